// The optimizers beyond AdamW (-opt muon|adafactor, doc/optimizers.md):
//  - llmc/muon.h's Newton-Schulz and llmc/adafactor.h's update against double-precision references
//    written here from the formulas;
//  - the matrices' owners under data parallelism (llmc/parallel/matrix_owners.h) are balanced;
//  - train_gpt2 -opt muon and -opt adafactor against the PyTorch oracle's torch.optim.Muon (with AdamW
//    on the other tensors) and torch.optim.Adafactor, a few steps on the tiny model: one process, and 3
//    processes with ZeRO-1 (the oracle accumulating the same global batch);
//  - a run resumed from its checkpoint continues bit for bit; resuming with another -opt, and layouts
//    the matrix optimizers do not support, are refused with a message.
#include <cmath>
#include <cstring>
#include <vector>

#include "../llmc/adafactor.h"
#include "../llmc/adamw8.h"
#include "../llmc/io/checkpoint.h"
#include "../llmc/muon.h"
#include "../llmc/optimizer.h"
#include "../llmc/parallel/matrix_owners.h"
#include "../llmc/run/args.h"
#include "optimizer_oracle.h"
#include "test_helpers.h"

namespace {

// ----------------------------------------------------------------------------
// the update rules, against references in double

// Newton-Schulz in double, from the definition (torch.optim.Muon's): X = G, or Gᵀ when G is tall;
// X /= max(‖X‖_F, eps); five times A = X Xᵀ, X = a X + (b A + c A A) X; transposed back.
std::vector<double> newton_schulz_reference(const std::vector<float>& g, int rows, int cols) {
    bool tall = rows > cols;
    int n = tall ? cols : rows, m = tall ? rows : cols;
    std::vector<double> x(n * m), a(n * n), aa(n * n), y(n * m);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) x[i * m + j] = tall ? g[j * cols + i] : g[i * cols + j];
    }
    double norm = 0;
    for (double v : x) norm += v * v;
    norm = std::max(std::sqrt(norm), 1e-7);
    for (double& v : x) v /= norm;
    for (int step = 0; step < 5; step++) {
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int k = 0; k < m; k++) s += x[i * m + k] * x[j * m + k];
                a[i * n + j] = s;
            }
        }
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int k = 0; k < n; k++) s += a[i * n + k] * a[k * n + j];
                aa[i * n + j] = -4.7750 * a[i * n + j] + 2.0315 * s;
            }
        }
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < m; j++) {
                double s = 0;
                for (int k = 0; k < n; k++) s += aa[i * n + k] * x[k * m + j];
                y[i * m + j] = 3.4445 * x[i * m + j] + s;
            }
        }
        x.swap(y);
    }
    std::vector<double> out(rows * cols);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) (tall ? out[j * cols + i] : out[i * cols + j]) = x[i * m + j];
    }
    return out;
}

std::vector<float> random_matrix(size_t n, uint64_t seed, float scale) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = scale * ((float)(seed >> 40) / (float)(1 << 24) - 0.5f);
    }
    return x;
}

// fp32 against double: each of the 15 products sums at most 96 terms, whose rounding (6e-8 relative
// each) the iteration carries along; its slope at zero (a = 3.4 per step) can amplify what lands in
// the smallest singular directions by up to 3.4^5 ~ 500, which on these random matrices stays below
// 1e-5 of the largest element (measured: <= 1e-6). A wrong coefficient, a missing transpose or a
// normalization by the wrong norm is off by 1e-2 or more.
TEST(OptimizerMuon, NewtonSchulzMatchesDoubleReference) {
    for (auto shape : {std::pair<int, int>{12, 40}, {40, 12}, {32, 32}, {96, 24}}) {
        int rows = shape.first, cols = shape.second;
        SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
        std::vector<float> g = random_matrix((size_t)rows * cols, rows * 1000 + cols, 0.01f);
        std::vector<double> want = newton_schulz_reference(g, rows, cols);
        std::vector<float> x = g, scratch;
        newton_schulz(x.data(), rows, cols, MuonHyper(), &scratch);
        double worst = 0, largest = 0;
        for (size_t i = 0; i < x.size(); i++) {
            worst = std::max(worst, std::fabs(x[i] - want[i]));
            largest = std::max(largest, std::fabs(want[i]));
        }
        EXPECT_LE(worst, 1e-5 * largest);
        printf("  %dx%d: max error %.2e of the largest element %.3f\n", rows, cols, worst / largest, largest);
        EXPECT_GT(largest, 0.05);  // the scale of the input is gone: the result is near-orthogonal
    }
}

// A tall matrix is orthogonalized as the transpose of its transpose, bit for bit (the code copies it
// transposed and back).
TEST(OptimizerMuon, TallIsTransposeOfWide) {
    int rows = 48, cols = 16;
    std::vector<float> tall = random_matrix((size_t)rows * cols, 7, 1.0f), wide(tall.size()), scratch;
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) wide[j * rows + i] = tall[i * cols + j];
    }
    newton_schulz(tall.data(), rows, cols, MuonHyper(), &scratch);
    newton_schulz(wide.data(), cols, rows, MuonHyper(), &scratch);
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) ASSERT_EQ(tall[i * cols + j], wide[j * rows + i]) << i << " " << j;
    }
}

// Momentum and Nesterov as torch.optim.Muon writes them (lerps), and the learning-rate adjustment of
// its default adjust_lr_fn ("original": sqrt(max(1, rows/cols))).
TEST(OptimizerMuon, MomentumAndLearningRateAdjustment) {
    std::vector<float> momentum = {0.0f, 1.0f, -2.0f}, grad = {1.0f, 1.0f, 4.0f};
    muon_momentum(momentum.data(), grad.data(), 3, 0.95f, 0.5f);  // gradients clipped by half
    for (int i = 0; i < 3; i++) {
        double g = 0.5 * std::vector<double>{1, 1, 4}[i], b0 = std::vector<double>{0, 1, -2}[i];
        double b = 0.95 * b0 + 0.05 * g;
        EXPECT_NEAR(momentum[i], b, 1e-6 * std::fabs(b));  // fp32: a few roundings of 6e-8
        EXPECT_NEAR(grad[i], 0.05 * g + 0.95 * b, 1e-6 * std::fabs(b));  // the Nesterov update, in place of the gradient
    }
    EXPECT_DOUBLE_EQ(muon_lr_ratio(3 * 64, 64), std::sqrt(3.0));
    EXPECT_DOUBLE_EQ(muon_lr_ratio(4 * 64, 64), 2.0);
    EXPECT_DOUBLE_EQ(muon_lr_ratio(64, 4 * 64), 1.0);
    EXPECT_DOUBLE_EQ(muon_lr_ratio(64, 64), 1.0);
}

// Adafactor in double from torch.optim.Adafactor's definition (its documentation's algorithm, with its
// lerp form of the running means and eps1 at the variance estimate and the update):
//   w = t^-0.8, rho = min(lr, 1/sqrt t), alpha = max(eps2, RMS(p)) rho, p *= 1 - lr wd,
//   R = R + w (mean_j g² - R), C = C + w (mean_i g² - C), V = R Cᵀ / max(mean R, eps1),
//   U = g / max(sqrt V, eps1), p -= alpha / max(1, RMS(U)/d) U.
struct AdafactorReference {
    std::vector<double> p, row, col;
    int rows, cols;
    void step(const std::vector<float>& g32, double scale, double lr, double wd, int t) {
        double eps1 = 1.0 / (1 << 23), eps2 = 1e-3, w = std::pow((double)t, -0.8);
        size_t n = p.size();
        std::vector<double> g(n);
        for (size_t i = 0; i < n; i++) g[i] = g32[i] * scale;
        double ss = 0;
        for (double v : p) ss += v * v;
        double alpha = std::max(eps2, std::sqrt(ss / n)) * std::min(lr, 1 / std::sqrt((double)t));
        for (double& v : p) v *= 1 - lr * wd;
        for (int i = 0; i < rows; i++) {
            double s = 0;
            for (int j = 0; j < cols; j++) s += g[i * cols + j] * g[i * cols + j];
            row[i] += w * (s / cols - row[i]);
        }
        for (int j = 0; j < cols; j++) {
            double s = 0;
            for (int i = 0; i < rows; i++) s += g[i * cols + j] * g[i * cols + j];
            col[j] += w * (s / rows - col[j]);
        }
        double row_mean = 0;
        for (double r : row) row_mean += r / rows;
        std::vector<double> u(n);
        double uu = 0;
        for (int i = 0; i < rows; i++) {
            for (int j = 0; j < cols; j++) {
                double v = row[i] * col[j] / std::max(row_mean, eps1);
                u[i * cols + j] = g[i * cols + j] / std::max(std::sqrt(v), eps1);
                uu += u[i * cols + j] * u[i * cols + j];
            }
        }
        double denom = std::max(1.0, std::sqrt(uu / n));
        for (size_t i = 0; i < n; i++) p[i] -= alpha / denom * u[i];
    }
};

// Four steps on a 6x10 matrix with a zero row (its update must stay 0: eps1 keeps V's square root
// away from 0) and weight decay; also the same on a vector of 10 (the unfactored variance). fp32 against
// double: a few roundings per element per step, 1e-6 of the parameters' scale.
TEST(OptimizerAdafactor, MatchesDoubleReference) {
    int rows = 6, cols = 10, n = rows * cols;
    std::vector<float> p = random_matrix(n, 3, 0.1f), row(rows, 0.0f), col(cols, 0.0f);
    AdafactorReference ref{std::vector<double>(p.begin(), p.end()), std::vector<double>(rows), std::vector<double>(cols), rows, cols};
    std::vector<float> pv(p.begin(), p.begin() + cols), var(cols, 0.0f);
    AdafactorReference ref_vector{std::vector<double>(pv.begin(), pv.end()), std::vector<double>(1), std::vector<double>(cols), 1, cols};
    for (int t = 1; t <= 4; t++) {
        std::vector<float> g = random_matrix(n, 100 + t, 0.02f * t);
        for (int j = 0; j < cols; j++) g[2 * cols + j] = 0.0f;
        adafactor_update_matrix(p.data(), g.data(), row.data(), col.data(), rows, cols, AdafactorHyper(), 0.01f, 0.1f, 0.5f, t);
        ref.step(g, 0.5f, 0.01f, 0.1f, t);
        // a vector: V is the running mean of g² itself (the reference's one "row" factor is mean_j g²,
        // so its R Cᵀ / mean R is the column factor: the same)
        adafactor_update_vector(pv.data(), g.data(), var.data(), cols, AdafactorHyper(), 0.01f, 0.0f, 0.5f, t);
        ref_vector.step(std::vector<float>(g.begin(), g.begin() + cols), 0.5f, 0.01f, 0.0f, t);
    }
    for (int i = 0; i < n; i++) EXPECT_NEAR(p[i], ref.p[i], 1e-6 * 0.1) << i;
    for (int i = 0; i < cols; i++) EXPECT_NEAR(pv[i], ref_vector.p[i], 1e-6 * 0.1) << i;
    for (int i = 0; i < rows; i++) EXPECT_NEAR(row[i], ref.row[i], 1e-6 * ref.row[i] + 1e-30) << i;
    for (int j = 0; j < cols; j++) EXPECT_NEAR(col[j], ref.col[j], 1e-6 * ref.col[j]) << j;
    for (int j = 0; j < cols; j++) EXPECT_NEAR(var[j], ref_vector.col[j], 1e-6 * ref_vector.col[j]) << j;
}

// The tensors the matrix optimizers see, per layer; their state sizes.
TEST(OptimizerTensors, PerLayerShapesAndAdafactorState) {
    GPT2Config cfg = {32, 300, 384, 2, 4, 64};
    std::vector<OptimizerTensor> tensors = optimizer_tensors(cfg);
    ASSERT_EQ(tensors.size(), 2 + 12 * 2 + 2u);
    size_t covered = 0, state = 0, C = 64;
    for (const OptimizerTensor& t : tensors) {
        EXPECT_EQ(t.offset, covered) << param_tensor_name(t.param) << " layer " << t.layer;
        covered += t.rows * t.cols;
        EXPECT_EQ(t.state_offset, state);
        state += t.rows > 1 ? t.rows + t.cols : t.cols;
    }
    EXPECT_EQ(covered, num_parameters(cfg));
    EXPECT_EQ(adafactor_state_size(tensors), state);
    EXPECT_EQ(tensors[0].rows, 384u);  // wte
    EXPECT_EQ(tensors[1].rows, 32u);   // wpe
    int muon = 0;
    for (const OptimizerTensor& t : tensors) {
        if (t.param == P_QKVW) {
            EXPECT_TRUE(t.rows == 3 * C && t.cols == C);
        }
        if (t.param == P_FCPROJW) {
            EXPECT_TRUE(t.rows == C && t.cols == 4 * C);
        }
        if (t.param == P_QKVB) {
            EXPECT_TRUE(t.rows == 1 && t.cols == 3 * C);
        }
        muon += muon_param_is_matrix(t.param);
    }
    EXPECT_EQ(muon, 4 * 2);
}

// d12's 48 matrices over 1..8 processes: each one's owner, deterministic, with the largest load within
// one fc matrix's work of the ideal share (greedy largest-first: no process ends more than one item above
// the average).
TEST(OptimizerOwners, BalancedByWork) {
    GPT2Config cfg;
    ASSERT_TRUE(config_from_descriptor("d12", &cfg));
    std::vector<double> work;
    for (const OptimizerTensor& t : optimizer_tensors(cfg)) {
        if (muon_param_is_matrix(t.param)) work.push_back(newton_schulz_flops(t.rows, t.cols, 5));
    }
    ASSERT_EQ(work.size(), 48u);
    double total = 0, largest = 0;
    for (double w : work) total += w, largest = std::max(largest, w);
    for (int P = 1; P <= 8; P++) {
        std::vector<int> owner = balance_owners(work, P);
        EXPECT_EQ(owner, balance_owners(work, P));
        std::vector<double> load(P, 0.0);
        for (size_t k = 0; k < work.size(); k++) {
            ASSERT_GE(owner[k], 0);
            ASSERT_LT(owner[k], P);
            load[owner[k]] += work[k];
        }
        double most = *std::max_element(load.begin(), load.end());
        EXPECT_LE(most, total / P + largest) << P << " processes";
        printf("  %d processes: largest load %.3f of the ideal share\n", P, most / (total / P));
    }
}

// ----------------------------------------------------------------------------
// 8-bit AdamW's codes (llmc/adamw8.h) against their definition, values worked out by hand

// v: level q is b 2^((q - 255) / 8); a level itself codes to q, a value just inside the geometric midpoint
// 2^((k - 254.5) / 8) between levels k and k + 1 to the nearer one, anything below half the smallest level
// (2^-32.75) to 0, and then m codes to 0 too. m: q = round(127 m / a), ties to even; its largest is +-127.
TEST(OptimizerAdamw8, CodesFollowTheDefinition) {
    const Adamw8Tables& t = adamw8_tables();
    EXPECT_EQ(t.level[255], 1.0f);
    EXPECT_EQ(t.level[247], 0.5f);  // 8 codes an octave
    EXPECT_EQ(t.level[1], (float)std::exp2(-31.75));
    for (int q : {1, 2, 100, 200, 254, 255}) EXPECT_EQ(adamw8_code_v((float)std::exp2((q - 255) / 8.0), t.threshold), q) << q;
    for (int k : {1, 50, 128, 254}) {
        float mid = (float)std::exp2((k - 254.5) / 8.0);
        EXPECT_EQ(adamw8_code_v(std::nextafter(mid, 0.0f), t.threshold), k) << k;
        EXPECT_EQ(adamw8_code_v(std::nextafter(mid, 2.0f), t.threshold), k + 1) << k;
    }
    float half_lowest = (float)std::exp2(-32.75);
    EXPECT_EQ(adamw8_code_v(std::nextafter(half_lowest, 0.0f), t.threshold), 0);
    EXPECT_EQ(adamw8_code_v(half_lowest, t.threshold), 1);
    EXPECT_EQ(adamw8_code_v(0.0f, t.threshold), 0);
    // a block of four: m (a = 2), v (b = 8)
    const float m[4] = {2.0f, -1.0f, 0.0078125f, 0.5f}, v[4] = {8.0f, 2.0f, 1e-12f, 4.0f};
    int8_t qm[4];
    uint8_t qv[4];
    adamw8_encode(m, v, 4, 2.0f, 8.0f, qm, qv);
    EXPECT_EQ(qm[0], 127);
    EXPECT_EQ(qm[1], -64);  // -63.5 rounds to even
    EXPECT_EQ(qm[3], 32);   // 31.75
    EXPECT_EQ(qv[0], 255);
    EXPECT_EQ(qv[1], 239);  // v / b = 1/4: two octaves down
    EXPECT_EQ(qv[3], 247);
    EXPECT_EQ(qv[2], 0) << "1.25e-13 of b is below the smallest level";
    EXPECT_EQ(qm[2], 0) << "where v codes to 0, m does too (0.0078125 alone would be code 0.5 -> 0 anyway)";
    EXPECT_EQ(adamw8_decode_m(127, 2.0f), 2.0f);
    EXPECT_EQ(adamw8_decode_m(-64, 2.0f), -64 * (2.0f / 127.0f));
    EXPECT_EQ(adamw8_decode_v(239, 8.0f, t.level), 2.0f);
    EXPECT_EQ(adamw8_decode_v(0, 8.0f, t.level), 0.0f);
    // a block whose m is all 0 (a = 0) codes m to 0; one whose v is all 0 (b = 0) codes everything to 0
    const float zeros[2] = {0.0f, 0.0f}, some[2] = {1.0f, 2.0f};
    adamw8_encode(zeros, some, 2, 0.0f, 2.0f, qm, qv);
    EXPECT_EQ(qm[0], 0);
    EXPECT_EQ(qv[1], 255);
    adamw8_encode(some, zeros, 2, 2.0f, 0.0f, qm, qv);
    EXPECT_EQ(qm[1], 0);
    EXPECT_EQ(qv[1], 0);
}

// v's code is the count of the table's thresholds at or below x, found from x's exponent and mantissa and
// settled against the table: the same as a binary search of the table (the definition's count) at every
// threshold and 3 float steps either side, and at every 997th float of [0, 1] (1.07 M of them; all
// 1.07 G agreed when checked once); NaN codes to 0.
TEST(OptimizerAdamw8, VCodeIsTheTablesCount) {
    const Adamw8Tables& t = adamw8_tables();
    auto search = [&](float x) {
        int q = 0;
        for (int step = 128; step > 0; step >>= 1) q += t.threshold[q + step - 1] <= x ? step : 0;
        return q;
    };
    int checked = 0;
    for (int k = 0; k < 255; k++) {
        float x = t.threshold[k];
        for (int i = 0; i < 3; i++) x = std::nextafter(x, 0.0f);
        for (int i = 0; i < 7; i++, x = std::nextafter(x, 2.0f), checked++) {
            ASSERT_EQ(adamw8_code_v(x, t.threshold), search(x)) << "x = " << x << " near threshold " << k;
        }
    }
    uint32_t one;
    float f1 = 1.0f;
    memcpy(&one, &f1, sizeof(one));
    for (uint32_t u = 0; u <= one; u += 997, checked++) {
        float x;
        memcpy(&x, &u, sizeof(x));
        ASSERT_EQ(adamw8_code_v(x, t.threshold), search(x)) << "x = " << x;
    }
    EXPECT_GT(checked, 1000000);
    EXPECT_EQ(adamw8_code_v(std::nanf(""), t.threshold), 0);
}

// Blocks start at each tensor's start (each layer's slice of a stacked tensor is one), so no block holds
// two tensors' elements; the tiny model's 16 tensors of 2 layers, counted by hand.
TEST(OptimizerAdamw8, BlocksStartAtEachTensor) {
    GPT2Config cfg = {32, 300, 384, 2, 4, 64};
    std::vector<OptimizerTensor> tensors = optimizer_tensors(cfg);
    Adamw8Blocks map = adamw8_blocks(tensors);
    size_t expected = 0;
    for (const OptimizerTensor& t : tensors) {
        size_t first = map.block_of(t.offset), last = map.block_of(t.offset + t.size() - 1);
        EXPECT_EQ(map.block_begin(first), t.offset);
        EXPECT_EQ(map.block_end(last), t.offset + t.size());
        EXPECT_EQ(last - first + 1, (t.size() + 255) / 256);
        EXPECT_EQ(map.decayed[map.tensor_of_block(first)], param_tensor_is_decayed(t.param));
        expected += (t.size() + 255) / 256;
    }
    EXPECT_EQ(map.num_blocks(), expected);
    size_t first, last;
    map.blocks_of(10, 300, &first, &last);  // wte's elements 10..299: its blocks 0 and 1
    EXPECT_EQ(first, 0u);
    EXPECT_EQ(last, 2u);
}

// ----------------------------------------------------------------------------
// the trainer against the PyTorch oracle

bool have_mpirun() { return test::run_command("command -v mpirun").exit_code == 0; }

std::string mpirun(int np) {
    return "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " ";
}

// processes: data-parallel ones (the oracle accumulates their micro-batches); group: each of them that
// many model-parallel processes (mpirun -np processes x group; trainer_extra says how: -tp, -pp)
Agreement train_against_oracle(const std::string& name, const OptimizerRun& run, const std::string& oracle_extra,
                               int processes, const std::string& trainer_extra = "", int group = 1) {
    std::string oracle_dir = test::oracle(name + "_np" + std::to_string(processes),
                                          std::string(OPTIMIZER_TINY) + run.oracle_args(processes) + oracle_extra);
    std::string dir = test::scratch_dir(name + "_np" + std::to_string(processes) + "_g" + std::to_string(group));
    std::string launch = processes * group > 1 ? mpirun(processes * group) : "OMP_NUM_THREADS=2 ";
    test::CommandResult r = test::run_command(launch + run.trainer_args(oracle_dir, processes) + trainer_extra + " -o " + dir);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) {
        Agreement failed;
        failed.loss = failed.norm = failed.params = failed.matrices = 1;
        return failed;
    }
    return compare_with_oracle(oracle_dir, dir, run.steps);
}

// Muon (Newton-Schulz in fp32 against the oracle's in float64, --muon-ns-dtype compute) on `processes`
// data-parallel processes of `group` each, in the layout `flags`, held to the one-process bars
// (OptimizerOracle.MuonOneProcess says why those).
Agreement muon_follows_oracle(int processes, const std::string& flags = "", int group = 1) {
    Agreement a = train_against_oracle("opt_muon", {"muon", 1e-3, 0.02}, " --muon-ns-dtype compute", processes, flags, group);
    expect_agreement(a, 1e-5, 1e-5, 1e-2);
    EXPECT_LE(a.matrices, 1e-4) << "Muon's matrices" << flags;
    return a;
}

// The oracle's Newton-Schulz is written out (newton_schulz in gpt2_oracle.py) and checked here to be
// torch.optim.Muon's own, bit for bit, when run in bfloat16 as Muon runs it.
TEST(OptimizerOracle, MuonNewtonSchulzIsTorchs) {
    test::CommandResult r = test::run_command(test::python() + " " + test::root() + "/test/oracle/gpt2_oracle.py --check-muon-ns");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("check-muon-ns PASSED"), std::string::npos) << r.output;
}

// Tolerances, for the tiny model over 5 steps (the numbers the tests print; doc/optimizers.md):
//  - losses and gradient norms, 1e-5 relative: as for AdamW (test_model.cpp), fp32 rounding of the
//    forward and backward (measured <= 8e-8);
//  - parameters, against the float64 oracle whose Newton-Schulz also runs in float64
//    (--muon-ns-dtype compute): AdamW's tensors carry the noise explained in test_model.cpp (elements
//    with a ~0 true gradient, the key biases, moved by rounding scaled up to a fraction of lr): 1e-2 of
//    the distance each tensor moved, as there (measured 5e-4, qkvb). Muon's matrices carry the fp32
//    rounding of 15 products, amplified in the small singular directions: 1e-4 (measured 4e-6).
TEST(OptimizerOracle, MuonOneProcess) {
    muon_follows_oracle(1);
}

// torch.optim.Muon as it is runs Newton-Schulz in bfloat16 (8 significant bits); ours runs in fp32, the
// CPU reference's precision. Each orthogonalized update then differs by about bf16's rounding, 2^-9
// relative per operation, carried through 15 products: measured, Muon's matrices end 2-4% of their
// movement apart, the losses 6e-6 and the gradient norms 9e-4 relative. (AdamW's tensors follow
// gradients that now differ by that much, and AdamW scales up the differences of elements whose
// gradient is ~0, as test_model.cpp explains: up to 10% of wte's movement; the fp32 test above checks
// them.) Bounds: losses 1e-4, norms 1e-2, Muon's matrices 0.06 of the distance moved (a learning rate
// 10% off moves them 0.10-0.12 of it; no orthogonalization, or another coefficient, far more).
TEST(OptimizerOracle, MuonAgainstTorchsBf16NewtonSchulz) {
    Agreement a = train_against_oracle("opt_muon_bf16", {"muon", 1e-3, 0.02}, "", 1);
    EXPECT_LE(a.loss, 1e-4) << "loss";
    EXPECT_LE(a.norm, 1e-2) << "grad norm";
    EXPECT_LE(a.matrices, 0.06) << "Muon's matrices";
}

// Adafactor against torch.optim.Adafactor (float64, with eps1 = fp32's machine epsilon, which is the
// default torch gives fp32 parameters). Its update divides by a square root of mean squares too, but of a
// whole row and column, so an element with a ~0 gradient is not scaled up as AdamW's is: parameters
// within 1e-3 of the distance moved (measured 2.2e-5, qkvb).
TEST(OptimizerOracle, AdafactorOneProcess) {
    Agreement a = train_against_oracle("opt_adafactor", {"adafactor", 1e-2, 0.0}, "", 1);
    expect_agreement(a, 1e-5, 1e-5, 1e-3);
}

// Adafactor on pipeline stages (-pp 2): each stage keeps its layers' factored states and a copy of the
// shared tensors' (their gradients summed over the stages, so every copy updates alike); the same oracle
// and bars as one process.
TEST(OptimizerOracle, AdafactorPipelineStages) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    Agreement a = train_against_oracle("opt_adafactor", {"adafactor", 1e-2, 0.0}, "", 1, " -pp 2", 2);
    expect_agreement(a, 1e-5, 1e-5, 1e-3);
}

// 3 processes with ZeRO-1 (and Muon with -z 0) follow the oracle accumulating the same global batch (3 x 2
// micro-batches):
// Muon's matrices orthogonalized by their owners and shared, AdamW's and Adafactor's updates as in one
// process. Same tolerances as one process (the sums are ordered differently, fp32 rounding again).
// Communication per step (llmc/parallel/matrix_owners.h; ring counts of llmc/parallel/comm.h, bytes sent
// plus received, P = 3, N = 126720 parameters, M = 98304 of them in the 8 matrices): AdamW's -z 1 moves
// 16 N (P-1)/P (the gradients' reduce-scatter, the parameters' all-gather); Muon adds 8 N (P-1)/P (the
// Nesterov updates' all-gather) and 8 M (P-1)/P (each matrix's broadcast; 1% for rounding M/P per
// matrix); Adafactor gathers the gradients instead of the parameters, 16 N (P-1)/P in all.
TEST(OptimizerOracle, MuonAndAdafactorThreeProcesses) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    Agreement muon = muon_follows_oracle(3, " -z 1");
    Agreement adafactor = train_against_oracle("opt_adafactor", {"adafactor", 1e-2, 0.0}, "", 3, " -z 1");
    expect_agreement(adafactor, 1e-5, 1e-5, 1e-3);
    // -z 0: the same matrices' owners and broadcasts, after AdamW's all-reduce (16 N (P-1)/P)
    Agreement muon_z0 = muon_follows_oracle(3, " -z 0");
    const double N = 126720, M = 98304, ring = 2.0 / 3.0;
    ASSERT_EQ(muon.comm_bytes.size(), 5u);
    ASSERT_EQ(muon_z0.comm_bytes.size(), 5u);
    ASSERT_EQ(adafactor.comm_bytes.size(), 5u);
    for (int s = 0; s < 5; s++) {
        EXPECT_NEAR(muon.comm_bytes[s], (24 * N + 8 * M) * ring, 0.01 * (24 * N + 8 * M) * ring) << "step " << s;
        EXPECT_NEAR(muon_z0.comm_bytes[s], (16 * N + 8 * M) * ring, 0.01 * (16 * N + 8 * M) * ring) << "step " << s;
        EXPECT_NEAR(adafactor.comm_bytes[s], 16 * N * ring, 0.01 * 16 * N * ring) << "step " << s;
    }
}

// 8-bit AdamW against the oracle's (gpt2_oracle.py --opt adamw8, torch's operations in float64 on the
// decoded moments, the codes written from the definition). A code can round the other way where the new
// moment lies within fp32's rounding of a threshold (ours fp32, the oracle float64), and that element's
// next steps then move by up to one code (a / 127 of m, which for an element near a / 254 doubles its
// step; 4.4% of v): measured 6e-3 of the distance the tensor moved on one process (qkvw), 9e-3 on four
// and 2e-2 on three (their fp32 gradient sums, in another order, put other moments near a threshold);
// bound 5e-2. The 8-bit
// codes are what the bound sees: the fp32 AdamW oracle's run ends 0.5 of the distance moved (qkvb) from
// this one. Losses and norms as for AdamW (1e-5): measured the same to 7 digits over 5 steps.
// On 4 processes at each ZeRO stage the same bars; 3 of the tiny model's shard boundaries cut a block
// (3 processes' would cut none), whose parts are encoded with the whole block's maxima
// (llmc/parallel/zero_blocks.h): the neighbours' state files agree on them (the resume checks it too),
// every block's codes reach +-127 and 255 (its maxima are its own elements', not a part's), and -z 2 and
// -z 3 give the same bits.
TEST(OptimizerOracle, Adamw8OneProcessAndFourAtEachZeroStage) {
    Agreement one = train_against_oracle("opt_adamw8", {"adamw8", 1e-3, 0.02}, "", 1);
    expect_agreement(one, 1e-5, 1e-5, 5e-2);
    std::string dir = test::oracle("opt_adamw8_np1", std::string(OPTIMIZER_TINY) + OptimizerRun{"adamw8", 1e-3, 0.02}.oracle_args(1));
    std::vector<float> init, eight, fp32;
    GPT2Config cfg;
    model_file_read(dir + "/model.bin", &cfg, &init);
    model_file_read(dir + "/final.bin", &cfg, &eight);
    std::string adamw_dir = test::oracle("opt_adamw_plain_np1", std::string(OPTIMIZER_TINY) + OptimizerRun{"adamw", 1e-3, 0.02}.oracle_args(1));
    model_file_read(adamw_dir + "/final.bin", &cfg, &fp32);
    double apart = 0, moved = 0;
    for (size_t i = 0; i < init.size(); i++) {
        apart = std::max(apart, (double)std::fabs(eight[i] - fp32[i]));
        moved = std::max(moved, (double)std::fabs(fp32[i] - init[i]));
    }
    EXPECT_GT(apart / moved, 0.1) << "the 8-bit oracle's run is not AdamW's: the test sees the codes";
    if (!have_mpirun()) return;
    std::vector<std::string> finals;
    for (int z : {1, 2, 3}) {
        SCOPED_TRACE("-z " + std::to_string(z));
        Agreement agreement = train_against_oracle("opt_adamw8", {"adamw8", 1e-3, 0.02}, "", 4, " -z " + std::to_string(z));
        expect_agreement(agreement, 1e-5, 1e-5, 5e-2);
        const std::string& run = agreement.dir;
        finals.push_back(test::read_text(run + "/model_00000005.bin"));
        // the state files: process r holds [r S, (r + 1) S); a block two of them cut has the same maxima in both
        Adamw8Blocks map = adamw8_blocks(optimizer_tensors(cfg));
        std::vector<TrainState> files(4);
        for (int r = 0; r < 4; r++) {
            char name[64];
            snprintf(name, sizeof(name), "/state_00000005_%05d.bin", r);
            state_file_read(run + name, &files[r]);
            ASSERT_EQ(files[r].optimizer, OPT_ADAMW8);
        }
        int cut = 0;
        for (int r = 0; r + 1 < 4; r++) {
            const Adamw8State &left = files[r].moments8, &right = files[r + 1].moments8;
            if (left.block_end - 1 != right.block_begin) continue;  // the boundary falls between two blocks
            cut++;
            EXPECT_EQ(left.m_max.back(), right.m_max.front()) << "boundary " << r + 1;
            EXPECT_EQ(left.v_max.back(), right.v_max.front()) << "boundary " << r + 1;
        }
        EXPECT_EQ(cut, 3) << "the tiny model's 3 shard boundaries each cut a block";
        // every block's extreme codes: its largest |m| codes to 127 and its largest v to 255 (the blocks of
        // wte's padded rows, which no gradient reaches, are all 0)
        std::vector<int> top_m(map.num_blocks(), 0), top_v(map.num_blocks(), 0);
        std::vector<float> a(map.num_blocks(), 0.0f), b(map.num_blocks(), 0.0f);
        for (const TrainState& f : files) {
            const Adamw8State& q = f.moments8;
            for (size_t i = 0; i < q.m.size(); i++) {
                size_t k = map.block_of(q.begin + i);
                top_m[k] = std::max(top_m[k], std::abs((int)q.m[i]));
                top_v[k] = std::max(top_v[k], (int)q.v[i]);
            }
            for (size_t k = q.block_begin; k < q.block_end; k++) a[k] = q.m_max[k - q.block_begin], b[k] = q.v_max[k - q.block_begin];
        }
        int short_m = 0, short_v = 0, used = 0;
        for (size_t k = 0; k < map.num_blocks(); k++) {
            used += b[k] > 0;
            short_v += b[k] > 0 && top_v[k] != 255;
            short_m += a[k] > 0 && top_m[k] != 127;
        }
        EXPECT_GT(used, (int)map.num_blocks() * 9 / 10);
        EXPECT_EQ(short_v, 0) << "blocks whose largest v code is not 255";
        EXPECT_EQ(short_m, 0) << "blocks whose largest m code is not 127";
    }
    EXPECT_EQ(finals[1], finals[2]) << "-z 2 and -z 3: the same bits";
}

// Muon with ZeRO-2 and 3 (CPU trainer): a process holds only its shard of the gradients (and with -z 3 of
// the parameters), so each matrix's Nesterov update is all-gathered on its own, orthogonalized by its
// owner and broadcast: 3 processes follow the oracle accumulating their batches, with the one-process
// bars. Communication, against AdamW's at the same stage: process 0 receives each matrix but its
// shard's part of it (ring count 8 (size - held)) and each broadcast adds 8 size (P-1)/P (1% for
// rounding size/P).
TEST(OptimizerOracle, MuonZero2And3) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("opt_muon_np3", std::string(OPTIMIZER_TINY) +
                                                              OptimizerRun{"muon", 1e-3, 0.02}.oracle_args(3) +
                                                              " --muon-ns-dtype compute");
    GPT2Config cfg;
    std::vector<float> unused;
    model_file_read(oracle_dir + "/model.bin", &cfg, &unused);
    size_t N = unused.size(), S = (N + 2) / 3;  // process 0's shard: [0, S)
    double expected = 0;
    for (const OptimizerTensor& t : optimizer_tensors(cfg)) {
        if (!muon_param_is_matrix(t.param)) continue;
        size_t held = t.offset < S ? std::min(S, t.offset + t.size()) - t.offset : 0;
        expected += 8.0 * (double)(t.size() - held) + 8.0 * (double)t.size() * 2.0 / 3.0;
    }
    for (int z : {2, 3}) {
        SCOPED_TRACE("-z " + std::to_string(z));
        std::string flags = " -z " + std::to_string(z);
        Agreement muon = muon_follows_oracle(3, flags);
        Agreement adamw = train_against_oracle("opt_adamw_z" + std::to_string(z), {"adamw", 1e-3, 0.02}, "", 3, flags);
        ASSERT_EQ(muon.comm_bytes.size(), 5u);
        ASSERT_EQ(adamw.comm_bytes.size(), 5u);
        for (int s = 0; s < 5; s++) {
            EXPECT_NEAR(muon.comm_bytes[s] - adamw.comm_bytes[s], expected, 0.01 * expected) << "step " << s;
        }
    }
}

// Muon under tensor parallelism (-tp 2: each process holds half of each matrix, train_gpt2.cpp's
// gpt2_update_muon gathers it whole for Newton-Schulz): the same oracle and tolerances as one process,
// alone and with 2 data-parallel groups under ZeRO-1. Communication: a matrix's gather moves
// 8 (tp-1)/tp of its elements per TP rank, once per step for each matrix this process's data-parallel
// rank owns (here all of them: dp 1, M/tp = 49152 elements per rank).
TEST(OptimizerOracle, MuonTensorParallel) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    Agreement tp2 = muon_follows_oracle(1, " -tp 2", 2);
    Agreement adamw_tp2 = train_against_oracle("opt_adamw_tp", {"adamw", 1e-3, 0.02}, "", 1, " -tp 2", 2);
    ASSERT_EQ(tp2.comm_bytes.size(), 5u);
    ASSERT_EQ(adamw_tp2.comm_bytes.size(), 5u);
    const double M = 98304, tp = 2;
    for (int s = 0; s < 5; s++) {
        EXPECT_NEAR(tp2.comm_bytes[s] - adamw_tp2.comm_bytes[s], 8 * (M / tp) * (tp - 1), 1e-6 * M) << "step " << s;
    }
    muon_follows_oracle(2, " -tp 2 -z 1", 2);
}

// Muon on pipeline stages (-pp 2: each stage its own layers' matrices, orthogonalized by the owners
// among its data-parallel group; the shared tensors under AdamW as before), alone and with -tp 2 in each
// stage: the same oracle and bars as one process.
TEST(OptimizerOracle, MuonPipelineStages) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    muon_follows_oracle(1, " -pp 2", 2);
    muon_follows_oracle(1, " -tp 2 -pp 2", 4);
}

// ----------------------------------------------------------------------------
// checkpoints and refusals

std::string tiny_oracle() { return test::oracle("tiny", std::string(OPTIMIZER_TINY)); }

std::string base_command(int steps) {
    std::string dir = tiny_oracle();
    return test::root() + "/train_gpt2 -e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -d 64 -l 1e-3 -u 1 "
           "-c 0.1 -sh 1 -v 0 -s 0 -x " + std::to_string(steps);
}

// Run A: 6 steps, checkpoints every 3. Run B: the same, its last checkpoint removed, resumed from step 3:
// the same bits (the momentum, the factored moments and the update count all come back), on one process,
// on 3 processes with ZeRO-1 (Muon: momentum in shards, Adafactor: its whole state from process 0's file)
// and Muon with ZeRO-3, 8-bit AdamW on one process, on 4 with ZeRO-1 and 2 with ZeRO-3 (its codes and block maxima, blocks cut
// by the shards' boundaries included),
// Muon on 2 tensor-parallel processes and on 2 pipeline stages, and Adafactor on 2 pipeline stages (the
// state put together whole in process 0's file).
TEST(OptimizerCheckpoint, ResumedRunEqualsUninterrupted) {
    struct Case {
        const char* opt;
        int np;
        const char* layout;
    };
    for (const Case& c : {Case{"muon", 1, ""}, Case{"muon", 3, " -z 1 -d 192"}, Case{"muon", 3, " -z 3 -d 192"}, Case{"muon", 2, " -tp 2"},
                          Case{"muon", 2, " -pp 2"}, Case{"adafactor", 2, " -pp 2"},
                          Case{"adafactor", 1, ""}, Case{"adafactor", 3, " -z 1 -d 192"},
                          Case{"adamw8", 1, ""}, Case{"adamw8", 4, " -z 1 -d 256"}, Case{"adamw8", 2, " -z 3 -d 128"}}) {
        const char* opt = c.opt;
        int np = c.np;
        if (np > 1 && !have_mpirun()) continue;
        SCOPED_TRACE(std::string(opt) + " on " + std::to_string(np) + " process(es)" + c.layout);
        std::string launch = np > 1 ? mpirun(np) : "";
        std::string cmd = launch + base_command(6) + " -n 3 -opt " + opt + c.layout;
        std::string a = test::scratch_dir("opt_resume_a"), b = test::scratch_dir("opt_resume_b");
        test::CommandResult ra = test::run_command(cmd + " -o " + a);
        ASSERT_EQ(ra.exit_code, 0) << ra.output;
        ASSERT_EQ(test::run_command(cmd + " -o " + b).exit_code, 0);
        ASSERT_EQ(test::run_command("rm " + b + "/model_00000006.bin " + b + "/state_00000006_* " + b + "/DONE_00000006").exit_code, 0);
        test::CommandResult rb = test::run_command(cmd + " -o " + b + " -y 1");
        ASSERT_EQ(rb.exit_code, 0) << rb.output;
        EXPECT_NE(rb.output.find("continuing from step 3"), std::string::npos) << rb.output;
        EXPECT_EQ(test::read_text(a + "/model_00000006.bin"), test::read_text(b + "/model_00000006.bin"));
        EXPECT_EQ(test::read_text(a + "/state_00000006_00000.bin"), test::read_text(b + "/state_00000006_00000.bin"));
        EXPECT_EQ(test::metrics_without_timings(a + "/metrics.jsonl"), test::metrics_without_timings(b + "/metrics.jsonl"));
    }
}

// The state file names its optimizer; resuming with another -opt is refused, naming both.
TEST(OptimizerCheckpoint, ResumeWithAnotherOptimizerIsRefused) {
    std::string dir = test::scratch_dir("opt_other");
    ASSERT_EQ(test::run_command(base_command(2) + " -n 2 -opt muon -o " + dir).exit_code, 0);
    TrainState state;
    state_file_read(dir + "/state_00000002_00000.bin", &state);
    EXPECT_EQ(state.optimizer, OPT_MUON);
    for (const char* other : {"adamw", "adafactor"}) {
        test::CommandResult r = test::run_command(base_command(4) + " -opt " + other + " -y 1 -o " + dir);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find("was written with -opt muon; this run has -opt " + std::string(other)), std::string::npos)
            << r.output;
    }
    std::string adamw = test::scratch_dir("opt_other_adamw");
    ASSERT_EQ(test::run_command(base_command(2) + " -n 2 -o " + adamw).exit_code, 0);
    test::CommandResult r = test::run_command(base_command(4) + " -opt adafactor -y 1 -o " + adamw);
    EXPECT_NE(r.output.find("was written with -opt adamw; this run has -opt adafactor"), std::string::npos) << r.output;
    // a tensor-parallel run's checkpoint (put together on process 0) names its optimizer too
    if (!have_mpirun()) return;
    std::string tp = test::scratch_dir("opt_other_tp");
    ASSERT_EQ(test::run_command(mpirun(2) + base_command(2) + " -n 2 -opt muon -tp 2 -o " + tp).exit_code, 0);
    state_file_read(tp + "/state_00000002_00000.bin", &state);
    EXPECT_EQ(state.optimizer, OPT_MUON);
    r = test::run_command(mpirun(2) + base_command(4) + " -tp 2 -y 1 -o " + tp);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("was written with -opt muon; this run has -opt adamw"), std::string::npos) << r.output;
}

// The default is AdamW, and -opt adamw is the same run bit for bit; the start-up names the optimizer and
// what its state takes (Adafactor: what it saves against AdamW's moments).
TEST(OptimizerCli, DefaultIsAdamwAndStartupNamesTheState) {
    std::string d0 = test::scratch_dir("opt_default"), d1 = test::scratch_dir("opt_adamw");
    test::CommandResult r0 = test::run_command(base_command(2) + " -n 2 -o " + d0);
    test::CommandResult r1 = test::run_command(base_command(2) + " -n 2 -opt adamw -o " + d1);
    ASSERT_EQ(r0.exit_code, 0) << r0.output;
    ASSERT_EQ(r1.exit_code, 0) << r1.output;
    EXPECT_EQ(test::read_text(d0 + "/model_00000002.bin"), test::read_text(d1 + "/model_00000002.bin"));
    EXPECT_EQ(test::read_text(d0 + "/state_00000002_00000.bin"), test::read_text(d1 + "/state_00000002_00000.bin"));
    test::CommandResult af = test::run_command(base_command(1) + " -opt adafactor");
    ASSERT_EQ(af.exit_code, 0) << af.output;
    EXPECT_NE(af.output.find("optimizer: Adafactor"), std::string::npos) << af.output;
    EXPECT_NE(af.output.find("saves"), std::string::npos) << af.output;
    test::CommandResult mu = test::run_command(base_command(1) + " -opt muon -ml 0.01");
    ASSERT_EQ(mu.exit_code, 0) << mu.output;
    EXPECT_NE(mu.output.find("optimizer: Muon"), std::string::npos) << mu.output;
}

// The flags in-process: -opt and -ml parse; the CUDA trainer takes Muon with any -z, Adafactor with -z 0 and 1, and
// -oo 1 (its flag alone: the CPU trainer's optimizer state is in host memory already) with AdamW only.
TEST(OptimizerCli, ParsesAndTheCudaTrainerRefusesWhatItLacks) {
    auto parse = [](std::vector<std::string> words, bool cuda) {
        words.insert(words.begin(), "train");
        std::vector<char*> argv;
        for (std::string& w : words) argv.push_back(&w[0]);
        TrainArgs args;
        parse_args((int)argv.size(), argv.data(), &args, cuda);
        return args;
    };
    TrainArgs defaults = parse({}, false);
    EXPECT_EQ(defaults.optimizer, "adamw");
    EXPECT_FLOAT_EQ(defaults.muon_learning_rate, 0.02f);
    TrainArgs muon = parse({"-opt", "muon", "-ml", "0.05"}, false);
    EXPECT_EQ(muon.optimizer, "muon");
    EXPECT_FLOAT_EQ(muon.muon_learning_rate, 0.05f);
    EXPECT_EQ(parse({"-opt", "adamw"}, true).optimizer, "adamw");
    EXPECT_EQ(parse({"-opt", "muon"}, true).optimizer, "muon");
    EXPECT_EQ(parse({"-opt", "muon", "-z", "1"}, true).zero_stage, 1);
    EXPECT_EQ(parse({"-opt", "muon", "-z", "2"}, true).zero_stage, 2);
    EXPECT_EQ(parse({"-opt", "muon", "-z", "3"}, true).zero_stage, 3);
    EXPECT_EQ(parse({"-opt", "adafactor"}, true).optimizer, "adafactor");
    EXPECT_EQ(parse({"-opt", "adafactor", "-z", "1"}, true).zero_stage, 1);
    EXPECT_EQ(parse({"-oo", "1"}, true).offload_optimizer, 1);
    EXPECT_EXIT(parse({"-opt", "adafactor", "-oo", "1"}, true), testing::ExitedWithCode(1),
                "flag -oo 1 with -opt adafactor: the optimizer offload runs AdamW");
    EXPECT_EXIT(parse({"-oo", "1"}, false), testing::ExitedWithCode(1), "flag -oo is the CUDA trainer's");
    EXPECT_EXIT(parse({"-ml", "-1"}, false), testing::ExitedWithCode(1), "flag -ml: -1 is outside the allowed range");
    // 8-bit AdamW: both trainers, every ZeRO stage; not with -tp, -pp (its blocks are not put together across
    // slices and stages), -oo 1 (the offload runs AdamW) or -cf llmc (llm.c's files hold fp32 moments)
    for (bool cuda : {false, true}) {
        EXPECT_EQ(parse({"-opt", "adamw8", "-z", "3"}, cuda).optimizer, "adamw8");
        EXPECT_EXIT(parse({"-opt", "adamw8", "-tp", "2", "-s", "0"}, cuda), testing::ExitedWithCode(1),
                    "-opt adamw8 runs with data parallelism at every ZeRO stage, not with -tp or -pp");
        EXPECT_EXIT(parse({"-opt", "adamw8", "-pp", "2", "-s", "0"}, cuda), testing::ExitedWithCode(1),
                    "-opt adamw8 runs with data parallelism at every ZeRO stage, not with -tp or -pp");
        EXPECT_EXIT(parse({"-opt", "adamw8", "-cf", "llmc"}, cuda), testing::ExitedWithCode(1),
                    "flag -cf llmc: llm.c's trainer runs AdamW with data parallelism only; this run has -opt adamw8");
    }
    EXPECT_EXIT(parse({"-opt", "adamw8", "-oo", "1"}, true), testing::ExitedWithCode(1),
                "flag -oo 1 with -opt adamw8: the optimizer offload runs AdamW");
}

TEST(OptimizerCli, RefusesWhatItCannotRun) {
    test::CommandResult bad = test::run_command(base_command(1) + " -opt sgd");
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.output.find("flag -opt: unknown optimizer 'sgd' (adamw, muon, adafactor or adamw8)"), std::string::npos) << bad.output;
    if (!have_mpirun()) return;
    // Muon runs in each of these layouts (MuonZero2And3, MuonTensorParallel, MuonPipelineStages), Adafactor
    // on pipeline stages (AdafactorPipelineStages) but not these
    for (const char* layout : {"-z 2", "-z 3", "-tp 2"}) {
        test::CommandResult r = test::run_command(mpirun(2) + base_command(1) + " -opt adafactor " + layout);
        EXPECT_NE(r.exit_code, 0) << layout;
        EXPECT_NE(r.output.find("-opt adafactor runs with data parallelism and ZeRO stages 0 and 1 only"), std::string::npos)
            << r.output;
    }
}

}  // namespace
