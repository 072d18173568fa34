// The CUDA trainer's test suite (make test-gpu): every kernel against its CPU reference op
// (test_kernels.cuh), then the whole model and the train_gpt2cu binary against the same PyTorch
// oracle files as the CPU suite (test/test_model.cpp), and the trainer's own promises: -r 0/1/2 give
// the same bits (with -ge 0 and with -ge 1), -w 0, -ge 1 and -fa 0 (the cuBLAS attention instead of
// flash) stay close, two runs are bit-identical, a resumed run equals an
// uninterrupted one, and checkpoints move between the CPU and the CUDA trainers. Data parallelism
// over NCCL (one process, and two or more GPUs where there are): test_multi_gpu.cuh.
//
// Without a GPU every test is skipped with a message and the program exits 0.
// `test_gpt2cu --has-gpu` exits 0 when a GPU is visible (for scripts).
// `test_gpt2cu --prepare-oracle` only makes the oracle files (needs /usr/bin/python3 with torch, no GPU),
// so a GPU machine without torch can run the suite on files made elsewhere (build/oracle/).
#define TESTING
#include "../../train_gpt2.cu"
#include "test_kernels.cuh"
#include "../optimizer_oracle.h"

#include <fstream>
#include <regex>
#include <sstream>

// The trainer binary under test, in the repository root (the Makefile names the one of this precision).
#ifndef GPT2_TRAINER
#if defined(ENABLE_FP32)
#define GPT2_TRAINER "train_gpt2fp32cu"
#else
#define GPT2_TRAINER "train_gpt2cu"
#endif
#endif

namespace gpu_test {

const char* TRAINER = GPT2_TRAINER;

#if defined(ENABLE_FP32)
// close to the CPU suite's bars (test/test_model.cpp): the GPU sums in fp32 where the CPU sometimes
// uses double (layernorm statistics), so twice the CPU's allowance on the multi-step quantities
constexpr double TOL_LOGITS = 1e-5;           // relative to the largest logit
constexpr double TOL_LOSS_REL = 1e-5;
constexpr double TOL_GRAD_MATRIX = 1e-4;
constexpr double TOL_GRAD_VECTOR = 1e-4;
constexpr double TOL_STEP_LOSS_REL = 2e-5, TOL_STEP_LOSS_ABS = 0.0;
constexpr double TOL_STEP_NORM_REL = 2e-4;
#else
// bf16 keeps 8 significant bits: every stored weight and activation is off by up to 2^-9 = 0.2%
// relative. Logits come out of L layers of such roundings plus the LM head's sum over C terms: about
// 1% of the largest logit, allowed 5e-2. The loss averages B·T positions, so its error shrinks to a
// few thousandths; allowed 0.04 absolute ("a few hundredths"). Gradients:
//  - matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw): sums over B·T rows of products of two bf16
//    values, each factor carrying the rounding of the whole backward chain before it: ~1-2%, allowed 5e-2;
//  - vectors (biases, layernorm gains and shifts): column sums over B·T rows whose terms largely
//    cancel, so the rounding of the terms is large against the sum: allowed 1e-1.
// Per-step losses over 10 steps: the same 0.04 absolute; gradient norms 5e-2 relative.
constexpr double TOL_LOGITS = 5e-2;
constexpr double TOL_LOSS_ABS = 0.04;
constexpr double TOL_GRAD_MATRIX = 5e-2;
constexpr double TOL_GRAD_VECTOR = 1e-1;
constexpr double TOL_STEP_LOSS_REL = 0.0, TOL_STEP_LOSS_ABS = 0.04;
constexpr double TOL_STEP_NORM_REL = 5e-2;
#endif

double loss_tolerance(double reference) {
#if defined(ENABLE_FP32)
    return TOL_LOSS_REL * std::fabs(reference);
#else
    return TOL_LOSS_ABS;
#endif
}

double step_loss_tolerance(double reference) { return TOL_STEP_LOSS_REL * std::fabs(reference) + TOL_STEP_LOSS_ABS; }

// the same oracle arguments as test/test_model.cpp, so `make test` and this suite share build/oracle/
const char* TINY_MODEL = "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 --seed 1";
const char* TINY_DATA = "-b 2 -t 16 --data-tokens 4096";
const char* D12_ARGS = "--model d12 --seed 2 -b 2 -t 16 --data-tokens 8192 --steps 10 --accum 1 --warmup 2 --lr 0.0003 "
                       "--final-frac 0.1 --weight-decay 0.1 --schedule cosine";
const char* TINY_COSINE_RUN = "--steps 10 --accum 2 --warmup 2 --lr 0.001 --final-frac 0.1 --weight-decay 0.1 --schedule cosine";
const char* TINY_COSINE_TRAINER = "-b 2 -t 16 -d 64 -x 10 -u 2 -l 0.001 -q 0.1 -c 0.1 -k cosine";

// True if the oracle directory NAME is there for ARGS, or PyTorch is here to make it. A GPU machine
// without PyTorch runs on files made elsewhere (make test-gpu-oracle) and copied into build/oracle/.
bool oracle_available(const std::string& name, const std::string& args) {
    std::string dir = test::root() + "/build/oracle/" + name;
    std::string stamp = args + "\n" + test::read_text(test::root() + "/test/oracle/gpt2_oracle.py");
    if (file_exists(dir + "/stamp") && test::read_text(dir + "/stamp") == stamp) return true;
    return test::run_command(test::python() + " -c 'import torch'").exit_code == 0;
}

#define REQUIRE_ORACLE(name, args)                                                                             \
    if (!oracle_available(name, args))                                                                         \
    GTEST_SKIP() << "no oracle files build/oracle/" << name << " and no PyTorch to make them: run `make "      \
                 << "test-gpu-oracle` where torch is installed and copy build/oracle/ here"

std::string tiny_args() { return std::string(TINY_MODEL) + " " + TINY_DATA; }
std::string tiny_cosine_args() { return tiny_args() + " " + TINY_COSINE_RUN; }
std::string tiny_oracle() { return test::oracle("tiny", tiny_args()); }
std::string d12_oracle() { return test::oracle("d12", D12_ARGS); }
std::string tiny_cosine_oracle() { return test::oracle("tiny_cosine", tiny_cosine_args()); }

std::string trainer() { return test::root() + "/" + TRAINER; }

// ----------------------------------------------------------------------------
// the model in-process against the oracle's one batch

// With head_chunks (-lc), the logits compared are the rows the last chunk leaves (first_row on), and a
// forward without targets of the first sequence alone leaves the logits of its last positions.
void check_against_oracle_state(const std::string& dir, int recompute, int flash_attention = 1, int head_chunks = 0) {
    TrainArgs args;
    args.recompute = recompute;
    args.flash_attention = flash_attention;
    args.head_chunks = head_chunks;
    GPT2 model;
    gpt2_build(&model, dir + "/model.bin", args);
    const GPT2Config& cfg = model.config;
    int V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    test::DebugState state = test::read_debug_state(dir + "/state.bin", V, model.num_parameters);
    int B = state.B, T = state.T;
    gpt2_allocate_activations(&model, B, T);

    // the logits of rows [first, first + rows) against the oracle's rows from want_first on
    auto logits_error = [&](size_t first, size_t rows, size_t want_first) {
        std::vector<floatX> raw(rows * Vp);
        cudaCheck(cudaMemcpy(raw.data(), model.acts.logits, raw.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        std::vector<float> logits(rows * V);
        for (size_t i = 0; i < rows; i++) {
            for (int v = 0; v < V; v++) logits[i * V + v] = host_from_floatX(raw[i * Vp + v]);
        }
        EXPECT_EQ(model.logits_first_row, first);
        return test::max_rel_error(logits.data(), state.logits.data() + want_first * V, logits.size());
    };
    size_t BT = (size_t)B * T;
    size_t rows = head_chunks > 0 ? (BT + head_chunks - 1) / head_chunks : BT;  // -lc's definition: B·T/N rounded up
    size_t last = (BT - 1) / rows * rows;                                        // the last chunk's first row
    gpt2_forward(&model, state.inputs.data(), state.targets.data(), B, T);  // dloss 0: the logits stay
    float loss = gpt2_mean_loss(&model, B, T);
    double logits_err = logits_error(last, BT - last, last);
    EXPECT_LE(logits_err, TOL_LOGITS) << "logits";
    EXPECT_NEAR(loss, state.loss, loss_tolerance(state.loss)) << "loss";
    printf("  logits max rel error %.2e, loss %.8f vs oracle %.8f\n", logits_err, loss, state.loss);
    if (head_chunks > 0 && (size_t)T > rows) {  // sampling's forward: one sequence, its last `rows` positions
        gpt2_forward(&model, state.inputs.data(), nullptr, 1, T);
        double err = logits_error(T - rows, rows, T - rows);
        EXPECT_LE(err, TOL_LOGITS) << "logits of the first sequence's last positions";
        printf("  without targets: logits of positions %zu..%d, max rel error %.2e\n", T - rows, T - 1, err);
    }

    gpt2_zero_grad(&model);
    gpt2_forward(&model, state.inputs.data(), state.targets.data(), B, T, 1.0f / (B * T));
    gpt2_backward(&model, B, T);
    std::vector<floatX> raw_grads(model.num_parameters);
    cudaCheck(cudaMemcpy(raw_grads.data(), model.grads_memory, raw_grads.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> grads(model.num_parameters);
    for (size_t i = 0; i < grads.size(); i++) grads[i] = host_from_floatX(raw_grads[i]);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t off = model.param_offsets[i], n = model.param_sizes[i];
        double err = test::max_rel_error(grads.data() + off, state.grads.data() + off, n);
        double tol = param_tensor_is_decayed(i) ? TOL_GRAD_MATRIX : TOL_GRAD_VECTOR;
        EXPECT_LE(err, tol) << "gradient of " << param_tensor_name(i);
        printf("  grad %-9s max rel error %.2e (tolerance %.0e)\n", param_tensor_name(i), err, tol);
    }
    gpt2_free(&model);
}

TEST(ModelOracle, TinyForwardBackward) {
    REQUIRE_ORACLE("tiny", tiny_args());
    check_against_oracle_state(tiny_oracle(), 1);
}

TEST(ModelOracle, TinyForwardBackwardEachRecomputeLevel) {
    REQUIRE_ORACLE("tiny", tiny_args());
    for (int r : {0, 2, 3}) {
        SCOPED_TRACE(r);
        check_against_oracle_state(tiny_oracle(), r);
    }
}

// the cuBLAS + softmax attention (-fa 0) against the same oracle (the tiny model's head size is 16)
TEST(ModelOracle, TinyForwardBackwardCublasAttention) {
    REQUIRE_ORACLE("tiny", tiny_args());
    check_against_oracle_state(tiny_oracle(), 1, 0);
}

// -lc 3: the LM head, the loss and the head's gradient in three chunks of 11, 11 and 10 rows (B·T = 32),
// d(loss)/d(lnf) left over lnf, the same oracle and bars; and -lc 4 (8 rows), whose forward of one
// sequence of 16 positions keeps the logits of positions 8..15 for the sampler.
TEST(ModelOracle, TinyForwardBackwardHeadInChunks) {
    REQUIRE_ORACLE("tiny", tiny_args());
    for (int chunks : {3, 4}) {
        SCOPED_TRACE(chunks);
        check_against_oracle_state(tiny_oracle(), 1, 1, chunks);
    }
}

TEST(ModelOracle, Gpt2SmallShapeForwardBackward) {
    REQUIRE_ORACLE("d12", D12_ARGS);
    check_against_oracle_state(d12_oracle(), 1);
}

// ----------------------------------------------------------------------------
// the train_gpt2cu binary

struct TrainerRun {
    test::CommandResult result;
    std::string dir;
};

TrainerRun run_trainer(const std::string& name, const std::string& flags, const std::string& binary = trainer()) {
    TrainerRun run;
    run.dir = test::scratch_dir(name);
    std::string cmd = binary + " " + flags + " -o " + run.dir;
    run.result = test::run_command(cmd);
    EXPECT_EQ(run.result.exit_code, 0) << cmd << "\n" << run.result.output;
    return run;
}

// the total of a -P 1 plan (its last line, `plan: total N bytes per process`); false if missing
bool read_plan_total(const std::string& output, unsigned long long* total) {
    size_t at = output.rfind("plan: total ");
    return at != std::string::npos && sscanf(output.c_str() + at, "plan: total %llu bytes per process", total) == 1;
}

std::vector<double> train_losses(const TrainerRun& run) { return test::jsonl_values(run.dir + "/metrics.jsonl", "train_loss"); }

std::string tiny_cosine_flags(const std::string& oracle_dir) {
    return "-e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -sh 0 -v 0 -s 0 " + TINY_COSINE_TRAINER;
}

TEST(TrainOracle, Tiny10StepsCosineWithAccumulation) {
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    std::string dir = tiny_cosine_oracle();
    TrainerRun run = run_trainer("gpu_tiny_cosine", tiny_cosine_flags(dir) + " -n 10");
    std::string run_json = test::read_text(dir + "/run.json");
    std::vector<double> want_loss = test::json_array(run_json, "losses"), want_norm = test::json_array(run_json, "grad_norms");
    std::vector<double> loss = train_losses(run), norm = test::jsonl_values(run.dir + "/metrics.jsonl", "grad_norm");
    ASSERT_EQ(want_loss.size(), 10u);
    ASSERT_EQ(loss.size(), want_loss.size());
    ASSERT_EQ(norm.size(), want_norm.size());
    for (size_t s = 0; s < loss.size(); s++) {
        EXPECT_NEAR(loss[s], want_loss[s], step_loss_tolerance(want_loss[s])) << "loss at step " << s;
        EXPECT_NEAR(norm[s], want_norm[s], TOL_STEP_NORM_REL * want_norm[s]) << "grad norm at step " << s;
        printf("  step %zu loss %.6f oracle %.6f | norm %.5f oracle %.5f\n", s, loss[s], want_loss[s], norm[s], want_norm[s]);
    }
    EXPECT_LT(loss.back(), loss.front()) << "training did not lower the loss";
    EXPECT_NE(run.result.output.find("tok/s | MFU"), std::string::npos) << "step lines carry tokens/s and MFU";
    EXPECT_NE(run.result.output.find("recompute -r 1 saves"), std::string::npos) << "start-up prints the memory saved";
    EXPECT_NE(run.result.output.find("; -r 0/1/2/3: "), std::string::npos) << "and the memory of every level";
    // the step breakdown (llmc/run/phase_timer.h): GPU phases timed by events, host ones by the clock; the
    // phases inside the step cannot add up to more than its time (1% for rounding and the clock reads
    // between phases), and the forward and backward take some time
    EXPECT_NE(run.result.output.find(" GFLOP/s | data "), std::string::npos) << "step lines carry the breakdown";
    std::string metrics = run.dir + "/metrics.jsonl";
    std::vector<double> ms = test::jsonl_values(metrics, "ms");
    ASSERT_EQ(ms.size(), loss.size());
    for (size_t s = 0; s < ms.size(); s++) {
        double inside = 0;
        for (const char* phase : {"ms_data", "ms_forward", "ms_backward", "ms_comm", "ms_gradnorm", "ms_optimizer"}) {
            std::vector<double> t = test::jsonl_values(metrics, phase);
            ASSERT_EQ(t.size(), ms.size()) << phase;
            EXPECT_GE(t[s], 0.0) << phase;
            inside += t[s];
        }
        EXPECT_GT(test::jsonl_values(metrics, "ms_forward")[s], 0.0);
        EXPECT_GT(test::jsonl_values(metrics, "ms_backward")[s], 0.0);
        EXPECT_LE(inside, ms[s] * 1.01 + 0.01) << "step " << s;
    }
#if defined(LLMC_FLASH_ATTENTION)
    EXPECT_NE(run.result.output.find("attention: flash (-fa 1); activations with flash"), std::string::npos)
        << "flash attention is the default, and start-up prints the memory of both paths";
#endif
}

// -opt muon against torch.optim.Muon (test/optimizer_oracle.h: the tiny model, 5 steps with
// accumulation, warm-up, a cosine and weight decay; AdamW on the other tensors), held to this suite's
// per-step bars of TrainOracle for losses and gradient norms. The fp32 build runs Newton-Schulz in fp32
// against the float64 oracle whose iteration is float64 (--muon-ns-dtype compute): all tensors within
// 1e-2 of their movement (AdamW's noise on ~0 gradients, as the CPU suite's), Muon's matrices 1e-4
// (fp32 rounding through 15 products). The bf16 build runs it in bf16 as torch's Muon does, against the
// oracle run so; its forward and backward are bf16 too, and each matrix's gradient enters its update
// with its bf16 error (up to TOL_GRAD_MATRIX, 5%, in direction: orthogonalization normalizes the size,
// not the direction) on top of the bf16 iteration's own (2-4% of the movement, test_optimizers.cpp):
// Muon's matrices within 0.15 of their movement (no orthogonalization, a transposed Gram matrix or
// another coefficient is off by O(1)). The other tensors are not checked here: stored in bf16, a
// layernorm gain near 1 has steps of 2^-8, more than these 5 steps move it. Measured under the
// emulator: fp32 losses 5e-8 and norms 1e-7 relative, matrices 3e-6 of their movement; bf16 losses
// 4e-5, norms 9e-4, matrices 0.087.
TEST(TrainOptimizers, MuonAgainstTorch) {
#if defined(ENABLE_FP32)
    const std::string name = "opt_muon", extra = " --muon-ns-dtype compute";
#else
    const std::string name = "opt_muon_bf16", extra = "";
#endif
    OptimizerRun run{"muon", 1e-3, 0.02};
    std::string oracle_args = std::string(OPTIMIZER_TINY) + run.oracle_args(1) + extra;
    REQUIRE_ORACLE(name + "_np1", oracle_args);
    std::string oracle_dir = test::oracle(name + "_np1", oracle_args);
    std::string dir = test::scratch_dir("muon_" + name);
    test::CommandResult r = test::run_command(run.trainer_args(oracle_dir, 1, TRAINER) + " -o " + dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("-opt muon: the 4 block matrices of each layer orthogonalized"), std::string::npos) << r.output;
    Agreement a = compare_with_oracle(oracle_dir, dir, run.steps);
    const double loss_bar = TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0;  // the losses are above 5
#if defined(ENABLE_FP32)
    expect_agreement(a, loss_bar, TOL_STEP_NORM_REL, 1e-2);
    EXPECT_LE(a.matrices, 1e-4) << "Muon's matrices";
#else
    EXPECT_LE(a.loss, loss_bar) << "loss";
    EXPECT_LE(a.norm, TOL_STEP_NORM_REL) << "grad norm";
    EXPECT_LE(a.matrices, 0.15) << "Muon's matrices";
#endif
}

// `run` on one process against its oracle's run (build/oracle/opt_<opt>_np1), into scratch dir `name`.
struct OracleRun {
    std::string oracle_dir, dir;
    test::CommandResult result;
};
OracleRun one_process_against_oracle(const OptimizerRun& run, const std::string& name) {
    OracleRun o;
    o.oracle_dir = test::oracle("opt_" + run.opt + "_np1", std::string(OPTIMIZER_TINY) + run.oracle_args(1));
    o.dir = test::scratch_dir(name);
    o.result = test::run_command(run.trainer_args(o.oracle_dir, 1, TRAINER) + " -o " + o.dir);
    return o;
}

// `run` with a checkpoint every 2 steps, cut after step 2 and resumed: step 4's model and state files are
// the uninterrupted run's, bit for bit.
void expect_resume_bit_for_bit(const OptimizerRun& run, const std::string& oracle_dir, const std::string& name) {
    std::string common = run.trainer_args(oracle_dir, 1, TRAINER) + " -n 2";
    std::string full = test::scratch_dir(name + "_full"), cut = test::scratch_dir(name + "_cut");
    ASSERT_EQ(test::run_command(common + " -o " + full).exit_code, 0);
    ASSERT_EQ(test::run_command(common + " -x 2 -o " + cut).exit_code, 0);
    test::CommandResult resumed = test::run_command(common + " -y 1 -o " + cut);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(test::read_text(full + "/model_00000004.bin"), test::read_text(cut + "/model_00000004.bin"));
    EXPECT_EQ(test::read_text(full + "/state_00000004_00000.bin"), test::read_text(cut + "/state_00000004_00000.bin"));
}

// The 2-D tensors' elements (wte, wpe and the block matrices) against the oracle's final values, less
// `steps` bf16 steps (2^-7 relative) of each element for the stochastic roundings of as many updates
// without master weights: the worst excess as a share of how far the oracle moved that tensor.
double matrices_beyond_rounding(const std::string& oracle_dir, const std::string& model, int steps) {
    GPT2Config cfg;
    std::vector<float> init, ours, want;
    model_file_read(oracle_dir + "/model.bin", &cfg, &init);
    model_file_read(model, &cfg, &ours);
    model_file_read(oracle_dir + "/final.bin", &cfg, &want);
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    param_tensor_offsets(cfg, offsets);
    double worst = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (!muon_param_is_matrix(i) && i != P_WTE && i != P_WPE) continue;
        double moved = 0, excess = 0;
        for (size_t j = offsets[i]; j < offsets[i] + sizes[i]; j++) moved = std::max(moved, (double)std::fabs(want[j] - init[j]));
        for (size_t j = offsets[i]; j < offsets[i] + sizes[i]; j++) {
            double rounding = steps * std::ldexp(std::max(std::fabs(ours[j]), std::fabs(want[j])), -7);
            excess = std::max(excess, (double)std::fabs(ours[j] - want[j]) - rounding);
        }
        worst = std::max(worst, excess / moved);
    }
    return worst;
}

// -opt adafactor against torch.optim.Adafactor (float64 oracle, eps1 = fp32's machine epsilon, as
// the CPU suite's OptimizerOracle.AdafactorOneProcess), 5 steps on the tiny model, with this suite's
// per-step bars for losses and gradient norms. fp32 build: the parameters within 1e-3 of their movement
// (the CPU's bar; the GPU sums its squares in fp32 where the CPU sums in double). bf16 build: the
// parameters are bf16, updated with stochastic rounding and no master weights. A step moves every
// element of a tensor by about the same amount (alpha is per tensor), which for its larger elements is
// about one bf16 step (2^-7 of the element) or less: each update then adds a random rounding error of up
// to one such step, and 5 of them add up to a few (the largest of ~10^5 elements: under 5). So the bf16
// check is per element of the factored (2-D) tensors: the difference from the oracle, less 5 bf16 steps
// of the element, within 0.1 of the tensor's movement (a missing factor, a wrong mean or a transposed
// column index moves elements, small ones included, by O(1) of it; measured: the whole difference
// reaches 0.88 of the movement on attprojw's largest elements, the excess over the allowance 0.01).
// The vectors are not checked: their second moment is per element, so an element whose true gradient
// is 0 (the key biases': softmax ignores them) but whose bf16 gradient is rounding noise takes full
// steps, as AdamW's do, where the float64 oracle's stays put.
// The resume half: a run resumed at step 2 ends with the bits of the uninterrupted one (the state file
// holds the whole factor vector and names Adafactor).
TEST(TrainOptimizers, AdafactorAgainstTorchAndResumesBitForBit) {
    OptimizerRun run{"adafactor", 1e-2, 0.0};
    REQUIRE_ORACLE("opt_adafactor_np1", std::string(OPTIMIZER_TINY) + run.oracle_args(1));
    OracleRun o = one_process_against_oracle(run, "adafactor_torch");
    ASSERT_EQ(o.result.exit_code, 0) << o.result.output;
    EXPECT_NE(o.result.output.find("optimizer: Adafactor over 28 tensors"), std::string::npos) << o.result.output;
    Agreement a = compare_with_oracle(o.oracle_dir, o.dir, run.steps);
    const double loss_bar = TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0;  // the losses are above 5
#if defined(ENABLE_FP32)
    expect_agreement(a, loss_bar, TOL_STEP_NORM_REL, 1e-3);
#else
    EXPECT_LE(a.loss, loss_bar) << "loss";
    EXPECT_LE(a.norm, TOL_STEP_NORM_REL) << "grad norm";
    double worst = matrices_beyond_rounding(o.oracle_dir, o.dir + "/model_00000005.bin", 5);
    EXPECT_LE(worst, 0.1) << "factored parameters beyond 5 bf16 steps of rounding, as a share of the movement";
    printf("  factored parameters beyond the rounding allowance: %.2e of their movement\n", worst);
#endif
    printf("  losses %.1e, norms %.1e, parameters %.1e of their movement\n", a.loss, a.norm, a.params);
    expect_resume_bit_for_bit(run, o.oracle_dir, "adafactor");
}

// -opt adamw8 against the oracle's 8-bit AdamW (gpt2_oracle.py --opt adamw8, float64; the CPU trainer's
// test, OptimizerOracle.Adamw8OneProcessAndFourAtEachZeroStage, explains its bar of 5e-2 of the movement
// for codes rounded the other way). The fp32 build is held to it. The bf16 build keeps no master weights
// (8-bit AdamW is for short memory: llmc/gpt2_plan.cuh) and its losses and norms are held to this suite's
// bars; its parameters are not compared, as AdamW's are not: an element-wise normalized step turns the
// bf16 gradient's noise on elements whose true gradient is ~0 into full steps (measured: matrices 0.5
// of their movement beyond 5 bf16 steps of rounding).
// The state file holds the codes and block maxima, at most 40% of AdamW's (its m, v and master weights:
// 12 bytes a parameter in bf16, 8 in fp32, against 2 and 8 per 256), and a run resumed from it ends with
// the uninterrupted one's bits.
TEST(TrainOptimizers, Adamw8AgainstTorchAndResumesBitForBit) {
    OptimizerRun run{"adamw8", 1e-3, 0.02};
    REQUIRE_ORACLE("opt_adamw8_np1", std::string(OPTIMIZER_TINY) + run.oracle_args(1));
    OracleRun o = one_process_against_oracle(run, "adamw8_torch");
    ASSERT_EQ(o.result.exit_code, 0) << o.result.output;
    EXPECT_NE(o.result.output.find("optimizer: 8-bit AdamW over 126720 parameters"), std::string::npos) << o.result.output;
    Agreement a = compare_with_oracle(o.oracle_dir, o.dir, run.steps);
    const double loss_bar = TOL_STEP_LOSS_REL + TOL_STEP_LOSS_ABS / 5.0;  // the losses are above 5
#if defined(ENABLE_FP32)
    expect_agreement(a, loss_bar, TOL_STEP_NORM_REL, 5e-2);
#else
    EXPECT_LE(a.loss, loss_bar) << "loss";
    EXPECT_LE(a.norm, TOL_STEP_NORM_REL) << "grad norm";
#endif
    printf("  losses %.1e, norms %.1e, parameters %.1e of their movement\n", a.loss, a.norm, a.params);
    std::string adamw = test::scratch_dir("adamw8_against_adamw");
    OptimizerRun plain{"adamw", 1e-3, 0.02};
    ASSERT_EQ(test::run_command(plain.trainer_args(o.oracle_dir, 1, TRAINER) + " -o " + adamw).exit_code, 0);
    size_t eight = test::read_text(o.dir + "/state_00000005_00000.bin").size();
    size_t fp32 = test::read_text(adamw + "/state_00000005_00000.bin").size();
    EXPECT_LE(eight, 0.4 * fp32) << eight << " bytes against AdamW's " << fp32;
    printf("  state file: %zu bytes, AdamW's %zu (%.0f%%)\n", eight, fp32, 100.0 * eight / fp32);
    expect_resume_bit_for_bit(run, o.oracle_dir, "adamw8");
}

// A Muon run resumed from its checkpoint continues bit for bit (the momentum is in the state file's m,
// beside AdamW's moments of the other tensors), and the state file names Muon: resuming it with AdamW is
// refused, naming both.
TEST(TrainOptimizers, MuonResumesBitForBitAndRefusesAnotherOptimizer) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string common = "-e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -b 2 -t 16 -d 64 -l 1e-3 -u 1 "
                         "-c 0.1 -sh 0 -v 0 -s 0 -n 2 -opt muon -ml 0.02";
    TrainerRun a = run_trainer("gpu_muon_resume_a", common + " -x 4");
    TrainerRun b = run_trainer("gpu_muon_resume_b", common + " -x 2");
    test::CommandResult resumed = test::run_command(trainer() + " " + common + " -x 4 -y 1 -o " + b.dir);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(test::read_text(a.dir + "/model_00000004.bin"), test::read_text(b.dir + "/model_00000004.bin"));
    EXPECT_EQ(test::read_text(a.dir + "/state_00000004_00000.bin"), test::read_text(b.dir + "/state_00000004_00000.bin"));
    test::CommandResult other = test::run_command(trainer() + " " + common + " -x 6 -y 1 -opt adamw -o " + a.dir);
    EXPECT_NE(other.exit_code, 0);
    EXPECT_NE(other.output.find("was written with -opt muon; this run has -opt adamw"), std::string::npos) << other.output;
}

// Flash attention (the default) and the cuBLAS + softmax path (-fa 0) compute the same function with
// different roundings (flash rounds only P to bf16; the cuBLAS path stores the scores and the
// probabilities in bf16): their 10-step runs agree within the oracle's tolerances.
TEST(TrainOptions, FlashAndCublasAttentionAgree) {
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    std::string flags = tiny_cosine_flags(tiny_cosine_oracle());
    TrainerRun flash = run_trainer("gpu_fa1", flags);
    TrainerRun cublas = run_trainer("gpu_fa0", flags + " -fa 0");
    std::vector<double> a = train_losses(flash), b = train_losses(cublas);
    std::vector<double> na = test::jsonl_values(flash.dir + "/metrics.jsonl", "grad_norm");
    std::vector<double> nb = test::jsonl_values(cublas.dir + "/metrics.jsonl", "grad_norm");
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), a.size());
    ASSERT_EQ(na.size(), nb.size());
    for (size_t s = 0; s < a.size(); s++) {
        EXPECT_NEAR(a[s], b[s], step_loss_tolerance(b[s])) << "loss at step " << s;
        EXPECT_NEAR(na[s], nb[s], TOL_STEP_NORM_REL * nb[s]) << "grad norm at step " << s;
        printf("  step %zu loss flash %.6f cuBLAS %.6f | norm %.5f %.5f\n", s, a[s], b[s], na[s], nb[s]);
    }
}

// Recomputation changes only what is stored, never a value: -r 0, 1, 2 and 3 (the whole block rerun
// from its input) give the same bits, with the GELU from our kernel (-ge 0) and from cuBLASLt's
// epilogue (-ge 1: the recompute re-runs the fused fc matmul), metrics and checkpoints alike. Without master weights (-w 0), with the GELU fused
// (-ge 1 against -ge 0) or with the bias gradients from cuBLASLt's BGRADB epilogue (-bg 1: rounded to
// floatX before they are added) the arithmetic differs, so those runs must only stay within the oracle
// tolerance of the default one.
TEST(TrainOptions, RecomputeMasterWeightsGeluFusion) {
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    std::string dir = tiny_cosine_oracle();
    std::string flags = tiny_cosine_flags(dir) + " -n 10";
    std::vector<double> base, fused;  // the -r 1 losses of -ge 0 and -ge 1
    for (int gelu_fusion : {0, 1}) {
        std::string gelu = "-ge " + std::to_string(gelu_fusion), name = "gpu_ge" + std::to_string(gelu_fusion);
        SCOPED_TRACE(gelu);
        TrainerRun r1 = run_trainer(name + "_r1", flags + " " + gelu + " -r 1");
        TrainerRun r0 = run_trainer(name + "_r0", flags + " " + gelu + " -r 0");
        TrainerRun r2 = run_trainer(name + "_r2", flags + " " + gelu + " -r 2");
        TrainerRun r3 = run_trainer(name + "_r3", flags + " " + gelu + " -r 3");
        std::vector<std::string> want = test::metrics_without_timings(r1.dir + "/metrics.jsonl");
        EXPECT_FALSE(want.empty());
        for (const TrainerRun* other : {&r0, &r2, &r3}) {
            EXPECT_EQ(test::metrics_without_timings(other->dir + "/metrics.jsonl"), want) << other->dir;
            for (const char* f : {"/model_00000010.bin", "/state_00000010_00000.bin"}) {
                EXPECT_EQ(test::read_text(other->dir + f), test::read_text(r1.dir + f)) << other->dir << f;
            }
        }
        (gelu_fusion ? fused : base) = train_losses(r1);
    }
    TrainerRun no_master = run_trainer("gpu_option_w0", flags + " -w 0");
    TrainerRun bias_epilogue = run_trainer("gpu_option_bg1", flags + " -bg 1");
    EXPECT_EQ(bias_epilogue.result.output.find("no BGRADB algorithm"), std::string::npos) << "-bg 1 fell back";
    for (const auto& [option, losses] : {std::make_pair("-w 0", train_losses(no_master)), std::make_pair("-ge 1", fused),
                                         std::make_pair("-bg 1", train_losses(bias_epilogue))}) {
        SCOPED_TRACE(option);
        ASSERT_EQ(losses.size(), base.size());
        for (size_t s = 0; s < losses.size(); s++) {
            EXPECT_NEAR(losses[s], base[s], step_loss_tolerance(base[s])) << "step " << s;
        }
    }
}

// -lc N: the LM head, the loss and the head's gradient a chunk of rows at a time (train_gpt2.cu's
// gpt2_forward). One chunk is the same products in another place: -lc 1 gives -lc 0's bits, metrics and
// checkpoints. Three chunks (11, 11, 10 rows of B·T = 32) sum wte's gradient in three matmuls rounded
// to floatX in turn, so their runs stay within the oracle's step bars (TrainOracle's). The memory plan
// (-P 1) is smaller by the logits' rows it no longer holds: (32 - 11) · Vp floatX values, each buffer on
// 256 bytes. In the bf16 build, with -fp8 2 (the head's forward and input gradient in FP8, whose chunks
// are multiples of 16 rows: 16 and 16) likewise: -lc 1 the -fp8 2 run's bits, -lc 3 within 1% of its losses
// (TrainFp8's bar).
TEST(TrainOptions, HeadInChunks) {
    REQUIRE_ORACLE("tiny_cosine", tiny_cosine_args());
    std::string dir = tiny_cosine_oracle();
    std::string flags = tiny_cosine_flags(dir) + " -n 10";
    auto same_run = [](const TrainerRun& a, const TrainerRun& b) {
        EXPECT_EQ(test::metrics_without_timings(b.dir + "/metrics.jsonl"), test::metrics_without_timings(a.dir + "/metrics.jsonl"));
        for (const char* f : {"/model_00000010.bin", "/state_00000010_00000.bin"}) {
            EXPECT_EQ(test::read_text(b.dir + f), test::read_text(a.dir + f)) << b.dir << f;
        }
    };
    TrainerRun whole = run_trainer("gpu_lc0", flags), one = run_trainer("gpu_lc1", flags + " -lc 1");
    same_run(whole, one);
    TrainerRun three = run_trainer("gpu_lc3", flags + " -lc 3");
    EXPECT_NE(three.result.output.find("LM head: 3 chunk(s) of up to 11 rows (-lc 3)"), std::string::npos) << three.result.output;
    std::string run_json = test::read_text(dir + "/run.json");
    std::vector<double> want_loss = test::json_array(run_json, "losses"), want_norm = test::json_array(run_json, "grad_norms");
    std::vector<double> loss = train_losses(three), norm = test::jsonl_values(three.dir + "/metrics.jsonl", "grad_norm");
    ASSERT_EQ(loss.size(), want_loss.size());
    ASSERT_EQ(norm.size(), want_norm.size());
    for (size_t s = 0; s < loss.size(); s++) {
        EXPECT_NEAR(loss[s], want_loss[s], step_loss_tolerance(want_loss[s])) << "loss at step " << s;
        EXPECT_NEAR(norm[s], want_norm[s], TOL_STEP_NORM_REL * want_norm[s]) << "grad norm at step " << s;
    }
    EXPECT_NE(test::read_text(three.dir + "/model_00000010.bin"), test::read_text(whole.dir + "/model_00000010.bin"))
        << "three chunks sum wte's gradient in another order";
    GPT2Config cfg;
    std::vector<float> unused;
    model_file_read(dir + "/model.bin", &cfg, &unused);
    auto on_256 = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    unsigned long long planned[2];
    for (int k = 0; k < 2; k++) {
        test::CommandResult plan = test::run_command(trainer() + " " + tiny_cosine_flags(dir) + (k ? " -lc 3" : "") + " -P 1");
        ASSERT_EQ(plan.exit_code, 0) << plan.output;
        ASSERT_TRUE(read_plan_total(plan.output, &planned[k])) << plan.output;
    }
    size_t Vp = cfg.padded_vocab_size;
    EXPECT_EQ(planned[0] - planned[1], on_256(32 * Vp * sizeof(floatX)) - on_256(11 * Vp * sizeof(floatX)));
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    TrainerRun fp8 = run_trainer("gpu_lc0_fp8", flags + " -fp8 2"), fp8_one = run_trainer("gpu_lc1_fp8", flags + " -fp8 2 -lc 1");
    same_run(fp8, fp8_one);
    TrainerRun fp8_three = run_trainer("gpu_lc3_fp8", flags + " -fp8 2 -lc 3");
    EXPECT_NE(fp8_three.result.output.find("LM head: 2 chunk(s) of up to 16 rows (-lc 3)"), std::string::npos)
        << fp8_three.result.output;
    std::vector<double> a = train_losses(fp8), b = train_losses(fp8_three);
    ASSERT_EQ(b.size(), a.size());
    for (size_t s = 0; s < a.size(); s++) EXPECT_NEAR(b[s], a[s], 0.01 * a[s]) << "-fp8 2 loss at step " << s;
#endif
}

// Device memory (EMU_DEVICE_MEMORY under the emulator, which fails a cudaMalloc past it as a GPU
// does). -r auto takes the least recomputation whose activations fit; the same memory with -r 0 forced
// is refused before anything runs, naming -r 1; a model state or a cuBLAS workspace that does not fit
// is refused with its sizes, never a crash mid-run. The memory for the middle case comes from a first
// run's own report (free MiB before the activations, and each level's activations): what the test
// checks is the choice made from those numbers and that the emulator then lets the run through.
TEST(TrainMemory, RecomputeAutoTakesTheLeastThatFitsAndWhatCannotFitIsRefused) {
#if !defined(CUDA_EMULATION)
    GTEST_SKIP() << "sets the device's memory with EMU_DEVICE_MEMORY: emulator only";
#endif
#if defined(ENABLE_FP32) || defined(ENABLE_FP16)
    GTEST_SKIP() << "the bf16 build's suite runs it: the choice is made from the plan's numbers on the host, the "
                    "same code in every precision";
#endif
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    // B=64, T=32 on the tiny model (its shard has 4096 tokens): the levels differ by half a MiB and more
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -sh 0 -v 0 -s 0 -b 64 -t 32 -x 1 -n 1";
    TrainerRun ample = run_trainer("gpu_mem_ample", flags + " -r auto");
    const std::string& out = ample.result.output;
    ASSERT_NE(out.find("-r auto chose -r 0"), std::string::npos) << out;
    double free_mib = 0, act[4] = {};
    size_t at = out.find("fit the ");
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(sscanf(out.c_str() + at, "fit the %lf MiB free", &free_mib), 1);
    at = out.find("-r 0/1/2/3:");
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(sscanf(out.c_str() + at, "-r 0/1/2/3: %lf %lf %lf %lf", &act[0], &act[1], &act[2], &act[3]), 4);
    ASSERT_GT(act[0] - act[1], 0.3) << "the levels must differ for the test to mean anything";
    // memory M where the room left for activations, free - M/32 (the headroom kept), lies halfway
    // between -r 1's and -r 0's: used = total - free before the activations, the same at any M
    double total_mib = 81920.0;  // the emulator's default 80 GiB
    double used_mib = total_mib - free_mib, target = (act[0] + act[1]) / 2;
    double memory_mib = (target + used_mib) * 32.0 / 31.0;
    std::string env = "EMU_DEVICE_MEMORY=" + std::to_string((long long)(memory_mib * 1048576.0)) + " ";
    TrainerRun tight = run_trainer("gpu_mem_tight", flags + " -r auto", env + trainer());
    EXPECT_NE(tight.result.output.find("-r auto chose -r 1"), std::string::npos) << tight.result.output;
    // every level gives the same bits: the tight run trained exactly as the ample one
    EXPECT_EQ(test::read_text(tight.dir + "/model_00000001.bin"), test::read_text(ample.dir + "/model_00000001.bin"));

    auto refused = [&](const std::string& name, const std::string& env_flags, const std::string& more) {
        std::string run_dir = test::scratch_dir(name);
        test::CommandResult r = test::run_command(env_flags + trainer() + " " + flags + more + " -o " + run_dir);
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_EQ(r.output.find("step "), std::string::npos) << "no step may run:\n" << r.output;
        return r.output;
    };
    std::string forced = refused("gpu_mem_forced", env, " -r 0");
    EXPECT_NE(forced.find("need"), std::string::npos) << forced;
    EXPECT_NE(forced.find("Ways to fit: -r 1"), std::string::npos) << forced;
    // 33 MiB: cuBLAS's 32 MiB workspace fits, the model state (1.9 MiB) and its headroom do not
    std::string state = refused("gpu_mem_state", "EMU_DEVICE_MEMORY=33M ", " -r auto");
    EXPECT_NE(state.find("the model state"), std::string::npos) << state;
    EXPECT_NE(state.find("nothing was allocated"), std::string::npos) << state;
    std::string workspace = refused("gpu_mem_workspace", "EMU_DEVICE_MEMORY=16M ", " -r auto");
    EXPECT_NE(workspace.find("cuBLAS's 32 MiB workspace"), std::string::npos) << workspace;
}

// -P 1 prints the memory plan and exits before allocating the model (no step, no data read); the
// plan's total then matches what a run of the same flags has in use once allocated (cudaMemGetInfo,
// the emulator's count of cudaMalloc bytes), within 5%, for AdamW and Muon (its scratch), -z 0.
// cudaMemGetInfo counts the whole device, other processes too, so a number from one process is never
// set against one from another: the run compares its own plan with its own use (both counting from
// what was in use at its start), and the -P 1 process's plan, less what was in use at its own start,
// must be the run's plan less what was in use at the run's start, to the MiB the plan prints. (A process
// starting or ending on the GPU while the run allocates still moves the count: run_on_gpu.sh runs this
// suite alone on the GPU, stage "memory".)
TEST(TrainMemory, PlanPredictsTheAllocationsWithoutAllocating) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    const double MiB = 1048576.0;
    for (const char* optimizer : {"adamw", "muon"}) {
        SCOPED_TRACE(optimizer);
        std::string flags = "-e " + dir + "/model.bin -b 64 -t 32 -r 1 -opt " + optimizer;
        test::CommandResult plan = test::run_command(trainer() + " " + flags + " -P 1 -i /nonexistent_*.bin");
        ASSERT_EQ(plan.exit_code, 0) << plan.output;
        EXPECT_EQ(plan.output.find("step "), std::string::npos) << plan.output;
        unsigned long long planned = 0;
        ASSERT_TRUE(read_plan_total(plan.output, &planned)) << plan.output;
        size_t row = plan.output.find("in use before the model");
        ASSERT_NE(row, std::string::npos) << plan.output;
        double before_mib = 0.0;
        ASSERT_EQ(sscanf(plan.output.c_str() + row, "in use before the model %lf MiB", &before_mib), 1) << plan.output;
        TrainerRun run = run_trainer(std::string("gpu_plan_") + optimizer,
                                     flags + " -i " + dir + "/train.bin -sh 0 -v 0 -s 0 -x 1");
        size_t at = run.result.output.find(" bytes planned (-P 1), ");
        ASSERT_NE(at, std::string::npos) << run.result.output;
        at = run.result.output.rfind("memory: ", at);
        ASSERT_NE(at, std::string::npos) << run.result.output;
        unsigned long long run_planned = 0, in_use = 0, run_before = 0;
        ASSERT_EQ(sscanf(run.result.output.c_str() + at,
                         "memory: %llu bytes planned (-P 1), %llu in use (cudaMemGetInfo): %*[^;]; %llu of each",
                         &run_planned, &in_use, &run_before),
                  3)
            << run.result.output;
        EXPECT_NEAR((double)run_planned, (double)in_use, 0.05 * (double)in_use) << run.result.output;
        // the rows after "in use before the model" are the same in both processes (the plan prints MiB
        // with one decimal: 0.05 MiB of rounding)
        EXPECT_NEAR((double)planned - before_mib * MiB, (double)run_planned - (double)run_before, 0.06 * MiB)
            << plan.output;
    }
}

// Issue 51, item 8: the start-up's "device memory: X in use of Y" read "0.0 GiB in use" for a small
// model, beside the byte count of the line after it. The figure must say what is in use, in a unit that
// shows it: a positive number, and the same bytes (to its printed precision) as that byte count.
TEST(TrainMemory, DeviceMemoryLineShowsWhatIsInUse) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    TrainerRun run = run_trainer("gpu_memory_line", "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 4 -t 32 -sh 0 -v 0 -s 0 -x 1");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(run.result.output, m, std::regex("device memory: ([0-9.]+) (MiB|GiB) in use of ([0-9.]+) (MiB|GiB)")))
        << run.result.output;
    double in_use = std::stod(m[1]) * (m[2] == "GiB" ? 1024.0 : 1.0);  // MiB
    EXPECT_GT(in_use, 0.0) << m[0];
    std::smatch bytes;
    ASSERT_TRUE(std::regex_search(run.result.output, bytes, std::regex("bytes planned \\(-P 1\\), ([0-9]+) in use"))) << run.result.output;
    double used_mib = std::stod(bytes[1]) / 1048576.0;
    EXPECT_NEAR(in_use, used_mib, 0.05 * used_mib + 0.05) << m[0];
}

// -b auto with -d: the largest micro-batch dividing -d's sequences whose activations fit, gradient
// accumulation making up the rest. The memory is set between what the plans (-P 1) of B=32 and B=64
// need, so B=64 (one micro-step) no longer fits and B=32 (two) does; the step computes the same 64
// sequences, so its loss equals the ample run's within the oracle tolerance (a different summation
// order, not a different step). And a checkpoint of the one resumes as the other (below).
TEST(TrainMemory, BatchAutoTakesTheLargestMicroBatchThatFits) {
#if !defined(CUDA_EMULATION)
    GTEST_SKIP() << "sets the device's memory with EMU_DEVICE_MEMORY: emulator only";
#endif
#if defined(ENABLE_FP32) || defined(ENABLE_FP16)
    GTEST_SKIP() << "the bf16 build's suite runs it: the choice is made from the plan's numbers on the host, the "
                    "same code in every precision (a fifth of a minute of CI time)";
#endif
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string model = "-e " + dir + "/model.bin -t 32 -r 3";
    auto planned = [&](int B) {
        test::CommandResult r = test::run_command(trainer() + " " + model + " -b " + std::to_string(B) + " -P 1");
        EXPECT_EQ(r.exit_code, 0) << r.output;
        unsigned long long total = 0;
        EXPECT_TRUE(read_plan_total(r.output, &total)) << r.output;
        return (double)total;
    };
    double need32 = planned(32), need64 = planned(64);
    ASSERT_GT(need64, need32 + 1048576.0) << "the two batches must differ for the test to mean anything";
    // the room for everything is memory - memory/32 (the headroom kept): put it halfway between
    long long memory = (long long)((need32 + need64) / 2 * 32.0 / 31.0);
    std::string flags = model + " -i " + dir + "/train.bin -sh 0 -v 0 -s 0 -b auto -d 2048 -x 1";
    TrainerRun ample = run_trainer("gpu_batch_ample", flags);
    EXPECT_NE(ample.result.output.find("-b auto chose B=64 (1 micro-step(s)"), std::string::npos) << ample.result.output;
    TrainerRun tight = run_trainer("gpu_batch_tight", flags, "EMU_DEVICE_MEMORY=" + std::to_string(memory) + " " + trainer());
    EXPECT_NE(tight.result.output.find("-b auto chose B=32 (2 micro-step(s)"), std::string::npos) << tight.result.output;
    std::vector<double> a = train_losses(ample), t = train_losses(tight);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(t.size(), 1u);
    EXPECT_NEAR(t[0], a[0], step_loss_tolerance(a[0]));
    // issue 51, items 2 and 4: a run checkpointed with B=64 resumed where only B=32 fits (-b auto on
    // another card) was refused, and would have read other data (the order was one of B*T-token units).
    // Now it continues the one stream of T-token samples (llmc/io/dataloader.h), shuffled: its steps 2
    // and 3 are the uninterrupted B=64 run's within the oracle tolerance.
    std::string elastic = model + " -i " + dir + "/train.bin -v 0 -s 0 -b auto -d 2048 -x 3 -n 1";
    TrainerRun whole = run_trainer("gpu_batch_whole", elastic);
    std::string cut = test::scratch_dir("gpu_batch_cut");
    ASSERT_EQ(test::run_command("cp -r " + whole.dir + "/. " + cut + " && rm " + cut + "/*_00000002* " + cut +
                                "/*_00000003*").exit_code, 0);
    test::CommandResult resumed = test::run_command("EMU_DEVICE_MEMORY=" + std::to_string(memory) + " " + trainer() +
                                                    " " + elastic + " -y 1 -o " + cut);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("-b auto chose B=32 (2 micro-step(s)"), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 1"), std::string::npos) << resumed.output;
    std::vector<double> w = train_losses(whole), c = test::jsonl_values(cut + "/metrics.jsonl", "train_loss");
    ASSERT_EQ(w.size(), 3u);
    ASSERT_EQ(c.size(), 3u);
    for (int k = 1; k < 3; k++) EXPECT_NEAR(c[k], w[k], step_loss_tolerance(w[k])) << "step " << k + 1;
    // without -d there is nothing to keep fixed: refused
    test::CommandResult no_d = test::run_command(trainer() + " " + model + " -b auto");
    EXPECT_NE(no_d.exit_code, 0);
    EXPECT_NE(no_d.output.find("flag -b auto needs -d"), std::string::npos) << no_d.output;
}

// -oo 1 (llmc/optimizer_offload.cuh): AdamW's state in pinned host memory, updated by the CPU with the
// GPU kernel's own element body and rounding seeds, so the run is the -oo 0 run bit for bit: the same
// metrics and the same checkpoint files (weights, m, v, master weights). A -oo 0 checkpoint resumed with
// -oo 1 ends in the same files too (the state goes to host memory). Under the emulator, a device whose
// memory lies between the two plans (-P 1 of each) refuses -oo 0 before allocating, naming -oo 1, and
// runs -oo 1 to the same bits; -oo 1 with another optimizer is refused.
TEST(TrainMemory, OptimizerOffloadTrainsTheSameBitsInLessDeviceMemory) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string model = "-e " + dir + "/model.bin -b 2 -t 16";
    std::string flags = model + " -i " + dir + "/train.bin -sh 0 -v 0 -s 0 -x 4 -n 2 -l 1e-3 -c 0.1";
    TrainerRun device = run_trainer("gpu_offload_0", flags + " -oo 0");
    TrainerRun host = run_trainer("gpu_offload_1", flags + " -oo 1");
    EXPECT_NE(host.result.output.find("offloaded (-oo 1)"), std::string::npos) << host.result.output;
    EXPECT_NE(host.result.output.find("offload: 4 AdamW updates on the host"), std::string::npos) << host.result.output;
    EXPECT_EQ(test::metrics_without_timings(device.dir + "/metrics.jsonl"), test::metrics_without_timings(host.dir + "/metrics.jsonl"));
    for (const char* f : {"/model_00000004.bin", "/state_00000004_00000.bin"}) {
        EXPECT_EQ(test::read_text(device.dir + f), test::read_text(host.dir + f)) << f;
    }
    // the -oo 0 run cut back to step 2, resumed with -oo 1
    TrainerRun resumed = run_trainer("gpu_offload_resume", flags + " -oo 0");
    for (const char* f : {"/model_00000004.bin", "/state_00000004_00000.bin", "/DONE_00000004"}) {
        ASSERT_EQ(remove((resumed.dir + f).c_str()), 0) << f;
    }
    test::CommandResult r = test::run_command(trainer() + " " + flags + " -oo 1 -y 1 -o " + resumed.dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("continuing from step 2"), std::string::npos) << r.output;
    for (const char* f : {"/model_00000004.bin", "/state_00000004_00000.bin"}) {
        EXPECT_EQ(test::read_text(device.dir + f), test::read_text(resumed.dir + f)) << f;
    }
    test::CommandResult muon = test::run_command(trainer() + " " + flags + " -opt muon -oo 1 -o " + test::scratch_dir("gpu_offload_muon"));
    EXPECT_NE(muon.exit_code, 0);
    EXPECT_NE(muon.output.find("flag -oo 1 with -opt muon"), std::string::npos) << muon.output;
#if defined(CUDA_EMULATION)
    auto planned = [&](const std::string& more) {
        test::CommandResult p = test::run_command(trainer() + " " + model + more + " -P 1");
        EXPECT_EQ(p.exit_code, 0) << p.output;
        unsigned long long total = 0;
        EXPECT_TRUE(read_plan_total(p.output, &total)) << p.output;
        return std::make_pair((double)total, p.output);
    };
    auto [need_device, plan_device] = planned(" -oo 0");
    auto [need_host, plan_host] = planned(" -oo 1");
    EXPECT_NE(plan_host.find("host: AdamW m, v"), std::string::npos) << plan_host;
    // the state moves 12 of its 16 bytes a parameter to the host (fp32 build: 8 of 12, no master weights)
    ASSERT_GT(need_device, need_host + 0.5 * 1048576.0) << "the plans must differ for the test to mean anything";
    // a memory whose room (memory - memory/32, the headroom kept) lies halfway between the two plans
    std::string env = "EMU_DEVICE_MEMORY=" + std::to_string((long long)((need_device + need_host) / 2 * 32.0 / 31.0)) + " ";
    test::CommandResult refused = test::run_command(env + trainer() + " " + flags + " -oo 0 -o " + test::scratch_dir("gpu_offload_refused"));
    EXPECT_NE(refused.exit_code, 0) << refused.output;
    EXPECT_EQ(refused.output.find("step "), std::string::npos) << "no step may run:\n" << refused.output;
    // refused for the model state (bf16) or, once it is placed, for the activations (fp32): either names -oo 1
    EXPECT_NE(refused.output.find("nothing was"), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find("-oo 1 (AdamW's state in host memory"), std::string::npos) << refused.output;
    TrainerRun fits = run_trainer("gpu_offload_fits", flags + " -oo 1", env + trainer());
    for (const char* f : {"/model_00000004.bin", "/state_00000004_00000.bin"}) {
        EXPECT_EQ(test::read_text(device.dir + f), test::read_text(fits.dir + f)) << f;
    }
#endif
}

TEST(TrainDeterminism, SameSeedSameRun) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e d6 -sd 5 -i " + dir + "/train.bin -b 2 -t 16 -x 3 -v 0 -s 0 -n 3";
    TrainerRun a = run_trainer("gpu_det1", flags), b = run_trainer("gpu_det2", flags);
    EXPECT_EQ(test::metrics_without_timings(a.dir + "/metrics.jsonl"), test::metrics_without_timings(b.dir + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(a.dir + "/model_00000003.bin"), test::read_text(b.dir + "/model_00000003.bin"));
    EXPECT_EQ(test::read_text(a.dir + "/state_00000003_00000.bin"), test::read_text(b.dir + "/state_00000003_00000.bin"));
}

// -at 1 (matmul autotuning, llmc/matmul.cuh) in a training run: every problem timed once, the report
// printed at the end; under the emulator every candidate computes the same arithmetic, so the run must be
// the -at 0 run bit for bit (on a GPU the kernels it picks may sum in another order: then only the
// report is checked).
TEST(TrainDeterminism, MatmulAutotuneRunsAndReports) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -x 2 -v 0 -s 0 -n 2";
    TrainerRun plain = run_trainer("gpu_at0", flags), tuned = run_trainer("gpu_at1", flags + " -at 1");
    ASSERT_EQ(tuned.result.exit_code, 0) << tuned.result.output;
    EXPECT_NE(tuned.result.output.find("matmul autotune (-at 1): "), std::string::npos) << tuned.result.output;
    EXPECT_EQ(plain.result.output.find("matmul autotune"), std::string::npos) << plain.result.output;
#ifdef CUDA_EMULATION
    EXPECT_EQ(test::metrics_without_timings(plain.dir + "/metrics.jsonl"), test::metrics_without_timings(tuned.dir + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(plain.dir + "/model_00000002.bin"), test::read_text(tuned.dir + "/model_00000002.bin"));
#endif
}

// -at 1 resumed takes the algorithms its checkpoint recorded (llmc/matmul_choices.cuh) instead of timing
// again: a run goes 4 steps with -at 1, checkpointing every 2; its last checkpoint is kept aside, deleted,
// and the run resumed from step 2. The new checkpoint at step 4, which records the algorithm of every
// product, must equal the uninterrupted one byte for byte, as must the model (on a GPU the candidates'
// sums can differ in the last bits; under the emulator they compute alike, and the recorded algorithms
// are what tells: EMU_LT_TIMING=shuffle makes each process time the candidates in an order of its own,
// so a resume that timed afresh would record others). A resume without -at 1 drops them, with a note.
TEST(TrainDeterminism, MatmulAutotuneResumesWithTheCheckpointsAlgorithms) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -x 4 -v 0 -s 0 -n 2";
    const std::string tuned = "EMU_LT_TIMING=shuffle " + trainer();  // the emulator's setting; a GPU ignores it
    TrainerRun run = run_trainer("gpu_at1_resume", flags + " -at 1", tuned);
    ASSERT_EQ(run.result.exit_code, 0) << run.result.output;
    std::string state = test::read_text(run.dir + "/state_00000004_00000.bin"), model = test::read_text(run.dir + "/model_00000004.bin");
    for (const char* f : {"/model_00000004.bin", "/state_00000004_00000.bin", "/DONE_00000004"}) {
        ASSERT_EQ(remove((run.dir + f).c_str()), 0) << f;
    }
    test::CommandResult resumed = test::run_command(tuned + " " + flags + " -at 1 -o " + run.dir + " -y 1");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("problems, from the checkpoint"), std::string::npos) << resumed.output;
    EXPECT_EQ(resumed.output.find("timed afresh"), std::string::npos) << resumed.output;
    TrainState uninterrupted;
    state_file_read(run.dir + "/state_00000002_00000.bin", &uninterrupted);
    ASSERT_EQ(uninterrupted.sections.size(), 1u);
    EXPECT_EQ(uninterrupted.sections[0].kind, STATE_SECTION_MATMUL_CHOICES);
    EXPECT_GT(uninterrupted.sections[0].bytes.size(), 10 * MATMUL_CHOICE_BYTES);  // the blocks' products and the head's
    EXPECT_TRUE(test::read_text(run.dir + "/state_00000004_00000.bin") == state) << "the resumed run chose other algorithms";
    EXPECT_TRUE(test::read_text(run.dir + "/model_00000004.bin") == model);
    // without -at 1 the section is dropped, with a note
    test::CommandResult untuned = test::run_command(trainer() + " " + flags + " -x 6 -o " + run.dir + " -y 1");
    ASSERT_EQ(untuned.exit_code, 0) << untuned.output;
    EXPECT_NE(untuned.output.find("holds -at 1's matmul algorithms; this run has no -at 1 and drops them"), std::string::npos)
        << untuned.output;
}

// As the CPU suite's resume test: run A goes 12 steps checkpointing every 4; run B is the same run
// "killed" after step 8 (later files deleted, a half-written one left) and resumed with -y 1.
// Shuffled shards, accumulation, validation and sampling are on; the master weights travel in the
// state file, so everything must match bit for bit.
TEST(TrainResume, ResumedRunEqualsUninterruptedRun) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string oracle_dir = tiny_oracle();
    std::string data = test::scratch_dir("gpu_resume_data");
    std::string train = test::make_three_shards(oracle_dir, data);
    std::string common = "-e " + oracle_dir + "/model.bin -i '" + train + "' -j '" + data +
                         "/shard_val_*.bin' -b 2 -t 16 -d 64 -x 12 -l 1e-3 -u 2 -q 0.1 -c 0.1 -sh 1 -v 4 -m 2 -s 4 -g 8 -n 4";
    TrainerRun a = run_trainer("gpu_resume_a", common);
    TrainerRun b = run_trainer("gpu_resume_b", common);
    for (const char* f : {"/model_00000012.bin", "/state_00000012_00000.bin", "/DONE_00000012"}) {
        ASSERT_EQ(remove((b.dir + f).c_str()), 0) << f;
    }
    { std::ofstream partial(b.dir + "/model_00000012.bin.tmp"); partial << "half"; }
    std::string cmd = trainer() + " " + common + " -o " + b.dir + " -y 1";
    test::CommandResult resumed = test::run_command(cmd);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 8"), std::string::npos) << resumed.output;
    EXPECT_EQ(test::metrics_without_timings(a.dir + "/metrics.jsonl"), test::metrics_without_timings(b.dir + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(a.dir + "/main.log"), test::read_text(b.dir + "/main.log"));
    EXPECT_EQ(test::read_text(a.dir + "/model_00000012.bin"), test::read_text(b.dir + "/model_00000012.bin"));
    EXPECT_EQ(test::read_text(a.dir + "/state_00000012_00000.bin"), test::read_text(b.dir + "/state_00000012_00000.bin"));
}

// llm.c's checkpoint format (-cf llmc, llmc/io/llmc_state.h) from this trainer: its master weights, m, v
// and step carry the run on to the same bits as the uninterrupted run (unshuffled, the data position comes
// from the step: 255 samples are no multiple of B = 2). And a checkpoint the oracle wrote in llm.c's format
// (fp32 model file and master weights, loader at batch 20) is continued from sample 40 of the stream, within
// the step tolerance of the oracle's own continuation (test/test_llmc_interop.cpp holds the fp32 CPU
// trainer to 1e-5 on the same files).
TEST(TrainCheckpoints, LlmcCheckpointsContinueTheRun) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string common = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -d 64 -x 6 -l 1e-3 -u 1 -q 0.1 "
                         "-c 0.1 -sh 0 -v 0 -s 0";
    TrainerRun a = run_trainer("gpu_llmc_a", common + " -n 6");
    TrainerRun b = run_trainer("gpu_llmc_b", common + " -n 3 -cf llmc");
    std::vector<int32_t> h(HEADER_INTS);
    FILE* fp = fopenCheck((b.dir + "/state_00000003_00000.bin").c_str(), "rb");
    freadCheck(h.data(), 4, HEADER_INTS, fp);
    fcloseCheck(fp);
    EXPECT_EQ(h[0], 20240527);
    EXPECT_EQ(h[4], 1) << "llm.c's default -w 1 needs the master weights";
    for (const char* f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/DONE_00000006"}) {
        ASSERT_EQ(remove((b.dir + f).c_str()), 0) << f;
    }
    test::CommandResult resumed = test::run_command(trainer() + " " + common + " -n 3 -cf llmc -o " + b.dir + " -y 1");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("was written by llm.c (1 process, fp32 master weights)"), std::string::npos)
        << resumed.output;
    EXPECT_EQ(test::metrics_without_timings(a.dir + "/metrics.jsonl"), test::metrics_without_timings(b.dir + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(a.dir + "/model_00000006.bin"), test::read_text(b.dir + "/model_00000006.bin"));

    // -w 0: no master weights in the run; the state file's are its parameters, those of the model file widened
    TrainerRun w0 = run_trainer("gpu_llmc_w0", common + " -x 1 -n 1 -w 0 -cf llmc");
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(w0.dir + "/model_00000001.bin", &cfg, &params);
    LlmcState l;
    llmc_state_read(w0.dir + "/state_00000001_00000.bin", (int64_t)params.size(), &l);
    EXPECT_EQ(l.master, params);

    const std::string jump_args = std::string(TINY_MODEL) + " -b 2 -t 16 --steps 6 --lr 1e-3 --accum 2 --warmup 1 "
                                  "--final-frac 0.1 --data-tokens 4097 --llmc-checkpoint 3:20";  // as test_llmc_interop.cpp
    REQUIRE_ORACLE("llmc_jump", jump_args);
    std::string jump = test::oracle("llmc_jump", jump_args);
    std::string out = test::scratch_dir("gpu_llmc_oracle");
    ASSERT_EQ(system(("cp " + jump + "/llmc/* " + out).c_str()), 0);
    test::CommandResult r = test::run_command(trainer() + " -e " + jump + "/model.bin -i " + jump + "/train.bin -b 2 -t 16 "
                                              "-d 64 -x 6 -l 1e-3 -u 1 -q 0.1 -c 0 -sh 0 -v 0 -s 0 -o " + out + " -y 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("is sample 40 of epoch 0 of this stream"), std::string::npos) << r.output;
    std::vector<double> want = test::json_array(test::read_text(jump + "/run.json"), "losses");
    std::vector<double> got = test::jsonl_values(out + "/metrics.jsonl", "train_loss");
    ASSERT_EQ(want.size(), 6u);
    ASSERT_EQ(got.size(), 3u);
    for (int i = 0; i < 3; i++) EXPECT_NEAR(got[i], want[3 + i], step_loss_tolerance(want[3 + i])) << "step " << 4 + i;
}

// -ni 2: rank 0's gradients of step 2 are made non-finite (an infinite loss weight, as from one bad
// micro-batch or an fp16 overflow). The step is skipped: the checkpoint after it holds exactly the
// weights and AdamW state of the one before (master weights included), the metrics say so, and the
// run goes on. In the FP16 build the loss scale S also halves at that step. A checkpoint holding a
// NaN is then refused at start.
TEST(TrainNonFinite, SkippedStepLeavesWeightsAndMomentsUntouched) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    TrainerRun run = run_trainer("gpu_nonfinite", "-e " + dir + "/model.bin -i " + dir +
                                 "/train.bin -b 2 -t 16 -x 4 -v 0 -s 0 -sh 0 -n 1 -ni 2");
    EXPECT_NE(run.result.output.find("SKIPPED: non-finite gradient norm (1 so far)"), std::string::npos) << run.result.output;
    EXPECT_EQ(test::read_text(run.dir + "/model_00000002.bin"), test::read_text(run.dir + "/model_00000003.bin"));
    EXPECT_NE(test::read_text(run.dir + "/model_00000003.bin"), test::read_text(run.dir + "/model_00000004.bin"));
    TrainState before, after;
    state_file_read(run.dir + "/state_00000002_00000.bin", &before);
    state_file_read(run.dir + "/state_00000003_00000.bin", &after);
    EXPECT_EQ(before.m, after.m);
    EXPECT_EQ(before.v, after.v);
    EXPECT_EQ(before.master, after.master);
    EXPECT_EQ(after.skipped_total, 1);
    std::string metrics = test::read_text(run.dir + "/metrics.jsonl");
    EXPECT_NE(metrics.find("\"grad_norm\": null, \"skipped\": true, \"skipped_steps\": 1"), std::string::npos) << metrics;
    for (double loss : train_losses(run)) EXPECT_TRUE(std::isfinite(loss));

    std::string bad = run.dir + "/model_nan.bin";
    ASSERT_EQ(system(("cp '" + run.dir + "/model_00000004.bin' '" + bad + "'").c_str()), 0);
    FILE* fp = fopenCheck(bad.c_str(), "r+b");
    fseek(fp, HEADER_BYTES + 8, SEEK_SET);  // parameters 4 and 5 (bf16) or 2 (fp32)
    uint32_t nan_bits = 0x7FC07FC0u;            // a NaN whether read as two bf16 or one fp32
    fwriteCheck(&nan_bits, 4, 1, fp);
    fcloseCheck(fp);
    test::reseal_checksums(bad);  // as a writer with a bug would have made it: past the checksums
    test::CommandResult refused = test::run_command(trainer() + " -e " + bad + " -i " + dir + "/train.bin -b 2 -t 16 -x 1 -v 0 -s 0");
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_NE(refused.output.find("model_nan.bin': element"), std::string::npos) << refused.output;
}

// -fp8 1 (llmc/fp8_linear.cuh) in training runs of the tiny model (B·T = 32 rows, C = 64: every block
// product fits cuBLASLt's FP8 path). Step 1 calibrates in BF16, so its loss is the BF16 run's to the bit;
// the later steps' are not (FP8 changes the products: they must differ) but stay within 1% of BF16's, the
// issue's bar for a GPU run's last 100 steps (e4m3 rounds each operand to within 2^-4 of itself, which
// sums over 48..256 terms average down; the losses here differ by about 1e-4 relative). An evaluation
// (-v 2) changes no training bit (its forwards record no amax), nor does the recompute level (-r 0, 3);
// the run resumed from step 4's checkpoint
// is the uninterrupted run bit for bit (the scales and their history travel in the state file); a skipped
// step (a non-finite gradient, -ni) leaves the scales usable. With B·T = 8 rows (no multiple of 16) every
// product runs in BF16: the BF16 run's bits, as the start-up line says. The fp32 and fp16 builds refuse it.
TEST(TrainFp8, CloseToBf16ResumesBitForBitAndEvaluatesWithoutRecording) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string common = "-e " + dir + "/model.bin -i " + dir + "/train.bin -j " + dir +
                         "/train.bin -b 2 -t 16 -d 64 -x 8 -l 1e-3 -u 2 -q 0.1 -c 0.1 -s 0 -n 4";
#if defined(ENABLE_FP32) || defined(ENABLE_FP16)
    test::CommandResult refused = test::run_command(trainer() + " " + common + " -v 0 -fp8 1 -o " + test::scratch_dir("gpu_fp8_no"));
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_NE(refused.output.find("FP8 training runs in the bf16 build"), std::string::npos) << refused.output;
#else
    TrainerRun bf16 = run_trainer("gpu_fp8_bf16", common + " -v 0"), fp8 = run_trainer("gpu_fp8", common + " -v 0 -fp8 1");
    EXPECT_NE(fp8.result.output.find("FP8 (-fp8 1): the block's qkv, attproj, fc, fcproj matmuls"), std::string::npos)
        << fp8.result.output;
    std::vector<double> a = train_losses(bf16), b = train_losses(fp8);
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    EXPECT_EQ(a[0], b[0]) << "step 1 calibrates in BF16";
    int differ = 0;
    for (size_t i = 1; i < a.size(); i++) {
        EXPECT_NEAR(b[i], a[i], 0.01 * a[i]) << "step " << i + 1;
        differ += a[i] != b[i];
    }
    EXPECT_GE(differ, 6) << "the FP8 steps must not be the BF16 steps";
    // every recompute level the same bits: -r 3's recomputed forward casts the same tensors with the same
    // scales (its amax records again what the forward recorded)
    for (const char* r : {"0", "3"}) {
        TrainerRun other = run_trainer(std::string("gpu_fp8_r") + r, common + " -v 0 -fp8 1 -r " + r);
        EXPECT_EQ(test::metrics_without_timings(other.dir + "/metrics.jsonl"), test::metrics_without_timings(fp8.dir + "/metrics.jsonl"))
            << "-r " << r;
        EXPECT_EQ(test::read_text(other.dir + "/model_00000008.bin"), test::read_text(fp8.dir + "/model_00000008.bin")) << "-r " << r;
    }
#ifdef CUDA_EMULATION
    // a cuBLASLt whose FP8 products take no BIAS epilogue and no beta (the emulator told so): the bias added
    // and the weight gradient summed apart, said once each; the same training but for those roundings
    // (the bias added to the rounded product, the gradient rounded before its sum: a bf16 rounding each)
    TrainerRun apart = run_trainer("gpu_fp8_apart", common + " -v 0 -fp8 1", "env EMU_FP8_EPILOGUES=default " + trainer());
    EXPECT_NE(apart.result.output.find("with the BIAS epilogue (the requested functionality is not supported): that part is done apart"),
              std::string::npos) << apart.result.output;
    EXPECT_NE(apart.result.output.find("adding into the output (the requested functionality is not supported): that part is done apart"),
              std::string::npos) << apart.result.output;
    std::vector<double> c = train_losses(apart);
    ASSERT_EQ(c.size(), 8u);
    for (size_t i = 0; i < c.size(); i++) EXPECT_NEAR(c[i], b[i], 0.002 * b[i]) << "step " << i + 1;
#endif
    // evaluating every 2 steps changes no training bit
    TrainerRun evaluated = run_trainer("gpu_fp8_eval", common + " -v 2 -fp8 1");
    EXPECT_EQ(train_losses(evaluated), b);
    EXPECT_EQ(test::read_text(fp8.dir + "/model_00000008.bin"), test::read_text(evaluated.dir + "/model_00000008.bin"));
    // resumed from step 4
    TrainerRun resumed = run_trainer("gpu_fp8_resume", common + " -v 0 -fp8 1");
    for (const char* f : {"/model_00000008.bin", "/state_00000008_00000.bin", "/DONE_00000008"}) {
        ASSERT_EQ(remove((resumed.dir + f).c_str()), 0) << f;
    }
    test::CommandResult again = test::run_command(trainer() + " " + common + " -v 0 -fp8 1 -o " + resumed.dir + " -y 1");
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_EQ(again.output.find("no FP8 scaling state"), std::string::npos) << again.output;
    EXPECT_EQ(test::metrics_without_timings(fp8.dir + "/metrics.jsonl"), test::metrics_without_timings(resumed.dir + "/metrics.jsonl"));
    EXPECT_EQ(test::read_text(fp8.dir + "/model_00000008.bin"), test::read_text(resumed.dir + "/model_00000008.bin"));
    EXPECT_EQ(test::read_text(fp8.dir + "/state_00000008_00000.bin"), test::read_text(resumed.dir + "/state_00000008_00000.bin"));
    TrainState state;
    state_file_read(fp8.dir + "/state_00000008_00000.bin", &state);
    ASSERT_EQ(state.sections.size(), 1u);
    EXPECT_EQ(state.sections[0].kind, STATE_SECTION_FP8_SCALES);
    // a BF16 run's checkpoint resumed with -fp8 1 calibrates first
    test::CommandResult from_bf16 = test::run_command(trainer() + " " + common + " -x 10 -v 0 -fp8 1 -o " + bf16.dir + " -y 1");
    EXPECT_EQ(from_bf16.exit_code, 0) << from_bf16.output;
    EXPECT_NE(from_bf16.output.find("no FP8 scaling state (written without -fp8): the first step of this run calibrates"),
              std::string::npos) << from_bf16.output;
    // the CPU trainer resumes the FP8 run's checkpoint without it, saying so (copied: the CPU trainer's
    // run description differs from the CUDA trainer's, so it continues in a directory of its own)
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (file_exists(cpu_trainer)) {
        std::string on_cpu = test::scratch_dir("gpu_fp8_on_cpu");
        ASSERT_EQ(system(("cp -r '" + fp8.dir + "/.' '" + on_cpu + "'").c_str()), 0);
        test::CommandResult cpu = test::run_command(cpu_trainer + " " + common + " -x 10 -v 0 -o " + on_cpu + " -y 1");
        EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
        EXPECT_NE(cpu.output.find("the checkpoint holds FP8 scaling state; this trainer has no FP8 and drops it"),
                  std::string::npos) << cpu.output;
    }
    // a skipped step leaves finite scales: the steps after it train
    TrainerRun skipped = run_trainer("gpu_fp8_skip", common + " -v 0 -fp8 1 -ni 3");
    std::vector<double> after = train_losses(skipped);
    ASSERT_EQ(after.size(), 8u);
    for (size_t i = 3; i < after.size(); i++) EXPECT_NEAR(after[i], b[i], 0.02 * b[i]) << "step " << i + 1;
    // -fp8 2, the LM head's forward and input gradient in FP8 too: step 1 calibrates (BF16's bits), the
    // later steps stay within 1% of BF16's and differ from -fp8 1's; resumed from step 4 while evaluating
    // every 2 steps, the same training bits (the head's scales and steps travel in the state file, and the
    // classifier records no amax in an evaluation)
    TrainerRun head = run_trainer("gpu_fp8_head", common + " -v 0 -fp8 2");
    EXPECT_NE(head.result.output.find("FP8 (-fp8 2): the block's qkv, attproj, fc, fcproj matmuls, forward and backward, "
                                      "and the LM head's forward and input gradient, in FP8"), std::string::npos)
        << head.result.output;
    std::vector<double> h = train_losses(head);
    ASSERT_EQ(h.size(), 8u);
    EXPECT_EQ(h[0], a[0]) << "step 1 calibrates in BF16";
    int head_differs = 0;
    for (size_t i = 1; i < h.size(); i++) {
        EXPECT_NEAR(h[i], a[i], 0.01 * a[i]) << "step " << i + 1;
        head_differs += h[i] != b[i];
    }
    EXPECT_GE(head_differs, 6) << "the LM head's FP8 products must change the steps";
    std::string head_resumed = test::scratch_dir("gpu_fp8_head_resume");
    ASSERT_EQ(system(("cp '" + head.dir + "/model_00000004.bin' '" + head.dir + "/state_00000004_00000.bin' '" + head.dir +
                      "/DONE_00000004' '" + head_resumed + "'").c_str()), 0);
    test::CommandResult head_again = test::run_command(trainer() + " " + common + " -v 2 -fp8 2 -o " + head_resumed + " -y 1");
    ASSERT_EQ(head_again.exit_code, 0) << head_again.output;
    EXPECT_EQ(head_again.output.find("resume: the checkpoint"), std::string::npos) << head_again.output;  // no note
    EXPECT_EQ(test::read_text(head.dir + "/model_00000008.bin"), test::read_text(head_resumed + "/model_00000008.bin"));
    EXPECT_EQ(test::read_text(head.dir + "/state_00000008_00000.bin"), test::read_text(head_resumed + "/state_00000008_00000.bin"));
    // the levels' checkpoints resume each other: -fp8 1's with -fp8 2 calibrates the head (its first step's
    // loss is -fp8 1's step 9 to the bit: the head's products BF16, the blocks' FP8 from the state), and
    // -fp8 2's with -fp8 1 drops the head's state
    std::string one_to_two = test::scratch_dir("gpu_fp8_1_to_2"), one_on = test::scratch_dir("gpu_fp8_1_on");
    for (const std::string& to : {one_to_two, one_on}) {
        ASSERT_EQ(system(("cp '" + fp8.dir + "/model_00000008.bin' '" + fp8.dir + "/state_00000008_00000.bin' '" + fp8.dir +
                          "/DONE_00000008' '" + to + "'").c_str()), 0);
    }
    test::CommandResult to_two = test::run_command(trainer() + " " + common + " -x 9 -v 0 -fp8 2 -o " + one_to_two + " -y 1");
    ASSERT_EQ(to_two.exit_code, 0) << to_two.output;
    EXPECT_NE(to_two.output.find("has no LM head (written with -fp8 1): the head calibrates in BF16 on this run's first step"),
              std::string::npos) << to_two.output;
    ASSERT_EQ(test::run_command(trainer() + " " + common + " -x 9 -v 0 -fp8 1 -o " + one_on + " -y 1").exit_code, 0);
    std::vector<double> nine_two = test::jsonl_values(one_to_two + "/metrics.jsonl", "train_loss"),
                        nine_one = test::jsonl_values(one_on + "/metrics.jsonl", "train_loss");
    ASSERT_FALSE(nine_two.empty());
    ASSERT_FALSE(nine_one.empty());
    EXPECT_EQ(nine_two.back(), nine_one.back()) << "step 9: the head calibrating is -fp8 1's step";
    test::CommandResult to_one = test::run_command(trainer() + " " + common + " -x 9 -v 0 -fp8 1 -o " + head.dir + " -y 1");
    EXPECT_EQ(to_one.exit_code, 0) << to_one.output;
    EXPECT_NE(to_one.output.find("holds the LM head's (-fp8 2); this run has -fp8 1 and drops them"), std::string::npos)
        << to_one.output;
    // rows that the FP8 path cannot take: BF16, the BF16 run's bits
    std::string odd = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 1 -t 8 -x 3 -v 0 -s 0";
    TrainerRun odd_bf16 = run_trainer("gpu_fp8_odd0", odd), odd_fp8 = run_trainer("gpu_fp8_odd1", odd + " -fp8 1");
    EXPECT_NE(odd_fp8.result.output.find("qkv, attproj, fc, fcproj in BF16 (B·T = 8 rows"), std::string::npos) << odd_fp8.result.output;
    EXPECT_EQ(train_losses(odd_bf16), train_losses(odd_fp8));
#ifdef CUDA_EMULATION
    test::CommandResult ampere = test::run_command("EMU_COMPUTE_CAPABILITY=8.0 " + trainer() + " " + odd + " -fp8 1");
    EXPECT_EQ(ampere.exit_code, 1) << ampere.output;
    EXPECT_NE(ampere.output.find("FP8 matmuls need FP8 tensor cores (sm_89 and later: Ada, Hopper); this GPU is sm_80"),
              std::string::npos) << ampere.output;
#endif
    test::CommandResult fused = test::run_command(trainer() + " " + odd + " -fp8 1 -ge 1");
    EXPECT_EQ(fused.exit_code, 1) << fused.output;
    EXPECT_NE(fused.output.find("flag -fp8 1 with -ge 1"), std::string::npos) << fused.output;
#endif
}

#if defined(ENABLE_FP16)
// ----------------------------------------------------------------------------
// FP16 with dynamic loss scaling (llmc/run/loss_scaler.h, doc/mixed_precision.md). The oracle tolerances
// above are bf16's; fp16 keeps 3 more mantissa bits (2^-11 relative rounding against 2^-8), so they
// bound fp16 with room to spare wherever nothing underflows or overflows, which loss scaling ensures.

std::vector<double> loss_scales(const TrainerRun& run) { return test::jsonl_values(run.dir + "/metrics.jsonl", "loss_scale"); }

// An injected overflow at step 2 skips exactly that step and halves S; S doubles after -lw clean steps.
TEST(TrainFp16, OverflowSkipsTheStepAndHalvesTheScaleWhichGrowsAfterCleanSteps) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    TrainerRun run = run_trainer("fp16_scale", "-e " + dir + "/model.bin -i " + dir +
                                 "/train.bin -b 2 -t 16 -x 7 -v 0 -s 0 -sh 0 -n 1 -ni 2 -ls 1024 -lw 2");
    std::vector<double> scale = loss_scales(run);
    // steps 0, 1 clean (S grows after step 1), step 2 overflows (S halves), 3, 4 clean (grows), 5, 6 clean
    std::vector<double> want = {1024, 1024, 2048, 1024, 1024, 2048, 2048};
    EXPECT_EQ(scale, want);
    EXPECT_EQ(test::read_text(run.dir + "/model_00000002.bin"), test::read_text(run.dir + "/model_00000003.bin"));
    std::string metrics = test::read_text(run.dir + "/metrics.jsonl");
    EXPECT_NE(metrics.find("\"skipped\": true, \"skipped_steps\": 1, \"loss_scale\": 2048"), std::string::npos) << metrics;
}

// A resumed run restores S and its clean-step counter from the state file: the same scales and bits.
TEST(TrainFp16, ResumeRestoresTheLossScale) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -x 6 -v 0 -s 0 -sh 0 -n 3 -ls 1024 -lw 2";
    TrainerRun a = run_trainer("fp16_resume_a", flags), b = run_trainer("fp16_resume_b", flags);
    for (const char* f : {"/model_00000006.bin", "/state_00000006_00000.bin", "/DONE_00000006"}) remove((b.dir + f).c_str());
    test::CommandResult resumed = test::run_command(trainer() + " " + flags + " -o " + b.dir + " -y 1");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(loss_scales(a), loss_scales(b));
    EXPECT_EQ(test::read_text(a.dir + "/model_00000006.bin"), test::read_text(b.dir + "/model_00000006.bin"));
    TrainState state;
    state_file_read(a.dir + "/state_00000003_00000.bin", &state);
    EXPECT_EQ(state.loss_scale, 2048.0f);  // grown after steps 0-1; steps 2's clean count is saved too
    EXPECT_EQ(state.clean_steps, 1);
}

// The fraction of gradient elements that are nonzero in the float64 oracle but exactly 0 in fp16, for
// one micro-step of B·T = 32 positions, with and without scaling. The loss weight of a position is
// 1/D, D the step's total batch in tokens (accumulation and processes included: the trainer's dloss),
// so the same micro-batch is measured as a step of its own (D = B·T = 32) and as one micro-step of a
// GPT-2-sized step (D = 2^19 tokens, GPT-2 124M's 0.5M-token batch: 2^14 micro-steps here). Measured
// under the CUDA emulator (doc/mixed_precision.md has the table):
//   D = 32:    S = 1: 31 of 120320 elements (0.026%)     S = 2^16: 1 (0.001%)
//   D = 2^19:  S = 1: 38955 of 120320 (32.4%)            S = 2^16: 33 (0.027%)
// The bars leave a factor of 3 to 7 from each measured value (above 10% without scaling at D = 2^19,
// below 0.2% otherwise), so fp16 rounding noise passes while losing the scaling (or a kernel that
// flushes small gradients) does not.
// With scaling the gradients, divided by S and multiplied back by D/(B·T), match the oracle.
TEST(TrainFp16, LossScalingPreventsGradientUnderflow) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    TrainArgs args;
    GPT2 model;
    gpt2_build(&model, dir + "/model.bin", args);
    test::DebugState state = test::read_debug_state(dir + "/state.bin", model.config.vocab_size, model.num_parameters);
    int B = state.B, T = state.T;
    gpt2_allocate_activations(&model, B, T);
    struct Case { double tokens, scale, fraction; };
    std::vector<Case> cases = {{(double)B * T, 1, 0}, {(double)B * T, 65536, 0}, {524288, 1, 0}, {524288, 65536, 0}};
    for (Case& c : cases) {
        gpt2_zero_grad(&model);
        gpt2_forward(&model, state.inputs.data(), state.targets.data(), B, T, (float)(c.scale / c.tokens));
        gpt2_backward(&model, B, T);
        std::vector<floatX> raw(model.num_parameters);
        cudaCheck(cudaMemcpy(raw.data(), model.grads_memory, raw.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        size_t nonzero = 0, underflow = 0;
        std::vector<float> grads(raw.size());  // as the oracle's: the mean over the B·T positions
        for (size_t i = 0; i < raw.size(); i++) {
            float g = host_from_floatX(raw[i]);
            grads[i] = (float)(g / c.scale * (c.tokens / (B * T)));
            if (state.grads[i] == 0.0f) continue;
            nonzero++;
            if (g == 0.0f) underflow++;
        }
        c.fraction = (double)underflow / nonzero;
        printf("  D = %g tokens, S = %g: %zu of %zu nonzero gradient elements are 0 in fp16 (%.3f%%)\n", c.tokens, c.scale,
               underflow, nonzero, 100.0 * c.fraction);
        if (c.scale > 1) {
            for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                size_t off = model.param_offsets[i], n = model.param_sizes[i];
                double err = test::max_rel_error(grads.data() + off, state.grads.data() + off, n);
                EXPECT_LE(err, param_tensor_is_decayed(i) ? TOL_GRAD_MATRIX : TOL_GRAD_VECTOR)
                    << param_tensor_name(i) << ", D = " << c.tokens;
            }
        }
    }
    EXPECT_LT(cases[0].fraction, 0.002) << "a tiny step of its own barely underflows (measured 0.026%)";
    EXPECT_LT(cases[1].fraction, 0.002);
    EXPECT_GT(cases[2].fraction, 0.10) << "a micro-step of a large batch underflows without scaling";
    EXPECT_LT(cases[3].fraction, 0.002) << "with S = 2^16 it does not";
    gpt2_free(&model);
}
#endif

// Checkpoints cross between the trainers: each loads a checkpoint the other wrote and both then see
// the same first loss (within this build's tolerance). Ours is version 5 (bf16) or 3 (fp32); the
// CPU trainer's is version 3, the format llm.c also writes.
TEST(TrainCheckpoints, CpuAndCudaTrainersReadEachOthersCheckpoints) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string cpu_trainer = test::root() + "/train_gpt2";
    if (!file_exists(cpu_trainer)) GTEST_SKIP() << "needs the CPU trainer (make train_gpt2)";
    std::string data = "-i " + dir + "/train.bin -b 2 -t 16 -v 0 -s 0 -sh 0 ";

    TrainerRun gpu = run_trainer("gpu_ckpt_gpu", "-e " + dir + "/model.bin " + data + "-x 2 -n 2");
    TrainerRun cpu = run_trainer("gpu_ckpt_cpu", "-e " + dir + "/model.bin " + data + "-x 2 -n 2", cpu_trainer);
    for (const std::string& model : {gpu.dir + "/model_00000002.bin", cpu.dir + "/model_00000002.bin"}) {
        SCOPED_TRACE(model);
        TrainerRun on_gpu = run_trainer("gpu_ckpt_load_gpu", "-e " + model + " " + data + "-x 1");
        TrainerRun on_cpu = run_trainer("gpu_ckpt_load_cpu", "-e " + model + " " + data + "-x 1", cpu_trainer);
        std::vector<double> a = train_losses(on_gpu), b = train_losses(on_cpu);
        ASSERT_EQ(a.size(), 1u);
        ASSERT_EQ(b.size(), 1u);
        EXPECT_NEAR(a[0], b[0], step_loss_tolerance(b[0]));
    }
}


// doc/reliability.md, with this trainer: its checkpoints go through the same writers and readers as the
// CPU trainer's (llmc/io/checkpoint.h, llmc/run/train_state.h), checked here end to end. A disk that
// fills up during a checkpoint (a file-size limit between the model file's size and the state file's):
// the run stops naming the file and leaves nothing of that step; one that dies there (SIGXFSZ) leaves
// an orphan model file and a .tmp, which -y 1 removes, saying so, before it resumes.
TEST(TrainCheckpoints, FullDiskDuringACheckpointLeavesNothingOfIt) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -v 0 -s 0 -sh 0 -n 1";
    TrainerRun run = run_trainer("gpu_disk_full", flags + " -x 2");
    long model_size = (long)test::read_text(checkpoint_model_path(run.dir, 2)).size();
    long state_size = (long)test::read_text(checkpoint_state_path(run.dir, 2, 0)).size();
    long limit = (model_size + state_size) / 2 / 1024 * 1024;
    ASSERT_TRUE(model_size < limit && limit < state_size) << model_size << " " << state_size;
    std::string resume = trainer() + " " + flags + " -x 4 -y 1 -o " + run.dir;

    test::CommandResult full = test::run_with_file_limit(resume, limit);
    EXPECT_EQ(full.exit_code, 1) << full.output;
    EXPECT_TRUE(std::regex_search(full.output, std::regex("Error: could not write '.*state_00000003_00000\\.bin\\.tmp'.*File too large")))
        << full.output;
    EXPECT_EQ(test::dir_names_ending(run.dir, ".tmp"), "");
    for (const std::string& name : test::dir_names(run.dir)) EXPECT_EQ(name.find("00000003"), std::string::npos) << name;
    EXPECT_EQ(checkpoint_find_latest(run.dir), 2);

    test::CommandResult killed = test::run_with_file_limit(resume, limit, true);
    EXPECT_NE(killed.exit_code, 0) << killed.output;
    ASSERT_TRUE(file_exists(checkpoint_model_path(run.dir, 3))) << "the crash left no orphan model file";
    test::CommandResult resumed = test::run_command(resume);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(std::regex_search(resumed.output, std::regex(
        "resume: removed 2 incomplete checkpoint files .*: model_00000003\\.bin state_00000003_00000\\.bin\\.tmp")))
        << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(checkpoint_find_latest(run.dir), 4);
    EXPECT_EQ(test::dir_names_ending(run.dir, ".tmp"), "");
}

// -ca 1 (llmc/run/checkpoint_writer.h): this trainer copies its weights, moments and master weights from
// the device and hands them to a thread that writes the files while training goes on; the files are
// the synchronous run's byte for byte at every step (-n 1: each checkpoint waits for the one before),
// and a disk that fills during a background write stops the run naming the file, leaving nothing of
// that step, as the synchronous checkpoint does (above).
TEST(TrainCheckpoints, AsyncCheckpointsWriteTheSameFiles) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -v 0 -s 0 -n 1 -x 3";
    TrainerRun sync = run_trainer("gpu_ckpt_sync", flags + " -ca 0"), async = run_trainer("gpu_ckpt_async", flags + " -ca 1");
    EXPECT_NE(async.result.output.find("(in the background"), std::string::npos) << async.result.output;
    for (int step = 1; step <= 3; step++) {
        for (const std::string& f : {checkpoint_model_path(sync.dir, step), checkpoint_state_path(sync.dir, step, 0)}) {
            std::string other = async.dir + f.substr(sync.dir.size());
            EXPECT_EQ(test::read_text(other), test::read_text(f)) << other;
        }
        EXPECT_TRUE(file_exists(checkpoint_done_path(async.dir, step))) << step;
    }
    long model_size = (long)test::read_text(checkpoint_model_path(sync.dir, 3)).size();
    long state_size = (long)test::read_text(checkpoint_state_path(sync.dir, 3, 0)).size();
    long limit = (model_size + state_size) / 2 / 1024 * 1024;
    test::CommandResult full = test::run_with_file_limit(trainer() + " " + flags + " -x 5 -y 1 -ca 1 -o " + async.dir, limit);
    EXPECT_EQ(full.exit_code, 1) << full.output;
    EXPECT_TRUE(std::regex_search(full.output, std::regex("Error: could not write '.*state_00000004_00000\\.bin\\.tmp'.*File too large")))
        << full.output;
    EXPECT_EQ(checkpoint_find_latest(async.dir), 3);
    for (const std::string& name : test::dir_names(async.dir)) EXPECT_EQ(name.find("00000004"), std::string::npos) << name;
}

// A flipped bit in this trainer's bf16 model file or in its state file stops the resume with the file
// and the bytes named; a negative AdamW second moment with correct checksums is refused too.
TEST(TrainCheckpoints, CorruptCheckpointIsRefusedOnResume) {
    REQUIRE_ORACLE("tiny", tiny_args());
    std::string dir = tiny_oracle();
    std::string flags = "-e " + dir + "/model.bin -i " + dir + "/train.bin -b 2 -t 16 -v 0 -s 0 -sh 0 -n 1";
    TrainerRun run = run_trainer("gpu_corrupt", flags + " -x 2");
    std::string model = checkpoint_model_path(run.dir, 2), state = checkpoint_state_path(run.dir, 2, 0);
    std::string model_bytes = test::read_text(model), state_bytes = test::read_text(state);
    auto restore = [&] {
        std::ofstream(model, std::ios::binary) << model_bytes;
        std::ofstream(state, std::ios::binary) << state_bytes;
    };
    std::string resume = trainer() + " " + flags + " -x 3 -y 1 -o " + run.dir;
    struct Case {
        std::string path;
        std::string pattern;
    } cases[] = {
        {model, "model checkpoint '.*model_00000002\\.bin' is corrupt: bytes \\[1024, [0-9]+\\) \\(block 1 of 1\\)"},
        {state, "optimizer state file '.*state_00000002_00000\\.bin' is corrupt: bytes \\[1024, [0-9]+\\) \\(block 1 of [0-9]+\\)"},
    };
    for (const Case& c : cases) {
        restore();
        test::flip_byte(c.path, HEADER_BYTES + 2000);
        test::CommandResult r = test::run_command(resume);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_TRUE(std::regex_search(r.output, std::regex(c.pattern))) << r.output;
    }
    restore();
    TrainState saved;
    state_file_read(state, &saved);
    float negative = -1e-4f;
    FILE* fp = fopenCheck(state.c_str(), "r+b");
    fseek(fp, HEADER_BYTES + (long)(saved.m.size() + 5) * 4, SEEK_SET);  // v[5]
    fwriteCheck(&negative, 4, 1, fp);
    fcloseCheck(fp);
    test::reseal_checksums(state);
    test::CommandResult r = test::run_command(resume);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex(
        "reading AdamW v of .*state_00000002_00000\\.bin': element 5 of [0-9]+ is -0\\.0001; a second moment cannot be negative")))
        << r.output;
}

}  // namespace gpu_test

#include "test_multi_gpu.cuh"

int main(int argc, char** argv) {
    testing::InitGoogleTest(&argc, argv);
    if (argc > 1 && strcmp(argv[1], "--prepare-oracle") == 0) {
        gpu_test::tiny_oracle();
        gpu_test::tiny_cosine_oracle();
        gpu_test::d12_oracle();
        printf("oracle files are in %s/build/oracle/\n", test::root().c_str());
        return testing::UnitTest::GetInstance()->ad_hoc_test_result().Failed() ? 1 : 0;
    }
    int device_count = 0;
    cudaError_t err = cudaGetDeviceCount(&device_count);
    if (argc > 1 && strcmp(argv[1], "--has-gpu") == 0) return err == cudaSuccess && device_count > 0 ? 0 : 1;
    if (err != cudaSuccess || device_count == 0) {
        printf("test_gpt2cu: SKIPPED, no CUDA GPU is visible (%s). These tests need an NVIDIA GPU; on this machine\n"
               "they were only compiled.\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        printf("tests: 0 passed, 0 failed, %d skipped\n", testing::UnitTest::GetInstance()->total_test_count());
        return 0;
    }
    cudaCheck(cudaSetDevice(0));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("test_gpt2cu (%s) on %s\n", PRECISION_NAME, prop.name);
    cublas_setup();
    int rc = RUN_ALL_TESTS();
    cublas_teardown();
    const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
    // googletest counts a skipped test as neither successful nor failed
    printf("tests: %d passed, %d failed, %d skipped\n", unit.successful_test_count(), unit.failed_test_count(),
           unit.skipped_test_count());
    return rc;
}
