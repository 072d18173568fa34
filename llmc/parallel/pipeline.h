// Pipeline parallelism over the PP group of llmc/parallel/layout.h: the layers are cut into stages.
//
// Stage s of p holds layers [l0, l1), as even as possible (the first L % p stages get one more). Each
// stage's parameters are a model of its own in checkpoint order with num_layers = l1 - l0 (so tensor
// parallelism, ZeRO-1 and AdamW work on it unchanged). The first stage uses wte and wpe (the
// embedding), the last lnf and wte again (the tied LM head). The gradients of these shared tensors
// (wte, wpe, lnfw, lnfb) are summed over the PP group before the update: for wte that is the tied sum
// of the embedding's and the head's gradients, for the others it adds zeros; every stage then applies
// the same update, so the copies never differ. (A middle stage of p >= 3 keeps such a copy it never
// uses: simpler than a layout with absent tensors, and for p = 2 there is no middle stage.)
//
// The gradient-accumulation micro-batches flow through the stages: stage s receives the (B, T, C)
// residual stream from s-1, runs its blocks and sends its output to s+1; in the backward it receives
// d(loss)/d(output) from s+1 and sends d(loss)/d(input) to s-1. The order of forwards (F) and
// backwards (B) on each stage is the schedule; for p = 3 stages and m = 4 micro-batches:
//
//   GPipe (all forwards, then all backwards; m activations alive per stage)
//     s0, s1, s2: F0 F1 F2 F3 B0 B1 B2 B3
//   1F1B (p-1-s forwards of warm-up, then one forward one backward, then the cool-down backwards;
//         at most p-s micro-batches alive on stage s)
//     s0: F0 F1 F2 B0 F3 B1 B2 B3
//     s1: F0 F1 B0 F2 B1 F3 B2 B3
//     s2: F0 B0 F1 B1 F2 B2 F3 B3
// doc/model_parallel.md draws them as timelines. Each stage idles
// p-1 slots of forward+backward out of m+p-1: the bubble fraction (p-1)/(m+p-1), the same for both
// schedules; 1F1B only lowers the activation memory.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../utils.h"
#include "comm.h"

// Layers [*l0, *l1) of stage s of p for L layers.
inline void pp_stage_layers(int L, int p, int s, int* l0, int* l1) {
    int base = L / p, extra = L % p;
    *l0 = s * base + std::min(s, extra);
    *l1 = *l0 + base + (s < extra ? 1 : 0);
}

// The tensors every stage keeps a copy of (their gradients are summed over the PP group).
inline bool pp_param_is_shared(int i) { return i == P_WTE || i == P_WPE || i == P_LNFW || i == P_LNFB; }

// The model of the stage holding layers [l0, l1): the whole model's shapes with those layers only; and
// that of stage s of p.
inline GPT2Config pp_layers_config(const GPT2Config& cfg, int l0, int l1) {
    GPT2Config stage = cfg;
    stage.num_layers = l1 - l0;
    return stage;
}
inline GPT2Config pp_stage_config(const GPT2Config& cfg, int p, int s) {
    int l0, l1;
    pp_stage_layers(cfg.num_layers, p, s, &l0, &l1);
    return pp_layers_config(cfg, l0, l1);
}

// Copies between the full parameter vector (checkpoint order, cfg) and the stage vector of layers
// [l0, l1) (checkpoint order, cfg with num_layers = l1 - l0): full -> stage when to_stage, else back.
// Per-layer tensors are stacked (L, ...), so a stage's layers are one contiguous run of each.
inline void pp_copy_stage(const GPT2Config& cfg, int l0, int l1, float* full, float* stage, bool to_stage) {
    GPT2Config stage_cfg = pp_layers_config(cfg, l0, l1);
    size_t full_sizes[NUM_PARAMETER_TENSORS], stage_sizes[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, full_sizes);
    param_tensor_sizes(stage_cfg, stage_sizes);
    float* f = full;
    float* s = stage;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t skip = pp_param_is_shared(i) ? 0 : full_sizes[i] / cfg.num_layers * l0;
        if (to_stage) memcpy(s, f + skip, stage_sizes[i] * sizeof(float));
        else memcpy(f + skip, s, stage_sizes[i] * sizeof(float));
        f += full_sizes[i];
        s += stage_sizes[i];
    }
}

// ----------------------------------------------------------------------------
// Schedules

struct PipelineOp {
    bool forward;
    int micro;  // which micro-batch
};

// The order of forwards and backwards on stage s of p for m micro-batches: "gpipe" or "1f1b".
inline std::vector<PipelineOp> pp_schedule(const std::string& kind, int p, int s, int m) {
    std::vector<PipelineOp> ops;
    if (kind == "gpipe") {
        for (int i = 0; i < m; i++) ops.push_back({true, i});
        for (int i = 0; i < m; i++) ops.push_back({false, i});
        return ops;
    }
    int warmup = std::min(p - 1 - s, m), next_f = 0, next_b = 0;
    for (; next_f < warmup; next_f++) ops.push_back({true, next_f});
    while (next_f < m) {  // steady state: one forward, one backward
        ops.push_back({true, next_f++});
        ops.push_back({false, next_b++});
    }
    while (next_b < m) ops.push_back({false, next_b++});  // cool-down
    return ops;
}

// Micro-batches whose activations are alive at once on stage s: all m for GPipe, p-s for 1F1B.
// Micro-batch i uses activation slot i % slots (1F1B: micro i's forward comes after micro i-(p-s)'s backward).
inline int pp_activation_slots(const std::string& kind, int p, int s, int m) {
    return kind == "gpipe" ? m : std::min(m, p - s);
}

inline double pp_bubble_formula(int p, int m) { return (double)(p - 1) / (m + p - 1); }

// The start-up line of a pipeline stage, for both trainers: its layers [l0, l1) of L, the schedule over
// m micro-batches, the activation sets it keeps (and those of each schedule, with their size when
// set_bytes, one set's, is known) and the bubble formula.
inline std::string pipeline_describe(int p, int s, int l0, int l1, int L, const std::string& schedule, int m,
                                     size_t set_bytes = 0) {
    int gpipe = pp_activation_slots("gpipe", p, s, m), one_f_one_b = pp_activation_slots("1f1b", p, s, m);
    char sizes[2][48] = {"", ""};
    if (set_bytes > 0) {
        snprintf(sizes[0], sizeof(sizes[0]), ", %.2f MiB", gpipe * (double)set_bytes / 1048576.0);
        snprintf(sizes[1], sizeof(sizes[1]), ", %.2f MiB", one_f_one_b * (double)set_bytes / 1048576.0);
    }
    char line[400];
    snprintf(line, sizeof(line), "pipeline: %d stages, stage %d holds layers [%d, %d) of %d; schedule %s over m = %d "
             "micro-batches, %d activation slot(s) (GPipe %d%s, 1F1B %d%s); bubble formula (p-1)/(m+p-1) = %d/%d = %.3f",
             p, s, l0, l1, L, schedule.c_str(), m, pp_activation_slots(schedule, p, s, m), gpipe, sizes[0],
             one_f_one_b, sizes[1], p - 1, m + p - 1, pp_bubble_formula(p, m));
    return line;
}

// ----------------------------------------------------------------------------
// Point-to-point transfers along the PP group (llmc/parallel/comm.h's comm_send and comm_recv), in the
// element type of the boundary tensors (fp32 on the CPU, the CUDA build's floatX on GPUs).
//
// Two stages exchange in both directions (activations down, gradients up), and under NCCL a send holds
// the communication stream until its peer receives. Sent alone, the 1F1B steady state would deadlock:
// stage s's send of activation i+1 waits for s+1 to receive it, while s+1 first sends gradient i and
// waits for s to receive that, behind the send. So each send is put off until this stage's next
// receive and the two go in one group (Megatron-LM's send_forward_recv_backward): the peer's matching
// group holds the matching pair, and every pair of neighbours then issues its groups in the same order.
// (MPI copies a send and returns, so there the grouping changes nothing.)
//
// The time a stage waits for its received data is its idle time, the measured bubble. A queued backend
// (NCCL) returns from a receive at once, so the runner first drains the stage's compute (busy time),
// then times the exchange until its data is there (idle time): the stage computes and communicates in
// turn, not overlapped.

struct PipelineComm {
    ProcessGroup pp;
    CommType type = COMM_FLOAT32;  // the boundary tensors' element type
    std::function<void()> drain;   // a queued backend: waits until this stage's queued work is done
    double wait_seconds = 0.0;     // time spent waiting for received data since the last reset
};

enum { PP_TAG_ACTIVATION = 1, PP_TAG_GRADIENT = 2 };

// A send put off until the next exchange (see above).
struct PipelineSend {
    const void* data = nullptr;
    int to_stage = -1, tag = 0;
};

// Issues the pending send (if any) and a receive into data from from_stage (if from_stage >= 0) as one
// group, and waits until the received data is there; the wait counts as idle.
inline void pp_exchange(PipelineComm* c, PipelineSend* pending, size_t n, void* data, int from_stage, int tag) {
    if (pending->to_stage < 0 && from_stage < 0) return;
    if (c->drain) c->drain();
    auto start = std::chrono::steady_clock::now();
    comm_group_start(c->pp);
    if (pending->to_stage >= 0) comm_send(c->pp, pending->data, n, c->type, pending->to_stage, pending->tag);
    if (from_stage >= 0) comm_recv(c->pp, data, n, c->type, from_stage, tag);
    comm_group_end(c->pp);
    comm_join(c->pp);
    if (c->drain) c->drain();
    c->wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    pending->to_stage = -1;
}

// Waits for this stage's sends to complete (end of a step's schedule).
inline void pp_finish_sends(PipelineComm* c) { comm_finish_sends(c->pp); }

// ----------------------------------------------------------------------------
// Running a schedule, model-free: the stage's model is reached through these hooks; the runner keeps
// the order of the schedule, moves the boundary tensors and measures the bubble.

struct PipelineStageHooks {
    size_t boundary_elements = 0;  // what crosses between stages per micro-batch: the (B, T, C) residual stream
    std::function<void(int micro)> select;     // makes micro-batch `micro`'s activations the current ones
    std::function<double(int micro)> forward;  // its forward; returns its mean loss on the last stage, else 0
    std::function<void(int micro)> backward;   // its backward
    // buffers of the current micro-batch (PipelineComm::type elements): the forward's input (received
    // from the previous stage) and output (sent to the next); the backward's d(loss)/d(output)
    // (received from the next stage) and d(loss)/d(input) (sent to the previous). An output must stay
    // unchanged until the next exchange has sent it (the micro-batch's own slot, or scratch that no
    // later hook writes before then).
    std::function<void*()> activation_in, activation_out, gradient_in, gradient_out;
};

struct PipelineStepResult {
    double loss_sum = 0.0;     // the sum of the micro-batches' mean losses (0 on a stage before the last)
    std::vector<float> idle;   // per stage: the share of the pipeline's span it was not computing
    std::string note;          // " | bubble 0.333 0.334 (formula 0.333)" for the step line
};

// One step's forwards and backwards of m micro-batches on this stage, in the order of `schedule`.
// Every stage of the PP group calls it. The measured bubble: a stage's time waiting for received data
// (or done early) as a share of the span of the slowest stage.
inline PipelineStepResult pipeline_run(PipelineComm* comm, const std::string& schedule, int m,
                                       const PipelineStageHooks& h) {
    const ProcessGroup& pp = comm->pp;
    bool first = pp.rank == 0, last = pp.rank == pp.size - 1;
    size_t n = h.boundary_elements;
    PipelineStepResult result;
    PipelineSend pending;
    comm->wait_seconds = 0.0;
    auto start = std::chrono::steady_clock::now();
    for (const PipelineOp& op : pp_schedule(schedule, pp.size, pp.rank, m)) {
        h.select(op.micro);
        if (op.forward) {
            pp_exchange(comm, &pending, n, first ? nullptr : h.activation_in(), first ? -1 : pp.rank - 1, PP_TAG_ACTIVATION);
            result.loss_sum += h.forward(op.micro);
            if (!last) pending = {h.activation_out(), pp.rank + 1, PP_TAG_ACTIVATION};
        } else {
            pp_exchange(comm, &pending, n, last ? nullptr : h.gradient_in(), last ? -1 : pp.rank + 1, PP_TAG_GRADIENT);
            h.backward(op.micro);
            if (!first) pending = {h.gradient_out(), pp.rank - 1, PP_TAG_GRADIENT};
        }
    }
    pp_exchange(comm, &pending, n, nullptr, -1, 0);
    pp_finish_sends(comm);
    double span_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int p = pp.size;
    std::vector<double> busy = all_gather_host_f64(pp, span_s - comm->wait_seconds, "the pipeline's timings");
    std::vector<double> span = all_gather_host_f64(pp, span_s, "the pipeline's timings");
    double longest = *std::max_element(span.begin(), span.end());
    result.idle.resize(p);
    result.note = " | bubble";
    for (int s = 0; s < p; s++) {
        result.idle[s] = (float)(1.0 - busy[s] / longest);
        result.note += " " + std::to_string(result.idle[s]).substr(0, 5);
    }
    result.note += " (formula " + std::to_string(pp_bubble_formula(p, m)).substr(0, 5) + ")";
    return result;
}

// One micro-batch's forward through the stages, no backward (evaluation). Returns its mean loss on the
// last stage, else 0.
inline double pipeline_forward_only(PipelineComm* comm, const PipelineStageHooks& h) {
    const ProcessGroup& pp = comm->pp;
    bool first = pp.rank == 0, last = pp.rank == pp.size - 1;
    PipelineSend pending;
    h.select(0);
    pp_exchange(comm, &pending, h.boundary_elements, first ? nullptr : h.activation_in(), first ? -1 : pp.rank - 1,
                PP_TAG_ACTIVATION);
    double loss = h.forward(0);
    if (!last) pending = {h.activation_out(), pp.rank + 1, PP_TAG_ACTIVATION};
    pp_exchange(comm, &pending, h.boundary_elements, nullptr, -1, 0);
    pp_finish_sends(comm);
    return loss;
}

// Every stage's vector to stage 0 (checkpoints): stage s's is size_of(s) long. Returns them there, in
// stage order; elsewhere empty vectors. Each travels through one buffer of the staging (comm.h).
template <typename SizeOf>
std::vector<std::vector<float>> pp_gather_vectors(const ProcessGroup& pp, const std::vector<float>& mine, SizeOf size_of,
                                                  const CommStaging& st) {
    std::vector<std::vector<float>> stages(pp.size);
    size_t largest = 0;
    for (int s = 0; s < pp.size; s++) largest = std::max(largest, (size_t)size_of(s));
    float* buffer = st.buffer(largest);
    if (pp.rank != 0) {
        st.put(buffer, mine.data(), mine.size());
        comm_send(pp, buffer, mine.size(), COMM_FLOAT32, 0, 0);
        comm_finish_sends(pp);
        st.wait("a checkpoint's stage vector, sent to stage 0");
    } else {
        stages[0] = mine;
        for (int s = 1; s < pp.size; s++) {
            stages[s].resize(size_of(s));
            comm_recv(pp, buffer, stages[s].size(), COMM_FLOAT32, s, 0);
            st.wait("a checkpoint's stage vector, from a later stage");
            st.get(stages[s].data(), buffer, stages[s].size());
        }
    }
    st.release();
    return stages;
}
