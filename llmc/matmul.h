// Linear layer: out = inp · Wᵀ + bias, and its backward, on the CPU's matrix product engine (gemm.h).
//
// All three products of a Linear layer are C (M×N) += A (M×K) · B (K×N) with different strides:
//   forward   out  (BT,OC) = inp (BT,C)  · W(OC,C)ᵀ     B[k][n] = W[n][k]
//   backward  dinp (BT,C) += dout(BT,OC) · W(OC,C)      B[k][n] = W[k][n]
//             dW   (OC,C) += dout(BT,OC)ᵀ · inp(BT,C)    A[m][k] = dout[k][m]
// so gemm_accumulate() does them all, each with its own views of the same arrays.
#pragma once

#include <omp.h>

#include <algorithm>
#include <vector>

#include "gemm.h"

// out = inp · weightᵀ + bias. Overwrites out.
template <typename Real>
void matmul_forward(Real* out,           // (N, OC) with N = B*T rows
                    const Real* inp,     // (N, C)
                    const Real* weight,  // (OC, C)
                    const Real* bias,    // (OC) or nullptr
                    int N, int C, int OC) {
    gemm_accumulate(out, OC, MatrixView<Real>{inp, (size_t)C, 1}, MatrixView<Real>{weight, 1, (size_t)C}, N, OC, C, true,
                    GemmTriangle::none, bias);
}

// Accumulates (+=) into dinp, dweight and dbias (dbias may be nullptr); with set_dinp, dinp = instead of
// +=, and with set_dweight, dweight and dbias = instead of += (a gradient's first contribution needs no
// cleared buffer: gemm_accumulate's `overwrite`, the same bits).
template <typename Real>
void matmul_backward(Real* dinp,          // (N, C)
                     Real* dweight,       // (OC, C)
                     Real* dbias,         // (OC) or nullptr
                     const Real* dout,    // (N, OC)
                     const Real* inp,     // (N, C)
                     const Real* weight,  // (OC, C)
                     int N, int C, int OC, bool set_dinp = false, bool set_dweight = false) {
    // dinp (N×C) += dout (N×OC) · weight (OC×C)
    gemm_accumulate(dinp, C, MatrixView<Real>{dout, (size_t)OC, 1}, MatrixView<Real>{weight, (size_t)C, 1}, N, C, OC,
                    set_dinp);
    // dweight (OC×C) += doutᵀ (OC×N) · inp (N×C)
    gemm_accumulate(dweight, C, MatrixView<Real>{dout, 1, (size_t)OC}, MatrixView<Real>{inp, (size_t)C, 1}, OC, C, N,
                    set_dweight);
    if (dbias) {
        // sum over rows, each thread owning a range of columns (no atomics, fixed order); rows outer so
        // the loads are contiguous and the inner loop vectorizes across columns
#pragma omp parallel
        {
            int threads = omp_get_num_threads(), thread = omp_get_thread_num();
            int o_begin = (int)((long)OC * thread / threads), o_end = (int)((long)OC * (thread + 1) / threads);
            std::vector<Real> sum(std::max(0, o_end - o_begin), Real(0));
            for (int n = 0; n < N; n++) {
                const Real* row = dout + (size_t)n * OC + o_begin;
                for (int o = 0; o < o_end - o_begin; o++) sum[o] += row[o];
            }
            for (int o = o_begin; o < o_end; o++) dbias[o] = set_dweight ? sum[o - o_begin] : dbias[o] + sum[o - o_begin];
        }
    }
}
