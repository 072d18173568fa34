// Residual connection: out = a + b. Its backward is the identity into both branches, which the
// trainer does by accumulating the same gradient buffer into both inputs.
#pragma once

#include <cstddef>

template <typename Real>
void residual_forward(Real* out, const Real* a, const Real* b, size_t N) {  // all (N)
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

// Accumulates (+=) dout into both inputs' gradients.
template <typename Real>
void residual_backward(Real* da, Real* db, const Real* dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
