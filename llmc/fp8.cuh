// Tensors to 8-bit floats with a per-tensor scale (issue 48: FP8 matmuls on Hopper), the cast an FP8
// GEMM's operands need. cuBLASLt's FP8 product takes one layout only, both operands K-contiguous ("TN",
// dev/cuda/matmul_fp8.cu), so a backward GEMM needs some operands transposed: the cast writes the
// row-major copy, the transposed one, or both, from one read of the tensor.
//
// The scale: q = fp8(x / scale), saturating to the format's largest finite value (e4m3: 448, e5m2:
// 57344; cuda_fp8.h's conversions, which dev/emu checks against PyTorch's float8 casts), so a scale of
// amax / 448 maps the tensor's largest magnitude to e4m3's largest value. The cast reads the scale from
// the device and folds the tensor's amax = max |x| into a device word as it goes, so a step can take
// its scales from the amax the previous step recorded (delayed scaling) with no host sync: one pass.
// The amax is combined with atomicMax on the float's bits (non-negative floats order as their bit
// patterns do), which is exact and does not depend on the blocks' order.
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "cuda_common.cuh"

constexpr int FP8_TILE = 32;           // a block casts a 32 x 32 tile, transposed through shared memory
constexpr int FP8_THREADS = 256;       // 8 rows of the tile at a time
constexpr float FP8_E4M3_MAX = 448.0f;
constexpr float FP8_E5M2_MAX = 57344.0f;

template <typename Fp8>
__host__ __device__ constexpr float fp8_max() {
    return std::is_same<Fp8, __nv_fp8_e4m3>::value ? FP8_E4M3_MAX : FP8_E5M2_MAX;
}

// in (rows, cols) row-major -> out (rows, cols) and/or out_t (cols, rows), each skipped when null;
// *amax_bits = max(*amax_bits, bits of max |x|) over the tile.
template <typename Fp8>
__global__ void fp8_cast_kernel(Fp8* out, Fp8* out_t, const floatX* in, int rows, int cols, const float* scale,
                                unsigned* amax_bits) {
    __shared__ Fp8 tile[FP8_TILE][FP8_TILE + 4];
    const int r0 = blockIdx.y * FP8_TILE, c0 = blockIdx.x * FP8_TILE;
    const int lane = threadIdx.x % FP8_TILE, first = threadIdx.x / FP8_TILE, step = FP8_THREADS / FP8_TILE;
    const float inv_scale = 1.0f / *scale;
    float local_max = 0.0f;
    for (int i = first; i < FP8_TILE; i += step) {  // a warp reads 32 consecutive values of a row
        int r = r0 + i, c = c0 + lane;
        if (r < rows && c < cols) {
            float x = (float)in[(size_t)r * cols + c];
            local_max = fmaxf(local_max, fabsf(x));
            Fp8 q(x * inv_scale);  // the conversion saturates
            if (out) out[(size_t)r * cols + c] = q;
            tile[i][lane] = q;
        }
    }
    __syncthreads();
    if (out_t) {
        for (int i = first; i < FP8_TILE; i += step) {  // and writes 32 consecutive values of a column
            int c = c0 + i, r = r0 + lane;
            if (r < rows && c < cols) out_t[(size_t)c * rows + r] = tile[lane][i];
        }
    }
    float block_max = block_reduce_max(local_max);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(block_max));
}

// The launch: in (rows, cols) bf16/fp32 on the device, scale a device float, amax_bits a device word
// (zero it to start a new maximum; __uint_as_float of it is the amax).
template <typename Fp8>
inline void fp8_cast(Fp8* out, Fp8* out_t, const floatX* in, int rows, int cols, const float* scale, unsigned* amax_bits,
                     cudaStream_t stream) {
    if (out == nullptr && out_t == nullptr) fatal("fp8_cast: neither a row-major nor a transposed output");
    dim3 grid(ceil_div_int(cols, FP8_TILE), ceil_div_int(rows, FP8_TILE));
    fp8_cast_kernel<Fp8><<<grid, FP8_THREADS, 0, stream>>>(out, out_t, in, rows, cols, scale, amax_bits);
    cudaCheckLaunch();
}

// The scale for the next cast from a recorded amax: amax / (the format's largest value), or 1 for a
// tensor that was all zeros (any scale casts zeros exactly).
template <typename Fp8>
__global__ void fp8_scale_from_amax_kernel(float* scale, const unsigned* amax_bits) {
    float amax = __uint_as_float(*amax_bits);
    *scale = amax > 0.0f ? amax / fp8_max<Fp8>() : 1.0f;
}
