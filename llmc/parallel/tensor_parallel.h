// Tensor parallelism (Megatron-LM style) over the TP group of llmc/parallel/layout.h.
//
// Each of the tp processes of a group stores only its slices of the parameters (rank t of tp):
//   wte (Vp, C)          rows [t·Vp/tp, (t+1)·Vp/tp)      vocabulary-parallel embedding and LM head
//   qkvw (3C, C), qkvb   rows of q, k and v of heads [t·NH/tp, (t+1)·NH/tp)   column-parallel
//   fcw (4C, C), fcb     rows [t·4C/tp, (t+1)·4C/tp)                           column-parallel
//   attprojw (C, C)      columns [t·C/tp, (t+1)·C/tp)                          row-parallel
//   fcprojw (C, 4C)      columns [t·4C/tp, (t+1)·4C/tp)                        row-parallel
//   wpe, layernorms, attprojb, fcprojb: whole (replicated)
// The local vector keeps checkpoint order with these local shapes (tp_param_sizes), so AdamW, ZeRO-1
// and the gradient collectives of the data-parallel group work on it unchanged.
//
// Why one all-reduce per row-parallel matmul: a column-parallel matmul y_t = x W_tᵀ needs the whole
// input x (replicated) and produces its own columns; attention and GELU act column by column (head by
// head), so they stay local; the row-parallel matmul that follows computes z = Σ_t y_t P_tᵀ, and each
// rank holds one term, so one all-reduce of z (B·T·C floats) gives every rank the full output, to which
// the replicated bias is added. Backward is the conjugate: dy_t = dz P_t is local, and dx = Σ_t dy_t W_t
// is a sum of one term per rank, so one all-reduce of dx. Layernorm inputs are then the same on every
// rank, and so are their gradients; the replicated gradients are broadcast from TP rank 0 anyway, so
// rounding differences between ranks' all-reduce results can never make the replicas drift apart.
//
// The cross-entropy over logits split by vocabulary never gathers the logits: each row's max, sum of
// exponentials and target logit are reduced across the group (B·T numbers each).
//
// Sequence parallelism (-sq 1; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models"). Without it every rank of the group holds the same (B·T, C) tensors between the
// matmuls: the residual stream, the layernorms, the row-parallel outputs. With it, rank t holds rows
// [t·R, t·R + rows) of the B·T rows (R = ceil(B·T / tp); the last ranks may hold fewer, or none): the
// all-reduce after a row-parallel matmul becomes a reduce-scatter (each rank receives the sum of its
// own rows), and a layernorm's output is all-gathered just before the column-parallel matmul that needs
// every row. A reduce-scatter and an all-gather move an all-reduce's bytes, so the traffic is the same,
// and those activations shrink by tp. The backward is the conjugate: the gradient at a row-parallel
// output is all-gathered (its matmul's backward needs every row), the one at a column-parallel input
// reduce-scattered. The layernorms' parameter gradients then sum this rank's rows only and are
// all-reduced over the group; the biases of attproj and fcproj and wpe see the gathered gradient of
// every row, so theirs are whole on every rank as without -sq.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../encoder.h"
#include "../gpt2_config.h"
#include "../matmul.h"
#include "comm.h"

// True for the tensors that every TP rank holds whole.
inline bool tp_param_is_replicated(int i) {
    return i == P_WPE || i == P_LN1W || i == P_LN1B || i == P_ATTPROJB || i == P_LN2W || i == P_LN2B ||
           i == P_FCPROJB || i == P_LNFW || i == P_LNFB;
}

// Elements of each tensor on one TP rank (tp = 1: param_tensor_sizes).
inline void tp_param_sizes(const GPT2Config& cfg, int tp, size_t sizes[NUM_PARAMETER_TENSORS]) {
    param_tensor_sizes(cfg, sizes);
    size_t Vp = cfg.padded_vocab_size, C = cfg.channels, L = cfg.num_layers, Cl = C / tp;
    sizes[P_WTE] = Vp / tp * C;
    sizes[P_QKVW] = L * 3 * Cl * C;
    sizes[P_QKVB] = L * 3 * Cl;
    sizes[P_ATTPROJW] = L * C * Cl;
    sizes[P_FCW] = L * 4 * Cl * C;
    sizes[P_FCB] = L * 4 * Cl;
    sizes[P_FCPROJW] = L * C * 4 * Cl;
}

// Rank t's slice of one layer's block matrix (qkvw (3C, C), attprojw (C, C), fcw (4C, C), fcprojw
// (C, 4C), row-major), as `height` runs of `width` elements: run r is at full_offset + r full_pitch of the
// whole matrix and at r local_pitch of the slice (cudaMemcpy2D's shape, in elements).
struct MatrixSlice {
    size_t full_offset, full_pitch, local_pitch, width, height;
};
inline MatrixSlice tp_matrix_slice(int i, size_t C, int tp, int t) {
    size_t Cl = C / tp;
    if (i == P_QKVW) return {t * Cl * C, C * C, Cl * C, Cl * C, 3};  // q, k and v: Cl rows each
    if (i == P_FCW) return {t * 4 * Cl * C, 4 * Cl * C, 4 * Cl * C, 4 * Cl * C, 1};
    size_t width = i == P_ATTPROJW ? C : 4 * C, lw = width / tp;  // attprojw, fcprojw: columns
    return {t * lw, width, lw, lw, C};
}

// The same as runs: fn(full_offset, local_offset, n) for each.
template <typename Fn>
void tp_matrix_slice_runs(int i, size_t C, int tp, int t, Fn fn) {
    MatrixSlice m = tp_matrix_slice(i, C, tp, t);
    for (size_t r = 0; r < m.height; r++) fn(m.full_offset + r * m.full_pitch, r * m.local_pitch, m.width);
}

// Copies between the full parameter vector (checkpoint order) and rank t's local one: full -> local
// when to_local, else local -> full (the slices of rank t only).
inline void tp_copy_slices(const GPT2Config& cfg, int tp, int t, float* full, float* local, bool to_local) {
    size_t full_sizes[NUM_PARAMETER_TENSORS], local_sizes[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, full_sizes);
    tp_param_sizes(cfg, tp, local_sizes);
    size_t Vp = cfg.padded_vocab_size, C = cfg.channels, L = cfg.num_layers, Cl = C / tp;
    // one contiguous run of n elements: full[f..f+n) <-> local[l..l+n)
    auto run = [&](float* f, float* l, size_t n) {
        if (to_local) memcpy(l, f, n * sizeof(float));
        else memcpy(f, l, n * sizeof(float));
    };
    float* f = full;
    float* l = local;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (tp_param_is_replicated(i)) {
            run(f, l, full_sizes[i]);
        } else if (i == P_WTE) {
            run(f + t * (Vp / tp) * C, l, (Vp / tp) * C);
        } else if (i == P_QKVB) {  // per layer, per q/k/v: Cl entries
            for (size_t layer = 0; layer < L; layer++) {
                for (size_t part = 0; part < 3; part++) run(f + layer * 3 * C + part * C + t * Cl, l + layer * 3 * Cl + part * Cl, Cl);
            }
        } else if (i == P_FCB) {  // per layer: 4Cl entries
            for (size_t layer = 0; layer < L; layer++) run(f + layer * 4 * C + t * 4 * Cl, l + layer * 4 * Cl, 4 * Cl);
        } else {  // the block matrices, layer by layer
            size_t whole = full_sizes[i] / L, mine = local_sizes[i] / L;
            for (size_t layer = 0; layer < L; layer++) {
                tp_matrix_slice_runs(i, C, tp, t, [&](size_t fo, size_t lo, size_t n) {
                    run(f + layer * whole + fo, l + layer * mine + lo, n);
                });
            }
        }
        f += full_sizes[i];
        l += local_sizes[i];
    }
}

// The layernorms' parameter gradients, which sequence parallelism leaves partial (a sum over this
// rank's rows): all-reduced over the group at the end of the step.
inline bool sp_param_is_partial(int i) {
    return i == P_LN1W || i == P_LN1B || i == P_LN2W || i == P_LN2B || i == P_LNFW || i == P_LNFB;
}

// ----------------------------------------------------------------------------
// Sequence parallelism: this rank's rows of the (B·T, C) tensors between the matmuls

struct SequenceShard {
    bool on = false;            // -sq 1 (and tp > 1); off: every rank holds all B·T rows
    size_t rows_per_rank = 0;   // R = ceil(B·T / tp): each rank's block of a gathered (tp·R, C) buffer
    size_t begin = 0, rows = 0; // this rank's rows [begin, begin + rows) of the B·T (rows = B·T when off)
    float* gathered = nullptr;  // (tp·R, C) scratch for the gathers and the row-parallel partial sums
};

// Rows per rank of B·T rows split over tp ranks (B·T itself without sequence parallelism).
inline size_t sp_rows_per_rank(size_t BT, size_t tp, bool on) { return on ? (BT + tp - 1) / tp : BT; }

inline SequenceShard sequence_shard(size_t BT, const ProcessGroup& tp, bool on, float* gathered) {
    SequenceShard sq;
    sq.on = on && tp.size > 1;
    sq.rows_per_rank = sp_rows_per_rank(BT, tp.size, sq.on);
    sq.begin = sq.on ? std::min(BT, (size_t)tp.rank * sq.rows_per_rank) : 0;
    sq.rows = sq.on ? std::min(BT, sq.begin + sq.rows_per_rank) - sq.begin : BT;
    sq.gathered = gathered;
    return sq;
}

// The group's collectives between the matmuls, on either trainer's element type T (the CPU's float over
// MPI, the CUDA trainer's floatX over NCCL; CommType names it) and memory: `copy(dst, src, n)` copies n of
// this process's own elements (memcpy, or cudaMemcpyAsync on the compute stream). Each returns with the
// result ready for the next computation (comm_join: NCCL's queued collectives joined to the compute stream).

// Every rank's rows of `mine` (sq.rows x C), in order, into `gathered` (B·T rows, then padding); returns
// it. Off, `mine` already holds every row. Each rank's block may be `mine` itself (no copy).
template <typename T, typename Copy>
const T* sp_all_gather(const T* mine, T* gathered, const SequenceShard& sq, size_t C, const ProcessGroup& tp,
                       CommType type, Copy copy) {
    if (!sq.on) return mine;
    T* block = gathered + tp.rank * sq.rows_per_rank * C;
    if (mine != block && sq.rows > 0) copy(block, mine, sq.rows * C);
    all_gather(tp, gathered, sq.rows_per_rank * C, type);
    comm_join(tp);
    return gathered;
}

// x (n elements, this rank's term) becomes the sum over the group.
template <typename T>
void tp_all_reduce(T* x, size_t n, const ProcessGroup& tp, CommType type) {
    if (!comm_active(tp)) return;
    all_reduce(tp, x, n, type, COMM_SUM);
    comm_join(tp);
}

// x (n floats, this rank's values) becomes the elementwise max over the group (the vocabulary-parallel
// cross-entropy's row maxima).
inline void tp_all_reduce_max(float* x, size_t n, const ProcessGroup& tp) {
    if (!comm_active(tp)) return;
    all_reduce(tp, x, n, COMM_FLOAT32, COMM_MAX);
    comm_join(tp);
}

// full holds this rank's term of every row: (tp·R, C) with sequence parallelism, (B·T, C) without. With
// it, reduce-scattered: returns this rank's block, its own rows summed over the group; without, the
// whole all-reduced (a row-parallel output, or a column-parallel input's gradient) and returned.
template <typename T>
T* tp_sum_rows(T* full, const SequenceShard& sq, size_t C, const ProcessGroup& tp, CommType type) {
    if (!sq.on) {
        tp_all_reduce(full, sq.rows * C, tp, type);
        return full;
    }
    reduce_scatter_sum(tp, full, sq.rows_per_rank * C, type);
    comm_join(tp);
    return full + tp.rank * sq.rows_per_rank * C;
}

// The CPU trainer's forms: floats, host memory, sq.gathered as the scratch.
inline void host_copy(float* dst, const float* src, size_t n) { memcpy(dst, src, n * sizeof(float)); }
inline const float* sp_all_gather(const float* mine, const SequenceShard& sq, size_t C, const ProcessGroup& tp) {
    return sp_all_gather(mine, sq.gathered, sq, C, tp, COMM_FLOAT32, host_copy);
}
inline float* tp_sum_rows(float* full, const SequenceShard& sq, size_t C, const ProcessGroup& tp) {
    return tp_sum_rows(full, sq, C, tp, COMM_FLOAT32);
}
inline void tp_all_reduce(float* x, size_t n, const ProcessGroup& tp) { tp_all_reduce(x, n, tp, COMM_FLOAT32); }

// ----------------------------------------------------------------------------
// The two halves of a Megatron MLP or attention block

// Row-parallel matmul: out (N, OC) = Σ_t inp_t (N, IC) · weight_tᵀ + bias, one all-reduce. With one
// rank it is matmul_forward itself. With sequence parallelism (sq on), one reduce-scatter instead and
// out holds this rank's sq.rows rows.
inline void row_parallel_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                                 int OC, const ProcessGroup& tp, const SequenceShard& sq = SequenceShard()) {
    if (tp.size == 1) {
        matmul_forward(out, inp, weight, bias, N, IC, OC);
        return;
    }
    size_t rows = N;
    if (sq.on) {
        matmul_forward(sq.gathered, inp, weight, (const float*)nullptr, N, IC, OC);
        memcpy(out, tp_sum_rows(sq.gathered, sq, OC, tp), sq.rows * OC * sizeof(float));
        rows = sq.rows;
    } else {
        matmul_forward(out, inp, weight, (const float*)nullptr, N, IC, OC);
        tp_all_reduce(out, (size_t)N * OC, tp);
    }
    for (size_t n = 0; n < rows; n++) {
        for (int o = 0; o < OC; o++) out[n * OC + o] += bias[o];
    }
}

// ----------------------------------------------------------------------------
// Vocabulary-parallel embedding and cross-entropy; this rank holds vocabulary rows [v0, v0 + Vl)

// out (B, T, C) = wte[inp] + wpe: the rank holding a token's row contributes it, the others zero. With
// sequence parallelism, a reduce-scatter instead of the all-reduce: out holds this rank's sq.rows rows.
inline void tp_encoder_forward(float* out, const int* inp, const float* wte_local, const float* wpe, int B, int T,
                               int C, int v0, int Vl, const ProcessGroup& tp, const SequenceShard& sq = SequenceShard()) {
    if (tp.size == 1) {
        encoder_forward(out, inp, wte_local, wpe, B, T, C);
        return;
    }
    size_t BT = (size_t)B * T;
    float* terms = sq.on ? sq.gathered : out;
    for (size_t n = 0; n < BT; n++) {
        int row = inp[n] - v0;
        for (int c = 0; c < C; c++) terms[n * C + c] = row >= 0 && row < Vl ? wte_local[(size_t)row * C + c] : 0.0f;
    }
    size_t first = 0, rows = BT;  // one non-zero term per element: the sum is exact
    if (sq.on) {
        memcpy(out, tp_sum_rows(terms, sq, C, tp), sq.rows * C * sizeof(float));
        first = sq.begin;
        rows = sq.rows;
    } else {
        tp_all_reduce(out, BT * C, tp);
    }
    for (size_t n = 0; n < rows; n++) {
        const float* wpe_t = wpe + ((first + n) % T) * C;
        for (int c = 0; c < C; c++) out[n * C + c] += wpe_t[c];
    }
}

// Accumulates into this rank's rows of dwte and into dwpe (the same on every rank).
inline void tp_encoder_backward(float* dwte_local, float* dwpe, const float* dout, const int* inp, int B, int T, int C,
                                int v0, int Vl, const ProcessGroup& tp) {
    if (tp.size == 1) {
        encoder_backward(dwte_local, dwpe, dout, inp, B, T, C);
        return;
    }
    for (int c = 0; c < C; c++) {  // the order of encoder_backward: by channel, then position
        for (size_t n = 0; n < (size_t)B * T; n++) {
            float d = dout[n * C + c];
            int row = inp[n] - v0;
            if (row >= 0 && row < Vl) dwte_local[(size_t)row * C + c] += d;
            dwpe[(n % T) * C + c] += d;
        }
    }
}

// losses[n] = log Σ_v exp(logit[n,v] - max) + max - logit[n, target], over the V real columns split
// across ranks. Keeps each row's max and sum (N each) for the backward.
inline void tp_crossentropy_forward(float* losses, const float* logits, const int* targets, int N, int V, int v0,
                                    int Vl, const ProcessGroup& tp, std::vector<float>* row_max,
                                    std::vector<double>* row_sum) {
    int real = std::max(0, std::min(Vl, V - v0));  // columns of this rank below V
    row_max->assign(N, -INFINITY);
    row_sum->assign(N, 0.0);
    std::vector<float> target_logit(N, 0.0f);
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vl;
        for (int v = 0; v < real; v++) (*row_max)[n] = std::max((*row_max)[n], row[v]);
        int t = targets[n] - v0;
        if (t >= 0 && t < Vl) target_logit[n] = row[t];
    }
    tp_all_reduce_max(row_max->data(), N, tp);
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vl;
        double sum = 0.0;
        for (int v = 0; v < real; v++) sum += std::exp(row[v] - (*row_max)[n]);
        (*row_sum)[n] = sum;
    }
    all_reduce_sum(tp, row_sum->data(), N);
    all_reduce_sum(tp, target_logit.data(), N);  // one non-zero term: exact
    for (int n = 0; n < N; n++) losses[n] = (float)(std::log((*row_sum)[n]) + (*row_max)[n] - target_logit[n]);
}

// dlogits (N, Vl) = (softmax - onehot) * dloss on this rank's columns; 0 past V. Overwrites.
inline void tp_crossentropy_backward(float* dlogits, const float* logits, const int* targets, float dloss, int N, int V,
                                     int v0, int Vl, const std::vector<float>& row_max,
                                     const std::vector<double>& row_sum) {
    int real = std::max(0, std::min(Vl, V - v0));
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vl;
        float* drow = dlogits + (size_t)n * Vl;
        float scale = (float)(dloss / row_sum[n]);
        for (int v = 0; v < real; v++) drow[v] = std::exp(row[v] - row_max[n]) * scale;
        for (int v = real; v < Vl; v++) drow[v] = 0.0f;
        int t = targets[n] - v0;
        if (t >= 0 && t < Vl) drow[t] -= dloss;
    }
}
