// exp(x - shift) over a row of fp32 values and the sum of the results: the inner loop of every softmax
// (attention's rows, the loss's 50257 logits per position), eight values at a time with the bits of
// the C library's one-at-a-time expf.
//
// glibc (2.28 and later) computes expf in double precision, by the algorithm of ARM's
// optimized-routines with a 32-entry table:
//   z = x · 32/ln 2,  k = round(z),  r = z - k   (|r| <= 1/2)
//   exp(x) = 2^(k/32) · 2^(r/32),  2^(k/32) = 2^(k div 32) · T[k mod 32],  T[i] = 2^(i/32)
//   2^(r/32) ≈ 1 + C2 r + C1 r² + C0 r³
// and rounds the double result to float once (error at most 0.502 ulp). On a CPU with FMA it runs a
// build that fuses x·32/ln 2 + shift, x·32/ln 2 - k and the polynomial's multiply-adds. The same
// operations on four doubles per AVX2 register give the same bits: each is an IEEE operation on the
// same operands. Eight values then cost about what one call did; what is left of the softmax is its
// sum, which stays one double addition after another, in index order, as before.
//
// Inputs with |x| >= 88 (overflow; results that are subnormal or zero; inf, nan) take the C library's
// special cases: a group of eight holding one goes to std::exp value by value. So does the row's tail
// past a multiple of 8, and every type but float. test_ops.cpp checks the bits against std::exp.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// The constants, as published with the algorithm: 32/ln 2; 1.5 · 2^52 (adding it rounds to an
// integer, which the low bits then hold); the polynomial's coefficients scaled for r in units of 1/32;
// and T[i] = 2^(i/32) as double bits with i << 47 subtracted, so that adding k << 47 (k's low 5 bits
// cancel, the rest lands in the exponent) makes 2^(k/32) whole.
constexpr double EXPF_INV_LN2_N = 0x1.71547652b82fep+5;
constexpr double EXPF_SHIFT = 0x1.8p+52;
constexpr double EXPF_C0 = 0x1.c6af84b912394p-20, EXPF_C1 = 0x1.ebfce50fac4f3p-13, EXPF_C2 = 0x1.62e42ff0c52d6p-6;
alignas(64) constexpr uint64_t EXPF_TABLE[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

// exp of four doubles (floats converted exactly, |x| < 88), before the rounding to float
static inline __m256d expf_core_pd(__m256d xd) {
    const __m256d shift = _mm256_set1_pd(EXPF_SHIFT), inv_ln2_n = _mm256_set1_pd(EXPF_INV_LN2_N);
    __m256d kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);  // k + shift
    __m256i ki = _mm256_castpd_si256(kd);                // k in the low bits
    kd = _mm256_sub_pd(kd, shift);
    __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long*)EXPF_TABLE, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));  // 2^(k/32)
    __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(EXPF_C0), _mm256_set1_pd(EXPF_C1));
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(EXPF_C2), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_mul_pd(y, scale);
}

// exp of eight floats, all with |x| < 88
static inline __m256 expf8(__m256 x) {
    __m128 lo = _mm256_cvtpd_ps(expf_core_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    __m128 hi = _mm256_cvtpd_ps(expf_core_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    return _mm256_set_m128(hi, lo);
}
#endif

// out[i] = exp(in[i] - shift) for i < n (out may be in, or nullptr to keep none); returns the sum of
// the out[i], added in double in index order.
template <typename Real>
inline double exp_and_sum(Real* out, const Real* in, Real shift, int n) {
    double sum = 0.0;
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if constexpr (std::is_same<Real, float>::value) {
        const __m256 shift8 = _mm256_set1_ps(shift), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256 limit = _mm256_set1_ps(88.0f);
        alignas(32) float e[8];
        for (; i + 8 <= n; i += 8) {
            __m256 x = _mm256_sub_ps(_mm256_loadu_ps(in + i), shift8);
            // not (|x| < 88): a special case, or nan
            if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(x, abs_mask), limit, _CMP_NLT_UQ)) != 0) {
                _mm256_store_ps(e, x);
                for (int j = 0; j < 8; j++) e[j] = std::exp(e[j]);
            } else {
                _mm256_store_ps(e, expf8(x));
            }
            if (out) _mm256_storeu_ps(out + i, _mm256_load_ps(e));
            for (int j = 0; j < 8; j++) sum += e[j];
        }
    }
#endif
    for (; i < n; i++) {
        Real e = std::exp(in[i] - shift);
        if (out) out[i] = e;
        sum += e;
    }
    return sum;
}
