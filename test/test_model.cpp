// The whole CPU model and trainer against the PyTorch oracle (test/oracle/gpt2_oracle.py), which
// computes in float64 from the same fp32 initial parameters:
//  - logits, loss and all 16 parameter gradients of one batch;
//  - 10 AdamW steps through the real train_gpt2 binary: per-step loss, learning rate, gradient norm,
//    and the final parameters, for a tiny config and a GPT-2 small (d12) shaped one;
//  - a run resumed from a checkpoint continues bit for bit like the uninterrupted run.
#define TESTING
#include "../train_gpt2.cpp"
#include "test_helpers.h"

namespace {

// The tiny config has a vocabulary (300) that is not a multiple of 128, so the padded columns of the
// LM head are exercised; 2 accumulation steps, warmup, decay and weight decay are all on.
const char* TINY_MODEL = "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 --seed 1";
const char* TINY_DATA = "-b 2 -t 16 --data-tokens 4096";

struct RunFlags {
    int steps, accum, warmup;
    double lr, final_frac, weight_decay;
    const char* schedule;
};

std::string oracle_run_args(const RunFlags& f) {
    char buf[256];
    snprintf(buf, sizeof(buf), "--steps %d --accum %d --warmup %d --lr %g --final-frac %g --weight-decay %g --schedule %s",
             f.steps, f.accum, f.warmup, f.lr, f.final_frac, f.weight_decay, f.schedule);
    return buf;
}

std::string trainer_run_args(const RunFlags& f, int B, int T) {
    char buf[256];
    snprintf(buf, sizeof(buf), "-b %d -t %d -d %d -x %d -u %d -l %g -q %g -c %g -k %s", B, T, B * T * f.accum,
             f.steps, f.warmup, f.lr, f.final_frac, f.weight_decay, f.schedule);
    return buf;
}

// One forward and backward of the oracle's batch, compared tensor by tensor.
// Tolerances, relative to each tensor's largest element (test::max_rel_error): our fp32 results
// against the float64 oracle differ only by fp32 rounding (6e-8 per operation), grown by sums over
// up to 4C or Vp terms and by L layers of backward. Measured: logits <= 1e-6 and gradients
// <= 1.5e-6 at both sizes (tiny and d12). We allow 1e-5 on both (a 6x margin), and 1e-5 relative on
// the loss (the bar for fp32): a wrong formula, tensor layout or missed accumulation is off by 1e-2
// or more.
void check_against_oracle_state(const std::string& dir) {
    GPT2 model;
    gpt2_load_checkpoint(&model, dir + "/model.bin");
    const GPT2Config& cfg = model.config;
    test::DebugState state = test::read_debug_state(dir + "/state.bin", cfg.vocab_size, model.num_parameters);
    int B = state.B, T = state.T, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;

    float loss = gpt2_forward(&model, state.inputs.data(), state.targets.data(), B, T);
    std::vector<float> logits((size_t)B * T * V);
    for (int i = 0; i < B * T; i++) {
        std::copy(model.acts.logits + (size_t)i * Vp, model.acts.logits + (size_t)i * Vp + V, logits.begin() + (size_t)i * V);
    }
    double logits_err = test::max_rel_error(logits.data(), state.logits.data(), logits.size());
    EXPECT_LE(logits_err, 1e-5) << "logits";
    EXPECT_NEAR(loss, state.loss, 1e-5 * state.loss) << "loss";

    gpt2_zero_grad(&model);
    gpt2_backward(&model, state.inputs.data(), state.targets.data(), B, T, 1.0f / (B * T));
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t off = model.param_offsets[i], n = model.param_sizes[i];
        double err = test::max_rel_error(model.grads_memory.data() + off, state.grads.data() + off, n);
        EXPECT_LE(err, 1e-5) << "gradient of " << param_tensor_name(i);
        printf("  grad %-9s max rel error %.2e\n", param_tensor_name(i), err);
    }
    printf("  logits max rel error %.2e, loss %.8f vs oracle %.8f\n", logits_err, loss, state.loss);
}

// Trains with the real binary on the oracle's data and compares every step and the final weights.
// Per-step losses: 1e-5 relative, as for one forward (updates made from slightly different gradients
// move the weights by far less than that). Learning rates: computed in double by both, compared at
// float precision. Gradient norms: 1e-5 relative like the gradients.
// Final parameters: AdamW divides each gradient element by its own running RMS, so an element whose
// true gradient is ~0 moves by its rounding noise scaled up to a fraction of lr. The key biases are
// such elements: adding a constant to every score of a softmax row changes nothing, so their exact
// gradient is 0; the float64 oracle moves them by ~1e-16, we by up to ~lr * 1e-9 / (1e-9 + eps) per
// step. So we bound each element's difference by 1% of the largest distance AdamW can move it,
// sum over steps of lr (measured: at most ~1e-3 of it). A wrong update rule, bias correction, or
// weight decay applied to the wrong tensors moves elements by a large part of that budget.
void check_training_run(const std::string& oracle_dir, const std::string& name, const RunFlags& flags, int B, int T) {
    std::string out = test::scratch_dir(name);
    std::string cmd = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                      "/train.bin -sh 0 -v 0 -s 0 -n " + std::to_string(flags.steps) + " -o " + out + " " +
                      trainer_run_args(flags, B, T);
    test::CommandResult r = test::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;

    std::string run_json = test::read_text(oracle_dir + "/run.json");
    std::vector<double> want_loss = test::json_array(run_json, "losses"), want_lr = test::json_array(run_json, "lrs"),
                        want_norm = test::json_array(run_json, "grad_norms");
    std::vector<double> loss = test::jsonl_values(out + "/metrics.jsonl", "train_loss"),
                        lr = test::jsonl_values(out + "/metrics.jsonl", "lr"),
                        norm = test::jsonl_values(out + "/metrics.jsonl", "grad_norm");
    ASSERT_EQ(want_loss.size(), (size_t)flags.steps);
    ASSERT_EQ(loss.size(), want_loss.size());
    ASSERT_EQ(lr.size(), want_lr.size());
    ASSERT_EQ(norm.size(), want_norm.size());
    for (int s = 0; s < flags.steps; s++) {
        EXPECT_NEAR(loss[s], want_loss[s], 1e-5 * want_loss[s]) << "loss at step " << s;
        EXPECT_NEAR(lr[s], want_lr[s], 1e-6 * want_lr[s] + 1e-12) << "lr at step " << s;
        EXPECT_NEAR(norm[s], want_norm[s], 1e-5 * want_norm[s]) << "grad norm at step " << s;
    }
    EXPECT_LT(loss.back(), loss.front()) << "training did not lower the loss";

    GPT2Config cfg_ours, cfg_oracle;
    std::vector<float> ours, oracle;
    model_file_read(checkpoint_model_path(out, flags.steps), &cfg_ours, &ours);
    model_file_read(oracle_dir + "/final.bin", &cfg_oracle, &oracle);
    ASSERT_EQ(ours.size(), oracle.size());
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg_ours, sizes);
    param_tensor_offsets(cfg_ours, offsets);
    double lr_budget = 0;
    for (double l : want_lr) lr_budget += l;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        double worst = 0;
        for (size_t j = offsets[i]; j < offsets[i] + sizes[i]; j++) worst = std::max(worst, (double)std::fabs(ours[j] - oracle[j]));
        EXPECT_LE(worst, 0.01 * lr_budget) << "final " << param_tensor_name(i);
    }
}

TEST(ModelOracle, TinyForwardBackward) {
    std::string dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    check_against_oracle_state(dir);
}

TEST(ModelOracle, Gpt2SmallShapeForwardBackward) {
    std::string dir = test::oracle("d12", "--model d12 --seed 2 -b 2 -t 16 --data-tokens 8192 " +
                                              oracle_run_args({10, 1, 2, 3e-4, 0.1, 0.1, "cosine"}));
    check_against_oracle_state(dir);
}

TEST(TrainOracle, Tiny10StepsCosineWithAccumulation) {
    RunFlags flags = {10, 2, 2, 1e-3, 0.1, 0.1, "cosine"};
    std::string dir = test::oracle("tiny_cosine", std::string(TINY_MODEL) + " " + TINY_DATA + " " + oracle_run_args(flags));
    check_training_run(dir, "tiny_cosine", flags, 2, 16);
}

TEST(TrainOracle, TinyEachSchedule) {
    for (const char* schedule : {"linear", "constant", "wsd"}) {
        RunFlags flags = {10, 1, 3, 2e-3, 0.05, 0.0, schedule};
        std::string name = std::string("tiny_") + schedule;
        std::string dir = test::oracle(name, std::string(TINY_MODEL) + " " + TINY_DATA + " " + oracle_run_args(flags));
        SCOPED_TRACE(schedule);
        check_training_run(dir, name, flags, 2, 16);
    }
}

TEST(TrainOracle, Gpt2Small10Steps) {
    RunFlags flags = {10, 1, 2, 3e-4, 0.1, 0.1, "cosine"};
    std::string dir = test::oracle("d12", "--model d12 --seed 2 -b 2 -t 16 --data-tokens 8192 " + oracle_run_args(flags));
    check_training_run(dir, "d12_train", flags, 2, 16);
}

// Sample texts printed by a run, in order.
std::vector<std::string> samples_in(const std::string& output) {
    std::vector<std::string> samples;
    size_t at = 0;
    while ((at = output.find("--- sample ---\n", at)) != std::string::npos) {
        size_t end = output.find("\n--------------", at);
        samples.push_back(output.substr(at, end - at));
        at = end;
    }
    return samples;
}

// Resume: run A goes 12 steps uninterrupted, checkpointing every 4. Run B is the same command killed
// after its step-8 checkpoint (we simulate the kill by deleting everything it wrote after that and
// leaving a half-written later checkpoint without its DONE marker), then resumed with -y 1. Shuffled
// multi-shard data, accumulation, validation and sampling are all on, so the data position, the
// optimizer moments and the sampler state must all be restored. Expected: identical metrics
// (timings aside), identical samples from step 8 on, and bit-identical final weights.
TEST(TrainResume, ResumedRunEqualsUninterruptedRun) {
    std::string oracle_dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    std::string data = test::scratch_dir("resume_data");
    std::string train = test::make_three_shards(oracle_dir, data);
    std::string common = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i '" + train + "' -j '" + data +
                         "/shard_val_*.bin' -b 2 -t 16 -d 64 -x 12 -l 1e-3 -u 2 -q 0.1 -c 0.1 -sh 1 -v 4 -m 2 -s 4 -g 8 -n 4";
    std::string dir_a = test::scratch_dir("resume_a"), dir_b = test::scratch_dir("resume_b");
    test::CommandResult a = test::run_command(common + " -o " + dir_a);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    test::CommandResult b = test::run_command(common + " -o " + dir_b);
    ASSERT_EQ(b.exit_code, 0) << b.output;

    // "kill" run B after step 8's checkpoint
    for (const char* f : {"/model_00000012.bin", "/state_00000012_00000.bin", "/DONE_00000012"}) {
        ASSERT_EQ(remove((dir_b + f).c_str()), 0) << f;
    }
    { std::ofstream partial(dir_b + "/model_00000012.bin.tmp"); partial << "half"; }
    ASSERT_EQ(checkpoint_find_latest(dir_b), 8);
    test::CommandResult resumed = test::run_command(common + " -o " + dir_b + " -y 1");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 8"), std::string::npos) << resumed.output;

    EXPECT_EQ(test::metrics_without_timings(dir_a + "/metrics.jsonl"), test::metrics_without_timings(dir_b + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(dir_a + "/main.log"), test::read_text(dir_b + "/main.log"));
    EXPECT_EQ(test::read_text(dir_a + "/model_00000012.bin"), test::read_text(dir_b + "/model_00000012.bin"));
    EXPECT_EQ(test::read_text(dir_a + "/state_00000012_00000.bin"), test::read_text(dir_b + "/state_00000012_00000.bin"));
    std::vector<std::string> samples_a = samples_in(a.output), samples_b = samples_in(resumed.output);
    ASSERT_EQ(samples_a.size(), 3u);  // steps 4, 8, 12
    ASSERT_EQ(samples_b.size(), 2u);  // steps 8, 12
    EXPECT_EQ(samples_a[1], samples_b[0]);
    EXPECT_EQ(samples_a[2], samples_b[1]);
}

// A fresh run with the same seed and data is bit-identical; another seed initializes differently.
TEST(TrainDeterminism, SameSeedSameRunOtherSeedOtherInit) {
    std::string oracle_dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    std::string base = test::root() + "/train_gpt2 -e d6 -i " + oracle_dir + "/train.bin -b 1 -t 8 -x 2 -v 0 -s 0 -n 2";
    (void)base;  // d6 has V = 50257 but the tiny shard's ids are < 300, so it is valid data for it
    std::string d1 = test::scratch_dir("det1"), d2 = test::scratch_dir("det2"), d3 = test::scratch_dir("det3");
    ASSERT_EQ(test::run_command(base + " -sd 5 -o " + d1).exit_code, 0);
    ASSERT_EQ(test::run_command(base + " -sd 5 -o " + d2).exit_code, 0);
    ASSERT_EQ(test::run_command(base + " -sd 6 -o " + d3).exit_code, 0);
    EXPECT_EQ(test::metrics_without_timings(d1 + "/metrics.jsonl"), test::metrics_without_timings(d2 + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(d1 + "/model_00000002.bin"), test::read_text(d2 + "/model_00000002.bin"));
    EXPECT_NE(test::read_text(d1 + "/model_00000002.bin"), test::read_text(d3 + "/model_00000002.bin"));
}

// Recomputation (-r) changes what is stored, never a value: the recomputed tensors come from the same
// functions on the same inputs. So every level gives the same bits as -r 0: metrics (timings aside),
// final weights and optimizer state, over a run with accumulation, warmup and weight decay.
TEST(Recompute, EveryLevelTrainsBitIdenticalToNone) {
    std::string oracle_dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    std::string common = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                         "/train.bin -sh 0 -v 0 -s 0 -b 2 -t 16 -d 64 -x 4 -l 1e-3 -u 1 -c 0.1 -n 4";
    std::string dirs[4];
    for (int r = 0; r <= 3; r++) {
        dirs[r] = test::scratch_dir("recompute_r" + std::to_string(r));
        test::CommandResult run = test::run_command(common + " -r " + std::to_string(r) + " -o " + dirs[r]);
        ASSERT_EQ(run.exit_code, 0) << run.output;
        // start-up names the level and the memory of every level
        EXPECT_NE(run.output.find("at recompute -r " + std::to_string(r) + " (-r 0/1/2/3:"), std::string::npos)
            << run.output;
    }
    std::vector<std::string> want = test::metrics_without_timings(dirs[0] + "/metrics.jsonl");
    ASSERT_EQ(want.size(), 4u);
    for (int r = 1; r <= 3; r++) {
        SCOPED_TRACE("-r " + std::to_string(r));
        EXPECT_EQ(test::metrics_without_timings(dirs[r] + "/metrics.jsonl"), want);
        for (const char* f : {"/model_00000004.bin", "/state_00000004_00000.bin"}) {
            EXPECT_EQ(test::read_text(dirs[r] + f), test::read_text(dirs[0] + f)) << f;
        }
    }
}

// Two copies of the tiny oracle model, for comparing two ways of running one step.
static void load_tiny_twice(GPT2* a, GPT2* b) {
    std::string oracle_dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    gpt2_load_checkpoint(a, oracle_dir + "/model.bin");
    gpt2_load_checkpoint(b, oracle_dir + "/model.bin");
}

// A fixed batch of n input and target ids spread over the vocabulary.
static void synthetic_batch(const GPT2Config& cfg, size_t n, std::vector<int>* inputs, std::vector<int>* targets) {
    inputs->resize(n);
    targets->resize(n);
    for (size_t i = 0; i < n; i++) (*inputs)[i] = (int)(i * 37 % cfg.vocab_size), (*targets)[i] = (int)(i * 11 % cfg.vocab_size);
}

// In process: each level keeps less (-r 3 about one block plus the L block inputs), and one forward
// and backward at -r 3 gives the same loss and gradients, bit for bit, as at -r 0. A smaller batch
// than allocated is used, so the per-layer views are laid out for the call's B*T, not the allocation's.
TEST(Recompute, FullRecomputeGradientsAndMemory) {
    GPT2 none, full;
    load_tiny_twice(&none, &full);
    const GPT2Config& cfg = none.config;
    int B = 2, T = 16;
    size_t floats[4];
    for (int r = 0; r <= 3; r++) floats[r] = layout_activations(nullptr, nullptr, cfg, B, T, r);
    EXPECT_GT(floats[0], floats[1]);
    EXPECT_GT(floats[1], floats[2]);
    EXPECT_GT(floats[2], floats[3]);
    // -r 3 drops L - 1 layers of every block tensor but residual3: 17C + 4 floats per position, plus
    // B*NH*T*T for the attention weights
    size_t L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, BT = (size_t)B * T;
    EXPECT_EQ(floats[0] - floats[3], (L - 1) * (BT * (17 * C + 4) + B * NH * T * T));

    full.recompute = 3;
    gpt2_allocate_activations(&none, B, T);
    gpt2_allocate_activations(&full, B, T);
    std::vector<int> inputs, targets;
    synthetic_batch(cfg, BT, &inputs, &targets);
    int b = 1;  // one row of the two allocated
    float loss_none = gpt2_forward(&none, inputs.data(), targets.data(), b, T);
    float loss_full = gpt2_forward(&full, inputs.data(), targets.data(), b, T);
    EXPECT_EQ(loss_none, loss_full);
    gpt2_zero_grad(&none);
    gpt2_zero_grad(&full);
    gpt2_backward(&none, inputs.data(), targets.data(), b, T, 1.0f / (b * T));
    gpt2_backward(&full, inputs.data(), targets.data(), b, T, 1.0f / (b * T));
    EXPECT_TRUE(none.grads_memory == full.grads_memory) << "-r 3 gradients differ from -r 0";
    double sum_sq = sum_of_squares(full.grads_memory.data(), full.num_parameters);
    EXPECT_GT(sum_sq, 0.0) << "the gradients are all zero: the comparison would prove nothing";
}

// gpt2_zero_grad clears only the gradients the backward adds into; the first backward after it sets the
// weights' and biases' (llmc/matmul.h's overwrite). Against gradients cleared in full and accumulated
// into: the same bits after the first micro-step and after a second one, although every gradient
// started as NaN (so an element the first backward failed to set would show).
TEST(ModelGradients, FirstBackwardSetsWhatZeroGradLeftStale) {
    GPT2 set, added;
    load_tiny_twice(&set, &added);
    const GPT2Config& cfg = set.config;
    int B = 2, T = 16;
    size_t BT = (size_t)B * T;
    std::vector<int> inputs, targets;
    synthetic_batch(cfg, BT, &inputs, &targets);
    std::fill(set.grads_memory.begin(), set.grads_memory.end(), NAN);
    gpt2_zero_grad(&set);
    std::fill(added.grads_memory.begin(), added.grads_memory.end(), 0.0f);  // the old way: clear all, then +=
    for (int micro = 0; micro < 2; micro++) {
        SCOPED_TRACE("micro-step " + std::to_string(micro));
        for (GPT2* m : {&set, &added}) {
            gpt2_forward(m, inputs.data(), targets.data(), B, T);
            gpt2_backward(m, inputs.data(), targets.data(), B, T, 1.0f / (2 * BT));
        }
        EXPECT_EQ(0, memcmp(set.grads_memory.data(), added.grads_memory.data(), set.num_parameters * sizeof(float)));
        std::reverse(inputs.begin(), inputs.end());  // a different second micro-batch
    }
    EXPECT_GT(sum_of_squares(added.grads_memory.data(), added.num_parameters), 0.0);
}

// Issue 51, item 1.8: one process's "comm" was the global norm's time (the sum of squares over every
// gradient): nothing was communicated. The norm is its own phase now ("gradnorm", ms_gradnorm), and
// comm times only collectives: a process alone moves no byte and reads about 0 there (a sum over a
// group of one and the clock reads: 0.005 ms), while its norm over d6's 30M gradients takes
// milliseconds. The time bound holds for the quickest of the 3 steps: on a loaded 2-core machine one
// step's clock reads can be preempted (0.056 ms seen once), which says nothing about what the phase holds.
TEST(StepBreakdown, OneProcessCommunicatesNothing) {
    std::string oracle_dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    std::string dir = test::scratch_dir("breakdown_one");
    test::CommandResult run = test::run_command("OMP_NUM_THREADS=2 " + test::root() + "/train_gpt2 -e d6 -i " + oracle_dir +
                                                "/train.bin -sh 0 -v 0 -s 0 -b 1 -t 16 -x 3 -o " + dir);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::vector<double> comm = test::jsonl_values(dir + "/metrics.jsonl", "ms_comm");
    std::vector<double> norm = test::jsonl_values(dir + "/metrics.jsonl", "ms_gradnorm");
    std::vector<double> bytes = test::jsonl_values(dir + "/metrics.jsonl", "comm_bytes");
    ASSERT_EQ(comm.size(), 3u);
    ASSERT_EQ(norm.size(), 3u) << "metrics.jsonl has no ms_gradnorm";
    ASSERT_EQ(bytes.size(), 3u);
    for (int s = 0; s < 3; s++) {
        EXPECT_EQ(bytes[s], 0.0) << "step " << s;
        EXPECT_GT(norm[s], 0.1) << "step " << s;
    }
    EXPECT_LT(*std::min_element(comm.begin(), comm.end()), 0.05);
}

// The step line and metrics.jsonl carry the time of each phase, FLOP/s and MFU. With a given peak
// (-pk), MFU must be FLOP/s / peak (both are printed with 9 significant digits: 1e-6 relative
// allows for that rounding); the phases inside the step (all but the checkpoint, written before it)
// cannot add up to more than the step's time (1% for the rounding to 3 decimals and the clock reads
// between phases); FLOP/s must be the model's FLOPs per step (flops_per_token x tokens) / the step time.
TEST(StepBreakdown, PhasesFlopsAndMfu) {
    std::string oracle_dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    std::string dir = test::scratch_dir("breakdown");
    std::string cmd = test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir +
                      "/train.bin -sh 0 -v 0 -s 0 -b 2 -t 16 -d 64 -x 3 -n 1 -pk 50 -o " + dir;
    test::CommandResult run = test::run_command(cmd);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("peak: 50.0 GFLOP/s fp32 (-pk)"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(" tok/s | MFU "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(" GFLOP/s | data "), std::string::npos) << run.output;
    std::string path = dir + "/metrics.jsonl";
    std::vector<double> ms = test::jsonl_values(path, "ms"), flops = test::jsonl_values(path, "flops_per_s"),
                        mfu = test::jsonl_values(path, "mfu"), checkpoint = test::jsonl_values(path, "ms_checkpoint");
    ASSERT_EQ(ms.size(), 3u);
    ASSERT_EQ(flops.size(), 3u);
    ASSERT_EQ(mfu.size(), 3u);
    ASSERT_EQ(checkpoint.size(), 3u);
    GPT2Config cfg;
    std::vector<float> unused;
    model_file_read(oracle_dir + "/model.bin", &cfg, &unused);
    double flops_per_step = flops_per_token(cfg, 16) * 64;
    for (size_t s = 0; s < ms.size(); s++) {
        double inside = 0;
        for (const char* phase : {"ms_data", "ms_forward", "ms_backward", "ms_comm", "ms_gradnorm", "ms_optimizer"}) {
            double t = test::jsonl_values(path, phase)[s];
            EXPECT_GE(t, 0.0) << phase;
            inside += t;
        }
        EXPECT_GT(test::jsonl_values(path, "ms_forward")[s], 0.0);
        EXPECT_GT(test::jsonl_values(path, "ms_backward")[s], 0.0);
        EXPECT_LE(inside, ms[s] * 1.01 + 0.01) << "step " << s;
        EXPECT_NEAR(flops[s], flops_per_step / (ms[s] / 1000.0), 1e-3 * flops[s]) << "step " << s;
        EXPECT_NEAR(mfu[s], flops[s] / 50e9, 1e-6 * mfu[s]) << "step " << s;
    }
    // -n 1: checkpoints before steps 1 and 2 are timed on those steps' lines; step 0 has none
    EXPECT_EQ(checkpoint[0], 0.0);
    EXPECT_GT(checkpoint[1], 0.0);
    EXPECT_GT(checkpoint[2], 0.0);
}

// The random initialization has the statistics the model description asks for.
TEST(ModelInit, Gpt2InitializationStatistics) {
    GPT2Config cfg;
    ASSERT_TRUE(config_from_descriptor("d6", &cfg));
    GPT2 model;
    gpt2_init_from(&model, cfg, gpt2_random_parameters(cfg, 123));
    EXPECT_EQ(model.num_parameters, num_parameters(cfg));
    auto stats = [&](int i, size_t count, double* mean, double* std) {
        const float* t = model.params_memory.data() + model.param_offsets[i];
        double s = 0, s2 = 0;
        for (size_t j = 0; j < count; j++) {
            s += t[j];
            s2 += (double)t[j] * t[j];
        }
        *mean = s / count;
        *std = std::sqrt(s2 / count - *mean * *mean);
    };
    double mean, std;
    // with n >= 10^5 draws the sample std is within ~0.5% of the true one (relative error ~ 1/sqrt(2n))
    stats(P_WTE, (size_t)cfg.vocab_size * cfg.channels, &mean, &std);
    EXPECT_NEAR(std, 0.02, 0.02 * 0.02);
    EXPECT_NEAR(mean, 0.0, 1e-3 * 0.02 * 10);
    stats(P_FCPROJW, model.param_sizes[P_FCPROJW], &mean, &std);
    EXPECT_NEAR(std, 0.02 / std::sqrt(2.0 * cfg.num_layers), 0.02 * 0.02);
    stats(P_QKVW, model.param_sizes[P_QKVW], &mean, &std);
    EXPECT_NEAR(std, 0.02, 0.02 * 0.02);
    const float* wte = model.params_memory.data() + model.param_offsets[P_WTE];
    for (size_t j = (size_t)cfg.vocab_size * cfg.channels; j < model.param_sizes[P_WTE]; j++) ASSERT_EQ(wte[j], 0.0f);
    for (size_t j = 0; j < model.param_sizes[P_LN1W]; j++) ASSERT_EQ(model.params.ln1w[j], 1.0f);
    for (size_t j = 0; j < model.param_sizes[P_QKVB]; j++) ASSERT_EQ(model.params.qkvb[j], 0.0f);
}

// A bf16 checkpoint (version 5) loads as the bf16-rounded fp32 weights.
TEST(ModelCheckpoint, Bf16CheckpointLoadsUpcast) {
    std::string dir = test::oracle("tiny", std::string(TINY_MODEL) + " " + TINY_DATA);
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(dir + "/model.bin", &cfg, &params);
    std::string out = test::scratch_dir("bf16") + "/model_bf16.bin";
    model_file_write(out, cfg, params.data(), MODEL_VERSION_BF16);
    GPT2 model;
    gpt2_load_checkpoint(&model, out);
    for (size_t i = 0; i < params.size(); i++) {
        ASSERT_EQ(model.params_memory[i], bf16_to_float(float_to_bf16(params[i]))) << i;
        // bf16 keeps 8 significant bits: rounding to nearest is off by at most half a unit in the last
        // place, 2^-8 of the value's power of two, so at most 2^-8 relative
        ASSERT_LE(std::fabs(model.params_memory[i] - params[i]), std::fabs(params[i]) * (1.0 / 256)) << i;
    }
}

}  // namespace
