// What every CUDA op header shares: error checks, the storage precision floatX, 128-bit packed
// loads and stores, warp and block reductions, and stochastic rounding.
//
// Design: activations, parameters and gradients are stored in floatX (bf16 by default, fp32 with
// -DENABLE_FP32 for tight checks against the oracle); every kernel loads floatX, computes in fp32 and
// rounds once when it stores. Element-wise kernels move 16 bytes per thread per access (8 bf16 or 4
// fp32, a Packed128), which is what keeps a memory-bound kernel near the bandwidth ceiling.
// Reductions use the xor butterfly, so every lane ends with the same bits and, with a fixed launch
// shape, every run sums in the same order: the trainer is deterministic without extra effort.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "utils.h"

// ----------------------------------------------------------------------------
// error checks: print the call's reason, our file and line, and exit non-zero

inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        fatal("CUDA: %s  [%s:%d]", cudaGetErrorString(err), file, line);
    }
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)
// after a kernel launch: catches a bad launch configuration at the launch, not at the next sync
#define cudaCheckLaunch() cuda_check(cudaGetLastError(), __FILE__, __LINE__)

inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fatal("cuBLAS: %s (status %d)  [%s:%d]", cublasGetStatusString(status), (int)status, file, line);
    }
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// storage precision

// USE_LOSS_SCALING: dynamic loss scaling (llmc/run/loss_scaler.h) in the FP16 build only: bf16 has fp32's
// exponent range, so its gradients do not underflow, and fp32 needs nothing.
#if defined(ENABLE_FP32)
typedef float floatX;
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
constexpr const char* PRECISION_NAME = "fp32";
constexpr bool USE_LOSS_SCALING = false;
#elif defined(ENABLE_FP16)
// fp16: 10 mantissa bits (finer than bf16's 7) but 5 exponent bits: nothing beyond 65504, and
// gradients below 2^-24 vanish, hence the trainer's dynamic loss scaling
typedef half floatX;
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_16F;
constexpr const char* PRECISION_NAME = "fp16";
constexpr bool USE_LOSS_SCALING = true;
#else
typedef __nv_bfloat16 floatX;
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
constexpr const char* PRECISION_NAME = "bf16";
constexpr bool USE_LOSS_SCALING = false;
#endif

// ----------------------------------------------------------------------------
// 128-bit packed vectors: Packed128<floatX> holds 8 bf16 or 4 fp32

template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T payload[size];

    __device__ __host__ T& operator[](int i) { return payload[i]; }
    __device__ __host__ const T& operator[](int i) const { return payload[i]; }

    __device__ static Packed128 constant(float value) {
        Packed128 result;
#pragma unroll
        for (int k = 0; k < size; k++) result.payload[k] = (T)value;
        return result;
    }
    __device__ static Packed128 zeros() { return constant(0.0f); }
};

typedef Packed128<floatX> x128;
typedef Packed128<float> f128;

// The address must be 16-byte aligned; every tensor the trainer hands out is (see the allocators).
template <typename T>
__device__ inline Packed128<T> load128(const T* address) {
    return *reinterpret_cast<const Packed128<T>*>(address);
}

// streaming load: data read once, so it should not evict what other warps will reuse from L2
template <typename T>
__device__ inline Packed128<T> load128cs(const T* address) {
    int4 bits = __ldcs(reinterpret_cast<const int4*>(address));
    Packed128<T> result;
    memcpy(&result, &bits, sizeof(bits));
    return result;
}

template <typename T>
__device__ inline void store128(T* address, Packed128<T> value) {
    *reinterpret_cast<Packed128<T>*>(address) = value;
}

// streaming store: written once and not read again soon
template <typename T>
__device__ inline void store128cs(T* address, Packed128<T> value) {
    int4 bits;
    memcpy(&bits, &value, sizeof(bits));
    __stcs(reinterpret_cast<int4*>(address), bits);
}

// Elementwise kernels 16 bytes at a time. Thread t of the grid takes elements [t·E, t·E + E), E =
// x128::size (8 bf16, 4 fp32): each floatX array moves as one 128-bit access per thread, each fp32 array
// as E/4. `vector` is the launcher's answer to "does every array start 16-byte aligned"
// (elementwise_aligned; a ZeRO shard or a tensor after an odd-sized one may not); where it is false,
// and for the last elements when n is not a multiple of E, the thread goes one element at a time:
// the same arithmetic, so the same bits.
constexpr int ELEMENTWISE_E = x128::size;

// One thread's share: vector_body(i0) for a whole aligned share, else element_body(i) for each of its
// elements below n
template <typename VectorBody, typename ElementBody>
__device__ inline void elementwise_share(size_t n, bool vector, VectorBody vector_body, ElementBody element_body) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * ELEMENTWISE_E;
    if (i0 >= n) return;
    if (vector && i0 + ELEMENTWISE_E <= n) {
        vector_body(i0);
        return;
    }
    for (size_t i = i0; i < n && i < i0 + ELEMENTWISE_E; i++) element_body(i);
}

template <int N>
__device__ inline void load_floats(float (&out)[N], const float* address) {
    static_assert(N % f128::size == 0, "whole 16-byte chunks");
#pragma unroll
    for (int c = 0; c < N / f128::size; c++) {
        f128 chunk = load128(address + c * f128::size);
#pragma unroll
        for (int k = 0; k < f128::size; k++) out[c * f128::size + k] = chunk[k];
    }
}

template <int N>
__device__ inline void store_floats(float* address, const float (&values)[N]) {
#pragma unroll
    for (int c = 0; c < N / f128::size; c++) {
        f128 chunk;
#pragma unroll
        for (int k = 0; k < f128::size; k++) chunk[k] = values[c * f128::size + k];
        store128(address + c * f128::size, chunk);
    }
}

// ----------------------------------------------------------------------------
// reductions

constexpr int WARP_SIZE = 32;

__device__ inline float warp_reduce_sum(float value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffff, value, offset);
    return value;
}

__device__ inline float warp_reduce_max(float value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
    return value;
}

// Reduces one value per thread over the whole block and returns the result to every thread.
// blockDim.x must be a multiple of 32 (and at most 1024); `identity` fills the unused warp slots
// (0 for a sum, -INFINITY for a max). Safe to call several times in a row.
template <float (*warp_reduce)(float)>
__device__ inline float block_reduce(float value, float identity) {
    __shared__ float warp_results[WARP_SIZE];
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int num_warps = blockDim.x / WARP_SIZE;
    __syncthreads();  // an earlier call may still be reading warp_results
    value = warp_reduce(value);
    if (lane == 0) warp_results[warp] = value;
    __syncthreads();
    value = lane < num_warps ? warp_results[lane] : identity;
    return warp_reduce(value);
}

__device__ inline float block_reduce_sum(float value) { return block_reduce<warp_reduce_sum>(value, 0.0f); }
__device__ inline float block_reduce_max(float value) { return block_reduce<warp_reduce_max>(value, -INFINITY); }

// ----------------------------------------------------------------------------
// stochastic rounding fp32 -> bf16
//
// Round-to-nearest loses every update smaller than half a bf16 step (2^-8 relative), so small AdamW
// steps on bf16 weights vanish. Rounding up with probability equal to the discarded fraction makes
// the stored value right on average. The random bits come from a hash of (element index, seed), so a
// run is reproducible and needs no random-number state.
// Host and device both: the optimizer offload (-oo 1, llmc/optimizer_offload.cuh) rounds on the CPU with
// the same bits as the GPU kernels.

// a float's bits as an integer (the device's reinterpretation; memcpy on the host)
__host__ __device__ inline uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(value);
#else
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return bits;
#endif
}

__host__ __device__ inline uint32_t hash_u32(uint32_t x, uint32_t seed) {
    // an integer mixing function (xorshift-multiply rounds); good enough to decorrelate neighbours
    x ^= seed * 0x9E3779B9u;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

__host__ __device__ inline void stochastic_round(float value, __nv_bfloat16* out, uint32_t random_bits) {
    // adding r in [0, 2^16) to the 16 bits that bf16 drops carries into the kept bits with
    // probability (dropped bits) / 2^16; works for either sign since floats are sign-magnitude. A NaN
    // becomes bf16's canonical NaN, as round-to-nearest gives it. No branch: the CPU's loop over this
    // (-oo 1) vectorizes.
    uint32_t bits = float_bits(value);
    uint32_t rounded = (bits + (random_bits & 0xFFFFu)) >> 16;
    bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    *out = __ushort_as_bfloat16((unsigned short)(nan ? 0x7FFFu : rounded));
}

__host__ __device__ inline void stochastic_round(float value, float* out, uint32_t random_bits) { *out = value; }

// fp16 is not the top half of an fp32, so no bit trick: take the two fp16 neighbours lo <= value < hi
// and pick hi with probability (value - lo) / (hi - lo). Infinities and NaN round to nearest.
__host__ __device__ inline void stochastic_round(float value, half* out, uint32_t random_bits) {
    half nearest = __float2half_rn(value);
    float nearest_value = __half2float(nearest);
    if (nearest_value == value || !isfinite(value) || !isfinite(nearest_value)) {
        *out = nearest;
        return;
    }
    // the neighbour on the other side of value: one step of the fp16 bit pattern away from zero or towards it
    unsigned short bits = __half_as_ushort(nearest);
    bool away_from_zero = fabsf(value) > fabsf(nearest_value);
    unsigned short other_bits = away_from_zero ? bits + 1 : (bits & 0x7FFFu) == 0 ? (unsigned short)((bits ^ 0x8000u) + 1) : bits - 1;
    half other = __ushort_as_half(other_bits);
    float other_value = __half2float(other);
    float lo = fminf(nearest_value, other_value), hi = fmaxf(nearest_value, other_value);
    if (!isfinite(hi) || !isfinite(lo)) {
        *out = nearest;
        return;
    }
    float p_hi = (value - lo) / (hi - lo);
    float u = (random_bits >> 8) * (1.0f / 16777216.0f);  // uniform in [0, 1) with 24 bits
    float chosen = u < p_hi ? hi : lo;
    *out = chosen == nearest_value ? nearest : other;
}

// ----------------------------------------------------------------------------
// host helpers

// grid sizes are ints
inline int ceil_div_int(long a, long b) { return (int)ceil_div(a, b); }

// An elementwise kernel's grid (above): blocks of block_size threads, ELEMENTWISE_E elements a thread
inline int elementwise_blocks(size_t n, int block_size) { return ceil_div_int(ceil_div(n, (size_t)ELEMENTWISE_E), block_size); }

// true if every non-null pointer starts 16-byte aligned (an elementwise kernel's `vector`)
inline bool elementwise_aligned(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers) {
        if ((uintptr_t)p % 16 != 0) return false;
    }
    return true;
}

// dst += src, rounded to floatX, elementwise 16 bytes at a time: ZeRO-2's running gradient sum over
// micro-steps (train_gpt2.cu) and -bg 1's bias gradient from cuBLASLt's scratch (matmul.cuh)
__global__ void add_into_kernel(floatX* dst, const floatX* src, size_t n, bool vector) {
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 d = load128(dst + i0), add = load128(src + i0);
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) d[k] = (floatX)((float)d[k] + (float)add[k]);
            store128(dst + i0, d);
        },
        [&](size_t i) { dst[i] = (floatX)((float)dst[i] + (float)src[i]); });
}

inline void add_into(floatX* dst, const floatX* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block_size = 256;
    add_into_kernel<<<elementwise_blocks(n, block_size), block_size, 0, stream>>>(dst, src, n,
                                                                                 elementwise_aligned({dst, src}));
    cudaCheckLaunch();
}

// Bytes from `offset` rounded up to the next multiple of 256: the allocators put every tensor on such
// a boundary so 128-bit accesses and cuBLASLt's fastest kernels apply to each of them.
inline size_t align_up_256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

// fp32 <-> floatX on the host, for copying checkpoints and test data in and out
inline floatX host_to_floatX(float value) {
#if defined(ENABLE_FP32)
    return value;
#elif defined(ENABLE_FP16)
    return __float2half_rn(value);
#else
    return __float2bfloat16_rn(value);
#endif
}

inline float host_from_floatX(floatX value) {
#if defined(ENABLE_FP32)
    return value;
#elif defined(ENABLE_FP16)
    return __half2float(value);
#else
    return __bfloat162float(value);
#endif
}

// ----------------------------------------------------------------------------
// cuBLAS / cuBLASLt handles, shared by matmul.cuh and attention.cuh
//
// One 32 MiB workspace serves both libraries: all our work runs on one stream, so they never use it
// at the same time. With one stream and a given workspace, cuBLAS returns the same bits every run on
// the same GPU model (its documented reproducibility rule), which our determinism relies on.

constexpr size_t CUBLAS_WORKSPACE_BYTES = 32 * 1024 * 1024;

struct CublasContext {
    cublasLtHandle_t lt = nullptr;
    cublasHandle_t blas = nullptr;
    void* workspace = nullptr;
};
inline CublasContext cublas_context;

// Points the cuBLAS handle at `stream` before a call. cublasSetStream also puts the handle back on
// cuBLAS's default workspace pool (documented), so our workspace is set again right after: without
// that cuBLAS would allocate its own, and the "given workspace" of the reproducibility rule would not
// hold. Both are cheap host calls, made before every cuBLAS call rather than cached, so a stream
// destroyed and another created at the same address can never be confused. (cuBLASLt takes the
// stream and the workspace with each call.)
inline void cublas_use_stream(cudaStream_t stream) {
    cublasCheck(cublasSetStream(cublas_context.blas, stream));
    cublasCheck(cublasSetWorkspace(cublas_context.blas, cublas_context.workspace, CUBLAS_WORKSPACE_BYTES));
}

inline void cublas_setup() {
    cublasCheck(cublasLtCreate(&cublas_context.lt));
    cublasCheck(cublasCreate(&cublas_context.blas));
    cudaError_t allocated = cudaMalloc(&cublas_context.workspace, CUBLAS_WORKSPACE_BYTES);
    if (allocated == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
        fatal("the GPU has %.1f MiB free of %.1f MiB, less than cuBLAS's %d MiB workspace: nothing else can run",
              free_bytes / 1048576.0, total_bytes / 1048576.0, (int)(CUBLAS_WORKSPACE_BYTES >> 20));
    }
    cudaCheck(allocated);
    cublasCheck(cublasSetWorkspace(cublas_context.blas, cublas_context.workspace, CUBLAS_WORKSPACE_BYTES));
    // fp32 builds stay fp32 (no TF32), since they exist for tight checks against the oracle
    cublasCheck(cublasSetMathMode(cublas_context.blas, CUBLAS_DEFAULT_MATH));
}

inline void cublas_teardown() {
    cudaCheck(cudaFree(cublas_context.workspace));
    cublasCheck(cublasDestroy(cublas_context.blas));
    cublasCheck(cublasLtDestroy(cublas_context.lt));
    cublas_context = CublasContext{};
}
