// ZeRO-2 and ZeRO-3 on the GPU (-z 2, -z 3): the device buffers a bucket's gradients and parameters
// travel in, and their collectives. llmc/parallel/grad_buckets.h cuts the flat vector into buckets (one
// per block, one for wte, wpe, lnfw and lnfb) and each bucket into pieces by owner; this file moves them.
//   -z 2 and 3: the backward writes a bucket's gradient packed into a buffer of its own (the outer one,
//     or one of two block buffers used in turn); once the bucket is complete each piece is reduced into
//     its owner's shard (zero_reduce_bucket); a block buffer is taken again once the fence after its last
//     reduction has passed
//   -z 3: a forward or backward gathers the parameters it needs in the same packed layout: the outer
//     tensors once after each update, block l into gathered_block[l % 2], the next block's gather queued
//     while this one computes and waited for (its fence) just before use
// A packed buffer is also rank order (each owner's pieces lie together), so a gather is one all_gather_v.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "../cuda_common.cuh"
#include "comm.h"
#include "grad_buckets.h"
#include "zero.h"

struct ZeroDevice {
    // what the buffers serve (zero_device_allocate)
    const ProcessGroup* dp = nullptr;
    const ShardLayout* shard = nullptr;
    const std::vector<std::vector<GradSlice>>* buckets = nullptr;  // 0..L-1 the blocks, L the outer tensors
    floatX* params_shard = nullptr;  // -z 3: this process's shard of the parameters
    floatX* grads_shard = nullptr;   // its shard of the gradients
    cudaStream_t stream = nullptr;
    bool gather_params = false;      // -z 3
    // -z 2 and 3: the packed gradient buffers
    floatX* packed_outer = nullptr;
    floatX* packed_block[2] = {nullptr, nullptr};
    uint64_t packed_block_fence[2] = {0, 0};
    bool packed_block_in_flight[2] = {false, false};
    // -z 3: the gathered parameters
    floatX* gathered_outer = nullptr;
    floatX* gathered_block[2] = {nullptr, nullptr};
    uint64_t gathered_fence[2] = {0, 0};
    bool outer_gathered = false;
};

inline int zero_outer_bucket(const ZeroDevice* z) { return (int)z->buckets->size() - 1; }

// Allocates the buffers: zero_buffer_elements (llmc/parallel/grad_buckets.h) for the gradients, and with
// -z 3 again for the parameters.
inline void zero_device_allocate(ZeroDevice* z, const ProcessGroup* dp, const ShardLayout* shard,
                                 const std::vector<std::vector<GradSlice>>* buckets, floatX* params_shard,
                                 floatX* grads_shard, bool gather_params, cudaStream_t stream) {
    *z = ZeroDevice{};
    z->dp = dp, z->shard = shard, z->buckets = buckets, z->stream = stream;
    z->params_shard = params_shard, z->grads_shard = grads_shard, z->gather_params = gather_params;
    size_t outer = packed_size(buckets->back()), block = packed_size((*buckets)[0]);
    cudaCheck(cudaMalloc(&z->packed_outer, outer * sizeof(floatX)));
    for (floatX*& b : z->packed_block) cudaCheck(cudaMalloc(&b, block * sizeof(floatX)));
    if (!gather_params) return;
    cudaCheck(cudaMalloc(&z->gathered_outer, outer * sizeof(floatX)));
    for (floatX*& b : z->gathered_block) cudaCheck(cudaMalloc(&b, block * sizeof(floatX)));
}

inline void zero_device_free(ZeroDevice* z) {
    for (floatX* p : {z->packed_outer, z->packed_block[0], z->packed_block[1], z->gathered_outer, z->gathered_block[0],
                      z->gathered_block[1]}) {
        cudaCheck(cudaFree(p));
    }
}

// The start of a backward: the outer buffer zeroed (the LM head and the embedding add into it).
inline void zero_backward_begin(ZeroDevice* z) {
    cudaCheck(cudaMemsetAsync(z->packed_outer, 0, packed_size(z->buckets->back()) * sizeof(floatX), z->stream));
}

// Block l's packed gradient buffer, zeroed, once the reductions that last read it have finished.
inline floatX* zero_block_grads(ZeroDevice* z, int l) {
    int which = l % 2;
    if (z->packed_block_in_flight[which]) comm_wait_fence(*z->dp, z->packed_block_fence[which]);
    z->packed_block_in_flight[which] = false;
    cudaCheck(cudaMemsetAsync(z->packed_block[which], 0, packed_size((*z->buckets)[l]) * sizeof(floatX), z->stream));
    return z->packed_block[which];
}

// Bucket b's gradient (packed) is final for this micro-step. The pieces this process owns get the shard's
// running sum added first, so the reduction, which overwrites the shard, leaves the sum over processes
// and micro-steps there. A block's buffer is marked in flight until the reduction's fence; the outer
// bucket, the backward's last, is waited for with everything else.
inline void zero_reduce_bucket(ZeroDevice* z, int b) {
    bool outer = b == zero_outer_bucket(z);
    floatX* packed = outer ? z->packed_outer : z->packed_block[b % 2];
    size_t shard_start = shard_first(*z->shard);
    for (const GradSlice& s : (*z->buckets)[b]) {
        if (s.owner != z->dp->rank) continue;
        add_into(packed + s.unit_offset, z->grads_shard + (s.offset - shard_start), s.count, z->stream);
    }
    reduce_gradient_packed(*z->dp, packed, z->grads_shard, shard_start, COMM_FLOATX, (*z->buckets)[b]);
    if (!outer) {
        z->packed_block_fence[b % 2] = comm_fence(*z->dp);
        z->packed_block_in_flight[b % 2] = true;
        return;
    }
    comm_join(*z->dp);
    z->packed_block_in_flight[0] = z->packed_block_in_flight[1] = false;
}

// -z 3: queues the all-gather of bucket b's parameters into dst (its packed layout): this process's
// pieces copied in from its shard on the compute stream, then each owner's part to all (all_gather_v,
// queued after the compute so far, so after the last reader of dst).
inline void zero_gather_bucket(ZeroDevice* z, int b, floatX* dst) {
    const ProcessGroup& dp = *z->dp;
    size_t shard_start = shard_first(*z->shard);
    std::vector<int> counts(dp.size, 0), displs(dp.size, 0);
    std::vector<bool> seen(dp.size, false);
    for (const GradSlice& s : (*z->buckets)[b]) {
        if (!seen[s.owner]) displs[s.owner] = (int)s.unit_offset;
        seen[s.owner] = true;
        counts[s.owner] += (int)s.count;
        if (s.owner == dp.rank) {
            cudaCheck(cudaMemcpyAsync(dst + s.unit_offset, z->params_shard + (s.offset - shard_start),
                                      s.count * sizeof(floatX), cudaMemcpyDeviceToDevice, z->stream));
        }
    }
    all_gather_v(dp, dst, counts, displs, COMM_FLOATX);
}

// -z 3: every parameter (n), widened to fp32 on the host, gathered bucket by bucket through the gathering
// buffers (every process must call it; all get the result). sync waits for the compute stream.
inline std::vector<float> zero_gather_all_parameters(ZeroDevice* z, size_t n, const std::function<void(const char*)>& sync) {
    std::vector<float> params(n);
    for (int b = zero_outer_bucket(z); b >= 0; b--) {  // the outer bucket first, then the blocks
        floatX* packed = b == zero_outer_bucket(z) ? z->gathered_outer : z->gathered_block[0];
        zero_gather_bucket(z, b, packed);
        comm_join(*z->dp);
        std::vector<floatX> raw(packed_size((*z->buckets)[b]));
        cudaCheck(cudaMemcpyAsync(raw.data(), packed, raw.size() * sizeof(floatX), cudaMemcpyDeviceToHost, z->stream));
        sync("gathering the parameters");
        for (const GradSlice& s : (*z->buckets)[b]) {
            for (size_t i = 0; i < s.count; i++) params[s.offset + i] = host_from_floatX(raw[s.unit_offset + i]);
        }
    }
    z->outer_gathered = true;
    return params;
}

// -z 3, the start of a pass over the blocks (a forward, first = 0; a backward, first = L-1): the outer
// tensors if the parameters changed since their last gather, and block `first`, waited for.
inline void zero_gather_pass_begin(ZeroDevice* z, int first) {
    if (!z->gather_params) return;
    if (!z->outer_gathered) zero_gather_bucket(z, zero_outer_bucket(z), z->gathered_outer);
    z->outer_gathered = true;
    zero_gather_bucket(z, first, z->gathered_block[first % 2]);
    comm_join(*z->dp);
}

// -z 3: queues block l's gather (the block after the one about to compute), or nothing.
inline void zero_gather_prefetch(ZeroDevice* z, int l) {
    if (!z->gather_params || l < 0 || l >= zero_outer_bucket(z)) return;
    zero_gather_bucket(z, l, z->gathered_block[l % 2]);
    z->gathered_fence[l % 2] = comm_fence(*z->dp);
}

// -z 3: block l's gathered parameters, waited for if it was prefetched (wait = true).
inline const floatX* zero_gathered_block(ZeroDevice* z, int l, bool wait) {
    if (wait) comm_wait_fence(*z->dp, z->gathered_fence[l % 2]);
    return z->gathered_block[l % 2];
}
