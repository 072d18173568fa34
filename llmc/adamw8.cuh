// 8-bit AdamW on the GPU (-opt adamw8): llmc/adamw8.h's update, its element functions shared with the
// CPU, so both give the same bits. The state of a process's range [begin, end) of the flat vector (all
// of it, or a ZeRO shard) lives on the device: one int8 code of m and one uint8 code of v per element,
// and the two fp32 maxima of each 256-element block touching the range.
//
// One CUDA block of 256 threads per 8-bit block, one thread per element: decode m and v with the block's
// old maxima, step the parameter (the fp32 master weights when there are any, else the floatX parameter,
// rounded back stochastically as llmc/adamw.cuh does), reduce the new max |m| and max v over the block,
// and encode the new moments with them. The maximum of floats >= 0 is exact and has no order, so the
// block reduction gives the CPU's sequential maxima bit for bit.
//
// A block cut by the range's edge (a ZeRO shard boundary; at most two per range, the range's first and
// last block) cannot be encoded yet: its maxima must cover the other process's part too. For those the
// first kernel keeps the new moments in fp32 (edge_moments) and this part's maxima (edge_maxima); the
// caller makes the maxima whole (download, zero_complete_block_maxima in llmc/parallel/zero_blocks.h,
// upload), and the second kernel encodes them. This is adamw8_update's complete_edges step, on the GPU:
//
//   adamw8_update_blocks(...)                      every block; whole ones encoded, cut ones kept
//   plan.edge_maxima -> host -> all-reduce max -> plan.edge_maxima     (every process of the group takes
//                                                                       part, cut blocks or not)
//   adamw8_encode_edges(...)                        the cut blocks encoded with the whole block's maxima
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <functional>

#include "adamw.cuh"  // AdamWSettings, adamw_bias_corrections
#include "adamw8.h"
#include "cuda_common.cuh"
#include "parallel/comm_nccl.cuh"  // device_staging_in
#include "parallel/layout.h"
#include "parallel/zero_blocks.h"

constexpr int ADAMW8_THREADS = (int)ADAMW8_BLOCK;  // one thread per element of an 8-bit block

// The device copy of a range's state (llmc/adamw8.h's Adamw8State without its bookkeeping), allocated by
// the trainer: codes (end - begin), maxima (block_end - block_begin).
struct Adamw8Device {
    int8_t* m;
    uint8_t* v;
    float* m_max;
    float* v_max;
};

// One block of the range, as the kernels see it: its elements [first, first + n) counted from the range's
// first element, whether weight decay reaches its tensor, and which edge slot it takes (-1: whole).
struct Adamw8DeviceBlock {
    uint32_t first;
    uint16_t n;
    uint8_t decayed;
    int8_t edge;
};

// What the kernels of one range need besides the state, built once from the block map (device arrays
// owned by the plan; adamw8_plan_free releases them).
struct Adamw8Plan {
    size_t begin = 0;                        // the range's first element of the flat vector
    size_t num_blocks = 0;                   // blocks touching the range: block_begin .. block_end
    Adamw8DeviceBlock* blocks = nullptr;     // (num_blocks)
    float* tables = nullptr;                 // adamw8_tables(): level (256), then threshold (255)
    float* edge_moments = nullptr;           // (2 slots, m' then v', ADAMW8_BLOCK)
    float* edge_maxima = nullptr;            // (2 slots, max |m'| then max v'): zero_complete_block_maxima's layout
    int num_edges = 0;                       // cut blocks: 0, 1 or 2
    uint32_t edge_block[2] = {0, 0};         // each slot's block, counted from the range's first block
    std::vector<std::pair<size_t, size_t>> edge_elements;  // each slot's whole block [begin, end) in the flat vector
};

// ----------------------------------------------------------------------------
// kernels

// One 8-bit block per CUDA block (blockIdx.x = the block's index in the range). params, master (or
// nullptr), grads and the codes start at the range's first element; the random bits of the stochastic
// rounding hash the element's index in the flat vector (base + offset), so they do not depend on how
// processes share the vector.
__global__ void __launch_bounds__(ADAMW8_THREADS)
    adamw8_blocks_kernel(floatX* params, float* master, const floatX* grads, Adamw8Device state,
                         const Adamw8DeviceBlock* blocks, const float* tables, float* edge_moments, float* edge_maxima,
                         size_t base, float lr, float beta1, float beta2, float bias_correction1,
                         float bias_correction2, float eps, float weight_decay, float grad_scale, uint32_t seed) {
    // the tables in shared memory: the decode and the encode's binary search index them by data
    __shared__ float level[256];
    __shared__ float threshold[255];
    for (int q = threadIdx.x; q < 256; q += blockDim.x) level[q] = tables[q];
    for (int q = threadIdx.x; q < 255; q += blockDim.x) threshold[q] = tables[256 + q];
    __syncthreads();

    const int k = blockIdx.x;
    const Adamw8DeviceBlock block = blocks[k];
    const int j = threadIdx.x;
    const bool active = j < block.n;
    const size_t i = (size_t)block.first + j;
    float m = 0.0f, v = 0.0f;
    if (active) {
        m = adamw8_decode_m(state.m[i], state.m_max[k]);
        v = adamw8_decode_v(state.v[i], state.v_max[k], level);
        float p = master != nullptr ? master[i] : (float)params[i];
        p = adamw_element(p, (float)grads[i], &m, &v, lr, beta1, beta2, bias_correction1, bias_correction2, eps,
                          block.decayed ? weight_decay : 0.0f, grad_scale);
        if (master != nullptr) master[i] = p;
        stochastic_round(p, &params[i], hash_u32((uint32_t)(base + i), seed));
    }
    // fmaxf with 0 first, as the CPU's running maximum starts from 0: a NaN moment then counts as 0 on
    // both, whatever the order. (The reductions' barriers also order every read of the old maxima above
    // before thread 0 overwrites them below.)
    const float m_max = block_reduce_max(active ? fmaxf(0.0f, fabsf(m)) : 0.0f);
    const float v_max = block_reduce_max(active ? fmaxf(0.0f, v) : 0.0f);

    if (block.edge < 0) {
        if (j == 0) {
            state.m_max[k] = m_max;
            state.v_max[k] = v_max;
        }
        if (active) adamw8_encode_element(m, v, adamw8_ratio(m_max), v_max, threshold, &state.m[i], &state.v[i]);
    } else {
        float* slot = edge_moments + (size_t)block.edge * 2 * ADAMW8_BLOCK;
        if (active) {
            slot[j] = m;
            slot[ADAMW8_BLOCK + j] = v;
        }
        if (j == 0) {
            edge_maxima[2 * block.edge] = m_max;
            edge_maxima[2 * block.edge + 1] = v_max;
        }
    }
}

// One cut block per CUDA block (blockIdx.x = its edge slot): its kept moments encoded with the whole
// block's maxima, which are stored as the block's.
__global__ void __launch_bounds__(ADAMW8_THREADS)
    adamw8_encode_edges_kernel(Adamw8Device state, const Adamw8DeviceBlock* blocks, const float* threshold,
                               const float* edge_moments, const float* edge_maxima, uint32_t block0, uint32_t block1) {
    const int edge = blockIdx.x;
    const uint32_t k = edge == 0 ? block0 : block1;
    const Adamw8DeviceBlock block = blocks[k];
    const float m_max = edge_maxima[2 * edge], v_max = edge_maxima[2 * edge + 1];
    const int j = threadIdx.x;
    if (j == 0) {
        state.m_max[k] = m_max;
        state.v_max[k] = v_max;
    }
    if (j < block.n) {
        const float* slot = edge_moments + (size_t)edge * 2 * ADAMW8_BLOCK;
        const size_t i = (size_t)block.first + j;
        adamw8_encode_element(slot[j], slot[ADAMW8_BLOCK + j], adamw8_ratio(m_max), v_max, threshold, &state.m[i],
                              &state.v[i]);
    }
}

// ----------------------------------------------------------------------------
// the plan

// The device bytes of a plan over `num_blocks` blocks (for the memory plan).
inline size_t adamw8_plan_bytes(size_t num_blocks) {
    return num_blocks * sizeof(Adamw8DeviceBlock) + (256 + 255) * sizeof(float) + (2 * 2 * ADAMW8_BLOCK + 2 * 2) * sizeof(float);
}

// The plan of the range [begin, end) of the flat vector that `map` cuts into blocks. Edge slots are
// numbered as adamw8_update numbers its edges: in block order.
inline Adamw8Plan adamw8_plan_create(const Adamw8Blocks& map, size_t begin, size_t end) {
    if (end - begin > UINT32_MAX) {
        fatal("adamw8: a range of %zu elements is more than the 8-bit optimizer's 2^32 - 1 a process", end - begin);
    }
    Adamw8Plan plan;
    plan.begin = begin;
    size_t block_begin, block_end;
    map.blocks_of(begin, end, &block_begin, &block_end);
    plan.num_blocks = block_end - block_begin;
    std::vector<Adamw8DeviceBlock> blocks(plan.num_blocks);
    for (size_t k = 0; k < plan.num_blocks; k++) {
        size_t b = block_begin + k;
        size_t lo = std::max(map.block_begin(b), begin), hi = std::min(map.block_end(b), end);
        bool whole = lo == map.block_begin(b) && hi == map.block_end(b);
        int8_t edge = -1;
        if (!whole) {
            edge = (int8_t)plan.num_edges;
            plan.edge_block[plan.num_edges++] = (uint32_t)k;
            plan.edge_elements.push_back({map.block_begin(b), map.block_end(b)});
        }
        blocks[k] = Adamw8DeviceBlock{(uint32_t)(lo - begin), (uint16_t)(hi - lo),
                                      (uint8_t)(map.decayed[map.tensor_of_block(b)] ? 1 : 0), edge};
    }
    if (plan.num_blocks > 0) {
        cudaCheck(cudaMalloc(&plan.blocks, plan.num_blocks * sizeof(Adamw8DeviceBlock)));
        cudaCheck(cudaMemcpy(plan.blocks, blocks.data(), plan.num_blocks * sizeof(Adamw8DeviceBlock), cudaMemcpyHostToDevice));
    }
    const Adamw8Tables& tab = adamw8_tables();
    cudaCheck(cudaMalloc(&plan.tables, (256 + 255) * sizeof(float)));
    cudaCheck(cudaMemcpy(plan.tables, tab.level, 256 * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(plan.tables + 256, tab.threshold, 255 * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&plan.edge_moments, 2 * 2 * ADAMW8_BLOCK * sizeof(float)));
    cudaCheck(cudaMalloc(&plan.edge_maxima, 2 * 2 * sizeof(float)));
    return plan;
}

inline void adamw8_plan_free(Adamw8Plan* plan) {
    cudaCheck(cudaFree(plan->blocks));
    cudaCheck(cudaFree(plan->tables));
    cudaCheck(cudaFree(plan->edge_moments));
    cudaCheck(cudaFree(plan->edge_maxima));
    *plan = Adamw8Plan{};
}

// ----------------------------------------------------------------------------
// launchers

// One update of the plan's range: params, master (nullptr: no master weights) and grads point at the
// range's first element, state holds its codes and maxima. s.weight_decay reaches only the blocks of
// decayed tensors; s.seed is the update's (one for the whole range). Whole blocks are done on return
// (in stream order); cut ones wait in plan.edge_maxima for adamw8_encode_edges.
inline void adamw8_update_blocks(floatX* params, float* master, const floatX* grads, Adamw8Device state,
                                 const Adamw8Plan& plan, const AdamWSettings& s, cudaStream_t stream) {
    if (plan.num_blocks == 0) return;
    float bias_correction1, bias_correction2;
    adamw_bias_corrections(s, &bias_correction1, &bias_correction2);
    adamw8_blocks_kernel<<<(int)plan.num_blocks, ADAMW8_THREADS, 0, stream>>>(
        params, master, grads, state, plan.blocks, plan.tables, plan.edge_moments, plan.edge_maxima, plan.begin, s.lr,
        s.beta1, s.beta2, bias_correction1, bias_correction2, s.eps, s.weight_decay, s.grad_scale, s.seed);
    cudaCheckLaunch();
}

// Encodes the cut blocks, once plan.edge_maxima holds each whole block's maxima (the all-reduce's).
inline void adamw8_encode_edges(Adamw8Device state, const Adamw8Plan& plan, cudaStream_t stream) {
    if (plan.num_edges == 0) return;
    adamw8_encode_edges_kernel<<<plan.num_edges, ADAMW8_THREADS, 0, stream>>>(
        state, plan.blocks, plan.tables + 256, plan.edge_moments, plan.edge_maxima, plan.edge_block[0],
        plan.edge_block[1]);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// a process's 8-bit state on the device, as the CUDA trainer keeps it over its optimizer range

struct Adamw8Gpu {
    void* memory = nullptr;  // one allocation: the block maxima, the exchange's 2 P floats, the codes
    Adamw8Device state{};
    float* bounds = nullptr;  // 2 P floats: zero_complete_block_maxima's buffer
    Adamw8Blocks blocks;
    Adamw8Plan plan{};
    size_t begin = 0, end = 0;
};

// The device bytes of the state of n parameters in `blocks` blocks among P data-parallel processes.
inline size_t adamw8_gpu_bytes(size_t n, size_t blocks, int P) {
    return adamw8_state_bytes(n, blocks) + adamw8_plan_bytes(blocks) + 2 * (size_t)P * sizeof(float);
}

// The state of [begin, end) of the flat vector the optimizer's tensors tile, all zero.
inline void adamw8_gpu_allocate(Adamw8Gpu* g, const std::vector<OptimizerTensor>& tensors, size_t begin, size_t end, int P) {
    g->blocks = adamw8_blocks(tensors);
    g->plan = adamw8_plan_create(g->blocks, begin, end);
    g->begin = begin, g->end = end;
    size_t blocks = g->plan.num_blocks, n = end - begin;
    size_t bytes = adamw8_state_bytes(n, blocks) + 2 * (size_t)P * sizeof(float);
    cudaCheck(cudaMalloc(&g->memory, bytes));
    cudaCheck(cudaMemset(g->memory, 0, bytes));
    float* floats = (float*)g->memory;  // the floats first (4-byte aligned), then the codes
    g->bounds = floats + 2 * blocks;
    int8_t* codes = (int8_t*)(g->bounds + 2 * (size_t)P);
    g->state = Adamw8Device{codes, (uint8_t*)(codes + n), floats, floats + blocks};
}

inline void adamw8_gpu_free(Adamw8Gpu* g) {
    if (g->memory == nullptr) return;
    cudaCheck(cudaFree(g->memory));
    adamw8_plan_free(&g->plan);
    *g = Adamw8Gpu{};
}

// The state as a checkpoint holds it (llmc/io/state_file.h), and back.
inline Adamw8State adamw8_gpu_download(const Adamw8Gpu& g) {
    Adamw8State q = adamw8_state(g.blocks, g.begin, g.end);
    cudaCheck(cudaMemcpy(q.m.data(), g.state.m, q.m.size(), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(q.v.data(), g.state.v, q.v.size(), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(q.m_max.data(), g.state.m_max, q.m_max.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(q.v_max.data(), g.state.v_max, q.v_max.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return q;
}

inline void adamw8_gpu_upload(Adamw8Gpu* g, const Adamw8State& q) {
    if (q.begin != g->begin || q.end != g->end || q.m_max.size() != g->plan.num_blocks) {
        fatal("adamw8: a state of [%zu, %zu) for a process updating [%zu, %zu)", q.begin, q.end, g->begin, g->end);
    }
    cudaCheck(cudaMemcpy(g->state.m, q.m.data(), q.m.size(), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g->state.v, q.v.data(), q.v.size(), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g->state.m_max, q.m_max.data(), q.m_max.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g->state.v_max, q.v_max.data(), q.v_max.size() * sizeof(float), cudaMemcpyHostToDevice));
}

// One update of the range (params and grads at its first element; no master weights): every block, then
// under ZeRO the cut blocks' maxima made whole with the other processes' (every process takes part; sync
// waits for the stream, through the trainer's watchdog) and the cut blocks encoded.
inline void adamw8_gpu_step(Adamw8Gpu* g, floatX* params, const floatX* grads, const AdamWSettings& s,
                            const ParallelLayout& lay, const ShardLayout& shard,
                            const std::function<void(const char*)>& sync, cudaStream_t stream) {
    Adamw8Plan& plan = g->plan;
    adamw8_update_blocks(params, nullptr, grads, g->state, plan, s, stream);
    if (lay.zero_stage == 0) return;
    std::vector<float> maxima(2 * plan.num_edges);
    if (plan.num_edges > 0) {
        cudaCheck(cudaMemcpyAsync(maxima.data(), plan.edge_maxima, maxima.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                  stream));
    }
    sync("the 8-bit blocks' maxima");
    // the collective's buffer: bounds, allocated with the state
    zero_complete_block_maxima(lay.dp_group, shard, plan.edge_elements, maxima.data(), device_staging_in(g->bounds, stream, sync));
    if (plan.num_edges == 0) return;
    cudaCheck(cudaMemcpyAsync(plan.edge_maxima, maxima.data(), maxima.size() * sizeof(float), cudaMemcpyHostToDevice,
                              stream));
    adamw8_encode_edges(g->state, plan, stream);
    cudaCheck(cudaStreamSynchronize(stream));  // the copy reads `maxima` (host) before it goes
}
