// Softmax cross-entropy over the first V of Vp logits (the padded columns V..Vp-1 take no part).
//   loss[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]
//   dlogits[n, v] = (softmax(logits[n, :V])[v] - [v == target[n]]) * dloss,  v < V;  0 for v >= V
// Two ways to get dlogits, the same bits either way:
//   - crossentropy_softmax_backward recomputes the exponentials from the logits, one row at a time;
//   - the training step's forward calls crossentropy_forward_keep_exps, which writes each row's
//     exponentials exp(logit - max) into the dlogits buffer and their sum into row_sums as it computes
//     the loss, and the backward only scales them (crossentropy_backward_from_exps). At d12 that
//     saves one exponential per logit (50257 per position) and two passes over the logits.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "expf.h"

// The largest of row[0..V). Eight lanes at a time for fp32 (the compiler leaves `a > m ? a : m`
// scalar): each lane keeps the first of equal values and skips NaN past element 0 as the scalar loop
// does; only which zero wins a tie between -0 and +0 may differ, and exp(x - max) and the loss are the
// same for either.
template <typename Real>
inline Real row_max(const Real* row, int V) {
    Real maxval = row[0];
    int v = 1;
#if defined(__AVX2__) && defined(__FMA__)
    if constexpr (std::is_same<Real, float>::value) {  // (a row shorter than 9 leaves every lane row[0])
        __m256 lanes = _mm256_set1_ps(row[0]);
        for (; v + 8 <= V; v += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(row + v), lanes);  // NaN in the first: the second
        alignas(32) float lane[8];
        _mm256_store_ps(lane, lanes);
        for (int j = 0; j < 8; j++) maxval = lane[j] > maxval ? lane[j] : maxval;
    }
#endif
    for (; v < V; v++) maxval = row[v] > maxval ? row[v] : maxval;
    return maxval;
}

// One row: exps[v] = exp(row[v] - max) for v < V, in Real precision (none kept when exps is null);
// returns their sum, in double.
template <typename Real>
inline double crossentropy_row_exps(Real* exps, const Real* row, int V, Real* maxval_out) {
    Real maxval = row_max(row, V);
    *maxval_out = maxval;
    return exp_and_sum(exps, row, maxval, V);
}

template <typename Real>
void crossentropy_forward(Real* losses,       // (N)
                          const Real* logits, // (N, Vp)
                          const int* targets, // (N)
                          int N, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const Real* row = logits + (size_t)n * Vp;
        Real maxval;
        double sum = crossentropy_row_exps((Real*)nullptr, row, V, &maxval);
        losses[n] = (Real)(std::log(sum) + maxval - row[targets[n]]);
    }
}

// One row's gradient from its exponentials (in place) and their sum: softmax · dloss, minus dloss at
// the target, 0 in the padded columns.
template <typename Real>
inline void crossentropy_row_grad(Real* drow, double sum, int target, Real dloss, int V, int Vp) {
    Real scale = (Real)(dloss / sum);
    for (int v = 0; v < V; v++) drow[v] *= scale;
    drow[target] -= dloss;
    for (int v = V; v < Vp; v++) drow[v] = 0;
}

// The same losses (bit for bit), and also exps[n, v] = exp(logits[n, v] - max of row n) for v < V and
// row_sums[n] = their sum in double, for crossentropy_backward_from_exps.
template <typename Real>
void crossentropy_forward_keep_exps(Real* losses,       // (N)
                                    Real* exps,         // (N, Vp), columns V..Vp-1 left as they are
                                    double* row_sums,   // (N)
                                    const Real* logits, // (N, Vp)
                                    const int* targets, // (N)
                                    int N, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const Real* row = logits + (size_t)n * Vp;
        Real maxval;
        double sum = crossentropy_row_exps(exps + (size_t)n * Vp, row, V, &maxval);
        row_sums[n] = sum;
        losses[n] = (Real)(std::log(sum) + maxval - row[targets[n]]);
    }
}

// crossentropy_softmax_backward's result from what crossentropy_forward_keep_exps left: dlogits holds
// the exponentials on entry and the gradient on return (the same bits as the recomputing version).
template <typename Real>
void crossentropy_backward_from_exps(Real* dlogits,          // (N, Vp)
                                     const double* row_sums, // (N)
                                     const int* targets,     // (N)
                                     Real dloss, int N, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        crossentropy_row_grad(dlogits + (size_t)n * Vp, row_sums[n], targets[n], dloss, V, Vp);
    }
}

// Overwrites dlogits. dloss is d(total loss)/d(losses[n]), e.g. 1/(B*T*grad_accum_steps).
template <typename Real>
void crossentropy_softmax_backward(Real* dlogits,      // (N, Vp)
                                   const Real* logits, // (N, Vp)
                                   const int* targets, // (N)
                                   Real dloss, int N, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        Real* drow = dlogits + (size_t)n * Vp;
        Real maxval;
        double sum = crossentropy_row_exps(drow, logits + (size_t)n * Vp, V, &maxval);  // store, then scale
        crossentropy_row_grad(drow, sum, targets[n], dloss, V, Vp);
    }
}
