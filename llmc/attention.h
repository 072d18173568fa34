// Causal multi-head self-attention, the naive way: the whole (T, T) score matrix per head.
// qkv holds q, k, v side by side per position, each C wide, head h taking channels h*hs .. h*hs+hs-1.
//   att[b,h,t,:] = softmax_{t2 <= t}( q[b,t,h] · k[b,t2,h] / sqrt(hs) ),   out[b,t,h] = sum_t2 att * v[b,t2,h]
// Backward, per row t, with datt[t2] = dout[b,t,h] · v[b,t2,h]:
//   dscore[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j])   (the softmax Jacobian)
//   dq += sum_t2 dscore[t2] k[t2] / sqrt(hs);  dk[t2] += dscore[t2] q / sqrt(hs);  dv[t2] += att[t2] dout
//
// For one (b, h) these are six matrix products of (T, hs) and (T, T) matrices plus row-wise work:
//   forward   S = Q Kᵀ,  att = softmax(S / sqrt(hs)) row by row,  out = att V
//   backward  dA = dout Vᵀ,  dS = softmax backward row by row,  dQ += dS K,  dK += dSᵀ Q,  dV += attᵀ dout
// and each product runs on llmc/gemm.h's gemm_accumulate (strided views, no copies). Done as dot
// products (one q against each k), the work is chains of dependent additions and reads of every
// (T, hs) row once per row t: ~10 GFLOP/s; as GEMMs it runs near the FMA peak. Causality halves the
// work, and each product says which triangle it needs (GemmTriangle): S and dA only on and below the
// diagonal (lower_c), att V and dS K stop each row's sum at the diagonal (lower_a: att and dS are zero
// above it), attᵀ dout and dSᵀ Q start it there (upper_a). Skipped terms are zeros, so the bits are
// those of the full square products; the tiles the diagonal crosses are computed whole, and the rows'
// entries above the diagonal are then overwritten with zeros.
// Each thread takes whole (b, h) pairs; the products inside run on that thread (nested OpenMP regions
// are off), so no two threads write the same element and the result does not depend on the count.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "expf.h"
#include "gemm.h"

template <typename Real>
void attention_forward(Real* out,        // (B, T, C)
                       Real* att,        // (B, NH, T, T) softmax weights, zero above the diagonal
                       const Real* qkv,  // (B, T, 3C)
                       int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    Real scale = (Real)(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const Real* q = qkv + (size_t)b * T * C3 + h * hs;  // (T, hs) with row stride 3C
            const Real* k = q + C;
            const Real* v = q + 2 * C;
            Real* att_bh = att + ((size_t)b * NH + h) * T * T;  // (T, T)
            // S = Q Kᵀ into att, its lower triangle (with the rest of the tiles the diagonal crosses; all
            // above the diagonal is overwritten with zeros below)
            gemm_accumulate(att_bh, T, MatrixView<Real>{q, C3, 1}, MatrixView<Real>{k, 1, C3}, T, T, hs, true,
                            GemmTriangle::lower_c);
            for (int t = 0; t < T; t++) {
                Real* row = att_bh + (size_t)t * T;
                Real max_score = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    row[t2] *= scale;
                    if (row[t2] > max_score) max_score = row[t2];
                }
                double sum = exp_and_sum(row, row, max_score, t + 1);
                Real inv_sum = (Real)(1.0 / sum);
                for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv_sum;
                for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0;
            }
            // out = att V
            Real* out_bh = out + (size_t)b * T * C + h * hs;  // (T, hs) with row stride C
            gemm_accumulate(out_bh, C, MatrixView<Real>{att_bh, (size_t)T, 1}, MatrixView<Real>{v, C3, 1}, T, hs, T, true,
                            GemmTriangle::lower_a);
        }
    }
}

// Accumulates (+=) into dqkv.
template <typename Real>
void attention_backward(Real* dqkv,       // (B, T, 3C)
                        const Real* dout, // (B, T, C)
                        const Real* qkv,  // (B, T, 3C)
                        const Real* att,  // (B, NH, T, T)
                        int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    Real scale = (Real)(1.0 / std::sqrt((double)hs));
#pragma omp parallel
    {
        std::vector<Real> dscore((size_t)T * T);  // (T, T): datt, then dS in place
#pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const Real* q = qkv + (size_t)b * T * C3 + h * hs;  // (T, hs) with row stride 3C
                const Real* k = q + C;
                const Real* v = q + 2 * C;
                Real* dq = dqkv + (size_t)b * T * C3 + h * hs;
                Real* dk = dq + C;
                Real* dv = dq + 2 * C;
                const Real* dout_bh = dout + (size_t)b * T * C + h * hs;  // (T, hs) with row stride C
                const Real* att_bh = att + ((size_t)b * NH + h) * T * T;
                Real* ds = dscore.data();
                // datt = dout Vᵀ, then through the softmax row by row; zero above the diagonal
                gemm_accumulate(ds, T, MatrixView<Real>{dout_bh, (size_t)C, 1}, MatrixView<Real>{v, 1, C3}, T, T, hs, true,
                                GemmTriangle::lower_c);
                for (int t = 0; t < T; t++) {
                    const Real* att_row = att_bh + (size_t)t * T;
                    Real* row = ds + (size_t)t * T;
                    double weighted = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) weighted += (double)att_row[t2] * row[t2];
                    for (int t2 = 0; t2 <= t; t2++) row[t2] = att_row[t2] * (row[t2] - (Real)weighted) * scale;
                    for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0;
                }
                // dQ += dS K,  dK += dSᵀ Q,  dV += attᵀ dout
                gemm_accumulate(dq, C3, MatrixView<Real>{ds, (size_t)T, 1}, MatrixView<Real>{k, C3, 1}, T, hs, T, false,
                                GemmTriangle::lower_a);
                gemm_accumulate(dk, C3, MatrixView<Real>{ds, 1, (size_t)T}, MatrixView<Real>{q, C3, 1}, T, hs, T, false,
                                GemmTriangle::upper_a);
                gemm_accumulate(dv, C3, MatrixView<Real>{att_bh, 1, (size_t)T}, MatrixView<Real>{dout_bh, (size_t)C, 1}, T,
                                hs, T, false, GemmTriangle::upper_a);
            }
        }
    }
}
