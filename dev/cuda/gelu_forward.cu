// GELU forward, version by version: out = gelu(inp) over the MLP's hidden activation, (B, T, 4C) =
// 25.2M elements. Every version is checked against gelu_forward() of llmc/gelu.h and timed.
//
// The two numbers: 2 bytes read + 2 written per element = 101 MB, ~34 us at 3 TB/s. The arithmetic is
// a tanh and a handful of multiplies per element; a tanhf() is ~20 instructions, which at 8 elements
// per 16 bytes is close to what the SMs can issue while memory streams, so both limits matter here.
//
//   make -C dev/cuda bin/gelu_forward && dev/cuda/bin/gelu_forward
#include "harness.cuh"

#include "../../llmc/gelu.cuh"
#include "../../llmc/gelu.h"

// ----------------------------------------------------------------------------
// v1: one thread per element. The plain translation of the CPU loop: each thread loads 2 bytes and
// stores 2 bytes. Coalesced (a warp touches 64 contiguous bytes), but the memory system handles
// requests, not bytes: 2-byte accesses need 8 times the load instructions of 16-byte ones.

__global__ void gelu_forward_v1_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = (floatX)gelu_value((float)inp[i]);
}

void gelu_forward_v1(floatX* out, const floatX* inp, size_t N, int block_size) {
    gelu_forward_v1_kernel<<<ceil_div_int(N, block_size), block_size>>>(out, inp, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's gelu_forward (llmc/gelu.cuh): one thread per 16 bytes (8 bf16) through Packed128, and a
// streaming load for the input that is read once. An eighth of v1's memory instructions.

// ----------------------------------------------------------------------------
// v3: v2 with the hardware tanh. tanh.approx.f32 (sm_75+) is one MUFU instruction instead of tanhf's
// ~20 (an exp, a division and range fixes); its relative error, ~2^-11, is 4x under the bf16 rounding
// of the result. Should help if v2 is limited by instruction issue rather than bytes.

__device__ inline float tanh_fast(float x) {
#if defined(CUDA_EMULATION)
    return tanhf(x);  // the CPU emulator has no MUFU: the exact function, within the approximation's bound
#else
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

__device__ inline float gelu_value_fast(float x) {
    float u = GELU_SCALE_F * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh_fast(u));
}

__global__ void gelu_forward_v3_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= N) return;
    x128 x = load128cs(inp + idx);
    x128 y;
#pragma unroll
    for (int k = 0; k < x128::size; k++) y[k] = (floatX)gelu_value_fast((float)x[k]);
    store128(out + idx, y);
}

void gelu_forward_v3(floatX* out, const floatX* inp, size_t N, int block_size) {
    gelu_forward_v3_kernel<<<ceil_div_int(N / x128::size, block_size), block_size>>>(out, inp, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v4: v3 with two 16-byte chunks per thread, both loads issued before either is used. Twice the bytes
// in flight per thread (Little's law: bandwidth = bytes in flight / latency), with half the threads.
// The two chunks are a block's width apart, so each load instruction is still coalesced.

constexpr int GELU_CHUNKS = 2;

__global__ void gelu_forward_v4_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t base = (size_t)blockIdx.x * blockDim.x * GELU_CHUNKS * x128::size + threadIdx.x * x128::size;
    x128 x[GELU_CHUNKS];
#pragma unroll
    for (int j = 0; j < GELU_CHUNKS; j++) {
        size_t idx = base + (size_t)j * blockDim.x * x128::size;
        if (idx < N) x[j] = load128cs(inp + idx);
    }
#pragma unroll
    for (int j = 0; j < GELU_CHUNKS; j++) {
        size_t idx = base + (size_t)j * blockDim.x * x128::size;
        if (idx >= N) continue;
        x128 y;
#pragma unroll
        for (int k = 0; k < x128::size; k++) y[k] = (floatX)gelu_value_fast((float)x[j][k]);
        store128(out + idx, y);
    }
}

void gelu_forward_v4(floatX* out, const floatX* inp, size_t N, int block_size) {
    gelu_forward_v4_kernel<<<ceil_div_int(N / x128::size, block_size * GELU_CHUNKS), block_size>>>(out, inp, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("gelu_forward", argc, argv);
    const size_t N = (size_t)dev::B * dev::T * 4 * dev::C;

    std::vector<float> inp = dev::random_floatX(N, -4.0f, 4.0f);
    std::vector<float> ref(N);
    gelu_forward(ref.data(), inp.data(), N);  // the CPU reference op

    dev::DeviceBuffer<floatX> d_inp(N), d_out(N);
    dev::upload(d_inp, inp);

    dev::Report report = dev::make_report("gelu_forward", 4.0 * N, 0.0);
    const std::vector<int> blocks = {128, 256, 512, 1024};
    std::vector<dev::Version> versions = {
        {"v1 one thread per element", blocks, [&](int bs) { gelu_forward_v1(d_out.ptr, d_inp.ptr, N, bs); }},
        {"v2 llmc: 16 bytes per thread", {0}, [&](int) { gelu_forward(d_out.ptr, d_inp.ptr, N, 0); }},
        {"v3 v2 + tanh.approx", blocks, [&](int bs) { gelu_forward_v3(d_out.ptr, d_inp.ptr, N, bs); }},
        {"v4 v3 + two 16-byte chunks per thread", blocks, [&](int bs) { gelu_forward_v4(d_out.ptr, d_inp.ptr, N, bs); }},
    };
    dev::run_versions(&report, versions, [&] { dev::poison(d_out); },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "out", dev::download(d_out), ref, dev::TOL_ELEMENTWISE);
                          return result;
                      });
    return dev::finish(report);
}
