// Prints the machine's fp32 FMA peak as llmc/run/cpu_peak.h measures it, for dev/bench_cpu.py to divide
// by (and for a reader to check their machine).
//
//   make build/cpu_peak && build/cpu_peak [threads]       (default: OMP_NUM_THREADS / all cores)
//   -> "fma_peak_gflops 195.2 threads 2"
#include <cstdio>
#include <cstdlib>

#include "../llmc/run/cpu_peak.h"

int main(int argc, char** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    if (argc > 2 || threads <= 0) {
        fprintf(stderr, "usage: %s [threads > 0]\n", argv[0]);
        return 2;
    }
    printf("fma_peak_gflops %.1f threads %d\n", cpu_fma_peak_flops(threads) / 1e9, threads);
    return 0;
}
