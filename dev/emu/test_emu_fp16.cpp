// Unit test of the emulated cuda_fp16.h (make emu-test-fp16): conversions against bit patterns worked
// out by hand from IEEE 754 binary16 (1 sign, 5 exponent bits with bias 15, 10 mantissa bits) and the
// round-to-nearest-even rule of cvt.rn.f16.f32 (PTX ISA). Not checked against our own callers.
#include <gtest/gtest.h>

#include <cmath>

#include <cuda_fp16.h>

namespace {

uint16_t bits_of(float f) { return __half_as_ushort(__float2half_rn(f)); }

TEST(EmuFp16, NormalNumbers) {
    EXPECT_EQ(bits_of(1.0f), 0x3C00);    // exponent 15 (2^0), mantissa 0
    EXPECT_EQ(bits_of(-2.0f), 0xC000);   // sign, exponent 16
    EXPECT_EQ(bits_of(0.5f), 0x3800);
    EXPECT_EQ(bits_of(65504.0f), 0x7BFF);  // largest finite: (2 - 2^-10) * 2^15
    EXPECT_EQ(bits_of(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
    // 0.1 = 1.6 * 2^-4: exponent 11 (0x2C00), mantissa 0.6 * 1024 = 614.4 -> 614 (0x266)
    EXPECT_EQ(bits_of(0.1f), 0x2E66);
    EXPECT_EQ(bits_of(0.0f), 0x0000);
    EXPECT_EQ(bits_of(-0.0f), 0x8000);
}

TEST(EmuFp16, RoundsToNearestEven) {
    // 1 + 2^-11 lies halfway between 1 (0x3C00, even) and 1 + 2^-10 (0x3C01): to the even one
    EXPECT_EQ(bits_of(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
    // 1 + 3 * 2^-11 lies halfway between 0x3C01 (odd) and 0x3C02 (even)
    EXPECT_EQ(bits_of(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
    // just above the halfway point rounds up
    EXPECT_EQ(bits_of(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
    // a carry out of the mantissa: (2 - 2^-11) rounds to 2.0 (exponent up, mantissa 0)
    EXPECT_EQ(bits_of(2.0f - std::ldexp(1.0f, -11)), 0x4000);
}

TEST(EmuFp16, OverflowToInfinity) {
    EXPECT_EQ(bits_of(65519.0f), 0x7BFF);  // below 65520, the halfway point to 2^16
    EXPECT_EQ(bits_of(65520.0f), 0x7C00);  // the tie goes to the even neighbour, 2^16: infinity
    EXPECT_EQ(bits_of(1e6f), 0x7C00);
    EXPECT_EQ(bits_of(-1e30f), 0xFC00);
    EXPECT_EQ(bits_of(INFINITY), 0x7C00);
    EXPECT_EQ(bits_of(NAN), 0x7FFF);  // canonical NaN
}

TEST(EmuFp16, SubnormalsAndUnderflow) {
    EXPECT_EQ(bits_of(std::ldexp(1.0f, -24)), 0x0001);       // smallest subnormal
    EXPECT_EQ(bits_of(std::ldexp(1.0f, -15)), 0x0200);       // half the smallest normal
    EXPECT_EQ(bits_of(std::ldexp(1.0f, -25)), 0x0000);       // half of 2^-24: tie, to even (0)
    EXPECT_EQ(bits_of(std::ldexp(1.5f, -25)), 0x0001);       // 0.75 units: up
    EXPECT_EQ(bits_of(std::ldexp(3.0f, -25)), 0x0002);       // 1.5 units: tie, to even (2)
    EXPECT_EQ(bits_of(std::ldexp(1.0f, -26)), 0x0000);       // a quarter unit: down
    EXPECT_EQ(bits_of(-std::ldexp(1.0f, -30)), 0x8000);      // underflows to -0
    EXPECT_EQ(bits_of(std::ldexp(1.0f, -130)), 0x0000);      // an fp32 subnormal
    EXPECT_EQ(bits_of(std::ldexp(1023.0f, -24)), 0x03FF);    // largest subnormal
    EXPECT_EQ(bits_of(std::ldexp(1023.5f, -24)), 0x0400);    // tie between 0x3FF and 0x400 (even): smallest normal
}

TEST(EmuFp16, ToFloatIsExact) {
    EXPECT_EQ(__half2float(__ushort_as_half(0x0001)), std::ldexp(1.0f, -24));
    EXPECT_EQ(__half2float(__ushort_as_half(0x03FF)), std::ldexp(1023.0f, -24));
    EXPECT_EQ(__half2float(__ushort_as_half(0x7BFF)), 65504.0f);
    EXPECT_EQ(__half2float(__ushort_as_half(0x3555)), 0.333251953125f);  // (1 + 341/1024) / 4
    EXPECT_EQ(__half2float(__ushort_as_half(0xC000)), -2.0f);
    EXPECT_TRUE(std::isinf(__half2float(__ushort_as_half(0xFC00))));
    EXPECT_TRUE(std::isnan(__half2float(__ushort_as_half(0x7E00))));
    // every finite half converts to float and back to itself
    for (uint32_t b = 0; b < 0x10000; b++) {
        if ((b & 0x7C00) == 0x7C00 && (b & 0x3FF) != 0) continue;  // NaNs
        ASSERT_EQ(bits_of(__half2float(__ushort_as_half((uint16_t)b))), b) << std::hex << b;
    }
}

}  // namespace
