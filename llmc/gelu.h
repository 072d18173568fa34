// GELU, the tanh approximation GPT-2 was trained with:
//   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2/pi)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3 * 0.044715 x^2),  u = k (x + 0.044715 x^3)
//
// The fp32 trainer spends much of the GELU time in tanh, which the C library computes one value at a
// time. gelu_tanh() below computes it from an exponential that the compiler can vectorize:
//   tanh(u) = sign(u) (1 - e) / (1 + e),  e = exp(-2|u|)
// with exp(x) = 2^k exp(r), k = round(x / ln 2), |r| <= ln(2)/2, and exp(r) from Cephes' degree-6
// polynomial (about 1 ulp). Near u = 0 the quotient loses relative accuracy, but GELU uses
// 1 + tanh(u) and 1 - tanh(u)^2, whose absolute error stays ~1e-7. Other types use std::tanh.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

constexpr double GELU_SCALE = 0.7978845608028654;  // sqrt(2 / pi)

// exp(x) for x in [-87, 0], vectorizable (no library call)
inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    // round(x / ln 2) by adding and subtracting 1.5 * 2^23: the sum has no bits below 1 (plain float
    // adds, which vectorize, where floor() and nearbyint() here do not)
    const float round_magic = 12582912.0f;
    float k = (x * 1.44269504088896341f + round_magic) - round_magic;
    float r = x - k * 0.693359375f + k * 2.12194440e-4f;      // x - k ln 2, in two parts for accuracy
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float exp_r = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;  // 2^k, k in [-126, 0]
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    return exp_r * two_k;
}

template <typename Real>
inline Real gelu_tanh(Real u) {
    if constexpr (std::is_same<Real, float>::value) {
        float e = exp_nonpositive(-2.0f * std::fabs(u));
        float t = (1.0f - e) / (1.0f + e);
        return std::copysign(t, u);
    } else {
        return std::tanh(u);
    }
}

template <typename Real>
void gelu_forward(Real* out, const Real* inp, size_t N) {  // out, inp: (N)
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        Real x = inp[i];
        Real u = (Real)GELU_SCALE * (x + (Real)0.044715 * x * x * x);
        out[i] = (Real)0.5 * x * ((Real)1 + gelu_tanh(u));
    }
}

// Accumulates (+=) into dinp.
template <typename Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, size_t N) {  // all (N)
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        Real x = inp[i];
        Real u = (Real)GELU_SCALE * (x + (Real)0.044715 * x * x * x);
        Real th = gelu_tanh(u);
        Real du_dx = (Real)GELU_SCALE * ((Real)1 + (Real)(3 * 0.044715) * x * x);
        Real grad = (Real)0.5 * ((Real)1 + th) + (Real)0.5 * x * ((Real)1 - th * th) * du_dx;
        dinp[i] += grad * dout[i];
    }
}
