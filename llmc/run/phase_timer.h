// Where a training step's time goes: milliseconds per phase, achieved FLOP/s and MFU, for the step
// line and metrics.jsonl of both trainers.
//
//   data        the data loader's next batch (reading tokens from the shard files)
//   forward     the forward passes of the step's micro-steps (and the loss)
//   backward    their backward passes (with -r, the recomputation inside them)
//   comm        combining the gradients of all processes, and their global norm
//   optimizer   the AdamW update (and with ZeRO-1, gathering the updated shards)
//   checkpoint  writing a checkpoint before the step (0 on most steps; not part of the step's ms)
//
// The CPU trainer times phases with the host clock, which is the time the work takes, since every
// function returns when its work is done. The CUDA trainer's kernels run asynchronously, so it times
// the GPU phases with CUDA events recorded on its stream (llmc/run/phase_events.cuh) and passes the
// elapsed times in; neither changes what is computed or in which order.
//
// MFU (model FLOPs utilization) = the step's model FLOPs (flops_per_token in llmc/gpt2_config.h; the
// recomputation of -r is not counted, it is overhead) / step time / the peak FLOP/s of the hardware.
#pragma once

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "logger.h"

// comm: the collectives that complete a step's gradients (and its loss's sum); gradnorm: the global
// norm (its sums over processes included), which a process alone computes too
enum StepPhase { PHASE_DATA, PHASE_FORWARD, PHASE_BACKWARD, PHASE_COMM, PHASE_GRADNORM, PHASE_OPTIMIZER, PHASE_CHECKPOINT, NUM_PHASES };

// Short names, for the step line and the metrics.jsonl keys ("ms_forward", ...).
inline const char* phase_name(int phase) {
    static const char* names[NUM_PHASES] = {"data", "forward", "backward", "comm", "gradnorm", "optimizer", "checkpoint"};
    return names[phase];
}

struct StepTimes {
    double ms[NUM_PHASES] = {};
    // a pipeline step: its schedule's forwards and backwards interleave and are timed as one span, under
    // forward; the step line says "forward+backward", metrics.jsonl has ms_backward null
    bool interleaved = false;
};

// A host stopwatch that adds each timed interval to its phase. on_begin/on_end, when set, are called
// at each phase's start and end (the CUDA trainer marks NVTX ranges with them).
struct PhaseTimer {
    StepTimes times;
    int phase = -1;
    std::chrono::steady_clock::time_point started;
    void (*on_begin)(const char* name) = nullptr;
    void (*on_end)() = nullptr;
};

inline void phase_begin(PhaseTimer* timer, int phase) {
    timer->phase = phase;
    if (timer->on_begin) timer->on_begin(phase_name(phase));
    timer->started = std::chrono::steady_clock::now();
}

inline void phase_end(PhaseTimer* timer) {
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - timer->started).count();
    timer->times.ms[timer->phase] += ms;
    if (timer->on_end) timer->on_end();
    timer->phase = -1;
}

// Starts a new step's record.
inline void phase_reset(PhaseTimer* timer) { timer->times = StepTimes(); }

// Achieved FLOP/s and the fraction of the peak (0 when the peak is unknown).
struct StepThroughput {
    double flops_per_s = 0.0;
    double mfu = 0.0;
};

inline StepThroughput step_throughput(double flops_per_step, double step_ms, double peak_flops) {
    StepThroughput t;
    t.flops_per_s = step_ms > 0.0 ? flops_per_step / (step_ms / 1000.0) : 0.0;
    t.mfu = peak_flops > 0.0 ? t.flops_per_s / peak_flops : 0.0;
    return t;
}

// The peak a step's MFU is of, after a step that ran at `achieved` FLOP/s. No step can beat the machine's
// peak, so one above the measured peak shows that measurement was low (a core busy or throttled while it
// ran, as on a shared VM): `measure` takes it again, and the larger of that and the step's own rate is
// the peak from then on. A step below the peak, or a peak given by hand (`measure` empty: -pk), leaves
// it as it was.
inline double peak_after_step(double peak, double achieved, const std::function<double()>& measure) {
    if (!measure || !(peak > 0.0) || achieved <= peak) return peak;
    return std::max(measure(), achieved);
}

// What the step line appends after tokens/s:
//   " | MFU 55.1% | 123.4 GFLOP/s | data 0.1 forward 512.3 backward 1001.2 comm 0.4 gradnorm 3.1 optimizer 40.2 checkpoint 0.0 ms"
// (a pipeline step: "forward+backward 1513.5" in place of the two)
inline std::string step_breakdown_text(const StepTimes& times, const StepThroughput& t, double peak_flops) {
    char text[512];
    int at = 0;
    if (peak_flops > 0.0) {
        at += snprintf(text + at, sizeof(text) - at, " | MFU %.1f%%", 100.0 * t.mfu);
    } else {
        at += snprintf(text + at, sizeof(text) - at, " | MFU n/a");
    }
    at += snprintf(text + at, sizeof(text) - at, " | %.1f GFLOP/s |", t.flops_per_s / 1e9);
    for (int p = 0; p < NUM_PHASES; p++) {
        if (times.interleaved && p == PHASE_BACKWARD) continue;
        const char* name = times.interleaved && p == PHASE_FORWARD ? "forward+backward" : phase_name(p);
        at += snprintf(text + at, sizeof(text) - at, " %s %.1f", name, times.ms[p]);
    }
    snprintf(text + at, sizeof(text) - at, " ms");
    return text;
}

// The same as metrics.jsonl fields, to append to a train line (logger_log_train's `extra`):
//   , "ms_data": 0.1, ..., "ms_checkpoint": 0, "flops_per_s": 1.23e11, "mfu": 0.551   (mfu null if unknown)
inline std::string step_breakdown_json(const StepTimes& times, const StepThroughput& t, double peak_flops) {
    std::string json;
    char field[96];
    for (int p = 0; p < NUM_PHASES; p++) {
        if (times.interleaved && p == PHASE_BACKWARD) {
            snprintf(field, sizeof(field), ", \"ms_%s\": null", phase_name(p));
        } else {
            snprintf(field, sizeof(field), ", \"ms_%s\": %.3f", phase_name(p), times.ms[p]);
        }
        json += field;
    }
    json += ", \"flops_per_s\": " + json_number(t.flops_per_s);
    json += ", \"mfu\": " + (peak_flops > 0.0 ? json_number(t.mfu) : std::string("null"));
    return json;
}
