// cuBLAS on the CPU: handles, streams, workspaces, math modes, cublasGemmEx,
// cublasGemmStridedBatchedEx, and the legacy cublasSgemm and cublasSgemmStridedBatched (the same
// products with fp32 A, B, C and CUBLAS_COMPUTE_32F). cuBLASLt is in cublas_lt.cpp, the shared kernel in cublas_gemm.cpp.
//
// Notes for the emulator (what is emulated and how):
// - Semantics are NVIDIA's cuBLAS documentation: column-major storage, op(X) = X or Xᵀ (OP_C is OP_T for
//   real types), C = alpha·op(A)·op(B) + beta·C, with C not read when beta == 0; leading dimensions at
//   least the stored rows (else CUBLAS_STATUS_INVALID_VALUE); m = 0 or n = 0 is a no-op.
// - Types: with CUBLAS_COMPUTE_32F (or _PEDANTIC, _FAST_TF32) A = B = bf16 with C bf16 or fp32, or
//   A = B = C = fp32. Every product accumulates in fp32 in a fixed k order (deterministic, independent
//   of threads) and rounds once to the output type (bf16: round to nearest even). Anything else
//   (fp64, int8, other compute types; fp16 only as bf16 is, for the FP16 build) returns CUBLAS_STATUS_NOT_SUPPORTED with a printed reason.
// - TF32: a GPU's tensor cores read fp32 inputs as TF32 when the compute type is
//   CUBLAS_COMPUTE_32F_FAST_TF32, or CUBLAS_COMPUTE_32F with the handle's math mode
//   CUBLAS_TF32_TENSOR_OP_MATH (cuBLAS "allows" it). The emulator does what that allows every time:
//   fp32 inputs are rounded to TF32 (10 mantissa bits, to nearest even) before the product, so code
//   that opts in sees TF32-sized errors here too. bf16 inputs are exact in TF32.
// - alpha and beta are host pointers (CUBLAS_POINTER_MODE_HOST, the default), read at the call; the
//   product itself is queued on the handle's stream (cuBLAS) or the call's stream (cuBLASLt) and runs
//   in stream order on the emulated device, split over two host threads when it is large.
// - Pointers are checked at the call: A, B, C (D, bias, aux for cuBLASLt) must be device memory
//   covering the extent their layout implies; alpha/beta must not be device memory.
// - Workspaces are tracked (cublasSetStream resets a cublasSetWorkspace workspace to the default pool,
//   as documented; emu::cublas_user_workspace shows it) but not used: the CPU kernel needs none.
// - cuBLASLt: see cublas_lt.cpp (epilogues, the alignment promise of the heuristic).
#include <cstdio>
#include <cstring>

#include "cublas_gemm.h"
#include "emu/device.h"

struct cublasContext {
    cudaStream_t stream = nullptr;
    void* user_workspace = nullptr;  // nullptr: the library's default pool
    size_t user_workspace_bytes = 0;
    cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    if (handle == nullptr) return emu_blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: handle is NULL");
    *handle = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (handle == nullptr) return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy: handle is NULL");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (handle == nullptr) return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream: handle is NULL");
    handle->stream = stream;
    // cuBLAS documentation (cublasSetStream): "resets the user-provided workspace to the default workspace pool"
    handle->user_workspace = nullptr;
    handle->user_workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
    if (handle == nullptr) return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetStream: handle is NULL");
    if (stream == nullptr) return emu_blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream: stream is NULL");
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t workspace_bytes) {
    if (handle == nullptr) {
        return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace: handle is NULL");
    }
    // documented: the workspace must be aligned to at least 256 bytes
    if ((uintptr_t)workspace % 256 != 0) {
        return emu_blas::refuse(CUBLAS_STATUS_INVALID_VALUE,
                                "cublasSetWorkspace: workspace %p is not aligned to 256 bytes", workspace);
    }
    if (workspace != nullptr && workspace_bytes > 0 && !emu::is_device_pointer(workspace, workspace_bytes)) {
        return emu_blas::refuse(CUBLAS_STATUS_INVALID_VALUE,
                                "cublasSetWorkspace: %p is not %zu bytes of device memory", workspace,
                                workspace_bytes);
    }
    handle->user_workspace = workspace;
    handle->user_workspace_bytes = workspace == nullptr ? 0 : workspace_bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (handle == nullptr) return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode: handle is NULL");
    int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH && base != CUBLAS_TF32_TENSOR_OP_MATH) {
        return emu_blas::refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                                "cublasSetMathMode: math mode %d is not emulated (only DEFAULT, PEDANTIC, TF32)",
                                (int)mode);
    }
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    if (handle == nullptr) return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetMathMode: handle is NULL");
    if (mode == nullptr) return emu_blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode: mode is NULL");
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (handle == nullptr) {
        return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetPointerMode: handle is NULL");
    }
    if (mode != CUBLAS_POINTER_MODE_HOST) {
        return emu_blas::refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                                "cublasSetPointerMode: only CUBLAS_POINTER_MODE_HOST is emulated");
    }
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode) {
    if (handle == nullptr) {
        return emu_blas::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetPointerMode: handle is NULL");
    }
    if (mode == nullptr) return emu_blas::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGetPointerMode: mode is NULL");
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
        case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown error";
}

namespace emu {
void cublas_user_workspace(cublasHandle_t handle, void** workspace, size_t* workspace_bytes) {
    if (handle == nullptr) emu::fail("emu::cublas_user_workspace: handle is NULL");
    *workspace = handle->user_workspace;
    *workspace_bytes = handle->user_workspace_bytes;
}
}  // namespace emu

// ----------------------------------------------------------------------------
// GEMM

namespace {

using emu_blas::refuse;

// Checks one operand: its op, its leading dimension against the stored rows, and that it is device
// memory covering every batch. stored_rows x stored_cols is the matrix as it lies in memory.
cublasStatus_t check_matrix(const char* fn, const char* name, const void* ptr, cudaDataType type, int64_t stored_rows,
                            int64_t stored_cols, int64_t ld, int64_t stride, int64_t batch_count) {
    if (ld < std::max<int64_t>(1, stored_rows)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: ld%s = %lld is less than max(1, %lld rows)", fn, name,
                      (long long)ld, (long long)stored_rows);
    }
    size_t extent = emu_blas::matrix_extent_bytes(stored_rows, stored_cols, ld, type);
    if (extent == 0) return CUBLAS_STATUS_SUCCESS;
    if (stride < 0) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: negative stride%s is not emulated", fn, name);
    }
    extent += (size_t)((batch_count - 1) * stride) * emu_blas::type_bytes(type);
    if (ptr == nullptr || !emu::is_device_pointer(ptr, extent)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: %s = %p is not %zu bytes of device memory (%lld x %lld, ld %lld)",
                      fn, name, ptr, extent, (long long)stored_rows, (long long)stored_cols, (long long)ld);
    }
    return CUBLAS_STATUS_SUCCESS;
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

cublasStatus_t gemm_strided_batched(const char* fn, cublasHandle_t handle, cublasOperation_t transa,
                                    cublasOperation_t transb, int m, int n, int k, const void* alpha, const void* A,
                                    cudaDataType Atype, int lda, long long strideA, const void* B,
                                    cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
                                    cudaDataType Ctype, int ldc, long long strideC, int batch_count,
                                    cublasComputeType_t compute_type) {
    emu_blas::no_cublas_check(fn);
    if (handle == nullptr) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "%s: handle is NULL", fn);
    if (!valid_op(transa) || !valid_op(transb)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: transa %d / transb %d is not N, T or C", fn, (int)transa,
                      (int)transb);
    }
    if (m < 0 || n < 0 || k < 0 || batch_count < 0) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: m %d, n %d, k %d, batch %d must not be negative", fn, m, n, k,
                      batch_count);
    }
    bool tf32;
    switch (compute_type) {
        case CUBLAS_COMPUTE_32F:
            tf32 = ((int)handle->math_mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
            break;
        case CUBLAS_COMPUTE_32F_PEDANTIC: tf32 = false; break;
        case CUBLAS_COMPUTE_32F_FAST_TF32: tf32 = true; break;
        default:
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "%s: compute type %d is not emulated (CUBLAS_COMPUTE_32F, _PEDANTIC, _FAST_TF32 are)", fn,
                          (int)compute_type);
    }
    if (!emu_blas::supported_types(Atype, Btype, Ctype)) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: A %s, B %s, C %s with fp32 compute is not emulated", fn,
                      emu_blas::type_name(Atype), emu_blas::type_name(Btype), emu_blas::type_name(Ctype));
    }
    bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    cublasStatus_t status;
    // stored shapes: A is (m, k), or (k, m) when transposed; B is (k, n) or (n, k); C is (m, n)
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (m == 0 || n == 0 || batch_count == 0) {
        // quick return, but the leading dimensions are still checked as cuBLAS does
        if (lda < std::max<int64_t>(1, a_rows) || ldb < std::max<int64_t>(1, b_rows) || ldc < std::max(1, m)) {
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: a leading dimension is too small", fn);
        }
        return CUBLAS_STATUS_SUCCESS;
    }
    if ((status = check_matrix(fn, "A", A, Atype, a_rows, a_cols, lda, strideA, batch_count))) return status;
    if ((status = check_matrix(fn, "B", B, Btype, b_rows, b_cols, ldb, strideB, batch_count))) return status;
    if ((status = check_matrix(fn, "C", C, Ctype, m, n, ldc, strideC, batch_count))) return status;
    if (alpha == nullptr || beta == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta is NULL", fn);
    if (emu::is_device_pointer(alpha, 4) || emu::is_device_pointer(beta, 4)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "%s: alpha/beta point to device memory but the pointer mode is CUBLAS_POINTER_MODE_HOST", fn);
    }
    // with a bf16 or fp32 C and CUBLAS_COMPUTE_32F, alpha and beta are floats (cuBLAS's scale type table)
    emu_blas::Gemm g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = *(const float*)alpha;
    g.beta = *(const float*)beta;
    g.a = {A, Atype, lda, ta};
    g.b = {B, Btype, ldb, tb};
    g.c = C;
    g.c_type = Ctype;
    g.ldc = ldc;
    g.d = C;
    g.d_type = Ctype;
    g.ldd = ldc;
    g.tf32 = tf32;
    g.batch_count = batch_count;
    g.stride_a = strideA;
    g.stride_b = strideB;
    g.stride_c = strideC;
    g.stride_d = strideC;
    emu::enqueue(handle->stream, fn, [g] { emu_blas::run_gemm(g); });
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    return gemm_strided_batched("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
                                ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    return gemm_strided_batched("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                                strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                                computeType);
}

// cuBLAS documents cublasSgemm as C = alpha·op(A)·op(B) + beta·C on fp32 matrices, computed in fp32
// (the handle's CUBLAS_TF32_TENSOR_OP_MATH allows TF32 inputs, as for CUBLAS_COMPUTE_32F): exactly
// cublasGemmEx with CUDA_R_32F everywhere and CUBLAS_COMPUTE_32F.
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
    return gemm_strided_batched("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B,
                                CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC,
                                         int batchCount) {
    return gemm_strided_batched("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F,
                                lda, strideA, B, CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC,
                                batchCount, CUBLAS_COMPUTE_32F);
}
