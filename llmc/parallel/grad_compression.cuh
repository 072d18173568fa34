// Compressed data-parallel gradients (-gc sign|powersgd) on the GPU: llmc/parallel/grad_compression.h's
// and powersgd.h's schemes with their state in device memory, the same element and block functions in
// the kernels (sign_encode_block, sign_decode_element) and the same order of every sum, so an fp32 run
// gives the CPU's bits. The collectives are the same calls over device buffers (NCCL); PowerSGD's
// Gram-Schmidt runs on the host on a copy of P (R columns a matrix: small), with powersgd.h's own
// function. The bookkeeping (which tensor is where, the bytes, the checkpoint sections and their notes)
// is the host's: a GradCompression whose big vectors are filled only to write or read a checkpoint.
//
// Per step, after the backward (the buckets' reductions do not run, gpt2_plan_init):
//   sign      encode d = g - h (a thread per 64-element block) -> all-gather of every process's words ->
//             decode, adding to h and H and handing H on (a thread per element)
//   powersgd  M = g + e, P = M Q (a thread per element of P) -> all-reduce of P and the vectors -> vectors
//             back, P to the host, Gram-Schmidt, back -> Q = M^T P (a thread per element) -> all-reduce of Q ->
//             g = P Q^T and e = M - g / P (a thread per element); a non-finite Q restarts from its first value
#pragma once

#include <functional>
#include <vector>

#include "../cuda_common.cuh"
#include "comm_nccl.cuh"
#include "grad_compression.h"

// A 64-element block of the flat vector (sign) and a matrix or an exactly summed tensor (PowerSGD), as
// the kernels see them.
struct SignBlockGpu {
    uint64_t offset;  // its first element
    uint32_t n;       // its elements, <= 64
};
struct PowerSgdTensorGpu {
    uint64_t offset;   // its first element in the flat vector
    uint32_t rows, cols;
    uint64_t p_first, q_first;  // its place in P and Q (an exact tensor: in P only, rows 1)
};

struct GradCompressionGpu {
    GradCompression host;  // the scheme, its layout and bytes (big vectors empty)
    size_t n = 0;
    int processes = 1;
    float* feedback = nullptr;           // this process's error feedback: -gc sign's h_p then H (2n), PowerSGD's e (n)
    size_t feedback_n = 0;
    // sign
    SignBlockGpu* blocks = nullptr;      // one per word of bits
    size_t num_blocks = 0;
    uint64_t* gathered = nullptr;        // (processes * block_words)
    // powersgd
    std::vector<PowerSgdTensorGpu> matrices;  // launched one by one (their sizes differ a thousandfold)
    PowerSgdTensorGpu* exact = nullptr;       // one launch over all of them (vectors: small)
    size_t num_exact = 0, max_exact = 0;
    float *p = nullptr, *q = nullptr, *q_new = nullptr, *q_first = nullptr;
    std::vector<float> p_host;           // (p_length) P for the host's Gram-Schmidt
    bool on() const { return host.on(); }
};

template <typename T>
static T* gc_upload(const std::vector<T>& v) {
    T* d = nullptr;
    cudaCheck(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
    if (!v.empty()) cudaCheck(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// The device bytes of the state (the memory plan): h_p, H and the gather (sign), or the residuals, P, the
// two Qs and Q's first value (PowerSGD), with the kernels' tables.
inline size_t grad_compression_gpu_bytes(const std::string& flag, int rank, const std::vector<OptimizerTensor>& tensors,
                                         size_t n, int processes) {
    if (processes == 1 || flag == "none") return 0;
    if (flag == "sign") {
        SignCompression shape = sign_compression_init(tensors, 0, 0);
        return 2 * n * sizeof(float) + (size_t)processes * shape.block_words * sizeof(uint64_t) +
               shape.first_word.back() * sizeof(SignBlockGpu);
    }
    PowerSgd shape = powersgd_init(tensors, 0, rank);
    return (n + shape.p_length + 3 * shape.q_length) * sizeof(float) + tensors.size() * sizeof(PowerSgdTensorGpu);
}

inline void grad_compression_gpu_setup(GradCompressionGpu* gc, size_t n, int processes);

// -gc at start-up (the host's notes and refusals: grad_compression_start); false without it.
inline bool grad_compression_gpu_start(const std::string& flag, int rank, const ProcessGroup& dp,
                                       const std::vector<OptimizerTensor>& tensors, size_t n, GradCompressionGpu* gc) {
    if (!grad_compression_start(flag, rank, dp, tensors, n, &gc->host)) return false;
    grad_compression_gpu_setup(gc, n, dp.size);
    return true;
}

// The device state for the scheme gc->host holds (its kind and layout, with its big host vectors, which
// this empties), for `processes` processes.
inline void grad_compression_gpu_setup(GradCompressionGpu* gc, size_t n, int processes) {
    gc->n = n;
    gc->processes = processes;
    gc->feedback_n = gc->host.feedback().size();  // 2n or n
    cudaCheck(cudaMalloc(&gc->feedback, gc->feedback_n * sizeof(float)));
    cudaCheck(cudaMemset(gc->feedback, 0, gc->feedback_n * sizeof(float)));
    if (gc->host.kind == "sign") {
        SignCompression& sc = gc->host.sign;
        std::vector<SignBlockGpu> blocks;
        for (const OptimizerTensor& t : sc.tensors) {
            for (size_t b = 0; b * SIGN_BLOCK < t.size(); b++) {
                blocks.push_back({t.offset + b * SIGN_BLOCK, (uint32_t)std::min(SIGN_BLOCK, t.size() - b * SIGN_BLOCK)});
            }
        }
        gc->num_blocks = blocks.size();
        gc->blocks = gc_upload(blocks);
        cudaCheck(cudaMalloc(&gc->gathered, (size_t)processes * sc.block_words * sizeof(uint64_t)));
        cudaCheck(cudaMemset(gc->gathered, 0, (size_t)processes * sc.block_words * sizeof(uint64_t)));
        std::vector<float>().swap(sc.estimates);
        std::vector<uint64_t>().swap(sc.gathered);
        return;
    }
    PowerSgd& ps = gc->host.power;
    std::vector<PowerSgdTensorGpu> exact;
    for (size_t i = 0; i < ps.matrices.size(); i++) {
        const OptimizerTensor& t = ps.tensors[ps.matrices[i]];
        gc->matrices.push_back({t.offset, (uint32_t)t.rows, (uint32_t)t.cols, ps.p_first[i], ps.q_first[i]});
    }
    size_t at = gc->matrices.empty() ? 0 : ps.p_first.back() + ps.tensors[ps.matrices.back()].rows * ps.rank;
    for (size_t k : ps.exact) {
        const OptimizerTensor& t = ps.tensors[k];
        exact.push_back({t.offset, 1, (uint32_t)t.size(), at, 0});
        at += t.size();
        gc->max_exact = std::max(gc->max_exact, t.size());
    }
    gc->num_exact = exact.size();
    gc->exact = gc_upload(exact);
    gc->q = gc_upload(ps.q);
    gc->q_first = gc_upload(ps.q);
    gc->q_new = gc_upload(ps.q);
    gc->p = gc_upload(std::vector<float>(ps.p_length, 0.0f));
    gc->p_host.assign(ps.p_length, 0.0f);
    std::vector<float>().swap(ps.residual);
    std::vector<float>().swap(ps.q);
    std::vector<float>().swap(ps.q_buffer);
    std::vector<float>().swap(ps.p_buffer);
}

inline void grad_compression_gpu_free(GradCompressionGpu* gc) {
    for (void* p : {(void*)gc->feedback, (void*)gc->blocks, (void*)gc->gathered, (void*)gc->exact,
                    (void*)gc->p, (void*)gc->q, (void*)gc->q_new, (void*)gc->q_first}) {
        cudaCheck(cudaFree(p));
    }
    *gc = GradCompressionGpu();
}

// ---------------------------------------------------------------------------------------------------
// sign

template <typename T>
__global__ void sign_encode_kernel(const T* grads, const float* h, const SignBlockGpu* blocks, size_t num_blocks,
                                   float inv_s, uint64_t* words, float* scales) {
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= num_blocks) return;
    const SignBlockGpu blk = blocks[b];
    sign_encode_block(grads + blk.offset, h + blk.offset, blk.n, inv_s, words + b, scales + b);
}

template <typename T>
__global__ void sign_decode_kernel(T* grads, float* h, float* H, const uint64_t* gathered, size_t W, size_t words,
                                   const SignBlockGpu* blocks, size_t num_blocks, int P, int rank, float loss_scale) {
    size_t b = (size_t)blockIdx.x * (blockDim.x / 64) + threadIdx.x / 64;
    int j = (int)(threadIdx.x % 64);
    if (b >= num_blocks || j >= (int)blocks[b].n) return;
    size_t x = blocks[b].offset + j;
    grads[x] = (T)(loss_scale * sign_decode_element(gathered, W, words, b, P, rank, j, h + x, H + x));
}

template <typename T>
void sign_reduce_gpu(const ProcessGroup& dp, GradCompressionGpu* gc, T* grads, float loss_scale, cudaStream_t stream) {
    const SignCompression& sc = gc->host.sign;
    const size_t W = sc.block_words, words = sc.first_word.back();
    uint64_t* mine = gc->gathered + (size_t)dp.rank * W;
    cudaCheck(cudaMemsetAsync(mine + W - 1, 0, sizeof(uint64_t), stream));  // an odd count of scales leaves half a word
    sign_encode_kernel<T><<<(unsigned)((gc->num_blocks + 127) / 128), 128, 0, stream>>>(grads, gc->feedback, gc->blocks,
                                                                                    gc->num_blocks, 1.0f / loss_scale, mine,
                                                                                    (float*)(mine + words));
    cudaCheck(cudaGetLastError());
    all_gather(dp, gc->gathered, W, COMM_UINT64);
    comm_join(dp);
    sign_decode_kernel<T><<<(unsigned)((gc->num_blocks + 3) / 4), 256, 0, stream>>>(grads, gc->feedback, gc->feedback + gc->n,
                                                                                gc->gathered, W, words, gc->blocks,
                                                                                gc->num_blocks, dp.size, dp.rank, loss_scale);
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------------
// PowerSGD (the sums in powersgd.h's order: over a row's columns, a column's rows, a product's R terms)

// Element x of matrix t: M = g / S + e, kept in e.
template <typename T>
__global__ void powersgd_add_kernel(const T* grads, float* residual, const PowerSgdTensorGpu t, float inv_s) {
    size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x < (size_t)t.rows * t.cols) residual[t.offset + x] += (float)grads[t.offset + x] * inv_s;
}

// P's element (r, j) of matrix t: M's row r times Q's column j (a thread each: one sum in registers).
__global__ void powersgd_p_kernel(const float* residual, const float* q, float* p, const PowerSgdTensorGpu t, int R) {
    size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (size_t)t.rows * R) return;
    size_t r = x / R;
    int j = (int)(x % R);
    const float* m = residual + t.offset + r * t.cols;
    const float* qt = q + t.q_first;
    double acc = 0.0;
    for (size_t c = 0; c < t.cols; c++) acc += (double)m[c] * qt[c * R + j];
    p[t.p_first + x] = (float)acc;
}

// An exact tensor's elements into P's tail (to_p) or back from it.
template <typename T>
__global__ void powersgd_exact_kernel(T* grads, float* p, const PowerSgdTensorGpu* exact, bool to_p) {
    const PowerSgdTensorGpu t = exact[blockIdx.y];
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t.cols) return;
    if (to_p) p[t.p_first + i] = (float)grads[t.offset + i];
    else grads[t.offset + i] = (T)p[t.p_first + i];
}

// Q's element (c, j) of matrix t: M's column c times P^'s column j.
__global__ void powersgd_q_kernel(const float* residual, const float* p, float* q, const PowerSgdTensorGpu t, int R) {
    size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (size_t)t.cols * R) return;
    size_t c = x / R;
    int j = (int)(x % R);
    const float* m = residual + t.offset;
    const float* pt = p + t.p_first;
    double acc = 0.0;
    for (size_t i = 0; i < t.rows; i++) acc += (double)m[i * t.cols + c] * pt[i * R + j];
    q[t.q_first + x] = (float)acc;
}

// Element x of matrix t: g = P^ Q^T (handed on times S), e = M - g / P.
template <typename T>
__global__ void powersgd_approx_kernel(T* grads, float* residual, const float* p, const float* q, const PowerSgdTensorGpu t,
                                       int R, float inv_processes, float loss_scale) {
    size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (size_t)t.rows * t.cols) return;
    size_t r = x / t.cols, c = x % t.cols;
    double sum = 0.0;
    for (int j = 0; j < R; j++) sum += (double)p[t.p_first + r * R + j] * q[t.q_first + c * R + j];
    float g = (float)sum;
    grads[t.offset + x] = (T)(g * loss_scale);
    float e = residual[t.offset + x] - g * inv_processes;
    residual[t.offset + x] = gc_finite(e) ? e : 0.0f;
}

// Matrix t's new Q, if any of it is not finite, from its first value (the same on every process).
__global__ void powersgd_q_reset_kernel(float* q, const float* q_first, const PowerSgdTensorGpu t, int R) {
    const size_t count = (size_t)t.cols * R;
    int bad = 0;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) bad |= !gc_finite(q[t.q_first + i]);
    if (!__syncthreads_or(bad)) return;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) q[t.q_first + i] = q_first[t.q_first + i];
}

template <typename T>
void powersgd_reduce_gpu(const ProcessGroup& dp, GradCompressionGpu* gc, T* grads, float loss_scale, cudaStream_t stream,
                         const std::function<void(const char*)>& sync) {
    const PowerSgd& ps = gc->host.power;
    const int R = ps.rank, threads = 128;
    auto blocks = [&](size_t count) { return (unsigned)((count + threads - 1) / threads); };
    const unsigned E = (unsigned)gc->num_exact;
    for (const PowerSgdTensorGpu& t : gc->matrices) {
        powersgd_add_kernel<T><<<blocks((size_t)t.rows * t.cols), threads, 0, stream>>>(grads, gc->feedback, t, 1.0f / loss_scale);
        powersgd_p_kernel<<<blocks((size_t)t.rows * R), threads, 0, stream>>>(gc->feedback, gc->q, gc->p, t, R);
    }
    if (E) powersgd_exact_kernel<T><<<dim3(blocks(gc->max_exact), E), threads, 0, stream>>>(grads, gc->p, gc->exact, true);
    cudaCheck(cudaGetLastError());
    all_reduce(dp, gc->p, ps.p_length, COMM_FLOAT32, COMM_SUM);
    comm_join(dp);
    if (E) powersgd_exact_kernel<T><<<dim3(blocks(gc->max_exact), E), threads, 0, stream>>>(grads, gc->p, gc->exact, false);
    cudaCheck(cudaGetLastError());
    if (gc->matrices.empty()) return;
    // P^ on the host: every process has the same P, and makes the same columns
    size_t matrices_p = ps.p_first.back() + ps.tensors[ps.matrices.back()].rows * R;
    cudaCheck(cudaMemcpyAsync(gc->p_host.data(), gc->p, matrices_p * sizeof(float), cudaMemcpyDeviceToHost, stream));
    sync("PowerSGD's P");
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < ps.matrices.size(); i++) {
        powersgd_orthonormalize(gc->p_host.data() + ps.p_first[i], ps.tensors[ps.matrices[i]].rows, R);
    }
    // (from pageable memory: the call returns once p_host has been read)
    cudaCheck(cudaMemcpyAsync(gc->p, gc->p_host.data(), matrices_p * sizeof(float), cudaMemcpyHostToDevice, stream));
    for (const PowerSgdTensorGpu& t : gc->matrices) {
        powersgd_q_kernel<<<blocks((size_t)t.cols * R), threads, 0, stream>>>(gc->feedback, gc->p, gc->q_new, t, R);
    }
    cudaCheck(cudaGetLastError());
    all_reduce(dp, gc->q_new, ps.q_length, COMM_FLOAT32, COMM_SUM);
    comm_join(dp);
    for (const PowerSgdTensorGpu& t : gc->matrices) {
        powersgd_approx_kernel<T><<<blocks((size_t)t.rows * t.cols), threads, 0, stream>>>(grads, gc->feedback, gc->p, gc->q_new, t,
                                                                                      R, 1.0f / (float)dp.size, loss_scale);
        powersgd_q_reset_kernel<<<1, 256, 0, stream>>>(gc->q_new, gc->q_first, t, R);
    }
    cudaCheck(cudaGetLastError());
    std::swap(gc->q, gc->q_new);
}

// The step's gradients (n floatX on the device, times the loss scale S) reduced over the data-parallel
// group as -gc says. A collective; sync waits for the stream (and the group's collectives).
template <typename T>
void grad_compression_gpu_reduce(const ProcessGroup& dp, GradCompressionGpu* gc, T* grads, cudaStream_t stream,
                                 const std::function<void(const char*)>& sync, float loss_scale = 1.0f) {
    if (gc->host.kind == "sign") sign_reduce_gpu(dp, gc, grads, loss_scale, stream);
    else powersgd_reduce_gpu(dp, gc, grads, loss_scale, stream, sync);
}

// The checkpoint's sections (grad_compression_sections, from host copies of the error feedback and Q).
inline std::vector<StateSection> grad_compression_gpu_sections(const GradCompressionGpu& gc) {
    if (!gc.on()) return {};
    GradCompression copy = gc.host;
    std::vector<float>& e = copy.feedback();
    e.resize(gc.feedback_n);
    cudaCheck(cudaMemcpy(e.data(), gc.feedback, gc.feedback_n * sizeof(float), cudaMemcpyDeviceToHost));
    if (copy.kind == "powersgd") {
        copy.power.q.resize(copy.power.q_length);
        cudaCheck(cudaMemcpy(copy.power.q.data(), gc.q, copy.power.q_length * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return grad_compression_sections(copy);
}

// The error feedback (and Q) from this process's sections (grad_compression_restore's rules and notes).
inline void grad_compression_gpu_restore(GradCompressionGpu* gc, const std::vector<StateSection>& sections) {
    GradCompression copy = gc->host;
    copy.feedback().assign(gc->feedback_n, 0.0f);
    if (copy.kind == "powersgd") {
        copy.power.q.resize(copy.power.q_length);
        cudaCheck(cudaMemcpy(copy.power.q.data(), gc->q_first, copy.power.q_length * sizeof(float), cudaMemcpyDeviceToHost));
    }
    grad_compression_restore(&copy, sections);
    cudaCheck(cudaMemcpy(gc->feedback, copy.feedback().data(), gc->feedback_n * sizeof(float), cudaMemcpyHostToDevice));
    if (copy.kind == "powersgd") {
        cudaCheck(cudaMemcpy(gc->q, copy.power.q.data(), copy.power.q_length * sizeof(float), cudaMemcpyHostToDevice));
    }
}
