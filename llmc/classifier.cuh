// The fused classifier: softmax, cross-entropy and the gradient of the logits in one kernel.
//   loss[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]
//   dlogits[n, v] = (softmax(logits[n, :V])[v] - [v == target[n]]) * dloss  (v < V),  0 for V <= v < Vp
// The (N, Vp) probabilities would be the largest tensor of the model (50304 per position), so they
// are never stored: one block per row first finds the row's max and sum of exponentials (each thread
// an online running pair over its 16-byte chunks, then a block reduction), then, if asked, walks the
// row again and overwrites the logits with their gradient. dloss is d(mean loss)/d(loss[n]), i.e.
// 1 / (B·T·grad_accum_steps).
//
// With -fp8 2 (llmc/fp8_linear.cuh) the LM head's input gradient is an FP8 product whose dy is dlogits:
// the walk that writes them also writes their e5m2 copy (each bf16 value as written, divided by the
// scale) and folds their amax into the scale's word, so no cast reads the (N, Vp) gradient again.
#pragma once

#include "cuda_common.cuh"
#include "fp8.cuh"  // Fp8Copy, fp8_record_block_amax

// ----------------------------------------------------------------------------
// kernels

// The block overwrites a row of n logits with their gradient: (softmax - one-hot(target)) * dloss for
// the first `valid` columns (row_max and inv_sum: the whole row's max and 1 / sum of exponentials), 0 for
// the padding after them. WithCodes: also row8 (n) = their e5m2 codes (the written floatX values times
// inv_scale); returns the largest |value| the thread wrote (0 without codes).
template <bool WithCodes>
__device__ inline float write_dlogits_row(floatX* row, __nv_fp8_e5m2* row8, float inv_scale, int n, int valid,
                                          int target, float row_max, float inv_sum, float dloss) {
    struct alignas(x128::size) Codes { unsigned char c[x128::size]; };
    float local_max = 0.0f;
    for (int v = threadIdx.x * x128::size; v < n; v += blockDim.x * x128::size) {
        x128 x = load128(row + v);
        x128 d;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            int col = v + k;
            float grad = 0.0f;
            if (col < valid) {
                float prob = expf((float)x[k] - row_max) * inv_sum;
                grad = (prob - (col == target ? 1.0f : 0.0f)) * dloss;
            }
            d[k] = (floatX)grad;
        }
        store128(row + v, d);
        if (WithCodes) {
            Codes codes;
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                float g = (float)d[k];
                local_max = fmaxf(local_max, fabsf(g));
                codes.c[k] = __nv_fp8_e5m2(g * inv_scale).__x;
            }
            *reinterpret_cast<Codes*>(row8 + v) = codes;
        }
    }
    return local_max;
}

// The gradient of a row and, with copy.codes, its e5m2 copy and amax (uniform: the whole block).
__device__ inline void write_dlogits_row_and_copy(floatX* row, const Fp8Copy<__nv_fp8_e5m2>& copy, size_t row_index,
                                                  int n, int valid, int target, float row_max, float inv_sum, float dloss) {
    if (copy.codes == nullptr) {
        write_dlogits_row<false>(row, nullptr, 0.0f, n, valid, target, row_max, inv_sum, dloss);
        return;
    }
    float local_max = write_dlogits_row<true>(row, copy.codes + row_index * n, 1.0f / *copy.scale, n, valid, target,
                                              row_max, inv_sum, dloss);
    if (copy.amax != nullptr) fp8_record_block_amax(local_max, copy.amax);
}

__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V,
                                        int Vp, bool write_dlogits, Fp8Copy<__nv_fp8_e5m2> copy) {
    int n = blockIdx.x;
    floatX* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float target_logit = (float)row[target];  // read before any thread overwrites the row

    // each thread: running max and sum of exp(x - max) over its chunks
    float thread_max = -INFINITY, thread_sum = 0.0f;
    for (int v = threadIdx.x * x128::size; v < V; v += blockDim.x * x128::size) {
        x128 x = load128(row + v);
        float chunk_max = -INFINITY;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (v + k < V) chunk_max = fmaxf(chunk_max, (float)x[k]);
        }
        float new_max = fmaxf(thread_max, chunk_max);
        thread_sum *= expf(thread_max - new_max);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (v + k < V) thread_sum += expf((float)x[k] - new_max);
        }
        thread_max = new_max;
    }
    float row_max = block_reduce_max(thread_max);
    float rescaled = thread_max == -INFINITY ? 0.0f : thread_sum * expf(thread_max - row_max);
    float row_sum = block_reduce_sum(rescaled);
    if (threadIdx.x == 0) losses[n] = logf(row_sum) + row_max - target_logit;
    if (write_dlogits) write_dlogits_row_and_copy(row, copy, n, Vp, V, target, row_max, 1.0f / row_sum, dloss);
}

// Vocabulary-parallel cross-entropy (tensor parallelism, llmc/parallel/tensor_parallel.h): this process
// holds the logits of vocabulary columns [v_begin, v_begin + Vl), of which the first `valid` are real
// tokens (the rest padding). The row's max, sum of exponentials and target logit are combined across the
// processes between these kernels (the caller's all-reduces), so no process holds a whole row.

// row_max[n] = the max of this process's valid columns (-inf if none)
__global__ void classifier_slice_max_kernel(const floatX* logits, float* row_max, int valid, int Vl) {
    const floatX* row = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int v = threadIdx.x * x128::size; v < valid; v += blockDim.x * x128::size) {
        x128 x = load128(row + v);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (v + k < valid) m = fmaxf(m, (float)x[k]);
        }
    }
    m = block_reduce_max(m);
    if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

// row_sum[n] = the sum of exp(x - row_max[n]) over this process's valid columns (row_max: the max over
// all processes); target_logit[n] = the target's logit if this process holds its column, else 0
__global__ void classifier_slice_sum_kernel(const floatX* logits, const float* row_max, float* row_sum,
                                            float* target_logit, const int* targets, int v_begin, int valid, int Vl) {
    int n = blockIdx.x;
    const floatX* row = logits + (size_t)n * Vl;
    float m = row_max[n], sum = 0.0f;
    for (int v = threadIdx.x * x128::size; v < valid; v += blockDim.x * x128::size) {
        x128 x = load128(row + v);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (v + k < valid) sum += expf((float)x[k] - m);
        }
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) {
        row_sum[n] = sum;
        int t = targets[n] - v_begin;
        target_logit[n] = t >= 0 && t < valid ? (float)row[t] : 0.0f;
    }
}

// losses[n] from the combined statistics; with write_dlogits this process's columns of the logits are
// overwritten by their gradient (as fused_classifier_kernel, on a slice)
__global__ void classifier_slice_loss_kernel(floatX* logits, float* losses, const float* row_max, const float* row_sum,
                                             const float* target_logit, const int* targets, float dloss, int v_begin,
                                             int valid, int Vl, bool write_dlogits, Fp8Copy<__nv_fp8_e5m2> copy) {
    int n = blockIdx.x;
    floatX* row = logits + (size_t)n * Vl;
    float m = row_max[n], sum = row_sum[n];
    if (threadIdx.x == 0) losses[n] = logf(sum) + m - target_logit[n];
    if (write_dlogits) write_dlogits_row_and_copy(row, copy, n, Vl, valid, targets[n] - v_begin, m, 1.0f / sum, dloss);
}

// ----------------------------------------------------------------------------
// launchers

// losses[n] = cross-entropy of row n; with write_dlogits, logits are overwritten by their gradient, and
// with copy.codes (N, Vp) also their e5m2 copy. targets must lie in [0, V) (the data loader checks the
// tokens it reads).
inline void fused_classifier(floatX* logits,      // (N, Vp)
                             float* losses,       // (N)
                             const int* targets,  // (N) on the device
                             float dloss, int N, int V, int Vp, bool write_dlogits, cudaStream_t stream,
                             Fp8Copy<__nv_fp8_e5m2> copy = {}) {
    if (Vp % x128::size != 0) {
        fatal("fused_classifier needs a padded vocab divisible by %d, got %d", x128::size, Vp);
    }
    if (copy.codes != nullptr && !write_dlogits) fatal("fused_classifier: an FP8 copy of dlogits not written");
    const int block_size = 1024;
    fused_classifier_kernel<<<N, block_size, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits, copy);
    cudaCheckLaunch();
}

// The vocabulary-parallel classifier's three steps (see the kernels); between them the caller combines
// row_max by a max and row_sum, target_logit by sums over the tensor-parallel processes.
inline void classifier_slice_max(const floatX* logits, float* row_max, int N, int valid, int Vl, cudaStream_t stream) {
    classifier_slice_max_kernel<<<N, 1024, 0, stream>>>(logits, row_max, valid, Vl);
    cudaCheckLaunch();
}
inline void classifier_slice_sum(const floatX* logits, const float* row_max, float* row_sum, float* target_logit,
                                 const int* targets, int N, int v_begin, int valid, int Vl, cudaStream_t stream) {
    classifier_slice_sum_kernel<<<N, 1024, 0, stream>>>(logits, row_max, row_sum, target_logit, targets, v_begin, valid, Vl);
    cudaCheckLaunch();
}
inline void classifier_slice_loss(floatX* logits, float* losses, const float* row_max, const float* row_sum,
                                  const float* target_logit, const int* targets, float dloss, int N, int v_begin,
                                  int valid, int Vl, bool write_dlogits, cudaStream_t stream,
                                  Fp8Copy<__nv_fp8_e5m2> copy = {}) {
    if (Vl % x128::size != 0) fatal("the vocabulary-parallel classifier needs a slice divisible by %d, got %d", x128::size, Vl);
    if (copy.codes != nullptr && !write_dlogits) fatal("classifier_slice_loss: an FP8 copy of dlogits not written");
    classifier_slice_loss_kernel<<<N, 1024, 0, stream>>>(logits, losses, row_max, row_sum, target_logit, targets, dloss,
                                                         v_begin, valid, Vl, write_dlogits, copy);
    cudaCheckLaunch();
}
