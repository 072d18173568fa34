// Linear layer: out = inp · Wᵀ + bias, and its backward, on one cache-blocked matrix product.
//
// All three products of a Linear layer are C (M×N) += A (M×K) · B (K×N) with different strides:
//   forward   out  (BT,OC) = inp (BT,C)  · W(OC,C)ᵀ     B[k][n] = W[n][k]
//   backward  dinp (BT,C) += dout(BT,OC) · W(OC,C)      B[k][n] = W[k][n]
//             dW   (OC,C) += dout(BT,OC)ᵀ · inp(BT,C)    A[m][k] = dout[k][m]
// so one routine, gemm_accumulate(), does them all. It follows the classic Goto/BLIS scheme:
//   1. cut K into slabs of KC and N into blocks of NC, so one packed B block (KC×NC) stays in cache;
//   2. copy ("pack") that block of B into panels NR columns wide, contiguous along k, and the rows of
//      A into panels MR rows tall, so the inner loop reads memory strictly in order whatever the
//      original strides were;
//   3. a micro-kernel keeps an MR×NR tile of C in registers and, for each k, adds the outer product
//      of an MR column of A and an NR row of B: MR·NR multiply-adds per MR+NR loads.
// With MR=6, NR=16 the tile is 12 AVX2 registers of 8 floats; the compiler vectorizes the plain
// loops below (check with -fopt-info-vec). Threads split C's columns, each writing its own, so the
// result does not depend on timing or on the thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

constexpr int GEMM_MR = 6;     // rows of C per micro-tile
constexpr int GEMM_NR = 16;    // columns of C per micro-tile
constexpr int GEMM_KC = 256;   // depth of a packed slab
constexpr int GEMM_MC = 240;   // rows of A packed at a time (a multiple of MR)
constexpr int GEMM_NC = 1024;  // columns of B packed at a time (a multiple of NR)

// A strided view of a matrix: element (i, j) is data[i * row_stride + j * col_stride].
template <typename Real>
struct MatrixView {
    const Real* data;
    size_t row_stride;
    size_t col_stride;
    const Real& at(size_t i, size_t j) const { return data[i * row_stride + j * col_stride]; }
};

// C[mr×nr] += A panel (kc×MR) · B panel (kc×NR); the tile may be cut short at the matrix edge.
template <typename Real>
static inline void gemm_micro_kernel(int kc, const Real* __restrict a, const Real* __restrict b, Real* c,
                                     size_t ldc, int mr, int nr) {
    Real acc[GEMM_MR][GEMM_NR] = {};
    for (int k = 0; k < kc; k++) {
        const Real* ak = a + k * GEMM_MR;
        const Real* bk = b + k * GEMM_NR;
#pragma GCC unroll 6
        for (int i = 0; i < GEMM_MR; i++) {
#pragma omp simd
            for (int j = 0; j < GEMM_NR; j++) acc[i][j] += ak[i] * bk[j];
        }
    }
    if (mr == GEMM_MR && nr == GEMM_NR) {
        for (int i = 0; i < GEMM_MR; i++) {
#pragma omp simd
            for (int j = 0; j < GEMM_NR; j++) c[i * ldc + j] += acc[i][j];
        }
    } else {
        for (int i = 0; i < mr; i++) {
            for (int j = 0; j < nr; j++) c[i * ldc + j] += acc[i][j];
        }
    }
}

// C (M×N, row-major, leading dimension ldc) += A (M×K) · B (K×N).
// Each thread takes a contiguous range of C's columns and does all of its work alone (its own
// packed panels of B, its own copy of the packed rows of A): no barrier inside the product, so a
// thread that the OS pauses delays only its own columns instead of stalling every other thread at
// each packing step. Packing A once per thread costs M·K copies against M·K·N/threads multiply-adds.
template <typename Real>
void gemm_accumulate(Real* C, size_t ldc, MatrixView<Real> A, MatrixView<Real> B, int M, int N, int K) {
    int total_panels = (N + GEMM_NR - 1) / GEMM_NR;
    // a product too small to pay for waking threads runs on the calling thread
    bool parallel = (double)M * N * K > 1e5 && total_panels > 1;
#pragma omp parallel if (parallel)
    {
        int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        int j_begin = (int)((long)total_panels * thread / threads) * GEMM_NR;
        int j_end = std::min(N, (int)((long)total_panels * (thread + 1) / threads) * GEMM_NR);
        size_t kc_max = std::min(GEMM_KC, K);
        std::unique_ptr<Real[]> packed_b(new Real[kc_max * GEMM_NC]);  // (KC × NC) as [panel][k][NR]
        std::unique_ptr<Real[]> packed_a(new Real[kc_max * GEMM_MC]);  // (MC × KC) as [panel][k][MR]
        for (int jc = j_begin; jc < j_end; jc += GEMM_NC) {
            int nc = std::min(GEMM_NC, j_end - jc);
            int n_panels = (nc + GEMM_NR - 1) / GEMM_NR;
            for (int pc = 0; pc < K; pc += GEMM_KC) {
                int kc = std::min(GEMM_KC, K - pc);
                for (int jp = 0; jp < n_panels; jp++) {  // pack B[pc:pc+kc, jc:jc+nc], zero-padded
                    Real* dst = packed_b.get() + (size_t)jp * kc * GEMM_NR;
                    int j0 = jc + jp * GEMM_NR;
                    int nr = std::min(GEMM_NR, j_end - j0);
                    for (int k = 0; k < kc; k++) {
                        for (int j = 0; j < nr; j++) dst[k * GEMM_NR + j] = B.at(pc + k, j0 + j);
                        for (int j = nr; j < GEMM_NR; j++) dst[k * GEMM_NR + j] = 0;
                    }
                }
                for (int ic = 0; ic < M; ic += GEMM_MC) {
                    int mc = std::min(GEMM_MC, M - ic);
                    int m_panels = (mc + GEMM_MR - 1) / GEMM_MR;
                    for (int ip = 0; ip < m_panels; ip++) {  // pack A[ic:ic+mc, pc:pc+kc], zero-padded
                        Real* dst = packed_a.get() + (size_t)ip * kc * GEMM_MR;
                        int i0 = ic + ip * GEMM_MR;
                        int mr = std::min(GEMM_MR, M - i0);
                        for (int k = 0; k < kc; k++) {
                            for (int i = 0; i < mr; i++) dst[k * GEMM_MR + i] = A.at(i0 + i, pc + k);
                            for (int i = mr; i < GEMM_MR; i++) dst[k * GEMM_MR + i] = 0;
                        }
                    }
                    for (int jp = 0; jp < n_panels; jp++) {
                        for (int ip = 0; ip < m_panels; ip++) {
                            int i0 = ic + ip * GEMM_MR, j0 = jc + jp * GEMM_NR;
                            gemm_micro_kernel(kc, packed_a.get() + (size_t)ip * kc * GEMM_MR,
                                              packed_b.get() + (size_t)jp * kc * GEMM_NR, C + (size_t)i0 * ldc + j0,
                                              ldc, std::min(GEMM_MR, M - i0), std::min(GEMM_NR, j_end - j0));
                        }
                    }
                }
            }
        }
    }
}

// out = inp · weightᵀ + bias. Overwrites out.
template <typename Real>
void matmul_forward(Real* out,           // (N, OC) with N = B*T rows
                    const Real* inp,     // (N, C)
                    const Real* weight,  // (OC, C)
                    const Real* bias,    // (OC) or nullptr
                    int N, int C, int OC) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        Real* row = out + (size_t)n * OC;
        if (bias) {
            for (int o = 0; o < OC; o++) row[o] = bias[o];
        } else {
            for (int o = 0; o < OC; o++) row[o] = 0;
        }
    }
    gemm_accumulate(out, OC, MatrixView<Real>{inp, (size_t)C, 1}, MatrixView<Real>{weight, 1, (size_t)C}, N, OC, C);
}

// Accumulates (+=) into dinp, dweight and dbias (dbias may be nullptr).
template <typename Real>
void matmul_backward(Real* dinp,          // (N, C)
                     Real* dweight,       // (OC, C)
                     Real* dbias,         // (OC) or nullptr
                     const Real* dout,    // (N, OC)
                     const Real* inp,     // (N, C)
                     const Real* weight,  // (OC, C)
                     int N, int C, int OC) {
    // dinp (N×C) += dout (N×OC) · weight (OC×C)
    gemm_accumulate(dinp, C, MatrixView<Real>{dout, (size_t)OC, 1}, MatrixView<Real>{weight, (size_t)C, 1}, N, C, OC);
    // dweight (OC×C) += doutᵀ (OC×N) · inp (N×C)
    gemm_accumulate(dweight, C, MatrixView<Real>{dout, 1, (size_t)OC}, MatrixView<Real>{inp, (size_t)C, 1}, OC, C, N);
    if (dbias) {
        // sum over rows, each thread owning a range of columns (no atomics, fixed order)
#pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            Real sum = 0;
            for (int n = 0; n < N; n++) sum += dout[(size_t)n * OC + o];
            dbias[o] += sum;
        }
    }
}
