// Optimizer offload (-oo 1), ZeRO-Offload's idea on one process: AdamW's fp32 state (m, v and the
// master weights: 12 of the 16 bytes a parameter costs in mixed precision) lives in pinned host
// memory, and the update runs on the CPU. Per step the GPU sends the gradients (2 bytes a parameter
// in bf16) and receives the new parameters (2 bytes); the device keeps parameters, gradients and
// activations only. With ZeRO (-z 1..3) a process offloads its shard, the range [opt_begin, opt_end)
// of the flat vector that its AdamW updates anyway.
//
// One step, for n elements cut into chunks (the copies of one chunk overlap the arithmetic of another):
//
//   model stream  ... backward, gradient norm ─ready┐                        ┌─wait done─ next forward
//   d2h stream                     grads chunk 0, 1, 2, ... (arrived[c])     │
//   host (OpenMP)                        AdamW chunk 0, 1, 2, ...            │
//   h2d stream                                  params chunk 0, 1, 2, ... ─done┘
//
// The arithmetic is adamw_element (llmc/adamw.cuh), the GPU kernel's own body, and the rounding seeds
// are the kernel's, so -oo 1 gives the same bits as -oo 0 (test/gpu/test_gpt2.cu, TrainOffload).
// Without master weights (-w 0, the fp32 build) the old parameters travel to the host too.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "adamw.cuh"
#include "cuda_common.cuh"

// One tensor's part of the offloaded range: elements [begin, end) of it, counted from the range's
// start, updated with settings s (its weight decay, its rounding seed, which counts from begin).
struct OffloadPart {
    size_t begin, end;
    AdamWSettings s;
};

struct OptimizerOffload {
    size_t n = 0;      // elements offloaded: this process's [opt_begin, opt_end)
    size_t chunk = 0;  // elements per copy
    floatX* grads = nullptr;   // (n) pinned: the gradients, from the device
    floatX* params = nullptr;  // (n) pinned: the new parameters (first the old ones, without master weights)
    cudaStream_t d2h = nullptr, h2d = nullptr;
    cudaEvent_t ready = nullptr, done = nullptr;
    std::vector<cudaEvent_t> arrived;  // per chunk: its gradients (and old parameters) are on the host
    // time spent on the host per step, summed: waiting for the copies, and the arithmetic
    double wait_seconds = 0, update_seconds = 0;
    int steps = 0;
};

// Chunks of at least 2^20 elements (2 MiB in bf16: long enough for a copy to reach PCIe's speed),
// at most 64 of them.
inline void offload_init(OptimizerOffload* off, size_t n) {
    off->n = n;
    size_t chunk = std::max<size_t>(1 << 20, (n + 63) / 64);
    off->chunk = (chunk + 7) / 8 * 8;
    cudaCheck(cudaMallocHost(&off->grads, std::max<size_t>(n, 1) * sizeof(floatX)));
    cudaCheck(cudaMallocHost(&off->params, std::max<size_t>(n, 1) * sizeof(floatX)));
    cudaCheck(cudaStreamCreate(&off->d2h));
    cudaCheck(cudaStreamCreate(&off->h2d));
    cudaCheck(cudaEventCreateWithFlags(&off->ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&off->done, cudaEventDisableTiming));
    off->arrived.resize(ceil_div(n, off->chunk));
    for (cudaEvent_t& e : off->arrived) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

inline void offload_free(OptimizerOffload* off) {
    if (off->d2h == nullptr) return;
    cudaCheck(cudaFreeHost(off->grads));
    cudaCheck(cudaFreeHost(off->params));
    for (cudaEvent_t e : off->arrived) cudaCheck(cudaEventDestroy(e));
    cudaCheck(cudaEventDestroy(off->ready));
    cudaCheck(cudaEventDestroy(off->done));
    cudaCheck(cudaStreamDestroy(off->d2h));
    cudaCheck(cudaStreamDestroy(off->h2d));
    *off = OptimizerOffload();
}

// After the run: where the host updates spent their time (nothing if none ran).
inline void offload_print_report(const OptimizerOffload& off) {
    if (off.steps == 0) return;
    printf("offload: %d AdamW updates on the host, %.2f ms each: %.2f ms waiting for the gradients' copies, %.2f ms "
           "of arithmetic (%.2f ns a parameter)\n", off.steps, 1e3 * (off.wait_seconds + off.update_seconds) / off.steps,
           1e3 * off.wait_seconds / off.steps, 1e3 * off.update_seconds / off.steps,
           1e9 * off.update_seconds / off.steps / (double)std::max<size_t>(off.n, 1));
}

// Host memory the offload pins for n elements: m, v (and master) in fp32, the two floatX staging arrays.
inline size_t offload_host_bytes(size_t n, bool master_weights) {
    return n * ((master_weights ? 3 : 2) * sizeof(float) + 2 * sizeof(floatX));
}

// AdamW on element k of one tensor's part, on the host: adamw_element, the GPU kernel's own body, and
// its rounding seed counted from the part's start
template <bool MASTER>
__attribute__((always_inline)) inline void offload_update_element(floatX* params, const floatX* grads, float* m,
                                                                  float* v, float* master, size_t k,
                                                                  const OffloadPart& part, float bias_correction1,
                                                                  float bias_correction2) {
    const AdamWSettings& s = part.s;
    float p = MASTER ? master[k] : (float)params[k];
    p = adamw_element(p, (float)grads[k], &m[k], &v[k], s.lr, s.beta1, s.beta2, bias_correction1, bias_correction2,
                      s.eps, s.weight_decay, s.grad_scale);
    if (MASTER) master[k] = p;
    stochastic_round(p, &params[k], hash_u32((uint32_t)(k - part.begin), s.seed));
}

// Elements [a, b) of one tensor's part: one loop per case of master weights, so the compiler has no
// branch in it and vectorizes it (the OpenMP threads split the range). The loop is compiled twice on
// x86-64: for the build's own target and, chosen at run time where the CPU has them, for AVX2 with FMA
// (x86-64-v3). The binaries for a GPU machine are built for x86-64-v2 (dev/gpu/prepare_gpu_run.sh:
// SSE4.2, no FMA), where adamw_element's three fmaf are library calls and the loop stays scalar: -oo 1's
// host update took 154 ms a step for GPT-2 124M on an H200 machine's 16 cores (doc/gpu_results.md).
// The AVX2 loop is 6x as fast on this 2-core machine (make bench-offload prints both, measured in the
// same run). Same bits: fmaf rounds once whether a library routine or an instruction computes it, and
// division and sqrt are IEEE in both (bench-offload checks).
#define OFFLOAD_UPDATE_LOOP(MASTER_)                                                                            \
    float bias_correction1, bias_correction2;                                                                  \
    adamw_bias_corrections(part.s, &bias_correction1, &bias_correction2);                                      \
    _Pragma("omp parallel for simd schedule(static)") for (size_t k = a; k < b; k++) {                         \
        offload_update_element<MASTER_>(params, grads, m, v, master, k, part, bias_correction1, bias_correction2); \
    }

template <bool MASTER>
void offload_update_part_portable(floatX* params, const floatX* grads, float* m, float* v, float* master, size_t a,
                                  size_t b, const OffloadPart& part) {
    OFFLOAD_UPDATE_LOOP(MASTER)
}

#if defined(__x86_64__) && defined(__GNUC__)
#define OFFLOAD_HAS_AVX2_LOOP 1
template <bool MASTER>
__attribute__((target("avx2,fma"))) void offload_update_part_avx2(floatX* params, const floatX* grads, float* m,
                                                                  float* v, float* master, size_t a, size_t b,
                                                                  const OffloadPart& part) {
    OFFLOAD_UPDATE_LOOP(MASTER)
}
#endif
#undef OFFLOAD_UPDATE_LOOP

// true where the AVX2 loop exists and this CPU runs it
inline bool offload_uses_avx2() {
#if defined(OFFLOAD_HAS_AVX2_LOOP)
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
#else
    return false;
#endif
}

template <bool MASTER>
void offload_update_part(floatX* params, const floatX* grads, float* m, float* v, float* master, size_t a, size_t b,
                         const OffloadPart& part) {
#if defined(OFFLOAD_HAS_AVX2_LOOP)
    if (offload_uses_avx2()) return offload_update_part_avx2<MASTER>(params, grads, m, v, master, a, b, part);
#endif
    offload_update_part_portable<MASTER>(params, grads, m, v, master, a, b, part);
}

// AdamW on elements [lo, hi) of the range (one chunk), on the host: m, v, master (or nullptr) are the
// range's host arrays.
inline void offload_update_chunk(OptimizerOffload* off, const std::vector<OffloadPart>& parts, float* m, float* v,
                                 float* master, size_t lo, size_t hi) {
    for (const OffloadPart& part : parts) {
        size_t a = std::max(lo, part.begin), b = std::min(hi, part.end);
        if (a >= b) continue;
        if (master != nullptr) {
            offload_update_part<true>(off->params, off->grads, m, v, master, a, b, part);
        } else {
            offload_update_part<false>(off->params, off->grads, m, v, master, a, b, part);
        }
    }
}

// One AdamW step of the offloaded range: device_grads and device_params point at its first element on
// the device. Returns once the host is done; the model's stream waits for the last parameters to
// arrive (no host synchronization with later work).
inline void offload_adamw_step(OptimizerOffload* off, const std::vector<OffloadPart>& parts, floatX* device_params,
                               const floatX* device_grads, float* m, float* v, float* master, cudaStream_t stream) {
    using clock = std::chrono::steady_clock;
    const size_t X = sizeof(floatX);
    cudaCheck(cudaEventRecord(off->ready, stream));  // the gradients are final (reduced, norm taken)
    cudaCheck(cudaStreamWaitEvent(off->d2h, off->ready, 0));
    for (size_t c = 0; c < off->arrived.size(); c++) {
        size_t lo = c * off->chunk, count = std::min(off->n, lo + off->chunk) - lo;
        cudaCheck(cudaMemcpyAsync(off->grads + lo, device_grads + lo, count * X, cudaMemcpyDeviceToHost, off->d2h));
        if (master == nullptr) {
            cudaCheck(cudaMemcpyAsync(off->params + lo, device_params + lo, count * X, cudaMemcpyDeviceToHost, off->d2h));
        }
        cudaCheck(cudaEventRecord(off->arrived[c], off->d2h));
    }
    for (size_t c = 0; c < off->arrived.size(); c++) {
        size_t lo = c * off->chunk, hi = std::min(off->n, lo + off->chunk);
        clock::time_point t0 = clock::now();
        cudaCheck(cudaEventSynchronize(off->arrived[c]));
        clock::time_point t1 = clock::now();
        offload_update_chunk(off, parts, m, v, master, lo, hi);
        off->wait_seconds += std::chrono::duration<double>(t1 - t0).count();
        off->update_seconds += std::chrono::duration<double>(clock::now() - t1).count();
        cudaCheck(cudaMemcpyAsync(device_params + lo, off->params + lo, (hi - lo) * X, cudaMemcpyHostToDevice, off->h2d));
    }
    cudaCheck(cudaEventRecord(off->done, off->h2d));
    cudaCheck(cudaStreamWaitEvent(stream, off->done, 0));
    off->steps++;
}
