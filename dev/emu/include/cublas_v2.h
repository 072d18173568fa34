// Emulated CUDA toolkit: cublas_v2.h, the part of cuBLAS this project calls (handles, streams,
// workspaces, math modes, cublasGemmEx, cublasGemmStridedBatchedEx, cublasSgemm and
// cublasSgemmStridedBatched). Names and enum values are
// NVIDIA's (cublas_api.h), so status numbers printed by our checks mean what they mean on a GPU.
// The products run on the CPU in dev/emu/cublas.cpp; see the notes at the top of that file.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>  // cudaStream_t

#include "library_types.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2,
    CUBLAS_OP_HERMITAN = 2,
    CUBLAS_OP_CONJG = 3,
} cublasOperation_t;

typedef enum {
    CUBLAS_POINTER_MODE_HOST = 0,
    CUBLAS_POINTER_MODE_DEVICE = 1,
} cublasPointerMode_t;

// Only the default algorithm values are listed; any algorithm number computes the same product here.
typedef enum {
    CUBLAS_GEMM_DEFAULT = -1,
    CUBLAS_GEMM_DFALT = -1,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
    CUBLAS_GEMM_DFALT_TENSOR_OP = 99,
} cublasGemmAlgo_t;

typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_FP32_EMULATED_BF16X9_MATH = 4,
    CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH = 8,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
} cublasMath_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_16F_PEDANTIC = 65,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_32F_EMULATED_16BFX9 = 78,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_64F_PEDANTIC = 71,
    CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT = 79,
    CUBLAS_COMPUTE_32I = 72,
    CUBLAS_COMPUTE_32I_PEDANTIC = 73,
} cublasComputeType_t;

typedef cudaDataType cublasDataType_t;

typedef struct cublasContext* cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
// Documented side effect: also resets a workspace set by cublasSetWorkspace to the default pool.
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t workspace_bytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

// C (m, n) = alpha·op(A)·op(B) + beta·C, column-major; A is (m, k) or stored (k, m) when transa.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);

// The same for batch_count matrices, matrix i of X starting at X + i·strideX elements.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);

// The legacy single-precision GEMMs: cublasGemmEx and cublasGemmStridedBatchedEx with A, B, C all fp32
// and CUBLAS_COMPUTE_32F, so the handle's math mode decides TF32 as it does for them. alpha and beta
// are host pointers (CUBLAS_POINTER_MODE_HOST, the only pointer mode emulated).
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC,
                                         int batchCount);

namespace emu {
// Emulator only (no cuBLAS counterpart), for tests: the workspace cublasSetWorkspace gave the handle,
// or nullptr and 0 while the handle uses the library's default pool.
void cublas_user_workspace(cublasHandle_t handle, void** workspace, size_t* workspace_bytes);
}
