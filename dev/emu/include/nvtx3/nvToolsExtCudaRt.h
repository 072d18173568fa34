// Stand-in for NVTX's naming of CUDA runtime objects (nvtx3/nvToolsExtCudaRt.h) under the emulator:
// programs written for the GPU (llm.c's trainer includes it) build unchanged; there is no profiler here.
#pragma once

#include "nvToolsExt.h"
#include "../cuda_runtime.h"

inline void nvtxNameCudaStreamA(cudaStream_t, const char*) {}
inline void nvtxNameCudaEventA(cudaEvent_t, const char*) {}
