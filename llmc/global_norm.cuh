// The global gradient norm's sum of squares on the GPU, deterministic: a fixed grid of NORM_BLOCKS blocks
// each reduces a fixed strided subset to one partial sum, then one block adds the partials in a fixed
// tree order, so the same gradient gives the same bits on every run and device. The trainer adds the sums
// of its ranges and over the processes (llmc/parallel/grad_completion.h); Muon and Adafactor use it for
// their matrices' norms.
#pragma once

#include <algorithm>

#include "cuda_common.cuh"

constexpr int NORM_BLOCKS = 512;  // fixed, not taken from the device, so the summation order is fixed
constexpr int NORM_THREADS = 512;

// Block b of the fixed grid: its threads' strided elements, the stride the whole grid's (NORM_BLOCKS
// blocks), whether or not every block is launched.
__global__ void sum_of_squares_partials_kernel(float* partials, const floatX* x, size_t n) {
    float sum = 0.0f;
    size_t stride = (size_t)NORM_BLOCKS * NORM_THREADS * x128::size;
    for (size_t i = ((size_t)blockIdx.x * NORM_THREADS + threadIdx.x) * x128::size; i < n; i += stride) {
        x128 chunk = load128(x + i);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)chunk[k] * (float)chunk[k];
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// one block of NORM_BLOCKS threads
__global__ void sum_partials_kernel(float* out, const float* partials) {
    float total = block_reduce_sum(partials[threadIdx.x]);
    if (threadIdx.x == 0) *out = total;
}

// *out (on the device) = sum of x[i]^2. partials: NORM_BLOCKS floats of scratch. Blocks whose elements
// all lie past n (a tensor under 2M elements: a bias, the tiny models) would each sum nothing to +0: they
// are not launched and their partials are set to +0 instead, the same bits (a d12 bias took 512 blocks
// of 512 threads for its 768 values).
inline void sum_of_squares(float* out, float* partials, const floatX* x, size_t n, cudaStream_t stream) {
    if (n % x128::size != 0) {
        fatal("sum_of_squares needs a size divisible by %d, got %zu", x128::size, n);
    }
    size_t per_block = (size_t)NORM_THREADS * x128::size;
    int blocks = (int)std::min<size_t>(NORM_BLOCKS, (n + per_block - 1) / per_block);
    if (blocks < NORM_BLOCKS) cudaCheck(cudaMemsetAsync(partials + blocks, 0, (NORM_BLOCKS - blocks) * sizeof(float), stream));
    if (blocks > 0) {
        sum_of_squares_partials_kernel<<<blocks, NORM_THREADS, 0, stream>>>(partials, x, n);
        cudaCheckLaunch();
    }
    sum_partials_kernel<<<1, NORM_BLOCKS, 0, stream>>>(out, partials);
    cudaCheckLaunch();
}
