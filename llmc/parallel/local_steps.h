// Local steps (-lh H): data-parallel replicas that synchronize every H steps instead of every step
// (issue 49; local SGD, and DiLoCo's outer optimizer: Douillard et al., "DiLoCo: Distributed Low-Communication
// Training of Language Models", 2023).
//
// Each process trains its replica alone for H steps: its own micro-batches' mean gradient (P times its
// share g_p of the global one, llmc/run/run_loop.h's weights), its own AdamW moments, no collective. Then
// the replicas agree on one model. With theta_0 the parameters at the last synchronization (the anchor,
// the same on every process) and theta_p this process's after its H steps:
//
//   d   = (1/P) sum_p (theta_0 - theta_p)   the mean change, the "outer gradient": one all-reduce of N floats
//   -lo 1 (DiLoCo: Nesterov momentum, outer learning rate 0.7, momentum 0.9):
//         u = 0.9 u + d,   theta = theta_0 - 0.7 (d + 0.9 u)
//   -lo 0 (plain averaging, local SGD):
//         theta = theta_0 - d   (the replicas' mean)
//   theta_0 = theta              on every process, the next interval's anchor
//
// Every process computes the same sum in the same order, so the replicas leave a synchronization
// identical. The run's last step synchronizes whatever H (the final model is one model). Traffic: one
// all-reduce of the parameters per H steps, 1/H of plain data parallelism's (which all-reduces the
// gradients every step). Between synchronizations the replicas differ: an evaluation then reports the
// mean of each replica's loss on its share of the batches, a sample and the model file are process 0's.
//
// The state beyond the optimizer's is each process's own (a checkpoint's extra section, restored from its
// own state file with the same process count): its parameters (between synchronizations they are its
// own), the anchor and the outer momentum; its AdamW moments are its own too (each process's state file
// holds them). The update is outer_element, the same on the host and on the GPU.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "../host_device.h"
#include "../io/state_file.h"
#include "../utils.h"
#include "comm.h"

// DiLoCo's outer Nesterov step (the paper's setting, kept for any H).
constexpr float OUTER_LR = 0.7f, OUTER_MOMENTUM = 0.9f;

// One parameter's synchronization: delta_sum = sum_p (anchor - theta_p) as the all-reduce left it;
// returns the new parameter (also the new anchor). u: the outer momentum (-lo 1).
HOST_DEVICE inline float outer_element(float anchor, float delta_sum, float inv_processes, float* u, bool nesterov) {
    float d = delta_sum * inv_processes;
    if (!nesterov) return anchor - d;
    *u = OUTER_MOMENTUM * *u + d;
    return anchor - OUTER_LR * (d + OUTER_MOMENTUM * *u);
}

struct LocalSteps {
    int every = 0;           // H: steps between synchronizations (0: off, the gradients are all-reduced every step)
    bool nesterov = true;    // -lo 1; -lo 0: plain averaging
    std::vector<float> anchor, momentum;  // theta_0 and u (N each); the host's copies (the CPU trainer's own)
};

// Whether the update of step `step` (from 0) ends with a synchronization: after every H steps, and after
// the run's last.
inline bool local_steps_sync_due(const LocalSteps& ls, int step, bool last) {
    return ls.every > 0 && ((step + 1) % ls.every == 0 || last);
}

// The bytes of a process's -lh state (the memory plan): the anchor, and the outer momentum with -lo 1.
inline size_t local_steps_state_bytes(size_t n, int outer) { return (outer == 1 ? 2 : 1) * n * sizeof(float); }

// The bytes one synchronization moves per process: the ring all-reduce of N values of `bytes` each (fp32;
// the CUDA trainer's floatX), comm.h's count.
inline double local_steps_sync_bytes(size_t n, int processes, size_t bytes = sizeof(float)) {
    return 2.0 * 2.0 * (double)(n - n / processes) * bytes;
}

// -lh at start-up, the scheme's settings (ls->every, nesterov) and its note (the changes sent as values of
// value_bytes); true when the run takes local steps; with one data-parallel process there is nothing to synchronize (a note says so). The trainer then
// sets the anchor to its parameters and the momentum to 0.
inline bool local_steps_configure(int every, int outer, const ProcessGroup& dp, size_t n, LocalSteps* ls,
                                  size_t value_bytes = sizeof(float)) {
    if (every == 0) return false;
    if (dp.size == 1) {
        printf("local steps: one data-parallel process, nothing to synchronize: -lh %d runs as every step\n", every);
        return false;
    }
    ls->every = every;
    ls->nesterov = outer == 1;
    printf("local steps: -lh %d, each replica alone for %d steps, then %s; %.0f bytes a synchronization per process "
           "(the changes' all-reduce, as big as the gradients' every step without -lh)\n", every, every,
           ls->nesterov ? "DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9) on the mean change" : "the replicas' mean",
           local_steps_sync_bytes(n, dp.size, value_bytes));
    return true;
}

// The CPU trainer's start: the anchor is the parameters now.
inline bool local_steps_start(int every, int outer, const ProcessGroup& dp, const float* params, size_t n, LocalSteps* ls) {
    if (!local_steps_configure(every, outer, dp, n, ls)) return false;
    ls->anchor.assign(params, params + n);
    ls->momentum.assign(ls->nesterov ? n : 0, 0.0f);
    return true;
}

// The synchronization on the host (the CPU trainer): params (N) become the outer step's, the same on every
// process; they hold the changes theta_0 - theta_p while the all-reduce sums them. A collective of the
// data-parallel group.
inline void local_steps_sync(const ProcessGroup& dp, LocalSteps* ls, float* params, size_t n) {
    float* anchor = ls->anchor.data();
    for (size_t i = 0; i < n; i++) params[i] = anchor[i] - params[i];
    all_reduce(dp, params, n, COMM_FLOAT32, COMM_SUM);
    comm_join(dp);
    const float inv = 1.0f / (float)dp.size;
    float unused = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float* u = ls->nesterov ? &ls->momentum[i] : &unused;
        params[i] = anchor[i] = outer_element(anchor[i], params[i], inv, u, ls->nesterov);
    }
}

// The state in a checkpoint: an extra section of this process's state file, [its parameters | the anchor |
// the outer momentum (zeros with -lo 0)], N floats each (host copies).
inline StateSection local_steps_section_of(const float* params, const float* anchor, const float* momentum, size_t n) {
    StateSection s;
    s.kind = STATE_SECTION_LOCAL_STEPS;
    s.bytes.resize(3 * n * sizeof(float));
    float* out = (float*)s.bytes.data();
    memcpy(out, params, n * sizeof(float));
    memcpy(out + n, anchor, n * sizeof(float));
    if (momentum) memcpy(out + 2 * n, momentum, n * sizeof(float));
    else memset(out + 2 * n, 0, n * sizeof(float));
    return s;
}

inline StateSection local_steps_section(const LocalSteps& ls, const float* params, size_t n) {
    return local_steps_section_of(params, ls.anchor.data(), ls.nesterov ? ls.momentum.data() : nullptr, n);
}

// The section among this process's, as three host vectors of n (params, anchor, momentum); false, with a
// note, from a checkpoint written without -lh (the trainer then takes the resumed parameters as the anchor
// and 0 as the momentum).
inline bool local_steps_section_read(const std::vector<StateSection>& sections, size_t n, std::vector<float>* params,
                                     std::vector<float>* anchor, std::vector<float>* momentum) {
    for (const StateSection& s : sections) {
        if (s.kind != STATE_SECTION_LOCAL_STEPS) continue;
        if (s.bytes.size() != 3 * n * sizeof(float)) {
            fatal("the checkpoint's local-steps state holds %zu bytes; this model's is %zu", s.bytes.size(), 3 * n * sizeof(float));
        }
        const float* in = (const float*)s.bytes.data();
        require_finite(in, 3 * n, "reading", "the checkpoint's local-steps state");
        params->assign(in, in + n);
        anchor->assign(in + n, in + 2 * n);
        momentum->assign(in + 2 * n, in + 3 * n);
        return true;
    }
    printf("resume: the checkpoint has no local-steps state (written without -lh): the anchor is the resumed model, "
           "the outer momentum 0\n");
    return false;
}

// The CPU trainer's restore: its parameters, anchor and momentum.
inline void local_steps_restore(LocalSteps* ls, const std::vector<StateSection>& sections, float* params, size_t n) {
    std::vector<float> mine, anchor, momentum;
    if (!local_steps_section_read(sections, n, &mine, &anchor, &momentum)) {
        ls->anchor.assign(params, params + n);
        return;
    }
    std::copy(mine.begin(), mine.end(), params);
    ls->anchor = std::move(anchor);
    if (ls->nesterov) ls->momentum = std::move(momentum);
}
