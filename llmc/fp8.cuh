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
#include <set>
#include <tuple>
#include <type_traits>

#include "cuda_common.cuh"
#include "gelu.cuh"    // gelu_derivative
#include "matmul.cuh"  // pointer_alignment, matmul_dbias's second stage

constexpr int FP8_TILE = 32;           // a block casts a 32 x 32 tile, transposed through shared memory
constexpr int FP8_THREADS = 256;       // 8 rows of the tile at a time
constexpr float FP8_E4M3_MAX = 448.0f;
constexpr float FP8_E5M2_MAX = 57344.0f;

template <typename Fp8>
__host__ __device__ constexpr float fp8_max() {
    return std::is_same<Fp8, __nv_fp8_e4m3>::value ? FP8_E4M3_MAX : FP8_E5M2_MAX;
}

// The row blocks of a cast that also sums columns (a backward's dy: its bias gradient's first stage,
// folded into the cast's read of dy): their partial sums fill matmul_dbias's scratch.
constexpr int FP8_ROW_BLOCKS = MATMUL_DBIAS_ROW_BLOCKS;

// Where a kernel that produces a tensor also writes its FP8 copy: the codes, the device scale they are
// cast with (q = fp8(v / scale)), and the device word the tensor's amax is folded into (null: none
// recorded). codes null: no copy.
template <typename Fp8>
struct Fp8Copy {
    Fp8* codes = nullptr;
    const float* scale = nullptr;
    unsigned* amax = nullptr;
};

// *amax_bits = max(*amax_bits, bits of the block's largest local_max), called by every thread of the block.
__device__ inline void fp8_record_block_amax(float local_max, unsigned* amax_bits) {
    float block_max = block_reduce_max(local_max);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(block_max));
}

// A cast's row blocks: one a 32-row tile, or, for a cast that sums columns, at most FP8_ROW_BLOCKS of
// them (each then casts several tiles), which is how many partial sums fp8_cast_dbias adds.
inline int fp8_cast_row_blocks(int rows, bool sums_columns) {
    return std::min(ceil_div_int(rows, FP8_TILE), sums_columns ? FP8_ROW_BLOCKS : 65535);
}

// in (rows, cols) row-major -> out (rows, cols) and/or out_t (cols, rows), each skipped when null;
// *amax_bits = max(*amax_bits, bits of max |v|). v is in's element, or, with gelu_pre non-null, the
// GELU's backward of it: floatX(gelu'(gelu_pre) · in), gelu_backward's value to the bit (the MLP's fc
// takes its dy so, without gelu_backward's pass). With partials non-null, partials[blockIdx.y][c] = the
// sum of v over column c of the block's rows (fp32, in a fixed order). Block (x, y) casts the 32-column
// strip x, row tiles y, y + gridDim.y, ...
template <typename Fp8>
__global__ void fp8_cast_kernel(Fp8* out, Fp8* out_t, const floatX* in, const floatX* gelu_pre, int rows, int cols,
                                const float* scale, unsigned* amax_bits, float* partials) {
    __shared__ unsigned char tile[FP8_TILE][FP8_TILE + 4];  // the 8-bit codes (Fp8's __x)
    __shared__ float column_sums[FP8_THREADS / FP8_TILE][FP8_TILE];
    const int c0 = blockIdx.x * FP8_TILE;
    const int lane = threadIdx.x % FP8_TILE, first = threadIdx.x / FP8_TILE, step = FP8_THREADS / FP8_TILE;
    const float inv_scale = 1.0f / *scale;
    float local_max = 0.0f, column_sum = 0.0f;
    for (int r0 = blockIdx.y * FP8_TILE; r0 < rows; r0 += gridDim.y * FP8_TILE) {
        for (int i = first; i < FP8_TILE; i += step) {  // a warp reads 32 consecutive values of a row
            int r = r0 + i, c = c0 + lane;
            if (r < rows && c < cols) {
                size_t at = (size_t)r * cols + c;
                float v = (float)in[at];
                if (gelu_pre) v = (float)(floatX)(gelu_derivative((float)gelu_pre[at]) * v);
                local_max = fmaxf(local_max, fabsf(v));
                column_sum += v;
                Fp8 q(v * inv_scale);  // the conversion saturates
                if (out) out[at] = q;
                tile[i][lane] = q.__x;
            }
        }
        if (out_t) {  // uniform: the whole block
            __syncthreads();
            for (int i = first; i < FP8_TILE; i += step) {  // and writes 32 consecutive values of a column
                int c = c0 + i, r = r0 + lane;
                if (r < rows && c < cols) out_t[(size_t)c * rows + r].__x = tile[lane][i];
            }
            __syncthreads();  // the tile read before the next one overwrites it
        }
    }
    if (partials) {  // uniform
        column_sums[first][lane] = column_sum;
        __syncthreads();
        if (first == 0 && c0 + lane < cols) {
            float sum = 0.0f;
            for (int y = 0; y < step; y++) sum += column_sums[y][lane];
            partials[(size_t)blockIdx.y * cols + c0 + lane] = sum;
        }
    }
    if (amax_bits != nullptr) fp8_record_block_amax(local_max, amax_bits);  // uniform: the whole block
}

// *amax_bits = max(*amax_bits, bits of max |x|) over in (n), without a cast: what a step that runs its
// products in BF16 records for the next one's scales (the first step, llmc/fp8_linear.cuh). As with
// fp8_cast, a null amax_bits records nothing (no launch).
__global__ void fp8_amax_kernel(const floatX* in, size_t n, unsigned* amax_bits) {
    float local_max = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        local_max = fmaxf(local_max, fabsf((float)in[i]));
    }
    fp8_record_block_amax(local_max, amax_bits);
}

inline void fp8_amax(const floatX* in, size_t n, unsigned* amax_bits, cudaStream_t stream) {
    if (amax_bits == nullptr) return;
    int blocks = (int)std::min<size_t>(ceil_div(n, (size_t)FP8_THREADS), 1024);
    fp8_amax_kernel<<<std::max(blocks, 1), FP8_THREADS, 0, stream>>>(in, n, amax_bits);
    cudaCheckLaunch();
}

// The launch: in (rows, cols) bf16/fp32 on the device, scale a device float, amax_bits a device word
// (zero it to start a new maximum; __uint_as_float of it is the amax), or null to record nothing.
// gelu_pre (rows, cols) or null: the kernel's GELU backward. partials or null: (FP8_ROW_BLOCKS, cols)
// floats, the column sums' first stage, which fp8_cast_dbias finishes.
template <typename Fp8>
inline void fp8_cast(Fp8* out, Fp8* out_t, const floatX* in, int rows, int cols, const float* scale, unsigned* amax_bits,
                     cudaStream_t stream, const floatX* gelu_pre = nullptr, float* partials = nullptr) {
    if (out == nullptr && out_t == nullptr) fatal("fp8_cast: neither a row-major nor a transposed output");
    dim3 grid(ceil_div_int(cols, FP8_TILE), fp8_cast_row_blocks(rows, partials != nullptr));
    fp8_cast_kernel<Fp8><<<grid, FP8_THREADS, 0, stream>>>(out, out_t, in, gelu_pre, rows, cols, scale, amax_bits, partials);
    cudaCheckLaunch();
}

// dbias (cols) += the column sums of the v a cast of (rows, cols) with partials read: its partials
// summed in row-block order (matmul_dbias's second stage).
inline void fp8_cast_dbias(floatX* dbias, const float* partials, int rows, int cols, cudaStream_t stream) {
    matmul_dbias_sum_partials_kernel<<<ceil_div_int(cols, 256), 256, 0, stream>>>(dbias, partials,
                                                                                  fp8_cast_row_blocks(rows, true), cols);
    cudaCheckLaunch();
}

// GELU whose output is also an FP8 product's input: out = gelu(inp) in floatX (gelu_forward's bits) and
// out8 = its e4m3 copy with the scale (the codes fp8_cast writes for out: the rounded value cast), out's
// amax folded into amax_bits (null: none). One read of inp, where gelu_forward and then a cast read
// inp and then out. n a multiple of x128::size.
__global__ void fp8_gelu_forward_kernel(floatX* out, __nv_fp8_e4m3* out8, const floatX* inp, size_t n, const float* scale,
                                        unsigned* amax_bits) {
    struct alignas(x128::size) Codes { unsigned char c[x128::size]; };
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    float local_max = 0.0f;
    if (idx < n) {
        const float inv_scale = 1.0f / *scale;
        x128 x = load128cs(inp + idx);
        x128 y;
        Codes codes;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            y[k] = (floatX)gelu_value((float)x[k]);
            float v = (float)y[k];
            local_max = fmaxf(local_max, fabsf(v));
            codes.c[k] = __nv_fp8_e4m3(v * inv_scale).__x;
        }
        store128(out + idx, y);
        *reinterpret_cast<Codes*>(out8 + idx) = codes;
    }
    if (amax_bits != nullptr) fp8_record_block_amax(local_max, amax_bits);  // uniform: the whole block
}

inline void fp8_gelu_forward(floatX* out, __nv_fp8_e4m3* out8, const floatX* inp, size_t n, const float* scale,
                             unsigned* amax_bits, cudaStream_t stream) {
    check_gelu_size(n);
    fp8_gelu_forward_kernel<<<ceil_div_int(n / x128::size, FP8_THREADS), FP8_THREADS, 0, stream>>>(out, out8, inp, n, scale,
                                                                                                   amax_bits);
    cudaCheckLaunch();
}

// out (rows, cols) += bias (cols), each row: the bias where cuBLASLt's FP8 product takes no BIAS epilogue.
__global__ void fp8_add_bias_kernel(floatX* out, const floatX* bias, size_t rows, int cols) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = (floatX)((float)out[i] + (float)bias[i % cols]);
    }
}

inline void fp8_add_bias(floatX* out, const floatX* bias, size_t rows, int cols, cudaStream_t stream) {
    int blocks = (int)std::min<size_t>(ceil_div(rows * cols, (size_t)256), 4096);
    fp8_add_bias_kernel<<<blocks, 256, 0, stream>>>(out, bias, rows, cols);
    cudaCheckLaunch();
}

// The scale for the next cast from a recorded amax: amax / (the format's largest value), or 1 for a
// tensor that was all zeros (any scale casts zeros exactly).
template <typename Fp8>
__global__ void fp8_scale_from_amax_kernel(float* scale, const unsigned* amax_bits) {
    float amax = __uint_as_float(*amax_bits);
    *scale = amax > 0.0f ? amax / fp8_max<Fp8>() : 1.0f;
}

// out (M, N) = scale_x · scale_w · X8 (M, K) · W8 (N, K)ᵀ [+ bias (N)] [+ out if accumulate], accumulated
// in fp32 and rounded to floatX once: cuBLASLt's FP8 product in the one layout Hopper takes, both operands
// contiguous along K ("TN"; in cuBLASLt's column-major terms outᵀ = op(W8) · X8 with W8 transposed). X8 is
// e4m3, or e5m2 for a gradient; W8 e4m3. The bias (floatX, D's type) rides on the BIAS epilogue; accumulate
// adds into out (beta = 1, C = D, floatX: a weight gradient summed over micro-steps). scale_x and scale_w are
// device floats, each in an allocation of its own or 256 bytes apart: cuBLASLt refused a scale 4 bytes after
// the other on the H100 (doc/mixed_precision.md). M, N and K must be multiples of 16 (the FP8 path's rule).
// The heuristic is told out's and the bias's real alignment; its first candidate that runs is kept per
// problem (shape, type, epilogue, alignments), so a problem gets the same kernel, the same bits, every call.
// Returns false, having computed nothing, when cuBLASLt runs no candidate with the bias or the addition
// (the caller then does without: fp8_linear.cuh); without either, that is fatal.
template <typename Fp8X>
inline bool fp8_matmul(floatX* out, const Fp8X* x8, const __nv_fp8_e4m3* w8, const float* scale_x, const float* scale_w,
                       int M, int N, int K, cudaStream_t stream, const floatX* bias = nullptr, bool accumulate = false) {
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
    if (bias != nullptr) {
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bias_type = CUBLAS_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t layout_w, layout_x, layout_out;
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_w, CUDA_R_8F_E4M3, K, N, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_x, type_x, K, M, K));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_out, CUBLAS_FLOATX, N, M, N));
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(cublas_context.lt, desc, &alpha, w8, layout_w, x8, layout_x, &beta, out, layout_out, out,
                              layout_out, &algo, cublas_context.workspace, CUBLAS_WORKSPACE_BYTES, stream);
    };
    const uint32_t align_out = pointer_alignment(out), align_bias = pointer_alignment(bias);
    struct Key {
        int M, N, K, type, bias, accumulate;
        uint32_t align_out, align_bias;
        bool operator<(const Key& o) const {
            return std::tie(M, N, K, type, bias, accumulate, align_out, align_bias) <
                   std::tie(o.M, o.N, o.K, o.type, o.bias, o.accumulate, o.align_out, o.align_bias);
        }
    };
    static std::map<Key, cublasLtMatmulAlgo_t> chosen;
    static std::set<Key> refused;  // problems with a bias or an addition that no candidate ran
    Key key{M, N, K, (int)type_x, bias != nullptr, accumulate, align_out, align_bias};
    auto known = chosen.find(key);
    bool computed = true;
    if (known != chosen.end()) {
        cublasCheck(run(known->second));
    } else if (refused.count(key)) {
        computed = false;
    } else {
        cublasLtMatmulPreference_t preference;
        cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
        size_t workspace = CUBLAS_WORKSPACE_BYTES;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                         sizeof(workspace)));
        for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
            cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &align_out, sizeof(align_out)));
        }
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
        if (status != CUBLAS_STATUS_SUCCESS && (bias != nullptr || accumulate)) {
            printf("fp8_matmul: cuBLASLt ran none of its %d candidates for (%d, %d) x (%d, %d)ᵀ%s (%s): that part is done "
                   "apart\n", found, M, K, N, K, bias ? " with the BIAS epilogue" : " adding into the output",
                   cublasGetStatusString(status));
            refused.insert(key);
            computed = false;
        } else if (status != CUBLAS_STATUS_SUCCESS) {
            fatal("fp8_matmul: cuBLASLt ran none of its %d candidates for (%d, %d) x (%d, %d)ᵀ: %s (FP8 needs an sm_89+ "
                  "GPU)", found, M, K, N, K, cublasGetStatusString(status));
        }
    }
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_w));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_x));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_out));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return computed;
}
