// FP8 matmuls on Hopper (issue 48), the two pieces under them: tensors to 8-bit floats with a
// per-tensor scale (fp8_cast), and the product of two such tensors through cuBLASLt (fp8_matmul). cuBLASLt's FP8 product takes one layout only, both operands K-contiguous ("TN",
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

#include <map>
#include <tuple>
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
    __shared__ unsigned char tile[FP8_TILE][FP8_TILE + 4];  // the 8-bit codes (Fp8's __x)
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
            tile[i][lane] = q.__x;
        }
    }
    __syncthreads();
    if (out_t) {
        for (int i = first; i < FP8_TILE; i += step) {  // and writes 32 consecutive values of a column
            int c = c0 + i, r = r0 + lane;
            if (r < rows && c < cols) out_t[(size_t)c * rows + r].__x = tile[lane][i];
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

// out (M, N) = scale_x · scale_w · X8 (M, K) · W8 (N, K)ᵀ, accumulated in fp32 and rounded to floatX once:
// cuBLASLt's FP8 product in the one layout Hopper takes, both operands contiguous along K ("TN"; in
// cuBLASLt's column-major terms outᵀ = op(W8) · X8 with W8 transposed). X8 is e4m3, or e5m2 for a
// gradient; W8 e4m3. scale_x and scale_w are device floats, each in an allocation of its own: cuBLASLt
// refused a scale 4 bytes after the other on the H100 (doc/mixed_precision.md). M, N and K must be
// multiples of 16 (the FP8 path's rule). The heuristic's first candidate that runs on these pointers is
// kept per shape.
template <typename Fp8X>
inline void fp8_matmul(floatX* out, const Fp8X* x8, const __nv_fp8_e4m3* w8, const float* scale_x, const float* scale_w,
                       int M, int N, int K, cudaStream_t stream) {
    static_assert(std::is_same<Fp8X, __nv_fp8_e4m3>::value || std::is_same<Fp8X, __nv_fp8_e5m2>::value, "e4m3 or e5m2");
    if (M % 16 != 0 || N % 16 != 0 || K % 16 != 0) {
        fatal("fp8_matmul: (%d, %d) x (%d, %d)ᵀ: cuBLASLt's FP8 product takes dimensions that are multiples of 16", M, K,
              N, K);
    }
    const cudaDataType_t type_x = std::is_same<Fp8X, __nv_fp8_e4m3>::value ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_w, sizeof(scale_w)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_x, sizeof(scale_x)));
    cublasLtMatrixLayout_t layout_w, layout_x, layout_out;
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_w, CUDA_R_8F_E4M3, K, N, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_x, type_x, K, M, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_out, CUBLAS_FLOATX, N, M, N));
    const float alpha = 1.0f, beta = 0.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(cublas_context.lt, desc, &alpha, w8, layout_w, x8, layout_x, &beta, out, layout_out, out,
                              layout_out, &algo, cublas_context.workspace, CUBLAS_WORKSPACE_BYTES, stream);
    };
    struct Key {
        int M, N, K, type;
        bool operator<(const Key& o) const { return std::tie(M, N, K, type) < std::tie(o.M, o.N, o.K, o.type); }
    };
    static std::map<Key, cublasLtMatmulAlgo_t> chosen;
    Key key{M, N, K, (int)type_x};
    auto known = chosen.find(key);
    if (known != chosen.end()) {
        cublasCheck(run(known->second));
    } else {
        cublasLtMatmulPreference_t preference;
        cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
        size_t workspace = CUBLAS_WORKSPACE_BYTES;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                         sizeof(workspace)));
        constexpr int MAX_CANDIDATES = 8;
        cublasLtMatmulHeuristicResult_t candidates[MAX_CANDIDATES];
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublas_context.lt, desc, layout_w, layout_x, layout_out, layout_out,
                                                   preference, MAX_CANDIDATES, candidates, &found));
        cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
        cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
        for (int i = 0; i < found && status != CUBLAS_STATUS_SUCCESS; i++) {
            status = run(candidates[i].algo);
            if (status == CUBLAS_STATUS_SUCCESS) chosen[key] = candidates[i].algo;
        }
        if (status != CUBLAS_STATUS_SUCCESS) {
            fatal("fp8_matmul: cuBLASLt ran none of its %d candidates for (%d, %d) x (%d, %d)ᵀ: %s (FP8 needs an sm_89+ "
                  "GPU)", found, M, K, N, K, cublasGetStatusString(status));
        }
    }
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_w));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_x));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_out));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}
