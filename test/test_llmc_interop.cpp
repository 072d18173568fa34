// Runs that move between llm.c and this project (issue 51, item 6; llmc/io/llmc_state.h): `-y 1` continues
// a checkpoint in llm.c's format, and `-cf llmc` writes one that llm.c's trainer continues. llm.c's CUDA
// trainer cannot run here, so the other side is the PyTorch oracle, which writes and reads llm.c's
// checkpoints from the format's definition (test/oracle/gpt2_oracle.py: --llmc-checkpoint, --resume-llmc),
// not from our code. Tolerances: a step's loss within 1e-5 relative, as the oracle's training tests
// (test_model.cpp) hold every step of a run; a lost or wrong m, v, step or data position moves the next
// step's loss by far more (1e-3 and up on this model, lr 1e-3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "../llmc/gpt2_config.h"
#include "../llmc/io/checkpoint.h"
#include "../llmc/io/llmc_state.h"
#include "test_helpers.h"

namespace {

// The tiny model on 4097 tokens: 256 samples of T = 16, a multiple of B = 2, so llm.c's loader reads our
// stream sample for sample; 3 of 6 steps of 2 micro-batches, warm-up and a cosine decay, so that the step
// decides the learning rate.
const char* MODEL = "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 --seed 1";
const char* RUN = "-b 2 -t 16 --steps 6 --lr 1e-3 --accum 2 --warmup 1 --final-frac 0.1";
const char* TRAIN = "-b 2 -t 16 -d 64 -x 6 -l 1e-3 -u 1 -q 0.1 -c 0 -v 0 -s 0 -sh 0";

std::string oracle_run(const std::string& name, const std::string& data, const std::string& checkpoint) {
    return test::oracle(name, std::string(MODEL) + " " + RUN + " " + data + " --llmc-checkpoint " + checkpoint);
}

std::string trainer(const std::string& oracle_dir) {
    return test::root() + "/train_gpt2 -e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin " + TRAIN;
}

std::vector<double> losses(const std::string& out) { return test::jsonl_values(out + "/metrics.jsonl", "train_loss"); }

std::vector<double> oracle_losses(const std::string& dir) {
    return test::json_array(test::read_text(dir + "/run.json"), "losses");
}

void expect_losses(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << what << ", loss " << i;
}

std::vector<int32_t> header_of(const std::string& path) {
    std::vector<int32_t> h(HEADER_INTS, 0);
    FILE* fp = fopen(path.c_str(), "rb");
    if (fp) {
        if (fread(h.data(), 4, HEADER_INTS, fp) != (size_t)HEADER_INTS) h.assign(HEADER_INTS, 0);
        fclose(fp);
    }
    return h;
}

uint64_t wide(const std::vector<int32_t>& h, int at) {
    uint64_t v;
    memcpy(&v, &h[at], sizeof(v));
    return v;
}

bool have_mpirun() { return test::run_command("command -v mpirun").exit_code == 0; }

}  // namespace

// llm.c's checkpoint of step 3 whose loader stands at batch 20 of the shard (not where a straight run would
// be, batch 6: so the test sees the position itself move across). The oracle went on from there; so must
// we, from sample 40 of our stream. Its model file is made bf16 (version 5), as llm.c's bf16 trainer writes
// it: the fp32 master weights in the state file are the parameters to continue from.
TEST(LlmcInterop, OurTrainerContinuesAnLlmcCheckpoint) {
    std::string dir = oracle_run("llmc_jump", "--data-tokens 4097", "3:20");
    std::string out = test::scratch_dir("llmc_resume");
    ASSERT_EQ(test::run_command("cp " + dir + "/llmc/* " + out).exit_code, 0);
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(checkpoint_model_path(out, 3), &cfg, &params);
    model_file_write(checkpoint_model_path(out, 3), cfg, params.data(), MODEL_VERSION_BF16);
    test::CommandResult r = test::run_command(trainer(dir) + " -o " + out + " -y 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("was written by llm.c (1 process, fp32 master weights)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("llm.c's data position (shard 0, batch 20 of B=2 x T=16 x 1 processes; llm.c does not "
                            "record B: this run's) is sample 40 of epoch 0 of this stream"), std::string::npos)
        << r.output;
    std::vector<double> want = oracle_losses(dir);
    ASSERT_EQ(want.size(), 6u);
    expect_losses(losses(out), std::vector<double>(want.begin() + 3, want.end()), "steps 4-6 after llm.c's step 3");
}

// Our run writes llm.c's checkpoint at step 3 (-cf llmc); the oracle reads it as llm.c would (its master
// weights, m, v, step and loader batch) and trains steps 4-6: the same losses as its own uninterrupted run.
TEST(LlmcInterop, TheOracleContinuesOurLlmcCheckpoint) {
    std::string dir = oracle_run("llmc_straight", "--data-tokens 4097", "3");
    std::string out = test::scratch_dir("llmc_write");
    test::CommandResult r = test::run_command(trainer(dir) + " -o " + out + " -n 3 -cf llmc");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<int32_t> h = header_of(checkpoint_state_path(out, 3, 0));
    EXPECT_EQ(h[0], 20240527);
    EXPECT_EQ(h[10], 3);
    EXPECT_EQ(wide(h, 32), 6u) << "3 steps of 2 micro-batches";
    std::string continued = test::scratch_dir("llmc_write_oracle");
    std::string cmd = test::python() + " " + test::root() + "/test/oracle/gpt2_oracle.py --out " + continued + " " + RUN +
                      " --shard " + dir + "/train.bin --resume-llmc " + out + ":3";
    test::CommandResult o = test::run_command(cmd);
    ASSERT_EQ(o.exit_code, 0) << cmd << "\n" << o.output;
    std::vector<double> want = oracle_losses(dir);
    ASSERT_EQ(want.size(), 6u);
    expect_losses(oracle_losses(continued), std::vector<double>(want.begin() + 3, want.end()),
                  "the oracle's steps 4-6 from our llm.c checkpoint");
}

// Where llm.c's loader does not read our stream (4096 tokens: 255 samples, and llm.c leaves the odd one
// out of every pass) the position does not move across: each side continues from the step, saying so.
// Reading: our stream after 3 steps is where the oracle's run went on (batch 6 = sample 12). Writing: the
// state file places llm.c's loader where its own run would be after 6 micro-batches.
TEST(LlmcInterop, WhereTheLoadersDisagreeEachSideContinuesFromTheStep) {
    std::string dir = oracle_run("llmc_odd", "--data-tokens 4096", "3");
    std::string out = test::scratch_dir("llmc_odd_resume");
    ASSERT_EQ(test::run_command("cp " + dir + "/llmc/* " + out).exit_code, 0);
    test::CommandResult r = test::run_command(trainer(dir) + " -o " + out + " -y 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("llm.c's data position (shard 0, batch 6) is not a place in this stream: shard '" + dir +
                            "/train.bin' holds 255 samples of T=16 tokens, not a multiple of B*processes = 2 (llm.c "
                            "leaves the last 1 out); the run continues this stream where it would be after step 3: "
                            "sample 12 of epoch 0"), std::string::npos) << r.output;
    std::vector<double> want = oracle_losses(dir);
    ASSERT_EQ(want.size(), 6u);
    expect_losses(losses(out), std::vector<double>(want.begin() + 3, want.end()), "steps 4-6");

    // a shuffled run: llm.c's loader cannot follow it either
    std::string shuffled = test::scratch_dir("llmc_odd_write");
    r = test::run_command(trainer(dir) + " -sh 1 -x 4 -o " + shuffled + " -n 2 -cf llmc");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("checkpoint: -cf llmc: llm.c's loader does not read this stream (this run shuffles its "
                            "samples (-sh 1), in an order llm.c does not have): its state files place it where llm.c's "
                            "own run would be after the same steps (at step 2: shard 0, batch 4)"), std::string::npos)
        << r.output;
    EXPECT_EQ(wide(header_of(checkpoint_state_path(shuffled, 4, 0)), 32), 8u);
}

// llm.c's shuffled files carry its loader's orders after the vectors; the reader finds the vectors' length
// under them, and continues from the step (llm.c's order is its own). A truncated file is refused, naming
// the sizes it could have had.
TEST(LlmcInterop, ShuffledAndTruncatedLlmcFiles) {
    std::string dir = oracle_run("llmc_straight", "--data-tokens 4097", "3");
    std::string out = test::scratch_dir("llmc_shuffled");
    ASSERT_EQ(test::run_command("cp " + dir + "/llmc/* " + out).exit_code, 0);
    std::string state = checkpoint_state_path(out, 3, 0);
    {   // h[5] = 1, then the orders as llm.c writes them: 1 shard, 128 batches, its generator's 2520 bytes
        FILE* fp = fopen(state.c_str(), "r+b");
        ASSERT_NE(fp, nullptr);
        int32_t one = 1;
        fseek(fp, 5 * 4, SEEK_SET);
        fwrite(&one, 4, 1, fp);
        fseek(fp, 0, SEEK_END);
        uint64_t shards = 1, batches = 128;
        int32_t zero = 0;
        fwrite(&shards, 8, 1, fp);
        fwrite(&zero, 4, 1, fp);
        fwrite(&batches, 8, 1, fp);
        for (int i = 0; i < 128; i++) fwrite(&i, 4, 1, fp);
        std::vector<char> rng(2520, 7);
        fwrite(rng.data(), 1, rng.size(), fp);
        fclose(fp);
    }
    test::CommandResult r = test::run_command(trainer(dir) + " -o " + out + " -y 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("is not a place in this stream: llm.c's loader shuffled, in an order of its own; the run "
                            "continues this stream where it would be after step 3: sample 12 of epoch 0"),
              std::string::npos) << r.output;
    std::vector<double> want = oracle_losses(dir);
    expect_losses(losses(out), std::vector<double>(want.begin() + 3, want.end()), "steps 4-6");

    // a position past the data (batch 200 of a shard of 128): from the step, saying why
    std::string past = test::scratch_dir("llmc_past");
    ASSERT_EQ(test::run_command("cp " + dir + "/llmc/* " + past).exit_code, 0);
    {
        FILE* fp = fopen(checkpoint_state_path(past, 3, 0).c_str(), "r+b");
        ASSERT_NE(fp, nullptr);
        uint64_t batch = 200;
        fseek(fp, 32 * 4, SEEK_SET);
        fwrite(&batch, 8, 1, fp);
        fclose(fp);
    }
    r = test::run_command(trainer(dir) + " -o " + past + " -y 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("llm.c's data position (shard 0, batch 200) is not a place in this stream: it lies past this "
                            "data (1 shard(s)): other data than llm.c's run read?; the run continues this stream where it "
                            "would be after step 3: sample 12 of epoch 0"), std::string::npos) << r.output;

    std::string cut = test::scratch_dir("llmc_truncated");
    ASSERT_EQ(test::run_command("cp " + dir + "/llmc/* " + cut + " && truncate -s -4 " + checkpoint_state_path(cut, 3, 0)).exit_code, 0);
    r = test::run_command(trainer(dir) + " -o " + cut + " -y 1");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("llm.c state file '" + checkpoint_state_path(cut, 3, 0) + "' is 1521660 bytes: not the state "
                            "of a model of 126720 parameters (1 processes; expected 1521664 bytes)"), std::string::npos)
        << r.output;
}

// What llm.c's trainer cannot continue is refused before the run starts.
TEST(LlmcInterop, WhatLlmcCannotContinueIsRefused) {
    std::string dir = oracle_run("llmc_straight", "--data-tokens 4097", "3");
    struct Case { std::string flags, message; };
    for (const Case& c : std::vector<Case>{
             {"-cf llmc -opt muon", "flag -cf llmc: llm.c's trainer runs AdamW with data parallelism only; this run has "
                                    "-opt muon -tp 1 -pp 1 (use -cf ours)"},
             {"-cf llm.c", "flag -cf: unknown checkpoint format 'llm.c' (ours or llmc)"}}) {
        test::CommandResult r = test::run_command(trainer(dir) + " " + c.flags);
        EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
        EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n" << r.output;
    }
    // a checkpoint of ours resumed with -opt muon is refused as before; one of llm.c's says whose it is
    std::string out = test::scratch_dir("llmc_refuse_muon");
    ASSERT_EQ(test::run_command("cp " + dir + "/llmc/* " + out).exit_code, 0);
    test::CommandResult r = test::run_command(trainer(dir) + " -o " + out + " -y 1 -opt muon");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("was written with -opt adamw (by llm.c); this run has -opt muon"), std::string::npos) << r.output;
}

// ZeRO-1 (and -z 3) over 2 processes: llm.c's files hold N/2 of each vector from rank*N/2, as ours are laid
// out; one process resumes them (its reader puts the two halves together), from the step (llm.c's run had 2
// processes), with the uninterrupted oracle's losses.
TEST(LlmcInterop, ZeroOneShardsAsLlmcDoesAndOneProcessResumesThem) {
    if (!have_mpirun() || !file_exists(test::root() + "/train_gpt2")) GTEST_SKIP() << "needs mpirun";
    std::string dir = oracle_run("llmc_straight", "--data-tokens 4097", "3");
    for (int zero : {1, 3}) {  // -z 3: each process's parameters are its shard only
        SCOPED_TRACE("-z " + std::to_string(zero));
        std::string out = test::scratch_dir("llmc_zero" + std::to_string(zero));
        std::string cmd = "OMP_NUM_THREADS=1 timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 " + trainer(dir) +
                          " -b 1 -z " + std::to_string(zero) + " -n 3 -cf llmc -o " + out;
        test::CommandResult r = test::run_command(cmd);
        ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
        const long N = 126720;
        for (int rank = 0; rank < 2; rank++) {
            std::string path = checkpoint_state_path(out, 3, rank);
            std::vector<int32_t> h = header_of(path);
            EXPECT_EQ(h[2], 2);
            EXPECT_EQ(h[3], rank);
            EXPECT_EQ(h[4], 1) << "master weights: the fp32 parameters";
            FILE* fp = fopen(path.c_str(), "rb");
            ASSERT_NE(fp, nullptr);
            EXPECT_EQ(file_size_of(fp), HEADER_BYTES + 4 * (N / 2) * 3) << path;
            fclose(fp);
        }
        ASSERT_EQ(test::run_command("rm " + checkpoint_done_path(out, 6)).exit_code, 0);  // resume from step 3
        r = test::run_command(trainer(dir) + " -o " + out + " -y 1");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("llm.c's run had 2 processes, this one 1 data-parallel processes; the run continues this "
                                "stream where it would be after step 3: sample 12 of epoch 0"), std::string::npos) << r.output;
        std::vector<double> want = oracle_losses(dir), got = losses(out);  // the resumed run's are the last 3
        ASSERT_GE(got.size(), 3u);
        expect_losses(std::vector<double>(got.end() - 3, got.end()), std::vector<double>(want.begin() + 3, want.end()),
                      "steps 4-6");
    }
}

// check_gpt2 checks a model + debug state pair as llm.c's test_gpt2 does: the oracle's tiny pair passes,
// with the losses of 10 steps of llm.c's test recipe that torch.optim.AdamW took (--llmc-test-steps);
// one gradient tensor off, a wrong expected loss, or a state of another model fail, naming what.
TEST(LlmcInterop, CheckGpt2ChecksAModelAndDebugStatePair) {
    std::string dir = test::oracle("llmc_check", std::string(MODEL) + " -b 2 -t 16 --data-tokens 4096 --llmc-test-steps 10");
    std::string check = test::root() + "/check_gpt2 ";
    std::vector<double> want = test::json_array(test::read_text(dir + "/llmc_test.json"), "losses");
    ASSERT_EQ(want.size(), 10u);
    std::string losses;
    for (double l : want) {
        char item[32];
        snprintf(item, sizeof(item), "%s%.9f", losses.empty() ? "" : ",", l);
        losses += item;
    }
    test::CommandResult r = test::run_command(check + dir + "/model.bin " + dir + "/state.bin -l " + losses + " -ts 1e-5");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("overall: OK (16/16 gradients)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 9: loss"), std::string::npos) << r.output;

    // the 8th tensor's gradient (attprojb), its first element moved by its tensor's largest magnitude
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(dir + "/model.bin", &cfg, &params);
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    param_tensor_offsets(cfg, offsets);
    DebugState state = debug_state_read(dir + "/state.bin", cfg.vocab_size, params.size());
    float largest = 0;
    for (size_t j = offsets[7]; j < offsets[7] + sizes[7]; j++) largest = std::max(largest, std::fabs(state.grads[j]));
    std::string bad = test::scratch_dir("check_gpt2") + "/state_bad.bin";
    ASSERT_EQ(test::run_command("cp " + dir + "/state.bin " + bad).exit_code, 0);
    FILE* fp = fopen(bad.c_str(), "r+b");
    ASSERT_NE(fp, nullptr);
    size_t BT = 2 * 16;
    float moved = state.grads[offsets[7]] + largest;
    fseek(fp, HEADER_BYTES + (long)(BT * 8 + BT * cfg.vocab_size * 4 + 4 + offsets[7] * 4), SEEK_SET);
    fwrite(&moved, 4, 1, fp);
    fclose(fp);
    r = test::run_command(check + dir + "/model.bin " + bad);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("gradient attprojb +max difference [0-9.e+-]+ of the largest "
                                                       "\\(tolerance 1e-03\\): NOT OK"))) << r.output;
    EXPECT_NE(r.output.find("overall: NOT OK (15/16 gradients)"), std::string::npos) << r.output;

    r = test::run_command(check + dir + "/model.bin " + dir + "/state.bin -l " + losses.substr(0, losses.find(',')) + ",5.0");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("step 1: loss"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("expected 5.000000"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("overall: NOT OK (16/16 gradients)"), std::string::npos) << r.output;

    // a debug state of another model: its size says so
    std::string other = test::oracle("llmc_check_other", "--layers 1 --channels 32 --heads 2 --max-seq-len 16 --vocab 300 "
                                                         "--seed 1 -b 2 -t 16 --data-tokens 1024");
    r = test::run_command(check + dir + "/model.bin " + other + "/state.bin");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("debug state '" + other + "/state.bin' is"), std::string::npos) << r.output;
    r = test::run_command(check + dir + "/model.bin");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("usage: check_gpt2 MODEL.bin DEBUG_STATE.bin"), std::string::npos) << r.output;
}
