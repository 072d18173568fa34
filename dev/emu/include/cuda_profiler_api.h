// Stand-in for the CUDA toolkit's profiler control under the emulator: no profiler to start or stop.
#pragma once

#include "cuda_runtime.h"

inline cudaError_t cudaProfilerStart() { return cudaSuccess; }
inline cudaError_t cudaProfilerStop() { return cudaSuccess; }
