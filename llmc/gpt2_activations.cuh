// The CUDA trainer's activation table (train_gpt2.cu): the tensors a pass over (B, T) keeps or uses, their
// per-layer strides, one block's views of them, and their layout in one allocation (with base ==
// nullptr, only their bytes: the memory plan, llmc/gpt2_plan.cuh). What recomputation (-r), tensor and
// sequence parallelism (-tp, -sq) and a pipeline stage's slots do to each tensor is decided here, once.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda_common.cuh"
#include <cuda_fp8.h>  // logits8
#include "global_norm.cuh"  // NORM_BLOCKS
#include "attention.cuh"  // attention_saved_elements, attention_scratch_elements
#include "parallel/context_parallel.cuh"
#include "encoder.cuh"    // encoder_buckets_ints
#include "layernorm.cuh"  // layernorm_backward_scratch_floats
#include "matmul.cuh"     // matmul_backward_scratch_floats
#include "block_acts.h"
#include "parallel/tensor_parallel.h"  // sp_rows_per_rank

// Activations: everything the forward keeps for the backward, the backward's per-layer gradient
// buffers and all scratch, carved out of one device allocation (each piece 256-byte aligned).
// With recomputation some per-layer tensors shrink to one layer's worth that the backward refills:
//   -r 1: fch_gelu is recomputed from fch;  -r 2: also ln1 and ln2 from the residual stream;
//   -r 3: every block tensor but residual3 (the next block's input): the backward reruns the block's
//         forward from its input first (about one more forward pass of compute).
// With tensor parallelism (-tp) the channels of qkv, atty, att, fch (and their gradients) are this
// process's C/tp (its NH/tp heads) and the logits its Vp/tp vocabulary columns. With sequence
// parallelism (-sq 1) the (B, T, C) tensors of the residual stream, the layernorms and their statistics
// hold this process's R = ceil(B·T/tp) rows (llmc/parallel/tensor_parallel.h), lnf is gathered whole.

struct ActivationTensors {
    floatX* encoded;     // (B, T, C)
    floatX* ln1;         // (L, B, T, C), or (B, T, C) with -r 2
    float* ln1_mean;     // (L, B, T)
    float* ln1_rstd;     // (L, B, T)
    floatX* qkv;         // (L, B, T, 3C); with -r 3 this and the others below but residual3: 1 layer
    floatX* atty;        // (L, B, T, C)
    floatX* att;         // (L, attention_saved_elements): flash's lse (B, NH, T) fp32, or (B, NH, T, T)
    floatX* residual2;   // (L, B, T, C)
    floatX* ln2;         // (L, B, T, C), or (B, T, C) with -r 2
    float* ln2_mean;     // (L, B, T)
    float* ln2_rstd;     // (L, B, T)
    floatX* fch;         // (L, B, T, 4C) before GELU
    floatX* fch_gelu;    // (L, B, T, 4C), or (B, T, 4C) with -r 1 or 2
    floatX* residual3;   // (L, B, T, C)
    floatX* lnf;         // (B, T, C); -lc: a training forward leaves d(loss)/d(lnf) in its place
    float* lnf_mean;     // (B, T)
    float* lnf_rstd;     // (B, T)
    floatX* logits;      // (B, T, Vp) (-lc: a chunk of rows); the classifier writes dlogits over them when training
    __nv_fp8_e5m2* logits8; // -fp8 2: dlogits' e5m2 copy, logits' shape; the classifier's (llmc/fp8_linear.cuh)
    float* losses;       // (B, T)
    // scratch, reused by every layer
    floatX* attproj;     // (B, T, C) output of attproj before the residual add (-sq 1: tp·R rows), and
    floatX* fcproj;      //   fcproj's: one scratch, the same storage
    floatX* gathered;    // -sq 1: (tp·R, C) every process's rows of a layernorm output or of dresidual
    floatX* attn_scratch;// attention_scratch_elements
    floatX* dresidual;   // (B, T, C) gradient flowing down the residual stream
    floatX* dln;         // (B, T, C) gradient of a layernorm output
    floatX* datty;       // (B, T, C)
    floatX* dqkv;        // (B, T, 3C)
    floatX* dfch;        // (B, T, 4C)
    float* reduce_scratch;  // partial sums of dbias/dweight/grad norm
    float* grad_norm_sq;    // (NUM_PARAMETER_TENSORS): the gradient norm's sum of squares, per tensor with -tp
    float* classifier_stats;// (3, B, T) with -tp: the vocabulary-parallel classifier's row max, sum, target logit
    int* inputs;         // (B, T)
    int* targets;        // (B, T)
    int* encoder_buckets;// encoder_buckets_ints(B, T)
};

// One block's views (BlockActs) come from llmc/block_acts.h with this table's strides (layer_strides):
// each layer's slice of a stacked tensor starts on 256 bytes, like the one-layer buffers that
// recomputation uses instead: cuBLASLt is told each pointer's real alignment (matmul.cuh), so equal
// alignment means the same algorithm for a layer's matmuls at every -r level, which -r 0/1/2 giving the
// same bits relies on. attproj and fcproj are one scratch (proj, stride 0): a projection's output is
// needed only until its residual add.
using BlockActs = BlockActsOf<floatX>;

inline size_t aligned_elements(size_t count) { return align_up_256(count * sizeof(floatX)) / sizeof(floatX); }

// What attention keeps per layer for the backward (saved) or shares as scratch (!saved), in floatX
// elements, for a pass over this process's T positions of B rows, NH heads and Cl channels: with -cp
// ulysses, NH/cp heads over cp·T positions; with -cp ring, whatever the path, flash's sizes (the rows'
// log-sum-exps: its chunks' scores are never kept, llmc/parallel/context_parallel.cuh).
inline size_t cp_attention_elements(bool saved, int B, int T, int Cl, int NH, bool flash, int cp, ContextMode mode) {
    if (cp > 1 && mode == ContextMode::ring) flash = true;
    else T *= cp, Cl /= cp, NH /= cp;
    return saved ? attention_saved_elements(B, T, NH, flash) : attention_scratch_elements(B, T, Cl, NH, flash);
}

// This table's per-layer strides for a pass over (B, T). With tensor parallelism (tp > 1) qkv, atty, att
// and fch hold this process's C/tp channels (NH/tp heads); with sequence parallelism (sp) ln1, ln2,
// residual2, residual3 and the layernorm statistics R of the B·T rows. The statistics are kept for every
// layer at every -r level. With context parallelism (cp > 1) T is this process's T/cp positions of each
// row, and att holds what its scheme's attention keeps (cp_attention_elements).
LayerStrides layer_strides(const GPT2Config& cfg, int B, int T, int recompute, bool flash, int tp = 1, bool sp = false,
                           int cp = 1, ContextMode cp_mode = ContextMode::ulysses) {
    size_t C = cfg.channels, Cl = C / tp, BT = (size_t)B * T, R = sp_rows_per_rank(BT, tp, sp && tp > 1);
    LayerStrides s;
    bool block = recompute >= 3;  // the whole block is recomputed: one layer of everything but residual3
    s.ln = recompute >= 2 ? 0 : aligned_elements(R * C);
    s.stats = R;
    s.attproj = s.fcproj = 0;  // the scratch proj
    s.qkv = block ? 0 : aligned_elements(BT * 3 * Cl);
    s.atty = block ? 0 : aligned_elements(BT * Cl);
    s.att = block ? 0 : aligned_elements(cp_attention_elements(true, B, T, (int)Cl, cfg.num_heads / tp, flash, cp, cp_mode));
    s.residual2 = block ? 0 : aligned_elements(R * C);
    s.residual3 = aligned_elements(R * C);
    s.fch = block ? 0 : aligned_elements(BT * 4 * Cl);
    s.fch_gelu = recompute >= 1 ? 0 : aligned_elements(BT * 4 * Cl);
    return s;
}

// -lc N: the rows of one chunk of the LM head (the logits buffer's rows): B·T/N rounded up, with -fp8 2
// (fp8_head) to a multiple of 16, which FP8's products need (every chunk but a short last one in FP8); at
// most B·T. 0: all B·T rows in one piece.
inline size_t head_chunk_rows(size_t BT, int chunks, bool fp8_head) {
    if (chunks <= 0) return BT;
    size_t rows = (BT + chunks - 1) / chunks, granule = fp8_head ? 16 : 1;
    return std::min(BT, (rows + granule - 1) / granule * granule);
}

// Lays out the activations for (B, T), recompute level and attention path; with base == nullptr only
// counts bytes. A pipeline stage (llmc/parallel/pipeline.h) keeps `slots` sets of what a micro-batch's
// forward leaves for its backward, a[0 .. slots), all sharing one backward scratch; a stage before the
// last (head false) has no logits. With tensor parallelism (tp > 1) the split tensors hold this
// process's C/tp channels, NH/tp heads and Vp/tp logits, and the scratch has room for the
// vocabulary-parallel classifier's statistics. With sequence parallelism (sp) the residual stream's
// tensors hold R rows, and lnf, proj, dln and the gather buffer tp·R. With context parallelism (cp > 1)
// T is this process's positions of each row (layer_strides); its scheme works in the backward scratch
// (context_scratch). fp8_head (-fp8 2): the head's logits have an e5m2 copy of their gradient.
// head_chunks (-lc N > 0): the head runs a chunk of head_chunk_rows rows at a time and takes its gradient
// at once, so the logits (and their e5m2 copy) are one chunk's, in the shared scratch.
size_t layout_activations(ActivationTensors* a, char* base, const GPT2Config& cfg, int B, int T, int recompute,
                          bool flash, int slots = 1, bool head = true, int tp = 1, bool sp = false, int cp = 1,
                          ContextMode cp_mode = ContextMode::ulysses, bool fp8_head = false, int head_chunks = 0) {
    size_t L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads / tp, Vp = cfg.padded_vocab_size / tp;
    size_t BT = (size_t)B * T, Cl = C / tp;
    bool on = sp && tp > 1;
    size_t R = sp_rows_per_rank(BT, tp, on), full = on ? tp * R : BT;  // rows here; rows of a gathered tensor
    bool chunked = head_chunks > 0;
    size_t head_rows = head_chunk_rows(BT, head_chunks, fp8_head);  // the rows of the logits (all B·T without -lc)
    LayerStrides all = layer_strides(cfg, B, T, 0, flash, tp, on, cp, cp_mode);  // a kept tensor holds L of these
    size_t L_block = recompute >= 3 ? 1 : L, L_ln = recompute >= 2 ? 1 : L, L_gelu = recompute >= 1 ? 1 : L;
    size_t reduce_floats = std::max({layernorm_backward_scratch_floats(C), matmul_backward_scratch_floats(4 * C),
                                     (size_t)NORM_BLOCKS});
    size_t offset = 0;
    auto take = [&](auto** ptr, size_t count) {
        using Elem = std::remove_pointer_t<std::remove_reference_t<decltype(*ptr)>>;
        *ptr = base ? reinterpret_cast<Elem*>(base + offset) : nullptr;
        offset += align_up_256(count * sizeof(Elem));
    };
    for (int k = 0; k < slots; k++) {
        ActivationTensors* s = &a[k];
        take(&s->encoded, R * C);
        take(&s->ln1, L_ln * all.ln);
        take(&s->ln1_mean, L * R);
        take(&s->ln1_rstd, L * R);
        take(&s->qkv, L_block * all.qkv);
        take(&s->atty, L_block * all.atty);
        take(&s->att, L_block * all.att);
        take(&s->residual2, L_block * all.residual2);
        take(&s->ln2, L_ln * all.ln);
        take(&s->ln2_mean, L * R);
        take(&s->ln2_rstd, L * R);
        take(&s->fch, L_block * all.fch);
        take(&s->fch_gelu, L_gelu * all.fch_gelu);
        take(&s->residual3, L * all.residual3);
        take(&s->lnf, full * C);
        take(&s->lnf_mean, R);
        take(&s->lnf_rstd, R);
        take(&s->logits, head && !chunked ? BT * Vp : 0);
        take(&s->logits8, head && fp8_head && !chunked ? BT * Vp : 0);
        take(&s->losses, BT);
        take(&s->inputs, BT);
        take(&s->targets, BT);
        take(&s->encoder_buckets, encoder_buckets_ints(B, T));
    }
    ActivationTensors* s = &a[0];
    take(&s->attproj, full * C);
    s->fcproj = s->attproj;
    take(&s->gathered, on ? full * C : 0);
    take(&s->attn_scratch, cp_attention_elements(false, B, T, (int)Cl, (int)NH, flash, cp, cp_mode));

    take(&s->dresidual, R * C);
    take(&s->dln, full * C);
    take(&s->datty, BT * Cl);
    take(&s->dqkv, BT * 3 * Cl);
    take(&s->dfch, BT * 4 * Cl);
    take(&s->reduce_scratch, reduce_floats);
    take(&s->grad_norm_sq, NUM_PARAMETER_TENSORS);
    take(&s->classifier_stats, tp > 1 ? 3 * head_rows : 0);
    if (chunked) {
        take(&s->logits, head ? head_rows * Vp : 0);
        take(&s->logits8, head && fp8_head ? head_rows * Vp : 0);
    }
    for (int k = 1; k < slots; k++) {  // the scratch is shared
        a[k].attproj = a[k].fcproj = s->attproj;
        a[k].gathered = s->gathered;
        a[k].attn_scratch = s->attn_scratch;
        a[k].dresidual = s->dresidual;
        a[k].dln = s->dln;
        a[k].datty = s->datty;
        a[k].dqkv = s->dqkv;
        a[k].dfch = s->dfch;
        a[k].reduce_scratch = s->reduce_scratch;
        a[k].grad_norm_sq = s->grad_norm_sq;
        a[k].classifier_stats = s->classifier_stats;
        if (chunked) a[k].logits = s->logits, a[k].logits8 = s->logits8;
    }
    return offset;
}

// Context parallelism's scratch (llmc/parallel/context_parallel.cuh): backward buffers free while
// attention runs.
inline ContextScratch context_scratch(const ActivationTensors& a) {
    return ContextScratch{a.dfch, a.attproj, a.dqkv, a.datty, a.dln};
}
