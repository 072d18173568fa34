// Muon on the GPU (llmc/muon.h has the definition and the CPU reference): for one block matrix W
// (rows, cols), its gradient g and its momentum B (fp32, in AdamW's m buffer), in the steps of
// llmc/parallel/matrix_owners.h (which process does what under data parallelism):
//   B = lerp(B, g, 1 - mu),  U = lerp(g, B, mu)         muon_momentum: U over g, as floatX
//   X = U or Uᵀ (whichever is wide), X /= max(‖X‖_F, eps)
//   five times:  A = X Xᵀ,  A' = b A + c A A,  X = a X + A' X     muon_orthogonalize: three cuBLASLt
//                                                                  calls per step, as torch.addmm
//   W = W (1 - lr wd) - adjusted_lr X(ᵀ)                  muon_apply, on the master weights
// Newton-Schulz runs in floatX like torch.optim.Muon's (bf16 GEMMs with fp32 accumulation, each GEMM's
// alpha·AB + beta·C rounded once, as addmm does): in the bf16 build it is the speedrun's bf16 iteration,
// in the fp32 build the fp32 one the CPU reference runs.
//
// No transposes are copied. A row-major (rows, cols) matrix is, to column-major cuBLASLt, the matrix
// S = Wᵀ (cols, rows). Wide (rows <= cols): X = U is S's transpose, so X Xᵀ = Sᵀ S and the new X, seen
// column-major, is a S + S A'. Tall: X = Uᵀ is S itself, X Xᵀ = S Sᵀ and the new X is a S + A' S.
// Either way the Gram matrix is (n, n) with n = min(rows, cols), which is C for all four block matrices.
#pragma once

#include <cmath>

#include "adamw.cuh"
#include "cuda_common.cuh"
#include "global_norm.cuh"
#include "matmul.cuh"
#include "muon_hyper.h"

// ----------------------------------------------------------------------------
// kernels

// grads (n) replaced by U, the Nesterov update, from the gradient (times the clipping scale) and the
// momentum (updated).
// Elementwise, 16 bytes at a time (cuda_common.cuh); each element's arithmetic in one function, shared
// by the vector and the one-at-a-time path.
__device__ inline float muon_momentum_element(float grad, float* momentum, float mu, float one_minus_mu,
                                              float grad_scale) {
    float g = grad * grad_scale;
    float b = lerp_as_torch(*momentum, g, one_minus_mu);
    *momentum = b;
    return lerp_as_torch(g, b, mu);
}

__global__ void muon_momentum_kernel(floatX* grads, float* momentum, size_t n, float mu, float one_minus_mu,
                                     float grad_scale, bool vector) {
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 g = load128(grads + i0);
            float b[ELEMENTWISE_E];
            load_floats(b, momentum + i0);
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) {
                g[k] = (floatX)muon_momentum_element((float)g[k], &b[k], mu, one_minus_mu, grad_scale);
            }
            store_floats(momentum + i0, b);
            store128(grads + i0, g);
        },
        [&](size_t i) {
            grads[i] = (floatX)muon_momentum_element((float)grads[i], &momentum[i], mu, one_minus_mu, grad_scale);
        });
}

// x (n) = u / max(sqrt(*sum_sq), eps): u over its Frobenius norm, read from the device
__global__ void muon_normalize_kernel(floatX* x, const floatX* u, const float* sum_sq, size_t n, float eps,
                                      bool vector) {
    float norm = fmaxf(sqrtf(*sum_sq), eps);
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 v = load128(u + i0);
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) v[k] = (floatX)((float)v[k] / norm);
            store128(x + i0, v);
        },
        [&](size_t i) { x[i] = (floatX)((float)u[i] / norm); });
}

// W = W (1 - lr wd) + step X on the master weights (or on the parameters under -w 0), rounded to the
// floatX parameters stochastically as AdamW's are (the hash of each element's index, as one at a time)
__device__ inline float muon_apply_element(float p, float ortho, float keep, float step) { return p * keep + step * ortho; }

__global__ void muon_apply_kernel(floatX* params, float* master, const floatX* ortho, size_t n, float keep, float step,
                                  uint32_t seed, bool vector) {
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 o = load128(ortho + i0), out;
            float p[ELEMENTWISE_E];
            if (master != nullptr) {
                load_floats(p, master + i0);
            } else {
                x128 old = load128(params + i0);
#pragma unroll
                for (int k = 0; k < ELEMENTWISE_E; k++) p[k] = (float)old[k];
            }
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) {
                p[k] = muon_apply_element(p[k], (float)o[k], keep, step);
                stochastic_round(p[k], &out[k], hash_u32((uint32_t)(i0 + k), seed));
            }
            if (master != nullptr) store_floats(master + i0, p);
            store128(params + i0, out);
        },
        [&](size_t i) {
            float p = muon_apply_element(master != nullptr ? master[i] : (float)params[i], (float)ortho[i], keep, step);
            if (master != nullptr) master[i] = p;
            stochastic_round(p, &params[i], hash_u32((uint32_t)i, seed));
        });
}

// ----------------------------------------------------------------------------
// launchers

// The scratch of one matrix's Newton-Schulz iteration, sized for the largest block matrix.
struct MuonScratch {
    floatX* x = nullptr;     // (max_elements): X, ping
    floatX* y = nullptr;     // (max_elements): X, pong
    floatX* gram = nullptr;  // (n, n): A
    floatX* poly = nullptr;  // (n, n): b A + c A A
    float* sum_sq = nullptr;    // 1 float: ‖X‖²
    float* partials = nullptr;  // NORM_BLOCKS floats
};

// Lays the scratch out in `memory` (256-byte aligned pieces, for cuBLASLt) and returns the bytes it
// takes; with memory null it only measures, so the caller allocates exactly that.
inline size_t muon_scratch_layout(void* memory, size_t max_elements, size_t n, MuonScratch* s) {
    size_t at = 0;
    auto take = [&](size_t bytes) {
        char* piece = memory ? (char*)memory + at : nullptr;
        at += (bytes + 255) / 256 * 256;
        return piece;
    };
    s->x = (floatX*)take(max_elements * sizeof(floatX));
    s->y = (floatX*)take(max_elements * sizeof(floatX));
    s->gram = (floatX*)take(n * n * sizeof(floatX));
    s->poly = (floatX*)take(n * n * sizeof(floatX));
    s->sum_sq = (float*)take((1 + NORM_BLOCKS) * sizeof(float));
    s->partials = memory ? s->sum_sq + 1 : nullptr;
    return at;
}

// Step 1 (llmc/parallel/matrix_owners.h): the momentum of n elements of a matrix updated, and its
// Nesterov update U written over the gradient (as floatX: what Newton-Schulz starts from).
inline void muon_momentum(floatX* grads, float* momentum, size_t n, const MuonHyper& h, float grad_scale,
                          cudaStream_t stream) {
    const int block_size = 256;
    muon_momentum_kernel<<<elementwise_blocks(n, block_size), block_size, 0, stream>>>(
        grads, momentum, n, h.momentum, (float)(1.0 - (double)h.momentum), grad_scale,
        elementwise_aligned({grads, momentum}));
    cudaCheckLaunch();
}

// Step 3: a whole (rows, cols) matrix's U orthogonalized in place (row-major, in the gradient buffer).
inline void muon_orthogonalize(floatX* u, int rows, int cols, const MuonHyper& h, MuonScratch* s, cudaStream_t stream) {
    const size_t count = (size_t)rows * cols;
    const int block_size = 256;
    const bool tall = rows > cols;
    const int n = tall ? cols : rows, m = tall ? rows : cols;  // X is (n, m), n <= m
    sum_of_squares(s->sum_sq, s->partials, u, count, stream);
    muon_normalize_kernel<<<elementwise_blocks(count, block_size), block_size, 0, stream>>>(
        s->x, u, s->sum_sq, count, h.eps, elementwise_aligned({s->x, u}));
    cudaCheckLaunch();
    floatX *x = s->x, *next = s->y;  // column-major S: (m, n) when wide, (n, m) when tall
    for (int step = 0; step < h.ns_steps; step++) {
        if (tall) {
            matmul_scaled(s->gram, x, x, s->gram, 1.0f, 0.0f, n, n, m, false, true, stream);  // S Sᵀ
        } else {
            matmul_scaled(s->gram, x, x, s->gram, 1.0f, 0.0f, n, n, m, true, false, stream);  // Sᵀ S
        }
        matmul_scaled(s->poly, s->gram, s->gram, s->gram, h.c, h.b, n, n, n, false, false, stream);  // c A A + b A
        if (tall) {
            matmul_scaled(next, s->poly, x, x, 1.0f, h.a, n, m, n, false, false, stream);  // A' S + a S
        } else {
            matmul_scaled(next, x, s->poly, x, 1.0f, h.a, m, n, n, false, false, stream);  // S A' + a S
        }
        std::swap(x, next);
    }
    cudaCheck(cudaMemcpyAsync(u, x, count * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
}

// Step 4: n elements of a matrix moved by its orthogonalized O: W = W (1 - lr wd) - adjusted_lr O, with
// adjusted_lr = lr * muon_lr_ratio(rows, cols). master: the elements' fp32 master weights, or nullptr.
inline void muon_apply(floatX* params, float* master, const floatX* ortho, size_t n, float lr, float weight_decay,
                       float adjusted_lr, uint32_t seed, cudaStream_t stream) {
    const int block_size = 256;
    muon_apply_kernel<<<elementwise_blocks(n, block_size), block_size, 0, stream>>>(
        params, master, ortho, n, (float)(1.0 - (double)lr * weight_decay), -adjusted_lr, seed,
        elementwise_aligned({params, master, ortho}));
    cudaCheckLaunch();
}
