// Emulated cuda_fp8.h (dev/emu): the two 8-bit floating-point formats of Hopper's tensor cores, as the GPU
// stores and converts them (issue 48, item 2).
//
//   e4m3 (__NV_E4M3, "e4m3fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities: the one
//        code S.1111.111 is NaN, so the largest finite value is 1.75 * 2^8 = 448 (S.1111.110). Normal
//        numbers down to 2^-6, subnormals m * 2^-9 (m = 1..7).
//   e5m2 (__NV_E5M2): 1 sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent 31 is
//        infinity (mantissa 0) or NaN; the largest finite value is 1.75 * 2^15 = 57344. Normal numbers
//        down to 2^-14, subnormals m * 2^-16 (m = 1..3).
//
// fp32 -> fp8 rounds to nearest, ties to even, on the format's grid (the subnormal grid below the
// smallest normal), as cvt.rn.satfinite{.e4m3x2,.e5m2x2}.f32 and its non-saturating form do (PTX ISA):
//   __NV_SATFINITE: a value whose rounding lies beyond the largest finite value, and an infinity,
//                   become the largest finite value of their sign; a NaN becomes NaN (0x7F)
//   __NV_NOSAT:     they become NaN (0x7F) in e4m3, which has no infinity, and infinity in e5m2
// The __nv_fp8_e4m3 and __nv_fp8_e5m2 types convert from a float with __NV_SATFINITE, as CUDA's do, and
// back to float exactly. Only what the project's code uses is here: a program that needs more fails to
// compile rather than running an approximation.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>

typedef unsigned char __nv_fp8_storage_t;

enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };

// the format's shape: mantissa bits, exponent bias, whether its top exponent is infinity/NaN (IEEE)
struct EmuFp8Format {
    int mantissa_bits, bias;
    bool ieee_top;       // e5m2: the top exponent holds inf and NaN; e4m3: only S.1111.111 is NaN
    double max_finite;   // 448 or 57344
    uint8_t max_code;    // 0x7E or 0x7B
};

inline EmuFp8Format emu_fp8_format(__nv_fp8_interpretation_t kind) {
    return kind == __NV_E4M3 ? EmuFp8Format{3, 7, false, 448.0, 0x7E} : EmuFp8Format{2, 15, true, 57344.0, 0x7B};
}

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate,
                                                __nv_fp8_interpretation_t kind) {
    const EmuFp8Format f = emu_fp8_format(kind);
    if (std::isnan(x)) return 0x7F;
    uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    double a = std::fabs((double)x);
    const uint8_t overflow = saturate == __NV_SATFINITE ? f.max_code : f.ieee_top ? 0x7C : 0x7F;
    if (std::isinf(a)) return (uint8_t)(sign | overflow);
    if (a == 0.0) return sign;
    // the grid at a's binade: 2^(e - M) apart, e = floor(log2 a), never finer than the subnormals'
    const int emin = 1 - f.bias;
    int e = std::ilogb(a);
    if (e < emin) e = emin;
    double quantum = std::ldexp(1.0, e - f.mantissa_bits);
    double r = std::nearbyint(a / quantum) * quantum;  // exact scaling by a power of two; ties to even
    if (r > f.max_finite) return (uint8_t)(sign | overflow);
    if (r == 0.0) return sign;
    int re = std::ilogb(r);
    if (re < emin) return (uint8_t)(sign | (uint8_t)(r / std::ldexp(1.0, emin - f.mantissa_bits)));  // subnormal
    uint8_t mantissa = (uint8_t)(r / std::ldexp(1.0, re - f.mantissa_bits)) - (uint8_t)(1 << f.mantissa_bits);
    return (uint8_t)(sign | ((re + f.bias) << f.mantissa_bits) | mantissa);
}

inline float emu_fp8_to_float(__nv_fp8_storage_t v, __nv_fp8_interpretation_t kind) {
    const EmuFp8Format f = emu_fp8_format(kind);
    const int exponent_bits = 7 - f.mantissa_bits;
    int exponent = (v >> f.mantissa_bits) & ((1 << exponent_bits) - 1);
    int mantissa = v & ((1 << f.mantissa_bits) - 1);
    float sign = (v & 0x80) ? -1.0f : 1.0f;
    int top = (1 << exponent_bits) - 1;
    if (f.ieee_top && exponent == top) return mantissa == 0 ? sign * INFINITY : NAN;
    if (!f.ieee_top && exponent == top && mantissa == (1 << f.mantissa_bits) - 1) return NAN;
    if (exponent == 0) return sign * std::ldexp((float)mantissa, 1 - f.bias - f.mantissa_bits);
    return sign * std::ldexp((float)(mantissa + (1 << f.mantissa_bits)), exponent - f.bias - f.mantissa_bits);
}

// fp8 -> fp16 is exact (every fp8 value is an fp16 value)
inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t v, __nv_fp8_interpretation_t kind) {
    return __half_raw{emu_float_to_half_bits_rn(emu_fp8_to_float(v, kind))};
}

template <__nv_fp8_interpretation_t Kind>
struct EmuFp8 {
    __nv_fp8_storage_t __x;

    EmuFp8() = default;
    explicit EmuFp8(float value) : __x(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, Kind)) {}
    explicit EmuFp8(double value) : EmuFp8((float)value) {}
    explicit operator float() const { return emu_fp8_to_float(__x, Kind); }
};

struct __nv_fp8_e4m3 : EmuFp8<__NV_E4M3> {
    using EmuFp8<__NV_E4M3>::EmuFp8;
    __nv_fp8_e4m3() = default;
};
struct __nv_fp8_e5m2 : EmuFp8<__NV_E5M2> {
    using EmuFp8<__NV_E5M2>::EmuFp8;
    __nv_fp8_e5m2() = default;
};
static_assert(sizeof(__nv_fp8_e4m3) == 1 && sizeof(__nv_fp8_e5m2) == 1, "fp8 is 1 byte");
