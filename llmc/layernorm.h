// LayerNorm over the channel dimension, with the mean and 1/std saved for the backward pass.
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + 1e-5),   var the biased variance
// Backward, with xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw += dy * xhat,  db += dy
// Statistics are accumulated in double so the fp32 trainer's error does not grow with C.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

constexpr double LAYERNORM_EPS = 1e-5;

template <typename Real>
void layernorm_forward(Real* out,           // (N, C) with N = B*T
                       Real* mean,          // (N)
                       Real* rstd,          // (N)
                       const Real* inp,     // (N, C)
                       const Real* weight,  // (C)
                       const Real* bias,    // (C)
                       int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const Real* x = inp + (size_t)n * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++) sum += x[c];
        double m = sum / C;
        double sumsq = 0.0;
        for (int c = 0; c < C; c++) sumsq += (x[c] - m) * (x[c] - m);
        double s = 1.0 / std::sqrt(sumsq / C + LAYERNORM_EPS);
        Real* y = out + (size_t)n * C;
        for (int c = 0; c < C; c++) y[c] = (Real)((x[c] - m) * s) * weight[c] + bias[c];
        mean[n] = (Real)m;
        rstd[n] = (Real)s;
    }
}

// Accumulates (+=) into dinp, dweight and dbias. dweight/dbias are sums over all N rows: each thread
// takes a slice of channels, so the sums need no atomics and come out the same for any thread count.
template <typename Real>
void layernorm_backward(Real* dinp,          // (N, C)
                        Real* dweight,       // (C)
                        Real* dbias,         // (C)
                        const Real* dout,    // (N, C)
                        const Real* inp,     // (N, C)
                        const Real* weight,  // (C)
                        const Real* mean,    // (N)
                        const Real* rstd,    // (N)
                        int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const Real* x = inp + (size_t)n * C;
        const Real* dy = dout + (size_t)n * C;
        Real* dx = dinp + (size_t)n * C;
        double m = mean[n], s = rstd[n];
        double mean_g = 0.0, mean_gx = 0.0;
        for (int c = 0; c < C; c++) {
            double g = (double)dy[c] * weight[c];
            mean_g += g;
            mean_gx += g * (x[c] - m) * s;
        }
        mean_g /= C;
        mean_gx /= C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            double g = (double)dy[c] * weight[c];
            dx[c] += (Real)(s * (g - mean_g - xhat * mean_gx));
        }
    }
    // each thread sums a slice of channels over all rows, rows outer so that the loads are contiguous
    // and the channels' sums (each still adding its rows in order) fill the vector lanes
#pragma omp parallel
    {
        int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        int c_begin = (int)((long)C * thread / threads), c_end = (int)((long)C * (thread + 1) / threads);
        std::vector<double> dw(std::max(0, c_end - c_begin), 0.0), db(dw.size(), 0.0);
        for (int n = 0; n < N; n++) {
            const Real* x = inp + (size_t)n * C + c_begin;
            const Real* dy = dout + (size_t)n * C + c_begin;
            double m = mean[n], s = rstd[n];
            for (int c = 0; c < c_end - c_begin; c++) {
                double xhat = ((double)x[c] - m) * s;
                dw[c] += dy[c] * xhat;
                db[c] += dy[c];
            }
        }
        for (int c = c_begin; c < c_end; c++) {
            dweight[c] += (Real)dw[c - c_begin];
            dbias[c] += (Real)db[c - c_begin];
        }
    }
}
