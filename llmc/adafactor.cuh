// Adafactor on the GPU: llmc/adafactor.h's definition (torch.optim.Adafactor's, with its defaults) for
// one tensor p with gradient g, its update t (from 1), learning rate lr and weight decay wd:
//   w = t^-0.8, rho = min(lr, 1/sqrt(t)), alpha = max(eps2, RMS(p)) rho          (host, from t and lr)
//   matrix (rows, cols): R_i = lerp(R_i, mean_j g_ij², w), C_j = lerp(C_j, mean_i g_ij², w),
//                        V_ij = R_i C_j / max(mean_i R_i, eps1)
//   vector:              V_i = lerp(V_i, g_i², w)
//   U = g / sqrt(max(V, eps1²)),  p = p (1 - lr wd) - alpha / max(1, RMS(U) / d) U
// as a few kernels per tensor, with every scalar that depends on the data (RMS(p), mean_i R_i, RMS(U))
// left on the device, so nothing waits for the host. Every sum has a fixed order for a given size (a
// fixed grid of blocks, each a fixed strided subset; the row and column sums in index order, the
// column sums in double over up to Vp = 50304 rows), so data-parallel processes with the same gradient
// compute the same bits.
//
// Adafactor is the optimizer for when memory is short: it keeps no fp32 master weights here (the floatX
// parameters are updated with stochastic rounding, as AdamW's are under -w 0), so its state is its
// factors alone (rows + cols floats per matrix, n per vector).
#pragma once

#include <cmath>

#include "adafactor_hyper.h"
#include "adamw.cuh"
#include "cuda_common.cuh"
#include "global_norm.cuh"  // NORM_BLOCKS
#include "muon_hyper.h"

constexpr int ADAFACTOR_THREADS = 256;

// ----------------------------------------------------------------------------
// kernels

// partials[blockIdx.x] = the sum of x² over this block's strided subset of x (n)
__global__ void adafactor_partial_squares_kernel(float* partials, const floatX* x, size_t n) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = (float)x[i];
        sum += v * v;
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// *out = the sum of partials[0 .. count), one block
__global__ void adafactor_sum_kernel(float* out, const float* partials, int count) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *out = sum;
}

// One block per row i: R_i = lerp(R_i, mean_j (g_ij s)², w)
__global__ void adafactor_rows_kernel(float* row, const floatX* g, int cols, float grad_scale, float w) {
    const floatX* gi = g + (size_t)blockIdx.x * cols;
    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = (float)gi[j] * grad_scale;
        sum += v * v;
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row[blockIdx.x] = lerp_as_torch(row[blockIdx.x], sum / (float)cols, w);
}

// One thread per column j, down the rows in order (neighbouring threads read neighbouring columns):
// C_j = lerp(C_j, mean_i (g_ij s)², w)
__global__ void adafactor_cols_kernel(float* col, const floatX* g, int rows, int cols, float grad_scale, float w) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    double sum = 0.0;
    for (int i = 0; i < rows; i++) {
        float v = (float)g[(size_t)i * cols + j] * grad_scale;
        sum += (double)(v * v);
    }
    col[j] = lerp_as_torch(col[j], (float)(sum / (double)rows), w);
}

// V_i = lerp(V_i, (g_i s)², w)
// elementwise, 16 bytes at a time (cuda_common.cuh)
__global__ void adafactor_vector_kernel(float* variance, const floatX* g, size_t n, float grad_scale, float w,
                                        bool vector) {
    auto update = [&](float& variance_i, float g_i) {
        float v = g_i * grad_scale;
        variance_i = lerp_as_torch(variance_i, v * v, w);
    };
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 gv = load128(g + i0);
            float var[ELEMENTWISE_E];
            load_floats(var, variance + i0);
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) update(var[k], (float)gv[k]);
            store_floats(variance + i0, var);
        },
        [&](size_t i) { update(variance[i], (float)g[i]); });
}

// U_i = g_i s / sqrt(max(V_i, floor)) for element i = (r, c) of the tensor, V from the factors (row !=
// nullptr: V = R_r C_c / *row_mean) or the per-element variance; g_i given
__device__ inline float adafactor_u_at(float g_i, size_t i, size_t r, int c, float grad_scale, const float* row,
                                       const float* col, const float* row_mean, const float* variance, float floor) {
    float v = row != nullptr ? row[r] * col[c] / *row_mean : variance[i];
    return g_i * grad_scale * (1.0f / sqrtf(fmaxf(v, floor)));
}

__device__ inline float adafactor_u(const floatX* g, size_t i, float grad_scale, const float* row, const float* col,
                                    const float* row_mean, const float* variance, int cols, float floor) {
    return adafactor_u_at((float)g[i], i, i / cols, (int)(i % cols), grad_scale, row, col, row_mean, variance, floor);
}

__global__ void adafactor_partial_u_squares_kernel(float* partials, const floatX* g, size_t n, float grad_scale,
                                                   const float* row, const float* col, const float* row_mean,
                                                   const float* variance, int cols, float floor) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = adafactor_u(g, i, grad_scale, row, col, row_mean, variance, cols, floor);
        sum += u * u;
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// *row_mean = max(mean of row (rows), eps1), one block
__global__ void adafactor_row_mean_kernel(float* row_mean, const float* row, int rows, float eps1) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) sum += row[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *row_mean = fmaxf(sum / (float)rows, eps1);
}

// p = p keep - alpha / max(1, RMS(U) / d) U, alpha = max(eps2, RMS(p)) rho, with RMS(p) and RMS(U) from
// the sums of squares *p_squares and *u_squares (p's before the update); rounded stochastically
__global__ void adafactor_apply_kernel(floatX* params, const floatX* g, size_t n, float grad_scale, const float* row,
                                       const float* col, const float* row_mean, const float* variance, int cols,
                                       float floor, const float* p_squares, const float* u_squares, float rho,
                                       float eps2, float d, float keep, uint32_t seed, bool vector) {
    float alpha = fmaxf(eps2, sqrtf(*p_squares / (float)n)) * rho;
    float step = -alpha / fmaxf(1.0f, sqrtf(*u_squares / (float)n) / d);
    auto updated = [&](float p, float g_i, size_t i, size_t r, int c) {
        p = p * keep;
        return p + step * adafactor_u_at(g_i, i, r, c, grad_scale, row, col, row_mean, variance, floor);
    };
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 p = load128(params + i0), gv = load128(g + i0), out;
            size_t r = i0 / cols;  // one division for the share, then the column steps on (and wraps)
            int c = (int)(i0 % cols);
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) {
                stochastic_round(updated((float)p[k], (float)gv[k], i0 + k, r, c), &out[k],
                                 hash_u32((uint32_t)(i0 + k), seed));
                if (++c == cols) c = 0, r++;
            }
            store128(params + i0, out);
        },
        [&](size_t i) {
            stochastic_round(updated((float)params[i], (float)g[i], i, i / cols, (int)(i % cols)), &params[i],
                             hash_u32((uint32_t)i, seed));
        });
}

// ----------------------------------------------------------------------------
// launchers

// The device scratch of one tensor's update: 3 scalars and the partial sums.
struct AdafactorScratch {
    float* scalars = nullptr;   // [0] sum of p², [1] mean of R (floored), [2] sum of U²
    float* partials = nullptr;  // NORM_BLOCKS floats
};

inline int adafactor_blocks(size_t n) {
    return (int)std::min<size_t>(NORM_BLOCKS, (n + ADAFACTOR_THREADS * 8 - 1) / (ADAFACTOR_THREADS * 8));
}

// One Adafactor update of a tensor (rows, cols) (rows = 1: a vector) of floatX parameters p with gradient
// g (times grad_scale), its state (a matrix: R (rows) then C (cols); a vector: V (cols)), update t.
inline void adafactor_update(floatX* p, const floatX* g, float* state, int rows, int cols, float lr, float weight_decay,
                             float grad_scale, int t, uint32_t seed, const AdafactorScratch& s, cudaStream_t stream) {
    AdafactorHyper h;
    const float eps1 = h.eps1, eps2 = h.eps2, d = h.d;
    const size_t n = (size_t)rows * cols;
    const int blocks = adafactor_blocks(n);
    float w = (float)std::pow((double)t, h.beta2_decay);
    float rho = (float)std::min((double)lr, 1.0 / std::sqrt((double)t));
    float keep = (float)(1.0 - (double)lr * weight_decay);
    float floor = (float)((double)eps1 * eps1);
    float* p_squares = s.scalars;
    float* row_mean = s.scalars + 1;
    float* u_squares = s.scalars + 2;
    adafactor_partial_squares_kernel<<<blocks, ADAFACTOR_THREADS, 0, stream>>>(s.partials, p, n);
    adafactor_sum_kernel<<<1, ADAFACTOR_THREADS, 0, stream>>>(p_squares, s.partials, blocks);
    const float *row = nullptr, *col = nullptr, *variance = nullptr;
    if (rows > 1) {
        float* r = state;
        float* c = state + rows;
        adafactor_rows_kernel<<<rows, ADAFACTOR_THREADS, 0, stream>>>(r, g, cols, grad_scale, w);
        adafactor_cols_kernel<<<ceil_div_int(cols, ADAFACTOR_THREADS), ADAFACTOR_THREADS, 0, stream>>>(c, g, rows, cols,
                                                                                                     grad_scale, w);
        adafactor_row_mean_kernel<<<1, ADAFACTOR_THREADS, 0, stream>>>(row_mean, r, rows, eps1);
        row = r;
        col = c;
    } else {
        adafactor_vector_kernel<<<elementwise_blocks(n, ADAFACTOR_THREADS), ADAFACTOR_THREADS, 0, stream>>>(
            state, g, n, grad_scale, w, elementwise_aligned({state, g}));
        variance = state;
    }
    adafactor_partial_u_squares_kernel<<<blocks, ADAFACTOR_THREADS, 0, stream>>>(s.partials, g, n, grad_scale, row, col,
                                                                                 row_mean, variance, cols, floor);
    adafactor_sum_kernel<<<1, ADAFACTOR_THREADS, 0, stream>>>(u_squares, s.partials, blocks);
    adafactor_apply_kernel<<<elementwise_blocks(n, ADAFACTOR_THREADS), ADAFACTOR_THREADS, 0, stream>>>(
        p, g, n, grad_scale, row, col, row_mean, variance, cols, floor, p_squares, u_squares, rho, eps2, d,
        weight_decay == 0.0f ? 1.0f : keep, seed, elementwise_aligned({p, g, variance}));
    cudaCheckLaunch();
}
