// The CPU trainer's activation table (train_gpt2.cpp): the tensors a pass over (B, T) keeps for the
// backward, the backward's scratch, and one block's views of them; with their recompute (-r), tensor-
// and sequence-parallel (-tp, -sq) and pipeline-stage rules. llmc/gpt2_activations.cuh is the CUDA
// trainer's (its tensors differ: flash attention's saved statistics, fused kernels' outputs).
#pragma once

#include <algorithm>
#include <cstddef>

#include "block_acts.h"
#include "gpt2_config.h"
#include "parallel/tensor_parallel.h"  // sp_rows_per_rank

// Activations of the forward pass, kept for the backward pass. Per-layer tensors are stacked over L;
// within a call they are laid out for that call's (B, T), so any B*T up to the allocated size works.
// Recomputation (-r) keeps fewer of them: a tensor it does not keep has one block's worth of storage,
// which every layer's forward overwrites and the backward refills, just before that block's backward,
// by running the same functions on the same inputs again (so the same bits):
//   -r 1: fch_gelu, from fch;  -r 2: also ln1 and ln2, from the block input and residual2;
//   -r 3: everything but residual3 (each block's output, the next block's input): the whole block's
//         forward runs again, about one more forward pass of compute.

struct ActivationTensors {
    float* encoded;    // (B, T, C)
    float* ln1;        // (L, B, T, C), (B, T, C) with -r 2
    float* ln1_mean;   // (L, B, T), (B, T) with -r 3 (as are all the ones below but residual3)
    float* ln1_rstd;   // (L, B, T)
    float* qkv;        // (L, B, T, 3C)
    float* atty;       // (L, B, T, C)
    float* att;        // (L, B, NH, T, T)
    float* attproj;    // (L, B, T, C)
    float* residual2;  // (L, B, T, C)
    float* ln2;        // (L, B, T, C), (B, T, C) with -r 2
    float* ln2_mean;   // (L, B, T)
    float* ln2_rstd;   // (L, B, T)
    float* fch;        // (L, B, T, 4C)
    float* fch_gelu;   // (L, B, T, 4C), (B, T, 4C) with -r 1
    float* fcproj;     // (L, B, T, C)
    float* residual3;  // (L, B, T, C) at every level
    float* lnf;        // (B, T, C)
    float* lnf_mean;   // (B, T)
    float* lnf_rstd;   // (B, T)
    float* logits;     // (B, T, Vp)
    float* losses;     // (B, T)
    int recompute;     // the -r level this layout was made for
};

// How many layers' worth of each block activation -r keeps: L, or 1 for the ones it recomputes.
struct RecomputeLayers {
    size_t block;      // every block activation but residual3 (-r 3 keeps 1)
    size_t layernorm;  // ln1, ln2 (-r 2 keeps 1)
    size_t gelu;       // fch_gelu (-r 1 keeps 1)
};

RecomputeLayers recompute_layers(size_t L, int recompute) {
    RecomputeLayers k;
    k.block = recompute >= 3 ? 1 : L;
    k.layernorm = recompute >= 2 ? 1 : k.block;
    k.gelu = recompute >= 1 ? 1 : k.block;
    return k;
}

// Gradients of activations are needed only one layer at a time, so the backward pass reuses these
// buffers for every layer instead of keeping a gradient for each activation.
struct BackwardScratch {
    float* dresidual;  // (B, T, C)   gradient flowing down the residual stream
    float* dln;        // (B, T, C)   gradient of a layernorm output (ln1, ln2 or lnf)
    float* datty;      // (B, T, C)
    float* dqkv;       // (B, T, 3C)
    float* dfch;       // (B, T, 4C)
    float* dfch_gelu;  // (B, T, 4C)
    float* dlogits;    // (B, T, Vp)
    float* gathered;   // (tp·R, C)   -sq 1: the gathers' and reduce-scatters' buffer (tensor_parallel.h)
};

// One block's views (BlockActs) come from llmc/block_acts.h with this table's strides: every tensor
// packed tightly, a tensor that recomputation keeps for one layer only the same storage for every l.
// With tensor parallelism (tp > 1) qkv, atty, att, fch and fch_gelu hold this rank's C/tp columns
// (NH/tp heads); with sequence parallelism the residual stream, the layernorms and their statistics,
// attproj and fcproj hold `rows` of the B·T rows (llmc/parallel/tensor_parallel.h).
using BlockActs = BlockActsOf<float>;

LayerStrides layer_strides(const GPT2Config& cfg, int B, int T, int recompute, size_t tp = 1, size_t rows = 0, size_t cp = 1) {
    size_t BT = (size_t)B * T, C = cfg.channels, Cl = C / tp, NH = cfg.num_heads / tp, R = rows ? rows : BT;
    size_t block = recompute >= 3 ? 0 : 1;  // -r 3 keeps one layer of every block tensor but residual3
    LayerStrides s;
    s.ln = recompute >= 2 ? 0 : block * R * C;
    s.stats = block * R;
    s.qkv = block * BT * 3 * Cl;
    s.atty = block * BT * Cl;
    s.att = block * B * NH * T * (cp * T);
    s.attproj = block * R * C;
    s.residual2 = block * R * C;
    s.fch = block * BT * 4 * Cl;
    s.fch_gelu = recompute >= 1 ? 0 : block * BT * 4 * Cl;
    s.fcproj = block * R * C;
    s.residual3 = R * C;
    return s;
}

// Floats of the activations for (B, T) at a recompute level; with acts, also points its tensors into
// `memory` (which holds that many floats). With tensor parallelism (tp > 1), this rank's columns:
// C/tp of qkv/atty/fch, NH/tp heads, Vp/tp logits; with sequence parallelism (sp) also R = ceil(B·T/tp)
// of the rows of the (B, T, C) tensors and their layernorm statistics, but lnf gathered whole (tp·R
// rows, the LM head's input). A pipeline stage before the last has no lnf, logits or losses. With context
// parallelism (cp > 1, llmc/parallel/context_parallel.h) T is this process's T/cp positions of each row,
// and att holds their weights over all cp·T keys (the ring's; Ulysses's NH/cp heads over T·cp queries are
// as many).
size_t layout_activations(ActivationTensors* acts, float* memory, const GPT2Config& cfg, int B, int T, int recompute,
                          size_t tp = 1, bool last_stage = true, bool sp = false, size_t cp = 1) {
    size_t L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads / tp, Vp = cfg.padded_vocab_size / tp;
    size_t BT = (size_t)B * T, Cl = C / tp;
    size_t R = sp_rows_per_rank(BT, tp, sp && tp > 1), lnf_rows = sp && tp > 1 ? tp * R : BT;
    RecomputeLayers k = recompute_layers(L, recompute);
    ActivationTensors unused;
    ActivationTensors* a = acts ? acts : &unused;
    a->recompute = recompute;
    float** act_ptrs[] = {&a->encoded, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att,
                          &a->attproj, &a->residual2, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu,
                          &a->fcproj, &a->residual3, &a->lnf, &a->lnf_mean, &a->lnf_rstd, &a->logits, &a->losses};
    size_t act_sizes[] = {R * C, k.layernorm * R * C, k.block * R, k.block * R, k.block * BT * 3 * Cl,
                          k.block * BT * Cl, k.block * B * NH * T * (cp * T), k.block * R * C, k.block * R * C,
                          k.layernorm * R * C, k.block * R, k.block * R, k.block * BT * 4 * Cl, k.gelu * BT * 4 * Cl,
                          k.block * R * C, L * R * C, lnf_rows * C, R, R, BT * Vp, BT};
    if (!last_stage) {
        for (int i = 16; i <= 20; i++) act_sizes[i] = 0;
    }
    size_t total = 0;
    for (size_t i = 0; i < sizeof(act_sizes) / sizeof(act_sizes[0]); i++) {
        *act_ptrs[i] = memory ? memory + total : nullptr;
        total += act_sizes[i];
    }
    return total;
}

// The backward scratch's tensors, floats each: dresidual, dln (B, T, C); datty (B, T, C/tp); dqkv; dfch
// and dfch_gelu; dlogits (B, T, Vp/tp) on the last pipeline stage only; with sequence parallelism (sp)
// dresidual has this rank's R rows, dln and the gather buffer tp·R.
constexpr int NUM_SCRATCH_TENSORS = 8;
void backward_scratch_sizes(const GPT2Config& cfg, int B, int T, size_t tp, bool last_stage,
                            size_t sizes[NUM_SCRATCH_TENSORS], bool sp = false) {
    size_t BT = (size_t)B * T, C = cfg.channels, Cl = C / tp, Vp = cfg.padded_vocab_size / tp;
    bool on = sp && tp > 1;
    size_t R = sp_rows_per_rank(BT, tp, on), full = on ? tp * R : BT;
    size_t s[NUM_SCRATCH_TENSORS] = {R * C, full * C, BT * Cl, BT * 3 * Cl, BT * 4 * Cl, BT * 4 * Cl,
                                     last_stage ? BT * Vp : 0, on ? full * C : 0};
    std::copy(s, s + NUM_SCRATCH_TENSORS, sizes);
}
