// The CPU side of the optimizer offload (-oo 1, llmc/optimizer_offload.cuh), timed on this machine:
// AdamW over N parameters with bf16 gradients in, bf16 parameters out (stochastically rounded) and fp32
// m, v and master weights, as the trainer runs it each step, beside the peer measured in the same run:
// the CPU trainer's fp32 AdamW (llmc/adamw.h), which moves 16 bytes a parameter where the offload moves
// 28 (grad 2, m, v, master 4 each in and out, param 2). Host code only: it runs without a GPU.
// On x86-64 the offload's loop exists twice (llmc/optimizer_offload.cuh): for the build's target and
// for AVX2 with FMA, taken at run time where the CPU has them; both are timed, and their results must
// have the same bits. Built as for a GPU machine (x86-64-v2, dev/gpu/prepare_gpu_run.sh) the first is
// the loop those binaries would run without the second.
//
//   make bench-offload                        N = 124,475,904 (GPT-2 124M), all OpenMP threads
//   make bench-offload CPU_ARCH=-march=x86-64-v2      the build target of the GPU machines' binaries
//   OMP_NUM_THREADS=1 ./build/bench_offload_adamw 10000000
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../llmc/adamw.h"
#include "../llmc/cuda_common.cuh"
#include "../llmc/optimizer_offload.cuh"

template <typename F>
double best_seconds(int repeats, F&& f) {
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

int main(int argc, char** argv) {
    size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 124475904;
    std::vector<floatX> grads(n), params(n);
    std::vector<float> m(n), v(n), master(n), grads32(n), params32(n);
    uint64_t state = 1;
    for (size_t i = 0; i < n; i++) {  // values of the trainer's scale
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)(state >> 40) / (float)(1 << 24) - 0.5f;
        master[i] = params32[i] = u;
        params[i] = (floatX)u;
        grads32[i] = 0.01f * u;
        grads[i] = (floatX)grads32[i];
        m[i] = 0.001f * u;
        v[i] = 1e-5f * u * u;
    }
    OptimizerOffload off;  // only the host arrays: nothing here touches a GPU
    off.n = n;
    off.grads = grads.data();
    off.params = params.data();
    AdamWHyper hyper;
    AdamWSettings s{1e-4f, hyper.beta1, hyper.beta2, hyper.eps, 0.1f, 1.0f, 10, 1234u};
    std::vector<OffloadPart> parts = {{0, n, s}};
    const int repeats = 5;
    // the build target's loop alone, from a copy of the state, then what the trainer runs (the AVX2
    // loop where this CPU has it), from the same state: one step of each must give the same bits
    std::vector<floatX> params_portable = params;
    std::vector<float> m_portable = m, v_portable = v, master_portable = master;
    offload_update_part_portable<true>(params_portable.data(), grads.data(), m_portable.data(), v_portable.data(),
                                       master_portable.data(), 0, n, parts[0]);
    offload_update_chunk(&off, parts, m.data(), v.data(), master.data(), 0, n);
    bool same = memcmp(params.data(), params_portable.data(), n * sizeof(floatX)) == 0 &&
                memcmp(m.data(), m_portable.data(), n * sizeof(float)) == 0 &&
                memcmp(v.data(), v_portable.data(), n * sizeof(float)) == 0 &&
                memcmp(master.data(), master_portable.data(), n * sizeof(float)) == 0;
    double portable = best_seconds(repeats, [&] {
        offload_update_part_portable<true>(params_portable.data(), grads.data(), m_portable.data(), v_portable.data(),
                                           master_portable.data(), 0, n, parts[0]);
    });
    double offload = best_seconds(repeats, [&] { offload_update_chunk(&off, parts, m.data(), v.data(), master.data(), 0, n); });
    double reference = best_seconds(repeats, [&] {
        adamw_update(params32.data(), grads32.data(), m.data(), v.data(), n, hyper, 1e-4f, 0.1f, 1.0f, 10);
    });
    printf("offloaded AdamW on the host, %zu parameters, %d OpenMP threads (best of %d):\n", n, omp_get_max_threads(), repeats);
    printf("  offload (bf16 in/out, fp32 m, v, master; llmc/optimizer_offload.cuh)  %8.1f ms  %6.2f ns/param  %6.1f GB/s  (%s loop)\n",
           1e3 * offload, 1e9 * offload / n, 28.0 * n / offload / 1e9, offload_uses_avx2() ? "AVX2" : "build target's");
    printf("  the offload's loop for the build target alone                          %8.1f ms  %6.2f ns/param  %6.1f GB/s\n",
           1e3 * portable, 1e9 * portable / n, 28.0 * n / portable / 1e9);
    printf("  peer: the CPU trainer's fp32 AdamW (llmc/adamw.h)                     %8.1f ms  %6.2f ns/param  %6.1f GB/s\n",
           1e3 * reference, 1e9 * reference / n, 16.0 * n / reference / 1e9);
    printf("ratio: offload / peer time %.2f (bytes moved: 28 / 16 = 1.75)\n", offload / reference);
    printf("ratio: build target's loop / offload time %.2f; the two loops' results: %s\n", portable / offload,
           same ? "the same bits" : "DIFFERENT BITS");
    return same ? 0 : 1;
}
