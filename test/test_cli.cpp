// The trainer's command line (llmc/run/args.h), learning-rate schedules (llmc/run/schedulers.h) and log
// truncation on resume (llmc/run/logger.h).
//
// Flag errors are checked on the built trainer (GPT2_ROOT/train_gpt2, which `make test` builds before
// this binary runs): each bad command line must exit non-zero with a message naming the flag. The
// errors that need a model or data run against a tiny checkpoint and tiny shards, and the same
// command line without the fault is run once and must succeed, so each failure is due to its fault.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "../llmc/run/args.h"
#include "../llmc/io/checkpoint.h"
#include "../llmc/io/dataloader.h"
#include "../llmc/run/logger.h"
#include "../llmc/run/loss_scaler.h"
#include "../llmc/io/output_lock.h"
#include "../llmc/parallel/comm_mpi.h"
#include "../llmc/run/schedulers.h"
#include "test_helpers.h"

namespace {

// Runs the trainer; a command line it wrongly accepts would start training a default-sized model, so
// the run is cut off after 120 s (exit code 124, which fails every check here).
test::CommandResult run_trainer(const std::string& args) {
    return test::run_command("cd '" + test::root() + "' && OMP_NUM_THREADS=1 timeout 120 ./train_gpt2 " + args);
}

struct Refusal {
    std::string args;     // the trainer's command line (shell words)
    std::string pattern;  // ECMAScript regex its output must match
};

// Expects the trainer to refuse each command line: exit code 1 and output matching the pattern. The
// commands run concurrently (each one's start-up is mostly waiting), outputs in build/test_tmp/NAME.
void expect_refused_all(const std::string& name, const std::vector<Refusal>& cases) {
    std::string dir = test::scratch_dir(name);
    std::string script = "cd '" + test::root() + "' && { ";
    for (size_t i = 0; i < cases.size(); i++) {
        std::string out = dir + "/out_" + std::to_string(i), rc = dir + "/rc_" + std::to_string(i);
        script += "( OMP_NUM_THREADS=1 timeout 120 ./train_gpt2 " + cases[i].args + " > '" + out + "' 2>&1; echo $? > '" +
                  rc + "' ) & ";
    }
    script += "wait; }";
    test::CommandResult all = test::run_command(script);
    ASSERT_EQ(all.exit_code, 0) << all.output;
    for (size_t i = 0; i < cases.size(); i++) {
        std::string output = test::read_text(dir + "/out_" + std::to_string(i));
        int exit_code = atoi(test::read_text(dir + "/rc_" + std::to_string(i)).c_str());
        EXPECT_EQ(exit_code, 1) << "train_gpt2 " << cases[i].args << "\n" << output;
        EXPECT_TRUE(std::regex_search(output, std::regex(cases[i].pattern)))
            << "train_gpt2 " << cases[i].args << "\nexpected output matching: " << cases[i].pattern << "\ngot:\n"
            << output;
    }
}

// A tiny model checkpoint and tiny shards: maxT 16, V 64 (Vp 128), 1 layer, 2 heads, 8 channels;
// 401 train tokens (25 batches of B*T = 16) and 97 val tokens (6 batches).
struct TinyRun {
    std::string dir, model, train, val;
    std::string args() const {  // a complete command line that trains one step
        return "-e '" + model + "' -i '" + train + "' -j '" + val + "' -b 2 -t 8 -x 1 -v 1 -m 2 -s 0";
    }
};

TinyRun make_tiny_run(const std::string& name) {
    TinyRun run;
    run.dir = test::scratch_dir(name);
    GPT2Config cfg{16, 64, 128, 1, 2, 8};  // maxT, V, Vp, L, NH, C
    std::vector<float> params(num_parameters(cfg));
    std::mt19937 rng(5);
    rand_normal_fill(params.data(), params.size(), 0.0, 0.02, rng);
    run.model = run.dir + "/model.bin";
    model_file_write(run.model, cfg, params.data(), MODEL_VERSION_FP32);
    std::vector<uint16_t> tokens(401);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint16_t)(i * 7 % 64);
    shard_write(run.dir + "/tiny_train_000001.bin", tokens.data(), 401);
    shard_write(run.dir + "/tiny_val_000000.bin", tokens.data(), 97);
    run.train = run.dir + "/tiny_train_*.bin";
    run.val = run.dir + "/tiny_val_*.bin";
    return run;
}

// Parses a command line in-process (argv[0] is added).
TrainArgs parse(std::vector<std::string> words, bool cuda = false) {
    words.insert(words.begin(), "train_gpt2");
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(&w[0]);
    TrainArgs args;
    parse_args((int)argv.size(), argv.data(), &args, cuda);
    return args;
}

// The schedule formulas of schedulers.h, written out again in double.
double lr_formula(const std::string& type, double lr, int W, int max_steps, double frac, int s) {
    double floor_lr = frac * lr;
    if (s < W) return lr * (s + 1) / W;
    double r = (double)(s - W) / (max_steps - W);
    if (type == "cosine") return floor_lr + (lr - floor_lr) * 0.5 * (1 + std::cos(M_PI * r));
    if (type == "linear") return lr - (lr - floor_lr) * r;
    if (type == "constant") return lr;
    int D = std::max(W, (int)std::floor(0.8 * max_steps));  // wsd
    if (s < D) return lr;
    return floor_lr + (lr - floor_lr) * (1 - std::sqrt((double)(s - D) / (max_steps - D)));
}

LRScheduler make_scheduler(const std::string& type, double lr, int W, int max_steps, double frac) {
    LRScheduler s;
    EXPECT_TRUE(parse_lr_schedule(type.c_str(), &s.type)) << type;
    s.learning_rate = lr;
    s.warmup_steps = W;
    s.max_steps = max_steps;
    s.final_frac = frac;
    return s;
}

void write_text(const std::string& path, const std::string& text) {
    FILE* fp = fopenCheck(path.c_str(), "wb");
    fwriteCheck(text.data(), 1, text.size(), fp);
    fcloseCheck(fp);
}

}  // namespace

// ----------------------------------------------------------------------------
// the trainer binary

TEST(CliTrainer, BinaryIsBuilt) {
    ASSERT_TRUE(file_exists(test::root() + "/train_gpt2")) << "build it first: make train_gpt2 (make test does)";
}

TEST(CliTrainer, HelpListsEveryFlag) {
    test::CommandResult r = run_trainer("-h");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (const char* flag : {"-i", "-j", "-e", "-o", "-b", "-t", "-d", "-x", "-l", "-u", "-q", "-k", "-c", "-v",
                             "-m", "-s", "-g", "-n", "-y", "-a", "-sh"}) {
        // each flag starts its own line of the usage, followed by a space (so "-s" is not found in "-sh")
        EXPECT_NE(r.output.find(std::string("\n  ") + flag + " "), std::string::npos) << "-h does not list " << flag;
    }
    // recomputation and the MFU peak are both trainers' flags; the CUDA-only ones are not offered here
    EXPECT_NE(r.output.find("\n  -r "), std::string::npos);
    EXPECT_NE(r.output.find("\n  -pk "), std::string::npos);
    EXPECT_EQ(r.output.find("\n  -w "), std::string::npos);
    EXPECT_EQ(run_trainer("--help").exit_code, 0);
}

TEST(CliTrainer, RefusesBadValues) {
    expect_refused_all("cli_bad_values", {
        // not numbers, or numbers with trailing characters
        {"-b abc", "flag -b: 'abc' is not an integer"},
        {"-b 4x", "flag -b: '4x' is not an integer"},
        {"-b 2.5", "flag -b: '2.5' is not an integer"},
        {"-x ''", "flag -x: '' is not an integer"},
        {"-l 0.1x", "flag -l: '0.1x' is not a number"},
        {"-l nan", "flag -l: 'nan' is not a number"},
        {"-q inf", "flag -q: 'inf' is not a number"},
        {"-d 99999999999999999999999", "flag -d: '9+' is not an integer"},  // overflows int64
        // out of range
        {"-b 0", "flag -b: 0 is outside the allowed range 1 \\.\\. "},
        {"-b 5000000000", "flag -b: 5000000000 is outside the allowed range"},  // beyond int
        {"-q 1.5", "flag -q: 1.5 is outside the allowed range 0 \\.\\. 1"},
        {"-y 2", "flag -y: 2 is outside the allowed range 0 \\.\\. 1"},
        {"-sh 3", "flag -sh: 3 is outside the allowed range 0 \\.\\. 1"},
        {"-l -1", "flag -l: -1 is outside the allowed range 0 \\.\\. "},
        {"-a -1", "flag -a: -1 is outside the allowed range"},
        {"-d 0", "flag -d: total batch must be -1 or positive"},
        {"-x -2", "flag -x: -2 is outside the allowed range"},
        {"-st -1", "flag -st: -1 is outside the allowed range 0 \\.\\. 100"},
        {"-sk -3", "flag -sk: -3 is outside the allowed range"},
        {"-he 5", "flag -he needs the HellaSwag file \\(-hs\\)"},
        {"-i ''", "flag -i: empty value"},
    });
}

TEST(CliTrainer, RefusesBadFlagsAndCombinations) {
    expect_refused_all("cli_bad_flags", {
        {"-Q 1", "unknown flag '-Q'"},
        {"-b 4 --batch 4", "unknown flag '--batch'"},
        {"-w 1", "flag -w is the CUDA trainer's"},  // CUDA only
        {"-fp8 1", "flag -fp8 is the CUDA trainer's.*FP8"},
        {"-b", "flag -b needs a value"},
        {"-t 64 -sh", "flag -sh needs a value"},
        {"-k step", "flag -k: unknown schedule 'step'"},
        {"-e d13", "flag -e: unknown model descriptor 'd13'"},
        {"-n 10", "flag -n needs an output directory \\(-o\\)"},
        {"-y 1", "flag -y 1 needs the output directory \\(-o\\)"},
        {"-r auto", "flag -r auto: only the CUDA trainer chooses by itself"},
        {"-b auto", "flag -b auto: only the CUDA trainer chooses by itself"},
        {"-r 4", "flag -r"},
    });
}

TEST(CliTrainer, RefusesFlagsThatDoNotFitModelOrData) {
    TinyRun run = make_tiny_run("cli_tiny");
    // the unchanged command line trains
    test::CommandResult ok = run_trainer(run.args());
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    std::string missing_train = run.dir + "/nothing_train_*.bin", missing_val = run.dir + "/nothing_val_*.bin";
    expect_refused_all("cli_bad_fit", {
        // -t above the model's maxT (d6: 1024; the tiny model: 16)
        {"-e d6 -t 1025", "flag -t: sequence length 1025 exceeds the model's maximum 1024"},
        {"-e d6:512 -t 513", "flag -t: sequence length 513 exceeds the model's maximum 512"},
        // a descriptor's context: a number of positions from 1 to 2^20; an unknown depth with one is unknown
        {"-e d6:0", "model descriptor 'd6:0': the context after ':' must be a number of positions from 1 to 1048576"},
        {"-e d6:4k", "model descriptor 'd6:4k': the context after ':' must be a number"},
        {"-e d6:", "model descriptor 'd6:': the context after ':' must be a number"},
        {"-e d7:512", "flag -e: unknown model descriptor 'd7:512' \\(d6, d12, d24, d36 or d48, each with an optional "
                      "context: d6:4096\\)"},
        {run.args() + " -t 17", "flag -t: sequence length 17 exceeds the model's maximum 16"},
        // -d not a multiple of B*T = 16
        {run.args() + " -d 24", "flag -d: total batch 24 tokens is not a multiple of B\\*T\\*\\(data-parallel replicas\\)"},
        // -d so large that the accumulation steps do not fit the step's count (2^31 and 2^32 micro-batches
        // of 16 tokens): refused, not run with a negative count or a division by zero
        {run.args() + " -d 34359738368", "flag -d: total batch 34359738368 tokens is 2147483648 micro-batches"},
        {run.args() + " -d 68719476736", "flag -d: total batch 68719476736 tokens is 4294967296 micro-batches"},
        // a data glob that matches nothing: the message names the pattern
        {run.args() + " -i '" + missing_train + "'", "no file matches '.*nothing_train_\\*\\.bin'"},
        {run.args() + " -j '" + missing_val + "'", "no file matches '.*nothing_val_\\*\\.bin'"},
        // more val batches than the val set holds (6 of B=2 x T=8)
        {run.args() + " -m 7", "flag -m: 7 val batches but the val data .* holds only 6 of B=2 x T=8"},
    });
}

// A descriptor with a context longer than GPT-2's (issue 50, item 3): d6 with 2048 positions trains a step
// at T = 2048 (GPT-2's d6 refuses it, above), from a loss near ln V (GPT-2's initialization: the logits
// start near 0), and its checkpoint has 2048 rows of wpe (maxT in the header).
TEST(CliTrainer, DescriptorWithALongerContextTrainsAtThatLength) {
    std::string dir = test::oracle("tiny_reliability", "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 "
                                                       "--seed 1 -b 2 -t 16 --data-tokens 4096");
    std::string out = test::scratch_dir("cli_long_context");
    test::CommandResult r = run_trainer("-e d6:2048 -i " + dir + "/train.bin -b 1 -t 2048 -x 1 -v 0 -s 0 -n 1 -o " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("maxT=2048"), std::string::npos) << r.output;
    std::vector<double> loss = test::jsonl_values(out + "/metrics.jsonl", "train_loss");
    ASSERT_EQ(loss.size(), 1u);
    EXPECT_NEAR(loss[0], std::log(50257.0), 0.1);
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(checkpoint_model_path(out, 1), &cfg, &params);
    EXPECT_EQ(cfg.max_seq_len, 2048);
    EXPECT_EQ(params.size(), num_parameters(cfg));
}

// ----------------------------------------------------------------------------
// no silent wrong runs: non-finite steps, non-finite checkpoints, one run per output directory

// Overwrites the float at `index` (counting from the first after the 1 KiB header) of a file and
// reseals its checksums, as a writer with a bug would have written it.
void poke_float(const std::string& path, size_t index, float value) {
    FILE* fp = fopenCheck(path.c_str(), "r+b");
    ASSERT_EQ(fseek(fp, HEADER_BYTES + (long)(index * sizeof(float)), SEEK_SET), 0);
    fwriteCheck(&value, sizeof(float), 1, fp);
    fcloseCheck(fp);
    test::reseal_checksums(path);
}

// -ni 2 makes process 0's gradients of step 2 non-finite (an infinite loss weight, as from one bad
// micro-batch). Step 2 must be skipped: the checkpoint after it (step 3) holds exactly the weights
// and AdamW moments of the one before (step 2), the logs say so, and training goes on.
TEST(NonFiniteSteps, SkippedStepLeavesWeightsAndMomentsUntouched) {
    TinyRun run = make_tiny_run("nonfinite_skip");
    std::string out = test::scratch_dir("nonfinite_skip_out");
    test::CommandResult r = run_trainer(run.args() + " -v 0 -x 5 -n 1 -ni 2 -o " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("SKIPPED: non-finite gradient norm (1 so far)"), std::string::npos) << r.output;
    EXPECT_EQ(test::read_text(out + "/model_00000002.bin"), test::read_text(out + "/model_00000003.bin"));
    EXPECT_NE(test::read_text(out + "/model_00000003.bin"), test::read_text(out + "/model_00000004.bin"));
    TrainState before, after;
    state_file_read(out + "/state_00000002_00000.bin", &before);
    state_file_read(out + "/state_00000003_00000.bin", &after);
    EXPECT_EQ(before.m, after.m);
    EXPECT_EQ(before.v, after.v);
    EXPECT_EQ(after.skipped_total, 1);
    EXPECT_EQ(after.updates, 2);  // steps 0 and 1; step 2 was no AdamW update
    std::vector<std::string> lines = test::metrics_without_timings(out + "/metrics.jsonl");
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_NE(lines[1].find("\"skipped\": false, \"skipped_steps\": 0"), std::string::npos) << lines[1];
    EXPECT_NE(lines[2].find("\"grad_norm\": null, \"skipped\": true, \"skipped_steps\": 1"), std::string::npos) << lines[2];
    EXPECT_NE(lines[3].find("\"skipped\": false, \"skipped_steps\": 1"), std::string::npos) << lines[3];
    std::vector<double> losses = test::jsonl_values(out + "/metrics.jsonl", "train_loss");
    for (double loss : losses) EXPECT_TRUE(std::isfinite(loss) && loss > 0);
}

// -ns 3 consecutive skipped steps stop the run with a message naming the step; every checkpoint it
// wrote is finite (the weights never took a non-finite update).
TEST(NonFiniteSteps, ConsecutiveSkipsStopTheRun) {
    TinyRun run = make_tiny_run("nonfinite_stop");
    std::string out = test::scratch_dir("nonfinite_stop_out");
    test::CommandResult r = run_trainer(run.args() + " -v 0 -x 8 -n 1 -ni 1,2,3,4 -ns 3 -o " + out);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("step 3: the gradient norm was not finite .* in 3 consecutive steps \\(-ns 3\\)")))
        << r.output;
    EXPECT_EQ(checkpoint_find_latest(out), 3);
    for (int step = 1; step <= 3; step++) {
        std::string data = test::read_text(checkpoint_model_path(out, step));
        ASSERT_GT(data.size(), (size_t)HEADER_BYTES);
        const float* w = reinterpret_cast<const float*>(data.data() + HEADER_BYTES);
        size_t n = (data.size() - HEADER_BYTES) / sizeof(float);
        EXPECT_EQ(first_non_finite(w, n), n) << "step " << step;
    }
    // two skips then a clean step: the count of consecutive skips starts again
    std::string out2 = test::scratch_dir("nonfinite_stop_out2");
    test::CommandResult ok = run_trainer(run.args() + " -v 0 -x 6 -ni 1,2,4,5 -ns 3 -o " + out2);
    EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// A model or state file holding inf or NaN is refused when a run starts from it.
TEST(NonFiniteSteps, CheckpointWithNonFiniteValuesIsRefused) {
    TinyRun run = make_tiny_run("nonfinite_ckpt");
    std::string bad = run.dir + "/model_nan.bin";
    ASSERT_EQ(system(("cp '" + run.model + "' '" + bad + "'").c_str()), 0);
    poke_float(bad, 5, NAN);
    test::CommandResult r = run_trainer(run.args() + " -e '" + bad + "'");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("reading model checkpoint '.*model_nan.bin': element 5 of [0-9]+ is -?nan")))
        << r.output;

    // a checkpoint directory whose AdamW v holds inf: resume refuses it
    std::string out = test::scratch_dir("nonfinite_ckpt_out");
    ASSERT_EQ(run_trainer(run.args() + " -v 0 -x 2 -n 1 -o " + out).exit_code, 0);
    TrainState state;
    state_file_read(checkpoint_state_path(out, 2, 0), &state);
    poke_float(checkpoint_state_path(out, 2, 0), state.m.size() + 7, INFINITY);  // v[7]
    test::CommandResult resumed = run_trainer(run.args() + " -v 0 -x 3 -o " + out + " -y 1");
    EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
    EXPECT_TRUE(std::regex_search(resumed.output, std::regex("reading AdamW v of .*state_00000002_00000.bin': element 7 .* is inf")))
        << resumed.output;
}

// The decision rule by itself: skip on inf/NaN, count, and (with dynamic scaling) halve S on
// overflow and double it after W clean steps.
TEST(NonFiniteSteps, LossScalerRule) {
    LossScaler s;
    s.dynamic = true;
    s.scale = 1024.0f;
    s.growth_interval = 3;
    EXPECT_TRUE(loss_scaler_step(&s, 5.0, 0));
    EXPECT_FALSE(loss_scaler_step(&s, INFINITY, 1));
    EXPECT_EQ(s.scale, 512.0f);
    EXPECT_FALSE(loss_scaler_step(&s, NAN, 2));
    EXPECT_EQ(s.scale, 256.0f);
    EXPECT_EQ(s.skipped_total, 2);
    for (int step = 3; step < 6; step++) EXPECT_TRUE(loss_scaler_step(&s, 5.0, step));
    EXPECT_EQ(s.scale, 512.0f);  // 3 clean steps
    EXPECT_EQ(s.updates, 4);
    EXPECT_EQ(s.consecutive, 0);
    // the factor AdamW applies: 1/S, times the clipping of the unscaled norm (here 5 -> 1)
    EXPECT_FLOAT_EQ(loss_scaler_grad_scale(s, 5.0 * 512, 1.0), 1.0f / 5 / 512);
}

// ----------------------------------------------------------------------------
// checkpoint integrity (doc/reliability.md): a disk that fills up during a checkpoint, a checkpoint
// file that a disk or a copy corrupted

// The trainer under a file-size limit (test::run_with_file_limit): a disk that is full after `limit`
// bytes of any one file.
test::CommandResult run_trainer_file_limit(const std::string& args, long limit, bool signal_kills = false) {
    return test::run_with_file_limit("env OMP_NUM_THREADS=1 timeout 120 '" + test::root() + "/train_gpt2' " + args,
                                     limit, signal_kills);
}

long file_bytes(const std::string& path) { return (long)test::read_text(path).size(); }

// The tiny run's model file is 9 KiB and its state file 17 KiB. A limit of 12 KiB fails the state
// file after the model file is in place, 8 KiB the model file itself: each time the run stops with a
// message naming the file, and leaves no .tmp and nothing of the failed step; the checkpoints before
// it are untouched and -y 1 resumes from the newest once the disk has room.
TEST(CheckpointDiskFull, FailedCheckpointCleansUpAfterItself) {
    TinyRun run = make_tiny_run("disk_full");
    std::string out = test::scratch_dir("disk_full_out");
    std::string flags = run.args() + " -v 0 -n 1 -o " + out;
    ASSERT_EQ(run_trainer(flags + " -x 2").exit_code, 0);
    long model_size = file_bytes(checkpoint_model_path(out, 2)), state_size = file_bytes(checkpoint_state_path(out, 2, 0));
    ASSERT_TRUE(8 * 1024 < model_size && model_size < 12 * 1024 && 12 * 1024 < state_size) << model_size << " " << state_size;

    struct Case {
        long limit;
        const char* fails;  // the file whose write fails
    } cases[] = {{12 * 1024, "state_00000003_00000\\.bin"}, {8 * 1024, "model_00000003\\.bin"}};
    for (const Case& c : cases) {
        SCOPED_TRACE(c.limit);
        test::CommandResult r = run_trainer_file_limit(flags + " -x 4 -y 1", c.limit);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_TRUE(std::regex_search(r.output, std::regex(std::string("Error: could not write '.*") + c.fails +
                                                           "\\.tmp'.*File too large")))
            << r.output;
        EXPECT_EQ(test::dir_names_ending(out, ".tmp"), "");
        for (const std::string& name : test::dir_names(out)) {
            EXPECT_EQ(name.find("00000003"), std::string::npos) << "left behind: " << name;
        }
        EXPECT_EQ(checkpoint_find_latest(out), 2);
        EXPECT_EQ(file_bytes(checkpoint_model_path(out, 2)), model_size);
        EXPECT_EQ(file_bytes(checkpoint_state_path(out, 2, 0)), state_size);
    }
    test::CommandResult resumed = run_trainer(flags + " -x 4 -y 1");
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(checkpoint_find_latest(out), 4);
}

// Issue 51, item 1.7: a disk that filled while the run logged went unnoticed: the run finished with exit
// 0, metrics.jsonl cut mid-line and main.log short. Now a failed log write stops the run (as a failed
// checkpoint does), naming the file and the error; the lines written before are whole (a resume's
// truncation drops a cut last line). Here any file may hold 4 KiB: metrics.jsonl, ~300 bytes a step,
// overflows after about a dozen steps of 60.
TEST(CheckpointDiskFull, ADiskThatFillsWhileLoggingStopsTheRun) {
    TinyRun run = make_tiny_run("disk_full_log");
    std::string out = test::scratch_dir("disk_full_log_out");
    test::CommandResult r = run_trainer_file_limit(run.args() + " -v 0 -n 0 -x 60 -o " + out, 4096);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("Error: could not write the run's log '.*(metrics\\.jsonl|main\\.log)'"
                                                        ".*File too large"))) << r.output;
    EXPECT_EQ(r.output.find("step   59/60"), std::string::npos) << "the run must stop";
}

// A run that dies while writing a checkpoint (here SIGXFSZ, as a crash or a kill) cannot clean up: it
// leaves the failed step's model file without its DONE marker and the state file's .tmp. The next
// -y 1 removes those and every other incomplete checkpoint file (here also planted ones of steps 7 and
// 9), says so, and resumes from the newest complete checkpoint; other files are not touched.
TEST(CheckpointDiskFull, ResumeRemovesWhatACrashLeft) {
    TinyRun run = make_tiny_run("disk_crash");
    std::string out = test::scratch_dir("disk_crash_out");
    std::string flags = run.args() + " -v 0 -n 1 -o " + out;
    ASSERT_EQ(run_trainer(flags + " -x 2").exit_code, 0);
    test::CommandResult killed = run_trainer_file_limit(flags + " -x 4 -y 1", 12 * 1024, true);
    EXPECT_NE(killed.exit_code, 0) << killed.output;
    ASSERT_TRUE(file_exists(checkpoint_model_path(out, 3))) << "the crash left no orphan model file";
    ASSERT_TRUE(file_exists(checkpoint_state_path(out, 3, 0) + ".tmp")) << "the crash left no .tmp";
    for (const char* name : {"model_00000007.bin", "state_00000007_00000.bin", "state_00000009_00001.bin.tmp",
                             "DONE_00000009.tmp", "notes.txt", "model_final.bin"}) {
        write_text(out + "/" + name, "x");
    }
    test::CommandResult resumed = run_trainer(flags + " -x 4 -y 1");
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(std::regex_search(resumed.output, std::regex(
        "resume: removed 6 incomplete checkpoint files .*: DONE_00000009\\.tmp model_00000003\\.bin "
        "model_00000007\\.bin state_00000003_00000\\.bin\\.tmp state_00000007_00000\\.bin state_00000009_00001\\.bin\\.tmp")))
        << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(test::dir_names_ending(out, ".tmp"), "");
    for (const char* name : {"model_00000007.bin", "state_00000007_00000.bin"}) EXPECT_FALSE(file_exists(out + "/" + name));
    for (const char* name : {"notes.txt", "model_final.bin", "DONE_00000004", "model_00000003.bin"}) {
        EXPECT_TRUE(file_exists(out + "/" + name)) << name;
    }
}

// A flipped bit in a checkpoint (the lowest mantissa byte of one number, a change that no range check
// could see) stops the resume with the file and the bytes named; so does a state that cannot be valid
// (a negative AdamW second moment) even when its checksums are right.
TEST(CheckpointCorrupt, ResumeRefusesAFlippedBitOrAnInvalidState) {
    TinyRun run = make_tiny_run("corrupt");
    std::string out = test::scratch_dir("corrupt_out");
    std::string flags = run.args() + " -v 0 -n 1 -o " + out;
    ASSERT_EQ(run_trainer(flags + " -x 2").exit_code, 0);
    std::string model = checkpoint_model_path(out, 2), state = checkpoint_state_path(out, 2, 0);
    std::string model_bytes = test::read_text(model), state_bytes = test::read_text(state);
    auto restore = [&] {
        write_text(model, model_bytes);
        write_text(state, state_bytes);
    };
    struct Case {
        std::string path;
        long offset;
        std::string pattern;
    } cases[] = {
        {model, HEADER_BYTES + 4 * 1000, "model checkpoint '.*model_00000002\\.bin' is corrupt: bytes \\[1024, " +
                                             std::to_string(model_bytes.size()) + "\\) \\(block 1 of 1\\)"},
        {state, HEADER_BYTES + 4 * 3000, "optimizer state file '.*state_00000002_00000\\.bin' is corrupt: bytes \\[1024, " +
                                             std::to_string(state_bytes.size()) + "\\) \\(block 1 of 1\\)"},
    };
    for (const Case& c : cases) {
        restore();
        test::flip_byte(c.path, c.offset);
        test::CommandResult r = run_trainer(flags + " -x 3 -y 1");
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_TRUE(std::regex_search(r.output, std::regex(c.pattern))) << r.output;
    }
    restore();
    TrainState saved;
    state_file_read(state, &saved);
    poke_float(state, saved.m.size() + 5, -1e-4f);  // v[5]
    test::CommandResult negative = run_trainer(flags + " -x 3 -y 1");
    EXPECT_EQ(negative.exit_code, 1) << negative.output;
    EXPECT_TRUE(std::regex_search(negative.output, std::regex(
        "reading AdamW v of .*state_00000002_00000\\.bin': element 5 of [0-9]+ is -0\\.0001; a second moment cannot be negative")))
        << negative.output;
    restore();
    EXPECT_EQ(run_trainer(flags + " -x 3 -y 1").exit_code, 0);
}

// A second run on the same -o refuses while the first holds the lock; once the holder is gone the
// directory is free again.
TEST(OutputLock, SecondRunOnSameDirectoryIsRefused) {
    TinyRun run = make_tiny_run("lock_tiny");
    std::string out = test::scratch_dir("lock_out");
    int fd = output_dir_lock(out);  // this test process stands for the first run
    test::CommandResult second = run_trainer(run.args() + " -o " + out);
    EXPECT_EQ(second.exit_code, 1) << second.output;
    EXPECT_TRUE(std::regex_search(second.output, std::regex("output directory '.*lock_out' is in use by another run")))
        << second.output;
    EXPECT_FALSE(file_exists(out + "/metrics.jsonl")) << "the refused run wrote into the directory";
    close(fd);
    test::CommandResult after = run_trainer(run.args() + " -o " + out);
    EXPECT_EQ(after.exit_code, 0) << after.output;
}

// A run killed with SIGKILL leaves no lock behind (flock dies with its process): it resumes.
TEST(OutputLock, KilledRunResumes) {
    TinyRun run = make_tiny_run("lock_kill");
    std::string out = test::scratch_dir("lock_kill_out");
    std::string script = "cd '" + test::root() + "' && { OMP_NUM_THREADS=1 ./train_gpt2 " + run.args() +
                         " -v 0 -a 1 -x 1000000 -n 1 -o " + out + " > /dev/null 2>&1 & pid=$!; "
                         "for i in $(seq 600); do [ -e '" + out + "/DONE_00000003' ] && break; sleep 0.1; done; "
                         "kill -9 $pid; wait $pid; echo killed; }";
    test::CommandResult killed = test::run_command(script);
    ASSERT_NE(killed.output.find("killed"), std::string::npos) << killed.output;
    int64_t latest = checkpoint_find_latest(out);
    ASSERT_GE(latest, 3);
    test::CommandResult resumed = run_trainer(run.args() + " -v 0 -a 1 -x " + std::to_string(latest + 2) + " -o " + out + " -y 1");
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step " + std::to_string(latest)), std::string::npos) << resumed.output;
}

// A binary built without MPI (this test binary is) started by mpirun or srun as one of several
// processes stops with a message saying how to rebuild, instead of training alone N times.
// Sets var=value and starts a process group as train_gpt2's main does, then exits 0.
void start_with_launcher_env(const char* var, const char* value) {
    setenv(var, value, 1);
    int argc = 1;
    char name[] = "train_gpt2";
    char* args[] = {name, nullptr};
    char** argv = args;
    process_group_init(&argc, &argv);
    exit(0);
}

TEST(LaunchCheck, NonMpiBuildRefusesParallelLaunch) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
        SCOPED_TRACE(var);
        EXPECT_EXIT(start_with_launcher_env(var, "3"), testing::ExitedWithCode(1),
                    "one of 3 processes by mpirun/srun, but this binary was built without MPI.*make train_gpt2");
    }
    // one process under a launcher is fine
    EXPECT_EXIT(start_with_launcher_env("OMPI_COMM_WORLD_SIZE", "1"), testing::ExitedWithCode(0), "");
}

// The Makefile rebuilds when its configuration changes: with Open MPI installed after a first build
// (mpicxx appears on PATH), with NO_MPI=1 again, with another PRECISION; and not otherwise. Checked
// with `make -q` (is the target up to date?) in a copy of the build files, with a stand-in mpicxx.
TEST(BuildConfig, MakefileNoticesConfigurationChanges) {
    std::string dir = test::scratch_dir("build_config");
    std::string r = test::root();
    std::string setup = "cd '" + dir + "' && mkdir -p dev fakebin && cp -r '" + r + "/Makefile' '" + r + "/train_gpt2.cpp' '" +
                        r + "/train_gpt2.cu' '" + r + "/llmc' '" + r + "/scripts' . && cp -r '" + r + "/dev/emu' dev/ && " +
                        "printf '#!/bin/sh\\ncase $1 in --showme:compile) echo -I/x/include;; --showme:link) echo -L/x/lib -lmpi;; esac\\n' "
                        "> fakebin/mpicxx && chmod +x fakebin/mpicxx";
    ASSERT_EQ(test::run_command(setup).exit_code, 0);
    // make -q: exit 0 when up to date, 1 when the target would be rebuilt
    auto make_q = [&](const std::string& vars, const std::string& target) {
        return test::run_command("cd '" + dir + "' && " + vars + " make -q PYTHON=python3 " + target).exit_code;
    };
    std::string no_mpi = "NO_MPI=1", with_mpi = "PATH='" + dir + "/fakebin':$PATH";
    // "build" without MPI: write the stamps, then a binary newer than them
    ASSERT_EQ(test::run_command("cd '" + dir + "' && make -n NO_MPI=1 PYTHON=python3 train_gpt2 train_gpt2cu > /dev/null && "
                                "sleep 1 && touch train_gpt2 train_gpt2cu").exit_code, 0);
    EXPECT_EQ(make_q(no_mpi, "train_gpt2"), 0) << "same configuration: nothing to rebuild";
    EXPECT_EQ(make_q(with_mpi, "train_gpt2"), 1) << "mpicxx appeared: train_gpt2 must be rebuilt";
    EXPECT_EQ(make_q(no_mpi, "train_gpt2"), 1) << "back to no MPI: rebuilt again";
    // every make run rewrites the stamps of all targets whose configuration changed, train_gpt2cu's
    // too (its NCCL launcher uses MPI): "rebuild" both
    ASSERT_EQ(test::run_command("cd '" + dir + "' && sleep 1 && touch train_gpt2 train_gpt2cu").exit_code, 0);
    EXPECT_EQ(make_q(no_mpi, "train_gpt2"), 0);
    EXPECT_EQ(make_q(no_mpi, "train_gpt2cu"), 0);
    EXPECT_EQ(make_q(no_mpi + " PRECISION=FP32", "train_gpt2cu"), 1) << "another precision";
    ASSERT_EQ(test::run_command("cd '" + dir + "' && sleep 1 && touch train_gpt2cu").exit_code, 0);
    EXPECT_EQ(make_q(with_mpi + " PRECISION=FP32", "train_gpt2cu"), 1) << "MPI (hence NCCL's launcher) for the CUDA trainer";
}

// ----------------------------------------------------------------------------
// parse_args in-process

TEST(CliParse, DefaultsWithoutFlags) {
    TrainArgs a = parse({});
    TrainArgs defaults;
    EXPECT_EQ(a.B, defaults.B);
    EXPECT_EQ(a.T, defaults.T);
    EXPECT_EQ(a.model, "d12");
    EXPECT_EQ(a.schedule, "cosine");
    EXPECT_EQ(a.total_batch_tokens, -1);
    EXPECT_EQ(a.resume, 0);
    EXPECT_EQ(a.shuffle, 1);
}

TEST(CliParse, SetsEveryField) {
    TrainArgs a = parse({"-i", "tr_*.bin", "-j", "va_*.bin", "-e", "d6", "-o", "out", "-b", "8", "-t", "128",
                         "-d", "8192", "-x", "100", "-l", "6e-4", "-u", "10", "-q", "0.1", "-k", "wsd", "-c",
                         "0.1", "-v", "5", "-m", "3", "-s", "0", "-g", "32", "-n", "50", "-y", "1", "-a", "1",
                         "-sh", "0", "-sd", "7", "-tk", "tok.bin"});
    EXPECT_EQ(a.train_pattern, "tr_*.bin");
    EXPECT_EQ(a.val_pattern, "va_*.bin");
    EXPECT_EQ(a.model, "d6");
    EXPECT_EQ(a.output_dir, "out");
    EXPECT_EQ(a.B, 8);
    EXPECT_EQ(a.T, 128);
    EXPECT_EQ(a.total_batch_tokens, 8192);
    EXPECT_EQ(a.max_steps, 100);
    EXPECT_FLOAT_EQ(a.learning_rate, 6e-4f);
    EXPECT_EQ(a.warmup_steps, 10);
    EXPECT_FLOAT_EQ(a.final_lr_frac, 0.1f);
    EXPECT_EQ(a.schedule, "wsd");
    EXPECT_FLOAT_EQ(a.weight_decay, 0.1f);
    EXPECT_EQ(a.val_every, 5);
    EXPECT_EQ(a.val_batches, 3);
    EXPECT_EQ(a.sample_every, 0);
    EXPECT_EQ(a.gen_tokens, 32);
    EXPECT_EQ(a.checkpoint_every, 50);
    EXPECT_EQ(a.resume, 1);
    EXPECT_EQ(a.overfit_single_batch, 1);
    EXPECT_EQ(a.shuffle, 0);
    EXPECT_EQ(a.seed, 7);
    EXPECT_EQ(a.tokenizer_path, "tok.bin");
}

TEST(CliParse, RangeEdgesAndRepeats) {
    TrainArgs a = parse({"-d", "-1", "-x", "-1", "-l", "0", "-q", "1", "-b", "1", "-b", "3", "-k", "linear"});
    EXPECT_EQ(a.total_batch_tokens, -1);
    EXPECT_EQ(a.max_steps, -1);
    EXPECT_EQ(a.learning_rate, 0.0f);
    EXPECT_EQ(a.final_lr_frac, 1.0f);
    EXPECT_EQ(a.B, 3);  // the last of a repeated flag wins
    EXPECT_EQ(a.schedule, "linear");
    TrainArgs big = parse({"-d", "1000000000000"});  // a long, beyond int
    EXPECT_EQ(big.total_batch_tokens, 1000000000000L);
    // the CUDA trainer's own flags parse only there
    TrainArgs cuda = parse({"-r", "2", "-w", "0"}, true);
    EXPECT_EQ(cuda.recompute, 2);
    EXPECT_EQ(cuda.master_weights, 0);
    // both trainers have ZeRO stages 0 to 3; -z 3 refuses HellaSwag (each process would run its own
    // number of forwards, and a -z 3 forward is collective)
    EXPECT_EQ(parse({"-z", "3"}).zero_stage, 3);
    EXPECT_EQ(parse({"-z", "3"}, true).zero_stage, 3);
    EXPECT_EQ(parse({"-z", "1"}, true).zero_stage, 1);
    for (bool cuda : {false, true}) {
        EXPECT_EXIT(parse({"-z", "3", "-he", "5", "-hs", "hellaswag_val.jsonl"}, cuda), testing::ExitedWithCode(1),
                    "HellaSwag with -z 3 is not supported");
    }
    EXPECT_EXIT(parse({"-z", "4"}), testing::ExitedWithCode(1), "flag -z: 4 is outside the allowed range 0 \\.\\. 3");
    EXPECT_EXIT(parse({"-w", "1"}), testing::ExitedWithCode(1), "flag -w is the CUDA trainer's");
    // recomputation and the MFU peak are both trainers' flags
    TrainArgs cpu = parse({"-r", "3", "-pk", "226.5"});
    EXPECT_EQ(cpu.recompute, 3);
    EXPECT_EQ(cpu.peak_gflops, 226.5f);
    EXPECT_EXIT(parse({"-r", "4"}), testing::ExitedWithCode(1), "flag -r: 4 is outside the allowed range");
    EXPECT_EXIT(parse({"-pk", "-1"}), testing::ExitedWithCode(1), "flag -pk: -1 is outside the allowed range");
}

TEST(CliParse, BatchArgsAgainstModel) {
    GPT2Config cfg{16, 64, 128, 1, 2, 8};
    TrainArgs a = parse({"-b", "2", "-t", "8", "-d", "64"});
    EXPECT_EQ(validate_batch_args(a, cfg, 1), 4);  // 64 / (2*8)
    EXPECT_EQ(validate_batch_args(a, cfg, 2), 2);  // 64 / (2*8*2)
    EXPECT_EXIT(validate_batch_args(a, cfg, 3), testing::ExitedWithCode(1),
                "flag -d: total batch 64 tokens is not a multiple of B\\*T\\*\\(data-parallel replicas\\) = 2\\*8\\*3 = 48");
    // 2^31 accumulation steps: more than a step counts (issue: it ran with -2147483648 of them)
    TrainArgs huge = parse({"-b", "2", "-t", "8", "-d", "34359738368"});
    EXPECT_EXIT(validate_batch_args(huge, cfg, 1), testing::ExitedWithCode(1),
                "flag -d: total batch 34359738368 tokens is 2147483648 micro-batches of B\\*T\\*\\(data-parallel replicas\\) = 16 "
                "tokens, more than the 2147483647 accumulation steps a step can take");
    TrainArgs one = parse({"-b", "2", "-t", "16"});
    EXPECT_EQ(validate_batch_args(one, cfg, 4), 1);  // -d -1: one micro-batch per step
    TrainArgs long_t = parse({"-t", "17"});
    EXPECT_EXIT(validate_batch_args(long_t, cfg, 1), testing::ExitedWithCode(1),
                "flag -t: sequence length 17 exceeds the model's maximum 16");
}

// ----------------------------------------------------------------------------
// learning-rate schedules

TEST(CliSchedule, MatchesFormulas) {
    // tolerance: lr_at_step computes in double and returns float, so it is within one float rounding
    // (relative 6e-8) of the double formula; 1e-6 relative leaves room and still catches any formula error
    const char* types[] = {"cosine", "linear", "constant", "wsd"};
    struct Case { double lr; int W, max_steps; double frac; };
    const Case cases[] = {{6e-4, 10, 110, 0.1}, {1.0, 0, 50, 0.0}, {3e-4, 7, 23, 0.5}, {1e-3, 100, 100000, 0.0}};
    for (const char* type : types) {
        for (const Case& c : cases) {
            LRScheduler s = make_scheduler(type, c.lr, c.W, c.max_steps, c.frac);
            for (int step : {0, 1, c.W / 2, c.W - 1, c.W, c.W + 1, c.max_steps / 2, (int)(0.8 * c.max_steps) - 1,
                             (int)(0.8 * c.max_steps), (int)(0.8 * c.max_steps) + 1, c.max_steps - 2, c.max_steps - 1}) {
                if (step < 0) continue;
                double want = lr_formula(type, c.lr, c.W, c.max_steps, c.frac, step);
                EXPECT_NEAR(lr_at_step(s, step), want, 1e-6 * c.lr) << type << " step " << step << " W " << c.W;
            }
        }
    }
}

TEST(CliSchedule, HandComputedValues) {
    // lr 1, warmup 10, 110 steps, floor 0.1: r = (s - 10) / 100; wsd decays from D = 88 over 22 steps
    const double tol = 1e-6;  // float rounding of values near 1
    LRScheduler cosine = make_scheduler("cosine", 1.0, 10, 110, 0.1);
    EXPECT_NEAR(lr_at_step(cosine, 0), 0.1, tol);    // warmup: (0 + 1) / 10
    EXPECT_NEAR(lr_at_step(cosine, 4), 0.5, tol);
    EXPECT_NEAR(lr_at_step(cosine, 9), 1.0, tol);    // warmup ends at the full rate
    EXPECT_NEAR(lr_at_step(cosine, 10), 1.0, tol);   // r = 0
    EXPECT_NEAR(lr_at_step(cosine, 60), 0.55, tol);  // r = 0.5: halfway between 1 and 0.1
    EXPECT_NEAR(lr_at_step(cosine, 109), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.99)), tol);
    LRScheduler linear = make_scheduler("linear", 1.0, 10, 110, 0.1);
    EXPECT_NEAR(lr_at_step(linear, 35), 1.0 - 0.9 * 0.25, tol);
    EXPECT_NEAR(lr_at_step(linear, 109), 1.0 - 0.9 * 0.99, tol);
    LRScheduler constant = make_scheduler("constant", 1.0, 10, 110, 0.1);
    EXPECT_NEAR(lr_at_step(constant, 4), 0.5, tol);  // warmup applies to every schedule
    EXPECT_NEAR(lr_at_step(constant, 109), 1.0, tol);
    LRScheduler wsd = make_scheduler("wsd", 1.0, 10, 110, 0.1);
    EXPECT_NEAR(lr_at_step(wsd, 4), 0.5, tol);
    EXPECT_NEAR(lr_at_step(wsd, 87), 1.0, tol);  // stable
    EXPECT_NEAR(lr_at_step(wsd, 88), 1.0, tol);  // decay starts at sqrt(0)
    EXPECT_NEAR(lr_at_step(wsd, 99), 0.1 + 0.9 * (1 - std::sqrt(0.5)), tol);
    // warmup longer than 80% of the run: the decay starts after the warmup
    LRScheduler wsd_long = make_scheduler("wsd", 1.0, 90, 100, 0.0);
    EXPECT_NEAR(lr_at_step(wsd_long, 89), 1.0, tol);
    EXPECT_NEAR(lr_at_step(wsd_long, 90), 1.0, tol);
    EXPECT_NEAR(lr_at_step(wsd_long, 95), 1 - std::sqrt(0.5), tol);

    LRSchedule unused;
    EXPECT_FALSE(parse_lr_schedule("Cosine", &unused));
    EXPECT_FALSE(parse_lr_schedule("", &unused));
}

TEST(CliSchedule, FinalFracOneWithoutWarmupIsConstant) {
    for (const char* type : {"cosine", "linear", "constant", "wsd"}) {
        LRScheduler s = make_scheduler(type, 3e-4, 0, 37, 1.0);
        int off = 0;
        for (int step = 0; step < 37; step++) off += lr_at_step(s, step) != 3e-4f;  // exactly the rate
        EXPECT_EQ(off, 0) << type;
    }
}

// ----------------------------------------------------------------------------
// logs on resume

TEST(CliLogger, TruncateKeepsStepsBelow) {
    std::string dir = test::scratch_dir("cli_logger_truncate");
    std::string main_log = "s:0 trl:5.5 lr:0.1 norm:1\ns:0 tel:5.6\ns:1 trl:5.4 lr:0.1 norm:1\n"
                           "s:2 trl:5.3 lr:0.1 norm:1\ns:2 tel:5.2\ns:10 trl:5.0 lr:0.1 norm:1\n";
    std::string metrics = "{\"step\": 0, \"train_loss\": 5.5}\n{\"step\": 0, \"val_loss\": 5.6}\n"
                          "{\"step\": 1, \"train_loss\": 5.4}\n{\"step\": 2, \"train_loss\": 5.3}\n"
                          "{\"step\": 10, \"train_loss\": 5.0}\n";
    write_text(dir + "/main.log", main_log);
    write_text(dir + "/metrics.jsonl", metrics);
    log_truncate_from_step(dir + "/main.log", 2);
    log_truncate_from_step(dir + "/metrics.jsonl", 2);
    EXPECT_EQ(test::read_text(dir + "/main.log"), "s:0 trl:5.5 lr:0.1 norm:1\ns:0 tel:5.6\ns:1 trl:5.4 lr:0.1 norm:1\n");
    EXPECT_EQ(test::read_text(dir + "/metrics.jsonl"),
              "{\"step\": 0, \"train_loss\": 5.5}\n{\"step\": 0, \"val_loss\": 5.6}\n{\"step\": 1, \"train_loss\": 5.4}\n");
    // step 10 is not step 1 (no prefix matching)
    write_text(dir + "/main.log", main_log);
    log_truncate_from_step(dir + "/main.log", 10);
    EXPECT_EQ(test::read_text(dir + "/main.log"), main_log.substr(0, main_log.find("s:10")));
    // from step 0 nothing is kept; a missing file stays missing
    log_truncate_from_step(dir + "/main.log", 0);
    EXPECT_EQ(test::read_text(dir + "/main.log"), "");
    log_truncate_from_step(dir + "/absent.log", 3);
    EXPECT_FALSE(file_exists(dir + "/absent.log"));
}

TEST(CliLogger, TruncateHandlesLongLinesAndNoFinalNewline) {
    std::string dir = test::scratch_dir("cli_logger_newline");
    // a line longer than the reader's 4096-byte buffer is one line
    std::string long_line = "{\"step\": 1, \"note\": \"" + std::string(10000, 'x') + "\"}\n";
    write_text(dir + "/metrics.jsonl", "{\"step\": 0}\n" + long_line + "{\"step\": 3}\n");
    log_truncate_from_step(dir + "/metrics.jsonl", 2);
    EXPECT_EQ(test::read_text(dir + "/metrics.jsonl"), "{\"step\": 0}\n" + long_line);

    // no newline after the last line: a kept last line stays, and what is appended next starts its own line
    for (const char* name : {"main.log", "metrics.jsonl"}) {
        bool json = std::string(name) == "metrics.jsonl";
        std::string l0 = json ? "{\"step\": 0, \"train_loss\": 5.5}" : "s:0 trl:5.5 lr:0.1 norm:1";
        std::string l1 = json ? "{\"step\": 1, \"train_loss\": 5.4}" : "s:1 trl:5.4 lr:0.1 norm:1";
        std::string l5 = json ? "{\"step\": 5, \"train_loss\": 5.0}" : "s:5 trl:5.0 lr:0.1 norm:1";
        std::string path = dir + "/" + name;
        write_text(path, l0 + "\n" + l1);  // last line kept
        log_truncate_from_step(path, 2);
        EXPECT_EQ(test::read_text(path), l0 + "\n" + l1 + "\n") << name;
        write_text(path, l0 + "\n" + l5);  // last line dropped
        log_truncate_from_step(path, 2);
        EXPECT_EQ(test::read_text(path), l0 + "\n") << name;
        write_text(path, l1);              // a single line, no newline
        log_truncate_from_step(path, 2);
        EXPECT_EQ(test::read_text(path), l1 + "\n") << name;
    }
}

TEST(CliLogger, ResumedRunAppendsAfterItsCheckpoint) {
    std::string dir = test::scratch_dir("cli_logger_resume");
    Logger logger;
    logger_open(&logger, dir, -1);
    for (int step = 0; step < 5; step++) logger_log_train(&logger, step, 5.0f - step, 0.1f, 1.0f, 10.0, 100.0);
    logger_log_val(&logger, 4, 3.5f);
    logger_close(&logger);
    logger_open(&logger, dir, 3);  // resumed from the checkpoint at step 3: steps 3 and 4 are redone
    logger_log_train(&logger, 3, 7.0f, 0.1f, 1.0f, 10.0, 100.0);
    logger_close(&logger);
    EXPECT_EQ(test::read_text(dir + "/main.log"),
              "s:0 trl:5 lr:0.1 norm:1\ns:1 trl:4 lr:0.1 norm:1\ns:2 trl:3 lr:0.1 norm:1\ns:3 trl:7 lr:0.1 norm:1\n");
    EXPECT_EQ(test::jsonl_values(dir + "/metrics.jsonl", "train_loss"), (std::vector<double>{5, 4, 3, 7}));
    EXPECT_TRUE(test::jsonl_values(dir + "/metrics.jsonl", "val_loss").empty());
    // a fresh run (no resume) starts the logs empty
    logger_open(&logger, dir, -1);
    logger_close(&logger);
    EXPECT_EQ(test::read_text(dir + "/main.log"), "");
}
