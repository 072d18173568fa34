// Data parallelism on the CPU: train_gpt2 under `mpirun --oversubscribe` with 2 and 3 processes.
//  - N processes with ZeRO-1 follow 1 process with N-fold gradient accumulation on the same global
//    batch (sample layout of ../shared/FORMATS.md): same losses, norms and final weights to fp32
//    rounding, over several steps, also with a parameter count that does not divide by N;
//  - -z 0 and -z 1 agree; -z 2 and -z 3 agree with -z 0 (with accumulation), print the ZeRO paper's
//    memory formulas and the bytes they allocate, and log the bytes they communicate; a checkpoint
//    resumes across ZeRO stages;
//  - a multi-process run resumed from its checkpoint equals the uninterrupted one, bit for bit, and
//    resumed with another process count (3, or 1) it continues as the uninterrupted one to fp32 rounding;
//  - 1, 2 and 3 processes train on the same global batches where the data crosses shard and epoch
//    boundaries (shards whose units no process count divides), and resume each other's checkpoints there;
//  - process layouts (-tp/-pp) that cannot split the processes or the model are refused;
//  - tensor parallelism (tp 2, tp 3, tp 2 x dp 2 with -z 1) follows one process, and its checkpoint
//    resumes as 1 process, dp 3 and tp 2;
//  - pipeline parallelism (pp 2 and pp 3 on 5 layers, both schedules, pp 2 x dp 2 with -z 1, tp 2 x pp 2)
//    follows one process, and a tp 2 x pp 2 checkpoint resumes as 1 process and as dp 3; the schedules
//    themselves (llmc/parallel/pipeline.h) are checked directly;
//  - processes started with different flags are stopped at start-up;
//  - killing one process ends the run with an error within a bounded time.
// The shard arithmetic itself (llmc/parallel/zero.h) is checked directly.
#include <chrono>
#include <map>
#include <fstream>
#include <map>
#include <sstream>

#include "../llmc/parallel/grad_completion.h"
#include "../llmc/parallel/pipeline.h"
#include "../llmc/parallel/zero.h"
#include "test_helpers.h"

namespace {

const char* TINY = "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 --seed 1 -b 2 -t 16 --data-tokens 4096";
// L=5: pipelines of 2 and 3 stages split it unevenly (3+2, 2+2+1)
const char* FIVE = "--layers 5 --channels 32 --heads 4 --max-seq-len 32 --vocab 300 --seed 1 -b 2 -t 16 --data-tokens 4096";
// L=1, C=21: 14343 parameters, odd, so 2 processes need a padded shard
const char* ODD = "--layers 1 --channels 21 --heads 3 --max-seq-len 32 --vocab 300 --seed 3 -b 2 -t 16 --data-tokens 4096";

bool have_mpirun() { return test::run_command("command -v mpirun").exit_code == 0; }

// mpirun as CI runs it: as root, more processes than cores, one OpenMP thread each.
std::string mpirun(int np) {
    return "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " ";
}

struct Run {
    std::vector<double> loss, norm;
    std::vector<float> params;
};

Run read_run(const std::string& dir, int final_step) {
    Run run;
    run.loss = test::jsonl_values(dir + "/metrics.jsonl", "train_loss");
    run.norm = test::jsonl_values(dir + "/metrics.jsonl", "grad_norm");
    std::string path = dir + "/model_" + std::string(8 - std::to_string(final_step).size(), '0') + std::to_string(final_step) + ".bin";
    std::string bytes = test::read_text(path);
    if (bytes.size() > HEADER_BYTES) {
        run.params.resize((bytes.size() - HEADER_BYTES) / 4);
        memcpy(run.params.data(), bytes.data() + HEADER_BYTES, run.params.size() * 4);
    }
    return run;
}

// Two runs that differ only in how the same sums are ordered (accumulation vs reduction across
// processes, all-reduce vs reduce-scatter). Losses and norms: 1e-5 relative (fp32 rounding of sums
// of thousands of terms is ~1e-6). Weights: within 1% of AdamW's largest possible movement
// (steps * lr), for the reason given in test_model.cpp: elements whose true gradient is ~0 move by
// rounding noise that AdamW scales up, differently in each run.
void expect_same_training(const Run& a, const Run& b, int steps, double lr) {
    ASSERT_EQ(a.loss.size(), (size_t)steps);
    ASSERT_EQ(b.loss.size(), (size_t)steps);
    for (int s = 0; s < steps; s++) {
        EXPECT_NEAR(a.loss[s], b.loss[s], 1e-5 * a.loss[s]) << "loss at step " << s;
        EXPECT_NEAR(a.norm[s], b.norm[s], 1e-5 * a.norm[s]) << "grad norm at step " << s;
    }
    ASSERT_EQ(a.params.size(), b.params.size());
    ASSERT_FALSE(a.params.empty());
    double worst = 0;
    for (size_t i = 0; i < a.params.size(); i++) worst = std::max(worst, (double)std::fabs(a.params[i] - b.params[i]));
    EXPECT_LE(worst, 0.01 * steps * lr) << "final weights";
}

// The number printed after `label` in a run's output (the start-up's memory lines), or -1.
double mib_after(const std::string& out, const std::string& label) {
    size_t at = out.find(label);
    return at == std::string::npos ? -1.0 : atof(out.c_str() + at + label.size());
}

std::string train_args(const std::string& oracle_dir, int steps, int total_batch) {
    return test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
           "/train.bin -b 2 -t 16 -l 1e-3 -c 0.1 -u 1 -q 0.5 -sh 0 -v 0 -s 0 -x " + std::to_string(steps) +
           " -n " + std::to_string(steps) + " -d " + std::to_string(total_batch);
}

TEST(DistributedShards, LayoutCoversEveryParameterOnce) {
    for (size_t n : {1ul, 2ul, 10ul, 14343ul, 124475904ul}) {
        for (int p : {1, 2, 3, 4, 7, 8}) {
            size_t covered = 0;
            for (int r = 0; r < p; r++) {
                ShardLayout s = shard_layout(n, p, r);
                EXPECT_EQ(s.shard_size, (n + p - 1) / p);
                EXPECT_EQ(s.padded_size, s.shard_size * p);
                EXPECT_GE(s.padded_size, n);
                EXPECT_EQ(s.begin, std::min(n, r * s.shard_size)) << n << " " << p << " " << r;
                EXPECT_LE(s.end, n);
                EXPECT_EQ(s.begin, covered) << "shards must tile [0, n) in rank order";
                covered = s.end;
            }
            EXPECT_EQ(covered, n);
        }
    }
}

// The global norm counts each parameter of the whole model once (llmc/parallel/grad_completion.h):
// over every tensor-parallel rank and pipeline stage, the elements of the ranges each process sums
// (gradient_norm_ranges) add up to the whole model's parameter count, and the replicated tensors (tp)
// and the stages' shared ones (pp) are counted where the definition says: on tp rank 0, on stage 0.
// Also with a ZeRO range [begin, end): the ranges stay inside it.
TEST(DistributedShards, NormRangesCountEveryParameterOnce) {
    GPT2Config whole{32, 300, 384, 5, 4, 32};  // maxT, V, Vp, L, NH, C
    for (int tp : {1, 2, 4}) {
        for (int pp : {1, 2, 3}) {
            size_t counted = 0;
            for (int s = 0; s < pp; s++) {
                for (int t = 0; t < tp; t++) {
                    ParallelLayout lay;
                    lay.tp = tp, lay.pp = pp, lay.tp_rank = t, lay.pp_rank = s;
                    pp_stage_layers(whole.num_layers, pp, s, &lay.layer_begin, &lay.layer_end);
                    GPT2Config cfg = pp_layers_config(whole, lay.layer_begin, lay.layer_end);
                    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS], n = 0;
                    tp_param_sizes(cfg, tp, sizes);
                    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) offsets[i] = n, n += sizes[i];
                    for (auto r : gradient_norm_ranges(lay, offsets, sizes, 0, n)) {
                        ASSERT_LT(r.first, r.second);
                        counted += r.second - r.first;
                        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {  // a tensor the range meets is counted here
                            if (offsets[i] >= r.second || offsets[i] + sizes[i] <= r.first || sizes[i] == 0) continue;
                            if (tp_param_is_replicated(i)) {
                                EXPECT_EQ(t, 0) << "tensor " << i;
                            }
                            if (pp_param_is_shared(i)) {
                                EXPECT_EQ(s, 0) << "tensor " << i;
                            }
                        }
                    }
                    size_t lo = n / 3, hi = 2 * n / 3;  // a shard
                    for (auto r : gradient_norm_ranges(lay, offsets, sizes, lo, hi)) {
                        EXPECT_GE(r.first, lo);
                        EXPECT_LE(r.second, hi);
                    }
                }
            }
            EXPECT_EQ(counted, num_parameters(whole)) << "tp " << tp << ", pp " << pp;
        }
    }
}

TEST(Distributed, Zero1RanksMatchOneRankWithAccumulation) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    for (int np : {2, 3}) {
        for (const char* model : {TINY, ODD}) {
            std::string name = model == TINY ? "tiny" : "tiny_odd";
            std::string oracle_dir = test::oracle(name, model);
            SCOPED_TRACE(name + " with " + std::to_string(np) + " processes");
            int steps = 4, total = 2 * 16 * np;
            std::string one = test::scratch_dir("dp_one"), many = test::scratch_dir("dp_many");
            test::CommandResult r1 = test::run_command("OMP_NUM_THREADS=1 " + train_args(oracle_dir, steps, total) + " -o " + one);
            ASSERT_EQ(r1.exit_code, 0) << r1.output;
            test::CommandResult rn = test::run_command(mpirun(np) + train_args(oracle_dir, steps, total) + " -z 1 -o " + many);
            ASSERT_EQ(rn.exit_code, 0) << rn.output;
            EXPECT_NE(rn.output.find(std::to_string(np) + " process(es)"), std::string::npos) << rn.output;
            expect_same_training(read_run(one, steps), read_run(many, steps), steps, 1e-3);
        }
    }
}

// Process 0 alone gets non-finite gradients at step 2 (-ni 2: one bad micro-batch on one process).
// The norm is global, so both processes skip that step, with -z 0 and with -z 1 (where each updates
// only its shard and a process that went on alone would gather NaN into the other's weights): the
// weights after step 2 are those before it, every later step is finite, and the run finishes.
TEST(Distributed, NonFiniteStepSkippedByEveryProcess) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    int steps = 4;
    for (int zero : {0, 1}) {
        SCOPED_TRACE("-z " + std::to_string(zero));
        std::string dir = test::scratch_dir("dp_nonfinite_z" + std::to_string(zero));
        test::CommandResult r = test::run_command(mpirun(2) + train_args(oracle_dir, steps, 64) + " -n 1 -ni 2 -z " +
                                                  std::to_string(zero) + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_EQ(test::read_text(dir + "/model_00000002.bin"), test::read_text(dir + "/model_00000003.bin"));
        for (int rank : {0, 1}) {
            char a[64], b[64];
            snprintf(a, sizeof(a), "/state_00000002_%05d.bin", rank);
            snprintf(b, sizeof(b), "/state_00000003_%05d.bin", rank);
            std::string sa = test::read_text(dir + a), sb = test::read_text(dir + b);
            ASSERT_GT(sa.size(), (size_t)HEADER_BYTES);
            EXPECT_EQ(sa.substr(HEADER_BYTES), sb.substr(HEADER_BYTES)) << "AdamW state of process " << rank;
        }
        auto run = read_run(dir, steps);  // (inside TEST, "Run" is testing::Test::Run)
        ASSERT_EQ(run.loss.size(), (size_t)steps);
        for (int s = 0; s < steps; s++) EXPECT_TRUE(std::isfinite(run.loss[s])) << "loss at step " << s;
        for (float p : run.params) ASSERT_TRUE(std::isfinite(p));
        EXPECT_NE(run.params, read_run(dir, 3).params) << "step 3 updated the weights";
        EXPECT_NE(test::read_text(dir + "/metrics.jsonl").find("\"step\": 2, \"train_loss\""), std::string::npos);
        EXPECT_NE(test::read_text(dir + "/metrics.jsonl").find("\"skipped\": true, \"skipped_steps\": 1"), std::string::npos);
    }
}

TEST(Distributed, Zero0AndZero1Agree) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    int steps = 4;
    std::string z0 = test::scratch_dir("dp_z0"), z1 = test::scratch_dir("dp_z1");
    test::CommandResult r0 = test::run_command(mpirun(2) + train_args(oracle_dir, steps, 128) + " -z 0 -o " + z0);
    ASSERT_EQ(r0.exit_code, 0) << r0.output;
    test::CommandResult r1 = test::run_command(mpirun(2) + train_args(oracle_dir, steps, 128) + " -z 1 -o " + z1);
    ASSERT_EQ(r1.exit_code, 0) << r1.output;
    expect_same_training(read_run(z0, steps), read_run(z1, steps), steps, 1e-3);
    // ZeRO-1 keeps half the moments per process: 14343 parameters -> shards of 7172
    EXPECT_NE(r1.output.find("AdamW over 7172 parameters"), std::string::npos) << r1.output;
    EXPECT_NE(r0.output.find("AdamW over 14343 parameters"), std::string::npos) << r0.output;
}

// The number after `label` on the line of the start-up memory table that starts with it, and the
// number after "(formula " on that line.
void memory_line(const std::string& output, const std::string& label, double* allocated, double* formula) {
    size_t at = output.find("\n  " + label);
    ASSERT_NE(at, std::string::npos) << label << "\n" << output;
    std::string line = output.substr(at + 3, output.find('\n', at + 3) - at - 3);
    *allocated = atof(line.c_str() + label.size());
    size_t f = line.find("(formula ");
    ASSERT_NE(f, std::string::npos) << line;
    *formula = atof(line.c_str() + f + 9);
}

// -z 2 and -z 3 against -z 0 on the same global batch (2 and 3 processes, 2 accumulation steps, the
// ODD model: 14343 parameters, a padded shard with 2 processes). Same tolerances as above.
// The start-up table: each term is the ZeRO formula (computed here from Ψ and N) plus at most the
// padding of the shards: fewer than N elements (4 bytes each, 8 for the two moments).
// Communication (metrics.jsonl, ring model of llmc/parallel/comm.h): -z 0 all-reduces Ψ once per step,
// 16Ψ(N-1)/N bytes; -z 2 reduce-scatters Ψ every micro-step and all-gathers Ψ once,
// (8*accum + 8)Ψ(N-1)/N; -z 3 gathers the parameters twice per micro-step (the backward skips unit 0)
// and never after the update, so it moves more than -z 2. 1% covers the per-unit rounding of N.
TEST(Distributed, Zero2And3MatchZero0WithAccumulation) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    const double psi = 14343;
    const int steps = 3, accum = 2;
    for (int np : {2, 3}) {
        std::map<int, ::Run> runs;  // (inside TEST, "Run" is testing::Test::Run)
        std::map<int, std::vector<double>> comm;
        for (int zero : {0, 2, 3}) {
            SCOPED_TRACE(std::to_string(np) + " processes, -z " + std::to_string(zero));
            std::string dir = test::scratch_dir("dp_z" + std::to_string(zero) + "_np" + std::to_string(np));
            test::CommandResult r = test::run_command(mpirun(np) + train_args(oracle_dir, steps, 2 * 16 * np * accum) +
                                                      " -z " + std::to_string(zero) + " -o " + dir);
            ASSERT_EQ(r.exit_code, 0) << r.output;
            runs[zero] = read_run(dir, steps);
            comm[zero] = test::jsonl_values(dir + "/metrics.jsonl", "comm_bytes");
            ASSERT_EQ(comm[zero].size(), (size_t)steps);
            EXPECT_NE(r.output.find("peak resident memory of process 0"), std::string::npos) << r.output;
            double fp = zero == 3 ? 4 * psi / np : 4 * psi, fg = zero >= 2 ? 4 * psi / np : 4 * psi;
            double fo = zero >= 1 ? 8 * psi / np : 8 * psi;
            struct { const char* label; double formula, bytes_per_element; } terms[] = {
                {"parameters", fp, 4}, {"gradients", fg, 4}, {"optimizer state", fo, 8}};
            for (auto& t : terms) {
                double allocated = 0, printed_formula = 0;
                memory_line(r.output, t.label, &allocated, &printed_formula);
                EXPECT_NEAR(printed_formula, t.formula, 0.5) << t.label;
                EXPECT_GE(allocated, t.formula) << t.label;
                EXPECT_LT(allocated, t.formula + t.bytes_per_element * np) << t.label;
            }
        }
        SCOPED_TRACE(std::to_string(np) + " processes");
        expect_same_training(runs[0], runs[2], steps, 1e-3);
        expect_same_training(runs[0], runs[3], steps, 1e-3);
        double ring = psi * (np - 1) / np;
        for (int s = 0; s < steps; s++) {
            EXPECT_NEAR(comm[0][s], 16 * ring, 0.01 * 16 * ring) << "step " << s;
            EXPECT_NEAR(comm[2][s], (8 * accum + 8) * ring, 0.01 * (8 * accum + 8) * ring) << "step " << s;
            EXPECT_GT(comm[3][s], comm[2][s]) << "step " << s;
        }
    }
}

// The memory plan (-P 1, llmc/run/memory_plan.h) from the shapes alone: it reads no data (the -i
// pattern matches nothing) and allocates nothing, and its total is exactly what the run then allocates
// for the same layout (the printed count of the arrays' bytes: the vectors' sizes, counted apart from
// the plan's arithmetic), for one process and for 2 with -z 3 (shards and unit buffers), -tp 2 (with and
// without -sq 1), -pp 2 and -cp 2 (ring and Ulysses: their buffers)
// (that those allocations follow the ZeRO formula is Zero2And3MatchZero0WithAccumulation's). A run whose arrays
// exceed the host's available memory (d48 at B=64, T=1024: its model state alone is 25 GB) stops before
// reading its model, with the sizes.
TEST(Distributed, MemoryPlanIsWhatTheRunAllocates) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string odd_dir = test::oracle("tiny_odd", ODD), tiny_dir = test::oracle("tiny", TINY);
    struct Case { int np, dp; const char* flags; bool odd; };
    const Case cases[] = {{1, 1, "-z 0", true}, {2, 2, "-z 3", true}, {2, 1, "-tp 2", false}, {2, 1, "-tp 2 -sq 1", false}, {2, 1, "-pp 2", false},
                          {2, 1, "-cp 2", false}, {2, 1, "-cp 2 -cpm ulysses", false}};
    for (const Case& c : cases) {
        SCOPED_TRACE(std::to_string(c.np) + " process(es), " + c.flags);
        std::string run_flags = train_args(c.odd ? odd_dir : tiny_dir, 1, 2 * 16 * c.dp) + " " + c.flags;
        test::CommandResult plan = test::run_command(mpirun(c.np) + run_flags + " -n 0 -P 1 -i '/nonexistent/*.bin'");
        ASSERT_EQ(plan.exit_code, 0) << plan.output;
        EXPECT_EQ(plan.output.find("step "), std::string::npos) << plan.output;
        size_t at = plan.output.rfind("plan: total ");
        ASSERT_NE(at, std::string::npos) << plan.output;
        unsigned long long planned = 0;
        ASSERT_EQ(sscanf(plan.output.c_str() + at, "plan: total %llu bytes per process", &planned), 1);
        std::string dir = test::scratch_dir("plan_case" + std::to_string(&c - cases));
        test::CommandResult run = test::run_command(mpirun(c.np) + run_flags + " -o " + dir);
        ASSERT_EQ(run.exit_code, 0) << run.output;
        at = run.output.find("bytes planned (-P 1), ");
        ASSERT_NE(at, std::string::npos) << run.output;
        unsigned long long allocated = 0;
        ASSERT_EQ(sscanf(run.output.c_str() + at, "bytes planned (-P 1), %llu allocated", &allocated), 1);
        EXPECT_EQ(planned, allocated);
    }
    std::string big = test::root() + "/train_gpt2 -e d48 -b 64 -t 1024 -i " + tiny_dir + "/train.bin -x 1 -v 0 -s 0";
    test::CommandResult refused = test::run_command(big + " -o " + test::scratch_dir("plan_refused"));
    EXPECT_NE(refused.exit_code, 0) << refused.output;
    EXPECT_NE(refused.output.find("nothing was allocated"), std::string::npos) << refused.output;
    EXPECT_EQ(refused.output.find("step "), std::string::npos) << refused.output;
}

// A checkpoint written with -z 3 resumes as -z 0 and the other way round (3 processes, so the state
// files hold shards in one run and all moments in the other), and a 2-process -z 3 checkpoint resumes
// as 3 processes with -z 2 (other shards, assembled from the files that cover them; the data order does
// not depend on the process count): each resumed run continues as the uninterrupted -z 0 run, to the
// tolerance of the comparisons above.
TEST(Distributed, ResumeAcrossZeroStagesAndProcessCounts) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    std::string cmd = train_args(oracle_dir, 4, 192) + " -n 2";
    std::string whole = test::scratch_dir("dp_stage_whole");
    ASSERT_EQ(test::run_command(mpirun(3) + cmd + " -z 0 -o " + whole).exit_code, 0);
    struct Case { int np, zero, then_np, then_zero; };
    for (Case c : {Case{3, 3, 3, 0}, Case{3, 0, 3, 3}, Case{2, 3, 3, 2}}) {
        std::string name = std::to_string(c.np) + "_" + std::to_string(c.zero) + "_" + std::to_string(c.then_np) + "_" +
                           std::to_string(c.then_zero);
        SCOPED_TRACE(std::to_string(c.np) + " processes -z " + std::to_string(c.zero) + ", then " +
                     std::to_string(c.then_np) + " processes -z " + std::to_string(c.then_zero));
        std::string dir = test::scratch_dir("dp_stage_" + name);
        ASSERT_EQ(test::run_command(mpirun(c.np) + cmd + " -z " + std::to_string(c.zero) + " -o " + dir).exit_code, 0);
        std::vector<std::string> last = {"/model_00000004.bin", "/DONE_00000004"};
        for (int r = 0; r < c.np; r++) last.push_back("/state_00000004_0000" + std::to_string(r) + ".bin");
        for (const std::string& f : last) ASSERT_EQ(remove((dir + f).c_str()), 0) << f;
        test::CommandResult resumed = test::run_command(mpirun(c.then_np) + cmd + " -z " + std::to_string(c.then_zero) +
                                                        " -o " + dir + " -y 1");
        ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
        EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
        expect_same_training(read_run(whole, 4), read_run(dir, 4), 4, 1e-3);
    }
}

// A checkpoint is layout-independent (llmc/run/train_state.h assembles each process's optimizer range from
// all state files; the shuffled data order is one order dealt to the ranks): the 2-process -z 1
// checkpoint of step 3 resumes bit for bit as 2 processes, and as 3 processes and as 1 process to fp32
// rounding (expect_same_training: their sums are ordered differently).
TEST(Distributed, ResumeAcrossRanksEqualsUninterrupted) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    std::string cmd = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                      "/train.bin -b 2 -t 16 -d 192 -x 6 -n 3 -l 1e-3 -sh 1 -v 0 -s 0 -z 1";  // 192 = 3 x 2 x 32 = 2 x 3 x 32
    std::string a = test::scratch_dir("dp_resume_a"), b = test::scratch_dir("dp_resume_b");
    ASSERT_EQ(test::run_command(mpirun(2) + cmd + " -o " + a).exit_code, 0);
    ASSERT_EQ(test::run_command(mpirun(2) + cmd + " -o " + b).exit_code, 0);
    for (const char* f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/state_00000006_00001.bin", "/DONE_00000006"}) {
        ASSERT_EQ(remove((b + f).c_str()), 0) << f;
    }
    std::string three = test::scratch_dir("dp_resume_three"), one = test::scratch_dir("dp_resume_one");
    ASSERT_EQ(test::run_command("cp -r " + b + "/. " + three + " && cp -r " + b + "/. " + one).exit_code, 0);
    test::CommandResult resumed = test::run_command(mpirun(2) + cmd + " -o " + b + " -y 1");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 3"), std::string::npos) << resumed.output;
    // same process count, same reduction order: bit for bit
    EXPECT_EQ(test::read_text(a + "/model_00000006.bin"), test::read_text(b + "/model_00000006.bin"));
    EXPECT_EQ(test::read_text(a + "/state_00000006_00001.bin"), test::read_text(b + "/state_00000006_00001.bin"));
    EXPECT_EQ(test::jsonl_values(a + "/metrics.jsonl", "train_loss"), test::jsonl_values(b + "/metrics.jsonl", "train_loss"));
    // another process count takes the same checkpoint and continues as the uninterrupted run
    test::CommandResult r3 = test::run_command(mpirun(3) + cmd + " -o " + three + " -y 1");
    ASSERT_EQ(r3.exit_code, 0) << r3.output;
    EXPECT_NE(r3.output.find("continuing from step 3"), std::string::npos) << r3.output;
    expect_same_training(read_run(a, 6), read_run(three, 6), 6, 1e-3);
    test::CommandResult r1 = test::run_command("OMP_NUM_THREADS=1 " + cmd + " -o " + one + " -y 1");
    ASSERT_EQ(r1.exit_code, 0) << r1.output;
    expect_same_training(read_run(a, 6), read_run(one, 6), 6, 1e-3);
    // the 3-process run wrote 3 state files; one process resumes from them too
    std::string again = test::scratch_dir("dp_resume_again");
    ASSERT_EQ(test::run_command("cp -r " + three + "/. " + again).exit_code, 0);
    test::CommandResult more = test::run_command("OMP_NUM_THREADS=1 " + cmd + " -x 7 -o " + again + " -y 1");
    ASSERT_EQ(more.exit_code, 0) << more.output;
    EXPECT_NE(more.output.find("continuing from step 6"), std::string::npos) << more.output;
}

// One data stream whatever the layout (llmc/io/dataloader.h: a stream of T-token samples; a step reads
// N = tokens per step / T of them, however N splits into B rows x A accumulation steps x P processes),
// also where the data crosses shard and epoch boundaries: the oracle's tokens cut into shards of 35, 27
// and 31 samples of T = 16 (93 an epoch), 9 steps of N = 12 samples (shard boundaries inside steps 2
// and 5, the epoch's end inside step 7), as 1 process with B = 2 x 6 accumulation steps (the
// reference), 1 with B = 4 x 3, 2 with B = 2 x 3, 3 with B = 4 x 1 and 2 with B = 6 x 1, shuffled and
// not: same losses and norms to 1e-3 relative, same final weights (expect_same_training: the sums run
// in another order). The val loss (-m 7 batches of B over val shards of 6 samples each, at steps 0 and
// 9) agrees where B does (-m counts batches). And elastic resumes: the reference's step-3 checkpoint
// (inside the second shard) continues as 3 processes with B = 4, and the 3-process run's step-6
// checkpoint as 2 processes with B = 2 x 3, each as the reference did.
TEST(Distributed, OneStreamWhateverTheLayout) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    std::string data = test::scratch_dir("dp_boundary_data");
    {
        FILE* fp;
        int64_t n = shard_open(oracle_dir + "/train.bin", &fp);
        std::vector<uint16_t> tokens(n);
        freadCheck(tokens.data(), 2, n, fp);
        fcloseCheck(fp);
        int64_t at = 0, i = 0;
        for (int64_t samples : {35, 27, 31}) {
            int64_t len = samples * 16 + 1;
            ASSERT_LE(at + len, n);
            shard_write(data + "/odd_train_00000" + std::to_string(i++) + ".bin", tokens.data() + at, len);
            at += len;
        }
        for (int v = 0; v < 3; v++) {
            ASSERT_LE(at + 97, n);
            shard_write(data + "/odd_val_00000" + std::to_string(v) + ".bin", tokens.data() + at, 97);
            at += 97;
        }
    }
    const int steps = 9;
    struct Layout { int np, B; std::string name; };
    const std::vector<Layout> layouts = {{1, 2, "np1_b2"}, {1, 4, "np1_b4"}, {2, 2, "np2_b2"}, {3, 4, "np3_b4"}, {2, 6, "np2_b6"}};
    for (int shuffle : {0, 1}) {
        SCOPED_TRACE(shuffle ? "shuffled" : "unshuffled");
        auto cmd = [&](int B) {
            return test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i '" + data + "/odd_train_*.bin' -j '" +
                   data + "/odd_val_*.bin' -b " + std::to_string(B) + " -t 16 -d 192 -x 9 -n 3 -l 1e-3 -c 0.1 -v 9 -m " +
                   (B == 6 ? "3" : B == 4 ? "4" : "7") + " -s 0 -sh " + std::to_string(shuffle);
        };
        std::map<std::string, std::string> dirs;
        for (const Layout& l : layouts) {
            SCOPED_TRACE(l.name);
            dirs[l.name] = test::scratch_dir("dp_stream_" + l.name + "_sh" + std::to_string(shuffle));
            test::CommandResult r = test::run_command((l.np == 1 ? std::string("OMP_NUM_THREADS=1 ") : mpirun(l.np)) +
                                                      cmd(l.B) + " -o " + dirs[l.name]);
            ASSERT_EQ(r.exit_code, 0) << r.output;
            if (l.name == "np1_b2") continue;
            expect_same_training(read_run(dirs["np1_b2"], steps), read_run(dirs[l.name], steps), steps, 1e-3);
            if (l.B == 2) {
                std::vector<double> val1 = test::jsonl_values(dirs["np1_b2"] + "/metrics.jsonl", "val_loss");
                std::vector<double> val = test::jsonl_values(dirs[l.name] + "/metrics.jsonl", "val_loss");
                ASSERT_EQ(val1.size(), 2u);
                ASSERT_EQ(val.size(), 2u);
                for (int k = 0; k < 2; k++) EXPECT_NEAR(val[k], val1[k], 1e-5 * val1[k]) << "val loss " << k;
            }
        }
        if (!shuffle) continue;
        struct Case { std::string from; int from_step; Layout to; };
        for (const Case& c : {Case{"np1_b2", 3, layouts[3]}, Case{"np3_b4", 6, layouts[2]}}) {
            SCOPED_TRACE("step " + std::to_string(c.from_step) + " of " + c.from + " resumed as " + c.to.name);
            std::string dir = test::scratch_dir("dp_stream_resume_" + c.from + "_" + c.to.name);
            ASSERT_EQ(test::run_command("cp -r " + dirs[c.from] + "/. " + dir).exit_code, 0);
            for (int later = c.from_step + 3; later <= steps; later += 3) {
                char name[32];
                snprintf(name, sizeof(name), "%08d", later);
                ASSERT_EQ(test::run_command(std::string("rm ") + dir + "/*_" + name + "*").exit_code, 0);
            }
            test::CommandResult r = test::run_command(mpirun(c.to.np) + cmd(c.to.B) + " -o " + dir + " -y 1");
            ASSERT_EQ(r.exit_code, 0) << r.output;
            EXPECT_NE(r.output.find("continuing from step " + std::to_string(c.from_step)), std::string::npos) << r.output;
            expect_same_training(read_run(dirs["np1_b2"], steps), read_run(dir, steps), steps, 1e-3);
        }
    }
}

// Tensor parallelism (llmc/parallel/tensor_parallel.h) against one process on the same global batch, to fp32
// rounding (expect_same_training: the all-reduces order the sums differently): tp 2; tp 3 on a model
// whose 3 heads it divides (C = 21: 7 columns per rank; Vp 384: 128 vocabulary rows per rank); and
// tp 2 x dp 2 with ZeRO-1. Each process must also hold only its slices: the printed parameter memory.
// With sequence parallelism (-sq 1): tp 2; tp 3, whose B·T = 32 rows split 11, 11, 10 (the last rank's
// block padded); tp 2 x dp 2 with ZeRO-1 at -r 2 (the layernorms recomputed on this rank's rows). Their
// activations must shrink: the (B·T, C) tensors are held by rows (the test model's T x T attention
// maps and 4C columns are not, so well under the -sq 0 figure, not 1/tp of it).
TEST(ModelParallel, TensorParallelMatchesOneProcess) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    struct Case { const char* model; std::string name; int np; std::string flags; };
    std::vector<Case> cases = {
        {TINY, "tiny", 2, "-tp 2"},
        {ODD, "tiny_odd", 3, "-tp 3"},
        {TINY, "tiny", 4, "-tp 2 -z 1"},
        {TINY, "tiny", 2, "-tp 2 -sq 1"},
        {ODD, "tiny_odd", 3, "-tp 3 -sq 1"},
        {TINY, "tiny", 4, "-tp 2 -z 1 -sq 1 -r 2"},
    };
    std::map<std::string, double> activations;
    int steps = 4, total = 2 * 16 * 4;  // 4 micro-batches per step: 4 x 1 process, 2 x 2 DP ranks
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name + " np " + std::to_string(c.np) + " " + c.flags);
        std::string oracle_dir = test::oracle(c.name, c.model);
        std::string one = test::scratch_dir("tp_one"), many = test::scratch_dir("tp_many");
        test::CommandResult r1 = test::run_command("OMP_NUM_THREADS=1 " + train_args(oracle_dir, steps, total) + " -o " + one);
        ASSERT_EQ(r1.exit_code, 0) << r1.output;
        test::CommandResult rn = test::run_command(mpirun(c.np) + train_args(oracle_dir, steps, total) + " " + c.flags + " -o " + many);
        ASSERT_EQ(rn.exit_code, 0) << rn.output;
        int tp = c.flags.find("-tp 3") != std::string::npos ? 3 : 2;
        EXPECT_NE(rn.output.find("layout: tp " + std::to_string(tp) + " x pp 1 x dp " + std::to_string(c.np / tp)),
                  std::string::npos) << rn.output;
        expect_same_training(read_run(one, steps), read_run(many, steps), steps, 1e-3);
        // parameters per process: the split tensors' share shrinks by tp (wte, qkv, attproj, fc, fcproj
        // are almost all of the model), so well under 1/tp + 25% of one process's
        auto param_mib = [](const std::string& out) {
            size_t at = out.find("memory per process: parameters ");
            return at == std::string::npos ? -1.0 : atof(out.c_str() + at + strlen("memory per process: parameters "));
        };
        EXPECT_GT(param_mib(rn.output), 0.0) << rn.output;
        EXPECT_LT(param_mib(rn.output), param_mib(r1.output) * (1.0 / tp + 0.25)) << rn.output << r1.output;
        bool sp = c.flags.find("-sq 1") != std::string::npos;
        if (sp) {
            EXPECT_NE(rn.output.find(", sequence parallel"), std::string::npos) << rn.output;
        }
        activations[c.flags] = mib_after(rn.output, "MiB, activations ");
    }
    for (const char* flags : {"-tp 2", "-tp 3"}) {
        SCOPED_TRACE(flags);
        EXPECT_GT(activations[std::string(flags) + " -sq 1"], 0.0);
        EXPECT_LT(activations[std::string(flags) + " -sq 1"], 0.9 * activations[flags]);
    }
}

// A layout's checkpoint resumes in other layouts: with the model of `oracle_dir`, 6 steps of 192 tokens
// (6 x 32 = 3 DP ranks x 2 x 32 = 2 DP ranks x 3 x 32; shuffled, so the data order matters) are trained
// by one process (the reference) and by 4 processes with `written_flags`, checkpointing at step 3 and 6.
// The step-6 checkpoint is removed, and each of `resumes` (a name, the launch, the flags) continues from
// step 3: every run continues as the uninterrupted one-process run would (expect_same_training).
struct Resume { std::string name, launch, flags; };
void expect_checkpoint_resumes_in_any_layout(const std::string& oracle_dir, const std::string& name,
                                             const std::string& written_flags, const std::vector<Resume>& resumes) {
    std::string cmd = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                      "/train.bin -b 2 -t 16 -d 192 -x 6 -n 3 -l 1e-3 -c 0.1 -sh 1 -v 0 -s 0";
    std::string ref = test::scratch_dir(name + "_ref"), written = test::scratch_dir(name + "_written");
    test::CommandResult r = test::run_command("OMP_NUM_THREADS=1 " + cmd + " -o " + ref);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = test::run_command(mpirun(4) + cmd + written_flags + " -o " + written);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_training(read_run(ref, 6), read_run(written, 6), 6, 1e-3);
    for (const char* f : {"/model_00000006.bin", "/DONE_00000006"}) ASSERT_EQ(remove((written + f).c_str()), 0) << f;
    for (const Resume& res : resumes) {
        SCOPED_TRACE("resumed as " + res.name);
        std::string dir = test::scratch_dir(name + "_" + res.name);
        ASSERT_EQ(test::run_command("cp -r " + written + "/. " + dir).exit_code, 0);
        test::CommandResult rr = test::run_command(res.launch + cmd + res.flags + " -o " + dir + " -y 1");
        ASSERT_EQ(rr.exit_code, 0) << rr.output;
        EXPECT_NE(rr.output.find("continuing from step 3"), std::string::npos) << rr.output;
        expect_same_training(read_run(ref, 6), read_run(dir, 6), 6, 1e-3);
    }
}

// A checkpoint written by tp 2 x dp 2 (ZeRO-1) resumes as one process, as dp 3 and as tp 2.
TEST(ModelParallel, TensorParallelCheckpointResumesInAnyLayout) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    expect_checkpoint_resumes_in_any_layout(test::oracle("tiny", TINY), "tp_ck", " -tp 2 -z 1",
                                            {{"one", "OMP_NUM_THREADS=1 ", ""}, {"dp3", mpirun(3), " -z 1"},
                                             {"tp2", mpirun(2), " -tp 2"}});
}

// Context parallelism (llmc/parallel/context_parallel.h): -cp 2, 3, 4 by the ring and by Ulysses (ODD's 3
// heads for Ulysses over 3), 2 replicas x cp 2 with ZeRO-1, cp 2 with ZeRO-3 and whole blocks recomputed
// (the ring runs again in the backward), with -tp 2 and with -pp 2, each at T = 24 (the ring's 2N chunks
// of 6, 4, 3 positions), follow one process over 4 steps: the losses, norms and final weights of
// expect_same_training (the sums differ in order only). Each process's activations are 1/cp of one
// process's (every tensor is per row, and the stored attention weights are its rows' against all T keys,
// or Ulysses's heads': 1/cp of them either way). The communication logged per step is what the start-up
// line predicted for the attention plus the gradients' all-reduce, which a data-parallel run of as many
// processes moves alone.
TEST(ModelParallel, ContextParallelMatchesOneProcess) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    struct Case { const char* model; std::string name; int np; std::string flags; };
    std::vector<Case> cases = {
        {TINY, "tiny", 2, "-cp 2"},
        {TINY, "tiny", 3, "-cp 3"},
        {TINY, "tiny", 4, "-cp 4"},
        {TINY, "tiny", 2, "-cp 2 -cpm ulysses"},
        {TINY, "tiny", 4, "-cp 4 -cpm ulysses"},
        {ODD, "tiny_odd", 3, "-cp 3 -cpm ulysses"},
        {TINY, "tiny", 4, "-cp 2 -z 1"},
        {TINY, "tiny", 2, "-cp 2 -z 3 -r 3"},
        {TINY, "tiny", 4, "-cp 2 -tp 2 -cpm ulysses"},
        {TINY, "tiny", 4, "-cp 2 -pp 2"},
    };
    auto activations = [](const std::string& out) { return mib_after(out, "MiB, activations "); };
    int steps = 4, total = 2 * 24 * 4;  // 4 micro-batches of 2 x 24 tokens per step on one replica
    std::map<std::string, test::CommandResult> ones;  // the one-process runs, by model
    std::map<std::string, std::string> one_dirs;
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name + " np " + std::to_string(c.np) + " " + c.flags);
        std::string oracle_dir = test::oracle(c.name, c.model);
        std::string cmd = train_args(oracle_dir, steps, total) + " -t 24", many = test::scratch_dir("cp_many");
        if (!ones.count(c.name)) {
            one_dirs[c.name] = test::scratch_dir("cp_one_" + c.name);
            ones[c.name] = test::run_command("OMP_NUM_THREADS=1 " + cmd + " -o " + one_dirs[c.name]);
        }
        const std::string& one = one_dirs[c.name];
        ASSERT_EQ(ones[c.name].exit_code, 0) << ones[c.name].output;
        test::CommandResult rn = test::run_command(mpirun(c.np) + cmd + " " + c.flags + " -o " + many);
        ASSERT_EQ(rn.exit_code, 0) << rn.output;
        int cp = c.flags[4] - '0';
        EXPECT_NE(rn.output.find("replica(s) x cp " + std::to_string(cp)), std::string::npos) << rn.output;
        expect_same_training(read_run(one, steps), read_run(many, steps), steps, 1e-3);
        if (c.flags.find("-tp") == std::string::npos && c.flags.find("-pp") == std::string::npos &&
            c.flags.find("-r") == std::string::npos) {  // (the one-process run is at -r 1)
            double mine = activations(rn.output), whole = activations(ones[c.name].output);
            EXPECT_GT(mine, 0.0) << rn.output;
            EXPECT_NEAR(mine, whole / cp, 0.002) << rn.output;  // printed to 3 decimals
        }
    }
    // the bytes: cp 2 (4 micro-batches) against dp 2 (2 each), both all-reducing the same gradients over 2
    std::string dir = test::oracle("tiny", TINY);
    for (const char* mode : {"ring", "ulysses"}) {
        SCOPED_TRACE(mode);
        std::string cp_dir = test::scratch_dir("cp_bytes"), dp_dir = test::scratch_dir("dp_bytes");
        std::string cmd = train_args(dir, 2, total) + " -t 24";
        test::CommandResult cp = test::run_command(mpirun(2) + cmd + " -cp 2 -cpm " + mode + " -o " + cp_dir);
        test::CommandResult dp = test::run_command(mpirun(2) + cmd + " -o " + dp_dir);
        ASSERT_EQ(cp.exit_code, 0) << cp.output;
        ASSERT_EQ(dp.exit_code, 0) << dp.output;
        size_t at = cp.output.find("attention traffic ");
        ASSERT_NE(at, std::string::npos) << cp.output;
        double predicted = atof(cp.output.c_str() + at + strlen("attention traffic "));
        std::vector<double> cp_bytes = test::jsonl_values(cp_dir + "/metrics.jsonl", "comm_bytes");
        std::vector<double> dp_bytes = test::jsonl_values(dp_dir + "/metrics.jsonl", "comm_bytes");
        ASSERT_EQ(cp_bytes.size(), 2u);
        ASSERT_EQ(dp_bytes.size(), 2u);
        EXPECT_GT(predicted, 0.0);
        for (int s = 0; s < 2; s++) EXPECT_EQ(cp_bytes[s] - dp_bytes[s], predicted) << "step " << s;
    }
}

// The val loss of a -cp run is the sum of each process's share of its rows' mean: the one process's
// (1e-5 relative, the sums' order); a sample is drawn from a whole copy of the parameters on process 0,
// so before any step (the same parameters) the same tokens as one process's.
TEST(ModelParallel, ContextParallelEvaluatesAndSamplesAsOneProcess) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string dir = test::oracle("tiny", TINY);
    std::string cmd = train_args(dir, 2, 192) + " -t 24 -v 2 -m 3 -j " + dir + "/train.bin -s 2 -g 8";
    auto sample = [](const std::string& out) {
        size_t at = out.find("--- sample ---");
        return at == std::string::npos ? std::string() : out.substr(at, out.find("-----", at + 14) - at);
    };
    std::string one_dir = test::scratch_dir("cp_eval_one");
    test::CommandResult one = test::run_command("OMP_NUM_THREADS=1 " + cmd + " -o " + one_dir);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    std::vector<double> one_val = test::jsonl_values(one_dir + "/metrics.jsonl", "val_loss");
    ASSERT_EQ(one_val.size(), 2u);
    ASSERT_FALSE(sample(one.output).empty()) << one.output;
    for (const char* flags : {"-cp 2", "-cp 2 -cpm ulysses", "-cp 4 -z 1"}) {
        SCOPED_TRACE(flags);
        std::string many_dir = test::scratch_dir("cp_eval_many");
        test::CommandResult many = test::run_command(mpirun(flags[4] - '0') + cmd + " " + flags + " -o " + many_dir);
        ASSERT_EQ(many.exit_code, 0) << many.output;
        std::vector<double> val = test::jsonl_values(many_dir + "/metrics.jsonl", "val_loss");
        ASSERT_EQ(val.size(), 2u);
        for (int i = 0; i < 2; i++) EXPECT_NEAR(val[i], one_val[i], 1e-5 * one_val[i]) << "val loss " << i;
        EXPECT_EQ(sample(many.output), sample(one.output));
    }
}

// A -cp 2 run (2 replicas, ZeRO-1) resumed from its step-3 checkpoint in the same layout ends with the
// uninterrupted run's bits; its checkpoint resumed as one process and as -cp 4 by Ulysses continues as
// one process would (the state files are the layout's, not the split's).
TEST(ModelParallel, ContextParallelCheckpointResumes) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny", TINY);
    std::string cmd = mpirun(4) + test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                      "/train.bin -b 2 -t 16 -d 128 -x 5 -n 1 -l 1e-3 -sh 1 -v 0 -s 0 -cp 2 -z 1";
    std::string a = test::scratch_dir("cp_bits_a"), b = test::scratch_dir("cp_bits_b");
    test::CommandResult r = test::run_command(cmd + " -o " + a);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    test::expect_resume_from_step_3_same_bits(cmd, a, b);
    expect_checkpoint_resumes_in_any_layout(oracle_dir, "cp_ck", " -cp 2 -z 1",
                                            {{"one", "OMP_NUM_THREADS=1 ", ""}, {"cp4", mpirun(4), " -cp 4 -cpm ulysses"}});
}

// The stages cover every layer once, as evenly as possible; each schedule runs every micro-batch's
// forward then its backward once per stage, in order, and never needs more activation slots than
// pp_activation_slots says (micro-batch i uses slot i % slots: the slot must be free when its forward starts).
TEST(Pipeline, StagesAndSchedules) {
    for (int L : {1, 4, 5, 12}) {
        for (int p = 1; p <= L; p++) {
            int next = 0;
            for (int s = 0; s < p; s++) {
                int l0, l1;
                pp_stage_layers(L, p, s, &l0, &l1);
                EXPECT_EQ(l0, next);
                EXPECT_TRUE(l1 - l0 == L / p || l1 - l0 == L / p + 1) << L << " " << p << " " << s;
                next = l1;
            }
            EXPECT_EQ(next, L);
        }
    }
    for (std::string kind : {"gpipe", "1f1b"}) {
        for (int p : {1, 2, 3, 4}) {
            for (int m : {1, 2, 3, 4, 8}) {
                for (int s = 0; s < p; s++) {
                    SCOPED_TRACE(kind + " p " + std::to_string(p) + " s " + std::to_string(s) + " m " + std::to_string(m));
                    int slots = pp_activation_slots(kind, p, s, m);
                    std::vector<int> slot_owner(slots, -1);
                    int next_f = 0, next_b = 0, alive = 0, most_alive = 0;
                    for (const PipelineOp& op : pp_schedule(kind, p, s, m)) {
                        if (op.forward) {
                            ASSERT_EQ(op.micro, next_f++);
                            ASSERT_EQ(slot_owner[op.micro % slots], -1) << "slot still in use";
                            slot_owner[op.micro % slots] = op.micro;
                            most_alive = std::max(most_alive, ++alive);
                        } else {
                            ASSERT_EQ(op.micro, next_b++);
                            ASSERT_LT(op.micro, next_f) << "backward before forward";
                            ASSERT_EQ(slot_owner[op.micro % slots], op.micro);
                            slot_owner[op.micro % slots] = -1;
                            alive--;
                        }
                    }
                    EXPECT_EQ(next_f, m);
                    EXPECT_EQ(next_b, m);
                    EXPECT_EQ(most_alive, kind == "gpipe" ? m : std::min(m, p - s));
                }
            }
        }
    }
}

// Issue 51, item 8: a pipeline step's forwards and backwards interleave in its schedule and are timed as
// one span; the step line said "forward X backward 0.0" as if the backward took no time. It says
// "forward+backward X" instead, and metrics.jsonl has the span as ms_forward and ms_backward null.
TEST(ModelParallel, PipelineStepLineTimesItsScheduleAsForwardAndBackward) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_five", FIVE);
    std::string out = test::scratch_dir("pp_step_line");
    test::CommandResult r = test::run_command(mpirun(2) + train_args(oracle_dir, 2, 2 * 16 * 4) + " -pp 2 -o " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(" forward+backward "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(" backward 0.0 "), std::string::npos) << r.output;
    std::string metrics = test::read_text(out + "/metrics.jsonl");
    EXPECT_NE(metrics.find("\"ms_backward\": null"), std::string::npos) << metrics;
}

// Pipeline parallelism (llmc/parallel/pipeline.h) against one process on the same global batch, to fp32
// rounding (expect_same_training: the tied wte gradient is summed across stages at the end of the step
// instead of accumulated in place). 5 layers split 3+2 and 2+2+1; both schedules; with dp and tp.
// Also: each stage stores less than the whole model; 1F1B keeps fewer activations than GPipe; the
// step line shows the measured bubble and the formula (p-1)/(m+p-1).
TEST(ModelParallel, PipelineParallelMatchesOneProcess) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    struct Case { int np; std::string flags, formula; };
    int steps = 3, total = 2 * 16 * 4;  // m = 4 micro-batches per step (2 with dp 2)
    std::vector<Case> cases = {
        {2, "-pp 2 -pm 1f1b", "(formula 0.200)"},  // 1/5
        {3, "-pp 3 -pm 1f1b", "(formula 0.333)"},  // 2/6
        {3, "-pp 3 -pm gpipe", "(formula 0.333)"},
        {4, "-pp 2 -z 1", "(formula 0.333)"},  // dp 2: m = 2, 1/3
        {4, "-tp 2 -pp 2 -pm gpipe", "(formula 0.200)"},
        {4, "-tp 2 -pp 2 -sq 1", "(formula 0.200)"},  // the stages send their rows of the residual stream
    };
    std::string oracle_dir = test::oracle("tiny_five", FIVE);
    std::string one = test::scratch_dir("pp_one");
    test::CommandResult r1 = test::run_command("OMP_NUM_THREADS=1 " + train_args(oracle_dir, steps, total) + " -o " + one);
    ASSERT_EQ(r1.exit_code, 0) << r1.output;
    auto mib_after = [](const std::string& out, const std::string& label) {
        size_t at = out.find(label);
        return at == std::string::npos ? -1.0 : atof(out.c_str() + at + label.size());
    };
    std::map<std::string, double> activations;
    for (const Case& c : cases) {
        SCOPED_TRACE("np " + std::to_string(c.np) + " " + c.flags);
        std::string many = test::scratch_dir("pp_many");
        test::CommandResult rn = test::run_command(mpirun(c.np) + train_args(oracle_dir, steps, total) + " " + c.flags + " -o " + many);
        ASSERT_EQ(rn.exit_code, 0) << rn.output;
        expect_same_training(read_run(one, steps), read_run(many, steps), steps, 1e-3);
        EXPECT_NE(rn.output.find("| bubble "), std::string::npos) << rn.output;
        EXPECT_NE(rn.output.find(c.formula), std::string::npos) << rn.output;
        // stage 0 (process 0 prints) holds 3 or 2 of the 5 layers, plus wte and wpe
        double params = mib_after(rn.output, "memory per process: parameters ");
        EXPECT_GT(params, 0.0) << rn.output;
        EXPECT_LT(params, 0.8 * mib_after(r1.output, "memory per process: parameters ")) << rn.output;
        activations[c.flags] = mib_after(rn.output, "MiB, activations ");
    }
    // pp 3, m 4, stage 0: 1F1B keeps p-s = 3 micro-batches' activations, GPipe all 4
    EXPECT_NEAR(activations["-pp 3 -pm 1f1b"] / activations["-pp 3 -pm gpipe"], 3.0 / 4.0, 0.02);
}

// -ni 2 with pp 2: the last stage alone gets a non-finite loss gradient; its infinity reaches stage 0
// through the sent gradients and the norm is summed over the stages, so both skip step 2: the weights
// after it are those before it, and step 3 updates them again.
TEST(ModelParallel, PipelineNonFiniteStepSkippedByEveryStage) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_five", FIVE);
    std::string dir = test::scratch_dir("pp_nonfinite");
    test::CommandResult r = test::run_command(mpirun(2) + train_args(oracle_dir, 4, 128) + " -n 1 -ni 2 -pp 2 -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("SKIPPED"), std::string::npos) << r.output;
    EXPECT_EQ(test::read_text(dir + "/model_00000002.bin"), test::read_text(dir + "/model_00000003.bin"));
    EXPECT_NE(test::read_text(dir + "/model_00000003.bin"), test::read_text(dir + "/model_00000004.bin"));
}

// A checkpoint written by tp 2 x pp 2 resumes as one process, as dp 3 (ZeRO-1) and as pp 3 (GPipe).
TEST(ModelParallel, PipelineCheckpointResumesInAnyLayout) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    expect_checkpoint_resumes_in_any_layout(test::oracle("tiny_five", FIVE), "pp_ck", " -tp 2 -pp 2",
                                            {{"one", "OMP_NUM_THREADS=1 ", ""}, {"dp3", mpirun(3), " -z 1"},
                                             {"pp3", mpirun(3), " -pp 3 -pm gpipe"}});
}

// A layout that cannot split the model or the processes is refused at start-up with the reason.
TEST(Distributed, BadLayoutsAreRefused) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny", TINY);  // L=2, NH=4, V=300 (padded 384)
    std::string base = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                       "/train.bin -b 2 -t 16 -x 1 -v 0 -s 0";
    struct Case { int np; std::string flags, message; };
    std::vector<Case> cases = {
        {1, "-tp 2", "does not divide the 1 process(es)"},
        {3, "-tp 2", "does not divide the 3 process(es)"},
        {3, "-tp 3", "does not divide the model's 4 attention heads"},
        {3, "-pp 3", "more pipeline stages than the model's 2 layers"},
        {1, "-pm zigzag", "unknown pipeline schedule 'zigzag'"},
        {2, "-tp 2 -s 5", "need the whole logits"},
        {2, "-pp 2 -s 5", "not implemented through a pipeline"},
        {1, "-tp 2 -z 2", "the CPU trainer runs ZeRO stages 2 and 3 with data parallelism alone"},
        {1, "-sq 1", "it needs -tp 2 or more"},
        {1, "-pp 2 -z 3", "ZeRO stages 2 and 3 do not run with pipeline stages"},
        {3, "-cp 3", "T = 16 does not divide into 6 chunks"},
        {3, "-cp 3 -cpm ulysses -t 15", "does not divide the 4 heads"},
        {3, "-cp 2", "-cp 2 does not divide the 3 data-parallel process(es)"},
        {2, "-cp 2 -cpm zigzag", "unknown context-parallel attention 'zigzag'"},
        {2, "-cp 2 -he 1", "HellaSwag (-he) scores whole rows"},
        {2, "-cp 2 -lh 2", "which -lh and -gc do not form"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE("np " + std::to_string(c.np) + " " + c.flags);
        std::string launch = c.np == 1 ? "OMP_NUM_THREADS=1 timeout 60 " : mpirun(c.np);
        test::CommandResult r = test::run_command(launch + base + " " + c.flags);
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
        EXPECT_EQ(r.output.find("step    1/1"), std::string::npos) << "training must not start";
    }
}

TEST(Distributed, ProcessesWithDifferentFlagsAreStopped) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny_odd", ODD);
    std::string base = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -x 2 -v 0 -s 0";
    // MPMD launch: the second process gets another learning rate
    std::string cmd = "OMP_NUM_THREADS=1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 1 " + base +
                      " -l 1e-3 : -np 1 " + base + " -l 2e-3";
    test::CommandResult r = test::run_command(cmd);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("different configuration"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step    1/2"), std::string::npos) << "training must not start";
}

// One process is killed with SIGKILL mid-run; mpirun must end the whole job with a non-zero status.
// Bound: 60 s (it takes a few seconds); `timeout` turns a hang into a failure instead of a stuck CI.
TEST(Distributed, KillingOneProcessEndsTheRunInBoundedTime) {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/install_deps.sh installs openmpi-bin)";
    std::string oracle_dir = test::oracle("tiny", TINY);
    std::string dir = test::scratch_dir("dp_kill");
    std::string script = dir + "/kill.sh";
    std::ofstream(script) << "set -u\n"
                          << "OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 " << test::root()
                          << "/train_gpt2 -e " << oracle_dir << "/model.bin -i " << oracle_dir
                          << "/train.bin -b 2 -t 16 -x 1000000 -sh 0 -v 0 -s 0 > " << dir << "/log 2>&1 &\n"
                          << "launcher=$!\n"
                          << "for i in $(seq 1 600); do grep -q 'step    2/' " << dir << "/log && break; sleep 0.1; done\n"
                          << "victim=$(pgrep -P $launcher -f train_gpt2 | tail -n 1)\n"
                          << "[ -n \"$victim\" ] || { echo 'no rank to kill'; kill $launcher; exit 3; }\n"
                          << "kill -9 $victim\n"
                          << "start=$(date +%s)\n"
                          << "timeout 60 tail --pid=$launcher -f /dev/null || { echo 'still running after 60 s'; kill -9 $launcher; exit 4; }\n"
                          << "wait $launcher; rc=$?\n"
                          << "echo \"launcher exit $rc after $(( $(date +%s) - start )) s\"\n"
                          << "[ $rc -ne 0 ] || exit 5\n";
    test::CommandResult r = test::run_command("bash " + script);
    EXPECT_EQ(r.exit_code, 0) << r.output << "\n" << test::read_text(dir + "/log");
    EXPECT_NE(r.output.find("launcher exit"), std::string::npos) << r.output;
}

}  // namespace
