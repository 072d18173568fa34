// Which parts of the gradient the GPU trainer reduces across processes, and when: the plan that lets
// the reduction run during the backward pass. Host arithmetic only, tested on the CPU
// (test/test_bootstrap.cpp); reduce_gradient_bucket turns a bucket into collectives (llmc/parallel/comm.h).
//
// The backward pass goes through the layers last to first. When layer l's backward is done, layer
// l's slice of each of the 12 per-layer tensors (ln1w .. fcprojb, each stacked over L in the flat
// parameter array) is final for the step. Bucket l holds those 12 slices; a second stream reduces
// them while the backward of layer l-1 runs. wte, wpe, lnfw and lnfb form bucket L, reduced after the
// backward ends (wte's gradient gets its last part from the encoder's backward, the very last op).
//
//   -z 0: every slice is all-reduced (owner -1): every process gets the sum.
//   -z 1: a slice is cut where it crosses a shard boundary (llmc/parallel/zero.h) and each piece is reduced to
//         the process whose shard holds it (owner = that rank). Over all buckets the pieces tile
//         [0, N) exactly once, so together they are a reduce-scatter of the whole gradient, done in L+1
//         installments instead of one call after the backward.
//   -z 2: the same pieces, but no process holds the whole gradient: the backward writes a bucket's
//         gradient into a small buffer of its own, its slices packed one after another (the unit
//         layout of llmc/parallel/zero_sharded.h), and each piece is reduced from there straight into
//         its owner's shard of the gradient (reduce_gradient_packed). Every micro-step is reduced.
//
// The GPU's shards are aligned: shard_size is rounded up to a multiple of `align` elements, so every
// shard starts on a 16-byte boundary (the vector loads of the gradient-norm kernel, and NCCL's fast
// path, want that). N itself is a multiple of C, so with one process the shard is exactly [0, N).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "../gpt2_config.h"
#include "comm.h"
#include "tensor_parallel.h"
#include "zero.h"

// ShardLayout of llmc/parallel/zero.h with shard_size a multiple of `align`; begin/end still clip to N.
inline ShardLayout aligned_shard_layout(size_t num_parameters, int num_processes, int rank, size_t align) {
    size_t per_process = (num_parameters + num_processes - 1) / num_processes;
    size_t shard_size = (per_process + align - 1) / align * align;
    ShardLayout s = shard_layout(shard_size * num_processes, num_processes, rank);
    s.num_parameters = num_parameters;
    s.begin = std::min(s.begin, num_parameters);
    s.end = std::min(s.end, num_parameters);
    return s;
}

struct GradSlice {
    size_t offset;       // first element in the flat gradient
    size_t count;
    int owner;           // the rank that receives the sum (-z 1, 2), or -1: all of them (-z 0)
    size_t unit_offset;  // first element in the bucket's packed buffer (-z 2): the bucket's pieces before it
};

// Appends [offset, offset + count) to bucket: whole (-z 0), or cut at the shard boundaries (-z 1, 2).
inline void add_slice(std::vector<GradSlice>* bucket, size_t offset, size_t count, int zero_stage, size_t shard_size) {
    size_t packed = bucket->empty() ? 0 : bucket->back().unit_offset + bucket->back().count;
    if (zero_stage == 0) {
        bucket->push_back({offset, count, -1, packed});
        return;
    }
    size_t end = offset + count;
    while (offset < end) {
        size_t owner = offset / shard_size;
        size_t piece_end = std::min(end, (owner + 1) * shard_size);
        bucket->push_back({offset, piece_end - offset, (int)owner, packed});
        packed += piece_end - offset;
        offset = piece_end;
    }
}

// Elements of a bucket's packed buffer (-z 2): all its pieces.
inline size_t packed_size(const std::vector<GradSlice>& bucket) {
    return bucket.empty() ? 0 : bucket.back().unit_offset + bucket.back().count;
}

// Elements of one set of -z 2/3 bucket buffers (llmc/parallel/zero_device.cuh): the outer bucket's and two
// blocks' (the block buffers are used in turn); 0 without buckets.
inline size_t zero_buffer_elements(const std::vector<std::vector<GradSlice>>& buckets) {
    return buckets.empty() ? 0 : packed_size(buckets.back()) + 2 * packed_size(buckets[0]);
}

// Buckets 0..L-1: the slices of layer l; bucket L: wte, wpe, lnfw, lnfb. The backward completes them
// in the order L-1, ..., 1, 0, L.
inline std::vector<std::vector<GradSlice>> gradient_buckets(const GPT2Config& cfg, int zero_stage, size_t shard_size,
                                                           int tp = 1) {
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS], offset = 0;
    tp_param_sizes(cfg, tp, sizes);  // a tensor-parallel process's slices (tp = 1: the whole tensors)
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        offsets[i] = offset;
        offset += sizes[i];
    }
    int L = cfg.num_layers;
    std::vector<std::vector<GradSlice>> buckets(L + 1);
    for (int l = 0; l < L; l++) {
        for (int i = P_LN1W; i <= P_FCPROJB; i++) {
            size_t per_layer = sizes[i] / L;
            add_slice(&buckets[l], offsets[i] + l * per_layer, per_layer, zero_stage, shard_size);
        }
    }
    for (int i : {P_WTE, P_WPE, P_LNFW, P_LNFB}) add_slice(&buckets[L], offsets[i], sizes[i], zero_stage, shard_size);
    return buckets;
}

// Queues one bucket's reductions as one group of collectives: an all-reduce per slice (-z 0), or a
// reduce to the slice's owner (-z 1). grads is the flat gradient array, elements of `type`, in the
// group's memory (the GPU's, under NCCL, where the calls are queued behind the backward's work so far).
inline void reduce_gradient_bucket(const ProcessGroup& g, void* grads, CommType type, const std::vector<GradSlice>& bucket) {
    comm_group_start(g);
    for (const GradSlice& s : bucket) {
        char* slice = (char*)grads + s.offset * comm_type_bytes(type);
        if (s.owner < 0) {
            all_reduce(g, slice, s.count, type, COMM_SUM);
        } else {
            reduce_sum(g, slice, s.count, type, s.owner);
        }
    }
    comm_group_end(g);
}

// -z 2: the bucket's gradient is packed in `packed` (its pieces one after another); each piece is
// reduced into its owner's shard of the gradient, shard_grads (element 0 = flat element shard_begin).
// The owner's own contribution is whatever its packed buffer holds, so a caller that accumulates over
// micro-steps first adds the shard's running sum into its pieces (the reduce overwrites the shard).
inline void reduce_gradient_packed(const ProcessGroup& g, const void* packed, void* shard_grads, size_t shard_begin,
                                   CommType type, const std::vector<GradSlice>& bucket) {
    const size_t bytes = comm_type_bytes(type);
    comm_group_start(g);
    for (const GradSlice& s : bucket) {
        const char* send = (const char*)packed + s.unit_offset * bytes;
        void* recv = s.owner == g.rank ? (char*)shard_grads + (s.offset - shard_begin) * bytes : (void*)send;
        reduce_sum(g, send, recv, s.count, type, s.owner);
    }
    comm_group_end(g);
}
