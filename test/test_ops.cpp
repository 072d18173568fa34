// Each CPU op's forward and backward, checked without any other implementation:
//  - the backward against central finite differences of the forward, both run in float64 (the ops
//    are templates over the scalar type, so this is the very code the trainer runs in fp32);
//  - the fp32 forward against the float64 forward at GPT-2 small's widths.
// The objective for an op y = f(x) is J = sum(y * w) with random w, so dJ/dy = w is the dout we pass.
#include <algorithm>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "../llmc/adamw.h"
#include "../llmc/attention.h"
#include "../llmc/run/cpu_peak.h"
#include "../llmc/run/phase_timer.h"
#include "../llmc/crossentropy.h"
#include "../llmc/encoder.h"
#include "../llmc/expf.h"
#include "../llmc/gelu.h"
#include "../llmc/layernorm.h"
#include "../llmc/matmul.h"
#include "../llmc/residual.h"
#include "test_helpers.h"

namespace {

using Vec = std::vector<double>;

// Uniform in [-1, 1): a zero is vanishingly unlikely, so no gradient is trivially right.
Vec random_vec(size_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Vec v(n);
    for (double& x : v) x = dist(rng);
    return v;
}

std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

double dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
    return s;
}

// Compares `analytic` = dJ/dx with central differences (J(x + h) - J(x - h)) / 2h, h = 1e-5, for every
// element of x. In float64 the truncation error is O(h^2 f''') ~ 1e-10 and the rounding error
// ~ 1e-16 |J| / h ~ 1e-11 |J|, so 1e-7 of the tensor's largest gradient is a safe yet tight bound:
// any real mistake in a backward formula is orders of magnitude larger.
void expect_gradient(const char* name, Vec& x, const Vec& analytic, const std::function<double()>& objective) {
    ASSERT_EQ(x.size(), analytic.size());
    const double h = 1e-5;
    double scale = 0;
    for (double g : analytic) scale = std::max(scale, std::fabs(g));
    double worst = 0;
    for (size_t i = 0; i < x.size(); i++) {
        double saved = x[i];
        x[i] = saved + h;
        double plus = objective();
        x[i] = saved - h;
        double minus = objective();
        x[i] = saved;
        worst = std::max(worst, std::fabs((plus - minus) / (2 * h) - analytic[i]));
    }
    EXPECT_LE(worst, 1e-7 * std::max(scale, 1e-3)) << name << ": finite differences disagree with the backward";
}

// fp32 result vs float64 result of the same op, relative to the largest value. fp32 rounds at 6e-8;
// the ops sum at most a few thousand terms (matmul over C = 3072), which grows the error to ~1e-6
// at worst, so 1e-5 leaves a margin while still catching precision loss (e.g. a float sum of
// squares in layernorm over large offsets).
void expect_fp32_close(const char* name, const std::vector<float>& got, const Vec& want) {
    ASSERT_EQ(got.size(), want.size());
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < got.size(); i++) {
        max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
        max_ref = std::max(max_ref, std::fabs(want[i]));
    }
    EXPECT_LE(max_diff, 1e-5 * max_ref) << name;
}

TEST(OpsGradient, Encoder) {
    std::mt19937 rng(1);
    int B = 2, T = 3, C = 4, V = 5;
    std::vector<int> inp = {0, 3, 3, 1, 3, 4};  // token 3 repeats: its row must sum three gradients
    Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), w = random_vec(B * T * C, rng);
    Vec out(B * T * C);
    auto objective = [&]() {
        encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
        return dot(out, w);
    };
    Vec dwte(V * C, 0.0), dwpe(T * C, 0.0);
    encoder_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C);
    expect_gradient("dwte", wte, dwte, objective);
    expect_gradient("dwpe", wpe, dwpe, objective);
}

TEST(OpsGradient, LayerNorm) {
    std::mt19937 rng(2);
    int N = 6, C = 8;
    Vec inp = random_vec(N * C, rng, -2, 3), weight = random_vec(C, rng), bias = random_vec(C, rng), w = random_vec(N * C, rng);
    Vec out(N * C), mean(N), rstd(N);
    auto objective = [&]() {
        layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
        return dot(out, w);
    };
    objective();
    Vec dinp(N * C, 0.0), dweight(C, 0.0), dbias(C, 0.0);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), mean.data(),
                       rstd.data(), N, C);
    expect_gradient("dinp", inp, dinp, objective);
    expect_gradient("dweight", weight, dweight, objective);
    expect_gradient("dbias", bias, dbias, objective);
}

TEST(OpsGradient, Matmul) {
    std::mt19937 rng(3);
    int N = 7, C = 13, OC = 19;  // not multiples of the micro-tile, so the edge tiles are exercised
    Vec inp = random_vec(N * C, rng), weight = random_vec(OC * C, rng), bias = random_vec(OC, rng), w = random_vec(N * OC, rng);
    Vec out(N * OC);
    auto objective = [&]() {
        matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
        return dot(out, w);
    };
    Vec dinp(N * C, 0.0), dweight(OC * C, 0.0), dbias(OC, 0.0);
    matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), N, C, OC);
    expect_gradient("dinp", inp, dinp, objective);
    expect_gradient("dweight", weight, dweight, objective);
    expect_gradient("dbias", bias, dbias, objective);
}

TEST(OpsGradient, Attention) {
    std::mt19937 rng(4);
    int B = 2, T = 5, C = 8, NH = 2;
    Vec qkv = random_vec(B * T * 3 * C, rng, -2, 2), w = random_vec(B * T * C, rng);
    Vec out(B * T * C), att(B * NH * T * T);
    auto objective = [&]() {
        attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
        return dot(out, w);
    };
    objective();
    Vec dqkv(B * T * 3 * C, 0.0);
    attention_backward(dqkv.data(), w.data(), qkv.data(), att.data(), B, T, C, NH);
    expect_gradient("dqkv", qkv, dqkv, objective);
    // causality: changing a later position's k or v must not change an earlier output
    Vec before = out;
    qkv[((size_t)0 * T + 4) * 3 * C + C + 1] += 0.5;      // k at t = 4, batch 0
    qkv[((size_t)0 * T + 4) * 3 * C + 2 * C + 1] += 0.5;  // v at t = 4
    objective();
    for (int t = 0; t < 4; t++) {
        for (int c = 0; c < C; c++) EXPECT_EQ(out[t * C + c], before[t * C + c]) << "t=" << t;
    }
}

TEST(OpsGradient, Gelu) {
    std::mt19937 rng(5);
    size_t N = 40;
    Vec inp = random_vec(N, rng, -4, 4), w = random_vec(N, rng), out(N);
    auto objective = [&]() {
        gelu_forward(out.data(), inp.data(), N);
        return dot(out, w);
    };
    Vec dinp(N, 0.0);
    gelu_backward(dinp.data(), inp.data(), w.data(), N);
    expect_gradient("dinp", inp, dinp, objective);
}

// The fp32 GELU computes tanh from its own vectorizable exp (llmc/gelu.h); the float64 instantiation
// above uses std::tanh, so this checks the fp32 path itself. GELU needs tanh's absolute error small
// (it uses 1 + tanh and 1 - tanh^2): measured 9e-8 over [-12, 12]; we allow 2e-7, about 2 float ulps
// at 1. The fp32 backward is checked against its float64 formula on the same inputs.
TEST(OpsGelu, Fp32TanhAndBackwardMatchFloat64) {
    double worst = 0;
    for (double u = -12.0; u <= 12.0; u += 1e-4) {
        float uf = (float)u;
        worst = std::max(worst, std::fabs((double)gelu_tanh(uf) - std::tanh((double)uf)));
    }
    EXPECT_LE(worst, 2e-7);
    std::mt19937 rng(10);
    size_t N = 4096;
    Vec inp = random_vec(N, rng, -6, 6), dout = random_vec(N, rng), dinp(N, 0.0);
    std::vector<float> dinp_f(N, 0.0f);
    gelu_backward(dinp.data(), inp.data(), dout.data(), N);
    gelu_backward(dinp_f.data(), to_float(inp).data(), to_float(dout).data(), N);
    expect_fp32_close("gelu backward", dinp_f, dinp);
}

TEST(OpsGradient, CrossEntropyOverFirstVLogits) {
    std::mt19937 rng(6);
    int N = 4, V = 10, Vp = 16;
    Vec logits = random_vec(N * Vp, rng, -3, 3);
    std::vector<int> targets = {0, 9, 4, 4};
    double dloss = 0.37;
    Vec losses(N);
    auto objective = [&]() {
        crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
        double s = 0;
        for (double l : losses) s += l;
        return s * dloss;
    };
    Vec dlogits(N * Vp, 99.0);  // poisoned: the backward must overwrite every element
    crossentropy_softmax_backward(dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);
    expect_gradient("dlogits", logits, dlogits, objective);
    for (int n = 0; n < N; n++) {
        for (int v = V; v < Vp; v++) EXPECT_EQ(dlogits[n * Vp + v], 0.0) << "padded column " << v;
    }
    // the loss is -log softmax: check one row against the definition directly
    objective();
    double sum = 0;
    for (int v = 0; v < V; v++) sum += std::exp(logits[v]);
    EXPECT_NEAR(losses[0], std::log(sum) - logits[targets[0]], 1e-12);
}

// The training step's fused path (exponentials kept by the forward, scaled by the backward) must give
// the same bits as the recomputing backward, and the same losses as the plain forward: the step's
// numerics may not depend on which path ran. fp32 at GPT-2's vocabulary width, a poisoned buffer.
TEST(OpsCrossEntropy, KeptExponentialsGiveTheRecomputedGradientBitForBit) {
    std::mt19937 rng(16);
    int N = 5, V = 50257, Vp = 50304;
    std::vector<float> logits(N * (size_t)Vp);
    std::uniform_real_distribution<float> u(-8.0f, 8.0f);
    for (float& x : logits) x = u(rng);
    std::vector<int> targets = {0, 50256, 17, 17, 31337};
    float dloss = 1.0f / 3.0f;
    std::vector<float> losses(N), losses_fused(N, -1.0f);
    std::vector<float> dlogits(N * (size_t)Vp, 99.0f), fused(N * (size_t)Vp, 99.0f);
    std::vector<double> sums(N, -1.0);
    crossentropy_forward(losses.data(), logits.data(), targets.data(), N, V, Vp);
    crossentropy_softmax_backward(dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);
    crossentropy_forward_keep_exps(losses_fused.data(), fused.data(), sums.data(), logits.data(), targets.data(), N, V, Vp);
    crossentropy_backward_from_exps(fused.data(), sums.data(), targets.data(), dloss, N, V, Vp);
    EXPECT_EQ(0, memcmp(losses.data(), losses_fused.data(), N * sizeof(float)));
    EXPECT_EQ(0, memcmp(dlogits.data(), fused.data(), dlogits.size() * sizeof(float)));
    for (int n = 0; n < N; n++) {
        EXPECT_EQ(fused[(size_t)n * Vp + V], 0.0f) << "padded column of row " << n;
        EXPECT_LT(fused[(size_t)n * Vp + targets[n]], 0.0f) << "target column of row " << n;
    }
}

// row_max's eight lanes must find the scalar loop's maximum (`v > m ? v : m` from element 0): NaN
// skipped past element 0 and kept at element 0, infinities, and every width around the vector's 8. A
// tie between -0 and +0 may pick either zero (the loss and the exponentials do not see the sign), so
// values are compared with ==, and NaN by being NaN.
TEST(OpsCrossEntropy, RowMaxIsTheScalarLoopsMaximum) {
    std::mt19937 rng(61);
    std::uniform_real_distribution<float> u(-30.0f, 30.0f);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    int checked = 0;
    for (int V : {1, 2, 7, 8, 9, 15, 16, 17, 31, 64, 100, 50257}) {
        for (int poison = 0; poison < 7; poison++) {
            std::vector<float> row(V);
            for (float& x : row) x = u(rng);
            int at = (int)(rng() % V);
            if (poison == 1) row[at] = nan;             // NaN somewhere (maybe element 0)
            if (poison == 2) row[0] = nan;              // NaN first: the scalar loop's result is NaN
            if (poison == 3) row[at] = inf;
            if (poison == 4) row[at] = -inf;
            if (poison == 5) row[at] = 1e30f, row[V - 1] = 1e30f;  // the largest value twice
            if (poison == 6) {                          // all negative but zeros of both signs
                for (float& x : row) x = -std::fabs(x) - 1.0f;
                row[at] = -0.0f, row[(at + 5) % V] = 0.0f;
            }
            float expected = row[0];
            for (int v = 1; v < V; v++) expected = row[v] > expected ? row[v] : expected;
            float got = row_max(row.data(), V);
            if (std::isnan(expected)) {
                EXPECT_TRUE(std::isnan(got)) << "V " << V << " case " << poison;
            } else {
                EXPECT_EQ(got, expected) << "V " << V << " case " << poison;
            }
            checked++;
        }
    }
    EXPECT_EQ(checked, 12 * 7);
}

// exp_and_sum (llmc/expf.h) gives each exponential the bits of the C library's expf and the sum of
// the same double additions in the same order: checked on every 61st float bit pattern (70 million
// values of every sign, size and class: subnormal, inf, nan, the |x| >= 88 special cases) minus a
// shift, row lengths that are not multiples of 8, in place and with no output kept. The one-time
// check over all 2^32 floats with |x| < 88 found no difference either (doc/cpu_trainer.md).
TEST(OpsExp, EightAtATimeHasTheBitsOfStdExp) {
#if !(defined(__AVX2__) && defined(__FMA__))
    GTEST_SKIP() << "built without AVX2+FMA: exp_and_sum is std::exp itself";
#else
    // the table's entries are 2^(i/32)'s double bits less i << 47
    for (int i = 0; i < 32; i++) {
        double two = std::exp2(i / 32.0);
        uint64_t bits;
        memcpy(&bits, &two, sizeof(bits));
        EXPECT_EQ(EXPF_TABLE[i], bits - ((uint64_t)i << 47)) << i;
    }
    const int n = 1 << 20;
    std::vector<float> x(n + 5), out(n + 5), in_place(n + 5);
    long differ = 0, sums_differ = 0;
    uint64_t pattern = 0;
    for (int round = 0; pattern < (1ull << 32); round++) {
        int len = n + round % 6;  // tails of 0..5 past a multiple of 8
        for (int i = 0; i < len; i++, pattern += 61) {
            uint32_t u = (uint32_t)pattern;
            memcpy(&x[i], &u, sizeof(u));
        }
        float shift = round % 2 ? 0.0f : 1.5f;
        double sum = exp_and_sum(out.data(), x.data(), shift, len);
        in_place = x;
        double sum_in_place = exp_and_sum(in_place.data(), in_place.data(), shift, len);
        double sum_none = exp_and_sum((float*)nullptr, x.data(), shift, len);
        double expect_sum = 0.0;
        for (int i = 0; i < len; i++) {
            float expect = std::exp(x[i] - shift);
            differ += memcmp(&expect, &out[i], sizeof(float)) != 0;
            differ += memcmp(&expect, &in_place[i], sizeof(float)) != 0;
            expect_sum += expect;
        }
        // a NaN sum is compared as NaN: which operand's payload an addition of two NaNs keeps is the
        // compiler's operand order (at -O2 6 of these sums kept the other NaN's bits)
        for (double s : {sum, sum_in_place, sum_none})
            sums_differ += std::isnan(expect_sum) ? !std::isnan(s) : memcmp(&s, &expect_sum, sizeof(double)) != 0;
    }
    EXPECT_EQ(differ, 0);
    EXPECT_EQ(sums_differ, 0);
#endif
}

TEST(OpsGradient, ResidualAddsIntoBothBranches) {
    Vec da = {1, 2}, db = {3, 4}, dout = {0.5, -0.5};
    residual_backward(da.data(), db.data(), dout.data(), 2);
    EXPECT_EQ(da, (Vec{1.5, 1.5}));
    EXPECT_EQ(db, (Vec{3.5, 3.5}));
}

TEST(OpsFp32, ForwardMatchesFloat64AtGpt2SmallWidths) {
    std::mt19937 rng(7);
    int N = 64, C = 768, OC = 3072, B = 1, T = 64, NH = 12;
    Vec inp = random_vec(N * C, rng, -3, 3), weight = random_vec(OC * C, rng, -0.05, 0.05), bias = random_vec(OC, rng);
    // matmul
    Vec out(N * OC);
    std::vector<float> out_f(N * OC);
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    matmul_forward(out_f.data(), to_float(inp).data(), to_float(weight).data(), to_float(bias).data(), N, C, OC);
    expect_fp32_close("matmul", out_f, out);
    // layernorm, on inputs with a large common offset (a float sum of squares would lose digits)
    Vec shifted = inp;
    for (double& x : shifted) x += 100.0;
    Vec ln(N * C), mean(N), rstd(N), lw = random_vec(C, rng), lb = random_vec(C, rng);
    std::vector<float> ln_f(N * C), mean_f(N), rstd_f(N);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), shifted.data(), lw.data(), lb.data(), N, C);
    layernorm_forward(ln_f.data(), mean_f.data(), rstd_f.data(), to_float(shifted).data(), to_float(lw).data(),
                      to_float(lb).data(), N, C);
    expect_fp32_close("layernorm", ln_f, ln);
    // attention
    Vec qkv = random_vec(B * T * 3 * C, rng, -1, 1), att_out(B * T * C), att(B * NH * T * T);
    std::vector<float> att_out_f(B * T * C), att_f(B * NH * T * T);
    attention_forward(att_out.data(), att.data(), qkv.data(), B, T, C, NH);
    attention_forward(att_out_f.data(), att_f.data(), to_float(qkv).data(), B, T, C, NH);
    expect_fp32_close("attention", att_out_f, att_out);
    // gelu
    Vec g(N * C);
    std::vector<float> g_f(N * C);
    gelu_forward(g.data(), inp.data(), g.size());
    gelu_forward(g_f.data(), to_float(inp).data(), g_f.size());
    expect_fp32_close("gelu", g_f, g);
    // cross-entropy over GPT-2's vocabulary
    int V = 50257, Vp = 50304, rows = 4;
    Vec logits = random_vec((size_t)rows * Vp, rng, -10, 10), losses(rows);
    std::vector<float> losses_f(rows);
    std::vector<int> targets = {0, 50256, 123, 4567};
    crossentropy_forward(losses.data(), logits.data(), targets.data(), rows, V, Vp);
    crossentropy_forward(losses_f.data(), to_float(logits).data(), targets.data(), rows, V, Vp);
    expect_fp32_close("crossentropy", losses_f, losses);
}

// The blocked GEMM against a plain triple loop, on shapes that span several K slabs (KC = 256),
// several N blocks (NC = 1024) and ragged edges, in each of the three stride layouts a Linear uses.
TEST(OpsMatmul, BlockedGemmMatchesNaiveAcrossBlocks) {
    std::mt19937 rng(8);
    int M = 37, K = 600, N = 1100;
    std::vector<float> a = to_float(random_vec((size_t)M * K, rng)), b = to_float(random_vec((size_t)K * N, rng));
    for (int layout = 0; layout < 3; layout++) {
        // layout 0: A row-major, B row-major; 1: B transposed; 2: A transposed
        MatrixView<float> A = layout == 2 ? MatrixView<float>{a.data(), 1, (size_t)M} : MatrixView<float>{a.data(), (size_t)K, 1};
        MatrixView<float> Bv = layout == 1 ? MatrixView<float>{b.data(), 1, (size_t)K} : MatrixView<float>{b.data(), (size_t)N, 1};
        std::vector<float> c((size_t)M * N, 1.0f);  // gemm accumulates onto what is there
        gemm_accumulate(c.data(), N, A, Bv, M, N, K);
        double worst = 0;
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
                double s = 1.0;
                for (int k = 0; k < K; k++) s += (double)A.at(i, k) * Bv.at(k, j);
                worst = std::max(worst, std::fabs(s - c[(size_t)i * N + j]));
            }
        }
        // |terms| <= 1 and K = 600: fp32 accumulation error is bounded by ~K * 6e-8 = 4e-5 in the worst case
        EXPECT_LE(worst, 4e-5) << "layout " << layout;
    }
}

// The fp32 fast paths of gemm_accumulate (AVX2 micro-kernel, 8×8-transpose packing) against a plain
// float64 triple loop, on shapes chosen to hit every edge: M, N and K each below, at and just past a
// multiple of the tile (MR = 6, NR = 16), the transposes' 8 and the blocks (KC = 256, MC = 144), for
// both thread splits (N >= M splits columns, M > N rows), through both ways of packing (a thread with
// at most GEMM_MC_PANELS = 288 rows packs B in narrow groups, one with more in KC×NC blocks), and with
// 1 and 2 threads, which must give bit-identical results (each C element is summed in the same order
// whatever the split).
TEST(OpsMatmul, Fp32FastPathsMatchNaiveOnEdgeShapes) {
    std::mt19937 rng(16);
    const int shapes[][3] = {// M, N, K
                             {1, 1, 1},   {5, 15, 7},    {6, 16, 8},    {7, 17, 9},     {12, 33, 257},
                             {145, 40, 300}, {40, 145, 513}, {150, 3, 20}, {3, 150, 20}, {13, 16 * 3 + 1, 8 * 5 + 3},
                             {300, 320, 40}, {700, 40, 20}, {289, 290, 9}};
    int threads_before = omp_get_max_threads();
    for (const auto& shape : shapes) {
        int M = shape[0], N = shape[1], K = shape[2];
        std::vector<float> a = to_float(random_vec((size_t)M * K, rng)), b = to_float(random_vec((size_t)K * N, rng));
        std::vector<float> c0 = to_float(random_vec((size_t)M * N, rng));
        for (int layout = 0; layout < 3; layout++) {
            // 0: A, B row-major (dinp); 1: B transposed (forward: B = Wᵀ); 2: A transposed (dW: A = doutᵀ)
            MatrixView<float> A = layout == 2 ? MatrixView<float>{a.data(), 1, (size_t)M} : MatrixView<float>{a.data(), (size_t)K, 1};
            MatrixView<float> Bv = layout == 1 ? MatrixView<float>{b.data(), 1, (size_t)K} : MatrixView<float>{b.data(), (size_t)N, 1};
            std::vector<float> results[2];
            for (int threads = 1; threads <= 2; threads++) {
                omp_set_num_threads(threads);
                results[threads - 1] = c0;
                gemm_accumulate(results[threads - 1].data(), N, A, Bv, M, N, K);
            }
            double worst = 0;
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    double s = c0[(size_t)i * N + j];
                    for (int k = 0; k < K; k++) s += (double)A.at(i, k) * Bv.at(k, j);
                    worst = std::max(worst, std::fabs(s - results[0][(size_t)i * N + j]));
                }
            }
            // |terms| <= 1, K <= 513: fp32 rounding of the K partial sums stays below K * 6e-8 ~ 3e-5, while
            // a wrongly packed or dropped element changes a sum by ~0.3 on average
            EXPECT_LE(worst, 4e-5) << "M=" << M << " N=" << N << " K=" << K << " layout " << layout;
            EXPECT_EQ(results[0], results[1]) << "1 and 2 threads differ: M=" << M << " N=" << N << " K=" << K
                                              << " layout " << layout;
            // overwrite (C = A·B) on a NaN-poisoned C: the same bits as accumulating onto zeros
            std::vector<float> zeros_then_add((size_t)M * N, 0.0f), set((size_t)M * N, NAN);
            gemm_accumulate(zeros_then_add.data(), N, A, Bv, M, N, K);
            gemm_accumulate(set.data(), N, A, Bv, M, N, K, true);
            EXPECT_EQ(0, memcmp(set.data(), zeros_then_add.data(), set.size() * sizeof(float)))
                << "overwrite differs from zeros + accumulate: M=" << M << " N=" << N << " K=" << K << " layout " << layout;
            // and with a bias: the same bits as filling each row with the bias and accumulating
            std::vector<float> bias = to_float(random_vec((size_t)N, rng)), bias_then_add((size_t)M * N);
            for (int i = 0; i < M; i++) std::copy(bias.begin(), bias.end(), bias_then_add.begin() + (size_t)i * N);
            gemm_accumulate(bias_then_add.data(), N, A, Bv, M, N, K);
            std::fill(set.begin(), set.end(), NAN);
            gemm_accumulate(set.data(), N, A, Bv, M, N, K, true, GemmTriangle::none, bias.data());
            EXPECT_EQ(0, memcmp(set.data(), bias_then_add.data(), set.size() * sizeof(float)))
                << "overwrite with bias differs from bias + accumulate: M=" << M << " N=" << N << " K=" << K
                << " layout " << layout;
        }
    }
    omp_set_num_threads(threads_before);
}

// The two ways of packing (gemm_accumulate_panels for a thread with at most GEMM_MC_PANELS rows,
// gemm_accumulate_blocks beyond) sum every element in the same order: the first rows of a product
// computed alone, on the panel path, have the bits of the same rows computed within the whole
// product on the block path (one thread, so the whole product's 300 rows are one share).
TEST(OpsMatmul, PanelAndBlockPathsAgreeBitForBit) {
    std::mt19937 rng(18);
    int M = GEMM_MC_PANELS + 12, few = 100, N = 300, K = 600;
    std::vector<float> a = to_float(random_vec((size_t)M * K, rng)), b = to_float(random_vec((size_t)K * N, rng));
    std::vector<float> c0 = to_float(random_vec((size_t)M * N, rng));
    int threads_before = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int layout = 0; layout < 3; layout++) {  // as in Fp32FastPathsMatchNaiveOnEdgeShapes
        MatrixView<float> A = layout == 2 ? MatrixView<float>{a.data(), 1, (size_t)M} : MatrixView<float>{a.data(), (size_t)K, 1};
        MatrixView<float> Bv = layout == 1 ? MatrixView<float>{b.data(), 1, (size_t)K} : MatrixView<float>{b.data(), (size_t)N, 1};
        std::vector<float> whole = c0, first = c0;
        gemm_accumulate(whole.data(), N, A, Bv, M, N, K);
        gemm_accumulate(first.data(), N, A, Bv, few, N, K);  // rows 0..few-1 only: A's view is the same
        EXPECT_EQ(0, memcmp(whole.data(), first.data(), (size_t)few * N * sizeof(float))) << "layout " << layout;
        EXPECT_NE(0, memcmp(whole.data(), c0.data(), (size_t)few * N * sizeof(float)));  // it did compute
    }
    omp_set_num_threads(threads_before);
}

// The triangles causal attention passes (GemmTriangle) skip only terms that are zero, so the wanted
// entries have the same bits as the full product's; a skipped tile is left as it was. T > KC = 256 puts
// the diagonal across k slabs.
TEST(OpsMatmul, TrianglesSkipOnlyZerosBitForBit) {
    std::mt19937 rng(17);
    const int shapes[][2] = {{7, 5}, {64, 64}, {100, 33}, {257, 17}, {300, 64}};  // T (= M = K), N
    int threads_before = omp_get_max_threads();
    for (const auto& shape : shapes) {
        int T = shape[0], N = shape[1];
        for (GemmTriangle triangle : {GemmTriangle::lower_c, GemmTriangle::lower_a, GemmTriangle::upper_a}) {
            int n = triangle == GemmTriangle::lower_c ? T : N;  // lower_c: C is square
            std::vector<float> a = to_float(random_vec((size_t)T * T, rng)), b = to_float(random_vec((size_t)T * n, rng));
            std::vector<float> c0 = to_float(random_vec((size_t)T * n, rng));
            for (int i = 0; i < T; i++) {  // A's zeros where the triangle says they are
                for (int k = 0; k < T; k++) {
                    bool zero = (triangle == GemmTriangle::lower_a && k > i) || (triangle == GemmTriangle::upper_a && k < i);
                    if (zero) a[(size_t)i * T + k] = 0.0f;
                }
            }
            for (int layout = 0; layout < 3; layout++) {  // as in Fp32FastPathsMatchNaiveOnEdgeShapes
                std::vector<float> at(a.size());  // A stored transposed, for layout 2
                for (int i = 0; i < T; i++)
                    for (int k = 0; k < T; k++) at[(size_t)k * T + i] = a[(size_t)i * T + k];
                std::vector<float> bt(b.size());  // B stored transposed, for layout 1
                for (int k = 0; k < T; k++)
                    for (int j = 0; j < n; j++) bt[(size_t)j * T + k] = b[(size_t)k * n + j];
                MatrixView<float> A = layout == 2 ? MatrixView<float>{at.data(), 1, (size_t)T} : MatrixView<float>{a.data(), (size_t)T, 1};
                MatrixView<float> Bv = layout == 1 ? MatrixView<float>{bt.data(), 1, (size_t)T} : MatrixView<float>{b.data(), (size_t)n, 1};
                std::vector<float> full = c0;
                gemm_accumulate(full.data(), n, A, Bv, T, n, T);
                for (int threads = 1; threads <= 2; threads++) {
                    omp_set_num_threads(threads);
                    std::vector<float> part = c0;
                    gemm_accumulate(part.data(), n, A, Bv, T, n, T, false, triangle);
                    int differ = 0, untouched_above = 0;
                    for (int i = 0; i < T; i++) {
                        for (int j = 0; j < n; j++) {
                            size_t e = (size_t)i * n + j;
                            if (triangle != GemmTriangle::lower_c || j <= i) {
                                differ += memcmp(&part[e], &full[e], sizeof(float)) != 0;
                            } else {
                                untouched_above += part[e] == c0[e];
                            }
                        }
                    }
                    EXPECT_EQ(differ, 0) << "T=" << T << " N=" << n << " triangle " << (int)triangle << " layout "
                                         << layout << " threads " << threads;
                    // lower_c skips the tiles wholly above the diagonal: with T > 16 there are some
                    if (triangle == GemmTriangle::lower_c && T > 16) {
                        EXPECT_GT(untouched_above, 0) << "T=" << T << " layout " << layout;
                    }
                }
            }
        }
    }
    omp_set_num_threads(threads_before);
}

// AdamW's first step moves each parameter by lr * (sign(g) + wd * p) up to eps (bias correction makes
// m_hat = g and v_hat = g^2); the clipping scale must not change that direction-only step.
TEST(OpsAdamW, FirstStepIsSignDescentPlusDecay) {
    std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -4.0f, 1e-3f}, m(3, 0.0f), v(3, 0.0f);
    std::vector<float> p0 = p;
    float lr = 0.01f, wd = 0.1f;
    adamw_update(p.data(), g.data(), m.data(), v.data(), 3, AdamWHyper(), lr, wd, 0.5f, 1);
    for (int i = 0; i < 3; i++) {
        double expected = p0[i] - lr * ((g[i] > 0 ? 1.0 : -1.0) + wd * p0[i]);
        EXPECT_NEAR(p[i], expected, 1e-6) << i;
        EXPECT_FLOAT_EQ(m[i], 0.1f * 0.5f * g[i]);  // (1 - beta1) * scaled gradient
    }
}

TEST(OpsAdamW, SumOfSquaresIsExactAndIndependentOfThreads) {
    std::mt19937 rng(9);
    std::vector<float> x = to_float(random_vec(100003, rng));
    double naive = 0;
    for (float f : x) naive += (double)f * f;
    double got = sum_of_squares(x.data(), x.size());
    EXPECT_NEAR(got, naive, 1e-9 * naive);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double single = sum_of_squares(x.data(), x.size());
    omp_set_num_threads(threads);
    EXPECT_EQ(got, single);  // bit-identical: block sums are combined in index order
}

// The fp32 path runs its eight lanes two AVX2 registers at a time; the definition is one double per
// lane: lane j adds x[i]² for i = j mod 8 in index order, within blocks of 2^14 elements summed in
// order, a block's lanes summed in lane order and then its tail. The same bits, on values over 60
// binades (any change of order would show in the last bits) and a length that leaves every tail.
TEST(OpsAdamW, SumOfSquaresHasTheBitsOfItsDefinition) {
    std::mt19937 rng(10);
    std::uniform_real_distribution<double> mantissa(-1.0, 1.0), exponent(-30.0, 30.0);
    size_t n = 3 * 16384 + 8 * 37 + 5;
    std::vector<float> x(n);
    for (float& f : x) f = (float)(mantissa(rng) * std::exp2(exponent(rng)));
    double expected = 0.0;
    for (size_t b = 0; b < n; b += 16384) {
        size_t end = std::min(n, b + 16384), i = b;
        double lane[8] = {};
        for (; i + 8 <= end; i += 8) {
            for (int j = 0; j < 8; j++) lane[j] += (double)x[i + j] * (double)x[i + j];
        }
        double s = 0.0;
        for (double l : lane) s += l;
        for (; i < end; i++) s += (double)x[i] * (double)x[i];
        expected += s;
    }
    double got = sum_of_squares(x.data(), n);
    EXPECT_EQ(0, memcmp(&got, &expected, sizeof(double))) << got << " vs " << expected;
}

}  // namespace

// The MFU denominator (llmc/run/cpu_peak.h) adds per-thread rates measured in CPU time, which would count
// twice a core shared by two threads if nothing capped it: with twice as many threads as CPUs it must
// still read about what one thread per CPU reads. 25% allows for the run-to-run spread of a shared
// machine; counting every thread would read about 2x. A busy machine (CI's other jobs) can depress
// one measurement of the single thread by more than that (one CI run read 3.1x with 2 CPUs), so each
// side is measured three times, interleaved: the single thread's best (its peak, what the MFU uses)
// against the oversubscribed run's least for the cap, the other way round for the floor. A trainer
// counting every thread would still read about 2x in all three.
TEST(CpuPeak, MoreThreadsThanCpusAddNothing) {
    cpu_set_t allowed;
    ASSERT_EQ(0, sched_getaffinity(0, sizeof(allowed), &allowed));
    int cpus = CPU_COUNT(&allowed);
    double one_best = 0, one_least = 1e300, over_best = 0, over_least = 1e300;
    for (int i = 0; i < 3; i++) {
        double one = cpu_fma_peak_flops(1), over = cpu_fma_peak_flops(2 * cpus);
        one_best = std::max(one_best, one), one_least = std::min(one_least, one);
        over_best = std::max(over_best, over), over_least = std::min(over_least, over);
    }
    EXPECT_GT(one_best, 1e9) << "an FMA loop below 1 GFLOP/s: the measurement is broken";
    EXPECT_LE(over_least, 1.25 * cpus * one_best) << cpus << " CPUs, " << 2 * cpus << " threads";
    EXPECT_GE(over_best, 0.75 * one_least);
}

// Issue 51, item 1.8: a 2-core VM printed "MFU 114.6%" for a whole run: the start-up measurement met a
// busy core (103 GFLOP/s) and the model then ran at 118. No step can beat the machine's peak, so a step
// above the measured one shows that measurement was low: peak_after_step measures again and takes the
// larger of that and the step's own rate; a step below the peak changes nothing (and measures nothing).
TEST(CpuPeak, AStepAboveTheMeasuredPeakMeasuresItAgain) {
    int measured = 0;
    auto measure = [&](double value) {
        return std::function<double()>([&, value] {
            measured++;
            return value;
        });
    };
    EXPECT_EQ(peak_after_step(103e9, 90e9, measure(200e9)), 103e9);
    EXPECT_EQ(measured, 0);
    EXPECT_EQ(peak_after_step(103e9, 118e9, measure(100e9)), 118e9);  // measured low again: the step's rate
    EXPECT_EQ(peak_after_step(103e9, 118e9, measure(130e9)), 130e9);
    EXPECT_EQ(measured, 2);
    EXPECT_EQ(peak_after_step(103e9, 118e9, nullptr), 103e9);  // a peak given with -pk stays what it was
    EXPECT_LE(step_throughput(118e9, 1000.0, peak_after_step(103e9, 118e9, measure(100e9))).mfu, 1.0);
}
