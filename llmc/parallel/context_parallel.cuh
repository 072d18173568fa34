// Context parallelism on the GPU (train_gpt2.cu, -cp N -cpm ring|ulysses): both schemes on device
// buffers, over the communicator's NCCL backend. The split of each sequence, each process's tokens and
// what the traffic comes to are llmc/parallel/context_split.h's, shared with the CPU trainer, whose
// llmc/parallel/context_parallel.h explains both schemes. Neither has memory of its own: each works in
// backward scratch that is free while a block's attention runs (ContextScratch, below).
//
// The ring, below, runs the attention of this process's queries against one key/value chunk at a time:
// the flash kernels (llmc/attention_flash.cuh) take an AttentionProblem, a chunk of queries against a
// chunk of keys in buffers of their own, causal or fully visible, and return its log-sum-exp; without
// flash (-fa 0, the fp32 build) plain kernels here do the same, a warp per row. Either way nothing of
// size T x T is kept: each layer saves its rows' log-sum-exps, and the backward rebuilds every chunk's
// probabilities from them, as flash does.
//
// Ulysses's split is contiguous: process r holds positions [r·T/N, (r+1)·T/N) of each row, so its
// embedding adds wpe's rows from r·T/N on and its gradient goes back there (no table to gather). An
// all-to-all turns qkv's rows into heads: afterwards a process holds all T positions of NH/N heads,
// and the ordinary attention (flash, or cuBLAS + softmax) runs on them; a second all-to-all turns the
// output back into rows. Each all-to-all is two permutations around NCCL's exchange:
//   columns: x (rows, k sections of C) -> blocks: block j holds process j's C/N columns of each section
//   rows:    blocks -> heads: block r holds process r's rows, which go to positions r·T/N + t
// and the way back is the same two, inverted.
#pragma once

#include "../attention.cuh"
#include "../cuda_common.cuh"
#include "../encoder.cuh"
#include "comm.h"
#include "context_split.h"

// The positions of this process's T/N rows of each sequence (-cp), for the encoder: the ring's front
// chunk and its mirror, or Ulysses's one span; *T becomes T/N. The identity without -cp. No inputs: a
// backward's T only.
inline RowPositions context_parallel_positions(ContextParallel* cp, int B, int* T, const int** inputs, const int** targets) {
    if (!cp->on()) return RowPositions{};
    *T = context_parallel_enter(cp, B, *T, inputs, targets, nullptr, 0);
    int r = cp->group.rank, Tc = cp->Tl / 2;
    if (cp->mode == ContextMode::ulysses) return RowPositions{0, 0, cp->position(r, 0)};
    return RowPositions{cp->position(r, 0), Tc, cp->position(r, Tc)};
}

// The backward scratch where the schemes work, free while a block's attention runs (its forward, the
// forward's recomputation, its backward), in columns of C per row of this process's B·T/N rows:
//   wide   4   (the backward's dfch)
//   proj   1   (the projections' scratch)
//   dqkv   3   (the backward's output; free in the forward)
//   datty  1   (the backward's dout; free in the forward)
//   dln    1
struct ContextScratch {
    floatX *wide, *proj, *dqkv, *datty, *dln;
};

// One thread per element of one section of x (rows of C columns, row stride x_stride): its place in
// block j = c / (C/N) of `blocks`, each block (rows, C/N). to_blocks: x -> blocks; otherwise back.
__global__ void ulysses_columns_kernel(floatX* blocks, floatX* x, size_t rows, int x_stride, int C, int N, bool to_blocks) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * C) return;
    size_t r = idx / C;
    int c = (int)(idx % C), Cn = C / N;
    size_t at = ((size_t)(c / Cn) * rows + r) * Cn + c % Cn, here = r * x_stride + c;
    if (to_blocks) {
        blocks[at] = x[here];
    } else {
        x[here] = blocks[at];
    }
}

// One thread per element of `blocks` (N blocks of (B, Tl, Cn)): block src's row (b, t) is heads' row
// (b, src·Tl + t) of (B, N·Tl) rows (row stride heads_stride). to_heads: blocks -> heads; otherwise back.
__global__ void ulysses_rows_kernel(floatX* heads, int heads_stride, floatX* blocks, int B, int Tl, int N, int Cn,
                                    bool to_heads) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * B * Tl * Cn) return;
    int c = (int)(idx % Cn), t = (int)(idx / Cn % Tl), b = (int)(idx / Cn / Tl % B), src = (int)(idx / Cn / Tl / B);
    size_t at = ((size_t)b * N * Tl + (size_t)src * Tl + t) * heads_stride + c;
    if (to_heads) {
        heads[at] = blocks[idx];
    } else {
        blocks[idx] = heads[at];
    }
}

inline unsigned ulysses_grid(size_t n) { return (unsigned)((n + 255) / 256); }

// One section of x (C columns of this process's B·Tl rows, row stride x_stride) -> its heads' C/N
// columns at every position, at heads (row stride heads_stride); send and recv hold B·Tl·C each.
inline void ulysses_section_to_heads(const ContextParallel& cp, floatX* heads, int heads_stride, const floatX* x, int x_stride,
                                     int B, int C, floatX* send, floatX* recv, cudaStream_t stream) {
    const int N = cp.group.size, Tl = cp.Tl;
    const size_t rows = (size_t)B * Tl, n = rows * C;
    ulysses_columns_kernel<<<ulysses_grid(n), 256, 0, stream>>>(send, const_cast<floatX*>(x), rows, x_stride, C, N, true);
    cudaCheckLaunch();
    all_to_all(cp.group, send, recv, n / N, COMM_FLOATX);
    comm_join(cp.group);
    ulysses_rows_kernel<<<ulysses_grid(n), 256, 0, stream>>>(heads, heads_stride, recv, B, Tl, N, C / N, true);
    cudaCheckLaunch();
}

// The inverse: heads' C/N columns of every position -> this process's rows of the section, all C columns.
inline void ulysses_section_to_rows(const ContextParallel& cp, floatX* x, int x_stride, const floatX* heads, int heads_stride,
                                    int B, int C, floatX* send, floatX* recv, cudaStream_t stream) {
    const int N = cp.group.size, Tl = cp.Tl;
    const size_t rows = (size_t)B * Tl, n = rows * C;
    ulysses_rows_kernel<<<ulysses_grid(n), 256, 0, stream>>>(const_cast<floatX*>(heads), heads_stride, send, B, Tl, N, C / N,
                                                             false);
    cudaCheckLaunch();
    all_to_all(cp.group, send, recv, n / N, COMM_FLOATX);
    comm_join(cp.group);
    ulysses_columns_kernel<<<ulysses_grid(n), 256, 0, stream>>>(recv, x, rows, x_stride, C, N, false);
    cudaCheckLaunch();
}

// Where Ulysses works, in the ContextScratch:
//   heads  wide                        q, k, v of NH/N heads over all positions, and the output's
//                                      (forward) or dout's (backward)
//   out    proj                        the backward's output in heads
//   a, b   dqkv's first two columns    the forward's staging and the backward's before its dqkv
//   c, d   datty, dln                  the backward's staging after it (dout is in heads by then)
struct UlyssesBuffers {
    floatX *heads, *out, *a, *b, *c, *d;
};
inline UlyssesBuffers ulysses_buffers(const ContextScratch& s, size_t rows_C) {
    return UlyssesBuffers{s.wide, s.proj, s.dqkv, s.dqkv + rows_C, s.datty, s.dln};
}

// Ulysses's attention for this process's B rows of T positions, section by section (q, k, v: three
// all-to-alls of C/N columns, then the output's). saved and scratch are sized for NH/N heads over N·T
// positions (layer_strides).
inline void ulysses_attention_forward(const ContextParallel& cp, const UlyssesBuffers& u, floatX* out, floatX* saved,
                                      const floatX* qkv, floatX* scratch, int B, int T, int C, int NH, bool flash,
                                      cudaStream_t stream) {
    const int N = cp.group.size, Cn = C / N;
    floatX *qkv_h = u.heads, *out_h = u.heads + (size_t)B * T * 3 * C;  // (B, N·T, 3C/N) and (B, N·T, C/N)
    for (int s = 0; s < 3; s++) ulysses_section_to_heads(cp, qkv_h + s * Cn, 3 * Cn, qkv + s * C, 3 * C, B, C, u.a, u.b, stream);
    attention_forward(out_h, saved, qkv_h, scratch, B, N * T, Cn, NH / N, flash, stream);
    ulysses_section_to_rows(cp, out, C, out_h, Cn, B, C, u.a, u.b, stream);
}

// Its backward likewise (dqkv overwritten): q, k, v, dout and the output go to heads again (the
// forward kept none of them in heads; flash reads the output), and dqkv's heads, computed into dqkv
// itself, are moved aside into `heads` before going back to rows: 8 columns of C all-to-all'ed, where
// the CPU's sends 7 (no output).
constexpr int ULYSSES_BACKWARD_COLUMNS = 8;
inline void ulysses_attention_backward(const ContextParallel& cp, const UlyssesBuffers& u, floatX* dqkv, const floatX* dout,
                                       const floatX* qkv, const floatX* out, const floatX* saved, floatX* scratch, int B,
                                       int T, int C, int NH, bool flash, cudaStream_t stream) {
    const int N = cp.group.size, Cn = C / N;
    const size_t part = (size_t)B * T * 3 * C;
    floatX *qkv_h = u.heads, *dout_h = u.heads + part;
    for (int s = 0; s < 3; s++) ulysses_section_to_heads(cp, qkv_h + s * Cn, 3 * Cn, qkv + s * C, 3 * C, B, C, u.a, u.b, stream);
    ulysses_section_to_heads(cp, dout_h, Cn, dout, C, B, C, u.a, u.b, stream);
    ulysses_section_to_heads(cp, u.out, Cn, out, C, B, C, u.a, u.b, stream);
    attention_backward(dqkv, dout_h, qkv_h, u.out, saved, scratch, B, N * T, Cn, NH / N, flash, stream);
    cudaCheck(cudaMemcpyAsync(u.heads, dqkv, part * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    for (int s = 0; s < 3; s++) ulysses_section_to_rows(cp, dqkv + s * C, 3 * C, u.heads + s * Cn, 3 * Cn, B, C, u.c, u.d, stream);
}

// ----------------------------------------------------------------------------
// The ring

// Without flash: one warp per (b, h, query i) of a problem (llmc/attention_flash.cuh), each lane holding
// the values d = lane + 32·k of the head. Plain fp32 loops, for the fp32 build and -fa 0: a reference
// path, not a fast one.
constexpr int RING_PLAIN_MAX_HEAD_SIZE = 4 * WARP_SIZE;

__device__ inline float ring_dot(const floatX* x, const floatX* y, int hs, int lane) {
    float s = 0.0f;
    for (int d = lane; d < hs; d += WARP_SIZE) s += (float)x[d] * (float)y[d];
    return warp_reduce_sum(s);
}

// The query's softmax over its visible keys, online (a running max m and sum l), its output and lse.
__global__ void ring_plain_forward_kernel(const AttentionProblem p) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= p.B * p.NH * p.Tq) return;
    const int i = row % p.Tq, h = row / p.Tq % p.NH, b = row / p.Tq / p.NH, hs = p.hs;
    const float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = p.q.head(b, h, hs) + (long)i * p.q.row;
    float o[RING_PLAIN_MAX_HEAD_SIZE / WARP_SIZE] = {}, m = -INFINITY, l = 0.0f;
    for (int j = 0; j < (p.causal ? i + 1 : p.Tk); j++) {
        const floatX* v = p.v.head(b, h, hs) + (long)j * p.v.row;
        float s = ring_dot(q, p.k.head(b, h, hs) + (long)j * p.k.row, hs, lane) * scale;
        float m_new = fmaxf(m, s), keep = expf(m - m_new), e = expf(s - m_new);  // keep: 0 at the first key
        l = l * keep + e;
        for (int k = 0, d = lane; d < hs; k++, d += WARP_SIZE) o[k] = o[k] * keep + e * (float)v[d];
        m = m_new;
    }
    floatX* out = p.out.head(b, h, hs) + (long)i * p.out.row;
    for (int k = 0, d = lane; d < hs; k++, d += WARP_SIZE) out[d] = (floatX)(o[k] / l);
    if (lane == 0) p.lse[(long)(row / p.Tq) * p.stat_row + i] = m + logf(l);
}

// dS = P (dout·v - D) for one (query i, key j) pair of a head, P = exp(q·k scale - lse_i)
__device__ inline void ring_plain_pair(const AttentionProblem& p, int b, int h, int i, int j, int lane, float* prob,
                                       float* ds) {
    const int hs = p.hs, stat = (b * p.NH + h) * p.stat_row + i;
    const floatX* q = p.q.head(b, h, hs) + (long)i * p.q.row;
    float s = ring_dot(q, p.k.head(b, h, hs) + (long)j * p.k.row, hs, lane) / sqrtf((float)hs);
    *prob = expf(s - p.lse[stat]);
    float dp = ring_dot(p.dout.head(b, h, hs) + (long)i * p.dout.row, p.v.head(b, h, hs) + (long)j * p.v.row, hs, lane);
    *ds = *prob * (dp - p.delta[stat]);
}

// x (hs values of a row) += acc / set to acc, times factor
__device__ inline void ring_plain_store(floatX* x, const float* acc, float factor, int hs, int lane, bool accumulate) {
    for (int k = 0, d = lane; d < hs; k++, d += WARP_SIZE) x[d] = (floatX)((accumulate ? (float)x[d] : 0.0f) + acc[k] * factor);
}

// dq_i = Σ_j dS_ij k_j / sqrt(hs): a warp per query
__global__ void ring_plain_backward_dq_kernel(const AttentionProblem p) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= p.B * p.NH * p.Tq) return;
    const int i = row % p.Tq, h = row / p.Tq % p.NH, b = row / p.Tq / p.NH, hs = p.hs;
    float dq[RING_PLAIN_MAX_HEAD_SIZE / WARP_SIZE] = {};
    for (int j = 0; j < (p.causal ? i + 1 : p.Tk); j++) {
        float prob, ds;
        ring_plain_pair(p, b, h, i, j, lane, &prob, &ds);
        const floatX* k = p.k.head(b, h, hs) + (long)j * p.k.row;
        for (int c = 0, d = lane; d < hs; c++, d += WARP_SIZE) dq[c] += ds * (float)k[d];
    }
    ring_plain_store(p.dq.head(b, h, hs) + (long)i * p.dq.row, dq, 1.0f / sqrtf((float)hs), hs, lane, p.accumulate);
}

// dk_j = Σ_i dS_ij q_i / sqrt(hs), dv_j = Σ_i P_ij dout_i: a warp per key
__global__ void ring_plain_backward_dkv_kernel(const AttentionProblem p) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= p.B * p.NH * p.Tk) return;
    const int j = row % p.Tk, h = row / p.Tk % p.NH, b = row / p.Tk / p.NH, hs = p.hs;
    float dk[RING_PLAIN_MAX_HEAD_SIZE / WARP_SIZE] = {}, dv[RING_PLAIN_MAX_HEAD_SIZE / WARP_SIZE] = {};
    for (int i = p.causal ? j : 0; i < p.Tq; i++) {
        float prob, ds;
        ring_plain_pair(p, b, h, i, j, lane, &prob, &ds);
        const floatX* q = p.q.head(b, h, hs) + (long)i * p.q.row;
        const floatX* dout = p.dout.head(b, h, hs) + (long)i * p.dout.row;
        for (int c = 0, d = lane; d < hs; c++, d += WARP_SIZE) {
            dk[c] += ds * (float)q[d];
            dv[c] += prob * (float)dout[d];
        }
    }
    ring_plain_store(p.dk.head(b, h, hs) + (long)j * p.dk.row, dk, 1.0f / sqrtf((float)hs), hs, lane, p.accumulate);
    ring_plain_store(p.dv.head(b, h, hs) + (long)j * p.dv.row, dv, 1.0f, hs, lane, p.accumulate);
}

// One chunk's attention, flash or plain.
inline void ring_chunk_forward(const AttentionProblem& p, bool flash, cudaStream_t stream) {
#if defined(LLMC_FLASH_ATTENTION)
    if (flash) return attention_flash_forward(p, stream);
#endif
    ring_plain_forward_kernel<<<ceil_div_int(p.B * p.NH * p.Tq, 4), 4 * WARP_SIZE, 0, stream>>>(p);
    cudaCheckLaunch();
}
inline void ring_chunk_backward(const AttentionProblem& p, bool flash, cudaStream_t stream) {
#if defined(LLMC_FLASH_ATTENTION)
    if (flash) return attention_flash_backward(p, stream);
#endif
    ring_plain_backward_dq_kernel<<<ceil_div_int(p.B * p.NH * p.Tq, 4), 4 * WARP_SIZE, 0, stream>>>(p);
    cudaCheckLaunch();
    ring_plain_backward_dkv_kernel<<<ceil_div_int(p.B * p.NH * p.Tk, 4), 4 * WARP_SIZE, 0, stream>>>(p);
    cudaCheckLaunch();
}

// A chunk's output `part` (B, Tl, C) and log-sum-exps part_lse (B, NH, Tl), rows [row0, row0 + rows) of
// each sequence, merged into the running fp32 output acc and lse (the same layouts):
//     lse' = log(e^lse + e^part_lse),   acc' = acc e^(lse - lse') + part e^(part_lse - lse')
// first: the rows' first chunk, copied. One thread per (b, row, h).
__global__ void ring_merge_kernel(float* acc, float* lse, const floatX* part, const float* part_lse, int B, int Tl,
                                  int row0, int rows, int NH, int hs, bool first) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * rows * NH) return;
    int h = idx % NH, t = row0 + idx / NH % rows, b = idx / NH / rows;
    size_t stat = ((size_t)b * NH + h) * Tl + t, at = ((size_t)b * Tl + t) * NH * hs + h * hs;
    float before = lse[stat], chunk = part_lse[stat];
    float after = first ? chunk : fmaxf(before, chunk) + log1pf(expf(-fabsf(before - chunk)));
    float keep = first ? 0.0f : expf(before - after), add = expf(chunk - after);
    for (int d = 0; d < hs; d++) acc[at + d] = (first ? 0.0f : acc[at + d] * keep) + (float)part[at + d] * add;
    lse[stat] = after;
}

__global__ void ring_output_kernel(floatX* out, const float* acc, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (floatX)acc[i];
}

// A chunk's keys and values (or their gradients): two (B, Tl, C) buffers, the unit the ring passes on.
struct RingChunk {
    floatX *k, *v;
};

// Passes `out` to the next process and fills `in` from the previous one (one group: NCCL's sends wait
// for their receives), queued after the compute stream's work so far.
inline void ring_pass(const ProcessGroup& g, RingChunk out, RingChunk in, size_t n) {
    const int next = (g.rank + 1) % g.size, prev = (g.rank - 1 + g.size) % g.size;
    comm_group_start(g);
    comm_send(g, out.k, n, COMM_FLOATX, next, 0);
    comm_send(g, out.v, n, COMM_FLOATX, next, 0);
    comm_recv(g, in.k, n, COMM_FLOATX, prev, 0);
    comm_recv(g, in.v, n, COMM_FLOATX, prev, 0);
    comm_group_end(g);
}

// The problem of query half qh (of this process's rows) against key half kh of the chunk: Tc rows each,
// causal on the diagonal, fully visible otherwise (ring_visibility).
inline AttentionProblem ring_problem(const ContextParallel& cp, const floatX* qkv, RingChunk kv, int qh, int kh, int visible,
                                     int B, int C, int NH) {
    const int Tl = cp.Tl, Tc = Tl / 2;
    AttentionProblem p;
    floatX* q = const_cast<floatX*>(qkv);
    p.q = HeadRows{q + (long)qh * Tc * 3 * C, (long)Tl * 3 * C, 3 * C};
    p.k = HeadRows{kv.k + (long)kh * Tc * C, (long)Tl * C, C};
    p.v = HeadRows{kv.v + (long)kh * Tc * C, (long)Tl * C, C};
    p.stat_row = Tl;
    p.B = B, p.NH = NH, p.hs = C / NH, p.Tq = p.Tk = Tc;
    p.causal = visible == 1;
    return p;
}

inline void ring_check(const ContextParallel& cp, int C, int NH, bool flash) {
    check_attention_shape(C, NH, flash);
    if (!flash && C / NH > RING_PLAIN_MAX_HEAD_SIZE) {
        fatal("-cp %d -cpm ring without flash takes head sizes up to %d, got %d", cp.group.size, RING_PLAIN_MAX_HEAD_SIZE, C / NH);
    }
}

// Forward: out (B, Tl, C) from this process's qkv (B, Tl, 3C); lse (B, NH, Tl) saved for the backward
// (the layer's saved attention). N steps: at step s the chunk of process (rank - s) mod N, already on
// its way to the next process while each visible pair of half-chunks is attended and merged. In the
// scratch: the chunk in use and the one arriving (wide), a pair's output (proj), the fp32 running output
// (dqkv) and a pair's log-sum-exps (`scratch`, the attention's).
inline void ring_attention_forward(const ContextParallel& cp, const ContextScratch& u, floatX* out, float* lse,
                                   const floatX* qkv, float* scratch, int B, int C, int NH, bool flash, cudaStream_t stream) {
    ring_check(cp, C, NH, flash);
    const ProcessGroup& g = cp.group;
    const int N = g.size, me = g.rank, Tc = cp.Tl / 2;
    const size_t n = (size_t)B * cp.Tl * C, X = sizeof(floatX);
    RingChunk chunk{u.wide, u.wide + n}, next{u.wide + 2 * n, u.wide + 3 * n};
    float* acc = reinterpret_cast<float*>(u.dqkv);
    for (int s = 0; s < 2; s++) {  // this process's own k and v first
        cudaCheck(cudaMemcpy2DAsync(s ? chunk.v : chunk.k, C * X, qkv + (s + 1) * C, 3 * C * X, C * X, n / C,
                                    cudaMemcpyDeviceToDevice, stream));
    }
    for (int s = 0; s < N; s++) {
        const int src = (me - s + N) % N;  // whose positions the chunk holds
        if (s + 1 < N) ring_pass(g, chunk, next, n);
        for (int qh = 0; qh < 2; qh++) {
            for (int kh = 0; kh < 2; kh++) {
                int visible = ring_visibility(N, me, qh, src, kh);
                if (visible == 0) continue;
                AttentionProblem p = ring_problem(cp, qkv, chunk, qh, kh, visible, B, C, NH);
                p.out = HeadRows{u.proj + (long)qh * Tc * C, (long)cp.Tl * C, C};
                p.lse = scratch + qh * Tc;
                ring_chunk_forward(p, flash, stream);
                // at step 0 each query half sees key half 0 (its own chunk, or an earlier one) first
                int threads = B * Tc * NH;
                ring_merge_kernel<<<ceil_div_int(threads, 256), 256, 0, stream>>>(acc, lse, u.proj, scratch, B, cp.Tl, qh * Tc,
                                                                                Tc, NH, C / NH, s == 0 && kh == 0);
                cudaCheckLaunch();
            }
        }
        if (s + 1 < N) {
            comm_join(g);
            std::swap(chunk, next);
        }
    }
    ring_output_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, acc, n);
    cudaCheckLaunch();
}

// Backward: dqkv (B, Tl, 3C) overwritten, from dout (B, Tl, C) and the forward's out and lse. The ring
// again, each chunk travelling with its dk and dv, which every process adds its queries' part to; after
// N steps and one more hop they are home. Three chunks in the scratch turn: the one in use, its
// gradient, and the next one arriving (wide: two, proj and dln: the third); the gradient arriving takes
// the place of the chunk just used. dq is added up in dqkv itself; delta (B, NH, Tl) in `scratch`.
// Each chunk's gradient is summed in floatX, one rounding per process that adds to it.
inline void ring_attention_backward(const ContextParallel& cp, const ContextScratch& u, floatX* dqkv, const floatX* dout,
                                    const floatX* qkv, const floatX* out, const float* lse, float* scratch, int B, int C,
                                    int NH, bool flash, cudaStream_t stream) {
    ring_check(cp, C, NH, flash);
    const ProcessGroup& g = cp.group;
    const int N = g.size, me = g.rank, Tl = cp.Tl, Tc = Tl / 2;
    const size_t n = (size_t)B * Tl * C, X = sizeof(floatX);
    RingChunk chunk{u.wide, u.wide + n}, grad{u.wide + 2 * n, u.wide + 3 * n}, spare{u.proj, u.dln};
    attention_delta_kernel<<<ceil_div_int(B * NH * Tl, 256), 256, 0, stream>>>(scratch, dout, out, B, Tl, NH, C / NH);
    cudaCheckLaunch();
    cudaCheck(cudaMemsetAsync(dqkv, 0, 3 * n * X, stream));
    cudaCheck(cudaMemsetAsync(grad.k, 0, n * X, stream));
    cudaCheck(cudaMemsetAsync(grad.v, 0, n * X, stream));
    for (int s = 0; s < 2; s++) {
        cudaCheck(cudaMemcpy2DAsync(s ? chunk.v : chunk.k, C * X, qkv + (s + 1) * C, 3 * C * X, C * X, n / C,
                                    cudaMemcpyDeviceToDevice, stream));
    }
    for (int s = 0; s < N; s++) {
        const int src = (me - s + N) % N;
        if (s + 1 < N) ring_pass(g, chunk, spare, n);  // k and v go on at once
        for (int qh = 0; qh < 2; qh++) {
            for (int kh = 0; kh < 2; kh++) {
                int visible = ring_visibility(N, me, qh, src, kh);
                if (visible == 0) continue;
                AttentionProblem p = ring_problem(cp, qkv, chunk, qh, kh, visible, B, C, NH);
                p.dout = HeadRows{const_cast<floatX*>(dout) + (long)qh * Tc * C, (long)Tl * C, C};
                p.dq = HeadRows{dqkv + (long)qh * Tc * 3 * C, (long)Tl * 3 * C, 3 * C};
                p.dk = HeadRows{grad.k + (long)kh * Tc * C, (long)Tl * C, C};
                p.dv = HeadRows{grad.v + (long)kh * Tc * C, (long)Tl * C, C};
                p.lse = const_cast<float*>(lse) + qh * Tc;
                p.delta = scratch + qh * Tc;
                p.accumulate = true;
                ring_chunk_backward(p, flash, stream);
            }
        }
        ring_pass(g, grad, chunk, n);  // dk and dv once this process has added its part (the last hop: home)
        comm_join(g);
        RingChunk arrived = chunk;  // the gradient of the chunk that arrived (after the last step: our own)
        if (s + 1 < N) chunk = spare, spare = grad;
        grad = arrived;
    }
    for (int s = 0; s < 2; s++) {
        cudaCheck(cudaMemcpy2DAsync(dqkv + (s + 1) * C, 3 * C * X, s ? grad.v : grad.k, C * X, C * X, n / C,
                                    cudaMemcpyDeviceToDevice, stream));
    }
}

// ----------------------------------------------------------------------------
// What a block calls: attention_forward and attention_backward (llmc/attention.cuh) for this process's
// B rows of T positions (T/N of each sequence with -cp), C and NH this tensor-parallel rank's.

inline void cp_attention_forward(const ContextParallel& cp, const ContextScratch& u, floatX* out, floatX* saved,
                                 const floatX* qkv, floatX* scratch, int B, int T, int C, int NH, bool flash,
                                 cudaStream_t stream) {
    if (!cp.on()) return attention_forward(out, saved, qkv, scratch, B, T, C, NH, flash, stream);
    if (cp.mode == ContextMode::ring) {
        return ring_attention_forward(cp, u, out, reinterpret_cast<float*>(saved), qkv, reinterpret_cast<float*>(scratch), B,
                                      C, NH, flash, stream);
    }
    ulysses_attention_forward(cp, ulysses_buffers(u, (size_t)B * T * C), out, saved, qkv, scratch, B, T, C, NH, flash, stream);
}

inline void cp_attention_backward(const ContextParallel& cp, const ContextScratch& u, floatX* dqkv, const floatX* dout,
                                  const floatX* qkv, const floatX* out, const floatX* saved, floatX* scratch, int B, int T,
                                  int C, int NH, bool flash, cudaStream_t stream) {
    if (!cp.on()) return attention_backward(dqkv, dout, qkv, out, saved, scratch, B, T, C, NH, flash, stream);
    if (cp.mode == ContextMode::ring) {
        return ring_attention_backward(cp, u, dqkv, dout, qkv, out, reinterpret_cast<const float*>(saved),
                                       reinterpret_cast<float*>(scratch), B, C, NH, flash, stream);
    }
    ulysses_attention_backward(cp, ulysses_buffers(u, (size_t)B * T * C), dqkv, dout, qkv, out, saved, scratch, B, T, C, NH,
                               flash, stream);
}
