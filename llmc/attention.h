// Causal multi-head self-attention, the naive way: the whole (T, T) score matrix per head.
// qkv holds q, k, v side by side per position, each C wide, head h taking channels h*hs .. h*hs+hs-1.
//   att[b,h,t,:] = softmax_{t2 <= t}( q[b,t,h] · k[b,t2,h] / sqrt(hs) ),   out[b,t,h] = sum_t2 att * v[b,t2,h]
// Backward, per row t, with datt[t2] = dout[b,t,h] · v[b,t2,h]:
//   dscore[t2] = att[t2] * (datt[t2] - sum_j att[j] datt[j])   (the softmax Jacobian)
//   dq += sum_t2 dscore[t2] k[t2] / sqrt(hs);  dk[t2] += dscore[t2] q / sqrt(hs);  dv[t2] += att[t2] dout
// A row t writes into the dk, dv of every earlier position, so the backward gives each thread a whole
// (b, h) pair: no races, and the same summation order on every run.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

template <typename Real>
void attention_forward(Real* out,        // (B, T, C)
                       Real* att,        // (B, NH, T, T) softmax weights, zero above the diagonal
                       const Real* qkv,  // (B, T, 3C)
                       int B, int T, int C, int NH) {
    int hs = C / NH;
    Real scale = (Real)(1.0 / std::sqrt((double)hs));
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const Real* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                Real* att_row = att + (((size_t)b * NH + h) * T + t) * T;
                Real max_score = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const Real* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    Real dot = 0;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    att_row[t2] = dot * scale;
                    if (att_row[t2] > max_score) max_score = att_row[t2];
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    att_row[t2] = std::exp(att_row[t2] - max_score);
                    sum += att_row[t2];
                }
                Real inv_sum = (Real)(1.0 / sum);
                for (int t2 = 0; t2 <= t; t2++) att_row[t2] *= inv_sum;
                for (int t2 = t + 1; t2 < T; t2++) att_row[t2] = 0;

                Real* out_bth = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) out_bth[i] = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const Real* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    Real a = att_row[t2];
                    for (int i = 0; i < hs; i++) out_bth[i] += a * v[i];
                }
            }
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
    Real scale = (Real)(1.0 / std::sqrt((double)hs));
#pragma omp parallel
    {
        std::vector<Real> dscore(T);
#pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < T; t++) {
                    const Real* att_row = att + (((size_t)b * NH + h) * T + t) * T;
                    const Real* dout_bth = dout + ((size_t)b * T + t) * C + h * hs;
                    const Real* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                    Real* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                    // datt[t2] = dout · v[t2], then through the softmax
                    double weighted = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const Real* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                        Real datt = 0;
                        for (int i = 0; i < hs; i++) datt += dout_bth[i] * v[i];
                        dscore[t2] = datt;
                        weighted += (double)att_row[t2] * datt;
                    }
                    for (int t2 = 0; t2 <= t; t2++) {
                        dscore[t2] = att_row[t2] * (dscore[t2] - (Real)weighted) * scale;
                    }
                    for (int t2 = 0; t2 <= t; t2++) {
                        size_t base = ((size_t)b * T + t2) * 3 * C + h * hs;
                        const Real* k = qkv + base + C;
                        Real* dk = dqkv + base + C;
                        Real* dv = dqkv + base + 2 * C;
                        Real ds = dscore[t2], a = att_row[t2];
                        for (int i = 0; i < hs; i++) {
                            dq[i] += ds * k[i];
                            dk[i] += ds * q[i];
                            dv[i] += a * dout_bth[i];
                        }
                    }
                }
            }
        }
    }
}
