// Included before every CUDA source compiled for the emulator (g++ -include dev/emu/prelude.h):
// CUDA's declaration specifiers as plain C++, and the emulated runtime.
//
// __shared__ becomes `static thread_local`: one copy per host thread, and a host thread runs the
// fibers of one block at a time (exec.cpp), so that copy is the block's shared memory. cu2cpp.sh
// renames it and makes `name` a reference to it (EMU_SHARED_VARIABLE, include/emu/kernel.h), filled
// with 0xFF bytes when a block first reaches the declaration: no block sees zeros or the previous
// block's values. (The race checker, EMU_TSAN, puts the block's copy in memory it maps afresh for
// every block.) `extern __shared__ T name[];` (dynamic shared memory) is rewritten by cu2cpp.sh into a
// pointer to the block's dynamic buffer, filled with 0xFF bytes for every block.
#pragma once

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __grid_constant__
// (no __noinline__: libstdc++ spells GCC's attribute that way)

#include <math.h>
#include <cmath>
#include <cstdio>

#include <cuda_runtime.h>
#include <cuda_bf16.h>

// the tensor-core primitives that llmc/mma.cuh declares only for the GPU (ldmatrix, mma.sync, cp.async)
#include "mma_emu.h"
// and Hopper's warpgroup matrix multiply, which llmc/wgmma.cuh declares only for the GPU
#include "wgmma_emu.h"
