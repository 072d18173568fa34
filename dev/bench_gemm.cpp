// Benchmark (not a test): llmc/gemm.h's gemm_accumulate against OpenBLAS's cblas_sgemm on the
// matrix products of a GPT-2 d12 step, and both against the machine's measured FMA peak.
//
//   make bench-gemm                      (needs libopenblas-dev: scripts/install_deps.sh --bench)
//   build/bench_gemm [--bt 256,2048] [--threads 2] [--quick]
//
// The three products of a Linear layer (llmc/matmul.h) at two layers, for B*T = 256 and 2048 rows:
//   forward  out (BT,OC) = inp (BT,C) · W(OC,C)ᵀ      sgemm(NoTrans, Trans)
//   dinp     dinp (BT,C) += dout (BT,OC) · W(OC,C)    sgemm(NoTrans, NoTrans)
//   dW       dW (OC,C) += dout (BT,OC)ᵀ · inp (BT,C)  sgemm(Trans, NoTrans)
// for the MLP's fc layer (C=768 -> OC=3072; the other Linears of a block have the same shapes up to
// OC) and the LM head (768 -> 50304, which dominates the step at small BT).
//
// Two measurements, each A/B interleaved (ours, OpenBLAS, ours, ...) in the same process so that a
// change of machine load hits both, keeping the best of a few repetitions:
//   1 thread:  per-thread CPU time (CLOCK_THREAD_CPUTIME_ID), against a one-thread FMA peak timed
//              the same way. CPU time does not count the time another process held the core, so the
//              fraction of peak survives a shared machine.
//   N threads: wall time, against llmc/run/cpu_peak.h's N-thread peak (the threads' rates in CPU time,
//              added). Meaningful on a quiet machine only.
// The ratios (ours / OpenBLAS in GFLOP/s, fraction of peak) are what to read; `uptime` goes next to
// any figure quoted.
#include <cblas.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../llmc/run/cpu_peak.h"
#include "../llmc/gemm.h"

extern "C" void openblas_set_num_threads(int);

static double thread_cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The one-thread peak in thread CPU time: cpu_peak.h's FMA loop on the calling thread, best of 5.
static double one_thread_peak_cpu_time() {
    const int64_t rounds = 20000000;
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = thread_cpu_seconds();
        sink = sink + cpu_peak_fma_rounds(rounds, 1e-3f);
        double s = thread_cpu_seconds() - t0;
        best = std::max(best, (double)rounds * 12 * 8 * 2 / s);
    }
    return best;
}

enum class Product { Forward, Dinp, Dweight };

struct Case {
    const char* layer;
    Product product;
    int BT, C, OC;
};

// Operands of one Linear layer, filled with uniform [-1, 1) values.
struct Operands {
    std::vector<float> inp, weight, dout, out;  // (BT,C) (OC,C) (BT,OC) and the product's output
};

static void fill(std::vector<float>& v, size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    v.resize(n);
    for (float& x : v) x = dist(rng);
}

static int out_rows(const Case& c) { return c.product == Product::Dweight ? c.OC : c.BT; }
static int out_cols(const Case& c) { return c.product == Product::Forward ? c.OC : c.C; }

static void run_ours(const Case& c, Operands& o) {
    size_t C = c.C, OC = c.OC;
    switch (c.product) {
        case Product::Forward:
            gemm_accumulate(o.out.data(), OC, MatrixView<float>{o.inp.data(), C, 1}, MatrixView<float>{o.weight.data(), 1, C},
                            c.BT, c.OC, c.C);
            break;
        case Product::Dinp:
            gemm_accumulate(o.out.data(), C, MatrixView<float>{o.dout.data(), OC, 1}, MatrixView<float>{o.weight.data(), C, 1},
                            c.BT, c.C, c.OC);
            break;
        case Product::Dweight:
            gemm_accumulate(o.out.data(), C, MatrixView<float>{o.dout.data(), 1, OC}, MatrixView<float>{o.inp.data(), C, 1},
                            c.OC, c.C, c.BT);
            break;
    }
}

static void run_openblas(const Case& c, Operands& o) {
    switch (c.product) {
        case Product::Forward:
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.BT, c.OC, c.C, 1.0f, o.inp.data(), c.C, o.weight.data(),
                        c.C, 1.0f, o.out.data(), c.OC);
            break;
        case Product::Dinp:
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c.BT, c.C, c.OC, 1.0f, o.dout.data(), c.OC,
                        o.weight.data(), c.C, 1.0f, o.out.data(), c.C);
            break;
        case Product::Dweight:
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c.OC, c.C, c.BT, 1.0f, o.dout.data(), c.OC, o.inp.data(),
                        c.C, 1.0f, o.out.data(), c.C);
            break;
    }
}

// Largest |ours - OpenBLAS| relative to the largest |OpenBLAS| element, from a zeroed output: a
// check that both computed the same product (fp32 summation order differs, so ~1e-6, not 0).
static double relative_difference(const Case& c, Operands& o) {
    size_t n = (size_t)out_rows(c) * out_cols(c);
    std::fill(o.out.begin(), o.out.end(), 0.0f);
    run_ours(c, o);
    std::vector<float> ours = o.out;
    std::fill(o.out.begin(), o.out.end(), 0.0f);
    run_openblas(c, o);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = std::max(diff, (double)std::fabs(ours[i] - o.out[i]));
        scale = std::max(scale, (double)std::fabs(o.out[i]));
    }
    return diff / scale;
}

// Best time of `reps` interleaved runs of each; `cpu_time` picks the clock.
static void time_pair(const Case& c, Operands& o, int reps, bool cpu_time, double* ours_s, double* blas_s) {
    auto now = cpu_time ? thread_cpu_seconds : wall_seconds;
    *ours_s = *blas_s = 1e30;
    run_ours(c, o);  // warm-up: page faults, packing buffers, thread start
    run_openblas(c, o);
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now();
        run_ours(c, o);
        *ours_s = std::min(*ours_s, now() - t0);
        // OpenBLAS's and OpenMP's worker threads spin for a while after a call; let them go to sleep
        // so that one library's idle threads do not steal the other's cores
        if (!cpu_time) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        t0 = now();
        run_openblas(c, o);
        *blas_s = std::min(*blas_s, now() - t0);
        if (!cpu_time) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
}

static std::vector<int> parse_list(const char* s) {
    std::vector<int> v;
    std::string item;
    for (const char* p = s;; p++) {
        if (*p == ',' || *p == 0) {
            char* end = nullptr;
            long x = strtol(item.c_str(), &end, 10);
            if (item.empty() || *end != 0 || x <= 0 || x > 1 << 20) {
                fprintf(stderr, "bench_gemm: --bt wants positive integers like 256,2048, got '%s'\n", s);
                exit(2);
            }
            v.push_back((int)x);
            item.clear();
            if (*p == 0) break;
        } else {
            item += *p;
        }
    }
    return v;
}

int main(int argc, char** argv) {
    std::vector<int> bts = {256, 2048};
    int threads = omp_get_max_threads();
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bt") && i + 1 < argc) {
            bts = parse_list(argv[++i]);
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
            if (threads <= 0) {
                fprintf(stderr, "bench_gemm: --threads wants a positive integer\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else {
            fprintf(stderr, "usage: %s [--bt 256,2048] [--threads N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    double peak1 = one_thread_peak_cpu_time();
    double peakN = cpu_fma_peak_flops(threads);
    printf("FMA peak: %.1f GFLOP/s on 1 thread (thread CPU time), %.1f GFLOP/s on %d threads (llmc/run/cpu_peak.h)\n", peak1 / 1e9,
           peakN / 1e9, threads);
    printf("GFLOP/s, best of interleaved repetitions; ours/BLAS > 1 means gemm_accumulate is faster\n");
    printf("| layer | product | M x N x K | 1 thread: ours | OpenBLAS | ours/BLAS | ours/peak | %d threads: ours | OpenBLAS | ours/BLAS | ours/peak | rel. diff |\n",
           threads);
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::mt19937 rng(1);
    for (int BT : bts) {
        const Case layers[] = {{"fc", Product::Forward, BT, 768, 3072},  {"fc", Product::Dinp, BT, 768, 3072},
                               {"fc", Product::Dweight, BT, 768, 3072},  {"lm_head", Product::Forward, BT, 768, 50304},
                               {"lm_head", Product::Dinp, BT, 768, 50304}, {"lm_head", Product::Dweight, BT, 768, 50304}};
        for (const Case& c : layers) {
            Operands o;
            fill(o.inp, (size_t)c.BT * c.C, rng);
            fill(o.weight, (size_t)c.OC * c.C, rng);
            fill(o.dout, (size_t)c.BT * c.OC, rng);
            o.out.assign((size_t)out_rows(c) * out_cols(c), 0.0f);
            double flops = 2.0 * c.BT * c.C * c.OC;
            // about 2 s of single-thread compute per implementation and mode at most, and 2 repetitions at least
            int reps = quick ? 1 : std::max(2, std::min(5, (int)(1.5e11 / flops)));
            const char* names[] = {"forward", "dinp", "dW"};
            int M = out_rows(c), N = out_cols(c), K = c.product == Product::Dweight ? c.BT : (c.product == Product::Forward ? c.C : c.OC);

            omp_set_num_threads(1);
            openblas_set_num_threads(1);
            double ours1, blas1;
            time_pair(c, o, reps, true, &ours1, &blas1);
            omp_set_num_threads(threads);
            openblas_set_num_threads(threads);
            double oursN, blasN;
            time_pair(c, o, reps, false, &oursN, &blasN);
            double diff = relative_difference(c, o);
            printf("| %s | %s | %d x %d x %d | %.1f | %.1f | %.2f | %.0f%% | %.1f | %.1f | %.2f | %.0f%% | %.1e |\n", c.layer,
                   names[(int)c.product], M, N, K, flops / ours1 / 1e9, flops / blas1 / 1e9, blas1 / ours1,
                   100 * flops / ours1 / peak1, flops / oursN / 1e9, flops / blasN / 1e9, blasN / oursN,
                   100 * flops / oursN / peakN, diff);
            fflush(stdout);
            if (diff > 1e-4) {
                fprintf(stderr, "bench_gemm: ours and OpenBLAS disagree (%.1e)\n", diff);
                return 1;
            }
        }
    }
    return 0;
}
