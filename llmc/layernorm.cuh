// LayerNorm on the GPU: forward, residual-add fused with the next LayerNorm, and backward.
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + 1e-5)
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w,  xhat = (x - mean) * rstd
//   dw += sum_n dy * xhat,   db += sum_n dy
//
// One warp owns one row (C channels, 8 per lane per 16-byte load), so a row's statistics need only
// warp shuffles. mean and rstd are kept in fp32 for the backward.
//
// The fused residual kernel writes residual = a + b rounded to floatX and normalizes *that rounded
// value*, so recomputing the LayerNorm later from the stored residual (-r 2) gives the same bits.
//
// dw and db are sums over all B·T rows. Rather than atomics (run-to-run noise), the backward does it
// in two deterministic stages: a fixed grid of LN_BWD_BLOCKS blocks each sums a fixed subset of rows
// into its own fp32 partial (in the same pass that computes dinp: layernorm_backward_kernel), then one
// kernel adds the partials in block order into dw and db.
#pragma once

#include <algorithm>

#include "cuda_common.cuh"

constexpr float LAYERNORM_EPS_F = 1e-5f;

// ----------------------------------------------------------------------------
// kernels

// Normalizes `row` (already in global memory) and writes out, mean, rstd. One warp, one row.
__device__ inline void layernorm_row(floatX* out_row, float* mean, float* rstd, const floatX* row,
                                     const floatX* weight, const floatX* bias, int C, int lane) {
    float sum = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 x = load128(row + c);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)x[k];
    }
    float m = warp_reduce_sum(sum) / C;
    float sumsq = 0.0f;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 x = load128(row + c);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            float d = (float)x[k] - m;
            sumsq += d * d;
        }
    }
    float s = rsqrtf(warp_reduce_sum(sumsq) / C + LAYERNORM_EPS_F);
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 x = load128(row + c);
        x128 w = load128(weight + c);
        x128 b = load128(bias + c);
        x128 y;
#pragma unroll
        for (int k = 0; k < x128::size; k++) y[k] = (floatX)(((float)x[k] - m) * s * (float)w[k] + (float)b[k]);
        store128(out_row + c, y);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    int n = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (n >= N) return;
    size_t offset = (size_t)n * C;
    layernorm_row(out + offset, mean + n, rstd + n, inp + offset, weight, bias, C, threadIdx.x % WARP_SIZE);
}

__global__ void fused_residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                        const floatX* inp1, const floatX* inp2,
                                                        const floatX* weight, const floatX* bias, int N, int C) {
    int n = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (n >= N) return;
    int lane = threadIdx.x % WARP_SIZE;
    size_t offset = (size_t)n * C;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 a = load128(inp1 + offset + c);
        x128 b = load128(inp2 + offset + c);
        x128 r;
#pragma unroll
        for (int k = 0; k < x128::size; k++) r[k] = (floatX)((float)a[k] + (float)b[k]);
        store128(residual + offset + c, r);
    }
    // each lane re-reads only the chunks it wrote itself, so no synchronization is needed
    layernorm_row(out + offset, mean + n, rstd + n, residual + offset, weight, bias, C, lane);
}

// The second pass of a row's backward, one warp: dinp += rstd · (g - mean(g) - xhat · mean(g · xhat)), the
// two means already reduced (g = dout · w, xhat = (x - mean) · rstd).
__device__ inline void layernorm_row_dinp(floatX* dinp_row, const floatX* dout_row, const floatX* inp_row,
                                          const floatX* weight, float m, float s, float mean_g, float mean_gx, int C,
                                          int lane) {
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 dy = load128(dout_row + c);
        x128 x = load128(inp_row + c);
        x128 w = load128(weight + c);
        x128 dx = load128(dinp_row + c);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            float g = (float)dy[k] * (float)w[k];
            float xhat = ((float)x[k] - m) * s;
            dx[k] = (floatX)((float)dx[k] + s * (g - mean_g - xhat * mean_gx));
        }
        store128(dinp_row + c, dx);
    }
}

// The backward in one pass over the rows. A fixed grid of LN_BWD_BLOCKS blocks of LN_BWD_WARPS warps
// (fewer when N is smaller than that many warps); each warp takes whole rows (row n goes to warp n mod
// the grid's warps, a function of n and N alone) and computes dinp as a warp per row does, with 16-byte loads: a first pass over the row for
// the two means, a second (from L1) for dinp. In the first pass it also adds dout * xhat and dout into
// its own fp32 slice of shared memory, in which each word belongs to one lane (lane l owns the same
// channels in every row): no atomics, and the order of every sum is fixed. At the end the block adds
// its warps' slices in warp order into its fp32 partial row. dout and inp come from DRAM once.
// A slice word is laid out lane-fastest, (chunk, k, lane) for channel (chunk·32 + lane)·8 + k, so a
// warp's 32 lanes touch 32 consecutive words: no bank conflicts.
constexpr int LN_BWD_BLOCKS = 512;  // fixed, so the summation order of dweight and dbias is fixed too
constexpr int LN_BWD_WARPS = 8;

__host__ __device__ inline int layernorm_backward_chunks(int C) { return (C + WARP_SIZE * x128::size - 1) / (WARP_SIZE * x128::size); }

__global__ void __launch_bounds__(LN_BWD_WARPS * WARP_SIZE)
    layernorm_backward_kernel(floatX* dinp, float* partials,  // (LN_BWD_BLOCKS, 2, C)
                              const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
                              const float* rstd, int N, int C) {
    extern __shared__ float warp_sums[];  // (LN_BWD_WARPS, 2, S): dweight's sums, then dbias's
    const int S = layernorm_backward_chunks(C) * WARP_SIZE * x128::size;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float* dw = warp_sums + (size_t)warp * 2 * S;
    float* db = dw + S;
    for (int q = lane; q < S; q += WARP_SIZE) dw[q] = db[q] = 0.0f;  // this lane's words only
    for (int n = blockIdx.x * LN_BWD_WARPS + warp; n < N; n += gridDim.x * LN_BWD_WARPS) {
        size_t offset = (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int chunk = 0, c = lane * x128::size; c < C; chunk++, c += WARP_SIZE * x128::size) {
            x128 dy = load128(dout + offset + c);
            x128 x = load128(inp + offset + c);
            x128 w = load128(weight + c);
            int q = chunk * WARP_SIZE * x128::size + lane;
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                float d = (float)dy[k];
                float xhat = ((float)x[k] - m) * s;
                float g = d * (float)w[k];
                sum_g += g;
                sum_gx += g * xhat;
                dw[q + k * WARP_SIZE] += d * xhat;
                db[q + k * WARP_SIZE] += d;
            }
        }
        layernorm_row_dinp(dinp + offset, dout + offset, inp + offset, weight, m, s, warp_reduce_sum(sum_g) / C,
                           warp_reduce_sum(sum_gx) / C, C, lane);
    }
    __syncthreads();
    // the block's partial row: its warps' sums, added in warp order
    float* out = partials + (size_t)blockIdx.x * 2 * C;
    for (int q = threadIdx.x; q < S; q += blockDim.x) {
        int chunk = q / (WARP_SIZE * x128::size), k = q / WARP_SIZE % x128::size, l = q % WARP_SIZE;
        int c = (chunk * WARP_SIZE + l) * x128::size + k;
        if (c >= C) continue;
        float sum_dw = 0.0f, sum_db = 0.0f;
        for (int w = 0; w < LN_BWD_WARPS; w++) {
            sum_dw += warp_sums[(size_t)w * 2 * S + q];
            sum_db += warp_sums[(size_t)w * 2 * S + S + q];
        }
        out[c] = sum_dw;
        out[C + c] = sum_db;
    }
}

// Stage 2: dweight[c] += the sum of the partial rows (likewise dbias), in a fixed order: thread (x, y) of
// a (32, LN_SUM_ROWS) block sums partial rows y, y + LN_SUM_ROWS, ... of channel blockIdx.x·32 + x (32
// neighbouring channels: coalesced), then the y = 0 row of threads adds the LN_SUM_ROWS sums in y order.
// A thread per channel alone would wait on its partial rows' loads one after another.
constexpr int LN_SUM_ROWS = 16;

__global__ void layernorm_backward_sum_partials_kernel(floatX* dweight, floatX* dbias, const float* partials,
                                                       int num_row_blocks, int C) {
    __shared__ float sums[2][LN_SUM_ROWS][WARP_SIZE];
    int c = blockIdx.x * WARP_SIZE + threadIdx.x;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int r = threadIdx.y; r < num_row_blocks; r += LN_SUM_ROWS) {
            dw += partials[(size_t)r * 2 * C + c];
            db += partials[(size_t)r * 2 * C + C + c];
        }
    }
    sums[0][threadIdx.y][threadIdx.x] = dw;
    sums[1][threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < LN_SUM_ROWS; y++) {
        dw += sums[0][y][threadIdx.x];
        db += sums[1][y][threadIdx.x];
    }
    dweight[c] = (floatX)((float)dweight[c] + dw);
    dbias[c] = (floatX)((float)dbias[c] + db);
}

inline void layernorm_backward_sum_partials(floatX* dweight, floatX* dbias, const float* partials, int num_row_blocks,
                                            int C, cudaStream_t stream) {
    layernorm_backward_sum_partials_kernel<<<ceil_div_int(C, WARP_SIZE), dim3(WARP_SIZE, LN_SUM_ROWS), 0, stream>>>(
        dweight, dbias, partials, num_row_blocks, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// launchers

inline void check_layernorm_shape(int C) {
    if (C % x128::size != 0) {
        fatal("the CUDA layernorm needs channels divisible by %d, got %d", x128::size, C);
    }
}

constexpr int LN_WARPS_PER_BLOCK = 8;

inline void layernorm_forward(floatX* out,          // (N, C) with N = B*T
                              float* mean,          // (N)
                              float* rstd,          // (N)
                              const floatX* inp,    // (N, C)
                              const floatX* weight, // (C)
                              const floatX* bias,   // (C)
                              int N, int C, cudaStream_t stream) {
    check_layernorm_shape(C);
    int grid_size = ceil_div_int(N, LN_WARPS_PER_BLOCK);
    layernorm_forward_kernel<<<grid_size, LN_WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(out, mean, rstd, inp, weight,
                                                                                      bias, N, C);
    cudaCheckLaunch();
}

// residual = inp1 + inp2, then out = layernorm(residual)
inline void fused_residual_layernorm_forward(floatX* residual,     // (N, C)
                                             floatX* out,          // (N, C)
                                             float* mean,          // (N)
                                             float* rstd,          // (N)
                                             const floatX* inp1,   // (N, C)
                                             const floatX* inp2,   // (N, C)
                                             const floatX* weight, // (C)
                                             const floatX* bias,   // (C)
                                             int N, int C, cudaStream_t stream) {
    check_layernorm_shape(C);
    int grid_size = ceil_div_int(N, LN_WARPS_PER_BLOCK);
    fused_residual_layernorm_forward_kernel<<<grid_size, LN_WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(
        residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    cudaCheckLaunch();
}

// fp32 scratch the backward needs for its dw/db partial sums
inline size_t layernorm_backward_scratch_floats(int C) { return (size_t)LN_BWD_BLOCKS * 2 * C; }

// Accumulates (+=) into dinp, dweight and dbias: layernorm_backward_kernel, then the partials summed in
// block order.
inline void layernorm_backward(floatX* dinp,         // (N, C)
                               floatX* dweight,      // (C)
                               floatX* dbias,        // (C)
                               float* scratch,       // layernorm_backward_scratch_floats(C)
                               const floatX* dout,   // (N, C)
                               const floatX* inp,    // (N, C)
                               const floatX* weight, // (C)
                               const float* mean,    // (N)
                               const float* rstd,    // (N)
                               int N, int C, cudaStream_t stream) {
    check_layernorm_shape(C);
    size_t shared_bytes = (size_t)LN_BWD_WARPS * 2 * layernorm_backward_chunks(C) * WARP_SIZE * x128::size * sizeof(float);
    static size_t allowed = 48 * 1024;  // what a launch may take without asking
    if (shared_bytes > allowed) {
        int device = 0, limit = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if (shared_bytes > (size_t)limit) {
            fatal("layernorm backward at C=%d needs %zu bytes of shared memory per block, this GPU allows %d", C,
                  shared_bytes, limit);
        }
        cudaCheck(cudaFuncSetAttribute(layernorm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared_bytes));
        allowed = shared_bytes;
    }
    // fewer blocks only when there are fewer rows than warps (a short sampling or test pass): the grid,
    // and so every sum's order, is still a function of N alone
    int blocks = std::max(1, std::min(LN_BWD_BLOCKS, ceil_div_int(N, LN_BWD_WARPS)));
    layernorm_backward_kernel<<<blocks, LN_BWD_WARPS * WARP_SIZE, shared_bytes, stream>>>(dinp, scratch, dout, inp,
                                                                                         weight, mean, rstd, N, C);
    cudaCheckLaunch();
    layernorm_backward_sum_partials(dweight, dbias, scratch, blocks, C, stream);
}
