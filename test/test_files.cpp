// File readers and writers (../shared/FORMATS.md): every reader refuses a bad file with a message that
// names the file and what is wrong, and exits 1; every writer's output reads back equal.
//
// Bad files are made by writing a good one and then editing its bytes, so each case differs from an
// accepted file in exactly one way. The death tests re-run the test body up to the statement in a
// child process (death_test_style "threadsafe", set in test_main.cpp), so every body is cheap.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../llmc/io/checkpoint.h"
#include "../llmc/io/dataloader.h"
#include "../llmc/tokenizer/tokenizer_file.h"
#include "../llmc/utils.h"
#include "test_helpers.h"

namespace {

std::string read_bytes(const std::string& path) { return test::read_text(path); }

void write_bytes(const std::string& path, const std::string& bytes) {
    FILE* fp = fopenCheck(path.c_str(), "wb");
    fwriteCheck(bytes.data(), 1, bytes.size(), fp);
    fcloseCheck(fp);
}

// Copies `from` to `to` with header slot `slot` set to `value`.
// (A field of the format, h[0..63], of a checksummed file gets the header's checksum recomputed, as a
// buggy writer would have written it: the reader's check of that field is then what fails, not the
// header's checksum, which FilesChecksum.ACorruptHeaderFieldIsCalledACorruptHeader tests. The checksum
// slots themselves, h[64..], are changed as they are.)
void copy_with_header(const std::string& from, const std::string& to, int slot, int32_t value) {
    std::string bytes = read_bytes(from);
    memcpy(&bytes[slot * 4], &value, 4);
    write_bytes(to, bytes);
    if (slot < CHECKSUM_SLOT_TAG) test::reseal_header_checksum(to);
}

// Copies `from` to `to`, cut to `size` bytes or grown with zero bytes to it.
void copy_resized(const std::string& from, const std::string& to, long size) {
    std::string bytes = read_bytes(from);
    bytes.resize(size, '\0');
    write_bytes(to, bytes);
}

uint32_t float_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return bits;
}

float bits_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// The bf16 nearest to f, ties to even, computed without bit tricks: bf16 keeps 8 significant bits, so
// with |f| = m * 2^e (m in [0.5, 1)) its spacing is 2^(e-8), and never finer than 2^-133 (the spacing
// of bf16 subnormals). Scaling by a power of two is exact in double and nearbyint rounds half to even
// in the default rounding mode; anything that rounds to 2^128 or beyond overflows to infinity.
float bf16_reference(float f) {
    if (std::isnan(f) || std::isinf(f) || f == 0.0f) return f;
    int e;
    std::frexp((double)f, &e);
    int q = std::max(e - 8, -133);
    double rounded = std::ldexp(std::nearbyint(std::ldexp((double)f, -q)), q);
    if (std::fabs(rounded) >= std::ldexp(1.0, 128)) return std::copysign(INFINITY, f);
    return (float)rounded;
}

// A tiny model: 2 layers, 8 channels, 2 heads, maxT 8, V 10 padded to 128.
GPT2Config tiny_config() {
    GPT2Config cfg;
    cfg.max_seq_len = 8;
    cfg.vocab_size = 10;
    cfg.padded_vocab_size = 128;
    cfg.num_layers = 2;
    cfg.num_heads = 2;
    cfg.channels = 8;
    return cfg;
}

std::vector<float> random_params(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<float> p(n);
    rand_normal_fill(p.data(), n, 0.0, 1.0, rng);
    return p;
}

void read_model(const std::string& path) {
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(path, &cfg, &params);
}

void read_state(const std::string& path) {
    TrainState s;
    state_file_read(path, &s);
}

void read_tokenizer(const std::string& path) {
    TokenizerFile tok;
    tokenizer_file_read(path, &tok);
}

TrainState sample_state(bool with_master) {
    TrainState s;
    s.num_processes = 4;
    s.rank = 3;
    s.B = 8;
    s.T = 64;
    s.grad_accum_steps = 5;
    s.step = 123456789012LL;         // beyond int32: stored as int64
    s.data_epoch = 3;
    s.data_sample = 5000000000LL;  // beyond int32
    s.data_epoch_samples = 6000000000LL;
    s.data_fingerprint = 0x8123456789abcdefull;
    s.loss_scale_dynamic = true;
    s.sampler_rng = 0xfedcba9876543210ull;  // top bit set: survives the int64 slot
    s.num_parameters = 1000;
    s.shard_offset = 750;
    s.shard_length = 250;
    s.loss_scale = 2048.0f;
    s.clean_steps = 3;
    s.consecutive_skipped = 1;
    s.skipped_total = 9;
    s.updates = s.step - 9;
    std::mt19937 rng(7);
    s.m.resize(250);
    s.v.resize(250);
    rand_normal_fill(s.m.data(), 250, 0.0, 1.0, rng);
    rand_normal_fill(s.v.data(), 250, 0.0, 1.0, rng);
    for (float& v : s.v) v *= v;  // a second moment: never negative
    if (with_master) {
        s.master.resize(250);
        rand_normal_fill(s.master.data(), 250, 0.0, 1.0, rng);
    }
    return s;
}

// Sets one int64 of the state header (h[8..23] hold eight int64, FORMATS in checkpoint.h).
void copy_with_state_wide(const std::string& from, const std::string& to, int index, int64_t value) {
    std::string bytes = read_bytes(from);
    memcpy(&bytes[(8 + 2 * index) * 4], &value, 8);
    write_bytes(to, bytes);
    test::reseal_header_checksum(to);  // as copy_with_header: the field's check is under test
}

TokenizerFile sample_tokenizer() {
    TokenizerFile tok;
    tok.token_bytes = {"a", "b", std::string("\0\xff", 2), " the", std::string(255, 'x'), "<|endoftext|>"};
    tok.eot_token = 5;
    return tok;
}

}  // namespace

// ----------------------------------------------------------------------------
// model checkpoint

TEST(FilesModel, Fp32RoundTripIsExact) {
    std::string dir = test::scratch_dir("files_model_v3");
    GPT2Config cfg = tiny_config();
    size_t n = num_parameters(cfg);
    std::vector<float> params = random_params(n, 1);
    params[0] = -0.0f;
    params[1] = 1e-40f;  // subnormal
    model_file_write(dir + "/m.bin", cfg, params.data(), MODEL_VERSION_FP32);
    // size is exactly the header plus 4 bytes per parameter
    EXPECT_EQ((long)read_bytes(dir + "/m.bin").size(), HEADER_BYTES + 4 * (long)n);

    GPT2Config got;
    std::vector<float> back;
    int version = 0;
    model_file_read(dir + "/m.bin", &got, &back, &version);
    EXPECT_EQ(version, 3);
    EXPECT_EQ(got.max_seq_len, cfg.max_seq_len);
    EXPECT_EQ(got.vocab_size, cfg.vocab_size);
    EXPECT_EQ(got.padded_vocab_size, cfg.padded_vocab_size);
    EXPECT_EQ(got.num_layers, cfg.num_layers);
    EXPECT_EQ(got.num_heads, cfg.num_heads);
    EXPECT_EQ(got.channels, cfg.channels);
    ASSERT_EQ(back.size(), n);
    EXPECT_EQ(memcmp(back.data(), params.data(), n * sizeof(float)), 0);  // bit for bit
    EXPECT_FALSE(file_exists(dir + "/m.bin.tmp"));  // committed: no temporary left
}

TEST(FilesModel, HeaderSlotsFollowFormats) {
    std::string dir = test::scratch_dir("files_model_header");
    GPT2Config cfg = tiny_config();
    std::vector<float> params(num_parameters(cfg), 0.5f);
    model_file_write(dir + "/m.bin", cfg, params.data(), MODEL_VERSION_FP32);
    std::string bytes = read_bytes(dir + "/m.bin");
    ASSERT_GE(bytes.size(), (size_t)HEADER_BYTES);
    const int32_t* h = (const int32_t*)bytes.data();
    EXPECT_EQ(h[0], 20240326);
    EXPECT_EQ(h[1], 3);
    EXPECT_EQ(h[2], 8);    // maxT
    EXPECT_EQ(h[3], 10);   // V
    EXPECT_EQ(h[4], 2);    // L
    EXPECT_EQ(h[5], 2);    // NH
    EXPECT_EQ(h[6], 8);    // C
    EXPECT_EQ(h[7], 128);  // Vp
    for (int i = 8; i < 64; i++) EXPECT_EQ(h[i], 0) << "unused header slot " << i;
    // then our checksums (llmc/io/checksum.h), in slots llm.c does not read: one 1 MiB block
    EXPECT_EQ(h[64], CHECKSUM_TAG);
    EXPECT_EQ(h[65], 1 << 20);
    EXPECT_EQ(h[66], 1);
    EXPECT_EQ((uint32_t)h[68], crc32_update(0, bytes.data() + HEADER_BYTES, bytes.size() - HEADER_BYTES));
    for (int i = 69; i < HEADER_INTS; i++) EXPECT_EQ(h[i], 0) << "unused checksum slot " << i;
}

TEST(FilesModel, Bf16RoundTripRoundsToNearestEven) {
    std::string dir = test::scratch_dir("files_model_v5");
    GPT2Config cfg = tiny_config();
    size_t n = num_parameters(cfg);
    std::vector<float> params = random_params(n, 2);
    // a few exact ties: 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7 (even: down to 1);
    // 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even: up)
    params[0] = 1.0f + std::ldexp(1.0f, -8);
    params[1] = 1.0f + 3 * std::ldexp(1.0f, -8);
    params[2] = -(1.0f + 3 * std::ldexp(1.0f, -8));
    model_file_write(dir + "/m.bin", cfg, params.data(), MODEL_VERSION_BF16);
    EXPECT_EQ((long)read_bytes(dir + "/m.bin").size(), HEADER_BYTES + 2 * (long)n);

    GPT2Config got;
    std::vector<float> back;
    int version = 0;
    model_file_read(dir + "/m.bin", &got, &back, &version);
    EXPECT_EQ(version, 5);
    EXPECT_EQ(got.channels, cfg.channels);
    ASSERT_EQ(back.size(), n);
    EXPECT_EQ(back[0], 1.0f);
    EXPECT_EQ(back[1], 1.0f + std::ldexp(1.0f, -6));
    EXPECT_EQ(back[2], -(1.0f + std::ldexp(1.0f, -6)));
    size_t mismatches = 0;
    for (size_t i = 0; i < n; i++) mismatches += float_bits(back[i]) != float_bits(bf16_reference(params[i]));
    EXPECT_EQ(mismatches, 0u);
}

TEST(FilesModel, Float32ToBf16MatchesIndependentRounding) {
    std::mt19937 rng(123);
    size_t checked = 0, mismatches = 0;
    auto check = [&](uint32_t bits) {
        float f = bits_float(bits);
        if (std::isnan(f)) return;
        float got = bf16_to_float(float_to_bf16(f));
        float want = bf16_reference(f);
        checked++;
        if (float_bits(got) != float_bits(want)) {
            if (mismatches++ < 5) ADD_FAILURE() << std::hex << "bits 0x" << bits << ": got 0x" << float_bits(got)
                                                << ", want 0x" << float_bits(want);
        }
    };
    for (int i = 0; i < 1000000; i++) check(rng());  // random bit patterns: every exponent, subnormals
    for (int i = 0; i < 100000; i++) {
        uint32_t upper = rng() & 0xffff0000u;
        check(upper | 0x8000u);  // exact tie: goes to the even neighbour
        check(upper | 0x7fffu);  // just below the tie: down
        check(upper | 0x8001u);  // just above: up
        check(upper);            // exactly representable: unchanged
    }
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu,
                                0x00800000u, 0x3f808000u, 0x3f818000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu,
                                0xff7f8000u, 0x7f800000u, 0xff800000u, 0x7f7e8000u};
    for (uint32_t bits : special) check(bits);
    EXPECT_GT(checked, 1390000u);  // all but the NaN patterns (about 0.4%) of 1.4 million
    EXPECT_EQ(mismatches, 0u);

    // hand-checked cases: the largest finite float's tie rounds up to infinity (0x7f7f is odd), the one
    // below it rounds down (0x7f7e is even); 2^-149 (smallest subnormal) rounds to zero
    EXPECT_EQ(float_to_bf16(bits_float(0x7f7f8000u)), 0x7f80u);
    EXPECT_EQ(float_to_bf16(bits_float(0x7f7e8000u)), 0x7f7eu);
    EXPECT_EQ(float_to_bf16(bits_float(0x00000001u)), 0x0000u);
    EXPECT_EQ(float_to_bf16(1.0f), 0x3f80u);
    EXPECT_EQ(float_to_bf16(-2.0f), 0xc000u);
    // NaN stays NaN, including a signalling NaN whose top half alone would read as infinity
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
    for (uint32_t bits : nans) EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_float(bits))))) << bits;
}

TEST(FilesModel, Bf16UpcastIsExact) {
    int mismatches = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_float((uint16_t)h);
        // value from the fields: sign, 8-bit exponent, 7-bit mantissa
        int sign = h >> 15, exponent = (h >> 7) & 0xff, mantissa = h & 0x7f;
        if (exponent == 0xff) {
            mismatches += mantissa == 0 ? !std::isinf(f) : !std::isnan(f);
            continue;
        }
        double value = exponent == 0 ? std::ldexp((double)mantissa, -133)
                                     : std::ldexp(128.0 + mantissa, exponent - 134);
        if (sign) value = -value;
        mismatches += (double)f != value || std::signbit(f) != (bool)sign;
        mismatches += float_bits(f) != h << 16;
        mismatches += float_to_bf16(f) != h;  // a bf16 value converts back to itself
    }
    EXPECT_EQ(mismatches, 0);
}

TEST(FilesModel, RefusesWrongMagicAndVersion) {
    std::string dir = test::scratch_dir("files_model_bad_id");
    GPT2Config cfg = tiny_config();
    std::vector<float> params(num_parameters(cfg), 0.25f);
    model_file_write(dir + "/good.bin", cfg, params.data(), MODEL_VERSION_FP32);
    copy_with_header(dir + "/good.bin", dir + "/magic.bin", 0, 20240520);  // a data shard's magic
    EXPECT_EXIT(read_model(dir + "/magic.bin"), testing::ExitedWithCode(1),
                "model checkpoint '.*magic\\.bin' has magic 20240520, expected 20240326");
    copy_with_header(dir + "/good.bin", dir + "/version.bin", 1, 4);
    EXPECT_EXIT(read_model(dir + "/version.bin"), testing::ExitedWithCode(1),
                "model checkpoint '.*version\\.bin' has version 4, this program reads version 3 or 5");
    EXPECT_EXIT(read_model(dir + "/missing.bin"), testing::ExitedWithCode(1), "could not open '.*missing\\.bin'");
}

TEST(FilesModel, RefusesTruncatedAndOversized) {
    std::string dir = test::scratch_dir("files_model_bad_size");
    GPT2Config cfg = tiny_config();
    long n = (long)num_parameters(cfg);
    std::vector<float> params(n, 0.25f);
    model_file_write(dir + "/good.bin", cfg, params.data(), MODEL_VERSION_FP32);
    model_file_write(dir + "/good5.bin", cfg, params.data(), MODEL_VERSION_BF16);
    copy_resized(dir + "/good.bin", dir + "/empty.bin", 0);
    EXPECT_EXIT(read_model(dir + "/empty.bin"), testing::ExitedWithCode(1),
                "model checkpoint '.*empty\\.bin' is 0 bytes, shorter than its 1024-byte header");
    copy_resized(dir + "/good.bin", dir + "/short_header.bin", 1000);
    EXPECT_EXIT(read_model(dir + "/short_header.bin"), testing::ExitedWithCode(1),
                "'.*short_header\\.bin' is 1000 bytes, shorter than its 1024-byte header");
    std::string implied3 = std::to_string(HEADER_BYTES + 4 * n), implied5 = std::to_string(HEADER_BYTES + 2 * n);
    copy_resized(dir + "/good.bin", dir + "/short3.bin", HEADER_BYTES + 4 * n - 1);
    EXPECT_EXIT(read_model(dir + "/short3.bin"), testing::ExitedWithCode(1),
                "model checkpoint '.*short3\\.bin' is [0-9]+ bytes but its header implies " + implied3 +
                    " bytes \\(truncated\\)");
    copy_resized(dir + "/good5.bin", dir + "/short5.bin", HEADER_BYTES + 2 * n - 2);
    EXPECT_EXIT(read_model(dir + "/short5.bin"), testing::ExitedWithCode(1),
                "'.*short5\\.bin' is [0-9]+ bytes but its header implies " + implied5 + " bytes \\(truncated\\)");
    copy_resized(dir + "/good.bin", dir + "/long3.bin", HEADER_BYTES + 4 * n + 1);
    EXPECT_EXIT(read_model(dir + "/long3.bin"), testing::ExitedWithCode(1),
                "'.*long3\\.bin' is [0-9]+ bytes but its header implies " + implied3 + " bytes \\(trailing bytes");
    // an fp32 file whose header claims bf16: twice the bytes the header implies
    copy_with_header(dir + "/good.bin", dir + "/v3_as_v5.bin", 1, 5);
    EXPECT_EXIT(read_model(dir + "/v3_as_v5.bin"), testing::ExitedWithCode(1),
                "'.*v3_as_v5\\.bin' is [0-9]+ bytes but its header implies " + implied5 + " bytes \\(trailing");
    copy_with_header(dir + "/good5.bin", dir + "/v5_as_v3.bin", 1, 3);
    EXPECT_EXIT(read_model(dir + "/v5_as_v3.bin"), testing::ExitedWithCode(1),
                "'.*v5_as_v3\\.bin' is [0-9]+ bytes but its header implies " + implied3 + " bytes \\(truncated");
}

TEST(FilesModel, RefusesInconsistentHeaders) {
    std::string dir = test::scratch_dir("files_model_bad_header");
    GPT2Config cfg = tiny_config();
    std::vector<float> params(num_parameters(cfg), 0.25f);
    model_file_write(dir + "/good.bin", cfg, params.data(), MODEL_VERSION_FP32);
    copy_with_header(dir + "/good.bin", dir + "/heads.bin", 5, 3);  // C = 8 over 3 heads
    EXPECT_EXIT(read_model(dir + "/heads.bin"), testing::ExitedWithCode(1),
                "/heads\\.bin: channels 8 are not divisible by the 3 heads");
    copy_with_header(dir + "/good.bin", dir + "/zero_heads.bin", 5, 0);  // no division by zero
    EXPECT_EXIT(read_model(dir + "/zero_heads.bin"), testing::ExitedWithCode(1),
                "/zero_heads\\.bin: model sizes must be positive");
    copy_with_header(dir + "/good.bin", dir + "/neg_layers.bin", 4, -2);
    EXPECT_EXIT(read_model(dir + "/neg_layers.bin"), testing::ExitedWithCode(1),
                "/neg_layers\\.bin: model sizes must be positive \\(maxT 8, V 10, L -2");
    copy_with_header(dir + "/good.bin", dir + "/neg_vocab.bin", 3, -10);
    EXPECT_EXIT(read_model(dir + "/neg_vocab.bin"), testing::ExitedWithCode(1),
                "/neg_vocab\\.bin: model sizes must be positive");
    copy_with_header(dir + "/good.bin", dir + "/padded.bin", 7, 100);  // Vp not a multiple of 128
    EXPECT_EXIT(read_model(dir + "/padded.bin"), testing::ExitedWithCode(1),
                "/padded\\.bin: padded vocab 100 must be a multiple of 128");
    copy_with_header(dir + "/good.bin", dir + "/vocab.bin", 3, 200);  // V above Vp = 128
    EXPECT_EXIT(read_model(dir + "/vocab.bin"), testing::ExitedWithCode(1),
                "/vocab\\.bin: padded vocab 128 must be a multiple of 128 and at least the vocab 200");
    copy_with_header(dir + "/good.bin", dir + "/huge.bin", 6, 1 << 30);  // sizes would overflow
    EXPECT_EXIT(read_model(dir + "/huge.bin"), testing::ExitedWithCode(1),
                "/huge\\.bin: model sizes are implausibly large");
}

// ----------------------------------------------------------------------------
// optimizer state file

TEST(FilesState, RoundTripWithAndWithoutMaster) {
    std::string dir = test::scratch_dir("files_state_roundtrip");
    for (bool with_master : {false, true}) {
        SCOPED_TRACE(with_master ? "with master weights" : "without master weights");
        TrainState s = sample_state(with_master);
        std::string path = dir + (with_master ? "/master.bin" : "/plain.bin");
        state_file_write(path, s);
        EXPECT_EQ((long)read_bytes(path).size(), HEADER_BYTES + 4 * 250 * (with_master ? 3 : 2));
        TrainState r;
        r.master.assign(3, 1.0f);  // must be cleared when the file has no master weights
        state_file_read(path, &r);
        EXPECT_EQ(r.num_processes, 4);
        EXPECT_EQ(r.rank, 3);
        EXPECT_EQ(r.B, 8);
        EXPECT_EQ(r.T, 64);
        EXPECT_EQ(r.grad_accum_steps, 5);
        EXPECT_EQ(r.step, 123456789012LL);
        EXPECT_EQ(r.version, STATE_VERSION);
        EXPECT_EQ(r.data_epoch, 3);
        EXPECT_EQ(r.data_sample, 5000000000LL);
        EXPECT_EQ(r.data_epoch_samples, 6000000000LL);
        EXPECT_EQ(r.data_fingerprint, 0x8123456789abcdefull);
        EXPECT_TRUE(r.loss_scale_dynamic);
        EXPECT_TRUE(r.sections.empty());
        EXPECT_EQ(r.sampler_rng, 0xfedcba9876543210ull);
        EXPECT_EQ(r.num_parameters, 1000);
        EXPECT_EQ(r.shard_offset, 750);
        EXPECT_EQ(r.shard_length, 250);
        EXPECT_EQ(r.loss_scale, 2048.0f);
        EXPECT_EQ(r.clean_steps, 3);
        EXPECT_EQ(r.consecutive_skipped, 1);
        EXPECT_EQ(r.skipped_total, 9);
        EXPECT_EQ(r.updates, s.step - 9);
        EXPECT_EQ(r.m, s.m);
        EXPECT_EQ(r.v, s.v);
        EXPECT_EQ(r.master, s.master);
        EXPECT_EQ(r.master.empty(), !with_master);
    }
}

// Version 4 names the optimizer (h[32]); Adafactor's file has no first moments. A version-3 file (no
// h[32]) is AdamW's; an unknown optimizer number is refused.
TEST(FilesState, OptimizerIsStoredAndOlderFilesAreAdamw) {
    std::string dir = test::scratch_dir("files_state_optimizer");
    for (int optimizer : {OPT_ADAMW, OPT_MUON, OPT_ADAFACTOR}) {
        SCOPED_TRACE(optimizer_name(optimizer));
        TrainState s = sample_state(false);
        s.optimizer = optimizer;
        if (optimizer == OPT_ADAFACTOR) s.m.clear();
        std::string path = dir + "/" + optimizer_name(optimizer) + ".bin";
        state_file_write(path, s);
        EXPECT_EQ((long)read_bytes(path).size(), HEADER_BYTES + 4 * 250 * (optimizer == OPT_ADAFACTOR ? 1 : 2));
        TrainState r;
        state_file_read(path, &r);
        EXPECT_EQ(r.optimizer, optimizer);
        EXPECT_EQ(r.m, s.m);
        EXPECT_EQ(r.v, s.v);
    }
    copy_with_header(dir + "/adamw.bin", dir + "/version3.bin", 1, 3);
    test::reseal_checksums(dir + "/version3.bin");
    TrainState old;
    old.optimizer = OPT_MUON;
    state_file_read(dir + "/version3.bin", &old);
    EXPECT_EQ(old.optimizer, OPT_ADAMW);
    copy_with_header(dir + "/adamw.bin", dir + "/unknown.bin", 32, 3);
    EXPECT_EXIT(read_state(dir + "/unknown.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*unknown\\.bin' has an inconsistent header");
    TrainState adafactor_with_m = sample_state(false);
    adafactor_with_m.optimizer = OPT_ADAFACTOR;
    EXPECT_EXIT(state_file_write(dir + "/bad.bin", adafactor_with_m), testing::ExitedWithCode(1),
                "optimizer buffers do not match the shard length");
}

TEST(FilesState, RefusesBadFiles) {
    std::string dir = test::scratch_dir("files_state_bad");
    state_file_write(dir + "/good.bin", sample_state(false));
    const long good_size = HEADER_BYTES + 4 * 250 * 2;
    copy_with_header(dir + "/good.bin", dir + "/magic.bin", 0, 20240326);  // a model's magic
    EXPECT_EXIT(read_state(dir + "/magic.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*magic\\.bin' has magic 20240326, expected 20261121");
    copy_with_header(dir + "/good.bin", dir + "/version.bin", 1, 6);
    EXPECT_EXIT(read_state(dir + "/version.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*version\\.bin' has version 6, this program reads version 1 or 2 or 3 or 4 or 5");
    copy_resized(dir + "/good.bin", dir + "/short_header.bin", 512);
    EXPECT_EXIT(read_state(dir + "/short_header.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*short_header\\.bin' is 512 bytes, shorter than its 1024-byte header");
    copy_resized(dir + "/good.bin", dir + "/short.bin", good_size - 4);
    EXPECT_EXIT(read_state(dir + "/short.bin"), testing::ExitedWithCode(1),
                "'.*short\\.bin' is [0-9]+ bytes but its header implies " + std::to_string(good_size) +
                    " bytes \\(truncated\\)");
    copy_resized(dir + "/good.bin", dir + "/long.bin", good_size + 4);
    EXPECT_EXIT(read_state(dir + "/long.bin"), testing::ExitedWithCode(1),
                "'.*long\\.bin' is [0-9]+ bytes but its header implies " + std::to_string(good_size) +
                    " bytes \\(trailing");
    // the has-master flag says there are master weights, which the file lacks
    copy_with_header(dir + "/good.bin", dir + "/flag.bin", 7, 1);
    EXPECT_EXIT(read_state(dir + "/flag.bin"), testing::ExitedWithCode(1),
                "'.*flag\\.bin' is [0-9]+ bytes but its header implies " + std::to_string(good_size + 1000) +
                    " bytes \\(truncated\\)");
}

TEST(FilesState, RefusesInconsistentHeaders) {
    std::string dir = test::scratch_dir("files_state_header");
    state_file_write(dir + "/good.bin", sample_state(false));
    const char* inconsistent = "optimizer state file '.*%s' has an inconsistent header";
    auto expect_refused = [&](const std::string& name) {
        char re[256];
        snprintf(re, sizeof(re), inconsistent, test::re_escape(name).c_str());
        EXPECT_EXIT(read_state(dir + "/" + name), testing::ExitedWithCode(1), re) << name;
    };
    copy_with_header(dir + "/good.bin", dir + "/rank.bin", 3, 4);  // rank 4 of 4 processes
    expect_refused("rank.bin");
    copy_with_header(dir + "/good.bin", dir + "/procs.bin", 2, 0);
    expect_refused("procs.bin");
    copy_with_header(dir + "/good.bin", dir + "/batch.bin", 4, -8);
    expect_refused("batch.bin");
    copy_with_header(dir + "/good.bin", dir + "/master_flag.bin", 7, 2);
    expect_refused("master_flag.bin");
    copy_with_state_wide(dir + "/good.bin", dir + "/step.bin", 0, -1);
    expect_refused("step.bin");
    copy_with_state_wide(dir + "/good.bin", dir + "/length.bin", 7, -250);
    expect_refused("length.bin");
    copy_with_state_wide(dir + "/good.bin", dir + "/offset.bin", 6, 900);  // 900 + 250 > 1000 + 4
    expect_refused("offset.bin");
    // lengths whose byte count overflows int64: must be refused, not read into a wrapped size
    {
        std::string bytes = read_bytes(dir + "/good.bin");
        int64_t huge = (int64_t)1 << 62, zero = 0;
        memcpy(&bytes[(8 + 2 * 5) * 4], &huge, 8);  // num_parameters
        memcpy(&bytes[(8 + 2 * 6) * 4], &zero, 8);  // shard_offset
        memcpy(&bytes[(8 + 2 * 7) * 4], &huge, 8);  // shard_length: 4 * 2 * 2^62 bytes wraps to 0
        bytes.resize(HEADER_BYTES);
        write_bytes(dir + "/overflow.bin", bytes);
        test::reseal_header_checksum(dir + "/overflow.bin");
        memcpy(&bytes[(8 + 2 * 6) * 4], &huge, 8);  // offset + length wraps negative
        write_bytes(dir + "/overflow_sum.bin", bytes);
        test::reseal_header_checksum(dir + "/overflow_sum.bin");
    }
    expect_refused("overflow.bin");
    expect_refused("overflow_sum.bin");
}

// The version plan's room for later state (state_file.h): extra sections after the arrays, each with a
// kind, flags and a length in the header, covered by the checksums. They read back byte for byte; a
// kind this program does not know is read and kept unless its section says it must be understood,
// which is refused naming the kind; a flipped byte in a section is found; and the fields version 5
// added are checked (h[33] is 0 or 1, h[36] an encoding this program reads, at most 5 sections).
TEST(FilesState, ExtraSectionsRoundTripAndAnUnknownRequiredOneIsRefused) {
    std::string dir = test::scratch_dir("files_state_sections");
    TrainState s = sample_state(true);
    StateSection fp8{STATE_SECTION_TEST, STATE_SECTION_REQUIRED, {}}, other{4242, 0, {}};
    for (int i = 0; i < 1000; i++) fp8.bytes.push_back((uint8_t)(i * 7));
    other.bytes = {1, 2, 3};
    s.sections = {fp8, other};
    state_file_write(dir + "/sections.bin", s);
    EXPECT_EQ((long)read_bytes(dir + "/sections.bin").size(), HEADER_BYTES + 4 * 250 * 3 + 1000 + 3);
    TrainState r;
    state_file_read(dir + "/sections.bin", &r);
    ASSERT_EQ(r.sections.size(), 2u);
    EXPECT_EQ(r.sections[0].kind, STATE_SECTION_TEST);
    EXPECT_EQ(r.sections[0].flags, STATE_SECTION_REQUIRED);
    EXPECT_EQ(r.sections[0].bytes, fp8.bytes);
    EXPECT_EQ(r.sections[1].kind, 4242);  // unknown, optional: kept
    EXPECT_EQ(r.sections[1].bytes, other.bytes);
    EXPECT_EQ(r.master, s.master);
    // the same unknown kind, required
    s.sections[1].flags = STATE_SECTION_REQUIRED;
    state_file_write(dir + "/required.bin", s);
    EXPECT_EXIT(read_state(dir + "/required.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*required\\.bin' holds state of kind 4242, which this program does not know "
                "and the file says it must \\(written by a newer version: resume with it\\)");
    // a flipped byte in the first section
    write_bytes(dir + "/flipped.bin", read_bytes(dir + "/sections.bin"));
    test::flip_byte(dir + "/flipped.bin", HEADER_BYTES + 4 * 250 * 3 + 10);
    EXPECT_EXIT(read_state(dir + "/flipped.bin"), testing::ExitedWithCode(1), "is corrupt: bytes .* do not match");
    // header fields
    copy_with_header(dir + "/sections.bin", dir + "/dynamic.bin", 33, 2);
    EXPECT_EXIT(read_state(dir + "/dynamic.bin"), testing::ExitedWithCode(1), "has an inconsistent header");
    copy_with_header(dir + "/sections.bin", dir + "/count.bin", 40, 6);
    EXPECT_EXIT(read_state(dir + "/count.bin"), testing::ExitedWithCode(1), "has an inconsistent header");
    // a section claiming 256 GiB (its header's checksum right, as a buggy writer would make it): refused by
    // the file's size before anything is allocated for it
    copy_with_header(dir + "/sections.bin", dir + "/huge.bin", 44, 64);
    EXPECT_EXIT(read_state(dir + "/huge.bin"), testing::ExitedWithCode(1), "'.*huge\\.bin' is [0-9]+ bytes but its header implies");
    copy_with_header(dir + "/sections.bin", dir + "/encoding.bin", 36, 2);
    EXPECT_EXIT(read_state(dir + "/encoding.bin"), testing::ExitedWithCode(1),
                "'.*encoding\\.bin' stores its moments in encoding 2, which this program does not read");
    // encoding 1 is 8-bit AdamW's, and only its
    copy_with_header(dir + "/sections.bin", dir + "/adamw_8bit.bin", 36, 1);
    EXPECT_EXIT(read_state(dir + "/adamw_8bit.bin"), testing::ExitedWithCode(1),
                "inconsistent header \\(corrupt\\?\\): optimizer 0 with moments in encoding 1");
    s.sections.assign(6, other);
    EXPECT_EXIT(state_file_write(dir + "/six.bin", s), testing::ExitedWithCode(1), "6 extra sections, more than the 5");
}

// 8-bit AdamW's state (encoding 1): the codes and the block maxima come back as written, with an extra
// section and master weights after them; a code no encoding writes (-128) and a negative maximum are refused
// on reading and on writing, and a file claiming more blocks than its size holds by its size.
TEST(FilesState, EightBitMomentsRoundTrip) {
    std::string dir = test::scratch_dir("files_state_8bit");
    TrainState s;
    s.B = 2, s.T = 8, s.num_parameters = 1000, s.shard_offset = 300, s.shard_length = 400, s.data_epoch_samples = 10;
    s.optimizer = OPT_ADAMW8;
    Adamw8State& q = s.moments8;
    q.begin = 300, q.end = 700, q.block_begin = 1, q.block_end = 4;
    for (int i = 0; i < 400; i++) q.m.push_back((int8_t)(i % 255 - 127)), q.v.push_back((uint8_t)(i * 7));
    q.m_max = {0.5f, 0.0f, 2.0f};
    q.v_max = {1e-6f, 0.0f, 3.0f};
    s.master.assign(400, 0.25f);
    StateSection extra;
    extra.kind = 4242;
    extra.bytes = {1, 2, 3};
    s.sections = {extra};
    state_file_write(dir + "/state.bin", s);
    TrainState r;
    state_file_read(dir + "/state.bin", &r);
    EXPECT_EQ(r.optimizer, OPT_ADAMW8);
    EXPECT_TRUE(r.m.empty() && r.v.empty());
    EXPECT_EQ(r.moments8.begin, 300u);
    EXPECT_EQ(r.moments8.end, 700u);
    EXPECT_EQ(r.moments8.block_begin, 1u);
    EXPECT_EQ(r.moments8.block_end, 4u);
    EXPECT_EQ(r.moments8.m, q.m);
    EXPECT_EQ(r.moments8.v, q.v);
    EXPECT_EQ(r.moments8.m_max, q.m_max);
    EXPECT_EQ(r.moments8.v_max, q.v_max);
    EXPECT_EQ(r.master, s.master);
    ASSERT_EQ(r.sections.size(), 1u);
    EXPECT_EQ(r.sections[0].bytes, extra.bytes);
    EXPECT_EQ(test::read_text(dir + "/state.bin").size(), (size_t)HEADER_BYTES + 2 * 400 + 2 * 4 * 3 + 4 * 400 + 3);
    TrainState bad = s;
    bad.moments8.m[7] = -128;
    EXPECT_EXIT(state_file_write(dir + "/bad.bin", bad), testing::ExitedWithCode(1), "code -128, which the encoding never writes");
    bad = s;
    bad.moments8.v_max[2] = -1.0f;
    EXPECT_EXIT(state_file_write(dir + "/bad.bin", bad), testing::ExitedWithCode(1), "8-bit AdamW's max v of blocks");
    copy_with_header(dir + "/state.bin", dir + "/blocks.bin", 37, 4);
    EXPECT_EXIT(read_state(dir + "/blocks.bin"), testing::ExitedWithCode(1), "bytes but its header implies");
}

// ----------------------------------------------------------------------------
// checksums and states that cannot be valid (doc/reliability.md, "A corrupt checkpoint file")

namespace {

// A state file of one process holding all of n parameters: 8n payload bytes (m and v).
TrainState state_of_length(int64_t n) {
    TrainState s = sample_state(false);
    s.num_parameters = s.shard_length = n;
    s.shard_offset = 0;
    s.m.assign(n, 0.25f);
    s.v.assign(n, 0.0625f);
    return s;
}

// Sets float `index` of the payload (after the 1 KiB header) and reseals the checksums: a file that a
// writer with a bug could have made.
void poke_payload_float(const std::string& path, size_t index, float value) {
    std::string bytes = read_bytes(path);
    memcpy(&bytes[HEADER_BYTES + index * sizeof(float)], &value, sizeof(float));
    write_bytes(path, bytes);
    test::reseal_checksums(path);
}

}  // namespace

// The CRC is zlib's (so Python's zlib.crc32 checks our files): its check value, and the same result
// however the bytes are split between calls (the writer and reader feed it in pieces).
TEST(FilesChecksum, Crc32IsZlibs) {
    EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);
    EXPECT_EQ(crc32_update(0, "", 0), 0u);
    EXPECT_EQ(crc32_update(0, "a", 1), 0xE8B7BE43u);
    std::string text = "The quick brown fox jumps over the lazy dog";
    EXPECT_EQ(crc32_update(0, text.data(), text.size()), 0x414FA339u);
    std::vector<unsigned char> data(100003);
    std::mt19937 rng(9);
    for (unsigned char& c : data) c = (unsigned char)rng();
    uint32_t whole = crc32_update(0, data.data(), data.size());
    for (size_t split : {1, 7, 8, 9, 4096, 100002}) {
        uint32_t parts = crc32_update(crc32_update(0, data.data(), split), data.data() + split, data.size() - split);
        EXPECT_EQ(parts, whole) << split;
    }
    // a bit-at-a-time CRC, written from the definition, agrees with the table-driven one
    uint32_t crc = 0xFFFFFFFFu;
    for (unsigned char c : data) {
        crc ^= c;
        for (int bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    }
    EXPECT_EQ(~crc, whole);
}

// Block sizes: 1 MiB up to 188 MiB of payload, then the fewest whole MiB that need at most 188 blocks.
TEST(FilesChecksum, BlockSizes) {
    const int64_t MiB = 1 << 20;
    EXPECT_EQ(checksum_block_bytes(0), MiB);
    EXPECT_EQ(checksum_block_bytes(188 * MiB), MiB);
    EXPECT_EQ(checksum_block_bytes(188 * MiB + 1), 2 * MiB);
    EXPECT_EQ(checksum_block_bytes(124475904LL * 4), 3 * MiB);  // GPT-2 124M, fp32
    EXPECT_EQ(checksum_block_count(0, MiB), 0);
    EXPECT_EQ(checksum_block_count(1, MiB), 1);
    EXPECT_EQ(checksum_block_count(124475904LL * 4, 3 * MiB), 159);
    for (int64_t payload : std::vector<int64_t>{1, 188 * MiB, 188 * MiB + 1, 6LL << 30, 100LL << 30}) {
        EXPECT_LE(checksum_block_count(payload, checksum_block_bytes(payload)), CHECKSUM_MAX_BLOCKS) << payload;
    }
}

// Issue 51, item 8: a corrupt size field of a checksummed header (here the channels) made the file look
// "truncated" (its size no longer the header's); the header's own checksum is checked first, so the
// message says the header is corrupt. Likewise for a state file's shard length.
TEST(FilesChecksum, ACorruptHeaderFieldIsCalledACorruptHeader) {
    std::string dir = test::scratch_dir("files_checksum_header_field");
    GPT2Config cfg = tiny_config();
    std::vector<float> params = random_params(num_parameters(cfg), 4);
    model_file_write(dir + "/ours.bin", cfg, params.data(), MODEL_VERSION_FP32);
    std::string bytes = read_bytes(dir + "/ours.bin");
    int32_t channels = 16;  // a flipped bit: 8 -> 16
    memcpy(&bytes[6 * 4], &channels, 4);
    write_bytes(dir + "/channels.bin", bytes);  // as it is: the header's checksum no longer matches
    EXPECT_EXIT(read_model(dir + "/channels.bin"), testing::ExitedWithCode(1),
                "model checkpoint '.*channels\\.bin' is corrupt: its header \\(bytes \\[0, 1024\\)\\) does not match its checksum");
}

// dir/ours.bin (our model file of cfg, random parameters, returned) and dir/llmc.bin, the same without
// checksums (slots 64.. zero), as llm.c writes it
std::vector<float> write_model_without_checksums(const std::string& dir, const GPT2Config& cfg) {
    std::vector<float> params = random_params(num_parameters(cfg), 4);
    model_file_write(dir + "/ours.bin", cfg, params.data(), MODEL_VERSION_FP32);
    std::string bytes = read_bytes(dir + "/ours.bin");
    std::fill(bytes.begin() + 64 * 4, bytes.begin() + HEADER_BYTES, '\0');
    write_bytes(dir + "/llmc.bin", bytes);
    return params;
}

// Issue 51, item 8: the note is the run's one line about the file: the CPU trainer read the header
// twice at start-up (for the memory plan, then with the parameters) and printed it twice.
TEST(FilesChecksum, TheNoteOfAFileWithoutChecksumsIsPrintedOnce) {
    std::string dir = test::scratch_dir("files_checksum_note_once");
    GPT2Config cfg = tiny_config();
    std::vector<float> params = write_model_without_checksums(dir, cfg);
    std::vector<uint16_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint16_t)(i * 7 % cfg.vocab_size);
    shard_write(dir + "/train.bin", tokens.data(), (int64_t)tokens.size());
    test::CommandResult r = test::run_command("cd '" + test::root() + "' && OMP_NUM_THREADS=1 ./train_gpt2 -e " + dir +
                                              "/llmc.bin -i " + dir + "/train.bin -b 2 -t 8 -v 0 -s 0 -x 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    size_t first = r.output.find("carries no checksums");
    ASSERT_NE(first, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("carries no checksums", first + 1), std::string::npos) << r.output;
}

// Files without checksums are read as before, with a note: llm.c's model files (slots 64.. zero) and
// our version-1 and -2 state files. A version-3 or -4 state file must have them; a model file whose
// checksum slots are neither empty nor consistent is refused.
TEST(FilesChecksum, FilesWithoutChecksumsAreReadWithANote) {
    std::string dir = test::scratch_dir("files_checksum_none");
    GPT2Config cfg = tiny_config();
    std::vector<float> params = write_model_without_checksums(dir, cfg);
    testing::internal::CaptureStdout();
    GPT2Config got;
    std::vector<float> back;
    model_file_read(dir + "/llmc.bin", &got, &back);
    std::string note = testing::internal::GetCapturedStdout();
    EXPECT_EQ(back, params);
    EXPECT_NE(note.find("model checkpoint '" + dir + "/llmc.bin' carries no checksums"), std::string::npos) << note;
    copy_with_header(dir + "/ours.bin", dir + "/tag.bin", 64, 12345);
    EXPECT_EXIT(read_model(dir + "/tag.bin"), testing::ExitedWithCode(1),
                "model checkpoint '.*tag\\.bin' is corrupt: its checksum fields \\(header slots 64\\.\\.66: 12345, "
                "1048576, 1\\) do not describe its [0-9]+ payload bytes");
    copy_with_header(dir + "/ours.bin", dir + "/blocks.bin", 66, 2);
    EXPECT_EXIT(read_model(dir + "/blocks.bin"), testing::ExitedWithCode(1), "'.*blocks\\.bin' is corrupt: its (checksum fields|header)");

    TrainState s = sample_state(true);
    state_file_write(dir + "/state4.bin", s);
    std::string bytes = read_bytes(dir + "/state4.bin");
    std::fill(bytes.begin() + 64 * 4, bytes.begin() + HEADER_BYTES, '\0');
    write_bytes(dir + "/state4_bare.bin", bytes);
    EXPECT_EXIT(read_state(dir + "/state4_bare.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*state4_bare\\.bin' has no checksums, which its version \\(" +
                    std::to_string(STATE_VERSION) + "\\) always has");
    int32_t two = 2;
    memcpy(&bytes[4], &two, 4);
    write_bytes(dir + "/state2.bin", bytes);
    TrainState r;
    testing::internal::CaptureStdout();
    state_file_read(dir + "/state2.bin", &r);
    note = testing::internal::GetCapturedStdout();
    EXPECT_EQ(r.m, s.m);
    EXPECT_EQ(r.v, s.v);
    EXPECT_EQ(r.master, s.master);
    EXPECT_EQ(r.updates, s.updates);
    EXPECT_NE(note.find("state2.bin' carries no checksums"), std::string::npos) << note;
    // versions 1 to 4 held data positions in another order: not read (train_state_restore places the run
    // by its step); S other than 1 was dynamic
    EXPECT_EQ(r.version, 2);
    EXPECT_EQ(r.data_epoch, 0);
    EXPECT_EQ(r.data_sample, 0);
    EXPECT_EQ(r.data_epoch_samples, 0);
    EXPECT_EQ(r.data_fingerprint, 0u);
    EXPECT_TRUE(r.loss_scale_dynamic);
}

// One flipped bit in the lowest mantissa byte of one weight (a change of one part in 2^23) is found,
// and the message names the file and the bytes of the block that holds it.
TEST(FilesChecksum, FlippedBitInAModelFileIsRefusedNamingTheBytes) {
    std::string dir = test::scratch_dir("files_checksum_model");
    GPT2Config cfg = tiny_config();
    long n = (long)num_parameters(cfg);
    std::vector<float> params = random_params(n, 3);
    for (int version : {MODEL_VERSION_FP32, MODEL_VERSION_BF16}) {
        SCOPED_TRACE(version);
        long bytes_per_param = version == MODEL_VERSION_FP32 ? 4 : 2;
        std::string good = dir + "/good" + std::to_string(version) + ".bin";
        std::string flipped = dir + "/flipped" + std::to_string(version) + ".bin";
        model_file_write(good, cfg, params.data(), version);
        read_model(good);  // the file as written reads back
        write_bytes(flipped, read_bytes(good));
        test::flip_byte(flipped, HEADER_BYTES + bytes_per_param * 100);  // little-endian: the low mantissa byte
        std::string end = std::to_string(HEADER_BYTES + bytes_per_param * n);
        EXPECT_EXIT(read_model(flipped), testing::ExitedWithCode(1),
                    "model checkpoint '.*flipped" + std::to_string(version) + "\\.bin' is corrupt: bytes \\[1024, " +
                        end + "\\) \\(block 1 of 1\\) do not match their checksum");
    }
}

// A state file of 2.4 MB has three blocks of 1 MiB (the last one shorter): a flipped bit is placed in
// its block; a flipped bit in the header (here the loss scaler's clean-step count, which no other check
// could catch) is found too.
TEST(FilesChecksum, FlippedBitInAStateFileIsRefusedNamingItsBlock) {
    std::string dir = test::scratch_dir("files_checksum_state");
    state_file_write(dir + "/good.bin", state_of_length(300000));
    read_state(dir + "/good.bin");
    struct Case {
        const char* name;
        long offset;
        const char* where;
    } cases[] = {
        {"first.bin", HEADER_BYTES + 17, "bytes \\[1024, 1049600\\) \\(block 1 of 3\\)"},
        {"second.bin", HEADER_BYTES + (1 << 20) + 5000, "bytes \\[1049600, 2098176\\) \\(block 2 of 3\\)"},
        {"last.bin", HEADER_BYTES + 2400000 - 1, "bytes \\[2098176, 2401024\\) \\(block 3 of 3\\)"},
        {"header.bin", 25 * 4, "its header \\(bytes \\[0, 1024\\)\\)"},
    };
    for (const Case& c : cases) {
        write_bytes(dir + "/" + c.name, read_bytes(dir + "/good.bin"));
        test::flip_byte(dir + "/" + c.name, c.offset);
        EXPECT_EXIT(read_state(dir + "/" + c.name), testing::ExitedWithCode(1),
                    std::string("optimizer state file '.*") + c.name + "' is corrupt: " + c.where +
                        " do(es)? not match (their|its) checksum")
            << c.name;
    }
}

// AdamW's second moment is a running mean of squares: a negative one is a corrupt or buggy state, and
// loaded it would make sqrt(v) NaN and every weight with it. Neither written nor read; neither are
// non-finite moments or master weights, a negative data position, or more skipped steps than steps.
TEST(FilesState, RefusesStatesThatCannotBeValid) {
    std::string dir = test::scratch_dir("files_state_invalid");
    TrainState bad = sample_state(true);
    bad.v[7] = -1e-3f;
    EXPECT_EXIT(state_file_write(dir + "/written.bin", bad), testing::ExitedWithCode(1),
                "writing AdamW v of '.*written\\.bin': element 7 of 250 is -0\\.001; a second moment cannot be negative");
    EXPECT_FALSE(file_exists(dir + "/written.bin"));

    state_file_write(dir + "/good.bin", sample_state(true));
    auto copy_poked = [&](const std::string& name, size_t index, float value) {
        write_bytes(dir + "/" + name, read_bytes(dir + "/good.bin"));
        poke_payload_float(dir + "/" + name, index, value);
    };
    copy_poked("negative_v.bin", 250 + 7, -1e-3f);
    EXPECT_EXIT(read_state(dir + "/negative_v.bin"), testing::ExitedWithCode(1),
                "reading AdamW v of optimizer state file '.*negative_v\\.bin': element 7 of 250 is -0\\.001; a second "
                "moment cannot be negative");
    copy_poked("negative_zero_v.bin", 250 + 7, -0.0f);  // -0 is zero: harmless, accepted
    read_state(dir + "/negative_zero_v.bin");
    copy_poked("nan_m.bin", 3, NAN);
    EXPECT_EXIT(read_state(dir + "/nan_m.bin"), testing::ExitedWithCode(1),
                "reading AdamW m of optimizer state file '.*nan_m\\.bin': element 3 of 250 is -?nan");
    copy_poked("inf_master.bin", 500 + 9, INFINITY);
    EXPECT_EXIT(read_state(dir + "/inf_master.bin"), testing::ExitedWithCode(1),
                "reading master weights of optimizer state file '.*inf_master\\.bin': element 9 of 250 is inf");

    copy_with_state_wide(dir + "/good.bin", dir + "/epoch.bin", 1, -1);
    test::reseal_checksums(dir + "/epoch.bin");
    EXPECT_EXIT(read_state(dir + "/epoch.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*epoch\\.bin' has an inconsistent header");
    copy_with_state_wide(dir + "/good.bin", dir + "/unit.bin", 2, -5);
    test::reseal_checksums(dir + "/unit.bin");
    EXPECT_EXIT(read_state(dir + "/unit.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*unit\\.bin' has an inconsistent header");
    copy_with_state_wide(dir + "/good.bin", dir + "/past_epoch.bin", 2, 6000000000LL);  // the epoch's units: one too far
    test::reseal_checksums(dir + "/past_epoch.bin");
    EXPECT_EXIT(read_state(dir + "/past_epoch.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*past_epoch\\.bin' has an inconsistent header");
    {
        std::string bytes = read_bytes(dir + "/good.bin");
        int64_t skipped = 123456789013LL;  // one more than the steps
        memcpy(&bytes[28 * 4], &skipped, 8);
        write_bytes(dir + "/skipped.bin", bytes);
        test::reseal_checksums(dir + "/skipped.bin");
    }
    EXPECT_EXIT(read_state(dir + "/skipped.bin"), testing::ExitedWithCode(1),
                "optimizer state file '.*skipped\\.bin' has an inconsistent loss scale or step counts");
}

// ----------------------------------------------------------------------------
// data shard

TEST(FilesShard, RoundTripAndHeader) {
    std::string dir = test::scratch_dir("files_shard_roundtrip");
    std::vector<uint16_t> tokens = {50256, 0, 1, 65535, 12345, 7};
    shard_write(dir + "/s.bin", tokens.data(), (int64_t)tokens.size());
    std::string bytes = read_bytes(dir + "/s.bin");
    ASSERT_EQ(bytes.size(), (size_t)HEADER_BYTES + 2 * tokens.size());
    const int32_t* h = (const int32_t*)bytes.data();
    EXPECT_EQ(h[0], 20240520);
    EXPECT_EQ(h[1], 1);
    EXPECT_EQ(h[2], 6);
    EXPECT_EQ(memcmp(bytes.data() + HEADER_BYTES, tokens.data(), 2 * tokens.size()), 0);
    EXPECT_EQ(shard_num_tokens(dir + "/s.bin"), 6);
    shard_write(dir + "/empty.bin", tokens.data(), 0);  // zero tokens is a valid (useless) shard
    EXPECT_EQ(shard_num_tokens(dir + "/empty.bin"), 0);
}

TEST(FilesShard, RefusesBadFiles) {
    std::string dir = test::scratch_dir("files_shard_bad");
    std::vector<uint16_t> tokens(100, 3);
    shard_write(dir + "/good.bin", tokens.data(), 100);
    const long good_size = HEADER_BYTES + 200;
    copy_with_header(dir + "/good.bin", dir + "/magic.bin", 0, 20240328);  // a tokenizer's magic
    EXPECT_EXIT(shard_num_tokens(dir + "/magic.bin"), testing::ExitedWithCode(1),
                "data shard '.*magic\\.bin' has magic 20240328, expected 20240520");
    copy_with_header(dir + "/good.bin", dir + "/version.bin", 1, 2);
    EXPECT_EXIT(shard_num_tokens(dir + "/version.bin"), testing::ExitedWithCode(1),
                "data shard '.*version\\.bin' has version 2, this program reads version 1");
    copy_resized(dir + "/good.bin", dir + "/short_header.bin", 3);
    EXPECT_EXIT(shard_num_tokens(dir + "/short_header.bin"), testing::ExitedWithCode(1),
                "data shard '.*short_header\\.bin' is 3 bytes, shorter than its 1024-byte header");
    copy_resized(dir + "/good.bin", dir + "/short.bin", good_size - 1);  // half a token
    EXPECT_EXIT(shard_num_tokens(dir + "/short.bin"), testing::ExitedWithCode(1),
                "data shard '.*short\\.bin' is [0-9]+ bytes but its header implies " + std::to_string(good_size) +
                    " bytes \\(truncated\\)");
    copy_resized(dir + "/good.bin", dir + "/long.bin", good_size + 2);
    EXPECT_EXIT(shard_num_tokens(dir + "/long.bin"), testing::ExitedWithCode(1),
                "data shard '.*long\\.bin' is [0-9]+ bytes but its header implies " + std::to_string(good_size) +
                    " bytes \\(trailing");
    copy_with_header(dir + "/good.bin", dir + "/negative.bin", 2, -5);
    EXPECT_EXIT(shard_num_tokens(dir + "/negative.bin"), testing::ExitedWithCode(1),
                "data shard '.*negative\\.bin' claims -5 tokens");
    copy_with_header(dir + "/good.bin", dir + "/more.bin", 2, 101);  // header claims one more token
    EXPECT_EXIT(shard_num_tokens(dir + "/more.bin"), testing::ExitedWithCode(1),
                "data shard '.*more\\.bin' is [0-9]+ bytes but its header implies " +
                    std::to_string(good_size + 2) + " bytes \\(truncated\\)");
}

TEST(FilesShard, LoaderChecksEveryShardAtInit) {
    std::string dir = test::scratch_dir("files_shard_init");
    std::vector<uint16_t> tokens(100, 3);
    shard_write(dir + "/d_000000.bin", tokens.data(), 100);
    shard_write(dir + "/d_000001.bin", tokens.data(), 100);
    copy_resized(dir + "/d_000001.bin", dir + "/d_000002.bin", HEADER_BYTES + 100);  // the last one is cut
    DataLoader loader;
    EXPECT_EXIT(dataloader_init(&loader, dir + "/d_*.bin", 2, 4, 0, 1, false, 50257), testing::ExitedWithCode(1),
                "data shard '.*d_000002\\.bin' is [0-9]+ bytes but its header implies 1224 bytes \\(truncated\\)");
    copy_with_header(dir + "/d_000000.bin", dir + "/d_000002.bin", 0, 0);
    EXPECT_EXIT(dataloader_init(&loader, dir + "/d_*.bin", 2, 4, 0, 1, true, 50257), testing::ExitedWithCode(1),
                "data shard '.*d_000002\\.bin' has magic 0, expected 20240520");
    EXPECT_EXIT(dataloader_init(&loader, dir + "/nothing_*.bin", 2, 4, 0, 1, false, 50257),
                testing::ExitedWithCode(1), "no file matches '" + test::re_escape(dir + "/nothing_*.bin") + "'");
}

// ----------------------------------------------------------------------------
// tokenizer file

TEST(FilesTokenizer, RoundTrip) {
    std::string dir = test::scratch_dir("files_tokenizer_roundtrip");
    TokenizerFile tok = sample_tokenizer();
    tokenizer_file_write(dir + "/tok.bin", tok);
    long expected_size = HEADER_BYTES;
    for (const std::string& t : tok.token_bytes) expected_size += 1 + (long)t.size();
    EXPECT_EQ((long)read_bytes(dir + "/tok.bin").size(), expected_size);
    TokenizerFile back;
    ASSERT_TRUE(tokenizer_file_read(dir + "/tok.bin", &back));
    EXPECT_EQ(back.token_bytes, tok.token_bytes);
    EXPECT_EQ(back.eot_token, 5);
    EXPECT_EQ(tokenizer_file_decode(back, 2), std::string("\0\xff", 2));
    EXPECT_EQ(tokenizer_file_decode(back, 6), "");   // out of range: empty, not a crash
    EXPECT_EQ(tokenizer_file_decode(back, -1), "");
    // a missing tokenizer is not an error: samples print as ids
    TokenizerFile none;
    EXPECT_FALSE(tokenizer_file_read(dir + "/absent.bin", &none));
}

TEST(FilesTokenizer, RefusesBadFiles) {
    std::string dir = test::scratch_dir("files_tokenizer_bad");
    tokenizer_file_write(dir + "/good.bin", sample_tokenizer());
    long good_size = (long)read_bytes(dir + "/good.bin").size();
    copy_with_header(dir + "/good.bin", dir + "/magic.bin", 0, 20240520);
    EXPECT_EXIT(read_tokenizer(dir + "/magic.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*magic\\.bin' has magic 20240520, expected 20240328");
    copy_with_header(dir + "/good.bin", dir + "/version.bin", 1, 1);  // llm.c's older version 1
    EXPECT_EXIT(read_tokenizer(dir + "/version.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*version\\.bin' has version 1, this program reads version 2");
    copy_resized(dir + "/good.bin", dir + "/short_header.bin", 1020);
    EXPECT_EXIT(read_tokenizer(dir + "/short_header.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*short_header\\.bin' is 1020 bytes, shorter than its 1024-byte header");
    // cut inside the last token's bytes, and right before a length byte (after token 4's bytes)
    copy_resized(dir + "/good.bin", dir + "/cut_bytes.bin", good_size - 3);
    EXPECT_EXIT(read_tokenizer(dir + "/cut_bytes.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*cut_bytes\\.bin' is truncated at token 5 of 6");
    copy_resized(dir + "/good.bin", dir + "/cut_length.bin", good_size - 14);
    EXPECT_EXIT(read_tokenizer(dir + "/cut_length.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*cut_length\\.bin' is truncated at token 5 of 6");
    copy_resized(dir + "/good.bin", dir + "/header_only.bin", HEADER_BYTES);
    EXPECT_EXIT(read_tokenizer(dir + "/header_only.bin"), testing::ExitedWithCode(1),
                "'.*header_only\\.bin' is truncated at token 0 of 6");
    copy_resized(dir + "/good.bin", dir + "/long.bin", good_size + 1);
    EXPECT_EXIT(read_tokenizer(dir + "/long.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*long\\.bin' has 1 trailing bytes after its 6 tokens");
}

TEST(FilesTokenizer, RefusesInconsistentHeaders) {
    std::string dir = test::scratch_dir("files_tokenizer_header");
    tokenizer_file_write(dir + "/good.bin", sample_tokenizer());
    copy_with_header(dir + "/good.bin", dir + "/zero.bin", 2, 0);
    EXPECT_EXIT(read_tokenizer(dir + "/zero.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*zero\\.bin' claims 0 tokens");
    copy_with_header(dir + "/good.bin", dir + "/negative.bin", 2, -6);
    EXPECT_EXIT(read_tokenizer(dir + "/negative.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*negative\\.bin' claims -6 tokens");
    copy_with_header(dir + "/good.bin", dir + "/eot.bin", 3, 6);  // one past the last id
    EXPECT_EXIT(read_tokenizer(dir + "/eot.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*eot\\.bin': end-of-text id 6 is outside 0\\.\\.5");
    copy_with_header(dir + "/good.bin", dir + "/eot_neg.bin", 3, -1);
    EXPECT_EXIT(read_tokenizer(dir + "/eot_neg.bin"), testing::ExitedWithCode(1),
                "'.*eot_neg\\.bin': end-of-text id -1 is outside 0\\.\\.5");
    // token 1 ("b") gets length 0: its byte then reads as token 2's length, but the reader stops first
    std::string bytes = read_bytes(dir + "/good.bin");
    bytes[HEADER_BYTES + 2] = '\0';  // header, then [1]'a', then token 1's length byte
    write_bytes(dir + "/empty_token.bin", bytes);
    EXPECT_EXIT(read_tokenizer(dir + "/empty_token.bin"), testing::ExitedWithCode(1),
                "tokenizer file '.*empty_token\\.bin': token 1 has length 0");
    // a writer refuses what the reader would refuse
    TokenizerFile bad = sample_tokenizer();
    bad.token_bytes[3] = "";
    EXPECT_EXIT(tokenizer_file_write(dir + "/bad.bin", bad), testing::ExitedWithCode(1),
                "token 3 has 0 bytes; the tokenizer file stores 1\\.\\.255 bytes per token");
}

// ----------------------------------------------------------------------------
// atomic writes and checkpoint directories

TEST(FilesAtomic, UncommittedWriteLeavesNoFinalFile) {
    std::string dir = test::scratch_dir("files_atomic");
    std::string path = dir + "/out.bin";
    AtomicFile f = atomic_open(path);
    fwriteCheck("abc", 1, 3, f.fp);
    fflush(f.fp);
    EXPECT_FALSE(file_exists(path));  // a crash here leaves only the .tmp
    EXPECT_TRUE(file_exists(path + ".tmp"));
    atomic_commit(&f);
    EXPECT_TRUE(file_exists(path));
    EXPECT_FALSE(file_exists(path + ".tmp"));
    EXPECT_EQ(read_bytes(path), "abc");

    // an interrupted rewrite leaves the previous complete file untouched
    AtomicFile g = atomic_open(path);
    fwriteCheck("xyz123", 1, 6, g.fp);
    fcloseCheck(g.fp);  // "crash" before the commit
    EXPECT_EQ(read_bytes(path), "abc");
    // a model write that is interrupted leaves no model file at all
    AtomicFile h = atomic_open(dir + "/model_00000010.bin");
    fcloseCheck(h.fp);
    EXPECT_FALSE(file_exists(dir + "/model_00000010.bin"));
}

// A write that fails (here: fatal in the middle, as on a full disk) removes its .tmp on the way out and
// says so; the file it was replacing stays as it was.
void write_and_fail(const std::string& path) {
    AtomicFile f = atomic_open(path);
    atomic_write(&f, "partial", 7);
    fflush(f.fp);
    fatal("disk full (simulated)");
}

TEST(FilesAtomic, FailedWriteRemovesItsTmp) {
    std::string dir = test::scratch_dir("files_atomic_fail");
    write_bytes(dir + "/out.bin", "old");
    EXPECT_EXIT(write_and_fail(dir + "/out.bin"), testing::ExitedWithCode(1),
                "disk full \\(simulated\\)\nremoved the incomplete file '.*out\\.bin\\.tmp'");
    EXPECT_FALSE(file_exists(dir + "/out.bin.tmp"));
    EXPECT_EQ(read_bytes(dir + "/out.bin"), "old");
}

// A checkpoint that fails before its DONE marker removes the files it wrote, and the marker of an
// older run's checkpoint of the same step (whose files it had begun to replace).
void checkpoint_and_fail(const std::string& dir) {
    GPT2Config cfg = tiny_config();
    std::vector<float> params(num_parameters(cfg), 0.5f);
    checkpoint_begin(dir, 5, 0);
    model_file_write(checkpoint_model_path(dir, 5), cfg, params.data(), MODEL_VERSION_FP32);
    AtomicFile f = atomic_open(checkpoint_state_path(dir, 5, 0));
    fatal("no space left on device (simulated)");
}

TEST(FilesCheckpoint, FailedCheckpointRemovesItsFiles) {
    std::string dir = test::scratch_dir("files_checkpoint_fail");
    checkpoint_mark_done(dir, 5);  // an older run's checkpoint 5
    checkpoint_mark_done(dir, 4);
    EXPECT_EXIT(checkpoint_and_fail(dir), testing::ExitedWithCode(1),
                "removed the incomplete file '.*state_00000005_00000\\.bin\\.tmp'\n"
                "removed the incomplete file '.*model_00000005\\.bin'");
    EXPECT_EQ(test::dir_names(dir), std::vector<std::string>({"DONE_00000004"}));
}

// Once complete (checkpoint_end), a checkpoint's files stay whatever error comes later. (A test of its
// own: a death test's child runs the test body again up to its statement, on the same directory.)
TEST(FilesCheckpoint, CompleteCheckpointStaysAfterALaterError) {
    std::string dir = test::scratch_dir("files_checkpoint_later_error");
    GPT2Config cfg = tiny_config();
    std::vector<float> params(num_parameters(cfg), 0.5f);
    checkpoint_begin(dir, 6, 0);
    model_file_write(checkpoint_model_path(dir, 6), cfg, params.data(), MODEL_VERSION_FP32);
    state_file_write(checkpoint_state_path(dir, 6, 0), sample_state(false));
    checkpoint_mark_done(dir, 6);
    checkpoint_end(dir, 6, 0);
    EXPECT_EXIT(fatal("a later error"), testing::ExitedWithCode(1), "a later error");
    EXPECT_EQ(test::dir_names(dir), std::vector<std::string>({"DONE_00000006", "model_00000006.bin",
                                                              "state_00000006_00000.bin"}));
}

// What a resume removes: checkpoint files of steps without a DONE marker and checkpoint .tmp files,
// nothing else (complete checkpoints, other files, names that only look like checkpoint files).
TEST(FilesCheckpoint, RemoveIncompleteLeavesCompleteCheckpointsAndOtherFiles) {
    std::string dir = test::scratch_dir("files_checkpoint_incomplete");
    EXPECT_TRUE(checkpoint_remove_incomplete(dir + "/absent").empty());
    for (const char* name : {"model_00000010.bin", "state_00000010_00000.bin", "state_00000010_00001.bin",
                             "DONE_00000010", "model_00000020.bin", "state_00000020_00000.bin",
                             "state_00000020_00001.bin.tmp", "model_00000030.bin.tmp", "DONE_00000040.tmp",
                             "model_00000010.bin.tmp", "notes.txt", "model_final.bin", "main.log.tmp",
                             "model_00000050.bin.bak", "state_00000050.bin", "model_123.bin", "DONE_25"}) {
        write_bytes(dir + "/" + name, "x");
    }
    std::vector<std::string> removed = checkpoint_remove_incomplete(dir);
    EXPECT_EQ(removed, std::vector<std::string>({"DONE_00000040.tmp", "model_00000010.bin.tmp", "model_00000020.bin",
                                                 "model_00000030.bin.tmp", "model_123.bin", "state_00000020_00000.bin",
                                                 "state_00000020_00001.bin.tmp"}));
    EXPECT_EQ(test::dir_names(dir),
              std::vector<std::string>({"DONE_00000010", "DONE_25", "main.log.tmp", "model_00000010.bin",
                                        "model_00000050.bin.bak", "model_final.bin", "notes.txt",
                                        "state_00000010_00000.bin", "state_00000010_00001.bin", "state_00000050.bin"}));
    EXPECT_TRUE(checkpoint_remove_incomplete(dir).empty());
}

TEST(FilesCheckpoint, FindLatestNeedsDoneMarker) {
    std::string dir = test::scratch_dir("files_checkpoint_latest");
    EXPECT_EQ(checkpoint_find_latest(dir), -1);                // empty directory
    EXPECT_EQ(checkpoint_find_latest(dir + "/absent"), -1);    // no directory
    GPT2Config cfg = tiny_config();
    std::vector<float> params(num_parameters(cfg), 0.5f);
    TrainState state = sample_state(false);
    // step 10 complete, step 20 written but never marked done (the run died before DONE_20)
    for (int step : {10, 20}) {
        model_file_write(checkpoint_model_path(dir, step), cfg, params.data(), MODEL_VERSION_FP32);
        state_file_write(checkpoint_state_path(dir, step, 0), state);
    }
    checkpoint_mark_done(dir, 10);
    EXPECT_TRUE(file_exists(dir + "/model_00000010.bin"));
    EXPECT_TRUE(file_exists(dir + "/state_00000010_00000.bin"));
    EXPECT_TRUE(file_exists(dir + "/DONE_00000010"));
    EXPECT_EQ(checkpoint_find_latest(dir), 10);
    // older complete checkpoints and names that only look like markers change nothing
    checkpoint_mark_done(dir, 5);
    for (const char* name : {"DONE_12x", "DONE_00000030.tmp", "DONE_", "xDONE_00000040", "DONE_-50", "DONE_ 60",
                             "DONE_+70", "done_00000080", "model_00000090.bin"}) {
        write_bytes(dir + "/" + name, "");
    }
    EXPECT_EQ(checkpoint_find_latest(dir), 10);
    // a newer DONE wins; unpadded digits are still a step number
    checkpoint_mark_done(dir, 20);
    EXPECT_EQ(checkpoint_find_latest(dir), 20);
    write_bytes(dir + "/DONE_25", "");
    EXPECT_EQ(checkpoint_find_latest(dir), 25);
}
