// Muon (Keller Jordan; as torch.optim.Muon defines it): momentum, then the update orthogonalized.
// For one weight matrix W (rows, cols) and its gradient g (already multiplied by the clipping scale),
// at learning rate lr and weight decay wd:
//   B = B + (1 - mu) (g - B)               momentum as a running mean, mu = 0.95 (torch: buf.lerp_(g, 1 - mu))
//   U = g + mu (B - g)                     Nesterov (torch: g.lerp(B, mu))
//   O = NS5(U)                             U's singular values pushed towards 1, its singular vectors kept
//   W = W (1 - lr wd) - lr sqrt(max(1, rows / cols)) O
// NS5: X = U, or Uᵀ when U is tall (so X X ᵀ is the small Gram matrix); X /= max(‖X‖_F, 1e-7), which puts
// every singular value in [0, 1]; then five times
//   A = X Xᵀ,   X = a X + (b A + c A²) X,   (a, b, c) = (3.4445, -4.7750, 2.0315)
// an odd quintic in X's singular values, p(s) = a s + b s³ + c s⁵, whose slope a at 0 lifts small ones
// quickly; after five steps every singular value is in about [0.7, 1.2] rather than exactly 1, which
// does not hurt training. The ratio sqrt(max(1, rows/cols)) is torch's default lr adjustment ("original"):
// a tall matrix's orthogonal update has smaller elements, so it gets a larger rate.
//
// torch runs NS5 in bfloat16; this CPU reference runs it in fp32 (test/test_optimizers.cpp measures the
// difference). The products go through the CPU GEMM (llmc/gemm.h), 2 n² m + n³ multiply-adds per step
// for X (n, m), n <= m: at GPT-2 small 1.5 TFLOP per optimizer step, as much as the forward and backward
// of about 2000 tokens (6 N per token), so Muon's cost is small only beside large batches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "adamw.h"
#include "gemm.h"
#include "muon_hyper.h"

// The momentum step of n elements: momentum (n) updated, grad (n) replaced by the Nesterov update U.
inline void muon_momentum(float* momentum, float* grad, size_t n, float mu, float grad_scale) {
    const float one_minus_mu = (float)(1.0 - (double)mu);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float b = lerp_as_torch(momentum[i], g, one_minus_mu);
        momentum[i] = b;
        grad[i] = lerp_as_torch(g, b, mu);
    }
}

// Orthogonalizes x (rows, cols) in place: NS5 above. scratch is resized as needed and may be reused.
inline void newton_schulz(float* x, int rows, int cols, const MuonHyper& h, std::vector<float>* scratch) {
    const bool tall = rows > cols;
    const int n = tall ? cols : rows, m = tall ? rows : cols;  // X is (n, m), n <= m
    const size_t nm = (size_t)n * m, nn = (size_t)n * n;
    scratch->resize(2 * nm + 2 * nn);
    float* X = scratch->data();  // (n, m)
    float* Y = X + nm;           // (n, m)  (b A + c A²) X
    float* A = Y + nm;           // (n, n)  X Xᵀ, then b A + c A²
    float* AA = A + nn;          // (n, n)  A²
    if (tall) {
        for (int i = 0; i < rows; i++) {
            for (int j = 0; j < cols; j++) X[(size_t)j * m + i] = x[(size_t)i * cols + j];
        }
    } else {
        std::copy(x, x + nm, X);
    }
    const float norm = std::max((float)std::sqrt(sum_of_squares(X, nm)), h.eps);
    for (size_t i = 0; i < nm; i++) X[i] /= norm;
    using View = MatrixView<float>;
    for (int step = 0; step < h.ns_steps; step++) {
        gemm_accumulate(A, n, View{X, (size_t)m, 1}, View{X, 1, (size_t)m}, n, n, m, true);   // X Xᵀ
        gemm_accumulate(AA, n, View{A, (size_t)n, 1}, View{A, (size_t)n, 1}, n, n, n, true);  // A A
        for (size_t i = 0; i < nn; i++) A[i] = h.b * A[i] + h.c * AA[i];
        gemm_accumulate(Y, m, View{A, (size_t)n, 1}, View{X, (size_t)m, 1}, n, m, n, true);   // (b A + c A²) X
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < nm; i++) X[i] = h.a * X[i] + Y[i];
    }
    if (tall) {
        for (int i = 0; i < rows; i++) {
            for (int j = 0; j < cols; j++) x[(size_t)i * cols + j] = X[(size_t)j * m + i];
        }
    } else {
        std::copy(X, X + nm, x);
    }
}

// The update of n elements of a matrix from its orthogonalized O: decoupled weight decay at the
// unadjusted rate, then the step at the adjusted one (adjusted_lr = lr * muon_lr_ratio).
inline void muon_apply(float* params, const float* ortho, size_t n, float lr, float weight_decay, float adjusted_lr) {
    const float keep = (float)(1.0 - (double)lr * weight_decay), step = -adjusted_lr;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) params[i] = params[i] * keep + step * ortho[i];
}
