// The optimizer runs both trainers' tests compare with the PyTorch oracle (test/test_optimizers.cpp for
// the CPU trainer, test/gpu/test_gpt2.cu for the CUDA one): the same oracle directories (build/oracle/
// opt_*), the same runs, the same measure of agreement.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../llmc/io/checkpoint.h"
#include "../llmc/optimizer.h"
#include "test_helpers.h"

inline const char* const OPTIMIZER_TINY = "--layers 2 --channels 64 --heads 4 --max-seq-len 32 --vocab 300 --seed 1 -b 2 -t 16 --data-tokens 4096";

// A run of `steps` steps with accumulation, warmup, a cosine to 10% and weight decay, for the oracle and
// for the trainer (whose batch is the oracle's accumulation over processes x accum micro-batches).
struct OptimizerRun {
    std::string opt;
    double lr, muon_lr;
    int steps = 5, accum = 2;
    std::string oracle_args(int processes) const {
        char buf[256];
        snprintf(buf, sizeof(buf), " --steps %d --accum %d --warmup 2 --lr %g --final-frac 0.1 --weight-decay 0.1 "
                 "--opt %s --muon-lr %g", steps, accum * processes, lr, opt.c_str(), muon_lr);
        return buf;
    }
    // trainer: the binary's name in the repository root (train_gpt2, train_gpt2cu, ...)
    std::string trainer_args(const std::string& oracle_dir, int processes, const std::string& trainer = "train_gpt2") const {
        char buf[256];
        snprintf(buf, sizeof(buf), " -b 2 -t 16 -d %d -x %d -u 2 -l %g -q 0.1 -c 0.1 -opt %s -ml %g", 2 * 16 * accum * processes,
                 steps, lr, opt.c_str(), muon_lr);
        return test::root() + "/" + trainer + " -e " + oracle_dir + "/model.bin -i " + oracle_dir + "/train.bin -sh 0 -v 0 -s 0 -n " +
               std::to_string(steps) + buf;
    }
};

struct Agreement {
    double loss = 0, norm = 0;         // worst relative loss and gradient-norm error over the steps
    double params = 0, matrices = 0;   // worst parameter error (see below): all tensors, Muon's four matrices
    std::vector<double> comm_bytes;    // process 0's, per step (metrics.jsonl)
    std::string dir;                   // the run's output directory
};

// Our run in `dir` against the oracle's. Parameters: per tensor, the largest difference from the oracle's
// final value over the largest distance the oracle moved any element of that tensor from its start
// (so 1e-3 means "a thousandth of how far training moved the tensor").
inline Agreement compare_with_oracle(const std::string& oracle_dir, const std::string& dir, int steps) {
    Agreement a;
    a.dir = dir;
    std::string run_json = test::read_text(oracle_dir + "/run.json");
    std::vector<double> want_loss = test::json_array(run_json, "losses"), want_norm = test::json_array(run_json, "grad_norms");
    std::vector<double> loss = test::jsonl_values(dir + "/metrics.jsonl", "train_loss"),
                        norm = test::jsonl_values(dir + "/metrics.jsonl", "grad_norm");
    EXPECT_EQ(want_loss.size(), (size_t)steps);
    EXPECT_EQ(loss.size(), want_loss.size());
    EXPECT_EQ(norm.size(), want_norm.size());
    for (size_t s = 0; s < std::min(loss.size(), want_loss.size()); s++) {
        a.loss = std::max(a.loss, std::fabs(loss[s] - want_loss[s]) / want_loss[s]);
        a.norm = std::max(a.norm, std::fabs(norm[s] - want_norm[s]) / want_norm[s]);
    }
    GPT2Config cfg;
    std::vector<float> init, ours, oracle;
    char name[32];
    snprintf(name, sizeof(name), "/model_%08d.bin", steps);
    model_file_read(oracle_dir + "/model.bin", &cfg, &init);
    model_file_read(dir + name, &cfg, &ours);
    model_file_read(oracle_dir + "/final.bin", &cfg, &oracle);
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    param_tensor_offsets(cfg, offsets);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        double diff = 0, moved = 0;
        for (size_t j = offsets[i]; j < offsets[i] + sizes[i]; j++) {
            diff = std::max(diff, (double)std::fabs(ours[j] - oracle[j]));
            moved = std::max(moved, (double)std::fabs(oracle[j] - init[j]));
        }
        EXPECT_GT(moved, 0.0) << param_tensor_name(i) << " did not move";
        a.params = std::max(a.params, diff / moved);
        if (muon_param_is_matrix(i)) a.matrices = std::max(a.matrices, diff / moved);
        printf("  %-9s moved %.3e, differs by %.2e of that\n", param_tensor_name(i), moved, diff / moved);
    }
    a.comm_bytes = test::jsonl_values(dir + "/metrics.jsonl", "comm_bytes");
    printf("  worst relative error: loss %.2e, grad norm %.2e, parameters %.2e\n", a.loss, a.norm, a.params);
    return a;
}

inline void expect_agreement(const Agreement& a, double loss, double norm, double params) {
    EXPECT_LE(a.loss, loss) << "loss";
    EXPECT_LE(a.norm, norm) << "grad norm";
    EXPECT_LE(a.params, params) << "final parameters";
}

