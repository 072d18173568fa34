// The CUDA trainer's side of the step breakdown (llmc/run/phase_timer.h): NVTX ranges, so that Nsight
// Systems shows each phase of a step on the timeline, and CUDA events for the phases whose work runs
// on the GPU after the host has moved on (the forward and backward are queued, not waited for).
//
// A GPU phase records an event before and after its work on the stream; once the host has waited for
// the stream (the trainer does so for every micro-step's loss), gpu_phases_collect adds the time
// between each pair to the phase. Events only observe the stream: the kernels and their order are
// those of an untimed run. Host phases that end in a wait for the GPU (the gradient norm, the update)
// use the host timer, with the same NVTX ranges through PhaseTimer's hooks.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include "../cuda_common.cuh"
#include "phase_timer.h"

inline void nvtx_phase_begin(const char* name) { nvtxRangePushA(name); }
inline void nvtx_phase_end() { nvtxRangePop(); }

struct GpuPhases {
    cudaEvent_t start[NUM_PHASES], stop[NUM_PHASES];
    bool recorded[NUM_PHASES] = {};
};

inline void gpu_phases_create(GpuPhases* g) {
    for (int p = 0; p < NUM_PHASES; p++) {
        cudaCheck(cudaEventCreate(&g->start[p]));
        cudaCheck(cudaEventCreate(&g->stop[p]));
    }
}

inline void gpu_phases_destroy(GpuPhases* g) {
    for (int p = 0; p < NUM_PHASES; p++) {
        cudaCheck(cudaEventDestroy(g->start[p]));
        cudaCheck(cudaEventDestroy(g->stop[p]));
    }
}

inline void gpu_phase_begin(GpuPhases* g, int phase, cudaStream_t stream) {
    nvtxRangePushA(phase_name(phase));
    cudaCheck(cudaEventRecord(g->start[phase], stream));
}

inline void gpu_phase_end(GpuPhases* g, int phase, cudaStream_t stream) {
    cudaCheck(cudaEventRecord(g->stop[phase], stream));
    g->recorded[phase] = true;
    nvtxRangePop();
}

// After the stream has been synchronized: adds each recorded phase's GPU time to `times`.
inline void gpu_phases_collect(GpuPhases* g, StepTimes* times) {
    for (int p = 0; p < NUM_PHASES; p++) {
        if (!g->recorded[p]) continue;
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, g->start[p], g->stop[p]));
        times->ms[p] += ms;
        g->recorded[p] = false;
    }
}
