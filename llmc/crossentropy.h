// Softmax cross-entropy over the first V of Vp logits (the padded columns V..Vp-1 take no part).
//   loss[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]
//   dlogits[n, v] = (softmax(logits[n, :V])[v] - [v == target[n]]) * dloss,  v < V;  0 for v >= V
// The probabilities are never stored: the backward recomputes them from the logits, one row at a time.
#pragma once

#include <cmath>
#include <cstddef>

template <typename Real>
void crossentropy_forward(Real* losses,       // (N)
                          const Real* logits, // (N, Vp)
                          const int* targets, // (N)
                          int N, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const Real* row = logits + (size_t)n * Vp;
        Real maxval = row[0];
        for (int v = 1; v < V; v++) maxval = row[v] > maxval ? row[v] : maxval;
        double sum = 0.0;  // exponentials in Real precision, their sum in double
        for (int v = 0; v < V; v++) sum += std::exp(row[v] - maxval);
        losses[n] = (Real)(std::log(sum) + maxval - row[targets[n]]);
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
        const Real* row = logits + (size_t)n * Vp;
        Real* drow = dlogits + (size_t)n * Vp;
        Real maxval = row[0];
        for (int v = 1; v < V; v++) maxval = row[v] > maxval ? row[v] : maxval;
        // each exponential once: store it, sum it (in double), then scale the row
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            drow[v] = std::exp(row[v] - maxval);
            sum += drow[v];
        }
        Real scale = (Real)(dloss / sum);
        for (int v = 0; v < V; v++) drow[v] *= scale;
        drow[targets[n]] -= dloss;
        for (int v = V; v < Vp; v++) drow[v] = 0;
    }
}
