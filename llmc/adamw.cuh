// AdamW on the GPU, on fp32 master weights, with stochastic rounding back to the floatX parameters (the
// global gradient norm the clipping factor comes from is llmc/global_norm.cuh).
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,   g = grad * grad_scale (the clipping factor)
//   p -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
// Mixed precision: the forward and backward read bf16 parameters, but an update is often far smaller
// than a bf16 step (2^-8 of the weight), so the optimizer keeps an fp32 copy (the master weights) and
// updates that; the bf16 copy is then rounded stochastically from it. Without master weights (-w 0)
// the update starts from the bf16 value, and stochastic rounding alone keeps it right on average.
// The random bits come from a hash of (element, seed): the caller derives the seed from the step and
// the tensor, so a resumed run draws the same bits as an uninterrupted one.
#pragma once

#include <cmath>
#include <vector>

#include "adamw.h"  // AdamWHyper
#include "cuda_common.cuh"

// ----------------------------------------------------------------------------
// kernels

// One element's update is adamw_element (llmc/adamw.h): the GPU kernels', -oo 1's on the CPU
// (llmc/optimizer_offload.cuh) and 8-bit AdamW's (llmc/adamw8.h), one body.

__global__ void adamw_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                             float lr, float beta1, float beta2, float bias_correction1, float bias_correction2,
                             float eps, float weight_decay, float grad_scale, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p = master != nullptr ? master[i] : (float)params[i];
    p = adamw_element(p, (float)grads[i], &m[i], &v[i], lr, beta1, beta2, bias_correction1, bias_correction2, eps,
                      weight_decay, grad_scale);
    if (master != nullptr) master[i] = p;
    stochastic_round(p, &params[i], hash_u32((uint32_t)i, seed));
}

// Many tensors in one launch (adamw_update_many): each thread takes 4 consecutive elements of one
// tensor, so every access of a warp is one contiguous run: 16 bytes a thread of m, v and the master
// weights (512 bytes a warp), 8 bytes of the bf16 gradients and parameters (16 in the fp32 build).
// (8 elements a thread, one x128 of bf16, was 19% slower on an H200, 2026-11-27: each thread's m then
// spans two 16-byte loads, so each warp-wide load touched every other 16 bytes of 1 KB and the
// next load the rest.) Block b works on the tensor whose range of blocks holds b. The element body,
// the element index (counted from the tensor's start) and the seed are adamw_kernel's, so the bits are
// the same as one launch per tensor.
struct AdamWTensor {
    floatX* params;
    float* master;  // or nullptr
    const floatX* grads;
    float *m, *v;
    size_t n;
    float weight_decay;
    uint32_t seed;
};
constexpr int ADAMW_MAX_TENSORS = 16;  // a launch's share: the trainer's parameter tensors
struct AdamWBatch {
    AdamWTensor tensor[ADAMW_MAX_TENSORS];
    unsigned first_block[ADAMW_MAX_TENSORS + 1];  // tensor k's blocks: [first_block[k], first_block[k + 1])
    int count;
};

constexpr int ADAMW_MANY_ELEMENTS = 4;  // per thread: one f128 of each fp32 array
struct alignas(ADAMW_MANY_ELEMENTS * sizeof(floatX)) AdamWParams4 {
    floatX e[ADAMW_MANY_ELEMENTS];  // 8 bytes in bf16, 16 in fp32: one load or store
};

// The tensor of a batch this block works on: the last whose blocks begin at or before this one, and its
// first block (constant indices only: the parameter struct stays in the constant bank, no copy of it to
// local memory).
__device__ __forceinline__ AdamWTensor adamw_block_tensor(const AdamWBatch& batch, unsigned* first) {
    AdamWTensor t = batch.tensor[0];
    *first = 0;
#pragma unroll
    for (int k = 1; k < ADAMW_MAX_TENSORS; k++) {
        if (k < batch.count && blockIdx.x >= batch.first_block[k]) {
            t = batch.tensor[k];
            *first = batch.first_block[k];
        }
    }
    return t;
}

// Elements [i0, t.n) of a tensor, one at a time (its last few, fewer than a thread's share).
__device__ inline void adamw_tensor_tail(const AdamWTensor& t, size_t i0, float lr, float beta1, float beta2,
                                         float bias_correction1, float bias_correction2, float eps, float grad_scale) {
    for (size_t i = i0; i < t.n; i++) {
        float p = t.master != nullptr ? t.master[i] : (float)t.params[i];
        p = adamw_element(p, (float)t.grads[i], &t.m[i], &t.v[i], lr, beta1, beta2, bias_correction1,
                          bias_correction2, eps, t.weight_decay, grad_scale);
        if (t.master != nullptr) t.master[i] = p;
        stochastic_round(p, &t.params[i], hash_u32((uint32_t)i, t.seed));
    }
}

__global__ void adamw_many_kernel(const AdamWBatch batch, float lr, float beta1, float beta2, float bias_correction1,
                                  float bias_correction2, float eps, float grad_scale) {
    unsigned first;
    AdamWTensor t = adamw_block_tensor(batch, &first);
    constexpr int E = ADAMW_MANY_ELEMENTS;
    size_t i0 = ((size_t)(blockIdx.x - first) * blockDim.x + threadIdx.x) * E;
    if (i0 >= t.n) return;
    if (i0 + E > t.n) {  // the tensor's last few elements: one at a time
        adamw_tensor_tail(t, i0, lr, beta1, beta2, bias_correction1, bias_correction2, eps, grad_scale);
        return;
    }
    AdamWParams4 g = *reinterpret_cast<const AdamWParams4*>(t.grads + i0);
    f128 m = load128cs(t.m + i0);
    f128 v = load128cs(t.v + i0);
    f128 p;
    if (t.master != nullptr) {
        p = load128cs(t.master + i0);
    } else {
        AdamWParams4 p_old = *reinterpret_cast<const AdamWParams4*>(t.params + i0);
#pragma unroll
        for (int j = 0; j < E; j++) p[j] = (float)p_old.e[j];
    }
    AdamWParams4 p_out;
#pragma unroll
    for (int j = 0; j < E; j++) {
        p[j] = adamw_element(p[j], (float)g.e[j], &m[j], &v[j], lr, beta1, beta2, bias_correction1, bias_correction2,
                             eps, t.weight_decay, grad_scale);
        stochastic_round(p[j], &p_out.e[j], hash_u32((uint32_t)(i0 + j), t.seed));
    }
    store128cs(t.m + i0, m);
    store128cs(t.v + i0, v);
    if (t.master != nullptr) store128cs(t.master + i0, p);
    *reinterpret_cast<AdamWParams4*>(t.params + i0) = p_out;
}

// elementwise, 16 bytes at a time (cuda_common.cuh)
__global__ void copy_to_master_kernel(float* master, const floatX* params, size_t n, bool vector) {
    elementwise_share(
        n, vector,
        [&](size_t i0) {
            x128 p = load128(params + i0);
            float out[ELEMENTWISE_E];
#pragma unroll
            for (int k = 0; k < ELEMENTWISE_E; k++) out[k] = (float)p[k];
            store_floats(master + i0, out);
        },
        [&](size_t i) { master[i] = (float)params[i]; });
}

// ----------------------------------------------------------------------------
// launchers

struct AdamWSettings {
    float lr;
    float beta1, beta2, eps;
    float weight_decay;
    float grad_scale;  // clipping factor, <= 1
    int t;             // 1-based step count, for the bias corrections
    uint32_t seed;     // stochastic rounding seed: derive from (step, tensor)
};

// The settings of one update with AdamW's constants (llmc/adamw.h).
inline AdamWSettings adamw_settings(float lr, float weight_decay, float grad_scale, int t, uint32_t seed) {
    AdamWHyper h;
    return AdamWSettings{lr, h.beta1, h.beta2, h.eps, weight_decay, grad_scale, t, seed};
}

// The seed of a tensor's stochastic rounding: a fixed function of (step, tensor, where this part of the
// tensor starts), so the rounding bits of a tensor cut between two shards do not repeat, and a whole
// tensor draws what one GPU draws.
inline uint32_t rounding_seed(int t, int tensor, size_t start_in_tensor) {
    return (uint32_t)t * 2654435761u + (uint32_t)tensor * 40503u + (uint32_t)start_in_tensor * 2246822519u;
}

// 1 - beta^t, in double on the host as the CPU trainer computes them, then rounded to float
inline void adamw_bias_corrections(const AdamWSettings& s, float* bias_correction1, float* bias_correction2) {
    *bias_correction1 = (float)(1.0 - pow((double)s.beta1, s.t));
    *bias_correction2 = (float)(1.0 - pow((double)s.beta2, s.t));
}

// Updates one tensor of n elements. master may be nullptr (no master weights; then params hold the
// only copy). m and v are fp32.
inline void adamw_update(floatX* params,       // (n)
                         float* master,        // (n) or nullptr
                         const floatX* grads,  // (n)
                         float* m, float* v,   // (n)
                         size_t n, const AdamWSettings& s, cudaStream_t stream) {
    float bias_correction1, bias_correction2;
    adamw_bias_corrections(s, &bias_correction1, &bias_correction2);
    const int block_size = 512;
    adamw_kernel<<<ceil_div_int(n, block_size), block_size, 0, stream>>>(params, master, grads, m, v, n, s.lr,
                                                                         s.beta1, s.beta2, bias_correction1,
                                                                         bias_correction2, s.eps, s.weight_decay,
                                                                         s.grad_scale, s.seed);
    cudaCheckLaunch();
}

// Updates many tensors, ADAMW_MAX_TENSORS to a launch, with the settings s (but for each tensor's weight
// decay and seed). Every array must start 16 bytes aligned (the trainer's tensors and ZeRO shards start
// at multiples of 8 elements); a tensor that does not is updated by adamw_update instead.
inline void adamw_update_many(const std::vector<AdamWTensor>& tensors, const AdamWSettings& s, cudaStream_t stream) {
    float bias_correction1, bias_correction2;
    adamw_bias_corrections(s, &bias_correction1, &bias_correction2);
    const int block_size = 256;
    AdamWBatch batch;
    batch.count = 0;
    batch.first_block[0] = 0;
    auto launch = [&] {
        if (batch.count == 0) return;
        adamw_many_kernel<<<batch.first_block[batch.count], block_size, 0, stream>>>(
            batch, s.lr, s.beta1, s.beta2, bias_correction1, bias_correction2, s.eps, s.grad_scale);
        cudaCheckLaunch();
        batch.count = 0;
    };
    for (const AdamWTensor& t : tensors) {
        if (t.n == 0) continue;
        if (!elementwise_aligned({t.params, t.master, t.grads, t.m, t.v})) {
            AdamWSettings one = s;
            one.weight_decay = t.weight_decay;
            one.seed = t.seed;
            adamw_update(t.params, t.master, t.grads, t.m, t.v, t.n, one, stream);
            continue;
        }
        batch.tensor[batch.count] = t;
        batch.first_block[batch.count + 1] = batch.first_block[batch.count] + ceil_div_int(ceil_div(t.n, (size_t)ADAMW_MANY_ELEMENTS), block_size);
        batch.count++;
        if (batch.count == ADAMW_MAX_TENSORS) launch();
    }
    launch();
}

// master = params, e.g. after loading a checkpoint.
inline void copy_to_master(float* master, const floatX* params, size_t n, cudaStream_t stream) {
    const int block_size = 256;
    copy_to_master_kernel<<<elementwise_blocks(n, block_size), block_size, 0, stream>>>(
        master, params, n, elementwise_aligned({master, params}));
    cudaCheckLaunch();
}
