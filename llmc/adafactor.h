// Adafactor (Shazeer & Stern, 2018) as torch.optim.Adafactor defines it, with its defaults: no first
// moment, and for a matrix a factored second moment, one number per row and one per column instead of
// one per element. For a tensor p with gradient g (already multiplied by the clipping scale) at its
// update number t (from 1), learning rate lr and weight decay wd:
//   w = t^-0.8                               the running means' weight (1 at t = 1: they start as g²'s)
//   rho = min(lr, 1 / sqrt(t))               relative step size (lr caps it: torch's deviation from the paper)
//   alpha = max(eps2, RMS(p)) * rho          the step is relative to the tensor's own scale (before decay)
//   p = p (1 - lr wd)                        decoupled weight decay
//   matrix (rows, cols):  R_i = R_i + w (mean_j g_ij² - R_i),   C_j = C_j + w (mean_i g_ij² - C_j)
//                         V_ij = R_i C_j / max(mean_i R_i, eps1)      (rank-1 estimate of the mean of g²)
//   vector:               V_i = V_i + w (g_i² - V_i)
//   U = g / sqrt(max(V, eps1²))
//   p = p - alpha / max(1, RMS(U) / d) U      the update clipped to RMS d
// eps1 = 2^-23 (torch's default is its parameter type's machine epsilon: fp32's), eps2 = 1e-3, d = 1.
// The running means are torch's lerps (llmc/muon.h's lerp_as_torch), so t = 1 gives g² exactly.
//
// State: rows + cols floats per matrix, n per vector; at GPT-2 small 0.3 M floats against AdamW's 249 M
// (its m and v). Every sum is taken in double in a fixed order (whatever the thread count), so every
// process of a data-parallel run computes the same update from the same gradient.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "adafactor_hyper.h"
#include "adamw.h"
#include "muon.h"


// The scalars of one tensor's step, from its parameters before the update.
struct AdafactorStep {
    float w;       // the running means' weight, t^beta2_decay
    double alpha;  // max(eps2, RMS(p)) * rho
    float keep;    // 1 - lr wd
};

inline AdafactorStep adafactor_step(const float* p, size_t n, const AdafactorHyper& h, float lr, float weight_decay, int t) {
    AdafactorStep s;
    double step = (double)t;
    s.w = (float)std::pow(step, h.beta2_decay);
    double rho = std::min((double)lr, 1.0 / std::sqrt(step));
    s.alpha = std::max((double)h.eps2, std::sqrt(sum_of_squares(p, n) / (double)n)) * rho;
    s.keep = (float)(1.0 - (double)lr * weight_decay);
    return s;
}

// sum of f(i) over [0, n) in double: fixed blocks summed in index order, the blocks in order.
template <typename F>
double adafactor_ordered_sum(size_t n, F f) {
    const size_t block = 4096;
    size_t num_blocks = (n + block - 1) / block;
    std::vector<double> partial(num_blocks);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < num_blocks; b++) {
        double s = 0.0;
        for (size_t i = b * block; i < std::min(n, (b + 1) * block); i++) s += f(i);
        partial[b] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    return total;
}

// The end of every update: U = g / sqrt(max(V, eps1²)) with V given element by element (v_of), its RMS,
// and p -= alpha / max(1, RMS(U)/d) U. U is computed twice (for its RMS, then for the step) rather than
// stored: Adafactor is the optimizer for when memory is short.
template <typename VarianceOf>
void adafactor_apply(float* p, const float* g, size_t n, const AdafactorHyper& h, const AdafactorStep& s,
                     float grad_scale, VarianceOf v_of) {
    const float floor = (float)((double)h.eps1 * h.eps1);
    auto u_of = [&](size_t i) { return g[i] * grad_scale * (1.0f / std::sqrt(std::max(v_of(i), floor))); };
    double sum_u2 = adafactor_ordered_sum(n, [&](size_t i) {
        double u = u_of(i);
        return u * u;
    });
    double denom = std::max(1.0, std::sqrt(sum_u2 / (double)n) / h.d);
    const float step = (float)(-s.alpha / denom);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = p[i] + step * u_of(i);
}

inline void adafactor_decay(float* p, size_t n, const AdafactorStep& s, float weight_decay) {
    if (weight_decay == 0.0f) return;  // torch skips the multiplication, which would round nothing anyway
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) p[i] *= s.keep;
}

// One update of a matrix p (rows, cols) with gradient g, row factors row (rows) and column factors col (cols).
inline void adafactor_update_matrix(float* p, const float* g, float* row, float* col, size_t rows, size_t cols,
                                    const AdafactorHyper& h, float lr, float weight_decay, float grad_scale, int t) {
    const size_t n = rows * cols;
    AdafactorStep s = adafactor_step(p, n, h, lr, weight_decay, t);
    adafactor_decay(p, n, s, weight_decay);
    // row factors: each row's mean of g², one row per iteration
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        double sum = 0.0;
        for (size_t j = 0; j < cols; j++) {
            float gij = g[i * cols + j] * grad_scale;
            sum += (double)gij * gij;
        }
        row[i] = lerp_as_torch(row[i], (float)(sum / (double)cols), s.w);
    }
    // column factors: each thread sums its columns over all rows, in row order
#pragma omp parallel
    {
        int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        size_t j0 = cols * thread / threads, j1 = cols * (thread + 1) / threads;
        std::vector<double> sum(j1 - j0, 0.0);
        for (size_t i = 0; i < rows; i++) {
            for (size_t j = j0; j < j1; j++) {
                float gij = g[i * cols + j] * grad_scale;
                sum[j - j0] += (double)gij * gij;
            }
        }
        for (size_t j = j0; j < j1; j++) col[j] = lerp_as_torch(col[j], (float)(sum[j - j0] / (double)rows), s.w);
    }
    double row_sum = 0.0;
    for (size_t i = 0; i < rows; i++) row_sum += row[i];
    const float row_mean = std::max((float)(row_sum / (double)rows), h.eps1);
    adafactor_apply(p, g, n, h, s, grad_scale, [&](size_t i) { return row[i / cols] * col[i % cols] / row_mean; });
}

// One update of a vector p (n) with gradient g and its per-element second moment variance (n).
inline void adafactor_update_vector(float* p, const float* g, float* variance, size_t n, const AdafactorHyper& h,
                                    float lr, float weight_decay, float grad_scale, int t) {
    AdafactorStep s = adafactor_step(p, n, h, lr, weight_decay, t);
    adafactor_decay(p, n, s, weight_decay);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        variance[i] = lerp_as_torch(variance[i], gi * gi, s.w);
    }
    adafactor_apply(p, g, n, h, s, grad_scale, [&](size_t i) { return variance[i]; });
}
