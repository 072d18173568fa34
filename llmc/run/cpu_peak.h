// The machine's fp32 peak, measured: what "X% of peak" (MFU) on the CPU is a fraction of.
//
// A core's peak is (FMA units) x (floats per vector) x 2 FLOPs per cycle: an AVX2 core with two FMA
// ports does 2 x 8 x 2 = 32 FLOPs per cycle. Instead of trusting a clock frequency (turbo, shared
// cloud cores), we run that instruction mix and time it: every OpenMP thread keeps 12 independent
// vector accumulators (enough to cover FMA's 4-5 cycle latency on two ports) busy with a = a * b + c
// for a fixed number of rounds, and its FLOPs are divided by its own CPU time (see below why not wall
// time); the threads' rates add up. Nothing is read from memory, so this is the arithmetic ceiling a
// matmul can approach, never pass. The best of a few repetitions is taken (the first wakes the cores up).
//
//   double peak = cpu_fma_peak_flops();   // FLOP/s with omp_get_max_threads() threads, ~0.1 s
#pragma once

#include <omp.h>

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#ifdef __FMA__
#include <immintrin.h>
#endif

// GCC/Clang vector of 8 floats: one AVX register with -mavx2 -mfma (-march=native); without AVX the
// compiler splits it, and the measured peak is honestly lower.
typedef float cpu_peak_v8 __attribute__((vector_size(32)));

// a * b + c as one fused instruction where the CPU has FMA (the compiler may not contract a * b + c
// under -std=c++17, which implies -ffp-contract=off).
inline cpu_peak_v8 cpu_peak_fma(cpu_peak_v8 a, cpu_peak_v8 b, cpu_peak_v8 c) {
#ifdef __FMA__
    return (cpu_peak_v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

// FLOPs done by one thread in `rounds` rounds of 12 vector FMAs; the sum is returned (and stored by the
// caller) so the compiler cannot drop the loop.
inline float cpu_peak_fma_rounds(int64_t rounds, float seed) {
    constexpr int K = 12;
    cpu_peak_v8 acc[K];
    for (int i = 0; i < K; i++) acc[i] = cpu_peak_v8{} + seed * (float)(i + 1);
    // |mul| < 1 and the addend keep every value bounded and normal: no overflow, no denormal slow path
    const cpu_peak_v8 mul = cpu_peak_v8{} + 0.999f, add = cpu_peak_v8{} + 0.001f;
    for (int64_t r = 0; r < rounds; r++) {
#pragma GCC unroll 12
        for (int i = 0; i < K; i++) acc[i] = cpu_peak_fma(acc[i], mul, add);
    }
    float sum = 0.0f;
    for (int i = 0; i < K; i++) {
        for (int j = 0; j < 8; j++) sum += acc[i][j];
    }
    return sum;
}

// Peak fp32 FLOP/s of `threads` threads (default: OpenMP's), best of `repeats` timings.
// Each thread times its own loop in CPU time (CLOCK_THREAD_CPUTIME_ID) and the rates are added: a
// moment when the OS runs two of the threads on one core (another process, or the kernel freeing the
// memory the trainer just gave back, holds the other) then costs nothing, where wall time would read
// half the peak. Two threads that truly share a core's FMA units (SMT siblings) still run at half
// speed each in CPU time, so that case reads right. More threads than the CPUs this process may run
// on cannot add FLOPs: they are counted as that many.
inline double cpu_fma_peak_flops(int threads = 0, int repeats = 8, int64_t rounds = 2000000) {
    if (threads <= 0) threads = omp_get_max_threads();
    int counted = threads;
#ifdef __linux__
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
        counted = std::min(threads, CPU_COUNT(&allowed));
    }
#endif
    const double flops_per_thread = (double)rounds * 12 * 8 * 2;
    std::vector<double> best(threads, 0.0);  // each thread's best rate
    volatile float sink = 0.0f;
    for (int rep = 0; rep < repeats; rep++) {
        float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            timespec t0, t1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
            total += cpu_peak_fma_rounds(rounds, 1e-3f * (float)(omp_get_thread_num() + 1));
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
            int t = omp_get_thread_num();
            if (s > 0 && flops_per_thread / s > best[t]) best[t] = flops_per_thread / s;
        }
        sink = sink + total;
    }
    (void)sink;
    // the `counted` slowest threads' rates: with more threads than CPUs the extra ones add nothing
    std::sort(best.begin(), best.end());
    double sum = 0.0;
    for (int t = 0; t < counted; t++) sum += best[t];
    return sum;
}
