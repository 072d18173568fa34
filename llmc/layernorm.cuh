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
// in two deterministic stages: a fixed grid of LN_ROW_BLOCKS blocks each sums a fixed subset of rows
// into its own fp32 partial, then one kernel adds the partials in block order into dw and db.
#pragma once

#include "cuda_common.cuh"

constexpr float LAYERNORM_EPS_F = 1e-5f;
constexpr int LN_ROW_BLOCKS = 128;  // partial sums for dw, db; fixed so the summation order is too

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

// dinp += ...: one warp per row
__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
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
    float mean_g = warp_reduce_sum(sum_g) / C;
    float mean_gx = warp_reduce_sum(sum_gx) / C;
    for (int c = lane * x128::size; c < C; c += WARP_SIZE * x128::size) {
        x128 dy = load128(dout + offset + c);
        x128 x = load128(inp + offset + c);
        x128 w = load128(weight + c);
        x128 dx = load128(dinp + offset + c);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            float g = (float)dy[k] * (float)w[k];
            float xhat = ((float)x[k] - m) * s;
            dx[k] = (floatX)((float)dx[k] + s * (g - mean_g - xhat * mean_gx));
        }
        store128(dinp + offset + c, dx);
    }
}

// Stage 1 of dw, db. Block (32, 8) covers 256 channels (32 lanes x 8) of grid column blockIdx.x;
// row block blockIdx.y of LN_ROW_BLOCKS takes rows blockIdx.y*8 + threadIdx.y, stepping 8*LN_ROW_BLOCKS.
constexpr int LN_BWD_ROWS_PER_BLOCK = 8;

__global__ void layernorm_backward_partials_kernel(float* partials,  // (LN_ROW_BLOCKS, 2, C)
                                                   const floatX* dout, const floatX* inp, const float* mean,
                                                   const float* rstd, int N, int C) {
    __shared__ float shared_dw[LN_BWD_ROWS_PER_BLOCK][WARP_SIZE][x128::size];
    __shared__ float shared_db[LN_BWD_ROWS_PER_BLOCK][WARP_SIZE][x128::size];
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

// Stage 2: dweight[c] += sum of the partials in row-block order (same for dbias).
__global__ void layernorm_backward_sum_partials_kernel(floatX* dweight, floatX* dbias, const float* partials,
                                                       int num_row_blocks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int r = 0; r < num_row_blocks; r++) {
        dw += partials[(size_t)r * 2 * C + c];
        db += partials[(size_t)r * 2 * C + C + c];
    }
    dweight[c] = (floatX)((float)dweight[c] + dw);
    dbias[c] = (floatX)((float)dbias[c] + db);
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
inline size_t layernorm_backward_scratch_floats(int C) { return (size_t)LN_ROW_BLOCKS * 2 * C; }

// Accumulates (+=) into dinp, dweight and dbias.
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
    int grid_size = ceil_div_int(N, LN_WARPS_PER_BLOCK);
    layernorm_backward_dinp_kernel<<<grid_size, LN_WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    cudaCheckLaunch();

    dim3 partial_grid(ceil_div_int(C / x128::size, WARP_SIZE), LN_ROW_BLOCKS);
    dim3 partial_block(WARP_SIZE, LN_BWD_ROWS_PER_BLOCK);
    layernorm_backward_partials_kernel<<<partial_grid, partial_block, 0, stream>>>(scratch, dout, inp, mean, rstd,
                                                                                   N, C);
    cudaCheckLaunch();
    layernorm_backward_sum_partials_kernel<<<ceil_div_int(C, 256), 256, 0, stream>>>(dweight, dbias, scratch,
                                                                                    LN_ROW_BLOCKS, C);
    cudaCheckLaunch();
}
