// The global gradient norm's reduction, version by version: the sum of squares of all 124,475,904 bf16
// gradients of GPT-2 124M (the trainer takes its square root for clipping). Checked against
// sum_of_squares() of llmc/adamw.h (accumulated in double) and timed.
//
// Tolerance: fp32 partial sums over a few hundred terms each, then a tree over the partials: the
// relative error is typically ~1e-6; TOL_SUM_FP32 = 1e-4 leaves room and still catches a lost block
// (at least 1/512 of the sum, 2e-3).
//
// The two numbers: read 249 MB once, ~83 us at 3 TB/s; one multiply-add per element. The output is
// one float, so the whole difficulty is reducing across the GPU, deterministically and without a tail.
//
//   make -C dev/cuda bin/global_norm && dev/cuda/bin/global_norm
#include "harness.cuh"

#include "../../llmc/adamw.cuh"
#include "../../llmc/global_norm.cuh"
#include "../../llmc/adamw.h"

constexpr double TOL_SUM_FP32 = 1e-4;

// ----------------------------------------------------------------------------
// v1: one thread per element, a block reduction, then one atomicAdd per block into the result. Easy,
// but: the order in which blocks add changes from run to run (the last bits of the norm do too, and
// with them the clipping), and 486K blocks queue on one address.

__global__ void global_norm_v1_kernel(float* out, const floatX* x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float value = i < n ? (float)x[i] : 0.0f;
    float sum = block_reduce_sum(value * value);
    if (threadIdx.x == 0) atomicAdd(out, sum);
}

void global_norm_v1(float* out, const floatX* x, size_t n, int block_size) {
    cudaCheck(cudaMemsetAsync(out, 0, sizeof(float)));
    global_norm_v1_kernel<<<ceil_div_int(n, block_size), block_size>>>(out, x, n);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's sum_of_squares (llmc/adamw.cuh): a fixed grid of NORM_BLOCKS blocks, each thread
// striding over the tensor with 16-byte loads, one partial per block, then one block adds the partials
// in a fixed tree. The grid is fixed (not sized to the GPU), so the order, and the bits, are the same
// on any GPU.

// ----------------------------------------------------------------------------
// v3: v2 with two 16-byte loads in flight per thread (the second a grid-stride ahead), so each SM keeps
// twice the bytes in flight at the same thread count, and the block size is swept. Same fixed grid and
// fixed order as v2 (its own sum kernel, for any block count).

constexpr int NORM_V3_BLOCKS = 512;

__global__ void global_norm_v3_partials_kernel(float* partials, const floatX* x, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * x128::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    float sum = 0.0f;
    for (; i + stride < n; i += 2 * stride) {
        x128 a = load128cs(x + i);
        x128 b = load128cs(x + i + stride);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)a[k] * (float)a[k];
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)b[k] * (float)b[k];
    }
    if (i < n) {
        x128 a = load128cs(x + i);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)a[k] * (float)a[k];
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// one block: thread j sums partials j, j + blockDim, ... then a block reduction
__global__ void global_norm_v3_sum_kernel(float* out, const float* partials, int num_partials) {
    float sum = 0.0f;
    for (int j = threadIdx.x; j < num_partials; j += blockDim.x) sum += partials[j];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *out = sum;
}

void global_norm_v3(float* out, float* partials, const floatX* x, size_t n, int block_size) {
    if (n % x128::size != 0) fatal("global_norm_v3 needs a size divisible by %d, got %zu", x128::size, n);
    global_norm_v3_partials_kernel<<<NORM_V3_BLOCKS, block_size>>>(partials, x, n);
    cudaCheckLaunch();
    global_norm_v3_sum_kernel<<<1, 512>>>(out, partials, NORM_V3_BLOCKS);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("global_norm", argc, argv);
    const size_t n = dev::NUM_PARAMETERS;

    std::vector<float> grads = dev::random_floatX(n, -0.1f, 0.1f);
    std::vector<float> ref = {(float)sum_of_squares(grads.data(), n)};

    dev::DeviceBuffer<floatX> d_grads(n);
    dev::DeviceBuffer<float> d_out(1), d_partials(std::max(NORM_BLOCKS, NORM_V3_BLOCKS));
    dev::upload(d_grads, grads);
    grads.clear();

    dev::Report report = dev::make_report("global_norm", (double)n * sizeof(floatX), 0.0);
    std::vector<dev::Version> versions = {
        {"v1 block sums + one atomicAdd per block", {256, 512, 1024},
         [&](int bs) { global_norm_v1(d_out.ptr, d_grads.ptr, n, bs); }},
        {"v2 llmc: fixed grid, partials, tree", {0},
         [&](int) { sum_of_squares(d_out.ptr, d_partials.ptr, d_grads.ptr, n, 0); }},
        {"v3 v2 + two loads in flight per thread", {128, 256, 512, 1024},
         [&](int bs) { global_norm_v3(d_out.ptr, d_partials.ptr, d_grads.ptr, n, bs); }},
    };
    dev::run_versions(&report, versions, [&] { dev::poison(d_out); },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "sum of squares", dev::download(d_out), ref, TOL_SUM_FP32);
                          return result;
                      });
    return dev::finish(report);
}
