// The harness every dev/cuda program shares: check a kernel version against the CPU reference op, then
// time it and say how close it came to what this GPU can do.
//
// Two modes. The default checks and times at GPT-2 124M's shapes. The check-only mode (`--check`, or
// DEV_CHECK_ONLY=1; always on under the CPU emulator, where a time means nothing) shrinks the shapes
// (check_shapes below), skips the ceilings and the timing, and still checks every version and block
// size; the exit code is 1 if any check failed. CI runs every program that way under the emulator
// (make emu-devcuda-check, dev/emu/devcuda.mk).
//
// The method, in the order a program uses it:
//   1. No GPU (or one older than sm_80): print why and exit 0, so run_all.sh is safe anywhere.
//   2. Ceilings, measured in the same run: a large device-to-device copy (bytes read + written per
//      second) for memory-bound ops, and a large bf16 cuBLAS GEMM for the matrix ops. Datasheet
//      numbers are not used: the fraction printed is of what this card did a moment ago.
//   3. Inputs: fresh random values every run (the seed is printed; DEV_SEED=<n> repeats a run), drawn
//      in fp32 and rounded to floatX, so the CPU reference and the GPU start from the same numbers.
//      Never zeros: zeros hide unwritten outputs and wrong indexing.
//   4. For each version and block size: poison the outputs (all bits set: NaN in bf16 and fp32) or, for
//      outputs a kernel adds into, reset them to random values; run once; compare with the reference.
//   5. Timing: each repetition is prepared (outputs reset, in-place inputs restored), then the L2 is
//      flushed by reading a buffer twice its size, then the launch alone sits between two events. The
//      median of the repetitions is reported, so a cold L2 is what every version sees.
//
// One error measure for every check (the same as test/gpu): err = max|gpu - cpu| / max|cpu| over a
// tensor, plus a count of non-finite values (a poisoned element that was never written shows as NaN).
// Tolerances, for bf16 storage (8 significant bits, so one rounding moves a value by up to 2^-9 of
// itself, 2e-3):
//   TOL_ELEMENTWISE 4e-3  one or two roundings of each output (the inputs are already bf16 on both sides)
//   TOL_REDUCTION   1e-2  an fp32 sum of many bf16 terms, rounded once on output; the CPU sums in a
//                         different order, and bf16 intermediates (LayerNorm's output, a GEMM's operands)
//                         differ by a rounding too
//   TOL_ATTENTION   5e-2  the scores and the probabilities are stored in bf16 between the stages, and a
//                         score near 5 rounded by 2^-9 moves exp() by 1%
// A wrong index, stride or formula is off by O(1) of the tensor's scale, far above all of these.
// The dev programs are written for the bf16 build (the tensor-core kernels need it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../../llmc/cuda_common.cuh"

static_assert(sizeof(floatX) == 2, "dev/cuda programs are written for the bf16 build (floatX = __nv_bfloat16)");

namespace dev {

// GPT-2 124M at the trainer's default batch: the shapes every program checks and times. Settings, not
// constants: device_init switches them to check_shapes() in the check-only mode.
inline int B = 8;
inline int T = 1024;
inline int C = 768;
inline int NH = 12;
inline int V = 50257;
inline int Vp = 50304;  // V padded to a multiple of 128
inline size_t NUM_PARAMETERS = 124475904;  // GPT-2 124M with the padded vocabulary

// true: check every version at the small shapes, time nothing (--check, DEV_CHECK_ONLY=1, the emulator)
inline bool check_only = false;

// The attention programs check two lengths in the check mode: T, and T - 20, whose last 64-row tile is
// partial. DEV_CHECK_PARTIAL_ONLY=1 checks the second alone (make test's ASan run: the partial tile's
// edges are where an access out of bounds would be, and each length costs half a minute there).
inline bool check_partial_only() {
    const char* env = getenv("DEV_CHECK_PARTIAL_ONLY");
    return check_only && env != nullptr && strcmp(env, "1") == 0;
}

// Small shapes every kernel here accepts, chosen to reach the same code paths as the real ones:
// head size C / NH = 64 (the attention kernels' HS); B·T = 640 rows, a multiple of the 128-row matmul
// tiles; T = 320, five 64-query tiles for the flash kernels and, like C = 384, more than one but not a
// whole number of a warp's 256-element passes (the register-held rows' last chunk is partial, as at
// C = 768); C, 3C, 4C and Vp multiples of 128 (matmul tiles) and of 8 (16-byte accesses); V < Vp so
// the padding is exercised; NUM_PARAMETERS a multiple of 128 like the real count, several grids' worth.
inline void check_shapes() {
    B = 2;
    T = 320;
    C = 384;
    NH = 6;
    V = 1000;
    Vp = 1024;
    NUM_PARAMETERS = 200064;
}

constexpr double TOL_ELEMENTWISE = 4e-3;
constexpr double TOL_REDUCTION = 1e-2;
constexpr double TOL_ATTENTION = 5e-2;

// ----------------------------------------------------------------------------
// device

struct Device {
    int id = 0;
    cudaDeviceProp prop{};
};

inline Device& device() {
    static Device d;
    return d;
}

inline std::string today() {
    char buffer[32];
    time_t now = time(nullptr);
    strftime(buffer, sizeof(buffer), "%Y-%m-%d", localtime(&now));
    return buffer;
}

// Reads the command line (`--check`: the check-only mode; DEV_CHECK_ONLY=1 does the same), then picks
// GPU 0, or prints why this program cannot run here and exits 0. The CPU emulator (CUDA_EMULATION)
// reports one sm_90 device, so under it the program always runs, in the check-only mode.
inline void device_init(const char* program, int argc, char** argv) {
    const char* env = getenv("DEV_CHECK_ONLY");
    check_only = env != nullptr && strcmp(env, "0") != 0 && env[0] != '\0';
#if defined(CUDA_EMULATION)
    check_only = true;
#endif
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--check") == 0) {
            check_only = true;
        } else {
            fprintf(stderr, "%s: unknown argument '%s'; usage: %s [--check]\n", program, argv[i], program);
            exit(1);
        }
    }
    if (check_only) check_shapes();
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        printf("%s: no CUDA GPU visible (%s); nothing to check or time here.\n", program,
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        exit(0);
    }
    Device& d = device();
    cudaCheck(cudaSetDevice(d.id));
    cudaCheck(cudaGetDeviceProperties(&d.prop, d.id));
    if (d.prop.major < 8) {
        printf("%s: %s has compute capability %d.%d; these programs are built for sm_80 and sm_90. Skipping.\n",
               program, d.prop.name, d.prop.major, d.prop.minor);
        exit(0);
    }
    printf("%s\n", program);
    printf("device: %s, %d SMs, %.0f MiB L2, compute capability %d.%d, %.1f GiB; %s\n", d.prop.name,
           d.prop.multiProcessorCount, d.prop.l2CacheSize / 1048576.0, d.prop.major, d.prop.minor,
           d.prop.totalGlobalMem / 1073741824.0, today().c_str());
    if (check_only) {
        printf("check-only: B=%d T=%d C=%d NH=%d V=%d Vp=%d parameters=%zu; nothing is timed%s\n", B, T, C, NH, V, Vp,
               NUM_PARAMETERS,
#if defined(CUDA_EMULATION)
               " (emulated on the CPU: this proves the logic, not the speed)"
#else
               ""
#endif
        );
    }
}

// ----------------------------------------------------------------------------
// random inputs

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// uniform in [0, 1) with 24 bits, a pure function of (seed, i) so a fill can run in parallel
__host__ __device__ inline float hash_uniform(uint64_t seed, uint64_t i) {
    uint64_t x = seed ^ (i * 0xD2B74407B1CE6E93ull);
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

// Each call gives a new seed; the first comes from DEV_SEED or the clock and is printed, so a run
// (and a failure) can be repeated exactly.
inline uint64_t next_seed() {
    static uint64_t base = 0;
    static uint64_t counter = 0;
    if (counter == 0) {
        const char* env = getenv("DEV_SEED");
        base = env != nullptr ? strtoull(env, nullptr, 10) : (uint64_t)std::random_device{}() ^ (uint64_t)time(nullptr);
        printf("seed: %llu (DEV_SEED=%llu repeats this run)\n", (unsigned long long)base, (unsigned long long)base);
    }
    return splitmix64(base + counter++);
}

inline float round_to_floatX(float x) { return host_from_floatX(host_to_floatX(x)); }

// n values uniform in [lo, hi), each rounded to floatX so the CPU sees exactly what the GPU sees.
inline std::vector<float> random_floatX(size_t n, float lo, float hi) {
    uint64_t seed = next_seed();
    std::vector<float> values(n);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) values[i] = round_to_floatX(lo + (hi - lo) * hash_uniform(seed, i));
    return values;
}

// fp32 values uniform in [lo, hi) (for tensors kept in fp32: optimizer state, master weights)
inline std::vector<float> random_float(size_t n, float lo, float hi) {
    uint64_t seed = next_seed();
    std::vector<float> values(n);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) values[i] = lo + (hi - lo) * hash_uniform(seed, i);
    return values;
}

// Token ids with text's skew: P(rank k) is proportional to log((k+2)/(k+1)) ~ 1/(k+1.5) (Zipf, exponent
// 1), so the commonest id fills ~6% of the positions. Ranks are scattered over [0, V) by a fixed
// multiplicative permutation, so the common rows of wte are not neighbours in memory.
inline std::vector<int> random_tokens(size_t n, int vocab) {
    uint64_t seed = next_seed();
    std::vector<int> tokens(n);
    double log_range = std::log((double)vocab + 1.0);
    for (size_t i = 0; i < n; i++) {
        long rank = (long)std::floor(std::exp(hash_uniform(seed, i) * log_range)) - 1;
        rank = std::min<long>(std::max<long>(rank, 0), vocab - 1);
        tokens[i] = (int)((rank * 7919 + 13) % vocab);  // 7919 is prime and does not divide V = 29 * 1733
    }
    return tokens;
}

// ----------------------------------------------------------------------------
// device buffers

template <typename T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : n(count) { cudaCheck(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaFree(ptr); }
    size_t bytes() const { return n * sizeof(T); }
};

// all bits set: NaN in bf16 and in fp32, so an element no thread wrote fails the check
template <typename T>
inline void poison(DeviceBuffer<T>& buffer) {
    cudaCheck(cudaMemset(buffer.ptr, 0xFF, buffer.bytes()));
}

// dst = src on the device (restoring inputs a version overwrites, resetting outputs it adds into)
template <typename T>
inline void copy(DeviceBuffer<T>& dst, const DeviceBuffer<T>& src) {
    if (dst.n != src.n) fatal("copy: %zu elements into a buffer of %zu", src.n, dst.n);
    cudaCheck(cudaMemcpyAsync(dst.ptr, src.ptr, src.bytes(), cudaMemcpyDeviceToDevice));
}

inline void upload(DeviceBuffer<floatX>& buffer, const std::vector<float>& host) {
    if (host.size() != buffer.n) fatal("upload: %zu values into a buffer of %zu", host.size(), buffer.n);
    std::vector<floatX> converted(host.size());
#pragma omp parallel for
    for (size_t i = 0; i < host.size(); i++) converted[i] = host_to_floatX(host[i]);
    cudaCheck(cudaMemcpy(buffer.ptr, converted.data(), buffer.bytes(), cudaMemcpyHostToDevice));
}

template <typename T>
inline void upload(DeviceBuffer<T>& buffer, const std::vector<T>& host) {
    if (host.size() != buffer.n) fatal("upload: %zu values into a buffer of %zu", host.size(), buffer.n);
    cudaCheck(cudaMemcpy(buffer.ptr, host.data(), buffer.bytes(), cudaMemcpyHostToDevice));
}

inline std::vector<float> download(const DeviceBuffer<floatX>& buffer) {
    cudaCheck(cudaDeviceSynchronize());
    std::vector<floatX> raw(buffer.n);
    cudaCheck(cudaMemcpy(raw.data(), buffer.ptr, buffer.bytes(), cudaMemcpyDeviceToHost));
    std::vector<float> values(buffer.n);
#pragma omp parallel for
    for (size_t i = 0; i < buffer.n; i++) values[i] = host_from_floatX(raw[i]);
    return values;
}

inline std::vector<float> download(const DeviceBuffer<float>& buffer) {
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> values(buffer.n);
    cudaCheck(cudaMemcpy(values.data(), buffer.ptr, buffer.bytes(), cudaMemcpyDeviceToHost));
    return values;
}

// device-side fill, for large buffers no CPU reference reads (the GEMM ceiling's operands)
__global__ void fill_uniform_kernel(floatX* x, size_t n, uint64_t seed, float lo, float hi) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        x[i] = (floatX)(lo + (hi - lo) * hash_uniform(seed, i));
    }
}

inline void fill_uniform_device(DeviceBuffer<floatX>& buffer, float lo, float hi) {
    fill_uniform_kernel<<<1024, 256>>>(buffer.ptr, buffer.n, next_seed(), lo, hi);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// checks

struct CheckResult {
    bool ok = true;
    double worst = 0.0;      // the largest err among the tensors checked
    std::string failures;    // which tensors failed and why
};

// err = max|out - ref| / max|ref|; fails on any non-finite output or err > tolerance.
inline void check_tensor(CheckResult* result, const char* name, const float* out, const float* ref, size_t n,
                         double tolerance) {
    double max_err = 0.0, max_ref = 0.0;
    size_t nonfinite = 0, first_bad = n;
#pragma omp parallel for reduction(max : max_err, max_ref) reduction(+ : nonfinite) reduction(min : first_bad)
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(out[i])) {
            nonfinite++;
            first_bad = std::min(first_bad, i);
            continue;
        }
        max_err = std::max(max_err, std::fabs((double)out[i] - (double)ref[i]));
        max_ref = std::max(max_ref, std::fabs((double)ref[i]));
    }
    double err = max_ref > 0.0 ? max_err / max_ref : max_err;
    result->worst = std::max(result->worst, err);
    char message[256];
    if (nonfinite > 0) {
        result->ok = false;
        snprintf(message, sizeof(message), " %s: %zu non-finite (first at %zu: unwritten or overflow);", name,
                 nonfinite, first_bad);
        result->failures += message;
    } else if (!(err <= tolerance)) {
        result->ok = false;
        snprintf(message, sizeof(message), " %s: err %.2e > %.0e;", name, err, tolerance);
        result->failures += message;
    }
}

// Only that every element was written (finite): for outputs checked against the reference on a sample.
inline void check_all_finite(CheckResult* result, const char* name, const std::vector<float>& out) {
    size_t nonfinite = 0, first_bad = out.size();
#pragma omp parallel for reduction(+ : nonfinite) reduction(min : first_bad)
    for (size_t i = 0; i < out.size(); i++) {
        if (!std::isfinite(out[i])) {
            nonfinite++;
            first_bad = std::min(first_bad, i);
        }
    }
    if (nonfinite > 0) {
        char message[256];
        snprintf(message, sizeof(message), " %s: %zu non-finite (first at %zu: unwritten or overflow);", name,
                 nonfinite, first_bad);
        result->ok = false;
        result->failures += message;
    }
}

inline void check_tensor(CheckResult* result, const char* name, const std::vector<float>& out,
                         const std::vector<float>& ref, double tolerance) {
    if (out.size() != ref.size()) fatal("check %s: %zu values against %zu", name, out.size(), ref.size());
    check_tensor(result, name, out.data(), ref.data(), out.size(), tolerance);
}

// ----------------------------------------------------------------------------
// timing

struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    Events() {
        cudaCheck(cudaEventCreate(&start));
        cudaCheck(cudaEventCreate(&stop));
    }
    ~Events() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
};

// Reads every 16 bytes of `buffer`; the store never happens (the sum is not that value) but the
// compiler cannot know it, so the loads stay.
__global__ void l2_flush_kernel(const int4* buffer, size_t n, int* sink) {
    int acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = __ldcg(buffer + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7FFFFFFF) *sink = acc;
}

// A read sweep over twice the L2, so what the timed kernel reads next comes from memory. Reading
// (not writing) leaves the L2 holding clean lines: no write-backs land inside the timed region.
inline void flush_l2() {
    static DeviceBuffer<int4>* buffer = nullptr;
    static DeviceBuffer<int>* sink = nullptr;
    if (buffer == nullptr) {
        size_t bytes = std::max<size_t>(2 * (size_t)device().prop.l2CacheSize, 64u << 20);
        buffer = new DeviceBuffer<int4>(bytes / sizeof(int4));
        sink = new DeviceBuffer<int>(1);
        cudaCheck(cudaMemset(buffer->ptr, 1, buffer->bytes()));
    }
    l2_flush_kernel<<<4 * device().prop.multiProcessorCount, 512>>>(buffer->ptr, buffer->n, sink->ptr);
    cudaCheckLaunch();
}

struct Timing {
    double median_ms = 0.0;
    double spread = 0.0;  // (slowest - fastest) / median over the repetitions
    int reps = 0;
};

// Times `run` alone: each repetition first calls `prepare` and flushes the L2, untimed. One untimed
// warm-up first; slow versions get fewer repetitions (at least 3) so a program stays quick.
inline Timing time_ms(const std::function<void()>& prepare, const std::function<void()>& run, int max_reps = 25) {
    static Events events;
    auto once = [&]() {
        prepare();
        flush_l2();
        cudaCheck(cudaEventRecord(events.start));
        run();
        cudaCheck(cudaEventRecord(events.stop));
        cudaCheck(cudaEventSynchronize(events.stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, events.start, events.stop));
        return (double)ms;
    };
    double first = once();  // warm-up
    int reps = std::max(3, std::min(max_reps, (int)(1000.0 / std::max(first, 1e-3))));
    std::vector<double> samples;
    for (int r = 0; r < reps; r++) samples.push_back(once());
    std::sort(samples.begin(), samples.end());
    Timing t;
    t.median_ms = samples[reps / 2];
    t.spread = (samples.back() - samples.front()) / t.median_ms;
    t.reps = reps;
    return t;
}

// ----------------------------------------------------------------------------
// ceilings, measured on this GPU in this run

// Device-to-device copy of 1 GiB, counting bytes read plus bytes written, in GB/s.
inline double measure_copy_gbps() {
    const size_t bytes = 1ull << 30;
    DeviceBuffer<uint8_t> src(bytes), dst(bytes);
    cudaCheck(cudaMemset(src.ptr, 0x5A, bytes));
    Timing t = time_ms([] {}, [&] { cudaCheck(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice)); }, 15);
    return 2.0 * bytes / (t.median_ms * 1e6);
}

// bf16 GEMM 8192 x 8192 x 8192 through cuBLAS (fp32 accumulation), random operands, in TFLOP/s.
inline double measure_gemm_tflops(cublasHandle_t handle) {
    const int n = 8192;
    DeviceBuffer<floatX> a((size_t)n * n), b((size_t)n * n), c((size_t)n * n);
    fill_uniform_device(a, -1.0f, 1.0f);
    fill_uniform_device(b, -1.0f, 1.0f);
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm = [&] {
        cublasCheck(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.ptr, CUDA_R_16BF, n, b.ptr,
                                 CUDA_R_16BF, n, &beta, c.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    gemm();
    gemm();
    Timing t = time_ms([] {}, gemm, 10);
    return 2.0 * n * n * (double)n / (t.median_ms * 1e9);
}

// ----------------------------------------------------------------------------
// versions and the report

// One kernel version: its name (a short lesson title; the source comment says what changed and why)
// and a launch function taking a block size. block_sizes {0} means the launch shape is fixed (an
// llmc/ launcher, or a kernel whose shape is part of its design).
struct Version {
    std::string name;
    std::vector<int> block_sizes;
    std::function<void(int block_size)> launch;
};

struct Row {
    std::string version;
    int block_size = 0;
    Timing timing;
    double err = 0.0;
    bool ok = false;
};

// What the op must move and compute at its shape, to turn times into rates:
//   bytes: the fewest bytes it can move through device memory (each input read once, each output
//          written once; an output it adds into counts as read and written)
//   flops: the useful floating-point operations (0 for a memory-bound op)
struct Report {
    std::string op;
    double bytes = 0.0;
    double flops = 0.0;
    double copy_gbps = 0.0;     // measured ceiling for memory-bound ops
    double gemm_tflops = 0.0;   // measured ceiling for matrix ops
    std::vector<Row> rows;

    bool compute_bound() const { return flops > 0.0; }
    double rate(double ms) const { return compute_bound() ? flops / (ms * 1e9) : bytes / (ms * 1e6); }
    const char* unit() const { return compute_bound() ? "TFLOP/s" : "GB/s"; }
    double ceiling() const { return compute_bound() ? gemm_tflops : copy_gbps; }
    const char* ceiling_name() const { return compute_bound() ? "cuBLAS" : "copy"; }
};

// Measures the ceilings the first time a program asks for them (the GEMM only if a report needs it)
// and starts a report: prints the ceilings, the op's bytes and flops, and the table's header.
inline Report make_report(const std::string& op, double bytes, double flops) {
    static double copy_gbps = 0.0, gemm_tflops = 0.0;
    if (check_only) {
        Report report;
        report.op = op;
        report.bytes = bytes;
        report.flops = flops;
        printf("op: %s (check only)\n\n%-44s %6s %9s  %s\n", op.c_str(), "version", "block", "err", "check");
        return report;
    }
    if (copy_gbps == 0.0) {
        copy_gbps = measure_copy_gbps();
        printf("ceiling: device-to-device copy %.0f GB/s (bytes read + written)\n", copy_gbps);
    }
    if (flops > 0.0 && gemm_tflops == 0.0) {
        cublasHandle_t handle = cublas_context.blas;
        bool own_handle = handle == nullptr;
        if (own_handle) cublasCheck(cublasCreate(&handle));
        gemm_tflops = measure_gemm_tflops(handle);
        if (own_handle) cublasCheck(cublasDestroy(handle));
        printf("ceiling: cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s\n", gemm_tflops);
    }
    Report report;
    report.op = op;
    report.bytes = bytes;
    report.flops = flops;
    report.copy_gbps = copy_gbps;
    report.gemm_tflops = gemm_tflops;
    printf("op: %s, %.1f MB moved at least", op.c_str(), bytes / 1e6);
    if (flops > 0.0) printf(", %.2f GFLOP", flops / 1e9);
    printf("\n\n");
    printf("%-44s %6s %11s %10s %8s %7s %9s  %s\n", "version", "block", "time (us)",
           report.unit(), report.compute_bound() ? "%cuBLAS" : "%copy", "spread", "err", "check");
    return report;
}

inline void print_row(const Report& report, const Row& row) {
    char block[16];
    if (row.block_size > 0) {
        snprintf(block, sizeof(block), "%d", row.block_size);
    } else {
        snprintf(block, sizeof(block), "fixed");
    }
    if (check_only) {
        printf("%-44s %6s %9.2e  %s\n", row.version.c_str(), block, row.err, row.ok ? "ok" : "FAIL");
        return;
    }
    double rate = report.rate(row.timing.median_ms);
    printf("%-44s %6s %11.1f %10.1f %7.1f%% %6.0f%% %9.2e  %s\n", row.version.c_str(), block,
           row.timing.median_ms * 1e3, rate, 100.0 * rate / report.ceiling(), 100.0 * row.timing.spread, row.err,
           row.ok ? "ok" : "FAIL");
}

// For each version and block size: prepare, launch, check, then time. `prepare` poisons or resets the
// outputs and restores inputs that a version overwrites; `check` compares the outputs with the CPU
// reference (computed once by the caller). Rows print as they finish.
// DEV_CHECK_ONE_BLOCK_SIZE=1 (check-only mode): each version at its first block size only; =largest: at
// its largest (the most warps a block, where a race between warps has the most chances to show). The
// sanitizer lanes of CI set it (test/run_tests.sh: AddressSanitizer 1, the race checker largest): a
// version's code is the same at every block size, and the sanitizers make the naive versions' sizes most
// of the suite's time; the plain emulated check still runs them all.
inline int one_block_size(const std::vector<int>& sizes) {  // the one size to run, or 0: every size
    const char* env = getenv("DEV_CHECK_ONE_BLOCK_SIZE");
    if (!check_only || env == nullptr) return 0;
    if (strcmp(env, "1") == 0) return sizes.front();
    if (strcmp(env, "largest") == 0) return *std::max_element(sizes.begin(), sizes.end());
    return 0;
}

inline void run_versions(Report* report, const std::vector<Version>& versions, const std::function<void()>& prepare,
                         const std::function<CheckResult()>& check) {
    for (const Version& version : versions) {
        for (int block_size : version.block_sizes) {
            int only = one_block_size(version.block_sizes);
            if (only != 0 && block_size != only) continue;
            prepare();
            version.launch(block_size);
            cudaCheck(cudaGetLastError());
            cudaCheck(cudaDeviceSynchronize());
            CheckResult result = check();
            Row row;
            row.version = version.name;
            row.block_size = block_size;
            row.err = result.worst;
            row.ok = result.ok;
            if (!check_only) row.timing = time_ms(prepare, [&] { version.launch(block_size); });
            report->rows.push_back(row);
            print_row(*report, row);
            if (!result.ok) printf("    FAIL:%s\n", result.failures.c_str());
            fflush(stdout);
        }
    }
}

// Prints the best passing row as one line for run_all.sh:
//   RESULT|op|version|block|time_us|rate|unit|pct_of_ceiling|ceiling_name|checks
// (in the check-only mode: CHECK|op|checks) and returns the exit code: 1 if any version failed its check.
inline int finish(const Report& report) {
    const Row* best = nullptr;
    int failed = 0;
    for (const Row& row : report.rows) {
        if (!row.ok) {
            failed++;
            continue;
        }
        if (best == nullptr || row.timing.median_ms < best->timing.median_ms) best = &row;
    }
    char checks[64];
    if (failed == 0) {
        snprintf(checks, sizeof(checks), "all %zu ok", report.rows.size());
    } else {
        snprintf(checks, sizeof(checks), "%d of %zu FAILED", failed, report.rows.size());
    }
    printf("\n");
    if (check_only) {
        printf("CHECK|%s|%s\n", report.op.c_str(), checks);
        return failed == 0 ? 0 : 1;
    }
    if (best == nullptr) {
        printf("RESULT|%s|none passed|-|-|-|-|-|-|%s\n", report.op.c_str(), checks);
        return 1;
    }
    double rate = report.rate(best->timing.median_ms);
    printf("RESULT|%s|%s|%s|%.1f|%.1f|%s|%.1f|%s|%s\n", report.op.c_str(), best->version.c_str(),
           best->block_size > 0 ? std::to_string(best->block_size).c_str() : "fixed", best->timing.median_ms * 1e3,
           rate, report.unit(), 100.0 * rate / report.ceiling(), report.ceiling_name(), checks);
    return failed == 0 ? 0 : 1;
}

}  // namespace dev
