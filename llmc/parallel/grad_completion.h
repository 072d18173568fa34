// A step's gradients made complete across the layout, and their global norm: written once for both
// trainers, on either element type (the CPU's float over MPI, the CUDA trainer's floatX over NCCL).
//
// After the last backward of a step each process holds its own part of the gradient. Complete means:
//   tensor parallelism: the tensors every rank of the group holds whole (layernorms, wpe, the
//     row-parallel biases: tp_param_is_replicated) take TP rank 0's values, so the replicas never drift
//     apart by rounding; with -sq 1 the layernorms' gradients, each rank's rows' part, are first summed
//     over the group (sp_param_is_partial)
//   pipeline stages: the tensors every stage holds (wte, wpe, lnfw, lnfb: pp_param_is_shared) summed
//     over the stages (wte: the embedding's gradient from stage 0 plus the LM head's from the last; the
//     others: one stage's plus zeros)
//   data parallelism: the sum over the replicas, as the ZeRO stage cuts it (llmc/parallel/zero.h,
//     grad_buckets.h: each trainer calls its own form, the CPU's whole-array one below or the CUDA
//     trainer's buckets during the backward)
// The norm counts each tensor once: a replicated one on TP rank 0 only, a shared one on stage 0 only;
// each process sums the squares of its ranges (gradient_norm_ranges; its trainer's arithmetic) and
// gradient_norm adds the sums over the groups.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "../gpt2_config.h"
#include "comm.h"
#include "layout.h"
#include "pipeline.h"
#include "tensor_parallel.h"
#include "zero.h"

// [lo, hi) ranges of the flat gradient array, neighbours merged: of the tensors that `keep` selects, the
// elements within [begin, end).
template <typename Keep>
std::vector<std::pair<size_t, size_t>> gradient_ranges(const size_t* offsets, const size_t* sizes, size_t begin,
                                                       size_t end, Keep keep) {
    std::vector<std::pair<size_t, size_t>> ranges;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (!keep(i)) continue;
        size_t lo = std::max(begin, offsets[i]), hi = std::min(end, offsets[i] + sizes[i]);
        if (lo >= hi) continue;
        if (!ranges.empty() && ranges.back().second == lo) {
            ranges.back().second = hi;
        } else {
            ranges.push_back({lo, hi});
        }
    }
    return ranges;
}

// The tensor- and pipeline-parallel part of completing the gradients. g holds flat elements
// [held_begin, held_end) from its element 0 (-z 2/3: the shard, whose replicated parts match its TP
// peers' shards; else all of them).
template <typename T>
void complete_model_parallel_gradients(const ParallelLayout& lay, T* g, size_t held_begin, size_t held_end,
                                       const size_t* offsets, const size_t* sizes, CommType type) {
    const ProcessGroup& tp = lay.tp_group;
    if (comm_active(tp)) {
        if (lay.sequence_parallel) {
            comm_group_start(tp);
            for (auto r : gradient_ranges(offsets, sizes, held_begin, held_end, sp_param_is_partial)) {
                all_reduce(tp, g + (r.first - held_begin), r.second - r.first, type, COMM_SUM);
            }
            comm_group_end(tp);
        }
        comm_group_start(tp);
        for (auto r : gradient_ranges(offsets, sizes, held_begin, held_end, tp_param_is_replicated)) {
            broadcast(tp, g + (r.first - held_begin), r.second - r.first, type, 0);
        }
        comm_group_end(tp);
        comm_join(tp);
    }
    const ProcessGroup& pp = lay.pp_group;
    if (comm_active(pp)) {
        for (auto r : gradient_ranges(offsets, sizes, held_begin, held_end, pp_param_is_shared)) {
            all_reduce(pp, g + (r.first - held_begin), r.second - r.first, type, COMM_SUM);
        }
        comm_join(pp);
    }
}

// The ranges of [begin, end) (this process's part of the flat gradient: all of it, or its -z 1..3 shard)
// whose squares this process adds to the norm.
inline std::vector<std::pair<size_t, size_t>> gradient_norm_ranges(const ParallelLayout& lay, const size_t* offsets,
                                                                   const size_t* sizes, size_t begin, size_t end) {
    return gradient_ranges(offsets, sizes, begin, end, [&](int i) {
        return !(tp_param_is_replicated(i) && lay.tp_rank != 0) && !(pp_param_is_shared(i) && lay.pp_rank != 0);
    });
}

// The global norm from this process's sum of squares over its gradient_norm_ranges: the sums added over
// the data-parallel group where it is sharded (-z 1..3), then over the tensor-parallel group and the
// stages (the same value on every process).
inline double gradient_norm(const ParallelLayout& lay, double sum_sq) {
    if (lay.zero_stage >= 1) sum_sq = all_reduce_sum(lay.dp_group, sum_sq, "the gradient norm");
    sum_sq = all_reduce_sum(lay.tp_group, sum_sq, "the gradient norm");
    sum_sq = all_reduce_sum(lay.pp_group, sum_sq, "the gradient norm");
    return std::sqrt(sum_sq);
}

// The data-parallel sum of a whole gradient array of n elements (the CPU trainer's form; the CUDA trainer
// reduces bucket by bucket during the backward, llmc/parallel/grad_buckets.h): -z 0 all-reduced, -z 1
// reduce-scattered into each process's shard (shard_size elements each); -z 2/3 nothing: each unit was
// reduce-scattered during the backward.
template <typename T>
void reduce_gradients_over_replicas(const ParallelLayout& lay, T* g, size_t n, size_t shard_size, CommType type) {
    if (lay.zero_stage == 0) {
        all_reduce(lay.dp_group, g, n, type, COMM_SUM);
    } else if (lay.zero_stage == 1) {
        reduce_scatter_sum(lay.dp_group, g, shard_size, type);
    }
    comm_join(lay.dp_group);
}

// ZeRO around the update. -z 1: an optimizer that updates every parameter on every process (Adafactor,
// whose state is small) first gathers the reduced gradient's shards. After a sharded update (-z 1 and 2:
// each process updated its shard) the parameters' shards are all-gathered, so every process has them all;
// -z 3 keeps its shard (the next forward gathers what it needs).
template <typename T>
void zero_gather_reduced_gradient(const ParallelLayout& lay, T* grads, size_t shard_size, CommType type) {
    if (lay.zero_stage != 1) return;
    all_gather(lay.dp_group, grads, shard_size, type);
    comm_join(lay.dp_group);
}
template <typename T>
void zero_gather_updated_parameters(const ParallelLayout& lay, T* params, size_t shard_size, CommType type) {
    if (lay.zero_stage != 1 && lay.zero_stage != 2) return;
    all_gather(lay.dp_group, params, shard_size, type);
    comm_join(lay.dp_group);
}
