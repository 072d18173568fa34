// Causal multi-head self-attention on the GPU, two ways behind one interface:
//  - flash (the default; attention_flash.cuh, bf16 builds): fused tiles on the tensor cores, no (T, T)
//    matrix anywhere; the forward saves the per-row log-sum-exp (B, NH, T) in fp32, the backward
//    recomputes the probabilities from it. Any T, head sizes that are multiples of 8 up to 128.
//  - the cuBLAS path (-fa 0, and always in the fp32 build), below: materialize the (T, T) scores per head.
//      q, k, v = split(qkv) per head;  att = softmax_causal(q·kᵀ / sqrt(hs));  out = att·v
//    Steps: permute qkv (B, T, 3, NH, hs) into q, k, v (B, NH, T, hs); one strided-batched cuBLAS GEMM
//    for the scores; our causal softmax in place (one warp per row, fp32 math, zeros above the
//    diagonal); a second batched GEMM for att·v; un-permute to (B, T, C). The backward retraces this:
//      datt = dout·vᵀ,  dv = attᵀ·dout,  dscores = att * (datt - sum(att * datt)) / sqrt(hs),
//      dq = dscores·k,  dk = dscoresᵀ·q
//    Since att is exactly zero above the diagonal, the full-square GEMMs need no mask. It saves att
//    (B, NH, T, T) per layer: 19 GB of bf16 over d12's 12 layers at B=64, T=1024, where flash saves 38 MB.
//
// The trainer only knows how many floatX elements per layer the forward saves for the backward
// (attention_saved_elements) and how much shared scratch both passes use (attention_scratch_elements).
#pragma once

#include <cmath>

#include "attention_flash.cuh"
#include "cuda_common.cuh"

// ----------------------------------------------------------------------------
// kernels

// One thread moves 16 bytes between the (B, T, 3, NH, hs) and (B, NH, T, hs) layouts.
// to_heads: qkv -> q, k, v;  otherwise q, k, v -> qkv (used with gradients in the backward).
__global__ void attention_permute_kernel(floatX* q, floatX* k, floatX* v, floatX* qkv, int B, int T, int NH,
                                         int hs, bool to_heads) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;  // index into (B, NH, T, hs)
    if (idx >= B * NH * T * hs) return;
    int d = idx % hs;
    int t = (idx / hs) % T;
    int h = (idx / (hs * T)) % NH;
    int b = idx / (hs * T * NH);
    int C = NH * hs;
    floatX* row = qkv + ((size_t)b * T + t) * 3 * C + h * hs + d;
    if (to_heads) {
        store128(q + idx, load128(row));
        store128(k + idx, load128(row + C));
        store128(v + idx, load128(row + 2 * C));
    } else {
        store128(row, load128(q + idx));
        store128(row + C, load128(k + idx));
        store128(row + 2 * C, load128(v + idx));
    }
}

// (B, NH, T, hs) <-> (B, T, NH, hs). to_heads: out (B, T, C) -> heads;  otherwise heads -> out.
__global__ void attention_unpermute_kernel(floatX* heads, floatX* out, int B, int T, int NH, int hs, bool to_heads) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;  // index into (B, NH, T, hs)
    if (idx >= B * NH * T * hs) return;
    int d = idx % hs;
    int t = (idx / hs) % T;
    int h = (idx / (hs * T)) % NH;
    int b = idx / (hs * T * NH);
    floatX* row = out + ((size_t)b * T + t) * NH * hs + h * hs + d;
    if (to_heads) {
        store128(heads + idx, load128(row));
    } else {
        store128(row, load128(heads + idx));
    }
}

// In place over att (B*NH*T rows of T): row (b, h, t) becomes softmax(scale * row[0..t]), zeros after.
__global__ void attention_softmax_forward_kernel(floatX* att, float scale, int num_rows, int T) {
    int row_index = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row_index >= num_rows) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t = row_index % T;
    floatX* row = att + (size_t)row_index * T;
    float max_score = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += WARP_SIZE) max_score = fmaxf(max_score, scale * (float)row[t2]);
    max_score = warp_reduce_max(max_score);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += WARP_SIZE) sum += expf(scale * (float)row[t2] - max_score);
    float inv_sum = 1.0f / warp_reduce_sum(sum);
    for (int t2 = lane; t2 < T; t2 += WARP_SIZE) {
        row[t2] = t2 <= t ? (floatX)(expf(scale * (float)row[t2] - max_score) * inv_sum) : (floatX)0.0f;
    }
}

// In place over datt: datt[t2] becomes att[t2] * (datt[t2] - sum_j att[j] datt[j]) * scale, zeros after t.
__global__ void attention_softmax_backward_kernel(floatX* datt, const floatX* att, float scale, int num_rows, int T) {
    int row_index = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row_index >= num_rows) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t = row_index % T;
    floatX* drow = datt + (size_t)row_index * T;
    const floatX* row = att + (size_t)row_index * T;
    float weighted = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += WARP_SIZE) weighted += (float)row[t2] * (float)drow[t2];
    weighted = warp_reduce_sum(weighted);
    for (int t2 = lane; t2 < T; t2 += WARP_SIZE) {
        drow[t2] = t2 <= t ? (floatX)((float)row[t2] * ((float)drow[t2] - weighted) * scale) : (floatX)0.0f;
    }
}

// ----------------------------------------------------------------------------
// launchers

// Flash attention needs the bf16 tensor cores: the fp32 and fp16 builds always run the cuBLAS path.
#if defined(LLMC_FLASH_ATTENTION)
constexpr bool FLASH_ATTENTION_AVAILABLE = true;
#else
constexpr bool FLASH_ATTENTION_AVAILABLE = false;
#endif

// Elements of floatX the forward saves per layer for the backward: flash, the log-sum-exp (B, NH, T)
// as fp32; otherwise att (B, NH, T, T).
inline size_t attention_saved_elements(int B, int T, int NH, bool flash) {
    size_t rows = (size_t)B * NH * T;
    return flash ? rows * sizeof(float) / sizeof(floatX) : rows * T;
}

// Elements of floatX scratch shared by all layers' forward and backward passes. Flash: D = rowsum(dout
// * out) (B, NH, T) as fp32. Otherwise q, k, v, out_heads or dout_heads, dq, dk, dv (7 x B·T·C) and
// datt (B, NH, T, T).
inline size_t attention_scratch_elements(int B, int T, int C, int NH, bool flash) {
    size_t rows = (size_t)B * NH * T;
    return flash ? rows * sizeof(float) / sizeof(floatX) : 7 * (size_t)B * T * C + rows * T;
}

// Refuses (at start-up, through the trainer's setup, and at every call) a shape the chosen path cannot take.
inline void check_attention_shape(int C, int NH, bool flash) {
    if (C % NH != 0 || (C / NH) % x128::size != 0) {
        fatal("CUDA attention needs a head size divisible by %d (C %d, NH %d)", x128::size, C, NH);
    }
    if (flash && !FLASH_ATTENTION_AVAILABLE) fatal("flash attention needs the bf16 build (this one is %s): use -fa 0", PRECISION_NAME);
    if (flash && (C / NH % 8 != 0 || C / NH > 128)) {
        fatal("flash attention takes head sizes that are multiples of 8 up to 128, got %d (C %d, NH %d): use -fa 0",
              C / NH, C, NH);
    }
}

// C (m, n) = op(A)·op(B) for each of `batch` column-major matrices, fp32 accumulation.
inline void attention_batched_gemm(floatX* c, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a,
                                   bool trans_b, int lda, long stride_a, int ldb, long stride_b, int ldc,
                                   long stride_c, int batch, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    cublas_use_stream(stream);
    cublasCheck(cublasGemmStridedBatchedEx(cublas_context.blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, CUBLAS_FLOATX,
                                           lda, stride_a, b, CUBLAS_FLOATX, ldb, stride_b, &beta, c, CUBLAS_FLOATX,
                                           ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

inline void attention_forward(floatX* out,       // (B, T, C)
                              floatX* saved,     // attention_saved_elements: lse (B, NH, T) fp32, or att (B, NH, T, T)
                              const floatX* qkv, // (B, T, 3C)
                              floatX* scratch,   // attention_scratch_elements
                              int B, int T, int C, int NH, bool flash, cudaStream_t stream) {
    check_attention_shape(C, NH, flash);
    int hs = C / NH;
#if defined(LLMC_FLASH_ATTENTION)
    if (flash) {
        attention_flash_forward(out, reinterpret_cast<float*>(saved), qkv, B, T, NH, hs, stream);
        return;
    }
#endif
    size_t BTC = (size_t)B * T * C;
    floatX *q = scratch, *k = q + BTC, *v = k + BTC, *heads = v + BTC;
    floatX* att = saved;
    const int block_size = 256;
    int grid_size = ceil_div_int(BTC / x128::size, block_size);
    attention_permute_kernel<<<grid_size, block_size, 0, stream>>>(q, k, v, const_cast<floatX*>(qkv), B, T, NH,
                                                                   hs, true);
    cudaCheckLaunch();
    // scoresᵀ (t2, t1) per head, column-major, is row-major scores (t1, t2) = q·kᵀ
    long head = (long)T * hs, square = (long)T * T;
    attention_batched_gemm(att, k, q, T, T, hs, true, false, hs, head, hs, head, T, square, B * NH, stream);
    int rows = B * NH * T;
    float scale = 1.0f / sqrtf((float)hs);
    attention_softmax_forward_kernel<<<ceil_div_int(rows, block_size / WARP_SIZE), block_size, 0, stream>>>(
        att, scale, rows, T);
    cudaCheckLaunch();
    // headsᵀ (d, t1) = vᵀ (d, t2) · attᵀ (t2, t1)
    attention_batched_gemm(heads, v, att, hs, T, T, false, false, hs, head, T, square, hs, head, B * NH, stream);
    attention_unpermute_kernel<<<grid_size, block_size, 0, stream>>>(heads, out, B, T, NH, hs, false);
    cudaCheckLaunch();
}

// dqkv is overwritten.
inline void attention_backward(floatX* dqkv,         // (B, T, 3C)
                               const floatX* dout,   // (B, T, C)
                               const floatX* qkv,    // (B, T, 3C)
                               const floatX* out,    // (B, T, C) the forward's output (read by flash only)
                               const floatX* saved,  // what attention_forward saved
                               floatX* scratch,      // attention_scratch_elements
                               int B, int T, int C, int NH, bool flash, cudaStream_t stream) {
    check_attention_shape(C, NH, flash);
    int hs = C / NH;
#if defined(LLMC_FLASH_ATTENTION)
    if (flash) {
        attention_flash_backward(dqkv, reinterpret_cast<float*>(scratch), dout, qkv, out,
                                 reinterpret_cast<const float*>(saved), B, T, NH, hs, stream);
        return;
    }
#endif
    size_t BTC = (size_t)B * T * C;
    floatX *q = scratch, *k = q + BTC, *v = k + BTC, *dheads = v + BTC;
    floatX *dq = dheads + BTC, *dk = dq + BTC, *dv = dk + BTC, *datt = dv + BTC;
    const floatX* att = saved;
    const int block_size = 256;
    int grid_size = ceil_div_int(BTC / x128::size, block_size);
    attention_permute_kernel<<<grid_size, block_size, 0, stream>>>(q, k, v, const_cast<floatX*>(qkv), B, T, NH,
                                                                   hs, true);
    cudaCheckLaunch();
    attention_unpermute_kernel<<<grid_size, block_size, 0, stream>>>(dheads, const_cast<floatX*>(dout), B, T, NH,
                                                                     hs, true);
    cudaCheckLaunch();
    long head = (long)T * hs, square = (long)T * T;
    int batch = B * NH;
    // datt (t1, t2) = dheads (t1, d) · v (t2, d)ᵀ: same shape of product as the scores
    attention_batched_gemm(datt, v, dheads, T, T, hs, true, false, hs, head, hs, head, T, square, batch, stream);
    // dvᵀ (d, t2) = dheadsᵀ (d, t1) · att (t1, t2)
    attention_batched_gemm(dv, dheads, att, hs, T, T, false, true, hs, head, T, square, hs, head, batch, stream);
    int rows = B * NH * T;
    float scale = 1.0f / sqrtf((float)hs);
    attention_softmax_backward_kernel<<<ceil_div_int(rows, block_size / WARP_SIZE), block_size, 0, stream>>>(
        datt, att, scale, rows, T);
    cudaCheckLaunch();
    // dqᵀ (d, t1) = kᵀ (d, t2) · dscoresᵀ (t2, t1)
    attention_batched_gemm(dq, k, datt, hs, T, T, false, false, hs, head, T, square, hs, head, batch, stream);
    // dkᵀ (d, t2) = qᵀ (d, t1) · dscores (t1, t2)
    attention_batched_gemm(dk, q, datt, hs, T, T, false, true, hs, head, T, square, hs, head, batch, stream);
    attention_permute_kernel<<<grid_size, block_size, 0, stream>>>(dq, dk, dv, dqkv, B, T, NH, hs, false);
    cudaCheckLaunch();
}
