// The CUDA trainer's LM head and loss (train_gpt2.cu): logits = lnf · wteᵀ, then the classifier's
// cross-entropy (llmc/classifier.cuh; with -tp the vocabulary-parallel one, whose statistics are summed
// over the tensor-parallel group), and the head's backward. Templates on the trainer's model struct.
//
// The logits are the largest activation of GPT-2: (B·T, Vp) floatX, 6288 MiB at d12's B=64, T=1024. By
// default they are kept from the forward to the backward as dlogits (the classifier writes the gradient
// over them). With -lc N the head runs N chunks of rows, and a training forward takes each chunk's
// gradient at once (wte's += and d(loss)/d(lnf), written over that chunk's rows of lnf), so only one
// chunk's logits ever exist: the backward then starts from lnf. The sums of wte's gradient are rounded
// to floatX chunk by chunk (as gradient accumulation's micro-steps are); -lc 1 is the default's bits.
#pragma once

#include <algorithm>

#include "cuda_common.cuh"
#include "classifier.cuh"
#include "fp8_linear.cuh"
#include "gpt2_activations.cuh"  // head_chunk_rows
#include "parallel/tensor_parallel.h"
#include "parallel/zero_device.cuh"

// The LM head and the loss on rows [r0, r0 + n) of lnf: their logits (n, Vl) at the start of acts.logits, and
// with targets their losses; with dloss > 0 the classifier overwrites the logits with d(loss)/d(logits),
// scaled by dloss (-fp8 2: and writes their e5m2 copy into acts.logits8).
template <typename Model>
void lm_head_forward(Model* model, size_t r0, size_t n, bool with_targets, float dloss) {
    const GPT2Config& cfg = model->config;
    int C = cfg.channels, V = cfg.vocab_size, Vp = cfg.padded_vocab_size, tp = model->layout.tp;
    int Vl = Vp / tp, v_begin = model->layout.tp_rank * Vl;  // this process's vocabulary rows of wte (all without -tp)
    const auto& a = model->acts;
    cudaStream_t stream = model->stream;
    floatX* logits = a.logits;
    float* losses = a.losses + r0;
    const int* targets = a.targets + r0;
    // -fp8 2: in FP8
    linear_forward(fp8_lm_head(model), logits, a.lnf + r0 * C, model->params.wte, nullptr, (int)n, C, Vl, stream);
    if (!with_targets) return;
    // -fp8 2: the classifier also writes dlogits' e5m2 copy, the LM head's FP8 backward's dy
    auto dlogits8 = lm_head_dy_copy(fp8_lm_head(model), dloss > 0.0f ? a.logits8 : nullptr, (int)n, C, Vl);
    if (tp == 1) {
        fused_classifier(logits, losses, targets, dloss, (int)n, V, Vp, dloss > 0.0f, stream, dlogits8);
        return;
    }
    // vocabulary-parallel cross-entropy (llmc/classifier.cuh): the rows' max, sum of exponentials and
    // target logit combined over the tensor-parallel group, 3 floats a row, never the logits
    const ProcessGroup& g = model->layout.tp_group;
    float *row_max = a.classifier_stats, *row_sum = row_max + n, *target_logit = row_sum + n;
    int valid = std::max(0, std::min(Vl, V - v_begin));
    classifier_slice_max(logits, row_max, (int)n, valid, Vl, stream);
    tp_all_reduce_max(row_max, n, g);
    classifier_slice_sum(logits, row_max, row_sum, target_logit, targets, (int)n, v_begin, valid, Vl, stream);
    tp_all_reduce(row_sum, 2 * n, g, COMM_FLOAT32);  // row_sum and target_logit lie together
    classifier_slice_loss(logits, losses, row_max, row_sum, target_logit, targets, dloss, (int)n, v_begin, valid, Vl,
                          dloss > 0.0f, stream, dlogits8);
}

// gpt2_forward's end on the last stage: the logits of BT rows of lnf, with targets their losses, and with
// dloss > 0 the gradient: left as dlogits in acts.logits for gpt2_head_backward, or (-lc) taken chunk by
// chunk here. acts.logits holds rows from logits_first_row on: all of them, or with -lc the last chunk's
// (without targets, as sampling asks: the last rows, whose logits the sampler reads).
template <typename Model>
void gpt2_head_forward(Model* model, size_t BT, bool with_targets, float dloss) {
    const auto& a = model->acts;
    int C = model->config.channels, Vl = model->config.padded_vocab_size / model->layout.tp;
    if (model->head_chunks == 0) {
        model->logits_first_row = 0;
        lm_head_forward(model, 0, BT, with_targets, dloss);
        return;
    }
    size_t rows = head_chunk_rows((size_t)model->batch_size * (model->seq_len / model->layout.cp), model->head_chunks,
                                  model->fp8_head);
    if (!with_targets) {
        model->logits_first_row = BT > rows ? BT - rows : 0;
        lm_head_forward(model, model->logits_first_row, BT - model->logits_first_row, false, 0.0f);
        return;
    }
    if (dloss > 0.0f && model->packed_grads) zero_backward_begin(&model->zero);  // -z 2, 3: wte's gradient starts here
    for (size_t r0 = 0; r0 < BT; r0 += rows) {
        size_t n = std::min(rows, BT - r0);
        model->logits_first_row = r0;
        lm_head_forward(model, r0, n, true, dloss);
        if (dloss > 0.0f) {
            floatX* lnf = a.lnf + r0 * C;
            lm_head_backward(fp8_lm_head(model), lnf, model->grads.wte, a.reduce_scratch, a.logits, a.logits8, lnf,
                             model->params.wte, (int)n, C, Vl, model->stream);
        }
    }
}

// gpt2_backward's start on the last stage: wte's gradient += dlogitsᵀ · lnf and d(loss)/d(lnf) from the
// dlogits the training forward left (-lc: the forward did both). Returns d(loss)/d(lnf), for BT rows
// (with -tp this process's term of the sum over the group).
template <typename Model>
floatX* gpt2_head_backward(Model* model, size_t BT) {
    const auto& a = model->acts;
    if (model->head_chunks > 0) return a.lnf;
    int C = model->config.channels, Vl = model->config.padded_vocab_size / model->layout.tp;
    lm_head_backward(fp8_lm_head(model), a.dln, model->grads.wte, a.reduce_scratch, a.logits, a.logits8, a.lnf,
                     model->params.wte, (int)BT, C, Vl, model->stream);
    return a.dln;
}
