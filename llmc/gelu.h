// GELU, the tanh approximation GPT-2 was trained with:
//   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2),  u = k (x + 0.044715 x^3)
#pragma once

#include <cmath>
#include <cstddef>

constexpr double GELU_SCALE = 0.7978845608028654;  // sqrt(2 / pi)

template <typename Real>
void gelu_forward(Real* out, const Real* inp, size_t N) {  // out, inp: (N)
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        Real x = inp[i];
        Real u = (Real)GELU_SCALE * (x + (Real)0.044715 * x * x * x);
        out[i] = (Real)0.5 * x * ((Real)1 + std::tanh(u));
    }
}

// Accumulates (+=) into dinp.
template <typename Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, size_t N) {  // all (N)
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        Real x = inp[i];
        Real u = (Real)GELU_SCALE * (x + (Real)0.044715 * x * x * x);
        Real th = std::tanh(u);
        Real du_dx = (Real)GELU_SCALE * ((Real)1 + (Real)(3 * 0.044715) * x * x);
        Real grad = (Real)0.5 * ((Real)1 + th) + (Real)0.5 * x * ((Real)1 - th * th) * du_dx;
        dinp[i] += grad * dout[i];
    }
}
