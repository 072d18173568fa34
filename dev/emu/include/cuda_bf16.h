// Emulated cuda_bf16.h (dev/emu): bfloat16 as the GPU stores and rounds it.
//
// bf16 is the top 16 bits of an fp32 (1 sign, 8 exponent, 7 mantissa bits). fp32 -> bf16 rounds to
// nearest, ties to even, as cvt.rn.bf16.f32 does (PTX ISA): overflow goes to infinity, denormals are
// kept, and a NaN becomes the canonical NaN 0x7FFF. bf16 -> fp32 is exact. Arithmetic on bf16 values
// converts them to fp32 (the code here always computes in fp32). The types have NVIDIA's names in the
// global namespace, so a kernel's mangled name is the same as nvcc's (the register table relies on it).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_runtime.h>

struct __nv_bfloat16_raw {
    unsigned short x;
};

inline unsigned short emu_float_to_bf16_bits_rn(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;  // NaN
    bits += 0x7FFFu + ((bits >> 16) & 1u);                    // round half to even on bit 16
    return (unsigned short)(bits >> 16);
}

inline float emu_bf16_bits_to_float(unsigned short b) {
    uint32_t bits = (uint32_t)b << 16;
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

struct __attribute__((aligned(2))) __nv_bfloat16 {
    unsigned short __x;

    __nv_bfloat16() = default;
    // from any arithmetic type, through fp32 (one template, so no integer type is ambiguous)
    template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
    __nv_bfloat16(T value) : __x(emu_float_to_bf16_bits_rn((float)value)) {}
    __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
    operator float() const { return emu_bf16_bits_to_float(__x); }
    operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is 2 bytes");

struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
static_assert(sizeof(__nv_bfloat162) == 4, "bf16x2 is 4 bytes");

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 emu_bf16_from_bits(unsigned short bits) {
    __nv_bfloat16 h;
    h.__x = bits;
    return h;
}

inline __nv_bfloat16 __float2bfloat16(float f) { return emu_bf16_from_bits(emu_float_to_bf16_bits_rn(f)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return emu_bf16_from_bits(emu_float_to_bf16_bits_rn(f)); }
inline float __bfloat162float(__nv_bfloat16 h) { return emu_bf16_bits_to_float(h.__x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return emu_bf16_from_bits(bits); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(a)}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }
inline float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
inline float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return float2{__bfloat162float(v.x), __bfloat162float(v.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }

// bf16x2 arithmetic, each half on its own: the fp32 result rounded once to bf16. The product of two bf16
// values (8 significant bits each) is exact in fp32, and a sum's fp32 rounding never lands on a bf16 tie,
// so this is the correctly rounded bf16 result (except where fp32 itself overflows or goes subnormal).
inline __nv_bfloat162 operator+(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __floats2bfloat162_rn((float)a.x + (float)b.x, (float)a.y + (float)b.y);
}
inline __nv_bfloat162 operator-(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __floats2bfloat162_rn((float)a.x - (float)b.x, (float)a.y - (float)b.y);
}
inline __nv_bfloat162 operator*(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __floats2bfloat162_rn((float)a.x * (float)b.x, (float)a.y * (float)b.y);
}
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return a + b; }
inline __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) { return a - b; }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return a * b; }

// on sm_80 and later; a compare-and-swap on the enclosing 32-bit word
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* address, __nv_bfloat16 value) {
    uintptr_t word_address = (uintptr_t)address & ~(uintptr_t)3;
    unsigned shift = ((uintptr_t)address & 2) ? 16 : 0;
    uint32_t* word = reinterpret_cast<uint32_t*>(word_address);
    EMU_ATOMIC(word);  // the race checker: an atomic access (fence patterns, kernel.h)
    uint32_t old = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        unsigned short old_bits = (unsigned short)(old >> shift);
        unsigned short new_bits = emu_float_to_bf16_bits_rn(emu_bf16_bits_to_float(old_bits) + (float)value);
        uint32_t desired = (old & ~(0xFFFFu << shift)) | ((uint32_t)new_bits << shift);
        if (__atomic_compare_exchange_n(word, &old, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return emu_bf16_from_bits(old_bits);
    }
}

// one compare-and-swap on the pair's 32-bit word (kernel.h)
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* address, __nv_bfloat162 value) { return emu_atomic_add_pair(address, value); }
