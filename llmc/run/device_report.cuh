// The CUDA trainer's start-up line for its device: the GPU, the data-parallel start-up, the settings, and
// the device's dense BF16 tensor-core peak for MFU (a run-loop concern: llmc/run/phase_timer.h divides by it).
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "../cuda_common.cuh"
#include "../parallel/gpu_start.cuh"
#include "args.h"

// Dense BF16 tensor-core peak of the device, for MFU; 0 when the model is not in the table.
inline double bf16_peak_flops(const cudaDeviceProp& prop) {
    struct Peak { const char* name; double tflops; };
    static const Peak peaks[] = {{"H200", 989.0}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.0},
                                 {"H800", 989.0}, {"A100", 312.0},      {"A800", 312.0},     {"L40S", 362.0},
                                 {"L40", 181.0},  {"L4", 121.0},   {"A10G", 70.0},       {"A10", 125.0},      {"RTX 4090", 165.0},
                                 {"RTX 3090", 71.0}};
    for (const Peak& p : peaks) {
        if (strstr(prop.name, p.name)) return p.tflops * 1e12;
    }
    return 0.0;
}

// The GPU's line at start-up; returns its peak FLOP/s for MFU (-pk, or the table's; 0 if unknown).
inline double describe_device(const DataParallel& dp, const TrainArgs& args) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dp.device));
    double peak_flops = args.peak_gflops > 0 ? args.peak_gflops * 1e9 : bf16_peak_flops(prop);
    printf("train_gpt2cu (%s, CUDA) on %s (sm_%d%d, %d SMs, %.1f GiB)\n", PRECISION_NAME, prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    if (dp.nccl) {
        int version = 0;
        ncclGetVersion(&version);
        printf("data parallel: %d process(es) started by %s, one GPU each (NCCL %d), ZeRO stage -z %d, timeout -pt %g s\n",
               dp.size, launch_method_name(dp.method), version, args.zero_stage, dp.timeout_s);
    }
    printf("settings: recompute -r %s, master weights -w %d%s, GELU fusion -ge %d, bias gradients in the matmul -bg %d, "
           "flash attention -fa %d%s\n",
           args.recompute == RECOMPUTE_AUTO ? "auto" : std::to_string(args.recompute).c_str(), args.master_weights, std::is_same<floatX, float>::value ? " (fp32 build: not needed)" : "",
           args.gelu_fusion, args.bias_grad_epilogue, args.flash_attention, FLASH_ATTENTION_AVAILABLE ? "" : " (this build: cuBLAS path)");
    return peak_flops;
}
