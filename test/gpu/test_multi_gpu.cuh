// Data parallelism on GPUs (llmc/parallel/comm_nccl.cuh), run through the train_gpt2cu binary. Included by
// test_gpt2.cu after its helpers (run_trainer, tiny_cosine_flags; metrics_without_timings is in test_helpers.h).
//
// One GPU is enough for the first group: the NCCL path with one process must be the single-GPU
// trainer, bit for bit, with -z 0 and -z 1 and whichever way the process starts (tcp, file, mpirun);
// and a rank that never comes must stop rank 0 within -pt seconds, at the bootstrap (tcp) or while
// the communicator forms (file).
// With two GPUs or more: 2 processes follow 1 process with 2-fold accumulation on the same global
// batch; -z 0 and -z 1 agree; a resumed 2-process run equals the uninterrupted one bit for bit;
// one process resumes their checkpoint; different flags are caught at start-up; killing one process
// stops the other within -pt seconds. The processes are started with -pi tcp on 127.0.0.1.
#pragma once

#include <unistd.h>

#include <map>

namespace gpu_test {

int visible_gpus() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

#define REQUIRE_GPUS(n)                                                                                   \
    if (visible_gpus() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, " << visible_gpus() << " visible"

// A port for rank 0 that nothing listens on now (127.0.0.1 only; test_helpers.h: below the ephemeral range).
std::string free_loopback_address() { return "127.0.0.1:" + std::to_string(test::free_loopback_port()); }

size_t tiny_parameters(const std::string& oracle_dir) {
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(oracle_dir + "/model.bin", &cfg, &params);
    return params.size();
}

// Starts `flags` (each entry: one process's extra flags) as processes of one run in `dir`, in the
// background except the first (rank 0), each under `timeout`; returns the exit codes and each log.
struct MultiRun {
    std::vector<int> exit_codes;
    std::vector<std::string> logs;
    std::string dir;
};

MultiRun run_processes(const std::string& name, const std::string& common, const std::vector<std::string>& per_rank,
                       int timeout_s = 300, const std::string& before_wait = "") {
    MultiRun run;
    run.dir = test::scratch_dir(name);
    std::string script = "cd '" + run.dir + "'\n";
    for (size_t r = 1; r < per_rank.size(); r++) {
        script += "timeout " + std::to_string(timeout_s) + " " + trainer() + " " + common + " " + per_rank[r] +
                  " > rank" + std::to_string(r) + ".log 2>&1 &\npid" + std::to_string(r) + "=$!\n";
    }
    script += before_wait;
    script += "timeout " + std::to_string(timeout_s) + " " + trainer() + " " + common + " " + per_rank[0] +
              " > rank0.log 2>&1; echo $? > rc0\n";
    for (size_t r = 1; r < per_rank.size(); r++) {
        script += "wait $pid" + std::to_string(r) + "; echo $? > rc" + std::to_string(r) + "\n";
    }
    std::ofstream(run.dir + "/run.sh") << script;
    test::run_command("bash '" + run.dir + "/run.sh'");
    for (size_t r = 0; r < per_rank.size(); r++) {
        run.exit_codes.push_back(atoi(test::read_text(run.dir + "/rc" + std::to_string(r)).c_str()));
        run.logs.push_back(test::read_text(run.dir + "/rank" + std::to_string(r) + ".log"));
    }
    return run;
}

std::string all_logs(const MultiRun& run) {
    std::string text;
    for (size_t r = 0; r < run.logs.size(); r++) text += "--- rank " + std::to_string(r) + " ---\n" + run.logs[r];
    return text;
}

// Flags of an N-process run with -pi tcp: common ones and each rank's own.
std::vector<std::string> tcp_ranks(int n, const std::string& address) {
    std::vector<std::string> ranks;
    for (int r = 0; r < n; r++) {
        ranks.push_back("-pi tcp -pn " + std::to_string(n) + " -pr " + std::to_string(r) + " -ps " + address);
    }
    return ranks;
}

// ----------------------------------------------------------------------------
// one GPU

// The same training with and without NCCL: the same losses, norms, weights and optimizer state, to
// the bit. A communicator of one process sums nothing, the shard of one process is every parameter,
// and everything else is the same code.
TEST(MultiGpuOneProcess, NcclPathEqualsSingleGpu) {
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    std::string oracle_dir = tiny_cosine_oracle();
    std::string flags = tiny_cosine_flags(oracle_dir) + " -n 10";
    TrainerRun single = run_trainer("mgpu_single", flags);
    std::vector<std::string> lines = test::metrics_without_timings(single.dir + "/metrics.jsonl");
    ASSERT_EQ(lines.size(), 10u);
    std::string id_dir = test::scratch_dir("mgpu_id");
    std::vector<std::pair<std::string, std::string>> variants = {
        {"tcp -z 0", "-pi tcp -pn 1 -pr 0 -ps " + free_loopback_address() + " -z 0"},
        {"tcp -z 1", "-pi tcp -pn 1 -pr 0 -ps " + free_loopback_address() + " -z 1"},
        {"file -z 1", "-pi file -pn 1 -pf " + id_dir + "/nccl_id -z 1"},
    };
    for (const auto& v : variants) {
        SCOPED_TRACE(v.first);
        TrainerRun nccl = run_trainer("mgpu_nccl", flags + " " + v.second);
        EXPECT_NE(nccl.result.output.find("data parallel: 1 process(es)"), std::string::npos) << nccl.result.output;
        EXPECT_EQ(test::metrics_without_timings(nccl.dir + "/metrics.jsonl"), lines);
        EXPECT_EQ(test::read_text(nccl.dir + "/model_00000010.bin"), test::read_text(single.dir + "/model_00000010.bin"));
        EXPECT_EQ(test::read_text(nccl.dir + "/state_00000010_00000.bin"),
                  test::read_text(single.dir + "/state_00000010_00000.bin"));
    }
    // the file of the id is removed once the communicator is formed
    EXPECT_FALSE(file_exists(id_dir + "/nccl_id"));
}

// Layouts the CUDA trainer cannot run are refused before anything runs, each with its reason: tensor-
// parallel ranks or stages without the processes, and what they cannot combine with (ZeRO-2/3 with
// stages, Adafactor, sampling), the same checks and messages as the CPU trainer's.
TEST(MultiGpuOneProcess, LayoutFlagsThatCannotRunAreRefused) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string flags = " -e " + tiny_oracle() + "/model.bin -i " + tiny_oracle() + "/train.bin -b 2 -t 16 -x 1 -v 0";
    struct Case { std::string flags, message; };
    for (const Case& c : {Case{" -s 0 -tp 2", "flag -tp 2: tensor-parallel ranks are processes; launch 2 or more"},
                          Case{" -s 5 -tp 2", "-tp 2: sampling (-s) and HellaSwag (-he) need the whole logits"},
                          Case{" -s 0 -pp 2", "flag -pp 2: pipeline stages are processes; launch 2 or more"},
                          Case{" -s 0 -pp 2 -z 2", "flag -z 2: ZeRO stages 2 and 3 do not run with pipeline stages"},
                          Case{" -s 0 -tp 2 -opt adafactor", "-opt adafactor runs with data parallelism and ZeRO stages 0 and 1 only"},
                          Case{" -s 5 -pp 2", "-pp 2: sampling (-s) and HellaSwag (-he) are not implemented through a pipeline"}}) {
        SCOPED_TRACE(c.flags);
        test::CommandResult r = test::run_command(trainer() + flags + c.flags);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    }
}

#ifdef USE_MPI
// mpirun as CI runs it: as root, more processes than cores, no binding to cores (a process of the
// emulator runs a host thread and a device thread). Under emulation each process is one emulated
// device (EMU_DEVICE_COUNT = the process count, as on a node with one GPU per process), and
// LeakSanitizer, when the build has AddressSanitizer, is off: Open MPI leaks at exit by design.
std::string mpirun_command(int np) {
    std::string cmd = "timeout 600 ";
#ifdef CUDA_EMULATION
    cmd += "env EMU_DEVICE_COUNT=" + std::to_string(np) + " ASAN_OPTIONS=detect_leaks=0 ";
#endif
    cmd += "mpirun --allow-run-as-root --oversubscribe --bind-to none ";
#ifdef CUDA_EMULATION
    cmd += "-x EMU_DEVICE_COUNT -x ASAN_OPTIONS ";
#endif
    return cmd + "-np " + std::to_string(np) + " ";
}

TEST(MultiGpuOneProcess, MpirunWithOneProcessEqualsSingleGpu) {
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    if (test::run_command("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun not found";
    std::string oracle_dir = tiny_cosine_oracle();
    std::string flags = tiny_cosine_flags(oracle_dir);
    TrainerRun single = run_trainer("mgpu_single_mpi", flags);
    std::string dir = test::scratch_dir("mgpu_mpirun");
    test::CommandResult r = test::run_command(mpirun_command(1) + trainer() + " " + flags +
                                              " -z 1 -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("started by mpi"), std::string::npos) << r.output;
    EXPECT_EQ(test::metrics_without_timings(dir + "/metrics.jsonl"), test::metrics_without_timings(single.dir + "/metrics.jsonl"));
}
#endif

// Rank 1 never starts. With tcp, rank 0 gives up at the bootstrap; with file, rank 0 gets past the
// bootstrap (it only writes the file) and waits while NCCL forms the communicator: the watchdog must
// end that wait too. Either way: a non-zero exit and a message within -pt plus a margin.
TEST(MultiGpuOneProcess, MissingRankStopsRank0WithinTheTimeout) {
#if defined(ENABLE_FP32)
    GTEST_SKIP() << "the bf16 build's suite runs it: the bootstrap and the watchdog do not depend on the precision";
#endif
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string common = trainer() + " -e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -x 2 -v 0 -s 0 -pt 8";
    struct Case { std::string flags, message; };
    std::string id_dir = test::scratch_dir("mgpu_missing");
    const Case cases[] = {
        {"-pi tcp -pn 2 -pr 0 -ps " + free_loopback_address(), "missing rank(s): 1"},
        {"-pi file -pn 2 -pr 0 -pf " + id_dir + "/nccl_id", "forming the NCCL communicator"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.flags);
        auto start = std::chrono::steady_clock::now();
        test::CommandResult r = test::run_command("timeout 120 " + common + " " + c.flags);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.exit_code, 124) << "killed by timeout: the watchdog did not fire";
        EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
        EXPECT_LT(seconds, 8 + DP_ABORT_GRACE_S + 15) << r.output;
    }
}

// ----------------------------------------------------------------------------
// two GPUs or more

// -d 64 with B=2 T=16: one process accumulates 2 micro-steps, two processes 1 each, over the same 64
// tokens per step (the sample layout of ../shared/FORMATS.md). Sums in another order: the losses agree
// within the suite's per-step tolerance, not to the bit.
TEST(MultiGpu, TwoProcessesMatchOneWithAccumulation) {
    REQUIRE_GPUS(2);
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    std::string oracle_dir = tiny_cosine_oracle();
    std::string flags = tiny_cosine_flags(oracle_dir);
    TrainerRun one = run_trainer("mgpu_one", flags);
    std::vector<double> want = train_losses(one);
    size_t n = tiny_parameters(oracle_dir);
    for (int zero : {0, 1}) {
        SCOPED_TRACE("-z " + std::to_string(zero));
        std::string dir = test::scratch_dir("mgpu_two_out");
        MultiRun run = run_processes("mgpu_two", flags + " -o " + dir + " -z " + std::to_string(zero),
                                     tcp_ranks(2, free_loopback_address()));
        ASSERT_EQ(run.exit_codes, std::vector<int>({0, 0})) << all_logs(run);
        std::vector<double> got = test::jsonl_values(dir + "/metrics.jsonl", "train_loss");
        ASSERT_EQ(got.size(), want.size()) << all_logs(run);
        for (size_t s = 0; s < got.size(); s++) EXPECT_NEAR(got[s], want[s], step_loss_tolerance(want[s])) << "step " << s;
        // the optimizer memory per process: all N, or rank 0's shard
        size_t expected = zero == 1 ? aligned_shard_layout(n, 2, 0, 8).end : n;
        EXPECT_NE(run.logs[0].find("AdamW over " + std::to_string(expected) + " parameters"), std::string::npos)
            << run.logs[0];
        EXPECT_EQ(run.logs[1].find("step "), std::string::npos) << "only rank 0 logs";
    }
}

TEST(MultiGpu, ResumeEqualsUninterruptedAndOneProcessTakesTheState) {
    REQUIRE_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string a = test::scratch_dir("mgpu_resume_a"), b = test::scratch_dir("mgpu_resume_b");
    std::string flags = "-e " + oracle_dir + "/model.bin -i " + oracle_dir +
                        "/train.bin -b 2 -t 16 -d 128 -x 6 -n 3 -l 1e-3 -sh 1 -v 0 -s 0 -z 1";
    MultiRun ra = run_processes("mgpu_ra", flags + " -o " + a, tcp_ranks(2, free_loopback_address()));
    ASSERT_EQ(ra.exit_codes, std::vector<int>({0, 0})) << all_logs(ra);
    MultiRun rb = run_processes("mgpu_rb", flags + " -o " + b, tcp_ranks(2, free_loopback_address()));
    ASSERT_EQ(rb.exit_codes, std::vector<int>({0, 0})) << all_logs(rb);
    for (const char* f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/state_00000006_00001.bin", "/DONE_00000006"}) {
        ASSERT_EQ(remove((b + f).c_str()), 0) << f;
    }
    // one process takes the state of two (llmc/run/train_state.h assembles its range from both state files)
    // and runs the remaining steps; a copy, so that b stays as the 2-process run left it
    std::string single = test::scratch_dir("mgpu_resume_single");
    ASSERT_EQ(test::run_command("cp -r " + b + "/. " + single).exit_code, 0);
    test::CommandResult one = test::run_command("timeout 120 " + trainer() + " " + flags + " -o " + single + " -y 1");
    EXPECT_EQ(one.exit_code, 0) << one.output;
    EXPECT_NE(one.output.find("continuing from step 3"), std::string::npos) << one.output;
    MultiRun resumed = run_processes("mgpu_rr", flags + " -o " + b + " -y 1", tcp_ranks(2, free_loopback_address()));
    ASSERT_EQ(resumed.exit_codes, std::vector<int>({0, 0})) << all_logs(resumed);
    EXPECT_NE(resumed.logs[0].find("continuing from step 3"), std::string::npos) << resumed.logs[0];
    EXPECT_EQ(test::read_text(a + "/model_00000006.bin"), test::read_text(b + "/model_00000006.bin"));
    EXPECT_EQ(test::read_text(a + "/state_00000006_00001.bin"), test::read_text(b + "/state_00000006_00001.bin"));
    EXPECT_EQ(test::metrics_without_timings(a + "/metrics.jsonl"), test::metrics_without_timings(b + "/metrics.jsonl"));
}

TEST(MultiGpu, ProcessesWithDifferentFlagsAreStopped) {
    REQUIRE_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string flags = "-e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -x 2 -v 0 -s 0 -pt 30";
    std::vector<std::string> ranks = tcp_ranks(2, free_loopback_address());
    ranks[1] += " -l 2e-3";
    MultiRun run = run_processes("mgpu_flags", flags, ranks, 120);
    EXPECT_NE(run.exit_codes[0], 0);
    EXPECT_NE(run.exit_codes[1], 0);
    EXPECT_NE(all_logs(run).find("different configuration"), std::string::npos) << all_logs(run);
    EXPECT_EQ(run.logs[0].find("step    1/2"), std::string::npos) << "training must not start";
}

// Rank 1 is killed (SIGKILL) after a few steps; rank 0 is then stuck in a collective, and its watchdog
// must end it with an error within -pt (10 s) plus the abort grace, not hang.
TEST(MultiGpu, KillingOneProcessStopsTheOtherWithinTheTimeout) {
    REQUIRE_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string flags = "-e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -x 1000000 -sh 0 -v 0 -s 0 -pt 10";
    // rank 1 runs in the background; once rank 0... cannot be watched from here (rank 0 runs in the
    // foreground), so a helper kills rank 1 after 20 s of training
    std::string killer = "(sleep 20; kill -9 $pid1) &\n";
    auto start = std::chrono::steady_clock::now();
    MultiRun run = run_processes("mgpu_kill", flags, tcp_ranks(2, free_loopback_address()), 120, killer);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(run.exit_codes[0], 0) << all_logs(run);
    EXPECT_NE(run.exit_codes[0], 124) << "rank 0 hung until `timeout` killed it\n" << all_logs(run);
    EXPECT_NE(run.logs[0].find("Error (process 0): rank 0 of 2"), std::string::npos) << all_logs(run);
    EXPECT_NE(run.logs[0].find("step    2/"), std::string::npos) << "rank 0 trained before the kill";
    EXPECT_LT(seconds, 20 + 10 + DP_ABORT_GRACE_S + 20) << all_logs(run);
}

// ----------------------------------------------------------------------------
// several processes under mpirun: on GPUs, one per GPU; under emulation (dev/emu), where every
// process is its own emulated device, always (CI runs these with 2 and 3 processes on 2 cores).

#ifdef USE_MPI
#ifdef CUDA_EMULATION
#define REQUIRE_MPIRUN_GPUS(n) \
    if (test::run_command("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun not found"
#else
#define REQUIRE_MPIRUN_GPUS(n) \
    REQUIRE_GPUS(n);           \
    if (test::run_command("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun not found"
#endif

// As test/test_distributed.cpp: file order (-sh 0), B=2 T=16, a global batch of `total` tokens, so
// that N processes and 1 process with N-fold accumulation train on the same samples at each step.
std::string dp_flags(const std::string& oracle_dir, int steps, int total) {
    return "-e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -l 1e-3 -c 0.1 -u 1 -q 0.5 -sh 0 -v 0 -s 0 -x " +
           std::to_string(steps) + " -n " + std::to_string(steps) + " -d " + std::to_string(total);
}

std::vector<float> checkpoint_weights(const std::string& dir, int step) {
    char name[32];
    snprintf(name, sizeof(name), "/model_%08d.bin", step);
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(dir + name, &cfg, &params);
    return params;
}

// Losses and norms within this build's per-step tolerances; weights within 1% of AdamW's largest
// possible movement (steps * lr), as test_distributed.cpp argues: elements whose true gradient is ~0
// move by rounding noise that AdamW scales up, differently in each run.
void expect_same_training(const std::string& want_dir, const std::string& got_dir, int steps, double lr) {
    std::vector<double> want_loss = test::jsonl_values(want_dir + "/metrics.jsonl", "train_loss"),
                        got_loss = test::jsonl_values(got_dir + "/metrics.jsonl", "train_loss");
    std::vector<double> want_norm = test::jsonl_values(want_dir + "/metrics.jsonl", "grad_norm"),
                        got_norm = test::jsonl_values(got_dir + "/metrics.jsonl", "grad_norm");
    ASSERT_EQ(want_loss.size(), (size_t)steps);
    ASSERT_EQ(got_loss.size(), (size_t)steps);
    ASSERT_EQ(got_norm.size(), want_norm.size());
    double loss_err = 0, norm_err = 0;
    for (int s = 0; s < steps; s++) {
        EXPECT_NEAR(got_loss[s], want_loss[s], step_loss_tolerance(want_loss[s])) << "loss at step " << s;
        EXPECT_NEAR(got_norm[s], want_norm[s], TOL_STEP_NORM_REL * want_norm[s]) << "grad norm at step " << s;
        loss_err = std::max(loss_err, std::fabs(got_loss[s] - want_loss[s]) / std::fabs(want_loss[s]));
        norm_err = std::max(norm_err, std::fabs(got_norm[s] - want_norm[s]) / want_norm[s]);
    }
    std::vector<float> a = checkpoint_weights(want_dir, steps), b = checkpoint_weights(got_dir, steps);
    ASSERT_EQ(a.size(), b.size());
    // bf16: a checkpoint rounds each weight to 8 significant bits (neighbouring values are 2^-7 of the
    // weight apart; 2 such steps allowed), and the gradients carry bf16 noise that AdamW turns into
    // moves of up to lr per step for the elements whose true gradient is ~0: there the weights are
    // only bounded by AdamW's largest movement in both runs (2 * steps * lr); the losses and norms
    // above are the check.
    const double movement = (sizeof(floatX) == 2 ? 2.0 : 0.01) * steps * lr;
    double worst = 0, worst_excess = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double diff = std::fabs(a[i] - b[i]);
        double rounding = sizeof(floatX) == 2 ? std::ldexp(std::max(std::fabs(a[i]), std::fabs(b[i])), -6) : 0.0;
        worst = std::max(worst, diff);
        worst_excess = std::max(worst_excess, diff - rounding);
    }
    EXPECT_LE(worst_excess, movement) << "final weights (beyond bf16 rounding: " << worst << " in all)";
    printf("  %d steps: losses within %.1e relative, grad norms %.1e, weights %.1e absolute\n", steps, loss_err, norm_err, worst);
}

// Every step's comm_bytes (metrics.jsonl, counted by llmc/parallel/comm.h) against the formula printed at
// start-up, within 1% (the count rounds each piece's 1/P share down; the formula does not).
void expect_comm_bytes_as_predicted(const std::string& output, const std::string& dir) {
    size_t at = output.find("communication: ");
    ASSERT_NE(at, std::string::npos) << output;
    double predicted = 0;
    ASSERT_EQ(sscanf(output.c_str() + at, "communication: %lf bytes per step predicted", &predicted), 1);
    std::vector<double> counted = test::jsonl_values(dir + "/metrics.jsonl", "comm_bytes");
    ASSERT_FALSE(counted.empty());
    for (double c : counted) EXPECT_NEAR(c, predicted, 0.01 * predicted) << "bytes counted in a step";
}

// N processes (all-reduce with -z 0, ZeRO-1 with -z 1, ZeRO-2 with -z 2, ZeRO-3 with -z 3) follow 1
// process with N-fold accumulation.
TEST(MultiGpuMpirun, TwoAndThreeProcessesMatchOneWithAccumulation) {
    REQUIRE_MPIRUN_GPUS(3);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    size_t n = tiny_parameters(oracle_dir);
    const int steps = 3;
    for (int np : {2, 3}) {
        std::string flags = dp_flags(oracle_dir, steps, 2 * 16 * np);
        TrainerRun one = run_trainer("mpi_one_" + std::to_string(np), flags);
        // every stage with 3 processes; 0 and 1 with 2 (the suite's time on 2 cores)
        for (int zero : np == 3 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 1}) {
            SCOPED_TRACE(std::to_string(np) + " processes, -z " + std::to_string(zero));
            std::string dir = test::scratch_dir("mpi_" + std::to_string(np) + "_z" + std::to_string(zero));
            test::CommandResult r = test::run_command(mpirun_command(np) + trainer() + " " + flags + " -z " +
                                                      std::to_string(zero) + " -o " + dir);
            ASSERT_EQ(r.exit_code, 0) << r.output;
            EXPECT_NE(r.output.find("data parallel: " + std::to_string(np) + " process(es)"), std::string::npos) << r.output;
            ShardLayout shard = aligned_shard_layout(n, np, 0, 8);
            size_t expected = zero >= 1 ? shard.end : n;
            EXPECT_NE(r.output.find("AdamW over " + std::to_string(expected) + " parameters"), std::string::npos) << r.output;
            if (zero >= 2) {  // rank 0 prints: its gradient (-z 3: and parameters) is its shard, not the whole model
                std::string z = "-z " + std::to_string(zero);
                EXPECT_NE(r.output.find(z + ": a shard of " + std::to_string(shard.shard_size)), std::string::npos) << r.output;
                if (zero == 3) EXPECT_NE(r.output.find("(-z 3: a shard of "), std::string::npos) << r.output;
            }
            // the model state's memory, allocated (cudaMemGetInfo) against the prediction, within 1%
            // (cudaMalloc's rounding; the emulator counts the bytes asked for)
            size_t at = r.output.find("model state per process: ");
            ASSERT_NE(at, std::string::npos) << r.output;
            double allocated = 0, predicted = 0;
            ASSERT_EQ(sscanf(r.output.c_str() + at, "model state per process: %lf MiB allocated (cudaMemGetInfo), %lf MiB predicted",
                             &allocated, &predicted), 2);
            EXPECT_NEAR(allocated, predicted, 0.01 * predicted);
            expect_comm_bytes_as_predicted(r.output, dir);
            expect_same_training(one.dir, dir, steps, 1e-3);
        }
    }
}

// Context parallelism's runs (-cp): each case (processes, flags added to `flags`, or to its own base
// flags with their own one-process run) follows one process to this build's per-step tolerances with the
// bytes per step as predicted (the gradients' reduction and the attention's traffic,
// llmc/parallel/context_split.h); then the val loss of `cp_flags` on 2 processes is one process's (each
// process's share of its rows' mean, summed; -v 2 over 3 batches of the train data).
struct ContextCase {
    int np;
    std::string flags, base;  // base: "" for the test's flags
};
void expect_context_parallel_as_one_process(const std::string& name, const std::string& oracle_dir, const std::string& flags,
                                            const std::vector<ContextCase>& cases, const std::string& cp_flags, int steps) {
    std::map<std::string, TrainerRun> one;  // by base flags
    for (const ContextCase& c : cases) {
        SCOPED_TRACE(c.flags);
        const std::string& base = c.base.empty() ? flags : c.base;
        if (!one.count(base)) one[base] = run_trainer(name + "_one" + std::to_string(one.size()), base);
        std::string dir = test::scratch_dir(name);
        test::CommandResult r = test::run_command(mpirun_command(c.np) + trainer() + " " + base + " " + c.flags + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        expect_comm_bytes_as_predicted(r.output, dir);
        expect_same_training(one[base].dir, dir, steps, 1e-3);
    }
    std::string eval = " -v 2 -m 3 -j " + oracle_dir + "/train.bin";
    std::string one_val = test::scratch_dir(name + "_val_one"), cp_val = test::scratch_dir(name + "_val");
    ASSERT_EQ(test::run_command(mpirun_command(1) + trainer() + " " + flags + eval + " -o " + one_val).exit_code, 0);
    test::CommandResult val = test::run_command(mpirun_command(2) + trainer() + " " + flags + eval + " " + cp_flags + " -o " + cp_val);
    ASSERT_EQ(val.exit_code, 0) << val.output;
    std::vector<double> want = test::jsonl_values(one_val + "/metrics.jsonl", "val_loss"),
                        got = test::jsonl_values(cp_val + "/metrics.jsonl", "val_loss");
    ASSERT_EQ(want.size(), 3u);  // steps 0, 2 and the last
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], step_loss_tolerance(want[i])) << "val loss " << i;
}

// Context parallelism by Ulysses (-cpm ulysses, llmc/parallel/context_parallel.cuh): 2 processes on each
// sequence's halves (8 of T=16 positions; their all-to-alls give each 2 of the 4 heads over all 16), 4
// (a head each), 2 replicas x cp 2 with ZeRO-1, -r 3 (the recomputed forward's all-to-alls work in the
// backward's scratch, as the backward's own do), cp 2 x tp 2 (each tensor-parallel rank's 2 heads split
// again: one each), cp 2 x pp 2 (the stages send their T/2 positions' rows) and in the bf16 build the
// cuBLAS path (-fa 0) beside flash. Sampling with -cp is refused with the reason.
TEST(MultiGpuMpirun, ContextParallelUlyssesMatchesOneProcess) {
    REQUIRE_MPIRUN_GPUS(4);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string flags = dp_flags(oracle_dir, 3, 2 * 16 * 4);  // one replica: 4 micro-batches of 2 x 16
    std::vector<ContextCase> cases = {{2, "-cp 2 -cpm ulysses"}, {4, "-cp 4 -cpm ulysses"}, {4, "-cp 2 -cpm ulysses -z 1"},
                                      {2, "-cp 2 -cpm ulysses -r 3"}, {4, "-cp 2 -cpm ulysses -tp 2"}, {4, "-cp 2 -cpm ulysses -pp 2"}};
    if (FLASH_ATTENTION_AVAILABLE) cases.push_back({2, "-cp 2 -cpm ulysses -fa 0"});
    expect_context_parallel_as_one_process("cp_ulysses", oracle_dir, flags, cases, "-cp 2 -cpm ulysses", 3);
    test::CommandResult refused = test::run_command(mpirun_command(2) + trainer() + " " + flags + " -cp 2 -cpm ulysses -s 1");
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_NE(refused.output.find("the CUDA trainer does not sample with context parallelism"), std::string::npos) << refused.output;
}

// Context parallelism by the ring (-cpm ring, the default): each process holds a chunk of T/(2N)
// positions from the front and its mirror from the back, and attends them to every process's key/value
// chunks as they pass around the ring (flash kernels on a chunk, or the plain ones in the fp32 build and
// with -fa 0), merging by log-sum-exp. 2 and 4 processes on a sequence of 16, 3 on one of 12, 2 replicas
// x cp 2 with ZeRO-1 and -r 3 (the recomputed forward's ring), cp 2 x tp 2, cp 2 x pp 2, and -fa 0 in
// bf16 (the chunks' gradients summed in floatX as they travel: a bf16 rounding a hop). A ring run
// resumed from its step-3 checkpoint ends with the uninterrupted one's bits. The bf16 build leaves cp 2
// x tp 2 and cp 2 x pp 2 to the fp32 build's suite (their chunks take the flash path of -cp 2, and the
// layouts around it do not depend on the precision; four emulated processes with flash chunks are
// most of this test's time on 2 cores).
TEST(MultiGpuMpirun, ContextParallelRingMatchesOneProcess) {
    REQUIRE_MPIRUN_GPUS(4);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string flags = dp_flags(oracle_dir, 3, 2 * 16 * 4), flags12 = dp_flags(oracle_dir, 3, 2 * 12 * 4) + " -t 12";
    std::vector<ContextCase> cases = {{2, "-cp 2"}, {4, "-cp 4 -cpm ring"}, {3, "-cp 3", flags12}, {4, "-cp 2 -z 1 -r 3"}};
    if (!FLASH_ATTENTION_AVAILABLE) cases.insert(cases.end(), {{4, "-cp 2 -tp 2"}, {4, "-cp 2 -pp 2"}});
    if (FLASH_ATTENTION_AVAILABLE) cases.push_back({2, "-cp 2 -fa 0"});
    expect_context_parallel_as_one_process("cp_ring", oracle_dir, flags, cases, "-cp 2", 3);
    std::string cmd = mpirun_command(2) + trainer() + " " + dp_flags(oracle_dir, 5, 2 * 16 * 4) + " -cp 2 -n 1";
    std::string a = test::scratch_dir("ring_resume_a"), b = test::scratch_dir("ring_resume_b");
    test::CommandResult whole = test::run_command(cmd + " -o " + a);
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    EXPECT_NE(whole.output.find("context parallel: -cp 2 -cpm ring"), std::string::npos) << whole.output;
    ASSERT_TRUE(file_exists(a + "/state_00000005_00001.bin")) << whole.output;
    test::expect_resume_from_step_3_same_bits(cmd, a, b);
}

// A hung collective must not hang the job (llmc/parallel/watchdog.h): process 1 of 2 is stopped
// (SIGSTOP) during training; process 0 waits for it on its stream (dp_wait), and the watchdog (-wt 8)
// ends the run within the limit, the answer time and a margin, naming the wait, the step and process 1
// as not arrived.
#if !defined(ENABLE_FP32)  // the bf16 build's suite only: the path does not depend on the precision
// Two processes with `layout_flags`; process 1 stopped after step 3; the watchdog's end checked.
void expect_watchdog_ends_run_with_process_1_stopped(const std::string& name, const std::string& layout_flags) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string out = test::scratch_dir(name);
    std::string flags = "-e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -x 1000000 -v 0 -s 0 " +
                        layout_flags + "-wt 8 -o " + out;
    test::CommandResult r = test::run_and_stop_rank(mpirun_command(2) + trainer() + " " + flags, out + ".log", "step    3/",
                                                     out, 1, 90);
    std::string log = test::read_text(out + ".log");
    test::expect_watchdog_ended_run(r, log, 8 + WATCHDOG_ANSWER_S + 30);
    EXPECT_TRUE(std::regex_search(log, std::regex("Error \\(process 0\\): watchdog: .* at step [0-9]+ has waited [0-9]+ s "
                                                  "\\(-wt 8\\); 1 process\\(es\\) had not arrived:"))) << log;
}

TEST(MultiGpuMpirun, WatchdogEndsARunWhoseProcessStopped) {
    REQUIRE_MPIRUN_GPUS(2);
    expect_watchdog_ends_run_with_process_1_stopped("mpi_watchdog", "");
}

// The same in a pipeline (-pp 2 over NCCL send/recv): stage 1 stopped, stage 0's wait on its stream
// (the exchange with stage 1, or the stages' sums) runs out and the watchdog ends the run.
TEST(MultiGpuMpirun, WatchdogEndsAPipelineWhoseStageStopped) {
    REQUIRE_MPIRUN_GPUS(2);
    expect_watchdog_ends_run_with_process_1_stopped("mpi_watchdog_pp", "-pp 2 ");
}
#endif

// Pipeline tests: 5 layers, which 2 and 3 stages split unevenly (3+2, 2+2+1).
const char* FIVE_MODEL = "--layers 5 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 --seed 1";
std::string five_args() { return std::string(FIVE_MODEL) + " " + TINY_DATA; }

// Parameters of pipeline stage s of p of the oracle's model: its layers and the shared wte, wpe, lnf.
size_t stage_parameters(const std::string& oracle_dir, int p, int s) {
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(oracle_dir + "/model.bin", &cfg, &params);
    int l0, l1;
    pp_stage_layers(cfg.num_layers, p, s, &l0, &l1);
    cfg.num_layers = l1 - l0;
    return num_parameters(cfg);
}

// Pipeline parallelism (-pp, llmc/parallel/pipeline.h) over NCCL send/recv follows one process on the
// same global batch (4 micro-batches of B=2, T=16 a step): 5 layers as 3+2 stages under 1F1B, as 2+2+1
// under GPipe, and pp 2 x dp 2 with ZeRO-1 (2 micro-batches per replica). The bars are
// expect_same_training's: the stages add the tied wte gradient (the embedding's on stage 0, the LM
// head's on the last) at the end of the step instead of accumulating it in place, a different rounding
// of the same sum. Also: stage 0 (process 0 prints) allocates its layers and the shared tensors only;
// the activation slots are the schedule's (1F1B p - s, GPipe m); the step line carries the measured
// bubble and the formula (p-1)/(m+p-1); the bytes counted per step are the start-up line's prediction.
TEST(MultiGpuMpirun, PipelineStagesMatchOneProcess) {
    REQUIRE_MPIRUN_GPUS(4);
    REQUIRE_ORACLE("tiny_five", five_args());
    std::string oracle_dir = test::oracle("tiny_five", five_args());
    const int steps = 3;
    std::string flags = dp_flags(oracle_dir, steps, 2 * 16 * 4);
    TrainerRun one = run_trainer("pp_one", flags);
    struct Case { int np, p; std::string flags, formula; int slots; };
    for (const Case& c : {Case{2, 2, "-pp 2 -pm 1f1b", "(formula 0.200)", 2}, Case{3, 3, "-pp 3 -pm gpipe", "(formula 0.333)", 4},
                          Case{4, 2, "-pp 2 -z 1", "(formula 0.333)", 2}}) {
        SCOPED_TRACE(std::to_string(c.np) + " processes, " + c.flags);
        std::string dir = test::scratch_dir("pp_" + std::to_string(c.np));
        test::CommandResult r = test::run_command(mpirun_command(c.np) + trainer() + " " + flags + " " + c.flags + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("| bubble "), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(c.formula), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(", " + std::to_string(c.slots) + " activation slot(s)"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("\nparameters: " + std::to_string(stage_parameters(oracle_dir, c.p, 0)) + " ("),
                  std::string::npos) << r.output;
        expect_comm_bytes_as_predicted(r.output, dir);
        expect_same_training(one.dir, dir, steps, 1e-3);
    }
}

// Tensor parallelism: 6 heads and a padded vocabulary of 384, which 3 processes split into 2 heads and
// 128 rows each; 3 layers, which 2 stages split 2+1.
const char* SIX_HEADS_MODEL = "--layers 3 --channels 96 --heads 6 --max-seq-len 32 --vocab 300 --seed 1";
std::string six_heads_args() { return std::string(SIX_HEADS_MODEL) + " " + TINY_DATA; }

// Parameters of tensor-parallel rank 0 of pipeline stage 0 (what process 0 allocates).
size_t local_parameters(const std::string& oracle_dir, int tp, int pp) {
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(oracle_dir + "/model.bin", &cfg, &params);
    int l0, l1;
    pp_stage_layers(cfg.num_layers, pp, 0, &l0, &l1);
    cfg.num_layers = l1 - l0;
    size_t sizes[NUM_PARAMETER_TENSORS], n = 0;
    tp_param_sizes(cfg, tp, sizes);
    for (size_t k : sizes) n += k;
    return n;
}

// Tensor parallelism (-tp, Megatron's split: llmc/parallel/tensor_parallel.h) over NCCL follows one
// process on the same global batch (4 micro-batches of B=2, T=16 a step): tp 2 with -r 3 (the block's
// forward, and its all-reduce, again in the backward), tp 2 x pp 2 under 1F1B, tp 2 x dp 2 with ZeRO-1,
// ZeRO-2 and ZeRO-3 (2-D: the data-parallel pair shards each tensor-parallel rank's slices; -z 3
// gathers them block by block), tp 3 x pp 2 under GPipe on a model of 6 heads (2 per process) and 3
// layers (2+1), and all three at once: tp 2 x pp 2 x dp 2 with ZeRO-1 (8 processes); with sequence
// parallelism (-sq 1): tp 2; tp 3 with -r 3, whose B·T = 32 rows split 11, 11, 10; tp 2 x pp 2 (the
// stages send their rows); tp 2 x dp 2 with ZeRO-3 and -r 2 (the layernorms' partial gradients summed
// within each shard); with the LM head in chunks (-lc: each chunk's vocabulary-parallel statistics summed
// on their own, d(loss)/d(lnf) kept over lnf): tp 2 x pp 2 under GPipe (every micro-batch's forward before
// any backward: each keeps its own in its slot) and tp 3 with -sq 1 (lnf's gathered rows). The bars are
// expect_same_training's: the row-parallel matmuls' terms and the embedding are summed across the
// processes in bf16 (in the fp32 build, in another order than one matmul sums them). Also: process 0
// allocates exactly its slices of its stage, and the bytes counted per step are the start-up line's
// prediction (the all-reduces of every layer, or with -sq 1 the gathers and reduce-scatters, the
// classifier's statistics, the replicated gradients' broadcasts).
TEST(MultiGpuMpirun, TensorParallelMatchesOneProcess) {
    REQUIRE_MPIRUN_GPUS(8);
    REQUIRE_ORACLE("tiny_five", five_args());
    REQUIRE_ORACLE("tiny_six_heads", six_heads_args());
    const int steps = 3;
    // the bf16 build runs two of the layouts (their bf16 sums; the paths do not depend on the precision),
    // to keep the suite's time on 2 cores
    struct Case { std::string oracle; int np, tp, pp; std::string flags; bool bf16; };
    std::string five = test::oracle("tiny_five", five_args()), six = test::oracle("tiny_six_heads", six_heads_args());
    std::map<std::string, std::string> one;  // oracle -> the one-process run's directory
    for (const Case& c : {Case{five, 2, 2, 1, "-tp 2 -r 3", false}, Case{five, 4, 2, 2, "-tp 2 -pp 2 -pm 1f1b", true},
                          Case{five, 4, 2, 1, "-tp 2 -z 1", false}, Case{five, 4, 2, 1, "-tp 2 -z 2", false},
                          Case{five, 4, 2, 1, "-tp 2 -z 3", true}, Case{six, 6, 3, 2, "-tp 3 -pp 2 -pm gpipe", false},
                          Case{five, 8, 2, 2, "-tp 2 -pp 2 -z 1", false}, Case{five, 2, 2, 1, "-tp 2 -sq 1", true},
                          Case{six, 3, 3, 1, "-tp 3 -sq 1 -r 3", false}, Case{five, 4, 2, 2, "-tp 2 -pp 2 -sq 1", false},
                          Case{five, 4, 2, 1, "-tp 2 -z 3 -sq 1 -r 2", false},
                          Case{five, 4, 2, 2, "-tp 2 -pp 2 -pm gpipe -lc 3", true}, Case{six, 3, 3, 1, "-tp 3 -sq 1 -lc 2", false}}) {
        if (sizeof(floatX) == 2 && !c.bf16) continue;
        SCOPED_TRACE(std::to_string(c.np) + " processes, " + c.flags);
        std::string flags = dp_flags(c.oracle, steps, 2 * 16 * 4);
        if (!one.count(c.oracle)) one[c.oracle] = run_trainer("tp_one_" + std::to_string(one.size()), flags).dir;
        std::string dir = test::scratch_dir("tp_" + std::to_string(c.np) + "_" + std::to_string(c.pp) + "_" +
                                            std::to_string(c.flags.size()));
        test::CommandResult r = test::run_command(mpirun_command(c.np) + trainer() + " " + flags + " " + c.flags + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("layout: tp " + std::to_string(c.tp) + " x pp " + std::to_string(c.pp)), std::string::npos) << r.output;
        if (c.flags.find("-sq 1") != std::string::npos) {
            EXPECT_NE(r.output.find(", sequence parallel"), std::string::npos) << r.output;
        }
        EXPECT_NE(r.output.find("\nparameters: " + std::to_string(local_parameters(c.oracle, c.tp, c.pp)) + " ("),
                  std::string::npos) << r.output;
        expect_comm_bytes_as_predicted(r.output, dir);
        expect_same_training(one[c.oracle], dir, steps, 1e-3);
    }
}

// -fp8's scales (llmc/fp8_linear.cuh) from the file a run wrote at `step` (process `rank`'s): the last
// floats of its FP8 section, one a tensor (the blocks' and, with -fp8 2, the LM head's).
std::vector<float> fp8_scales_of(const std::string& dir, int step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08d_%05d.bin", step, rank);
    TrainState state;
    state_file_read(dir + name, &state);
    for (const StateSection& s : state.sections) {
        if (s.kind != STATE_SECTION_FP8_SCALES) continue;
        int32_t head[4] = {};
        memcpy(head, s.bytes.data(), sizeof(head));
        size_t n = (size_t)head[1] * FP8_GEMMS * FP8_OPERANDS + (head[0] == 2 && head[3] == 1 ? FP8_OPERANDS : 0);
        std::vector<float> scales(n);
        memcpy(scales.data(), s.bytes.data() + s.bytes.size() - n * sizeof(float), n * sizeof(float));
        return scales;
    }
    ADD_FAILURE() << dir << name << " has no FP8 section";
    return {};
}

#if !defined(ENABLE_FP32)
// -fp8 2 (the blocks' linears and the LM head's forward and input gradient in FP8) in the layouts: each
// operand's amax is the maximum over every process, so every layout casts a
// tensor with the one process's scale: replicas (-z 1, -z 3) that each see half the micro-batches,
// tensor-parallel ranks that each hold a slice (-tp 2 -sq 1), pipeline stages that each hold some layers
// (-pp 2: without the maximum over the world, the other stage's layers would keep scales of 1; the LM
// head is the last stage's) and context-parallel ranks that each hold half the positions (-cp 2); the
// vocabulary-parallel classifier (-tp 2) writes the e5m2 dlogits of its slice. 5 layers, 3 steps of 4 micro-batches
// of 2 x 16 (32 rows: every block product in FP8): losses and weights within expect_same_training's bars
// of the one-process FP8 run; every process's checkpoint holds the same scales to the bit (a maximum
// taken per process would give each its own: its data, its slice, its layers' alone); and those are
// within 2^-3 of the one process's (not its bits: the layouts' sums round differently, so their first
// scales differ in the last bits, and from then on each run's FP8 products carry their own e4m3
// rounding, up to 2^-4 of an operand, which moves a tensor's maximum; measured: up to ~5%).
TEST(MultiGpuMpirun, Fp8LayoutsTakeTheOneProcessScales) {
    REQUIRE_MPIRUN_GPUS(4);
    REQUIRE_ORACLE("tiny_five", five_args());
    std::string oracle_dir = test::oracle("tiny_five", five_args());
    const int steps = 3;
    std::string flags = dp_flags(oracle_dir, steps, 2 * 16 * 4) + " -fp8 2";
    TrainerRun one = run_trainer("fp8_one", flags);
    std::vector<float> want = fp8_scales_of(one.dir, steps, 0);
    ASSERT_FALSE(want.empty());
    struct Case { int np; std::string flags; };
    int k = 0;
    for (const Case& c : {Case{2, "-z 1"}, Case{2, "-z 3"}, Case{2, "-tp 2 -sq 1"}, Case{2, "-pp 2"}, Case{2, "-cp 2"}}) {
        SCOPED_TRACE(c.flags);
        std::string dir = test::scratch_dir("fp8_layout_" + std::to_string(k++));
        test::CommandResult r = test::run_command(mpirun_command(c.np) + trainer() + " " + flags + " " + c.flags + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("FP8 (-fp8 2): the block's qkv, attproj, fc, fcproj matmuls"), std::string::npos) << r.output;
        expect_same_training(one.dir, dir, steps, 1e-3);
        std::vector<float> got = fp8_scales_of(dir, steps, 0);
        ASSERT_EQ(got.size(), want.size());
        double worst = 0;
        for (size_t i = 0; i < want.size(); i++) {
            EXPECT_NEAR(got[i], want[i], 0.125 * want[i]) << "scale " << i;
            worst = std::max(worst, std::fabs((double)got[i] - want[i]) / want[i]);
        }
        printf("  scales within %.1e relative of one process's\n", worst);
        for (int rank = 1; rank < c.np; rank++) EXPECT_EQ(fp8_scales_of(dir, steps, rank), got) << "process " << rank;
    }
}
#endif

// A data-parallel group of one process has nothing to shard: -z 2 and -z 3 with -tp 2 on 2 processes,
// and -z 3 on 1 process under mpirun, run as -z 0 and say so (they crashed at the first backward, on
// gradient tensors that pointed nowhere; the operations issue's item 1). Each trains as one process
// does (expect_same_training's bars), counts the bytes its start-up line predicts, and its memory plan
// is what it allocated, to the byte (the plan had counted the packed buffers the run does not use).
TEST(MultiGpuMpirun, ZeroStageWithOneDataParallelProcessRunsUnsharded) {
    REQUIRE_MPIRUN_GPUS(2);
    REQUIRE_ORACLE("tiny_five", five_args());
    const int steps = 2;
    std::string five = test::oracle("tiny_five", five_args());
    std::string flags = dp_flags(five, steps, 2 * 16 * 2);
    std::string one = run_trainer("zero_dp1_one", flags).dir;
    struct Case { int np; std::string flags; };
    for (const Case& c : {Case{2, "-tp 2 -z 3"}, Case{2, "-tp 2 -z 2"}, Case{1, "-z 3"}}) {
        SCOPED_TRACE(std::to_string(c.np) + " processes, " + c.flags);
        std::string dir = test::scratch_dir("zero_dp1_" + std::to_string(c.np) + "_" + c.flags.substr(c.flags.size() - 1));
        test::CommandResult r = test::run_command(mpirun_command(c.np) + trainer() + " " + flags + " " + c.flags + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("one data-parallel process: nothing to shard, -z " + c.flags.substr(c.flags.size() - 1) +
                                " runs as -z 0"), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("bytes planned (-P 1), "), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("in use (cudaMemGetInfo): +0.00%"), std::string::npos) << r.output;
        if (c.np > 1) expect_comm_bytes_as_predicted(r.output, dir);
        expect_same_training(one, dir, steps, 1e-3);
    }
}

// -ni 2 with pp 2: only the last stage's loss gradient is non-finite; it reaches stage 0 through the sent
// gradients and the norm is summed over the stages, so both skip step 2: the weights after it are those
// before it, and step 3 updates them again (the model files are gathered from both stages).
TEST(MultiGpuMpirun, PipelineNonFiniteStepSkippedByEveryStage) {
    REQUIRE_MPIRUN_GPUS(2);
    REQUIRE_ORACLE("tiny_five", five_args());
    std::string oracle_dir = test::oracle("tiny_five", five_args());
    std::string dir = test::scratch_dir("pp_nonfinite");
    test::CommandResult r = test::run_command(mpirun_command(2) + trainer() + " " + dp_flags(oracle_dir, 4, 128) +
                                              " -n 1 -ni 2 -pp 2 -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("SKIPPED"), std::string::npos) << r.output;
    EXPECT_EQ(test::read_text(dir + "/model_00000002.bin"), test::read_text(dir + "/model_00000003.bin"));
    EXPECT_NE(test::read_text(dir + "/model_00000003.bin"), test::read_text(dir + "/model_00000004.bin"));
}

// -b auto with 2 processes whose devices differ (MPMD: process 1's emulated device has less memory,
// between what B=32 and B=64 need, as in TrainMemory.BatchAutoTakesTheLargestMicroBatchThatFits):
// process 0 alone would take B=64, process 1 B=32; all must run the same micro-batch, so both take the
// least, and the step is 2 micro-steps of 32 on each. (bf16 build only: the path is the precision's
// neither; emulator only: it sets the device's memory.)
#if !defined(ENABLE_FP32)
TEST(MultiGpuMpirun, BatchAutoTakesTheLeastChoiceOfAllProcesses) {
#if !defined(CUDA_EMULATION)
    GTEST_SKIP() << "sets the device's memory with EMU_DEVICE_MEMORY: emulator only";
#endif
    REQUIRE_MPIRUN_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string model = " -e " + dir + "/model.bin -t 32 -r 3";
    auto planned = [&](int B) {
        test::CommandResult r = test::run_command(trainer() + model + " -b " + std::to_string(B) + " -P 1");
        EXPECT_EQ(r.exit_code, 0) << r.output;
        unsigned long long total = 0;
        EXPECT_TRUE(read_plan_total(r.output, &total)) << r.output;
        return (double)total;
    };
    long long memory = (long long)((planned(32) + planned(64)) / 2 * 32.0 / 31.0);
    std::string flags = model + " -i " + dir + "/train.bin -sh 0 -v 0 -s 0 -b auto -d 4096 -x 1 -o " +
                        test::scratch_dir("mpi_batch_auto");
    std::string cmd = "timeout 600 env EMU_DEVICE_COUNT=2 ASAN_OPTIONS=detect_leaks=0 mpirun --allow-run-as-root "
                      "--oversubscribe --bind-to none -x EMU_DEVICE_COUNT -x ASAN_OPTIONS -np 1 " + trainer() + flags +
                      " : -np 1 env EMU_DEVICE_MEMORY=" + std::to_string(memory) + " " + trainer() + flags;
    test::CommandResult r = test::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("-b auto chose B=64"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("batch: -b auto: B=32, the least any process could take (this one: 64)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("batch: B=32 T=32 x 2 accumulation step(s) x 2 process(es)"), std::string::npos) << r.output;
}
#endif

// Issue 51, item 2: one mpirun that started the CPU trainer beside this one hung before training (they
// issued different collectives, and nothing watched start-up). The first collective of both trainers
// now compares the programs (start_up_check, llmc/parallel/comm.h), under the start-up limit -pt: both
// stop at once, process 0 naming what each process runs.
TEST(MultiGpuMpirun, TwoTrainersInOneLaunchAreStoppedNamingEach) {
    REQUIRE_MPIRUN_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (!file_exists(cpu_trainer)) GTEST_SKIP() << "needs the CPU trainer (make train_gpt2)";
    std::string oracle_dir = tiny_oracle();
    std::string flags = " -e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -x 2 -v 0 -s 0 -pt 20";
    auto start = std::chrono::steady_clock::now();
    test::CommandResult r = test::run_command(mpirun_command(1) + trainer() + flags + " : -np 1 " + cpu_trainer + flags);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "hung until timeout\n" << r.output;
    EXPECT_NE(r.output.find(std::string("the processes run different programs: process 0 runs train_gpt2cu (") +
                            PRECISION_NAME + "), process 1 runs train_gpt2 (fp32 CPU)"), std::string::npos) << r.output;
    EXPECT_LT(seconds, 20 + 60) << r.output;
}

#if !defined(ENABLE_FP32)
// The bf16 build's side of -lh and -gc (the fp32 build's tests follow the oracle): the bf16 parameters
// rounded from the master weights after a synchronization, the changes and gradients sent in bf16 or
// compressed from bf16; each run's bytes as predicted (-gc: every step; -lh: the start-up's count at
// every second step and the last, nothing between), and each resumed from step 3 ends with its bits.
TEST(MultiGpuMpirun, BytesSavingFlagsResumeBitForBitInBf16) {
    REQUIRE_MPIRUN_GPUS(2);
    OptimizerRun run{"adamw", 1e-3, 0.02};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(2) + " --local-steps 2 --outer nesterov";
    REQUIRE_ORACLE("local_steps_nesterov", oracle_args);
    std::string oracle_dir = test::oracle("local_steps_nesterov", oracle_args);
    int k = 0;
    for (std::string flags : {" -lh 2", " -gc powersgd -gr 2", " -gc sign"}) {
        SCOPED_TRACE(flags);
        std::string cmd = mpirun_command(2) + run.trainer_args(oracle_dir, 2, TRAINER) + flags + " -n 1";
        std::string a = test::scratch_dir("bf16_saving_" + std::to_string(k)), b = test::scratch_dir("bf16_saving_r" + std::to_string(k++));
        test::CommandResult r = test::run_command(cmd + " -o " + a);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        if (flags.find("-gc") != std::string::npos) {
            expect_comm_bytes_as_predicted(r.output, a);
        } else {
            double sync = 0;
            size_t at = r.output.find("communication: -lh 2: ");
            ASSERT_NE(at, std::string::npos) << r.output;
            ASSERT_EQ(sscanf(r.output.c_str() + at, "communication: -lh 2: %lf bytes", &sync), 1);
            std::vector<double> counted = test::jsonl_values(a + "/metrics.jsonl", "comm_bytes");
            ASSERT_EQ(counted.size(), 5u);
            for (int s = 0; s < 5; s++) EXPECT_EQ(counted[s], s == 1 || s == 3 || s == 4 ? sync : 0.0) << "step " << s;
        }
        test::expect_resume_from_step_3_same_bits(cmd, a, b);
    }
}
#endif

#if defined(ENABLE_FP32)
// The issue's acceptance check: `mpirun -np 3 train_gpt2fp32cu -z 1` on a small model follows the CPU
// trainer (one process, 3-fold accumulation, the same global batch) to fp32 noise.
TEST(MultiGpuMpirun, ThreeProcessesZero1MatchTheCpuTrainer) {
    REQUIRE_MPIRUN_GPUS(3);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (!file_exists(cpu_trainer)) GTEST_SKIP() << "needs the CPU trainer (make train_gpt2)";
    std::string oracle_dir = tiny_oracle();
    const int steps = 4;
    std::string flags = dp_flags(oracle_dir, steps, 2 * 16 * 3);
    TrainerRun cpu = run_trainer("mpi_cpu", flags, "OMP_NUM_THREADS=1 " + cpu_trainer);
    std::string dir = test::scratch_dir("mpi_3_cpu_z1");
    test::CommandResult r = test::run_command(mpirun_command(3) + trainer() + " " + flags + " -z 1 -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_training(cpu.dir, dir, steps, 1e-3);
}

// -opt adafactor over 3 processes, -z 1 (the reduce-scatter's shards all-gathered: every process
// holds the whole reduced gradient and the whole factored state, and updates every parameter, as the
// CPU trainer does; llmc/parallel/matrix_owners.h) and -z 0, against torch.optim.Adafactor accumulating
// the same global batch, with the one-process test's bars (TrainOptimizers.AdafactorAgainstTorch...,
// fp32), and the bytes per step as predicted (the gradients' all-gather in place of the parameters').
TEST(MultiGpuMpirun, ThreeProcessesAdafactorZero0And1MatchTorch) {
    REQUIRE_MPIRUN_GPUS(3);
    OptimizerRun run{"adafactor", 1e-2, 0.0};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(3);
    REQUIRE_ORACLE("opt_adafactor_np3", oracle_args);
    std::string oracle_dir = test::oracle("opt_adafactor_np3", oracle_args);
    for (int z : {1, 0}) {
        SCOPED_TRACE("-z " + std::to_string(z));
        std::string dir = test::scratch_dir("mpi_3_adafactor_z" + std::to_string(z));
        test::CommandResult r = test::run_command(mpirun_command(3) + run.trainer_args(oracle_dir, 3, TRAINER) + " -z " +
                                                  std::to_string(z) + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("optimizer: Adafactor over 28 tensors"), std::string::npos) << r.output;
        Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
        expect_agreement(a, TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0, TOL_STEP_NORM_REL, 1e-3);
        expect_comm_bytes_as_predicted(r.output, dir);
    }
}

// Adafactor on 2 pipeline stages: the one-process oracle's run with the one-process bars and the
// predicted bytes; a run resumed from its checkpoint (the stages' factored states put together in
// process 0's file, then cut again) ends with the same bits as the uninterrupted one.
TEST(MultiGpuMpirun, AdafactorPipelineMatchesTorchAndResumes) {
    REQUIRE_MPIRUN_GPUS(2);
    OptimizerRun run{"adafactor", 1e-2, 0.0};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(1);
    REQUIRE_ORACLE("opt_adafactor_np1", oracle_args);
    std::string oracle_dir = test::oracle("opt_adafactor_np1", oracle_args);
    std::string cmd = mpirun_command(2) + run.trainer_args(oracle_dir, 1, TRAINER) + " -pp 2";
    std::string a = test::scratch_dir("mpi_2_adafactor_pp2"), b = test::scratch_dir("mpi_2_adafactor_pp2_resumed");
    test::CommandResult r = test::run_command(cmd + " -o " + a);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Agreement agree = compare_with_oracle(oracle_dir, a, run.steps);
    expect_agreement(agree, TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0, TOL_STEP_NORM_REL, 1e-3);
    expect_comm_bytes_as_predicted(r.output, a);
    // the same run with a checkpoint at step 3 (-n 3), its final checkpoint removed, resumed from step 3
    ASSERT_EQ(test::run_command(cmd + " -n 3 -o " + b).exit_code, 0);
    ASSERT_EQ(test::run_command("rm -f " + b + "/model_00000005.bin " + b + "/state_00000005_* " + b + "/DONE_00000005").exit_code, 0);
    test::CommandResult resumed = test::run_command(cmd + " -n 3 -y 1 -o " + b);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 3"), std::string::npos) << resumed.output;
    EXPECT_EQ(test::read_text(a + "/model_00000005.bin"), test::read_text(b + "/model_00000005.bin"));
}

// -opt adamw8 on 2 processes at each ZeRO stage (fp32) against the oracle's 8-bit AdamW accumulating the
// same global batch, with the one-process bars (TrainOptimizers.Adamw8AgainstTorch...): the tiny model's shard
// boundary cuts an 8-bit block, whose two parts are encoded with the whole block's maxima
// (llmc/parallel/zero_blocks.h; the two state files agree on them, checked, and the resume below checks
// it again); the bytes per step as predicted (AdamW's: the maxima's exchange is not counted); and a run
// resumed from the -z 1 checkpoint with -z 3 continues (the codes and maxima cut out again).
TEST(MultiGpuMpirun, Adamw8EveryZeroStageMatchesTorch) {
    REQUIRE_MPIRUN_GPUS(2);
    OptimizerRun run{"adamw8", 1e-3, 0.02};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(2);
    REQUIRE_ORACLE("opt_adamw8_np2", oracle_args);
    std::string oracle_dir = test::oracle("opt_adamw8_np2", oracle_args);
    for (int z : {1, 2, 3}) {
        SCOPED_TRACE("-z " + std::to_string(z));
        std::string dir = test::scratch_dir("mpi_2_adamw8_z" + std::to_string(z));
        test::CommandResult r = test::run_command(mpirun_command(2) + run.trainer_args(oracle_dir, 2, TRAINER) + " -z " +
                                                  std::to_string(z) + " -n 3 -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
        expect_agreement(a, TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0, TOL_STEP_NORM_REL, 5e-2);
        expect_comm_bytes_as_predicted(r.output, dir);
        TrainState left, right;
        state_file_read(dir + "/state_00000005_00000.bin", &left);
        state_file_read(dir + "/state_00000005_00001.bin", &right);
        ASSERT_EQ(left.moments8.block_end - 1, right.moments8.block_begin) << "the boundary cuts a block";
        EXPECT_EQ(left.moments8.m_max.back(), right.moments8.m_max.front());
        EXPECT_EQ(left.moments8.v_max.back(), right.moments8.v_max.front());
        if (z != 1) continue;
        std::string other = test::scratch_dir("mpi_2_adamw8_z1_to_z3");
        ASSERT_EQ(test::run_command("cp " + dir + "/model_00000003.bin " + dir + "/state_00000003_0000* " + dir +
                                    "/DONE_00000003 " + other).exit_code, 0);
        test::CommandResult resumed = test::run_command(mpirun_command(2) + run.trainer_args(oracle_dir, 2, TRAINER) +
                                                        " -z 3 -y 1 -o " + other);
        ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
        EXPECT_NE(resumed.output.find("continuing from step 3"), std::string::npos) << resumed.output;
    }
}

// -lh 2 on 2 processes (fp32) against the oracle's two AdamW replicas averaged by DiLoCo's outer step after
// steps 2, 4 and 5 (gpt2_oracle.py --local-steps, the CPU trainer's test: LocalSteps.TwoReplicas...), with
// the fp32 bars of the one-process runs; the bytes are the parameters' all-reduce at those steps and
// nothing between (the start-up's line says how many); a run resumed from step 3, where the replicas
// differ (each from its own state file), ends with the same bits.
TEST(MultiGpuMpirun, LocalStepsMatchTheOracleAndResumeBitForBit) {
    REQUIRE_MPIRUN_GPUS(2);
    OptimizerRun run{"adamw", 1e-3, 0.02};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(2) + " --local-steps 2 --outer nesterov";
    REQUIRE_ORACLE("local_steps_nesterov", oracle_args);
    std::string oracle_dir = test::oracle("local_steps_nesterov", oracle_args);
    std::string cmd = mpirun_command(2) + run.trainer_args(oracle_dir, 2, TRAINER) + " -lh 2 -n 1";
    std::string a = test::scratch_dir("mpi_2_lh2"), b = test::scratch_dir("mpi_2_lh2_resumed");
    test::CommandResult r = test::run_command(cmd + " -o " + a);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Agreement agree = compare_with_oracle(oracle_dir, a, run.steps);
    expect_agreement(agree, TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0, TOL_STEP_NORM_REL, 1e-2);
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(oracle_dir + "/model.bin", &cfg, &params);
    double sync = 2.0 * 2.0 * (double)(params.size() - params.size() / 2) * 4;
    EXPECT_NE(r.output.find("communication: -lh 2: " + std::to_string((long long)sync) + " bytes at each synchronization"),
              std::string::npos) << r.output;
    ASSERT_EQ(agree.comm_bytes.size(), 5u);
    for (int s = 0; s < 5; s++) EXPECT_EQ(agree.comm_bytes[s], s == 1 || s == 3 || s == 4 ? sync : 0.0) << "step " << s;
    test::expect_resume_from_step_3_same_bits(cmd, a, b);
}

// -gc powersgd -gr 2 and -gc sign on 2 processes (fp32) against the oracle's compression by its
// definition (gpt2_oracle.py --powersgd, with torch's QR; --sign, EF21), with the fp32 bars of the
// one-process runs; the bytes of each step as the start-up predicts (PowerSGD's two all-reduces, sign's
// gather). Each scheme resumed from step 3 (its state, and Q, from each process's own state file) ends
// with the same bits.
TEST(MultiGpuMpirun, CompressedGradientsMatchTheOracleAndResumeBitForBit) {
    REQUIRE_MPIRUN_GPUS(2);
    OptimizerRun run{"adamw", 1e-3, 0.02};
    for (std::string name : {"powersgd", "sign"}) {
        SCOPED_TRACE(name);
        std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(2) + (name == "sign" ? " --sign" : " --powersgd 2");
        std::string oracle_name = name == "sign" ? "sign_ef21" : "powersgd_r2";
        REQUIRE_ORACLE(oracle_name, oracle_args);
        std::string oracle_dir = test::oracle(oracle_name, oracle_args);
        std::string flags = name == "sign" ? " -gc sign" : " -gc powersgd -gr 2";
        std::string cmd = mpirun_command(2) + run.trainer_args(oracle_dir, 2, TRAINER) + flags + " -n 1";
        std::string a = test::scratch_dir("mpi_2_gc_" + name), b = test::scratch_dir("mpi_2_gc_" + name + "_resumed");
        test::CommandResult r = test::run_command(cmd + " -o " + a);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        expect_comm_bytes_as_predicted(r.output, a);
        Agreement agree = compare_with_oracle(oracle_dir, a, run.steps);
        expect_agreement(agree, TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0, TOL_STEP_NORM_REL, 1e-2);
        test::expect_resume_from_step_3_same_bits(cmd, a, b);
    }
}

// -oo 1 with ZeRO over 2 processes: each process offloads its shard of AdamW's state (-z 1), and with
// -z 3 its shard of the parameters' updates too; the runs equal their -oo 0 twins bit for bit (the
// CPU runs the GPU kernel's element body, llmc/optimizer_offload.cuh): the model file and both
// processes' state files.
TEST(MultiGpuMpirun, OptimizerOffloadOfEachShardEqualsTheDeviceOptimizer) {
    REQUIRE_MPIRUN_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string flags = dp_flags(oracle_dir, 3, 2 * 16 * 2 * 2);
    for (int zero : {1, 3}) {
        SCOPED_TRACE("-z " + std::to_string(zero));
        std::string dirs[2];
        for (int oo : {0, 1}) {
            dirs[oo] = test::scratch_dir("mpi_offload_z" + std::to_string(zero) + "_oo" + std::to_string(oo));
            test::CommandResult r = test::run_command(mpirun_command(2) + trainer() + " " + flags + " -z " +
                                                      std::to_string(zero) + " -oo " + std::to_string(oo) + " -o " + dirs[oo]);
            ASSERT_EQ(r.exit_code, 0) << r.output;
            if (oo == 1) EXPECT_NE(r.output.find("offload: 3 AdamW updates on the host"), std::string::npos) << r.output;
        }
        for (const char* f : {"/model_00000003.bin", "/state_00000003_00000.bin", "/state_00000003_00001.bin"}) {
            EXPECT_EQ(test::read_text(dirs[0] + f), test::read_text(dirs[1] + f)) << f;
        }
    }
}

// -opt muon over 3 processes, with -z 1 (each process's shard of the momentum; the Nesterov updates
// all-gathered, each matrix orthogonalized by its owner and broadcast), with -z 0 (owners and broadcasts
// after the all-reduce) and with -z 2 and 3 (only a shard of the gradients: each matrix gathered on its own
// from the shards), against torch.optim.Muon accumulating the same global batch (3 x 2
// micro-batches), with the one-process test's bars (TrainOptimizers.MuonAgainstTorch, fp32); and the
// bytes counted per step as the start-up line predicts them (Muon's gather and broadcasts included).
TEST(MultiGpuMpirun, ThreeProcessesMuonEveryZeroStageMatchesTorch) {
    REQUIRE_MPIRUN_GPUS(3);
    OptimizerRun run{"muon", 1e-3, 0.02};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(3) + " --muon-ns-dtype compute";
    REQUIRE_ORACLE("opt_muon_np3", oracle_args);
    std::string oracle_dir = test::oracle("opt_muon_np3", oracle_args);
    for (int z : {1, 0, 2, 3}) {  // -z 2, 3: each matrix gathered from the gradient shards on its own
        SCOPED_TRACE("-z " + std::to_string(z));
        std::string dir = test::scratch_dir("mpi_3_muon_z" + std::to_string(z));
        test::CommandResult r = test::run_command(mpirun_command(3) + run.trainer_args(oracle_dir, 3, TRAINER) + " -z " +
                                                  std::to_string(z) + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("each matrix by its owner, then broadcast"), std::string::npos) << r.output;
        Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
        expect_agreement(a, TOL_STEP_LOSS_REL, TOL_STEP_NORM_REL, 1e-2);
        EXPECT_LE(a.matrices, 1e-4) << "Muon's matrices";
        expect_comm_bytes_as_predicted(r.output, dir);
    }
}

// Muon under tensor parallelism (-tp 2: each process holds half of every block matrix; the owner's TP
// group gathers the slices, each rank orthogonalizes the whole matrix and keeps its slice) and on
// pipeline stages (-pp 2: each stage its own layers' matrices): the one-process oracle's run, with the
// one-process bars, and the bytes as predicted (the gathers counted).
TEST(MultiGpuMpirun, MuonTensorParallelAndPipelineMatchTorch) {
    REQUIRE_MPIRUN_GPUS(2);
    OptimizerRun run{"muon", 1e-3, 0.02};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(1) + " --muon-ns-dtype compute";
    REQUIRE_ORACLE("opt_muon_np1", oracle_args);
    std::string oracle_dir = test::oracle("opt_muon_np1", oracle_args);
    for (const char* layout : {"-tp 2", "-pp 2"}) {
        SCOPED_TRACE(layout);
        std::string dir = test::scratch_dir(std::string("mpi_2_muon_") + (layout[1] == 't' ? "tp2" : "pp2"));
        test::CommandResult r =
            test::run_command(mpirun_command(2) + run.trainer_args(oracle_dir, 1, TRAINER) + " " + layout + " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
        expect_agreement(a, TOL_STEP_LOSS_REL, TOL_STEP_NORM_REL, 1e-2);
        EXPECT_LE(a.matrices, 1e-4) << "Muon's matrices";
        expect_comm_bytes_as_predicted(r.output, dir);
    }
}

// ZeRO-2 and ZeRO-3 with gradient accumulation (2 micro-steps on each of 3 processes: every
// micro-step's packed gradients are reduced into the owners' shards and added to their running sums;
// -z 3 gathers each block before its forward and again before its backward, and the model file from
// the shards) follow the CPU trainer with 6-fold accumulation, to fp32 noise. The model is the tiny one
// with maxT 40, which makes its parameter count one that 3 does not divide (checked): the last shard is
// short and padded. -z 3 also samples (every process runs the sampling forwards) and evaluates.
TEST(MultiGpuMpirun, ThreeProcessesZero2And3WithAccumulationMatchTheCpuTrainer) {
    REQUIRE_MPIRUN_GPUS(3);
    const std::string odd_args = "--layers 2 --channels 64 --heads 4 --max-seq-len 40 --vocab 300 --seed 1 " +
                                 std::string(TINY_DATA);
    REQUIRE_ORACLE("tiny_t40", odd_args);
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (!file_exists(cpu_trainer)) GTEST_SKIP() << "needs the CPU trainer (make train_gpt2)";
    std::string oracle_dir = test::oracle("tiny_t40", odd_args);
    ASSERT_NE(tiny_parameters(oracle_dir) % 3, 0u) << "the test wants a parameter count 3 does not divide";
    const int steps = 3;
    std::string flags = dp_flags(oracle_dir, steps, 2 * 16 * 3 * 2);
    TrainerRun cpu = run_trainer("mpi_cpu_z2", flags, "OMP_NUM_THREADS=1 " + cpu_trainer);
    // -lc 3 (the LM head in chunks, its gradient in the forward): the packed gradient of wte starts there
    for (const std::string zero_flags : {"-z 2", "-z 3", "-z 2 -lc 3"}) {
        SCOPED_TRACE(zero_flags);
        int zero = zero_flags[3] - '0';
        std::string dir = test::scratch_dir("mpi_3_cpu_z" + std::to_string(zero) + std::to_string(zero_flags.size()));
        std::string extra = zero == 3 ? " -s 2 -g 4 -j " + oracle_dir + "/train.bin -v 2 -m 3" : "";
        test::CommandResult r = test::run_command(mpirun_command(3) + trainer() + " " + flags + extra + " " + zero_flags +
                                                  " -o " + dir);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("x 2 accumulation step(s) x 3 process(es)"), std::string::npos) << r.output;
        if (zero == 3) EXPECT_NE(r.output.find("--- sample ---"), std::string::npos) << r.output;
        if (zero == 2) expect_comm_bytes_as_predicted(r.output, dir);  // -z 3 evaluates and samples between steps
        expect_same_training(cpu.dir, dir, steps, 1e-3);
    }
}

// A run of 4 steps (leg.first, leg.first_processes processes, checkpoints every 2 steps in dir) is cut
// back to its step-2 checkpoint and resumed by leg.second: its steps 2 and 3 follow the first run's,
// losses within the suite's fp32 step tolerance and weights within 1% of AdamW's largest movement (2
// steps of lr 1e-3), not bit for bit (another trainer or layout: other summation orders).
struct ResumeLeg { const char* name; std::string first, second; int first_processes; };
void expect_resume_follows(const ResumeLeg& leg, const std::string& dir) {
    test::CommandResult first = test::run_command(leg.first + " -o " + dir);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    std::vector<double> want = test::jsonl_values(dir + "/metrics.jsonl", "train_loss");
    ASSERT_EQ(want.size(), 4u);
    std::vector<float> want_weights = checkpoint_weights(dir, 4);
    // forget step 4: the second trainer continues from step 2
    std::remove(checkpoint_done_path(dir, 4).c_str());
    std::remove(checkpoint_model_path(dir, 4).c_str());
    for (int r = 0; r < leg.first_processes; r++) std::remove(checkpoint_state_path(dir, 4, r).c_str());
    test::CommandResult second = test::run_command(leg.second + " -y 1 -o " + dir);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("continuing from step 2"), std::string::npos) << second.output;
    std::vector<double> got = test::jsonl_values(dir + "/metrics.jsonl", "train_loss");
    ASSERT_GE(got.size(), 2u);
    for (int s = 2; s < 4; s++) {
        double g = got[got.size() - 4 + s];
        EXPECT_NEAR(g, want[s], step_loss_tolerance(want[s])) << "loss at step " << s;
    }
    std::vector<float> got_weights = checkpoint_weights(dir, 4);
    ASSERT_EQ(got_weights.size(), want_weights.size());
    double worst = 0;
    for (size_t i = 0; i < got_weights.size(); i++) worst = std::max(worst, (double)std::fabs(got_weights[i] - want_weights[i]));
    EXPECT_LE(worst, 0.01 * 2 * 1e-3) << "final weights";
    printf("  %s: losses at steps 2, 3 within %.1e and %.1e, weights %.1e\n", leg.name,
           std::fabs(got[got.size() - 2] - want[2]), std::fabs(got.back() - want[3]), worst);
}

// Checkpoints depend on neither the layout nor the trainer (issue 29, item 6). A CPU run under tp 2 x
// pp 2 (4 processes) checkpoints at step 2 and goes on to step 4; the CUDA trainer (fp32) resumes its
// step-2 checkpoint under ZeRO-3 with 2 processes and trains the steps 2 and 3 the CPU run trained. The
// reverse: a CUDA -z 3 run's step-2 checkpoint resumed by the CPU trainer under tp 2 x pp 2. The global
// batch is the same (64 tokens a step) and the data order does not depend on the layout, so both go on
// with the same data and the same math: losses within the suite's fp32 step tolerance and weights
// within 1% of AdamW's largest movement (as expect_same_training), not bit for bit (another trainer,
// other summation orders).
TEST(MultiGpuMpirun, CheckpointsMoveBetweenTrainersAndLayouts) {
    REQUIRE_MPIRUN_GPUS(2);
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (!file_exists(cpu_trainer)) GTEST_SKIP() << "needs the CPU trainer (make train_gpt2)";
    std::string flags = " " + dp_flags(tiny_oracle(), 4, 64) + " -n 2";
    std::string cpu = "OMP_NUM_THREADS=1 " + mpirun_command(4) + cpu_trainer + flags + " -tp 2 -pp 2";
    std::string gpu = mpirun_command(2) + trainer() + flags + " -z 3";
    for (const ResumeLeg& leg : {ResumeLeg{"CPU tp2 x pp2, then CUDA -z 3", cpu, gpu, 4},
                                 ResumeLeg{"CUDA -z 3, then CPU tp2 x pp2", gpu, cpu, 2}}) {
        SCOPED_TRACE(leg.name);
        expect_resume_follows(leg, test::scratch_dir(std::string("xtrain_") + (leg.first_processes == 4 ? "cpu_gpu" : "gpu_cpu")));
    }
}

// A tensor- or pipeline-parallel checkpoint is the whole model and state, like any other (issue 29,
// item 6): a CUDA -pp 2 run's step-2 checkpoint resumed by one CUDA process, a CPU -pp 2 run's by the
// CUDA trainer as -pp 3 (GPipe), and a CUDA tp 2 x pp 2 run's by the CPU trainer as tp 2, each following
// the first run's steps 2 and 3 (fp32 step tolerance, weights within 1% of AdamW's largest movement).
TEST(MultiGpuMpirun, ModelParallelCheckpointsResumeInOtherLayouts) {
    REQUIRE_MPIRUN_GPUS(4);
    REQUIRE_ORACLE("tiny_five", five_args());
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (!file_exists(cpu_trainer)) GTEST_SKIP() << "needs the CPU trainer (make train_gpt2)";
    std::string flags = " " + dp_flags(test::oracle("tiny_five", five_args()), 4, 128) + " -n 2";
    int legs_run = 0;
    for (const ResumeLeg& leg : {ResumeLeg{"CUDA pp 2, then 1 CUDA process", mpirun_command(2) + trainer() + flags + " -pp 2",
                                           trainer() + flags, 2},
                                 ResumeLeg{"CPU pp 2, then CUDA pp 3 (GPipe)",
                                           "OMP_NUM_THREADS=1 " + mpirun_command(2) + cpu_trainer + flags + " -pp 2",
                                           mpirun_command(3) + trainer() + flags + " -pp 3 -pm gpipe", 2},
                                 ResumeLeg{"CUDA tp 2 x pp 2, then CPU tp 2", mpirun_command(4) + trainer() + flags + " -tp 2 -pp 2",
                                           "OMP_NUM_THREADS=1 " + mpirun_command(2) + cpu_trainer + flags + " -tp 2", 4}}) {
        SCOPED_TRACE(leg.name);
        expect_resume_follows(leg, test::scratch_dir("mp_resume_" + std::to_string(legs_run++)));
    }
}
#endif
#endif  // USE_MPI

}  // namespace gpu_test
