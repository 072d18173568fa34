// AdamW with decoupled weight decay (Loshchilov & Hutter), and the global gradient norm for clipping.
// For step t (1-based), gradient g already multiplied by the clipping scale:
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// The trainer calls this per tensor, with wd = 0 for biases and LayerNorm parameters.
#pragma once

#include <cmath>
#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "host_device.h"

// One element's update, on the GPU (llmc/adamw.cuh's kernels) and on the CPU (-oo 1, llmc/optimizer_offload.cuh;
// 8-bit AdamW's, llmc/adamw8.h, on its decoded moments):
// one body, so the two give the same bits. Every multiply-add is an explicit fmaf and nothing else
// can be contracted, so no compiler (nvcc, g++, with FMA or without) is free to fuse differently; the
// division and sqrtf are IEEE-rounded on both (no --use_fast_math). Returns the new fp32 value of p.
HOST_DEVICE inline float adamw_element(float p, float grad, float* m, float* v, float lr, float beta1,
                                               float beta2, float bias_correction1, float bias_correction2,
                                               float eps, float weight_decay, float grad_scale) {
    float g = grad * grad_scale;
    float mi = fmaf(beta1, *m, (1.0f - beta1) * g);
    float vi = fmaf(beta2, *v, (1.0f - beta2) * g * g);
    *m = mi;
    *v = vi;
    float m_hat = mi / bias_correction1;
    float v_hat = vi / bias_correction2;
    float step = m_hat / (sqrtf(v_hat) + eps);
    return fmaf(-lr, fmaf(weight_decay, p, step), p);  // p - lr (step + wd p)
}

struct AdamWHyper {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
};

template <typename Real>
void adamw_update(Real* params, const Real* grads, Real* m, Real* v,  // all (n)
                  size_t n, const AdamWHyper& hyper, float lr, float weight_decay, float grad_scale, int t) {
    // constants hoisted out of the loop, divisions by the bias corrections turned into products, so
    // the loop is a stream of multiply-adds, one sqrt and one division that the compiler vectorizes
    const Real b1 = hyper.beta1, b2 = hyper.beta2, one_minus_b1 = 1 - b1, one_minus_b2 = 1 - b2;
    const Real inv_bias_correction1 = (Real)(1.0 / (1.0 - std::pow((double)hyper.beta1, t)));
    const Real inv_bias_correction2 = (Real)(1.0 / (1.0 - std::pow((double)hyper.beta2, t)));
    const Real scale = grad_scale, rate = lr, decay = weight_decay, eps = hyper.eps;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        Real g = grads[i] * scale;
        Real mi = b1 * m[i] + one_minus_b1 * g;
        Real vi = b2 * v[i] + one_minus_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        Real m_hat = mi * inv_bias_correction1;
        Real v_hat = vi * inv_bias_correction2;
        params[i] -= rate * (m_hat / (std::sqrt(v_hat) + eps) + decay * params[i]);
    }
}

// Sum of squares accumulated in double. Fixed-size blocks are summed in index order, so the result
// is the same bit for bit whatever the thread count (an OpenMP reduction combines in arrival order).
// Inside a block, 8 interleaved partial sums (lane j takes elements i ≡ j mod 8) make independent
// vector chains; one chain of dependent double additions would take ~4 cycles per element, slower
// than reading the gradients from memory. For fp32 the eight lanes are two AVX2 registers of four
// doubles (the compiler leaves the loop scalar): the same operations lane by lane, the same bits (a
// float's square is exact in double, so fusing the multiply into the addition changes nothing).
template <typename Real>
double sum_of_squares(const Real* x, size_t n) {
    const size_t block = 1 << 14;
    constexpr int W = 8;
    size_t num_blocks = (n + block - 1) / block;
    std::vector<double> partial(num_blocks);
#pragma omp parallel for schedule(static)
    for (size_t ib = 0; ib < num_blocks; ib++) {
        double lane[W] = {};
        size_t i = ib * block, end = std::min(n, (ib + 1) * block);
#if defined(__AVX2__) && defined(__FMA__)
        if constexpr (std::is_same<Real, float>::value) {
            __m256d lanes_lo = _mm256_setzero_pd(), lanes_hi = lanes_lo;  // lanes 0-3, 4-7
            for (; i + W <= end; i += W) {
                __m256 v = _mm256_loadu_ps(x + i);
                __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
                lanes_lo = _mm256_fmadd_pd(lo, lo, lanes_lo);
                lanes_hi = _mm256_fmadd_pd(hi, hi, lanes_hi);
            }
            _mm256_storeu_pd(lane, lanes_lo);
            _mm256_storeu_pd(lane + 4, lanes_hi);
        }
#endif
        for (; i + W <= end; i += W) {
            for (int j = 0; j < W; j++) lane[j] += (double)x[i + j] * x[i + j];
        }
        double s = 0.0;
        for (int j = 0; j < W; j++) s += lane[j];
        for (; i < end; i++) s += (double)x[i] * x[i];
        partial[ib] = s;
    }
    double total = 0.0;
    for (double s : partial) total += s;
    return total;
}

// The clipping scale for a global norm: gradients are scaled down to norm max_norm, never up.
inline float clip_scale(double grad_norm, double max_norm) {
    return grad_norm > max_norm ? (float)(max_norm / grad_norm) : 1.0f;
}
