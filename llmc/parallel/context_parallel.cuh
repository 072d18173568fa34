// Context parallelism on the GPU (train_gpt2.cu, -cp N -cpm ulysses): the all-to-alls of Ulysses on
// device buffers, over the communicator's NCCL backend. The split of each sequence, each process's
// tokens and what the buffers and the traffic come to are llmc/parallel/context_split.h's, shared with
// the CPU trainer, whose llmc/parallel/context_parallel.h explains both schemes.
//
// Ulysses's split is contiguous: process r holds positions [r·T/N, (r+1)·T/N) of each row, so its
// embedding adds wpe's rows from r·T/N on and its gradient goes back there (no table to gather). An
// all-to-all turns qkv's rows into heads: afterwards a process holds all T positions of NH/N heads,
// and the ordinary attention (flash, or cuBLAS + softmax) runs on them; a second all-to-all turns the
// output back into rows. Each all-to-all is two permutations around NCCL's exchange:
//   columns: x (rows, k sections of C) -> blocks: block j holds process j's C/N columns of each section
//   rows:    blocks -> heads: block r holds process r's rows, which go to positions r·T/N + t
// and the way back is the same two, inverted. The ring (-cpm ring) needs the flash kernel to take a
// key/value chunk at an offset and to return its log-sum-exp: not built yet, refused with -cp.
#pragma once

#include "../attention.cuh"
#include "../cuda_common.cuh"
#include "comm.h"
#include "context_split.h"

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

// Where Ulysses works: no memory of its own, but backward scratch that is free while a block's attention
// runs (forward, its recomputation, and backward alike), each sized for this process's B·Tl rows:
//   heads    4·C   (the backward's dfch)       q, k, v of NH/N heads over all positions, and the output's
//                                              (forward) or dout's (backward)
//   out      C     (the projections' scratch)  the backward's output in heads
//   a, b     C, C  (dqkv's first two thirds)   the forward's staging and the backward's before its dqkv
//   c, d     C, C  (datty, dln)                the backward's staging after it (dout is in heads by then)
struct UlyssesBuffers {
    floatX *heads, *out, *a, *b, *c, *d;
};

// attention_forward (llmc/attention.cuh) for this process's B rows of T positions (T/N of each sequence
// with -cp): with -cp, Ulysses's, section by section (q, k, v: three all-to-alls of C/N columns, then
// the output's). saved and scratch are sized for NH/N heads over N·T positions (layer_strides).
inline void cp_attention_forward(const ContextParallel& cp, const UlyssesBuffers& u, floatX* out, floatX* saved,
                                 const floatX* qkv, floatX* scratch, int B, int T, int C, int NH, bool flash,
                                 cudaStream_t stream) {
    if (!cp.on()) return attention_forward(out, saved, qkv, scratch, B, T, C, NH, flash, stream);
    const int N = cp.group.size, Cn = C / N;
    floatX *qkv_h = u.heads, *out_h = u.heads + (size_t)B * T * 3 * C;  // (B, N·T, 3C/N) and (B, N·T, C/N)
    for (int s = 0; s < 3; s++) ulysses_section_to_heads(cp, qkv_h + s * Cn, 3 * Cn, qkv + s * C, 3 * C, B, C, u.a, u.b, stream);
    attention_forward(out_h, saved, qkv_h, scratch, B, N * T, Cn, NH / N, flash, stream);
    ulysses_section_to_rows(cp, out, C, out_h, Cn, B, C, u.a, u.b, stream);
}

// attention_backward likewise (dqkv overwritten): q, k, v, dout and the output go to heads again (the
// forward kept none of them in heads; flash reads the output), and dqkv's heads, computed into dqkv
// itself, are moved aside into `heads` before going back to rows: 8 columns of C all-to-all'ed, where
// the CPU's sends 7 (no output).
constexpr int ULYSSES_BACKWARD_COLUMNS = 8;
inline void cp_attention_backward(const ContextParallel& cp, const UlyssesBuffers& u, floatX* dqkv, const floatX* dout,
                                  const floatX* qkv, const floatX* out, const floatX* saved, floatX* scratch, int B, int T,
                                  int C, int NH, bool flash, cudaStream_t stream) {
    if (!cp.on()) return attention_backward(dqkv, dout, qkv, out, saved, scratch, B, T, C, NH, flash, stream);
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
