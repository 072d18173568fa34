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

// One thread per element of x (rows, k·C): its place in block j = c / (C/N) of `blocks`, each block
// (rows, k·C/N). to_blocks: x -> blocks; otherwise blocks -> x.
__global__ void ulysses_columns_kernel(floatX* blocks, floatX* x, size_t rows, int k, int C, int N, bool to_blocks) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * k * C) return;
    int c = (int)(idx % C), s = (int)(idx / C % k), Cn = C / N;
    size_t r = idx / C / k;
    size_t at = ((size_t)(c / Cn) * rows + r) * (size_t)(k * Cn) + (size_t)s * Cn + c % Cn;
    if (to_blocks) {
        blocks[at] = x[idx];
    } else {
        x[idx] = blocks[at];
    }
}

// One thread per element of `blocks` (N blocks of (B, Tl, w)): block src's row (b, t) is heads' row
// (b, src·Tl + t) of (B, N·Tl, w). to_heads: blocks -> heads; otherwise heads -> blocks.
__global__ void ulysses_rows_kernel(floatX* heads, floatX* blocks, int B, int Tl, int N, int w, bool to_heads) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * B * Tl * w) return;
    int c = (int)(idx % w), t = (int)(idx / w % Tl), b = (int)(idx / w / Tl % B), src = (int)(idx / w / Tl / B);
    size_t at = ((size_t)b * N * Tl + (size_t)src * Tl + t) * w + c;
    if (to_heads) {
        heads[at] = blocks[idx];
    } else {
        blocks[idx] = heads[at];
    }
}

inline unsigned ulysses_grid(size_t n) { return (unsigned)((n + 255) / 256); }

// x (B, Tl, k·C), this process's rows -> heads (B, T, k·C/N), all positions of its NH/N heads; send and
// recv are staging of B·Tl·k·C each.
inline void ulysses_to_heads(const ContextParallel& cp, floatX* heads, const floatX* x, int k, int B, int C, floatX* send,
                             floatX* recv, cudaStream_t stream) {
    const int N = cp.group.size, Tl = cp.Tl;
    const size_t rows = (size_t)B * Tl, n = rows * k * C;
    ulysses_columns_kernel<<<ulysses_grid(n), 256, 0, stream>>>(send, const_cast<floatX*>(x), rows, k, C, N, true);
    cudaCheckLaunch();
    all_to_all(cp.group, send, recv, n / N, COMM_FLOATX);
    comm_join(cp.group);
    ulysses_rows_kernel<<<ulysses_grid(n), 256, 0, stream>>>(heads, recv, B, Tl, N, k * C / N, true);
    cudaCheckLaunch();
}

// The inverse: heads (B, T, k·C/N) -> x (B, Tl, k·C), this process's rows of every process's heads.
inline void ulysses_to_rows(const ContextParallel& cp, floatX* x, const floatX* heads, int k, int B, int C, floatX* send,
                            floatX* recv, cudaStream_t stream) {
    const int N = cp.group.size, Tl = cp.Tl;
    const size_t rows = (size_t)B * Tl, n = rows * k * C;
    ulysses_rows_kernel<<<ulysses_grid(n), 256, 0, stream>>>(const_cast<floatX*>(heads), send, B, Tl, N, k * C / N, false);
    cudaCheckLaunch();
    all_to_all(cp.group, send, recv, n / N, COMM_FLOATX);
    comm_join(cp.group);
    ulysses_columns_kernel<<<ulysses_grid(n), 256, 0, stream>>>(recv, x, rows, k, C, N, false);
    cudaCheckLaunch();
}

// Elements of the device buffers (4 of B·Tl·3C each, C this tensor-parallel rank's) with N > 1.
inline size_t context_parallel_device_elements(int N, size_t B, size_t Tl, size_t C) { return N > 1 ? 4 * B * Tl * 3 * C : 0; }

// attention_forward (llmc/attention.cuh) for this process's B rows of T positions (T/N of each sequence
// with -cp): with -cp, Ulysses's. saved and scratch are sized for NH/N heads over N·T positions, which
// is what they were for NH heads over T (the cuBLAS path's (T, T) weights aside: N times as many).
inline void cp_attention_forward(const ContextParallel& cp, floatX* buffers, floatX* out, floatX* saved, const floatX* qkv,
                                 floatX* scratch, int B, int T, int C, int NH, bool flash, cudaStream_t stream) {
    if (!cp.on()) return attention_forward(out, saved, qkv, scratch, B, T, C, NH, flash, stream);
    const int N = cp.group.size;
    const size_t part = (size_t)B * T * 3 * C;
    floatX *send = buffers, *recv = send + part, *qkv_h = recv + part, *out_h = qkv_h + part;
    ulysses_to_heads(cp, qkv_h, qkv, 3, B, C, send, recv, stream);
    attention_forward(out_h, saved, qkv_h, scratch, B, N * T, C / N, NH / N, flash, stream);
    ulysses_to_rows(cp, out, out_h, 1, B, C, send, recv, stream);
}

// attention_backward likewise (dqkv overwritten): q, k, v, the output and dout go to heads again (the
// forward kept none of them in heads; flash reads the output), the heads' dqkv back to rows: 8 columns
// of C, where the CPU's sends 7 (no output).
constexpr int ULYSSES_BACKWARD_COLUMNS = 8;
inline void cp_attention_backward(const ContextParallel& cp, floatX* buffers, floatX* dqkv, const floatX* dout,
                                  const floatX* qkv, const floatX* out, const floatX* saved, floatX* scratch, int B, int T,
                                  int C, int NH, bool flash, cudaStream_t stream) {
    if (!cp.on()) return attention_backward(dqkv, dout, qkv, out, saved, scratch, B, T, C, NH, flash, stream);
    const int N = cp.group.size;
    const size_t part = (size_t)B * T * 3 * C, third = (size_t)B * T * C;
    floatX *send = buffers, *recv = send + part, *qkv_h = recv + part, *dout_h = qkv_h + part, *out_h = dout_h + third;
    ulysses_to_heads(cp, qkv_h, qkv, 3, B, C, send, recv, stream);
    ulysses_to_heads(cp, dout_h, dout, 1, B, C, send, recv, stream);
    ulysses_to_heads(cp, out_h, out, 1, B, C, send, recv, stream);
    attention_backward(send, dout_h, qkv_h, out_h, saved, scratch, B, N * T, C / N, NH / N, flash, stream);
    ulysses_to_rows(cp, dqkv, send, 3, B, C, recv, qkv_h, stream);
}
