// Emulated cuda_fp16.h (dev/emu): IEEE half precision as the GPU stores and rounds it.
//
// fp16 is 1 sign, 5 exponent (bias 15) and 10 mantissa bits: normal numbers from 2^-14 to 65504,
// subnormals down to 2^-24, then zero. fp32 -> fp16 rounds to nearest, ties to even, as
// cvt.rn.f16.f32 does (PTX ISA): a value at or beyond 65520 (65504 plus half a step) becomes infinity,
// a value below 2^-14 becomes a subnormal (rounded on its 2^-24 grid) or zero, and a NaN becomes the
// canonical NaN 0x7FFF. fp16 -> fp32 is exact. Arithmetic converts to fp32 (our kernels compute in
// fp32). The types have NVIDIA's names in the global namespace, like cuda_bf16.h here.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_runtime.h>

inline unsigned short emu_float_to_half_bits_rn(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return 0x7FFFu;                       // NaN
    int exponent = (int)(magnitude >> 23) - 127;                         // unbiased
    if (exponent >= -14) {
        // normal in fp16 (or overflowing): drop 13 mantissa bits, round half to even; a carry out of
        // the mantissa moves up the exponent, and past the largest finite value it lands on 0x7C00 (inf)
        if (exponent > 15) return (unsigned short)(sign | 0x7C00u);
        uint32_t result = (magnitude >> 13) - ((uint32_t)(127 - 15) << 10);
        uint32_t rest = magnitude & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) result++;
        if (result > 0x7C00u) result = 0x7C00u;
        return (unsigned short)(sign | result);
    }
    // subnormal or zero: the value in units of 2^-24 is m * 2^(exponent + 1), m with its implicit bit
    int shift = -exponent - 1;  // >= 14
    if (shift > 25) return (unsigned short)sign;  // below half of 2^-24 (float subnormals included)
    uint32_t m = (magnitude & 0x7FFFFFu) | 0x800000u;
    uint32_t result = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (result & 1u))) result++;
    return (unsigned short)(sign | result);
}

inline float emu_half_bits_to_float(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);  // inf, NaN
    } else if (exponent != 0) {
        bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
    } else {
        float value = (float)mantissa * (1.0f / 16777216.0f);  // 2^-24, exact
        memcpy(&bits, &value, sizeof(bits));
        bits |= sign;
    }
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

struct __half_raw {
    unsigned short x;
};

struct __attribute__((aligned(2))) __half {
    unsigned short __x;

    __half() = default;
    // from any arithmetic type, through fp32 (one template, so no integer type is ambiguous)
    template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
    __half(T value) : __x(emu_float_to_half_bits_rn((float)value)) {}
    __half(const __half_raw& r) : __x(r.x) {}
    operator float() const { return emu_half_bits_to_float(__x); }
    operator __half_raw() const { return __half_raw{__x}; }
};
static_assert(sizeof(__half) == 2, "fp16 is 2 bytes");

struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};
static_assert(sizeof(__half2) == 4, "fp16x2 is 4 bytes");

typedef __half half;
typedef __half2 half2;

inline __half emu_half_from_bits(unsigned short bits) {
    __half h;
    h.__x = bits;
    return h;
}

inline __half __float2half(float f) { return emu_half_from_bits(emu_float_to_half_bits_rn(f)); }
inline __half __float2half_rn(float f) { return emu_half_from_bits(emu_float_to_half_bits_rn(f)); }
inline float __half2float(__half h) { return emu_half_bits_to_float(h.__x); }
inline __half __ushort_as_half(unsigned short bits) { return emu_half_from_bits(bits); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__float2half_rn(a), __float2half_rn(a)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline float __low2float(__half2 v) { return __half2float(v.x); }
inline float __high2float(__half2 v) { return __half2float(v.y); }
inline float2 __half22float2(__half2 v) { return float2{__half2float(v.x), __half2float(v.y)}; }
inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline bool __hisnan(__half h) { return (h.__x & 0x7FFFu) > 0x7C00u; }
inline bool __hisinf(__half h) { return (h.__x & 0x7FFFu) == 0x7C00u; }

// half2 arithmetic, each half on its own: the fp32 result rounded once to fp16. The product of two fp16
// values (11 significant bits each) is exact in fp32, and a sum's fp32 rounding never lands on an fp16
// tie, so this is the correctly rounded fp16 result.
inline __half2 operator+(__half2 a, __half2 b) { return __floats2half2_rn((float)a.x + (float)b.x, (float)a.y + (float)b.y); }
inline __half2 operator-(__half2 a, __half2 b) { return __floats2half2_rn((float)a.x - (float)b.x, (float)a.y - (float)b.y); }
inline __half2 operator*(__half2 a, __half2 b) { return __floats2half2_rn((float)a.x * (float)b.x, (float)a.y * (float)b.y); }
inline __half2 __hadd2(__half2 a, __half2 b) { return a + b; }
inline __half2 __hsub2(__half2 a, __half2 b) { return a - b; }
inline __half2 __hmul2(__half2 a, __half2 b) { return a * b; }

// on sm_70 and later; a compare-and-swap on the enclosing 32-bit word
inline __half atomicAdd(__half* address, __half value) {
    uintptr_t word_address = (uintptr_t)address & ~(uintptr_t)3;
    unsigned shift = ((uintptr_t)address & 2) ? 16 : 0;
    uint32_t* word = reinterpret_cast<uint32_t*>(word_address);
    EMU_ATOMIC(word);  // the race checker: an atomic access (fence patterns, kernel.h)
    uint32_t old = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        unsigned short old_bits = (unsigned short)(old >> shift);
        unsigned short new_bits = emu_float_to_half_bits_rn(emu_half_bits_to_float(old_bits) + (float)value);
        uint32_t desired = (old & ~(0xFFFFu << shift)) | ((uint32_t)new_bits << shift);
        if (__atomic_compare_exchange_n(word, &old, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return emu_half_from_bits(old_bits);
    }
}

// one compare-and-swap on the pair's 32-bit word (kernel.h)
inline __half2 atomicAdd(__half2* address, __half2 value) { return emu_atomic_add_pair(address, value); }
