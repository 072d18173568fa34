// The Hugging Face weight converter, dev/hf_gpt2.py (doc/hf_weights.md), on a tiny GPT-2 that
// test/hf_fixture.py writes in HF's exact layout and names (2 layers, 64 channels, 4 heads, maxT 32,
// vocab 300 -> padded 384) with its own safetensors writer:
//  - round trips, both ways and in both precisions, are bit-identical;
//  - our forward on the imported file matches the PyTorch oracle on that file, and a float64 NumPy
//    forward written from HF's semantics on the original HF file (so a transposed or misplaced tensor
//    cannot hide: the oracle alone would agree with any consistent mistake);
//  - F16 and BF16 inputs convert exactly; --bf16 rounds to nearest even as llmc/io/checkpoint.h does;
//  - the hub's names with and without `transformer.`, buffers and a tied lm_head all import alike;
//  - truncated, corrupt and foreign files, and unconvertible configs, are refused with a message;
//  - where transformers is installed, GPT2LMHeadModel loads the export as is and its logits match ours.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../llmc/adamw.h"
#include "../llmc/run/args.h"
#include "../llmc/attention.h"
#include "../llmc/io/checkpoint.h"
#include "../llmc/crossentropy.h"
#include "../llmc/io/dataloader.h"
#include "../llmc/encoder.h"
#include "../llmc/gelu.h"
#include "../llmc/gpt2_config.h"
#include "../llmc/gpt2_init.h"
#include "../llmc/layernorm.h"
#include "../llmc/run/logger.h"
#include "../llmc/matmul.h"
#include "../llmc/parallel/comm_mpi.h"
#include "../llmc/rand.h"
#include "../llmc/residual.h"
#include "../llmc/run/sampler.h"
#include "../llmc/run/schedulers.h"
#include "../llmc/tokenizer/tokenizer_file.h"
#include "../llmc/run/run_loop.h"
#include "../llmc/run/train_common.h"
#include "../llmc/utils.h"
#include "../llmc/parallel/zero.h"
#include "test_helpers.h"

// Our CPU model. test_model.cpp already compiles train_gpt2.cpp into this binary, so a second plain
// #include would define its functions twice; inside a namespace of its own they are distinct. Its
// headers are included above first, so their include guards keep them out of the namespace.
#define TESTING
namespace ours {
#include "../train_gpt2.cpp"
}

namespace {

const int B = 2, T = 16;

std::string converter() { return test::python() + " '" + test::root() + "/dev/hf_gpt2.py'"; }
std::string fixture() { return test::python() + " '" + test::root() + "/test/hf_fixture.py'"; }

// Runs a command that must succeed; its output goes to the test log on failure.
void run_ok(const std::string& cmd) {
    test::CommandResult r = test::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
}

void hf_import(const std::string& hf_dir, const std::string& model, bool bf16 = false) {
    run_ok(converter() + " import '" + hf_dir + "' '" + model + "'" + (bf16 ? " --bf16" : ""));
}

void hf_export(const std::string& model, const std::string& hf_dir) {
    run_ok(converter() + " export '" + model + "' '" + hf_dir + "'");
}

std::string file_bytes(const std::string& path) {
    EXPECT_TRUE(file_exists(path)) << path;
    return test::read_text(path);
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<float> read_floats(const std::string& path, size_t n) {
    std::string bytes = file_bytes(path);
    EXPECT_EQ(bytes.size(), n * 4) << path;
    std::vector<float> out(n);
    memcpy(out.data(), bytes.data(), std::min(bytes.size(), n * 4));
    return out;
}

uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

// Logits (B, T, V) of our fp32 CPU forward on a model file, the padded columns dropped.
std::vector<float> our_logits(const std::string& model_path, const std::vector<int>& inputs) {
    ours::GPT2 model;
    ours::gpt2_load_checkpoint(&model, model_path);
    ours::gpt2_forward(&model, inputs.data(), nullptr, B, T);
    int V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
    std::vector<float> logits((size_t)B * T * V);
    for (int i = 0; i < B * T; i++) {
        std::copy(model.acts.logits + (size_t)i * Vp, model.acts.logits + (size_t)i * Vp + V, logits.begin() + (size_t)i * V);
    }
    return logits;
}

std::string write_inputs(const std::string& dir, const std::vector<int>& inputs) {
    std::string path = dir + "/inputs.bin";
    write_bytes(path, std::string((const char*)inputs.data(), inputs.size() * 4));
    return path;
}

// ----------------------------------------------------------------------------

// Ours -> HF -> ours gives back the same bytes, checksums included (so dev/hf_gpt2.py computes them as
// llmc/io/checksum.h does), for the oracle's fp32 model (version 3) and for its bf16 rounding (version
// 5: exported as exact F32, imported with --bf16, which rounds nothing).
TEST(HfRoundTrip, OursToHfToOursIsBitIdentical) {
    std::string oracle_dir = test::oracle("tiny", "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 "
                                                  "--seed 1 -b 2 -t 16 --data-tokens 4096");
    std::string dir = test::scratch_dir("hf_round_trip_ours");
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(oracle_dir + "/model.bin", &cfg, &params);
    model_file_write(dir + "/model_fp32.bin", cfg, params.data(), MODEL_VERSION_FP32);
    model_file_write(dir + "/model_bf16.bin", cfg, params.data(), MODEL_VERSION_BF16);

    hf_export(dir + "/model_fp32.bin", dir + "/hf32");
    hf_import(dir + "/hf32", dir + "/back32.bin");
    EXPECT_EQ(file_bytes(dir + "/back32.bin"), file_bytes(dir + "/model_fp32.bin")) << "version 3";

    hf_export(dir + "/model_bf16.bin", dir + "/hf16");
    hf_import(dir + "/hf16", dir + "/back16.bin", true);
    EXPECT_EQ(file_bytes(dir + "/back16.bin"), file_bytes(dir + "/model_bf16.bin")) << "version 5";
}

// HF (hub layout: no prefix, mask buffers, a tied lm_head copy) -> ours -> HF: every parameter
// comes back bit-identical, read by the fixture's own reader.
TEST(HfRoundTrip, HfToOursToHfIsBitIdentical) {
    std::string dir = test::scratch_dir("hf_round_trip_hf");
    run_ok(fixture() + " write " + dir + "/hf --buffers --lm-head");
    hf_import(dir + "/hf", dir + "/model.bin");
    hf_export(dir + "/model.bin", dir + "/out");
    run_ok(fixture() + " compare " + dir + "/hf " + dir + "/out");
}

// Our forward on the imported file against (a) the PyTorch oracle started from that same file and
// (b) a float64 NumPy forward that reads HF's file directly, with HF's conventions (x @ W for
// Conv1D, tied head). Tolerance 1e-5 relative to the largest logit, as in test_model.cpp: fp32
// against float64; measured ~1e-7. The fixture's weights have std 0.1, so a transposed or swapped
// tensor moves the logits by O(1).
TEST(HfImport, ForwardMatchesOracleAndHfLayoutForward) {
    std::string dir = test::scratch_dir("hf_forward");
    run_ok(fixture() + " write " + dir + "/hf");
    hf_import(dir + "/hf", dir + "/model.bin");
    run_ok(test::python() + " '" + test::root() + "/test/oracle/gpt2_oracle.py' --out " + dir +
           "/oracle --init-from " + dir + "/model.bin -b 2 -t 16 --data-tokens 4096 --seed 1");
    // the same header fields and weights (the oracle's copy has no checksums: header slots 64.. are ours)
    std::string oracle_copy = file_bytes(dir + "/oracle/model.bin"), imported = file_bytes(dir + "/model.bin");
    EXPECT_EQ(oracle_copy.substr(0, 64 * 4), imported.substr(0, 64 * 4)) << "oracle read another header";
    EXPECT_TRUE(oracle_copy.size() > HEADER_BYTES && oracle_copy.substr(HEADER_BYTES) == imported.substr(HEADER_BYTES))
        << "oracle read other weights";

    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(dir + "/model.bin", &cfg, &params);
    ASSERT_EQ(cfg.vocab_size, 300);
    test::DebugState state = test::read_debug_state(dir + "/oracle/state.bin", cfg.vocab_size, params.size());
    ASSERT_EQ(state.B, B);
    ASSERT_EQ(state.T, T);

    std::vector<float> ours_logits = our_logits(dir + "/model.bin", state.inputs);
    double vs_oracle = test::max_rel_error(ours_logits.data(), state.logits.data(), ours_logits.size());
    EXPECT_LE(vs_oracle, 1e-5) << "ours vs oracle";

    run_ok(fixture() + " numpy-logits " + dir + "/hf " + write_inputs(dir, state.inputs) + " 2 16 " + dir + "/np.bin");
    std::vector<float> np_logits = read_floats(dir + "/np.bin", ours_logits.size());
    double vs_numpy = test::max_rel_error(ours_logits.data(), np_logits.data(), ours_logits.size());
    EXPECT_LE(vs_numpy, 1e-5) << "ours vs HF-layout NumPy forward";
    double oracle_vs_numpy = test::max_rel_error(state.logits.data(), np_logits.data(), np_logits.size());
    printf("  logits max rel error: ours vs oracle %.2e, ours vs HF-layout NumPy %.2e, oracle vs NumPy %.2e\n",
           vs_oracle, vs_numpy, oracle_vs_numpy);
}

// F16 and BF16 tensors are upcast exactly: a file in F16 (BF16) imports to the same bytes as an F32
// file holding the same values. And --bf16 of a BF16 file reproduces its bits.
TEST(HfImport, HalfPrecisionTensorsConvertExactly) {
    std::string dir = test::scratch_dir("hf_half");
    for (const char* dtype : {"F16", "BF16"}) {
        SCOPED_TRACE(dtype);
        std::string half = dir + "/" + dtype, full = dir + "/" + dtype + "_as_f32";
        run_ok(fixture() + " write " + half + " --dtype " + dtype);
        run_ok(fixture() + " write " + full + " --dtype F32 --values-of " + dtype);
        hf_import(half, half + ".bin");
        hf_import(full, full + ".bin");
        EXPECT_EQ(file_bytes(half + ".bin"), file_bytes(full + ".bin"));
    }
    hf_import(dir + "/BF16", dir + "/BF16_v5.bin", true);
    hf_import(dir + "/BF16_as_f32", dir + "/BF16_as_f32_v5.bin", true);
    EXPECT_EQ(file_bytes(dir + "/BF16_v5.bin"), file_bytes(dir + "/BF16_as_f32_v5.bin"));
    GPT2Config cfg;
    std::vector<float> v3, v5;
    model_file_read(dir + "/BF16.bin", &cfg, &v3);
    model_file_read(dir + "/BF16_v5.bin", &cfg, &v5);
    EXPECT_TRUE(v3 == v5) << "a BF16 file imported as version 5 must keep its values";
}

// --bf16 rounds like llmc/io/checkpoint.h's float_to_bf16 (round to nearest even, NaN stays NaN), on
// planted ties, subnormals, infinities, the largest float and NaNs whose payload is in the low bits.
TEST(HfImport, Bf16RoundsToNearestEvenLikeTheTrainer) {
    std::string dir = test::scratch_dir("hf_bf16");
    run_ok(fixture() + " write " + dir + "/hf --special");
    hf_import(dir + "/hf", dir + "/v3.bin");
    hf_import(dir + "/hf", dir + "/v5.bin", true);
    // read as stored: model_file_read refuses the planted infinities and NaNs (llmc/io/checkpoint.h)
    std::string b3 = file_bytes(dir + "/v3.bin"), b5 = file_bytes(dir + "/v5.bin");
    ASSERT_GT(b5.size(), (size_t)HEADER_BYTES);
    size_t n = (b5.size() - HEADER_BYTES) / 2;
    ASSERT_EQ(b3.size(), HEADER_BYTES + 4 * n);
    std::vector<float> v3(n), v5(n);
    memcpy(v3.data(), b3.data() + HEADER_BYTES, 4 * n);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, b5.data() + HEADER_BYTES + 2 * i, 2);
        v5[i] = bf16_to_float(h);
    }
    size_t mismatches = 0, nans = 0;
    for (size_t i = 0; i < v3.size(); i++) {
        if (bits_of(bf16_to_float(float_to_bf16(v3[i]))) != bits_of(v5[i])) mismatches++;
        if (std::isnan(v3[i])) {
            nans++;
            EXPECT_TRUE(std::isnan(v5[i])) << "NaN at " << i << " did not stay NaN";
        }
    }
    EXPECT_EQ(mismatches, 0u);
    EXPECT_EQ(nans, 4u) << "the planted NaNs";
}

// The hub's names with the transformer. prefix, the causal-mask buffers and a tied lm_head copy
// change nothing.
TEST(HfImport, KeyNamesWithAndWithoutPrefix) {
    std::string dir = test::scratch_dir("hf_names");
    run_ok(fixture() + " write " + dir + "/plain");
    run_ok(fixture() + " write " + dir + "/prefixed --prefix --buffers --lm-head");
    hf_import(dir + "/plain", dir + "/plain.bin");
    hf_import(dir + "/prefixed", dir + "/prefixed.bin");
    EXPECT_EQ(file_bytes(dir + "/plain.bin"), file_bytes(dir + "/prefixed.bin"));
}

// wte gets V rounded up to a multiple of 128 rows, the new ones zero: 300 -> 384, 256 stays 256,
// GPT-2's 50257 -> 50304. Export drops them again (and round-trips).
TEST(HfImport, PadsVocabWithZeroRows) {
    std::string dir = test::scratch_dir("hf_vocab");
    struct Case { int V, Vp; const char* shape; };
    for (const Case& c : {Case{300, 384, ""}, Case{256, 256, ""},
                          Case{50257, 50304, " --layers 1 --channels 8 --heads 2 --max-seq-len 8"}}) {
        SCOPED_TRACE(c.V);
        std::string hf = dir + "/v" + std::to_string(c.V), model = hf + ".bin";
        run_ok(fixture() + " write " + hf + " --vocab " + std::to_string(c.V) + c.shape);
        hf_import(hf, model);
        GPT2Config cfg;
        std::vector<float> params;
        model_file_read(model, &cfg, &params);
        EXPECT_EQ(cfg.vocab_size, c.V);
        EXPECT_EQ(cfg.padded_vocab_size, c.Vp);
        size_t nonzero_pad = 0, C = cfg.channels;
        for (size_t i = (size_t)c.V * C; i < (size_t)c.Vp * C; i++) nonzero_pad += params[i] != 0.0f || std::signbit(params[i]);
        EXPECT_EQ(nonzero_pad, 0u);
        hf_export(model, hf + "_out");
        run_ok(fixture() + " compare " + hf + " " + hf + "_out");
        std::string config = test::read_text(hf + "_out/config.json");
        EXPECT_NE(config.find("\"vocab_size\": " + std::to_string(c.V) + ","), std::string::npos) << config;
    }
}

// A model file whose padded wte rows are not zero is refused on export (they would be dropped).
TEST(HfExport, RefusesNonZeroPaddedRows) {
    std::string dir = test::scratch_dir("hf_pad_export");
    run_ok(fixture() + " write " + dir + "/hf");
    hf_import(dir + "/hf", dir + "/model.bin");
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(dir + "/model.bin", &cfg, &params);
    params[(size_t)(cfg.vocab_size + 5) * cfg.channels + 3] = 0.25f;  // row V+5
    model_file_write(dir + "/dirty.bin", cfg, params.data(), MODEL_VERSION_FP32);
    test::CommandResult r = test::run_command(converter() + " export " + dir + "/dirty.bin " + dir + "/out");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("row 305 is not"), std::string::npos) << r.output;
    EXPECT_FALSE(file_exists(dir + "/out/model.safetensors"));
}

// Export checks our checksums (llmc/io/checksum.h) with zlib's CRC-32: a flipped bit in the weights or
// the header is refused naming the bytes, and nothing is written; llm.c's file (no checksums) exports,
// with a note. A model of more than 1 MiB of weights has several blocks, which both sides agree on.
TEST(HfExport, ChecksChecksums) {
    std::string dir = test::scratch_dir("hf_checksums");
    GPT2Config cfg{64, 300, 384, 2, 4, 128};  // maxT, V, Vp, L, NH, C: 454k parameters, 2 blocks in fp32
    std::vector<float> params = gpt2_random_parameters(cfg, 3);
    model_file_write(dir + "/good.bin", cfg, params.data(), MODEL_VERSION_FP32);
    std::string good = file_bytes(dir + "/good.bin");
    ASSERT_GT(good.size(), (size_t)HEADER_BYTES + (1 << 20));
    hf_export(dir + "/good.bin", dir + "/hf");
    hf_import(dir + "/hf", dir + "/back.bin");
    EXPECT_EQ(file_bytes(dir + "/back.bin"), good) << "python's checksums of two blocks differ from ours";

    struct Case { std::string name; long offset; std::string expect; };
    long end = (long)good.size(), second = HEADER_BYTES + (1 << 20);
    std::vector<Case> cases = {
        {"first_block", HEADER_BYTES + 40, "is corrupt: bytes [1024, " + std::to_string(second) + ") (block 1 of 2)"},
        {"second_block", end - 1, "is corrupt: bytes [" + std::to_string(second) + ", " + std::to_string(end) + ") (block 2 of 2)"},
        {"header", 4 * 10, "is corrupt: its header (bytes [0, 1024)) does not match its checksum"},  // an unused slot
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        std::string path = dir + "/" + c.name + ".bin";
        write_bytes(path, good);
        test::flip_byte(path, c.offset);
        test::CommandResult r = test::run_command(converter() + " export '" + path + "' '" + dir + "/out_" + c.name + "'");
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find("hf_gpt2.py: error: model file " + path + " " + c.expect), std::string::npos) << r.output;
        EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
        EXPECT_FALSE(file_exists(dir + "/out_" + c.name + "/model.safetensors"));
    }
    std::string bare = good;
    std::fill(bare.begin() + 64 * 4, bare.begin() + HEADER_BYTES, '\0');
    write_bytes(dir + "/llmc.bin", bare);
    test::CommandResult r = test::run_command(converter() + " export '" + dir + "/llmc.bin' '" + dir + "/out_llmc'");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("model file " + dir + "/llmc.bin carries no checksums"), std::string::npos) << r.output;
}

// Every way a file can be wrong: refused with exit status 1, a message naming the problem, no
// traceback, and no output file left behind.
TEST(HfImport, RefusesTruncatedCorruptAndForeignFiles) {
    std::string dir = test::scratch_dir("hf_corrupt");
    std::string good = dir + "/good";
    run_ok(fixture() + " write " + good);
    std::string st = file_bytes(good + "/model.safetensors"), config = file_bytes(good + "/config.json");
    uint64_t header_len;
    memcpy(&header_len, st.data(), 8);

    struct Case { std::string name, bytes, expect; };  // a replacement model.safetensors
    std::vector<Case> files = {
        {"empty", "", "too short"},
        {"four_bytes", st.substr(0, 4), "too short"},
        {"cut_in_header", st.substr(0, 8 + header_len / 2), "does not fit"},
        {"cut_in_data", st.substr(0, st.size() - 100), "truncated?"},
        {"one_byte_short", st.substr(0, st.size() - 1), "truncated?"},
        {"trailing_bytes", st + std::string(16, '\0'), "after the last tensor"},
        {"our_model_file", file_bytes(test::oracle("tiny", "--layers 2 --channels 64 --heads 4 --max-seq-len 32 "
                                                           "--vocab 300 --seed 1 -b 2 -t 16 --data-tokens 4096") +
                                      "/model.bin"),
         "not a safetensors file"},
        {"text_file", "This is a README, not a tensor file.\n", "not a safetensors file"},
    };
    for (const Case& c : files) {
        std::string d = dir + "/" + c.name;
        run_ok("mkdir -p " + d);
        write_bytes(d + "/model.safetensors", c.bytes);
        write_bytes(d + "/config.json", config);
    }
    struct Edit { std::string kind, expect; };  // header or config edits made by the fixture
    std::vector<Edit> edits = {
        {"overlap", "overlaps"},
        {"beyond-end", "truncated?"},
        {"size-mismatch", "needs 28 bytes, data_offsets span 256"},
        {"unknown-dtype", "unknown dtype 'Q4'"},
        {"int-dtype", "has dtype I32; expected F32, F16 or BF16"},
        {"transposed", "Conv1D weights are stored (in, out)"},
        {"not-json", "not JSON"},
        {"bad-activation", "activation_function 'relu'"},
    };
    for (const Edit& e : edits) {
        run_ok(fixture() + " corrupt " + good + " " + dir + "/" + e.kind + " " + e.kind);
        files.push_back({e.kind, "", e.expect});
    }
    run_ok(fixture() + " write " + dir + "/missing --drop ln_f.bias");
    files.push_back({"missing", "", "missing tensors ln_f.bias"});
    run_ok(fixture() + " write " + dir + "/three_layers --layers 3");
    run_ok("cp " + good + "/config.json " + dir + "/three_layers/config.json");
    files.push_back({"three_layers", "", "does not have: h.2."});
    run_ok("mkdir -p " + dir + "/no_config && cp " + good + "/model.safetensors " + dir + "/no_config/");
    files.push_back({"no_config", "", "No such file"});

    for (const Case& c : files) {
        SCOPED_TRACE(c.name);
        std::string out = dir + "/" + c.name + ".bin";
        test::CommandResult r = test::run_command(converter() + " import " + dir + "/" + c.name + " " + out);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find("hf_gpt2.py: error: "), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << r.output;
        EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
        EXPECT_FALSE(file_exists(out)) << "an output file was left behind";
    }
}

// transformers' GPT2LMHeadModel loads our export as is (no missing or unexpected keys) and gives the
// logits of our forward; it also reads the original HF file, so the whole chain is checked against
// the library users will use. The safetensors library reads the export bit-identical to the source.
// Tolerance 1e-5 as above (transformers runs in float64 here).
TEST(HfTransformers, ExportLoadsInGPT2LMHeadModelWithOurLogits) {
    std::string dir = test::scratch_dir("hf_transformers");
    run_ok(fixture() + " write " + dir + "/hf --buffers");
    hf_import(dir + "/hf", dir + "/model.bin");
    hf_export(dir + "/model.bin", dir + "/out");

    std::vector<int> inputs(B * T);
    for (int i = 0; i < B * T; i++) inputs[i] = (i * 37 + 11) % 300;
    std::string cmd = fixture() + " transformers-logits " + write_inputs(dir, inputs) + " 2 16 " + dir + "/tf " +
                      dir + "/hf " + dir + "/out";
    test::CommandResult r = test::run_command(cmd);
    if (r.exit_code == 77) GTEST_SKIP() << "transformers is not installed here: " << r.output;
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;

    std::vector<float> ours_logits = our_logits(dir + "/model.bin", inputs);
    std::vector<float> tf_source = read_floats(dir + "/tf.0", ours_logits.size());
    std::vector<float> tf_export = read_floats(dir + "/tf.1", ours_logits.size());
    double vs_export = test::max_rel_error(ours_logits.data(), tf_export.data(), ours_logits.size());
    double vs_source = test::max_rel_error(ours_logits.data(), tf_source.data(), ours_logits.size());
    EXPECT_LE(vs_export, 1e-5) << "ours vs GPT2LMHeadModel on our export";
    EXPECT_LE(vs_source, 1e-5) << "ours vs GPT2LMHeadModel on the original HF file";
    EXPECT_TRUE(tf_source == tf_export) << "GPT2LMHeadModel gives other logits on the export than on the source";
    printf("  logits max rel error: ours vs GPT2LMHeadModel(export) %.2e, vs GPT2LMHeadModel(source) %.2e\n",
           vs_export, vs_source);

    test::CommandResult lib = test::run_command(fixture() + " compare " + dir + "/hf " + dir + "/out --library");
    if (lib.exit_code == 77) GTEST_SKIP() << "the safetensors library is not installed here: " << lib.output;
    EXPECT_EQ(lib.exit_code, 0) << lib.output;
}

}  // namespace
