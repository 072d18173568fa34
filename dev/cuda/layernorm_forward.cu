// LayerNorm forward, version by version, over the (B·T, C) = (8192, 768) activations:
//   out = (x - mean) * rstd * w + b per row, with mean and rstd saved (fp32) for the backward.
// Checked against layernorm_forward() of llmc/layernorm.h and timed.
//
// The two numbers: read 12.6 MB, write 12.6 MB (+ 64 KB of statistics): ~8 us at 3 TB/s. A row is 1.5 KB,
// so the whole input fits in L2 (50 MB), but we time from a cold L2 as the trainer's activations are.
// The work per element is a few flops: memory bound, and the question is only how many times each
// version touches each byte, and how many loads it has in flight.
//
//   make -C dev/cuda bin/layernorm_forward && dev/cuda/bin/layernorm_forward
#include "harness.cuh"

#include "../../llmc/layernorm.cuh"
#include "../../llmc/layernorm.h"

// ----------------------------------------------------------------------------
// v1: one thread per row, three passes over the row (sum, squared deviations, normalize), the CPU
// loop as it is. Neighbouring threads read addresses C elements apart, so every 2-byte load of a warp
// is a separate 32-byte sector: ~16x the traffic the bytes need, mostly caught by L1. And 8192 rows
// make only 8192 threads, a few warps per SM.

__global__ void layernorm_forward_v1_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                            const floatX* weight, const floatX* bias, int N, int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    float sum = 0.0f;
    for (int c = 0; c < C; c++) sum += (float)x[c];
    float m = sum / C;
    float sumsq = 0.0f;
    for (int c = 0; c < C; c++) {
        float d = (float)x[c] - m;
        sumsq += d * d;
    }
    float s = rsqrtf(sumsq / C + LAYERNORM_EPS_F);
    floatX* y = out + (size_t)n * C;
    for (int c = 0; c < C; c++) y[c] = (floatX)(((float)x[c] - m) * s * (float)weight[c] + (float)bias[c]);
    mean[n] = m;
    rstd[n] = s;
}

void layernorm_forward_v1(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                          const floatX* bias, int N, int C, int block_size) {
    layernorm_forward_v1_kernel<<<ceil_div_int(N, block_size), block_size>>>(out, mean, rstd, inp, weight, bias, N, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2: one warp per row. Lane l takes channels l, l+32, ...: a warp's 32 loads are 64 contiguous bytes,
// coalesced; the row's sums are finished with 5 shuffles (warp_reduce_sum) instead of shared memory.
// 32x the threads of v1, each with 1/32 of the row.

__global__ void layernorm_forward_v2_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                            const floatX* weight, const floatX* bias, int N, int C) {
    int n = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (n >= N) return;
    int lane = threadIdx.x % WARP_SIZE;
    const floatX* x = inp + (size_t)n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) sum += (float)x[c];
    float m = warp_reduce_sum(sum) / C;
    float sumsq = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float d = (float)x[c] - m;
        sumsq += d * d;
    }
    float s = rsqrtf(warp_reduce_sum(sumsq) / C + LAYERNORM_EPS_F);
    floatX* y = out + (size_t)n * C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        y[c] = (floatX)(((float)x[c] - m) * s * (float)weight[c] + (float)bias[c]);
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

void layernorm_forward_v2(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                          const floatX* bias, int N, int C, int block_size) {
    int rows_per_block = block_size / WARP_SIZE;
    layernorm_forward_v2_kernel<<<ceil_div_int(N, rows_per_block), block_size>>>(out, mean, rstd, inp, weight, bias,
                                                                                N, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v3 is llmc's layernorm_forward (llmc/layernorm.cuh): v2 with 16-byte loads (8 bf16 per lane per
// access), an eighth of the load instructions. Its three passes still read the row three times; the
// second and third hit L1.

// ----------------------------------------------------------------------------
// v4: v3 with the row held in registers. A row of C <= 1024 is at most 4 chunks of 16 bytes per lane,
// all loaded before the first use (4 loads in flight per lane instead of 1), then both statistics and
// the output come from registers: each byte of the input crosses the memory system once. The output
// is stored with a streaming hint, as the next kernel, not this one, reads it.

constexpr int LN_MAX_CHUNKS = 4;  // 16-byte chunks per lane; C <= 32 * 8 * 4 = 1024

__global__ void layernorm_forward_v4_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                            const floatX* weight, const floatX* bias, int N, int C) {
    int n = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (n >= N) return;
    int lane = threadIdx.x % WARP_SIZE;
    const floatX* row = inp + (size_t)n * C;
    x128 x[LN_MAX_CHUNKS];
#pragma unroll
    for (int j = 0; j < LN_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        x[j] = c < C ? load128cs(row + c) : x128::zeros();
    }
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < LN_MAX_CHUNKS; j++) {
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)x[j][k];  // the zero padding adds nothing
    }
    float m = warp_reduce_sum(sum) / C;
    float sumsq = 0.0f;
#pragma unroll
    for (int j = 0; j < LN_MAX_CHUNKS; j++) {
        if ((j * WARP_SIZE + lane) * x128::size >= C) continue;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            float d = (float)x[j][k] - m;
            sumsq += d * d;
        }
    }
    float s = rsqrtf(warp_reduce_sum(sumsq) / C + LAYERNORM_EPS_F);
    floatX* y_row = out + (size_t)n * C;
#pragma unroll
    for (int j = 0; j < LN_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c >= C) continue;
        x128 w = load128(weight + c);
        x128 b = load128(bias + c);
        x128 y;
#pragma unroll
        for (int k = 0; k < x128::size; k++) y[k] = (floatX)(((float)x[j][k] - m) * s * (float)w[k] + (float)b[k]);
        store128cs(y_row + c, y);
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

void layernorm_forward_v4(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                          const floatX* bias, int N, int C, int block_size) {
    if (C % x128::size != 0 || C > LN_MAX_CHUNKS * WARP_SIZE * x128::size) {
        fatal("layernorm_forward_v4 needs C divisible by %d and at most %d, got %d", x128::size,
              LN_MAX_CHUNKS * WARP_SIZE * x128::size, C);
    }
    int rows_per_block = block_size / WARP_SIZE;
    layernorm_forward_v4_kernel<<<ceil_div_int(N, rows_per_block), block_size>>>(out, mean, rstd, inp, weight, bias,
                                                                                N, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("layernorm_forward", argc, argv);
    const int N = dev::B * dev::T, C = dev::C;

    std::vector<float> inp = dev::random_floatX((size_t)N * C, -2.0f, 2.0f);
    std::vector<float> weight = dev::random_floatX(C, 0.5f, 1.5f);
    std::vector<float> bias = dev::random_floatX(C, -0.5f, 0.5f);
    std::vector<float> ref_out((size_t)N * C), ref_mean(N), ref_rstd(N);
    layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(), weight.data(), bias.data(), N, C);

    dev::DeviceBuffer<floatX> d_inp((size_t)N * C), d_out((size_t)N * C), d_weight(C), d_bias(C);
    dev::DeviceBuffer<float> d_mean(N), d_rstd(N);
    dev::upload(d_inp, inp);
    dev::upload(d_weight, weight);
    dev::upload(d_bias, bias);

    double bytes = 2.0 * N * C * sizeof(floatX) + 2.0 * N * sizeof(float) + 2.0 * C * sizeof(floatX);
    dev::Report report = dev::make_report("layernorm_forward", bytes, 0.0);
    const std::vector<int> blocks = {64, 128, 256, 512, 1024};
    auto args = [&](auto launch, int bs) {
        launch(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, bs);
    };
    std::vector<dev::Version> versions = {
        {"v1 one thread per row", blocks, [&](int bs) { args(layernorm_forward_v1, bs); }},
        {"v2 one warp per row", blocks, [&](int bs) { args(layernorm_forward_v2, bs); }},
        {"v3 llmc: warp per row, 16-byte loads", {0},
         [&](int) {
             layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, 0);
         }},
        {"v4 v3 + row held in registers", blocks, [&](int bs) { args(layernorm_forward_v4, bs); }},
    };
    dev::run_versions(&report, versions,
                      [&] {
                          dev::poison(d_out);
                          dev::poison(d_mean);
                          dev::poison(d_rstd);
                      },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "out", dev::download(d_out), ref_out, dev::TOL_ELEMENTWISE);
                          dev::check_tensor(&result, "mean", dev::download(d_mean), ref_mean, dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "rstd", dev::download(d_rstd), ref_rstd, dev::TOL_REDUCTION);
                          return result;
                      });
    return dev::finish(report);
}
