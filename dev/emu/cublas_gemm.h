// What cublas.cpp (cuBLAS) and cublas_lt.cpp (cuBLASLt) share: one description of a product with its
// epilogue, the CPU kernel that runs it (cublas_gemm.cpp), and the argument checks both APIs make.
#pragma once

#include <cstdint>

#include "cublasLt.h"
#include "cublas_v2.h"

namespace emu_blas {

// One column-major operand: op(X) is read from ptr with leading dimension ld (in elements).
struct Operand {
    const void* ptr = nullptr;
    cudaDataType type = CUDA_R_32F;
    int64_t ld = 0;
    bool trans = false;
};

// What happens to each fp32 value v = alpha·acc + beta·C(i, j) before it is rounded into D, in order:
//   add_bias:   v += bias[i]
//   dgelu:      v *= gelu'(aux(i, j))                      (aux read)
//   write_aux:  aux(i, j) = v, rounded to aux_type       (the GELU input)
//   gelu:       v = gelu(v)
// and apart from D: bias_grad_b (cuBLASLt's BGRADB), bias_grad[j] = sum over p of op(B)(p, j) for each
// of D's n columns, summed in fp32 in the order p = 0, 1, ..., k-1 and rounded once to bias_grad_type
// (one batch only).
struct Epilogue {
    bool add_bias = false, dgelu = false, write_aux = false, gelu = false;
    const void* bias = nullptr;
    cudaDataType bias_type = CUDA_R_32F;
    void* aux = nullptr;
    cudaDataType aux_type = CUDA_R_32F;
    int64_t aux_ld = 0;
    void* bias_grad_b = nullptr;
    cudaDataType bias_grad_type = CUDA_R_32F;
};

// D (m, n) = epilogue(alpha·op(A)·op(B) + beta·C) for batch_count matrices; matrix b of X starts
// stride_x elements after matrix b-1. With beta == 0, C is not read (BLAS convention).
struct Gemm {
    int64_t m = 0, n = 0, k = 0;
    float alpha = 1.0f, beta = 0.0f;
    Operand a, b;
    const void* c = nullptr;
    cudaDataType c_type = CUDA_R_32F;
    int64_t ldc = 0;
    void* d = nullptr;
    cudaDataType d_type = CUDA_R_32F;
    int64_t ldd = 0;
    bool tf32 = false;  // round fp32 inputs to TF32 (10-bit mantissa, round to nearest even)
    // cuBLASLt's FP8 scales (A_SCALE_POINTER, B_SCALE_POINTER): device floats, read when the product
    // runs (in stream order), that multiply alpha; nullptr: 1
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    Epilogue epilogue;
    int64_t batch_count = 1;
    int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_d = 0;
};

// Runs the product now, on the calling thread and one helper thread (called from an enqueued task).
void run_gemm(const Gemm& gemm);

// EMU_NO_CUBLAS=1: every call of a product function (cublasGemmEx and friends, cublasLtMatmul) ends
// the program with status 70, refused or not, as compute-sanitizer's racecheck did on an H100 at the
// first cuBLASLt kernel. dev/gpu/sanitize.sh runs racecheck only on kernel tests that launch none;
// dev/gpu/check_racecheck_tests.sh checks its list this way (and by reading the tests' sources).
void no_cublas_check(const char* fn);

// Prints "cuda-emu: cuBLAS: <message>" on stderr and returns status: how every refusal is reported,
// so that a failing cublasCheck in the caller is preceded by the reason.
cublasStatus_t refuse(cublasStatus_t status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

size_t type_bytes(cudaDataType type);  // 0 for a type the emulator does not compute with
const char* type_name(cudaDataType type);
// True for the A/B/C combinations the emulator runs with fp32 compute: A = B = bf16 with C = D = bf16
// or fp32, and A = B = C = D = fp32 (cuBLAS's cublasGemmEx table for CUBLAS_COMPUTE_32F).
bool supported_types(cudaDataType ab, cudaDataType b, cudaDataType c);
// True for cuBLASLt's FP8 products the emulator runs (fp32 compute): A and B e4m3 or e5m2, not both e5m2,
// C = D bf16, fp16 or fp32 (cuBLASLt's table of FP8 types, without FP8 outputs).
bool supported_fp8_types(cudaDataType a, cudaDataType b, cudaDataType d);
bool is_fp8(cudaDataType type);
// Bytes a stored rows x cols column-major matrix spans with leading dimension ld.
size_t matrix_extent_bytes(int64_t rows, int64_t cols, int64_t ld, cudaDataType type);

// GELU, tanh approximation: 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))), and its derivative.
float gelu(float x);
float gelu_grad(float x);
float round_to_tf32(float x);

}  // namespace emu_blas
