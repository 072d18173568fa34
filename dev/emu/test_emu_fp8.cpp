// Unit test of the emulated cuda_fp8.h (make emu-test-fp8): every conversion against PyTorch's float8 casts
// (dev/emu/fp8_reference.txt, made by dev/emu/fp8_reference.py: every byte's value, and the rounding of
// every representable value, every tie, the floats beside each tie, overflows and random values) and a
// few cases worked out by hand from the formats' definitions. Not checked against our own callers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include <cuda_fp8.h>

namespace {

float float_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

std::string reference_path() {
    const char* root = getenv("GPT2_ROOT");
    return std::string(root ? root : ".") + "/dev/emu/fp8_reference.txt";
}

TEST(EmuFp8, DecodesEveryByteAsPyTorch) {
    FILE* f = fopen(reference_path().c_str(), "r");
    ASSERT_NE(f, nullptr) << reference_path();
    char kind[16];
    unsigned code, e4, e5;
    int n = 0;
    while (fscanf(f, "%15s", kind) == 1) {
        if (strcmp(kind, "decode") != 0) {
            fscanf(f, "%*[^\n]");
            continue;
        }
        ASSERT_EQ(fscanf(f, "%x %x %x", &code, &e4, &e5), 3);
        for (auto [kind8, want] : {std::pair{__NV_E4M3, e4}, std::pair{__NV_E5M2, e5}}) {
            float got = emu_fp8_to_float((__nv_fp8_storage_t)code, kind8);
            if (std::isnan(float_of(want))) {
                EXPECT_TRUE(std::isnan(got)) << "code " << code;
            } else {
                EXPECT_EQ(bits_of(got), want) << "code " << code << (kind8 == __NV_E4M3 ? " e4m3" : " e5m2");
            }
        }
        n++;
    }
    fclose(f);
    EXPECT_EQ(n, 256);
}

TEST(EmuFp8, RoundsEveryReferenceValueAsPyTorch) {
    FILE* f = fopen(reference_path().c_str(), "r");
    ASSERT_NE(f, nullptr) << reference_path();
    char kind[16];
    unsigned x, e4, e5, e4s, e5s;
    int n = 0, failures = 0;
    while (fscanf(f, "%15s", kind) == 1) {
        if (strcmp(kind, "encode") != 0) {
            fscanf(f, "%*[^\n]");
            continue;
        }
        ASSERT_EQ(fscanf(f, "%x %x %x %x %x", &x, &e4, &e5, &e4s, &e5s), 5);
        float v = float_of(x);
        unsigned got[4] = {__nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3), __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2),
                           __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3),
                           __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2)};
        unsigned want[4] = {e4, e5, e4s, e5s};
        const char* what[4] = {"e4m3", "e5m2", "e4m3 satfinite", "e5m2 satfinite"};
        for (int k = 0; k < 4; k++) {
            if (got[k] != want[k] && failures++ < 20) {
                ADD_FAILURE() << what[k] << " of " << v << " (0x" << std::hex << x << "): 0x" << got[k] << ", PyTorch 0x"
                              << want[k];
            }
        }
        n++;
    }
    fclose(f);
    EXPECT_EQ(failures, 0);
    EXPECT_GT(n, 3000);
}

// By hand, from the definitions (dev/emu/include/cuda_fp8.h's comment)
TEST(EmuFp8, EdgeCasesFromTheDefinitions) {
    auto e4 = [](float v, __nv_saturation_t s = __NV_SATFINITE) { return (unsigned)__nv_cvt_float_to_fp8(v, s, __NV_E4M3); };
    auto e5 = [](float v, __nv_saturation_t s = __NV_SATFINITE) { return (unsigned)__nv_cvt_float_to_fp8(v, s, __NV_E5M2); };
    EXPECT_EQ(e4(1.0f), 0x38u);    // 0.0111.000: exponent 7 = bias
    EXPECT_EQ(e5(1.0f), 0x3Cu);    // 0.01111.00
    EXPECT_EQ(e4(448.0f), 0x7Eu);  // 1.75 * 2^8, the largest finite
    EXPECT_EQ(e4(464.0f), 0x7Eu);  // halfway to the NaN code's place: ties to the even 448
    EXPECT_EQ(e4(470.0f, __NV_NOSAT), 0x7Fu);  // rounds past 448: NaN without saturation
    EXPECT_EQ(e4(470.0f), 0x7Eu);              // 448 with it
    EXPECT_EQ(e4(-INFINITY), 0xFEu);
    EXPECT_EQ(e5(61440.0f, __NV_NOSAT), 0x7Cu);  // halfway between 57344 (odd mantissa) and 2^16: infinity
    EXPECT_EQ(e5(61440.0f), 0x7Bu);
    EXPECT_EQ(e4(std::ldexp(1.0f, -9)), 0x01u);   // the smallest subnormal
    EXPECT_EQ(e4(std::ldexp(1.0f, -10)), 0x00u);  // half of it: ties to even, zero
    EXPECT_EQ(e4(std::ldexp(1.5f, -10)), 0x01u);  // above half
    EXPECT_EQ(e4(-0.0f), 0x80u);
    EXPECT_EQ(e4(NAN), 0x7Fu);
    EXPECT_EQ(e5(NAN), 0x7Fu);
    EXPECT_TRUE(std::isnan(emu_fp8_to_float(0x7F, __NV_E4M3)));
    EXPECT_EQ(emu_fp8_to_float(0x7C, __NV_E5M2), INFINITY);
    // the types convert with saturation, and back exactly
    EXPECT_EQ((float)__nv_fp8_e4m3(1000.0f), 448.0f);
    EXPECT_EQ((float)__nv_fp8_e5m2(-1e9f), -57344.0f);
    EXPECT_EQ((float)__nv_fp8_e4m3(0.3f), 0.3125f);  // 1.25 * 2^-2, the nearest e4m3 value to 0.3
}

}  // namespace
