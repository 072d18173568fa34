// LayerNorm backward, version by version, over (B·T, C) = (8192, 768), adding into dinp, dweight, dbias:
//   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * w,  xhat = (x - mean) * rstd
//   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout
// Checked against layernorm_backward() of llmc/layernorm.h and timed.
//
// Every output is added into, so outputs cannot be poisoned: each run starts them from random values
// instead, and an element a version forgot to add to is off by its whole increment.
//
// The two numbers: read dout, inp and dinp, write dinp: 4 x 12.6 MB = 50 MB, ~17 us at 3 TB/s. The
// row part (dinp) and the column part (dweight, dbias: sums over all 8192 rows) want different
// parallelizations; how to do both without reading dout and inp twice is the lesson here.
//
//   make -C dev/cuda bin/layernorm_backward && dev/cuda/bin/layernorm_backward
#include "harness.cuh"

#include "../../llmc/layernorm.cuh"
#include "../../llmc/layernorm.h"

// ----------------------------------------------------------------------------
// v1: the CPU loops as two kernels. One thread per row for dinp (two passes over its row, uncoalesced:
// neighbouring threads are C elements apart), one thread per channel for dweight and dbias (coalesced:
// neighbouring threads read neighbouring channels of a row, but only C = 768 threads, a few per SM).

__global__ void layernorm_backward_v1_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                                  const floatX* weight, const float* mean, const float* rstd,
                                                  int N, int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const floatX* dy = dout + (size_t)n * C;
    const floatX* x = inp + (size_t)n * C;
    floatX* dx = dinp + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float mean_g = 0.0f, mean_gx = 0.0f;
    for (int c = 0; c < C; c++) {
        float g = (float)dy[c] * (float)weight[c];
        mean_g += g;
        mean_gx += g * ((float)x[c] - m) * s;
    }
    mean_g /= C;
    mean_gx /= C;
    for (int c = 0; c < C; c++) {
        float g = (float)dy[c] * (float)weight[c];
        float xhat = ((float)x[c] - m) * s;
        dx[c] = (floatX)((float)dx[c] + s * (g - mean_g - xhat * mean_gx));
    }
}

__global__ void layernorm_backward_v1_dweight_kernel(floatX* dweight, floatX* dbias, const floatX* dout,
                                                     const floatX* inp, const float* mean, const float* rstd, int N,
                                                     int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int n = 0; n < N; n++) {
        float dy = (float)dout[(size_t)n * C + c];
        dw += dy * ((float)inp[(size_t)n * C + c] - mean[n]) * rstd[n];
        db += dy;
    }
    dweight[c] = (floatX)((float)dweight[c] + dw);
    dbias[c] = (floatX)((float)dbias[c] + db);
}

void layernorm_backward_v1(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                           const floatX* weight, const float* mean, const float* rstd, int N, int C, int block_size) {
    layernorm_backward_v1_dinp_kernel<<<ceil_div_int(N, block_size), block_size>>>(dinp, dout, inp, weight, mean,
                                                                                  rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_v1_dweight_kernel<<<ceil_div_int(C, block_size), block_size>>>(dweight, dbias, dout, inp, mean,
                                                                                     rstd, N, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2, llmc's until v4: a warp per row with 16-byte loads for dinp; then dweight and dbias in two
// deterministic stages (a fixed grid of row blocks writes fp32 partial sums, one small kernel adds them
// in block order). All coalesced and full-width, but dout and inp are read twice: once by the dinp
// kernel and once by the partials kernel, 6 tensor passes for 4.

constexpr int LN_V2_ROW_BLOCKS = 128;

// dinp += ...: one warp per row
__global__ void layernorm_backward_v2_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                               const floatX* weight, const float* mean, const float* rstd,
                                               int N, int C) {
    int n = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (n >= N) return;
    int lane = threadIdx.x % WARP_SIZE;
    size_t offset = (size_t)n * C;
    float m = mean[n], s = rstd[n];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 dy = load128(dout + offset + c);
        x128 x = load128(inp + offset + c);
        x128 w = load128(weight + c);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            float g = (float)dy[k] * (float)w[k];
            sum_g += g;
            sum_gx += g * ((float)x[k] - m) * s;
        }
    }
    // the second pass, as llmc's kernel does it
    layernorm_row_dinp(dinp + offset, dout + offset, inp + offset, weight, m, s, warp_reduce_sum(sum_g) / C,
                       warp_reduce_sum(sum_gx) / C, C, lane);
}

// Stage 1 of dw, db. Block (32, 8) covers 256 channels (32 lanes x 8) of grid column blockIdx.x;
// row block blockIdx.y of LN_V2_ROW_BLOCKS takes rows blockIdx.y*8 + threadIdx.y, stepping 8*LN_V2_ROW_BLOCKS.
constexpr int LN_V2_ROWS_PER_BLOCK = 8;

__global__ void layernorm_backward_v2_partials_kernel(float* partials,  // (LN_V2_ROW_BLOCKS, 2, C)
                                                   const floatX* dout, const floatX* inp, const float* mean,
                                                   const float* rstd, int N, int C) {
    __shared__ float shared_dw[LN_V2_ROWS_PER_BLOCK][WARP_SIZE][x128::size];
    __shared__ float shared_db[LN_V2_ROWS_PER_BLOCK][WARP_SIZE][x128::size];
    int c = (blockIdx.x * WARP_SIZE + threadIdx.x) * x128::size;
    bool active = c < C;
    float dw[x128::size] = {}, db[x128::size] = {};
    if (active) {
        for (int n = blockIdx.y * blockDim.y + threadIdx.y; n < N; n += gridDim.y * blockDim.y) {
            x128 dy = load128(dout + (size_t)n * C + c);
            x128 x = load128(inp + (size_t)n * C + c);
            float m = mean[n], s = rstd[n];
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                dw[k] += (float)dy[k] * ((float)x[k] - m) * s;
                db[k] += (float)dy[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < x128::size; k++) {
        shared_dw[threadIdx.y][threadIdx.x][k] = dw[k];
        shared_db[threadIdx.y][threadIdx.x][k] = db[k];
    }
    __syncthreads();
    if (threadIdx.y != 0 || !active) return;
    for (int y = 1; y < blockDim.y; y++) {
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            dw[k] += shared_dw[y][threadIdx.x][k];
            db[k] += shared_db[y][threadIdx.x][k];
        }
    }
    float* out = partials + (size_t)blockIdx.y * 2 * C;
#pragma unroll
    for (int k = 0; k < x128::size; k++) {
        out[c + k] = dw[k];
        out[C + c + k] = db[k];
    }
}

void layernorm_backward_v2(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch /* 128*2*C */,
                           const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
                           const float* rstd, int N, int C) {
    layernorm_backward_v2_dinp_kernel<<<ceil_div_int(N, 8), 8 * WARP_SIZE>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    cudaCheckLaunch();
    dim3 partial_grid(ceil_div_int(C / x128::size, WARP_SIZE), LN_V2_ROW_BLOCKS);
    dim3 partial_block(WARP_SIZE, LN_V2_ROWS_PER_BLOCK);
    layernorm_backward_v2_partials_kernel<<<partial_grid, partial_block>>>(scratch, dout, inp, mean, rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_sum_partials(dweight, dbias, scratch, LN_V2_ROW_BLOCKS, C, 0);
}

// ----------------------------------------------------------------------------
// v3: one pass. A fixed grid of LN_V3_BLOCKS blocks; each warp takes whole rows (grid-stride) and,
// while it has a row's dout and inp in registers for dinp, also adds dout * xhat and dout into
// per-lane fp32 sums for the channels it owns (lane l owns the same channels in every row). At the end
// the warps of a block add their sums into shared memory one warp after another (a fixed order), and
// the block writes one fp32 partial row; a second small kernel adds the partials in block order. So
// dout and inp are read once: 4 tensor passes, a third fewer bytes than v2, and still deterministic.
// The weight is loaded once per warp and kept in registers.

constexpr int LN_MAX_CHUNKS = 4;       // 16-byte chunks per lane; C <= 32 * 8 * 4 = 1024
constexpr int LN_V3_BLOCKS = 256;  // fixed, so the summation order of dweight and dbias is fixed too

__global__ void __launch_bounds__(256) layernorm_backward_v3_kernel(floatX* dinp, float* partials,  // (gridDim.x, 2, C)
                                             const floatX* dout, const floatX* inp, const floatX* weight,
                                             const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float block_sums[];  // (2, C): dweight then dbias
    int warp = threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    int num_warps = blockDim.x / WARP_SIZE;

    x128 w[LN_MAX_CHUNKS];
    float dw[LN_MAX_CHUNKS][x128::size] = {}, db[LN_MAX_CHUNKS][x128::size] = {};
#pragma unroll
    for (int j = 0; j < LN_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        w[j] = c < C ? load128(weight + c) : x128::zeros();
    }

    for (int n = blockIdx.x * num_warps + warp; n < N; n += gridDim.x * num_warps) {
        size_t offset = (size_t)n * C;
        x128 dy[LN_MAX_CHUNKS], x[LN_MAX_CHUNKS];
#pragma unroll
        for (int j = 0; j < LN_MAX_CHUNKS; j++) {
            int c = (j * WARP_SIZE + lane) * x128::size;
            dy[j] = c < C ? load128cs(dout + offset + c) : x128::zeros();
            x[j] = c < C ? load128cs(inp + offset + c) : x128::zeros();
        }
        float m = mean[n], s = rstd[n];
        float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
        for (int j = 0; j < LN_MAX_CHUNKS; j++) {
            if ((j * WARP_SIZE + lane) * x128::size >= C) continue;
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                float d = (float)dy[j][k];
                float g = d * (float)w[j][k];
                float xhat = ((float)x[j][k] - m) * s;
                sum_g += g;
                sum_gx += g * xhat;
                dw[j][k] += d * xhat;
                db[j][k] += d;
            }
        }
        float mean_g = warp_reduce_sum(sum_g) / C;
        float mean_gx = warp_reduce_sum(sum_gx) / C;
#pragma unroll
        for (int j = 0; j < LN_MAX_CHUNKS; j++) {
            int c = (j * WARP_SIZE + lane) * x128::size;
            if (c >= C) continue;
            x128 dx = load128(dinp + offset + c);
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                float g = (float)dy[j][k] * (float)w[j][k];
                float xhat = ((float)x[j][k] - m) * s;
                dx[k] = (floatX)((float)dx[k] + s * (g - mean_g - xhat * mean_gx));
            }
            store128(dinp + offset + c, dx);
        }
    }

    // the block's sums, warp 0 first, then warp 1 adds, ...: the same order every run
    for (int turn = 0; turn < num_warps; turn++) {
        if (warp == turn) {
#pragma unroll
            for (int j = 0; j < LN_MAX_CHUNKS; j++) {
                int c = (j * WARP_SIZE + lane) * x128::size;
                if (c >= C) continue;
#pragma unroll
                for (int k = 0; k < x128::size; k++) {
                    block_sums[c + k] = (turn == 0 ? 0.0f : block_sums[c + k]) + dw[j][k];
                    block_sums[C + c + k] = (turn == 0 ? 0.0f : block_sums[C + c + k]) + db[j][k];
                }
            }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) partials[(size_t)blockIdx.x * 2 * C + i] = block_sums[i];
}

// dweight[c] += sum of the partials over blocks, in block order (likewise dbias)
__global__ void layernorm_backward_v3_sum_kernel(floatX* dweight, floatX* dbias, const float* partials,
                                                 int num_blocks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int b = 0; b < num_blocks; b++) {
        dw += partials[(size_t)b * 2 * C + c];
        db += partials[(size_t)b * 2 * C + C + c];
    }
    dweight[c] = (floatX)((float)dweight[c] + dw);
    dbias[c] = (floatX)((float)dbias[c] + db);
}

void layernorm_backward_v3(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch /* LN_V3_BLOCKS*2*C */,
                           const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
                           const float* rstd, int N, int C, int block_size) {
    if (C % x128::size != 0 || C > LN_MAX_CHUNKS * WARP_SIZE * x128::size) {
        fatal("layernorm_backward_v3 needs C divisible by %d and at most %d, got %d", x128::size,
              LN_MAX_CHUNKS * WARP_SIZE * x128::size, C);
    }
    size_t shared_bytes = 2 * (size_t)C * sizeof(float);
    layernorm_backward_v3_kernel<<<LN_V3_BLOCKS, block_size, shared_bytes>>>(dinp, scratch, dout, inp, weight, mean,
                                                                              rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_v3_sum_kernel<<<ceil_div_int(C, 256), 256>>>(dweight, dbias, scratch, LN_V3_BLOCKS, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v4 is llmc's layernorm_backward now (llmc/layernorm.cuh, layernorm_backward_kernel): v3's single
// pass, with the column sums in shared memory instead of registers, so any C fits and a lane holds no
// more than v2's dinp kernel did: each warp adds dout * xhat and dout of its rows into its own fp32
// slice (each word owned by one lane, laid out lane-fastest: no bank conflicts, no atomics), and the
// block adds its 8 warps' slices in warp order. 512 blocks of 8 warps (49 KB of shared memory at
// C = 768: up to 4 blocks, 32 warps an SM) keep more loads in flight than v3's 256 blocks could. Why
// it should be faster than v2: 4 tensor passes instead of 6 (dout and inp read once), in full-width
// accesses; the cost is the shared-memory adds (4 C floats a row, far under the SM's shared bandwidth)
// and a longer final sum (512 partial rows instead of 128), which llmc's sum kernel now splits over 16
// threads a channel (v2 here uses it too; it summed a channel's 128 rows in one thread before).

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("layernorm_backward", argc, argv);
    const int N = dev::B * dev::T, C = dev::C;

    std::vector<float> inp = dev::random_floatX((size_t)N * C, -2.0f, 2.0f);
    std::vector<float> weight = dev::random_floatX(C, 0.5f, 1.5f);
    std::vector<float> bias = dev::random_floatX(C, -0.5f, 0.5f);
    std::vector<float> dout = dev::random_floatX((size_t)N * C, -1.0f, 1.0f);
    std::vector<float> dinp0 = dev::random_floatX((size_t)N * C, -0.5f, 0.5f);
    std::vector<float> dweight0 = dev::random_floatX(C, -1.0f, 1.0f);
    std::vector<float> dbias0 = dev::random_floatX(C, -1.0f, 1.0f);
    // the statistics come from the CPU forward, in fp32 as the GPU forward saves them
    std::vector<float> out((size_t)N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    std::vector<float> ref_dinp = dinp0, ref_dweight = dweight0, ref_dbias = dbias0;
    layernorm_backward(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), inp.data(), weight.data(),
                       mean.data(), rstd.data(), N, C);

    dev::DeviceBuffer<floatX> d_inp((size_t)N * C), d_weight(C), d_dout((size_t)N * C);
    dev::DeviceBuffer<floatX> d_dinp((size_t)N * C), d_dweight(C), d_dbias(C);
    dev::DeviceBuffer<floatX> d_dinp0((size_t)N * C), d_dweight0(C), d_dbias0(C);  // their starting values
    dev::DeviceBuffer<float> d_mean(N), d_rstd(N);
    size_t scratch_floats = std::max({layernorm_backward_scratch_floats(C), (size_t)LN_V3_BLOCKS * 2 * C,
                                      (size_t)LN_V2_ROW_BLOCKS * 2 * C});
    dev::DeviceBuffer<float> d_scratch(scratch_floats);
    dev::upload(d_inp, inp);
    dev::upload(d_weight, weight);
    dev::upload(d_dout, dout);
    dev::upload(d_mean, mean);
    dev::upload(d_rstd, rstd);
    dev::upload(d_dinp0, dinp0);
    dev::upload(d_dweight0, dweight0);
    dev::upload(d_dbias0, dbias0);

    double bytes = 4.0 * N * C * sizeof(floatX) + 2.0 * N * sizeof(float) + 5.0 * C * sizeof(floatX);
    dev::Report report = dev::make_report("layernorm_backward", bytes, 0.0);
    std::vector<dev::Version> versions = {
        {"v1 thread per row + thread per channel", {64, 128, 256, 512},
         [&](int bs) {
             layernorm_backward_v1(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr,
                                   d_mean.ptr, d_rstd.ptr, N, C, bs);
         }},
        {"v2 warp per row + 2-stage column sums", {0},
         [&](int) {
             layernorm_backward_v2(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr,
                                   d_weight.ptr, d_mean.ptr, d_rstd.ptr, N, C);
         }},
        // v3 holds 64 fp32 sums per lane (~170 registers): at most 384 threads fit one SM's 64K registers
        {"v3 one pass: column sums from the row pass", {64, 128, 256},
         [&](int bs) {
             layernorm_backward_v3(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr,
                                   d_weight.ptr, d_mean.ptr, d_rstd.ptr, N, C, bs);
         }},
        {"v4 llmc: one pass, column sums in shared memory", {0},
         [&](int) {
             layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr,
                                d_weight.ptr, d_mean.ptr, d_rstd.ptr, N, C, 0);
         }},
    };
    dev::run_versions(&report, versions,
                      [&] {
                          dev::copy(d_dinp, d_dinp0);
                          dev::copy(d_dweight, d_dweight0);
                          dev::copy(d_dbias, d_dbias0);
                      },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "dinp", dev::download(d_dinp), ref_dinp, dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "dweight", dev::download(d_dweight), ref_dweight, dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "dbias", dev::download(d_dbias), ref_dbias, dev::TOL_REDUCTION);
                          return result;
                      });
    return dev::finish(report);
}
