// HOST_DEVICE marks a function that both trainers call: nvcc compiles it for the host and for the GPU
// kernels, g++ (the CPU trainer) sees a plain inline function. The element functions of the optimizers
// (adamw.h, adamw8.h, muon_hyper.h) and of the data-parallel schemes (parallel/grad_compression.h,
// parallel/local_steps.h) are written once this way, so the two trainers compute the same bits.
#pragma once

#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif
