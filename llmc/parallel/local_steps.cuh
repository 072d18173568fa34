// Local steps (-lh H) on the GPU: llmc/parallel/local_steps.h's scheme with its anchor and outer momentum
// in device memory, the synchronization as two element-wise kernels around the same all-reduce, and the
// same outer_element. The fp32 weights it moves are the master weights (the bf16 build's -w 1, which -lh
// needs: gpt2_plan_init), or the parameters themselves in the fp32 build; the floatX parameters are then
// rounded to nearest from them, the same on every process. The changes travel in the build's floatX, as
// its gradients do (bf16: half the CPU trainer's bytes; a change's rounding, 2^-9 of it, is far below a
// bf16 parameter's), in the gradient buffer, which the update has used and the next step clears.
#pragma once

#include <vector>

#include "../cuda_common.cuh"
#include "comm_nccl.cuh"
#include "local_steps.h"

struct LocalStepsGpu {
    LocalSteps scheme;  // every, nesterov (its host vectors stay empty)
    float* anchor = nullptr;
    float* momentum = nullptr;  // -lo 1
    size_t n = 0;
};

// Starts -lh (the note, the device state; the anchor = weights, n fp32 on the device) for changes sent as
// floatX; false without it.
inline bool local_steps_gpu_start(int every, int outer, const ProcessGroup& dp, const float* weights, size_t n,
                                  LocalStepsGpu* ls) {
    if (!local_steps_configure(every, outer, dp, n, &ls->scheme, sizeof(floatX))) return false;
    ls->n = n;
    cudaCheck(cudaMalloc(&ls->anchor, n * sizeof(float)));
    cudaCheck(cudaMemcpy(ls->anchor, weights, n * sizeof(float), cudaMemcpyDeviceToDevice));
    if (ls->scheme.nesterov) {
        cudaCheck(cudaMalloc(&ls->momentum, n * sizeof(float)));
        cudaCheck(cudaMemset(ls->momentum, 0, n * sizeof(float)));
    }
    return true;
}

inline void local_steps_gpu_free(LocalStepsGpu* ls) {
    cudaCheck(cudaFree(ls->anchor));
    cudaCheck(cudaFree(ls->momentum));
    ls->anchor = ls->momentum = nullptr;
}

template <typename T>
__global__ void local_steps_change_kernel(T* change, const float* weights, const float* anchor, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) change[i] = (T)(anchor[i] - weights[i]);
}

// change holds the all-reduced changes; params (null in the fp32 build without master weights, where the
// weights are the parameters) get the new weights rounded to nearest.
template <typename T>
__global__ void local_steps_outer_kernel(float* weights, T* params, const T* change, float* anchor, float* momentum, size_t n,
                                         float inv_processes) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float u = momentum ? momentum[i] : 0.0f;  // (a register: no pointer chosen at run time)
    float x = outer_element(anchor[i], (float)change[i], inv_processes, &u, momentum != nullptr);
    if (momentum) momentum[i] = u;
    anchor[i] = x;
    weights[i] = x;
    if (params) params[i] = (T)x;
}

// The synchronization (a collective of the data-parallel group, queued on the stream the group's
// collectives follow): weights (n fp32) become the outer step's; params, when not null, their floatX copy;
// change (n of T, `type` for the all-reduce) is scratch.
template <typename T>
void local_steps_gpu_sync(const ProcessGroup& dp, LocalStepsGpu* ls, float* weights, T* params, T* change, CommType type,
                          cudaStream_t stream) {
    const int threads = 256;
    const unsigned blocks = (unsigned)((ls->n + threads - 1) / threads);
    local_steps_change_kernel<T><<<blocks, threads, 0, stream>>>(change, weights, ls->anchor, ls->n);
    cudaCheck(cudaGetLastError());
    all_reduce(dp, change, ls->n, type, COMM_SUM);
    comm_join(dp);
    local_steps_outer_kernel<T><<<blocks, threads, 0, stream>>>(weights, params, change, ls->anchor, ls->momentum, ls->n,
                                                                1.0f / (float)dp.size);
    cudaCheck(cudaGetLastError());
}

// The end of step `step`'s update (last: the run's last step): the synchronization when it is due.
template <typename T>
void local_steps_gpu_after_update(const ProcessGroup& dp, LocalStepsGpu* ls, int step, bool last, float* weights, T* params,
                                  T* change, CommType type, cudaStream_t stream) {
    if (local_steps_sync_due(ls->scheme, step, last)) local_steps_gpu_sync(dp, ls, weights, params, change, type, stream);
}

// The checkpoint section: params (this process's parameters as fp32 host values), the anchor and the
// momentum copied from the device.
inline StateSection local_steps_gpu_section(const LocalStepsGpu& ls, const std::vector<float>& params) {
    std::vector<float> anchor(ls.n), momentum(ls.momentum ? ls.n : 0);
    cudaCheck(cudaMemcpy(anchor.data(), ls.anchor, ls.n * sizeof(float), cudaMemcpyDeviceToHost));
    if (ls.momentum) cudaCheck(cudaMemcpy(momentum.data(), ls.momentum, ls.n * sizeof(float), cudaMemcpyDeviceToHost));
    return local_steps_section_of(params.data(), anchor.data(), ls.momentum ? momentum.data() : nullptr, ls.n);
}

// The restore: this process's parameters (fp32 host values, for the trainer to upload) from its section,
// the anchor and momentum to the device; from a checkpoint without -lh the anchor is `weights` (device)
// and *params stays empty.
inline void local_steps_gpu_restore(LocalStepsGpu* ls, const std::vector<StateSection>& sections, const float* weights,
                                    std::vector<float>* params) {
    std::vector<float> anchor, momentum;
    if (!local_steps_section_read(sections, ls->n, params, &anchor, &momentum)) {
        params->clear();
        cudaCheck(cudaMemcpy(ls->anchor, weights, ls->n * sizeof(float), cudaMemcpyDeviceToDevice));
        return;
    }
    cudaCheck(cudaMemcpy(ls->anchor, anchor.data(), ls->n * sizeof(float), cudaMemcpyHostToDevice));
    if (ls->momentum) cudaCheck(cudaMemcpy(ls->momentum, momentum.data(), ls->n * sizeof(float), cudaMemcpyHostToDevice));
}
