// Compressed data-parallel gradients (-gc sign, llmc/parallel/grad_compression.h): the encoding against
// its definition worked out by hand, EF21's error feedback against its definition over steps, the state
// independent of the loss scale, and the CPU trainer on 2 processes: against the oracle's EF21, the bytes
// a step as the formula says, h and H checkpointed per process and resumed bit for bit, and the refusals;
// PowerSGD and local steps likewise.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../llmc/io/state_file.h"
#include "../llmc/parallel/grad_compression.h"
#include "../llmc/parallel/local_steps.h"
#include "../llmc/parallel/powersgd.h"
#include "../llmc/run/args.h"
#include "optimizer_oracle.h"
#include "test_helpers.h"

namespace {

// A block of four with what the others hold already, h = (0.5, -1, 1, 0): d = g - h = (0.5, -1, -0.5,
// -0.5), scale = mean |d| over the block's 64 elements = 2.5 / 64, the bits mark the negative d's, and q =
// scale sign(d) is added to h and to H (one process: H = h), which is the gradient handed on. A zero d
// (elements 4..63) codes as +scale (one bit: no 0). The second block (elements 64..67, h = 0) has its own
// scale (3 + 1 + 0 + 0) / 4 = 1. Every value here is a short binary fraction: the sums are exact.
TEST(GradCompression, SignEncodingByHand) {
    const size_t n = 68;
    std::vector<OptimizerTensor> tensors = {{P_WTE, -1, 0, 1, n, 0}};
    SignCompression sc = sign_compression_init(tensors, n, 1);
    ASSERT_EQ(sc.estimates.size(), 2 * n) << "h, then H";
    const float h[4] = {0.5f, -1.0f, 1.0f, 0.0f};
    for (int i = 0; i < 4; i++) sc.estimates[i] = sc.estimates[n + i] = h[i];
    std::vector<float> g(n, 0.0f);
    g[0] = 1.0f, g[1] = -2.0f, g[2] = 0.5f, g[3] = -0.5f;
    g[64] = 3.0f, g[65] = -1.0f;
    std::vector<float> grads = g;
    sign_compressed_reduce(ProcessGroup(), &sc, grads.data());
    EXPECT_EQ(sc.gathered[0], 0b1110u) << "the bits of block 0";
    EXPECT_EQ(sc.gathered[1], 0b10u) << "the bits of block 1";
    EXPECT_EQ(((const float*)(sc.gathered.data() + 2))[0], 2.5f / 64);
    EXPECT_EQ(((const float*)(sc.gathered.data() + 2))[1], 1.0f);
    const float s = 2.5f / 64;
    const float want[8] = {0.5f + s, -1.0f - s, 1.0f - s, -s, s, 1.0f, -1.0f, 1.0f};
    const size_t at[8] = {0, 1, 2, 3, 4, 64, 65, 66};
    for (int k = 0; k < 8; k++) {
        EXPECT_EQ(grads[at[k]], want[k]) << "element " << at[k];
        EXPECT_EQ(sc.estimates[at[k]], want[k]) << "h at " << at[k];
        EXPECT_EQ(sc.estimates[n + at[k]], want[k]) << "H at " << at[k];
    }
}

// A non-finite gradient (a step the loss scaler skips): its block hands on a non-finite gradient, so the
// step is seen as skipped, and adds nothing to h or H, which would otherwise stay non-finite for good; the
// other blocks go on as usual.
TEST(GradCompression, SignLeavesANonFiniteBlockOut) {
    const size_t n = 128;
    std::vector<OptimizerTensor> tensors = {{P_WTE, -1, 0, 1, n, 0}};
    SignCompression sc = sign_compression_init(tensors, n, 1);
    std::vector<float> g(n, 1.0f);
    g[5] = NAN;
    sign_compressed_reduce(ProcessGroup(), &sc, g.data());
    for (size_t i = 0; i < 64; i++) {
        EXPECT_FALSE(std::isfinite(g[i])) << i;
        EXPECT_EQ(sc.estimates[i], 0.0f) << "h at " << i;
        EXPECT_EQ(sc.estimates[n + i], 0.0f) << "H at " << i;
    }
    for (size_t i = 64; i < n; i++) {
        EXPECT_EQ(g[i], 1.0f) << i;
        EXPECT_EQ(sc.estimates[i], 1.0f) << "h at " << i;
    }
}

// EF21 step by step against its definition, computed here in double from the h before the step: d = g - h,
// s = the block's mean |d|, h + s sign(d); the gradient handed on is H = h (one process). 30 steps of new
// gradients of changing size: h within 1e-6 of the definition's (each step rounds g - h, s and h + q once
// in fp32: relative 2^-24 of values of order 1; an element with the wrong sign is off by 2s, ~1). Then a
// gradient held fixed for 60 steps: d's next value is d - q, whose square sum in a block is |d|^2 - |d|_1^2
// / 64 (the scaled sign is contractive), so what the others hold for the gradient comes closer every step
// (checked per block: no step moves away, to fp32 rounding: 64 elements of order 1 off by 2^-23 each add
// 1e-11 to a square sum) and ends 100 times closer than it started in square sum (measured: 1.2e-4 of
// it), where the bits alone (EF-signSGD's q, handed on before) stay a block's scale away from it.
TEST(GradCompression, Ef21FollowsItsDefinitionAndConverges) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t n = 200;  // 3 blocks and a part
    std::vector<OptimizerTensor> tensors = {{P_WTE, -1, 0, 1, n, 0}};
    SignCompression sc = sign_compression_init(tensors, n, 1);
    std::vector<float> fixed(n);
    for (float& x : fixed) x = normal(rng);
    auto square_off = [&](size_t b) {  // |fixed - h|^2 over block b
        double sum = 0.0;
        for (size_t i = b * 64; i < std::min(n, b * 64 + 64); i++) sum += std::pow((double)fixed[i] - sc.estimates[i], 2);
        return sum;
    };
    double worst = 0.0, first[4] = {}, last[4] = {};
    for (int step = 0; step < 90; step++) {
        std::vector<float> g = fixed;
        if (step < 30) for (float& x : g) x = normal(rng) * (1.0f + (float)(step % 3));
        std::vector<double> want(sc.estimates.begin(), sc.estimates.begin() + n);  // the definition from h
        for (size_t b = 0; b < n; b += 64) {
            size_t e = std::min(n, b + 64);
            double s = 0.0;
            for (size_t i = b; i < e; i++) s += std::fabs(g[i] - want[i]);
            s /= (double)(e - b);
            for (size_t i = b; i < e; i++) want[i] += g[i] - want[i] < 0 ? -s : s;
        }
        double before[4];
        for (size_t b = 0; b < 4; b++) before[b] = square_off(b);
        if (step == 30) std::copy(before, before + 4, first);
        sign_compressed_reduce(ProcessGroup(), &sc, g.data());
        for (size_t i = 0; i < n; i++) {
            worst = std::max(worst, std::fabs(sc.estimates[i] - want[i]) / std::max(1.0, std::fabs(want[i])));
            ASSERT_EQ(g[i], sc.estimates[n + i]) << "the gradient handed on is H";
            ASSERT_EQ(sc.estimates[i], sc.estimates[n + i]) << "one process: H = h";
        }
        if (step >= 30) {
            for (size_t b = 0; b < 4; b++) {
                last[b] = square_off(b);
                EXPECT_LE(last[b], before[b] + 1e-11) << "block " << b << ", step " << step;
            }
        }
    }
    EXPECT_LT(worst, 1e-6) << "against the definition";
    double ratio = 0.0;
    for (size_t b = 0; b < 4; b++) ratio = std::max(ratio, last[b] / first[b]);
    EXPECT_LT(ratio, 1e-2) << "h converges to a gradient that stays";
    printf("  definition: worst %.1e; a fixed gradient after 60 steps: square sums at most %.1e of where they started\n",
           worst, ratio);
}

// The FP16 build's gradients carry the loss scale S, which the scaler halves after an overflow and
// doubles after clean steps: -gc's state holds the gradient itself, so the same gradients at another S
// hand on the same gradients times S and leave the same state, bit for bit (S a power of two: the
// multiplications are exact). Both schemes, one process, S changing every step; with the state kept in
// S's units instead, -gc sign would hand on an H twice too large after each halving.
TEST(GradCompression, StateHoldsTheGradientWhateverTheLossScale) {
    const std::vector<OptimizerTensor> tensors = {{P_QKVW, 0, 0, 40, 24, 0}, {P_QKVB, 0, 960, 1, 24, 0}};
    const size_t n = 984;
    const float scales[6] = {1.0f, 1024.0f, 512.0f, 1024.0f, 65536.0f, 0.5f};
    for (std::string kind : {"sign", "powersgd"}) {
        SCOPED_TRACE(kind);
        GradCompression plain, scaled;
        plain.kind = scaled.kind = kind;
        if (kind == "sign") plain.sign = scaled.sign = sign_compression_init(tensors, n, 1);
        else plain.power = scaled.power = powersgd_init(tensors, n, 2);
        std::mt19937 rng(3);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float S : scales) {
            std::vector<float> g(n), gs(n);
            for (size_t i = 0; i < n; i++) g[i] = normal(rng), gs[i] = g[i] * S;
            grad_compression_reduce(ProcessGroup(), &plain, g.data());
            grad_compression_reduce(ProcessGroup(), &scaled, gs.data(), S);
            for (size_t i = 0; i < n; i++) ASSERT_EQ(gs[i], g[i] * S) << "S " << S << ", element " << i;
            ASSERT_EQ(plain.feedback(), scaled.feedback()) << "S " << S;
        }
    }
}

std::string tiny_dir() { return test::oracle("tiny", std::string(OPTIMIZER_TINY)); }

// np processes, 64 tokens a step (-b 2 x 2 processes, or -b 1 x 4)
std::string command(int np, int steps, const std::string& extra) {
    std::string dir = tiny_dir();
    return "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " " +
           test::root() + "/train_gpt2 -e " + dir + "/model.bin -i " + dir + "/train.bin -b " + std::to_string(4 / np) +
           " -t 16 -d 64 -l 1e-3 -u 1 -c 0.1 -sh 1 -v 0 -s 0 -x " + std::to_string(steps) + " " + extra;
}

bool have_mpirun() { return test::run_command("command -v mpirun").exit_code == 0; }

// 2 processes: each step moves the all-gather of both processes' bits and scales, 2 (P-1) words x 8 bytes
// with words = the tensors' 64-element words and half a word per scale (the formula, from the tiny
// model's 28 tensors), 4.7% of the fp32 all-reduce's bytes (the same run without -gc, counted);
// both processes' state files hold their own h and the same H, and a run resumed from step 3
// ends with the uninterrupted one's bits.
TEST(GradCompression, SignOnTwoProcessesCountsItsBytesAndResumesBitForBit) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string plain = test::scratch_dir("gc_plain"), a = test::scratch_dir("gc_sign_a"), b = test::scratch_dir("gc_sign_b");
    ASSERT_EQ(test::run_command(command(2, 6, "-n 3 -o " + plain)).exit_code, 0);
    test::CommandResult ra = test::run_command(command(2, 6, "-gc sign -n 3 -o " + a));
    ASSERT_EQ(ra.exit_code, 0) << ra.output;
    EXPECT_NE(ra.output.find("gradient compression: -gc sign"), std::string::npos) << ra.output;
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(tiny_dir() + "/model.bin", &cfg, &params);
    size_t words = 0, scales = 0;
    for (const OptimizerTensor& t : optimizer_tensors(cfg)) words += (t.size() + 63) / 64, scales += (t.size() + 63) / 64;
    double expected = 2.0 * (2 - 1) * (double)(words + (scales + 1) / 2) * 8;
    std::vector<double> sign_bytes = test::jsonl_values(a + "/metrics.jsonl", "comm_bytes");
    std::vector<double> plain_bytes = test::jsonl_values(plain + "/metrics.jsonl", "comm_bytes");
    ASSERT_EQ(sign_bytes.size(), 6u);
    ASSERT_EQ(plain_bytes.size(), 6u);
    for (size_t s = 0; s < 6; s++) {
        EXPECT_EQ(sign_bytes[s], expected) << "step " << s;
        EXPECT_LE(sign_bytes[s], plain_bytes[s] / 8) << "step " << s;
    }
    printf("  bytes a step: %.0f, the all-reduce's %.0f (%.1f%%)\n", sign_bytes[0], plain_bytes[0],
           100.0 * sign_bytes[0] / plain_bytes[0]);
    TrainState s0, s1;
    state_file_read(a + "/state_00000006_00000.bin", &s0);
    state_file_read(a + "/state_00000006_00001.bin", &s1);
    ASSERT_EQ(s0.sections.size(), 1u);
    ASSERT_EQ(s1.sections.size(), 1u);
    EXPECT_EQ(s0.sections[0].kind, STATE_SECTION_SIGN_ESTIMATES);
    const size_t half = params.size() * sizeof(float);
    ASSERT_EQ(s0.sections[0].bytes.size(), 2 * half);
    ASSERT_EQ(s1.sections[0].bytes.size(), 2 * half);
    auto h = [&](const TrainState& s) { return std::vector<char>(s.sections[0].bytes.begin(), s.sections[0].bytes.begin() + half); };
    auto H = [&](const TrainState& s) { return std::vector<char>(s.sections[0].bytes.begin() + half, s.sections[0].bytes.end()); };
    EXPECT_NE(h(s0), h(s1)) << "each process's own h";
    EXPECT_EQ(H(s0), H(s1)) << "one H: every process adds the same bits and scales in the same order";
    // the same run, its last checkpoint removed, resumed from step 3
    ASSERT_EQ(test::run_command(command(2, 6, "-gc sign -n 3 -o " + b)).exit_code, 0);
    ASSERT_EQ(test::run_command("rm " + b + "/model_00000006.bin " + b + "/state_00000006_* " + b + "/DONE_00000006").exit_code, 0);
    test::CommandResult rb = test::run_command(command(2, 6, "-gc sign -n 3 -y 1 -o " + b));
    ASSERT_EQ(rb.exit_code, 0) << rb.output;
    EXPECT_NE(rb.output.find("continuing from step 3"), std::string::npos) << rb.output;
    EXPECT_EQ(test::read_text(a + "/model_00000006.bin"), test::read_text(b + "/model_00000006.bin"));
    EXPECT_EQ(test::read_text(a + "/state_00000006_00001.bin"), test::read_text(b + "/state_00000006_00001.bin"));
    // h is each process's: another process count is refused; without -gc they are dropped
    test::CommandResult other = test::run_command(command(4, 9, "-gc sign -y 1 -o " + a));
    EXPECT_NE(other.exit_code, 0);
    EXPECT_NE(other.output.find("holds the sign-compression estimates of 2 processes, each its own; this run has 4"),
              std::string::npos) << other.output;
    test::CommandResult dropped = test::run_command(command(2, 9, "-y 1 -o " + a));
    EXPECT_EQ(dropped.exit_code, 0) << dropped.output;
    EXPECT_NE(dropped.output.find("holds -gc sign's sign-compression estimates; this run has no -gc sign and drops them"), std::string::npos) << dropped.output;
    // a plain run's checkpoint resumed with -gc sign: h and H start at 0
    test::CommandResult started = test::run_command(command(2, 9, "-gc sign -y 1 -o " + plain));
    EXPECT_EQ(started.exit_code, 0) << started.output;
    EXPECT_NE(started.output.find("no sign-compression estimates (written without -gc sign): they start at 0"), std::string::npos)
        << started.output;
}

// -gc sign on 2 processes against the oracle's EF21 from its definition (gpt2_oracle.py --sign, float64,
// torch's own block sums): losses and gradient norms to 1e-5 and the parameters within 1e-2 of their
// movement, the bars of PowerSGD's test (fp32 against float64 over 5 steps: measured below). An element
// whose d is within rounding of 0 may take the other sign in one of them and move by 2 lr instead of 0,
// which is what the parameter bar allows; a wrong scale, sign or order (H summed from the wrong q) is off
// by the step itself.
TEST(GradCompression, SignOnTwoProcessesFollowsTheOracle) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    OptimizerRun run{"adamw", 1e-3, 0.02};
    std::string launch = "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 ";
    std::string oracle_dir = test::oracle("sign_ef21", std::string(OPTIMIZER_TINY) + run.oracle_args(2) + " --sign");
    std::string dir = test::scratch_dir("sign_oracle");
    test::CommandResult r = test::run_command(launch + run.trainer_args(oracle_dir, 2) + " -gc sign -n 1 -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
    expect_agreement(a, 1e-5, 1e-5, 1e-2);
}

// What -gc cannot run with, refused with the reason; one data-parallel process runs as -gc none.
TEST(GradCompression, RefusedWhereItCannotRun) {
    std::string dir = tiny_dir();
    std::string one = test::root() + "/train_gpt2 -e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -v 0 -s 0 -x 1 ";
    test::CommandResult unknown = test::run_command(one + "-gc topk");
    EXPECT_EQ(unknown.exit_code, 1);
    EXPECT_NE(unknown.output.find("flag -gc: unknown gradient compression 'topk' (none, sign or powersgd)"), std::string::npos);
    test::CommandResult zero = test::run_command(one + "-gc sign -z 1");
    EXPECT_EQ(zero.exit_code, 1);
    EXPECT_NE(zero.output.find("flag -gc sign compresses the whole gradient of data parallelism alone: it runs with -z 0"),
              std::string::npos) << zero.output;
    std::vector<std::string> words = {"train", "-gc", "powersgd", "-z", "2"};  // the CUDA trainer's flags alike
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(&w[0]);
    TrainArgs args;
    EXPECT_EXIT(parse_args((int)argv.size(), argv.data(), &args, true), testing::ExitedWithCode(1),
                "flag -gc powersgd compresses the whole gradient of data parallelism alone: it runs with -z 0");
    test::CommandResult alone = test::run_command(one + "-gc sign -o " + test::scratch_dir("gc_alone"));
    EXPECT_EQ(alone.exit_code, 0) << alone.output;
    EXPECT_NE(alone.output.find("one data-parallel process, nothing to send: -gc sign runs as -gc none"), std::string::npos);
}

// PowerSGD's step on one process against its definition, worked out in double here: with R = 1 and q0 the
// matrix's first Q, p = M q0 and p^ = p / |p|, the sent gradient is p^ p^^T M (M projected on p^), the
// residual M less it and the new Q = M^T p^. A matrix of rank 2 at R = 2 comes through whole (residual ~0).
// Single precision against double: 1e-6 relative to the matrix's largest element.
TEST(PowerSgd, OneStepIsTheProjectionOnMq) {
    const size_t rows = 6, cols = 4;
    std::vector<float> m(rows * cols);
    for (size_t i = 0; i < m.size(); i++) m[i] = std::sin(0.7f * (float)i + 0.3f) * (1.0f + (float)(i % 3));
    std::vector<OptimizerTensor> tensors = {{P_QKVW, 0, 0, rows, cols, 0}};
    PowerSgd ps = powersgd_init(tensors, rows * cols, 1);
    ASSERT_EQ(ps.matrices.size(), 1u);
    std::vector<float> q0 = ps.q, g = m;
    powersgd_reduce(ProcessGroup(), &ps, g.data());
    std::vector<double> p(rows, 0.0);
    double norm = 0.0;
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) p[r] += (double)m[r * cols + c] * q0[c];
        norm += p[r] * p[r];
    }
    for (double& x : p) x /= std::sqrt(norm);
    for (size_t c = 0; c < cols; c++) {
        double q = 0.0;
        for (size_t r = 0; r < rows; r++) q += (double)m[r * cols + c] * p[r];
        EXPECT_NEAR(ps.q[c], q, 1e-6 * 3) << "Q " << c;
        for (size_t r = 0; r < rows; r++) {
            EXPECT_NEAR(g[r * cols + c], p[r] * q, 1e-6 * 3) << r << "," << c;
            EXPECT_NEAR(ps.residual[r * cols + c], m[r * cols + c] - p[r] * q, 1e-6 * 3) << r << "," << c;
        }
    }
    // rank 2: m = a b^T + c d^T
    std::vector<float> two(rows * cols);
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) two[r * cols + c] = (float)(r + 1) * (float)(c % 3) - 0.5f * (float)(r % 2) * (float)(c + 2);
    }
    PowerSgd ps2 = powersgd_init({{P_QKVW, 0, 0, rows, cols, 0}}, rows * cols, 2);
    std::vector<float> g2 = two;
    powersgd_reduce(ProcessGroup(), &ps2, g2.data());
    for (size_t i = 0; i < two.size(); i++) {
        EXPECT_NEAR(g2[i], two[i], 1e-5) << i;
        EXPECT_NEAR(ps2.residual[i], 0.0f, 1e-5) << i;
    }
}

// Gram-Schmidt leaves orthonormal columns spanning the same space, and a column with nothing of its own
// left (a copy of an earlier one) becomes 0.
TEST(PowerSgd, OrthonormalColumns) {
    const size_t rows = 50;
    const int R = 3;
    std::vector<float> p(rows * R);
    for (size_t i = 0; i < rows; i++) {
        p[i * R] = std::cos((float)i), p[i * R + 1] = 1.0f + 0.01f * (float)i, p[i * R + 2] = 2.0f * std::cos((float)i);
    }
    powersgd_orthonormalize(p.data(), rows, R);
    double d00 = 0, d01 = 0, d11 = 0, d22 = 0;
    for (size_t i = 0; i < rows; i++) {
        d00 += p[i * R] * p[i * R], d01 += p[i * R] * p[i * R + 1], d11 += p[i * R + 1] * p[i * R + 1];
        d22 += std::fabs(p[i * R + 2]);
    }
    EXPECT_NEAR(d00, 1.0, 1e-6);
    EXPECT_NEAR(d11, 1.0, 1e-6);
    EXPECT_NEAR(d01, 0.0, 1e-6);
    EXPECT_LT(d22, 1e-4) << "the third column is twice the first: nothing left";
}

// Error feedback over 30 steps on one process: the sent gradients plus the last residual add up to the
// true ones (fp32 rounding of values of order 1 over 30 steps: 1e-4), where the sent ones alone miss by
// O(1) (rank 1 of a 40 x 30 matrix); a vector is sent exactly.
TEST(PowerSgd, ErrorFeedbackSumsToTheTrueGradients) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t rows = 40, cols = 30, n = rows * cols + 30;
    std::vector<OptimizerTensor> tensors = {{P_FCW, 0, 0, rows, cols, 0}, {P_FCB, 0, rows * cols, 1, 30, 0}};
    PowerSgd ps = powersgd_init(tensors, n, 1);
    std::vector<double> sum_g(n, 0.0), sum_q(n, 0.0);
    for (int step = 0; step < 30; step++) {
        std::vector<float> g(n);
        for (float& x : g) x = normal(rng);
        for (size_t i = 0; i < n; i++) sum_g[i] += g[i];
        powersgd_reduce(ProcessGroup(), &ps, g.data());
        for (size_t i = 0; i < n; i++) sum_q[i] += g[i];
    }
    double worst = 0, without = 0, vector = 0;
    for (size_t i = 0; i < n; i++) {
        worst = std::max(worst, std::fabs(sum_q[i] + ps.residual[i] - sum_g[i]));
        without = std::max(without, std::fabs(sum_q[i] - sum_g[i]));
        if (i >= rows * cols) vector = std::max(vector, std::fabs(sum_q[i] - sum_g[i]));
    }
    EXPECT_LT(worst, 1e-4);
    EXPECT_GT(without, 1.0);
    EXPECT_LT(vector, 1e-5) << "the vector is summed exactly";
}

// 2 processes, -gc powersgd -gr 2, 5 steps of the tiny model against the oracle (gpt2_oracle.py
// --powersgd: each process's gradient share compressed by the definition with torch's QR, in float64):
// losses and gradient norms to 1e-5 relative and parameters to 1e-2 of the distance moved (AdamW's bars,
// test_model.cpp; the compression's own rounding is fp32's, far below). Bytes a step: the two all-reduces,
// of sum (rows R) + the exact elements and of sum (cols R) floats, from the tiny model's shapes here. Both
// processes keep their own residuals and the same Q; resumed from step 3 the run ends with the same bits.
TEST(PowerSgd, TwoProcessesFollowTheOracleAndResumeBitForBit) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    OptimizerRun run{"adamw", 1e-3, 0.02};
    std::string launch = "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 ";
    std::string oracle_dir = test::oracle("powersgd_r2", std::string(OPTIMIZER_TINY) + run.oracle_args(2) + " --powersgd 2");
    std::string dir = test::scratch_dir("powersgd"), b = test::scratch_dir("powersgd_resumed");
    test::CommandResult r = test::run_command(launch + run.trainer_args(oracle_dir, 2) + " -gc powersgd -gr 2 -n 1 -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("gradient compression: -gc powersgd -gr 2, 10 matrices as rank-2 factors, 18 tensors summed exactly"),
              std::string::npos) << r.output;
    Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
    expect_agreement(a, 1e-5, 1e-5, 1e-2);
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(oracle_dir + "/model.bin", &cfg, &params);
    size_t p_length = 0, q_length = 0;
    for (const OptimizerTensor& t : optimizer_tensors(cfg)) {
        bool factored = t.rows > 1 && (t.rows + t.cols) * 2 < t.rows * t.cols;
        p_length += factored ? t.rows * 2 : t.size();
        q_length += factored ? t.cols * 2 : 0;
    }
    double bytes = 2.0 * 2.0 * (p_length - p_length / 2) * 4 + 2.0 * 2.0 * (q_length - q_length / 2) * 4;
    ASSERT_EQ(a.comm_bytes.size(), 5u);
    for (int s = 0; s < 5; s++) EXPECT_EQ(a.comm_bytes[s], bytes) << "step " << s;
    double all_reduce = 2.0 * 2.0 * (params.size() - params.size() / 2) * 4;
    printf("  bytes a step: %.0f, the all-reduce's %.0f (%.1f%%)\n", bytes, all_reduce, 100.0 * bytes / all_reduce);
    EXPECT_LE(bytes, all_reduce / 4);
    TrainState s0, s1;
    state_file_read(dir + "/state_00000003_00000.bin", &s0);
    state_file_read(dir + "/state_00000003_00001.bin", &s1);
    ASSERT_EQ(s0.sections.size(), 2u);
    ASSERT_EQ(s1.sections.size(), 2u);
    EXPECT_EQ(s0.sections[0].kind, STATE_SECTION_ERROR_FEEDBACK);
    EXPECT_EQ(s0.sections[1].kind, STATE_SECTION_POWERSGD);
    EXPECT_NE(s0.sections[0].bytes, s1.sections[0].bytes) << "each process's own residuals";
    EXPECT_EQ(s0.sections[1].bytes, s1.sections[1].bytes) << "one Q";
    EXPECT_EQ(s0.sections[1].bytes.size(), q_length * sizeof(float));
    test::expect_resume_from_step_3_same_bits(launch + run.trainer_args(oracle_dir, 2) + " -gc powersgd -gr 2 -n 1", dir, b);
    // another rank: the residuals carry over, Q starts afresh; -gc sign drops both (its own state is h and H)
    test::CommandResult other = test::run_command(launch + run.trainer_args(oracle_dir, 2) + " -gc powersgd -gr 1 -y 1 -o " + b);
    EXPECT_EQ(other.exit_code, 0) << other.output;
    EXPECT_NE(other.output.find("PowerSGD factors are of another -gr"), std::string::npos) << other.output;
    test::CommandResult sign = test::run_command(launch + run.trainer_args(oracle_dir, 2) + " -gc sign -y 1 -o " + b);
    EXPECT_EQ(sign.exit_code, 0) << sign.output;
    EXPECT_NE(sign.output.find("holds -gc powersgd's PowerSGD's factors; this run has no -gc powersgd and drops them"),
              std::string::npos) << sign.output;
    EXPECT_NE(sign.output.find("holds -gc powersgd's error-feedback residuals; this run has no -gc powersgd and drops them"),
              std::string::npos) << sign.output;
    EXPECT_NE(sign.output.find("no sign-compression estimates (written without -gc sign): they start at 0"), std::string::npos)
        << sign.output;
}

// The outer step by hand: anchor 1, two replicas at 0.5 and 0.7 (delta_sum 0.5 + 0.3 = 0.8, d = 0.4).
// Mean: 1 - 0.4 = 0.6, the replicas' mean. Nesterov from u = 0.1: u = 0.09 + 0.4 = 0.49, then
// theta = 1 - 0.7 (0.4 + 0.9 * 0.49) = 0.4113. Single precision: one rounding per operation, 1e-6.
TEST(LocalSteps, OuterStepByHand) {
    float u = 0.0f;
    EXPECT_NEAR(outer_element(1.0f, 0.8f, 0.5f, &u, false), 0.6f, 1e-6);
    EXPECT_EQ(u, 0.0f) << "-lo 0 keeps no momentum";
    u = 0.1f;
    EXPECT_NEAR(outer_element(1.0f, 0.8f, 0.5f, &u, true), 0.4113f, 1e-6);
    EXPECT_NEAR(u, 0.49f, 1e-6);
    LocalSteps ls;
    ls.every = 4;
    EXPECT_FALSE(local_steps_sync_due(ls, 2, false));
    EXPECT_TRUE(local_steps_sync_due(ls, 3, false)) << "after 4 updates (steps 0..3)";
    EXPECT_TRUE(local_steps_sync_due(ls, 5, true)) << "after the run's last";
}

// 2 processes, -lh 2, 5 steps of the tiny model against the oracle's replicas (gpt2_oracle.py
// --local-steps: two AdamW replicas on the micro-batches the data loader gives each process, averaged
// after steps 2, 4 and 5), for both outer steps: the losses (the replicas' mean) and process 0's gradient
// norms to 1e-5 relative and the final parameters to 1e-2 of the distance each tensor moved, AdamW's bars
// (test_model.cpp: fp32 rounding against float64, measured <= 1e-7 and 5e-4). Bytes: the parameters'
// all-reduce, 2 x 2 (N - N/2) x 4, after steps 2, 4 and 5, nothing on the others. Then the -lo 1 run
// resumed from step 3, where the replicas differ, ends with the uninterrupted run's bits.
TEST(LocalSteps, TwoReplicasFollowTheOracleAndResumeBitForBit) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    OptimizerRun run{"adamw", 1e-3, 0.02};
    std::string launch = "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 ";
    for (std::string outer : {"nesterov", "mean"}) {
        SCOPED_TRACE(outer);
        std::string oracle_dir = test::oracle("local_steps_" + outer, std::string(OPTIMIZER_TINY) + run.oracle_args(2) +
                                              " --local-steps 2 --outer " + outer);
        std::string dir = test::scratch_dir("lh_" + outer);
        std::string flags = " -lh 2 -lo " + std::string(outer == "nesterov" ? "1" : "0") + " -n 1 -o " + dir;
        test::CommandResult r = test::run_command(launch + run.trainer_args(oracle_dir, 2) + flags);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("local steps: -lh 2, each replica alone for 2 steps"), std::string::npos) << r.output;
        Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
        expect_agreement(a, 1e-5, 1e-5, 1e-2);
        std::vector<float> params;
        GPT2Config cfg;
        model_file_read(oracle_dir + "/model.bin", &cfg, &params);
        double sync = 2.0 * 2.0 * (double)(params.size() - params.size() / 2) * 4;
        ASSERT_EQ(a.comm_bytes.size(), 5u);
        for (int s = 0; s < 5; s++) EXPECT_EQ(a.comm_bytes[s], s == 1 || s == 3 || s == 4 ? sync : 0.0) << "step " << s;
        // step 3: the replicas differ, the anchors do not
        TrainState s0, s1;
        state_file_read(dir + "/state_00000003_00000.bin", &s0);
        state_file_read(dir + "/state_00000003_00001.bin", &s1);
        ASSERT_EQ(s0.sections.size(), 1u);
        ASSERT_EQ(s1.sections.size(), 1u);
        ASSERT_EQ(s0.sections[0].kind, STATE_SECTION_LOCAL_STEPS);
        size_t n = params.size() * sizeof(float);
        const std::vector<uint8_t> &b0 = s0.sections[0].bytes, &b1 = s1.sections[0].bytes;
        ASSERT_EQ(b0.size(), 3 * n);
        EXPECT_NE(std::vector<uint8_t>(b0.begin(), b0.begin() + n), std::vector<uint8_t>(b1.begin(), b1.begin() + n));
        EXPECT_EQ(std::vector<uint8_t>(b0.begin() + n, b0.end()), std::vector<uint8_t>(b1.begin() + n, b1.end()));
        EXPECT_NE(s0.m, s1.m) << "each replica's own moments";
        if (outer != "nesterov") continue;
        std::string b = test::scratch_dir("lh_resumed");
        test::expect_resume_from_step_3_same_bits(launch + run.trainer_args(oracle_dir, 2) + " -lh 2 -n 1", dir, b);
        // the state is each process's: another process count is refused; a run without -lh drops it (its
        // processes take process 0's replica: the model file, and process 0's moments)
        std::string launch4 = "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 4 ";
        test::CommandResult other = test::run_command(launch4 + run.trainer_args(oracle_dir, 2) + " -b 1 -lh 2 -y 1 -o " + b);
        EXPECT_NE(other.exit_code, 0);
        EXPECT_NE(other.output.find("holds the local steps' state of 2 processes, each its own; this run has 4: resume -lh"),
                  std::string::npos) << other.output;
        test::CommandResult dropped = test::run_command(launch + run.trainer_args(oracle_dir, 2) + " -y 1 -o " + b);
        EXPECT_EQ(dropped.exit_code, 0) << dropped.output;
        EXPECT_NE(dropped.output.find("holds -lh's local steps' state; this run has no -lh and drops them"), std::string::npos)
            << dropped.output;
    }
}

// What -lh cannot run with, refused with the reason (the CUDA trainer's -oo 1 too: its master weights are on the
// host); one data-parallel process runs every step.
TEST(LocalSteps, RefusedWhereItCannotRun) {
    std::string dir = tiny_dir();
    std::string one = test::root() + "/train_gpt2 -e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -v 0 -s 0 -x 1 ";
    for (std::string flags : {"-lh 2 -z 1", "-lh 2 -opt muon", "-lh 2 -gc sign"}) {
        test::CommandResult r = test::run_command(one + flags);
        EXPECT_EQ(r.exit_code, 1) << flags;
        EXPECT_NE(r.output.find("flag -lh 2: local steps train whole replicas alone: they run with -z 0, -opt adamw and no -tp, "
                                "-pp, -gc or -cf llmc"), std::string::npos) << r.output;
    }
    std::vector<std::string> words = {"train", "-lh", "4", "-oo", "1"};
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(&w[0]);
    TrainArgs args;
    EXPECT_EXIT(parse_args((int)argv.size(), argv.data(), &args, true), testing::ExitedWithCode(1),
                "flag -lh 4 with -oo 1: the synchronization runs on the GPU's master weights");
    test::CommandResult alone = test::run_command(one + "-lh 4 -o " + test::scratch_dir("lh_alone"));
    EXPECT_EQ(alone.exit_code, 0) << alone.output;
    EXPECT_NE(alone.output.find("one data-parallel process, nothing to synchronize: -lh 4 runs as every step"), std::string::npos);
}

}  // namespace
