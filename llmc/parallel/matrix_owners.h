// Who orthogonalizes which matrix under data parallelism (-opt muon, llmc/muon.h).
//
// Muon's momentum and the rest of its step are element-wise, so they are cut like AdamW's: every
// parameter on every process (-z 0) or each process its flat shard (-z 1, llmc/parallel/zero.h). Newton-
// Schulz is not: it needs a whole matrix. Each of the 4 L block matrices therefore has one owner; a step
// of P processes runs
//   1. momentum and the Nesterov update U of this process's elements (all, or its shard), written over
//      the gradient buffer; AdamW on the other tensors' elements, as before
//   2. -z 1 only: all-gather U, so that each owner has its matrices whole     + 8 N (P-1)/P bytes
//      (the whole padded buffer: the simplest collective; the part of it that
//      is not U, gradients of the other tensors, is sent along)
//   3. each owner orthogonalizes its matrices, then each matrix goes from its owner to every process
//      (a broadcast per matrix, counted as a ring moves it)                      + 8 M (P-1)/P bytes
//   4. every process applies O to its elements (all, or its shard); -z 1 then all-gathers the
//      parameters as for AdamW
// (bytes sent plus received per process, llmc/parallel/comm.h's count), where N is the number of
// parameters and M that of the matrices' elements (at GPT-2 small M = 85 M of
// N = 124 M). -z 0 adds only step 3 to AdamW's all-reduce of 8 N (P-1)/P; -z 1 adds steps 2 and 3 to its
// reduce-scatter and all-gather. The matrices are dealt to owners so that each process's Newton-Schulz
// work (llmc/muon.h: newton_schulz_flops) is about the same: balance_owners.
//
// Adafactor needs no owners: its state is about 0.25% of AdamW's, so every process keeps it whole, gets
// the whole reduced gradient (-z 1: the shards all-gathered after the reduce-scatter, the bytes of -z 0's
// all-reduce) and updates every parameter; the processes compute the same bits (llmc/adafactor.h's sums
// have a fixed order), so no parameters need to be gathered afterwards.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "../muon_hyper.h"
#include "../optimizer.h"
#include "zero.h"

// The owner of each item (0 .. processes-1) for the given work: largest first, each to the process with
// the least work so far (the lowest rank on ties). Deterministic, so every process computes the same
// assignment; no process ends with more than the average plus one item's work.
inline std::vector<int> balance_owners(const std::vector<double>& work, int processes) {
    std::vector<size_t> order(work.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return work[x] > work[y]; });
    std::vector<double> load(processes, 0.0);
    std::vector<int> owner(work.size(), 0);
    for (size_t k : order) {
        int least = (int)(std::min_element(load.begin(), load.end()) - load.begin());
        owner[k] = least;
        load[least] += work[k];
    }
    return owner;
}

// A run's optimizer plan (llmc/optimizer.h) for `processes` data-parallel processes: the tensors a matrix
// optimizer updates one by one and, for Muon, each block matrix's owner. Both trainers build it so.
inline OptimizerPlan optimizer_plan(OptimizerKind kind, const GPT2Config& cfg, int processes) {
    OptimizerPlan opt;
    opt.kind = kind;
    if (kind == OPT_ADAMW) return opt;
    opt.tensors = optimizer_tensors(cfg);
    opt.owner.assign(opt.tensors.size(), -1);
    if (kind == OPT_MUON) {
        std::vector<double> work;
        std::vector<size_t> matrices;
        for (size_t k = 0; k < opt.tensors.size(); k++) {
            if (!muon_param_is_matrix(opt.tensors[k].param)) continue;
            work.push_back(newton_schulz_flops(opt.tensors[k].rows, opt.tensors[k].cols, MuonHyper().ns_steps));
            matrices.push_back(k);
        }
        std::vector<int> owner = balance_owners(work, processes);
        for (size_t i = 0; i < matrices.size(); i++) opt.owner[matrices[i]] = owner[i];
    }
    return opt;
}

// ZeRO-2/3 (-opt muon): a process holds only its shard of the gradients, so each matrix's Nesterov
// update is all-gathered on its own before its owner orthogonalizes it: process r contributes where its
// shard meets the matrix, counts[r] elements at displs[r] (from the matrix's first element; 0 where they
// do not meet).
// Elements a process receives in those gathers per step: each owned matrix but the part its range
// [opt_begin, opt_end) holds (a ring's count, llmc/parallel/comm.h, is 2 x that many elements).
inline size_t matrix_shard_gathered(const OptimizerPlan& opt, size_t opt_begin, size_t opt_end) {
    size_t n = 0, begin, end;
    for (size_t k = 0; k < opt.tensors.size(); k++) {
        if (opt.owner[k] < 0) continue;
        n += opt.tensors[k].size() - (tensor_part_in(opt.tensors[k], opt_begin, opt_end, &begin, &end) ? end - begin : 0);
    }
    return n;
}

inline void matrix_shard_parts(const OptimizerTensor& t, const ShardLayout& sh, std::vector<int>* counts,
                               std::vector<int>* displs) {
    counts->assign(sh.num_processes, 0);
    displs->assign(sh.num_processes, 0);
    for (int r = 0; r < sh.num_processes; r++) {
        size_t lo = std::max(t.offset, std::min((size_t)r * sh.shard_size, sh.num_parameters));
        size_t hi = std::min(t.offset + t.size(), std::min((size_t)(r + 1) * sh.shard_size, sh.num_parameters));
        if (lo < hi) (*counts)[r] = (int)(hi - lo), (*displs)[r] = (int)(lo - t.offset);
    }
}

