// GELU backward, version by version: dinp = gelu'(inp) * dout over (B, T, 4C) = 25.2M elements,
// checked against gelu_backward() of llmc/gelu.h and timed.
//
// llmc's CUDA backward overwrites dinp while the CPU op adds into it; the CPU reference therefore
// starts from a zero dinp, which makes the two the same function.
//
// The two numbers: 2 + 2 bytes read, 2 written per element = 151 MB, ~50 us at 3 TB/s. gelu'(x) needs
// a tanh and ~10 multiplies: as in the forward, instruction issue is close to the memory time.
//
//   make -C dev/cuda bin/gelu_backward && dev/cuda/bin/gelu_backward
#include "harness.cuh"

#include "../../llmc/gelu.cuh"
#include "../../llmc/gelu.h"

// ----------------------------------------------------------------------------
// v1: one thread per element, 2-byte loads and stores (the CPU loop, one iteration per thread).

__global__ void gelu_backward_v1_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) dinp[i] = (floatX)(gelu_derivative((float)inp[i]) * (float)dout[i]);
}

void gelu_backward_v1(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, int block_size) {
    gelu_backward_v1_kernel<<<ceil_div_int(N, block_size), block_size>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's gelu_backward (llmc/gelu.cuh): 16 bytes per thread and per tensor, an eighth of v1's
// memory instructions.

// ----------------------------------------------------------------------------
// v3: v2 with tanh from one fast exponential. tanhf() is ~20 instructions; the hardware tanh
// (tanh.approx.f32) is one, but its error, ~2^-11 of the value, is larger than 1 - tanh^2 itself once
// |u| > 4, and gelu' needs exactly that factor. So instead: s = 2 / (exp(2u) + 1) = 1 - tanh(u), from
// ex2.approx and a fast divide (two MUFU instructions), gives 1 + tanh = 2 - s and 1 - tanh^2 =
// s (2 - s), each accurate relative to itself wherever tanh saturates.

__device__ inline float gelu_derivative_fast(float x) {
    float u = GELU_SCALE_F * (x + 0.044715f * x * x * x);
    u = fminf(fmaxf(u, -9.0f), 9.0f);  // tanh(+-9) is +-1 in fp32; keeps exp(2u) finite
    float s = __fdividef(2.0f, __expf(2.0f * u) + 1.0f);  // 1 - tanh(u)
    float du_dx = GELU_SCALE_F * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (2.0f - s) + 0.5f * x * s * (2.0f - s) * du_dx;
}

__global__ void gelu_backward_v3_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= N) return;
    x128 x = load128cs(inp + idx);
    x128 dy = load128cs(dout + idx);
    x128 dx;
#pragma unroll
    for (int k = 0; k < x128::size; k++) dx[k] = (floatX)(gelu_derivative_fast((float)x[k]) * (float)dy[k]);
    store128(dinp + idx, dx);
}

void gelu_backward_v3(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, int block_size) {
    gelu_backward_v3_kernel<<<ceil_div_int(N / x128::size, block_size), block_size>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v4: v3 with two 16-byte chunks per thread and tensor: four loads in flight before the first use.

constexpr int GELU_CHUNKS = 2;

__global__ void gelu_backward_v4_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t base = (size_t)blockIdx.x * blockDim.x * GELU_CHUNKS * x128::size + threadIdx.x * x128::size;
    x128 x[GELU_CHUNKS], dy[GELU_CHUNKS];
#pragma unroll
    for (int j = 0; j < GELU_CHUNKS; j++) {
        size_t idx = base + (size_t)j * blockDim.x * x128::size;
        if (idx < N) {
            x[j] = load128cs(inp + idx);
            dy[j] = load128cs(dout + idx);
        }
    }
#pragma unroll
    for (int j = 0; j < GELU_CHUNKS; j++) {
        size_t idx = base + (size_t)j * blockDim.x * x128::size;
        if (idx >= N) continue;
        x128 dx;
#pragma unroll
        for (int k = 0; k < x128::size; k++) dx[k] = (floatX)(gelu_derivative_fast((float)x[j][k]) * (float)dy[j][k]);
        store128(dinp + idx, dx);
    }
}

void gelu_backward_v4(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, int block_size) {
    gelu_backward_v4_kernel<<<ceil_div_int(N / x128::size, block_size * GELU_CHUNKS), block_size>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("gelu_backward", argc, argv);
    const size_t N = (size_t)dev::B * dev::T * 4 * dev::C;

    std::vector<float> inp = dev::random_floatX(N, -4.0f, 4.0f);
    std::vector<float> dout = dev::random_floatX(N, -1.0f, 1.0f);
    std::vector<float> ref(N, 0.0f);  // the CPU op adds into dinp: start it at zero
    gelu_backward(ref.data(), inp.data(), dout.data(), N);

    dev::DeviceBuffer<floatX> d_inp(N), d_dout(N), d_dinp(N);
    dev::upload(d_inp, inp);
    dev::upload(d_dout, dout);

    dev::Report report = dev::make_report("gelu_backward", 6.0 * N, 0.0);
    const std::vector<int> blocks = {128, 256, 512, 1024};
    std::vector<dev::Version> versions = {
        {"v1 one thread per element", blocks,
         [&](int bs) { gelu_backward_v1(d_dinp.ptr, d_inp.ptr, d_dout.ptr, N, bs); }},
        {"v2 llmc: 16 bytes per thread", {0}, [&](int) { gelu_backward(d_dinp.ptr, d_inp.ptr, d_dout.ptr, N, 0); }},
        {"v3 v2 + tanh from one __expf", blocks, [&](int bs) { gelu_backward_v3(d_dinp.ptr, d_inp.ptr, d_dout.ptr, N, bs); }},
        {"v4 v3 + two 16-byte chunks per thread", blocks,
         [&](int bs) { gelu_backward_v4(d_dinp.ptr, d_inp.ptr, d_dout.ptr, N, bs); }},
    };
    dev::run_versions(&report, versions, [&] { dev::poison(d_dinp); },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "dinp", dev::download(d_dinp), ref, dev::TOL_ELEMENTWISE);
                          return result;
                      });
    return dev::finish(report);
}
