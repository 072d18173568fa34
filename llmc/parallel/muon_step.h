// Muon's step over data, tensor and ZeRO parallelism, written once for both trainers: the CPU one on
// float host buffers over MPI, the CUDA one on floatX device buffers over NCCL. Who owns which matrix,
// and what each stage moves, is llmc/parallel/matrix_owners.h's; this file is the order the step runs in.
// A trainer supplies its arithmetic (momentum, Newton-Schulz, the update's application) and its copies
// (MuonOps); the collectives are here and nowhere else.
//
//   1. momentum and the Nesterov update U of this process's matrix elements (all of them, or its -z 1
//      shard), written over the gradient
//   -z 2/3 (a process holds only its shard of the gradients), matrix by matrix:
//   2. U all-gathered from the shards that meet it, orthogonalized by its owner, broadcast, applied to
//      this process's part
//   -z 0/1 (every gradient has its place):
//   2. -z 1: U all-gathered, so each owner has its matrices whole
//   3. each owner orthogonalizes its matrices; with -tp the owner's TP group gathers each matrix's
//      slices, every rank of it orthogonalizes the whole matrix (the same bits on each) and keeps its
//      slice (llmc/parallel/tensor_parallel.h: tp_matrix_slice)
//   4. each matrix (this rank's slice of it) broadcast from its owner, then applied to this process's
//      elements
#pragma once

#include <functional>
#include <vector>

#include "../optimizer.h"
#include "comm.h"
#include "layout.h"
#include "matrix_owners.h"
#include "tensor_parallel.h"
#include "zero.h"

// Where a process's parameters are: its tensors' offsets and sizes in its flat array (its stage's layers,
// its -tp slices), the stage's layer count, the model's width; and the optimizer's range of that array.
struct MuonPlace {
    const size_t* param_offsets;
    const size_t* param_sizes;
    size_t layers, channels;
    size_t opt_begin, opt_end;  // [opt_begin, opt_end): the elements this process updates (-z 1..3: its shard)
};

// The place of a trainer's model, whose fields both trainers name alike.
template <typename Model>
MuonPlace muon_place_of(const Model& m) {
    return {m.param_offsets, m.param_sizes, (size_t)m.config.num_layers, (size_t)m.config.channels, m.opt_begin, m.opt_end};
}

// A trainer's part of the step, on its element type T. Flat indices are into the process's parameter
// array; grads holds flat element grads_base at its element 0 (-z 2/3: the shard's first element, else 0).
template <typename T>
struct MuonOps {
    CommType type;
    T* grads;
    size_t grads_base = 0;
    T* whole = nullptr;     // scratch: one matrix, (rows, cols) (-z 2/3, -tp)
    T* gathered = nullptr;  // scratch: -tp, every rank's slice of one matrix
    // U over flat elements [begin, end), written over their gradient
    std::function<void(size_t begin, size_t end)> momentum;
    std::function<void(T* matrix, size_t rows, size_t cols)> orthogonalize;
    // the orthogonalized update of flat elements [begin, end) of matrix t (update[0] is element begin)
    std::function<void(const OptimizerTensor& t, size_t begin, size_t end, const T* update)> apply;
    // height rows of width elements, src rows spitch apart to dst rows dpitch apart
    std::function<void(T* dst, size_t dpitch, const T* src, size_t spitch, size_t width, size_t height)> copy2d;
};

template <typename T>
void muon_step(const OptimizerPlan& opt, const ParallelLayout& lay, const ShardLayout& shard, const MuonPlace& at,
               const MuonOps<T>& ops) {
    const ProcessGroup& dp = lay.dp_group;
    const ProcessGroup& tp = lay.tp_group;
    auto local = [&](const OptimizerTensor& t) { return local_tensor(t, at.param_offsets, at.param_sizes, at.layers); };
    auto grad_at = [&](size_t i) { return ops.grads + (i - ops.grads_base); };
    size_t begin, end;
    for (const OptimizerTensor& t : opt.tensors) {
        if (muon_param_is_matrix(t.param) && tensor_part_in(local(t), at.opt_begin, at.opt_end, &begin, &end)) {
            ops.momentum(begin, end);
        }
    }
    if (lay.zero_stage >= 2) {  // matrix by matrix (-tp is refused with -z 2/3 and Muon: llmc/run/args.h)
        std::vector<int> counts, displs;
        for (size_t k = 0; k < opt.tensors.size(); k++) {
            const OptimizerTensor& t = opt.tensors[k];
            if (opt.owner[k] < 0) continue;
            matrix_shard_parts(t, shard, &counts, &displs);
            bool mine = tensor_part_in(t, at.opt_begin, at.opt_end, &begin, &end);
            if (mine) ops.copy2d(ops.whole + (begin - t.offset), 0, grad_at(begin), 0, end - begin, 1);
            all_gather_v(dp, ops.whole, counts, displs, ops.type);
            comm_join(dp);
            if (opt.owner[k] == dp.rank) ops.orthogonalize(ops.whole, t.rows, t.cols);
            broadcast(dp, ops.whole, t.size(), ops.type, opt.owner[k]);
            comm_join(dp);
            if (mine) ops.apply(t, begin, end, ops.whole + (begin - t.offset));
        }
        return;
    }
    if (lay.zero_stage == 1) {
        all_gather(dp, ops.grads, shard.shard_size, ops.type);
        comm_join(dp);  // the owners' Newton-Schulz reads what the gather brought
    }
    for (size_t k = 0; k < opt.tensors.size(); k++) {  // all of this process's matrices first, then the sends
        const OptimizerTensor& t = opt.tensors[k];
        if (opt.owner[k] != dp.rank) continue;
        if (tp.size == 1) {
            ops.orthogonalize(ops.grads + t.offset, t.rows, t.cols);
            continue;
        }
        OptimizerTensor mine = local(t);
        size_t n = mine.size();
        ops.copy2d(ops.gathered + n * tp.rank, 0, ops.grads + mine.offset, 0, n, 1);
        all_gather(tp, ops.gathered, n, ops.type);
        comm_join(tp);
        for (int r = 0; r < tp.size; r++) {
            MatrixSlice m = tp_matrix_slice(t.param, at.channels, tp.size, r);
            ops.copy2d(ops.whole + m.full_offset, m.full_pitch, ops.gathered + n * r, m.local_pitch, m.width, m.height);
        }
        ops.orthogonalize(ops.whole, t.rows, t.cols);
        MatrixSlice m = tp_matrix_slice(t.param, at.channels, tp.size, tp.rank);
        ops.copy2d(ops.grads + mine.offset, m.local_pitch, ops.whole + m.full_offset, m.full_pitch, m.width, m.height);
    }
    for (size_t k = 0; k < opt.tensors.size(); k++) {
        OptimizerTensor mine = local(opt.tensors[k]);
        if (opt.owner[k] >= 0) broadcast(dp, ops.grads + mine.offset, mine.size(), ops.type, opt.owner[k]);
    }
    comm_join(dp);
    for (const OptimizerTensor& t : opt.tensors) {
        if (muon_param_is_matrix(t.param) && tensor_part_in(local(t), at.opt_begin, at.opt_end, &begin, &end)) {
            ops.apply(t, begin, end, ops.grads + begin);
        }
    }
}
