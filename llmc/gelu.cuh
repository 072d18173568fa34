// GELU (tanh approximation) on the GPU, forward and backward, 8 bf16 (or 4 fp32) per thread.
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// The backward overwrites dinp (it may be the same buffer as dout: each thread reads its 16 bytes
// before writing them). The trainer uses the same forward kernel when it recomputes GELU (-r 1), so a
// recomputed activation has the same bits as the original. (With -ge 1 the forward's GELU comes from
// cuBLASLt's epilogue instead, and the recompute re-runs that matmul: train_gpt2.cu, gpt2_backward.)
#pragma once

#include "cuda_common.cuh"

constexpr float GELU_SCALE_F = 0.7978845608028654f;  // sqrt(2 / pi)

// ----------------------------------------------------------------------------
// kernels

__device__ inline float gelu_value(float x) {
    float u = GELU_SCALE_F * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ inline float gelu_derivative(float x) {
    float u = GELU_SCALE_F * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float du_dx = GELU_SCALE_F * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= N) return;
    x128 x = load128cs(inp + idx);
    x128 y;
#pragma unroll
    for (int k = 0; k < x128::size; k++) y[k] = (floatX)gelu_value((float)x[k]);
    store128(out + idx, y);
}

__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= N) return;
    x128 x = load128cs(inp + idx);
    x128 dy = load128(dout + idx);
    x128 dx;
#pragma unroll
    for (int k = 0; k < x128::size; k++) dx[k] = (floatX)(gelu_derivative((float)x[k]) * (float)dy[k]);
    store128(dinp + idx, dx);
}

// ----------------------------------------------------------------------------
// launchers

inline void check_gelu_size(size_t N) {
    if (N % x128::size != 0) {
        fatal("CUDA gelu needs a size divisible by %d, got %zu", x128::size, N);
    }
}

inline void gelu_forward(floatX* out,        // (N)
                         const floatX* inp,  // (N)
                         size_t N, cudaStream_t stream) {
    check_gelu_size(N);
    const int block_size = 256;
    gelu_forward_kernel<<<ceil_div_int(N / x128::size, block_size), block_size, 0, stream>>>(out, inp, N);
    cudaCheckLaunch();
}

// dinp = gelu'(inp) * dout, overwriting dinp (which may be dout itself).
inline void gelu_backward(floatX* dinp,        // (N)
                          const floatX* inp,   // (N) the GELU's input
                          const floatX* dout,  // (N)
                          size_t N, cudaStream_t stream) {
    check_gelu_size(N);
    const int block_size = 256;
    gelu_backward_kernel<<<ceil_div_int(N / x128::size, block_size), block_size, 0, stream>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
}
