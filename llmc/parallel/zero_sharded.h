// ZeRO stages 2 and 3: gradients (stage 2) and parameters too (stage 3) sharded across processes.
//
// Every stage keeps ZeRO-1's shard (llmc/parallel/zero.h): process r owns elements [r*S, (r+1)*S) of the flat
// checkpoint-order parameter vector, S = ceil(N / P), and holds AdamW's moments for them. Stage 2 also
// keeps only that shard of the accumulated gradient; stage 3 only that shard of the parameters. What a
// layer needs in full lives for a moment in a small per-unit buffer:
//
//   unit 0       the embeddings and the final layernorm (wte, wpe, lnfw, lnfb): wte is both the input
//                embedding and the LM head, so this unit is used at both ends of the model
//   unit 1 + l   transformer block l: its 12 slices ln1w[l], ln1b[l], qkvw[l], ..., fcprojb[l]
//
// A unit's slices are in ascending flat order and the shards are ascending ranges of the same vector,
// so a unit laid out slice after slice is also laid out rank after rank: the elements in process 0's
// shard first, then process 1's, ... (a slice that straddles a shard boundary is split there). That
// makes one collective per unit enough, with no packing on the receiving side:
//   - gather (stage 3, before a block's forward and again before its backward): each process copies
//     its pieces of the unit into their places and one MPI_Allgatherv (counts[r] = the unit's elements
//     in shard r) fills in the rest. The next block's gather is started (MPI_Iallgatherv) into a
//     second buffer before the current block computes, so communication can overlap compute.
//   - reduce-scatter (stages 2 and 3, as soon as a unit's gradient is final for the micro-step): the
//     unit's gradient buffer goes through one MPI_Reduce_scatter with the same counts, and each process
//     adds the part it receives into its shard of the gradient accumulator.
// With gradient accumulation a unit is reduce-scattered every micro-step (the gradient memory stays at
// a shard plus one unit; the communication grows with the micro-steps); see doc/data_parallel.md.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "../gpt2_config.h"
#include "../utils.h"
#include "comm.h"
#include "zero.h"

struct ZeroSlice {
    size_t flat;         // first element in the flat parameter vector
    size_t length;
    size_t unit_offset;  // first element in the unit's buffer
};

struct ZeroUnit {
    std::vector<ZeroSlice> slices;  // the unit's tensors (slices), in flat order
    size_t size = 0;                // elements, all slices together
    std::vector<int> counts;        // (P) elements of the unit inside shard r
    std::vector<int> displs;        // (P) where shard r's elements start in the unit's buffer
    std::vector<ZeroSlice> mine;    // the pieces of the slices inside this process's shard
};

constexpr int ZERO_OUTER_UNIT = 0;
inline int zero_block_unit(int layer) { return 1 + layer; }

struct ZeroSharding {
    ProcessGroup pg;
    ShardLayout shard;
    std::vector<ZeroUnit> units;  // (1 + L)
    // stage 3: gathered parameters of unit 0, and of two blocks (the one computing, the one arriving)
    std::vector<float> outer_params, block_params[2];
    int block_params_unit[2] = {-1, -1};
    GatherRequest gathers[2];
    // stages 2 and 3: one unit's gradient at a time (unit 0's lives through the whole backward), and
    // the part of a reduce-scatter piece that lands in this shard
    std::vector<float> outer_grads, block_grads, shard_part;
};

// The units of a model (slices only); zero_sharding_init adds the per-rank counts.
inline std::vector<ZeroUnit> zero_units(const GPT2Config& cfg) {
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    param_tensor_offsets(cfg, offsets);
    auto add = [](ZeroUnit* u, size_t flat, size_t length) {
        u->slices.push_back({flat, length, u->size});
        u->size += length;
    };
    std::vector<ZeroUnit> units(1 + cfg.num_layers);
    for (int i : {P_WTE, P_WPE, P_LNFW, P_LNFB}) add(&units[ZERO_OUTER_UNIT], offsets[i], sizes[i]);
    for (int l = 0; l < cfg.num_layers; l++) {
        for (int i = P_LN1W; i <= P_FCPROJB; i++) {
            size_t per_layer = sizes[i] / cfg.num_layers;
            add(&units[zero_block_unit(l)], offsets[i] + l * per_layer, per_layer);
        }
    }
    return units;
}

// Splits each unit by shard and allocates the buffers of stage 2, or of stage 3 (shard_params: the
// parameters are sharded too, and gathered into buffers of their own).
inline void zero_sharding_init(ZeroSharding* zs, const GPT2Config& cfg, const ProcessGroup& pg,
                               const ShardLayout& shard, bool shard_params) {
    zs->pg = pg;
    zs->shard = shard;
    zs->units = zero_units(cfg);
    for (ZeroUnit& u : zs->units) {
        u.counts.assign(pg.size, 0);
        u.displs.assign(pg.size, 0);
        for (const ZeroSlice& s : u.slices) {
            for (int r = 0; r < pg.size; r++) {
                size_t begin = std::max(s.flat, (size_t)r * shard.shard_size);
                size_t end = std::min(s.flat + s.length, (size_t)(r + 1) * shard.shard_size);
                if (begin >= end) continue;
                u.counts[r] += (int)(end - begin);
                if (r == pg.rank) u.mine.push_back({begin, end - begin, s.unit_offset + (begin - s.flat)});
            }
        }
        for (int r = 1; r < pg.size; r++) u.displs[r] = u.displs[r - 1] + u.counts[r - 1];
    }
    size_t block_size = zs->units.size() > 1 ? zs->units[1].size : 0;
    zs->outer_grads.assign(zs->units[ZERO_OUTER_UNIT].size, 0.0f);
    zs->block_grads.assign(block_size, 0.0f);
    zs->shard_part.assign(block_size, 0.0f);  // a reduce-scatter piece (zero_reduce_scatter_unit)
    if (shard_params) {
        zs->outer_params.assign(zs->units[ZERO_OUTER_UNIT].size, 0.0f);
        zs->block_params[0].assign(block_size, 0.0f);
        zs->block_params[1].assign(block_size, 0.0f);
    }
}

// Starts gathering unit u's parameters into buf (the unit's size); shard_params is this process's
// shard (S elements, element 0 = flat element shard.begin).
inline void zero_gather_start(ZeroSharding* zs, int u, const float* shard_params, float* buf, GatherRequest* req) {
    const ZeroUnit& unit = zs->units[u];
    for (const ZeroSlice& piece : unit.mine) {
        std::copy(shard_params + (piece.flat - zs->shard.begin),
                  shard_params + (piece.flat - zs->shard.begin) + piece.length, buf + piece.unit_offset);
    }
    all_gather_v_start(zs->pg, buf, unit.counts, unit.displs, req);
}

// Unit 0's parameters, gathered (blocking). They stay valid until the parameters next change, so a
// micro-step's backward uses what its forward gathered.
inline const float* zero_gather_outer(ZeroSharding* zs, const float* shard_params) {
    GatherRequest req;
    zero_gather_start(zs, ZERO_OUTER_UNIT, shard_params, zs->outer_params.data(), &req);
    all_gather_v_wait(&req);
    return zs->outer_params.data();
}

// Start of a pass over the blocks (a forward or a backward): no gathered block is reused across
// passes, since the parameters may have changed between them.
inline void zero_blocks_begin(ZeroSharding* zs) {
    for (int b = 0; b < 2; b++) {
        if (zs->gathers[b].pending) all_gather_v_wait(&zs->gathers[b]);
        zs->block_params_unit[b] = -1;
    }
}

// Block `layer`'s parameters, gathered, for computing now; the gather of block `next` (-1: none) is
// started into the other buffer so it can arrive meanwhile. Forward passes next = layer + 1, the
// backward layer - 1. Every process makes the same calls in the same order.
inline const float* zero_gather_block(ZeroSharding* zs, int layer, int next, const float* shard_params) {
    int u = zero_block_unit(layer);
    int b = zs->block_params_unit[0] == u ? 0 : zs->block_params_unit[1] == u ? 1 : -1;
    if (b < 0) {  // not prefetched (the first block of a pass)
        b = zs->gathers[0].pending ? 1 : 0;
        zs->block_params_unit[b] = u;
        zero_gather_start(zs, u, shard_params, zs->block_params[b].data(), &zs->gathers[b]);
    }
    all_gather_v_wait(&zs->gathers[b]);
    if (next >= 0) {
        int other = 1 - b;
        if (zs->gathers[other].pending) all_gather_v_wait(&zs->gathers[other]);
        zs->block_params_unit[other] = zero_block_unit(next);
        zero_gather_start(zs, zero_block_unit(next), shard_params, zs->block_params[other].data(), &zs->gathers[other]);
    }
    return zs->block_params[b].data();
}

// Unit u's gradient in grads (the unit's size, this process's micro-batch) is final: sum it across
// processes and add this shard's part into the accumulator shard_grads (S elements, like shard_params).
// The collective goes in pieces of at most a block's size: MPI libraries allocate temporaries the size
// of a reduce-scatter's message, and unit 0 (wte) is several blocks large.
inline void zero_reduce_scatter_unit(ZeroSharding* zs, int u, const float* grads, float* shard_grads) {
    const ZeroUnit& unit = zs->units[u];
    const int P = zs->pg.size, me = zs->pg.rank;
    const size_t my_lo = unit.displs[me], my_hi = my_lo + unit.counts[me];  // my segment of the unit
    size_t piece = std::max(zs->shard_part.size(), (size_t)1);
    std::vector<int> counts(P);
    for (size_t lo = 0; lo < unit.size; lo += piece) {
        size_t hi = std::min(unit.size, lo + piece);
        for (int r = 0; r < P; r++) {  // the part of [lo, hi) inside process r's segment of the unit
            size_t seg_lo = std::max(lo, (size_t)unit.displs[r]);
            size_t seg_hi = std::min(hi, (size_t)unit.displs[r] + unit.counts[r]);
            counts[r] = seg_hi > seg_lo ? (int)(seg_hi - seg_lo) : 0;
        }
        reduce_scatter_v_sum(zs->pg, grads + lo, zs->shard_part.data(), counts);
        // unit elements [a, b) arrived; each lies in one of my pieces, at its flat index
        size_t a = std::max(lo, my_lo), b = std::min(hi, my_hi);
        for (const ZeroSlice& p : unit.mine) {
            size_t from = std::max(a, p.unit_offset), to = std::min(b, p.unit_offset + p.length);
            float* dst = shard_grads + (p.flat - zs->shard.begin) + (from - p.unit_offset);
            for (size_t i = from; i < to; i++) dst[i - from] += zs->shard_part[i - a];
        }
    }
}

// ----------------------------------------------------------------------------
// Memory per process: what a stage allocates, next to the ZeRO paper's formulas (fp32 here: 4 bytes
// per parameter, 4 per gradient, K for the optimizer's state: 8 for AdamW's two moments, 2 + 8/256 for
// 8-bit AdamW's codes and block maxima; Ψ parameters, N processes).

struct ZeroMemory {
    size_t params = 0, grads = 0, optimizer = 0;        // bytes allocated for the model state
    size_t gather_params = 0, gather_grads = 0;         // bytes of the per-unit buffers of stages 2 and 3
};

inline void zero_formula(int stage, double psi, int n, double k, double* params, double* grads, double* optimizer) {
    *params = stage == 3 ? 4 * psi / n : 4 * psi;
    *grads = stage >= 2 ? 4 * psi / n : 4 * psi;
    *optimizer = stage >= 1 ? k * psi / n : k * psi;
}

inline void zero_memory_print(int stage, size_t num_parameters, int n, const ZeroMemory& m, double k = 8.0) {
    double fp, fg, fo;
    zero_formula(stage, (double)num_parameters, n, k, &fp, &fg, &fo);
    char formula[64];
    const char* shapes[4] = {"4Ψ + 4Ψ + %gΨ", "4Ψ + 4Ψ + %gΨ/N", "4Ψ + (4Ψ + %gΨ)/N", "(8 + %g)Ψ/N"};
    snprintf(formula, sizeof(formula), shapes[stage], k);
    printf("memory per process, ZeRO-%d with N=%d, Ψ=%zu (bytes; formula %s):\n", stage, n, num_parameters, formula);
    printf("  parameters       %12zu  (formula %.0f)\n", m.params, fp);
    printf("  gradients        %12zu  (formula %.0f)\n", m.grads, fg);
    printf("  optimizer state  %12zu  (formula %.0f)\n", m.optimizer, fo);
    printf("  model state      %12zu  (formula %.0f)\n", m.params + m.grads + m.optimizer, fp + fg + fo);
    printf("  gather buffers   %12zu  (parameters %zu, gradients %zu; not in the formula)\n",
           m.gather_params + m.gather_grads, m.gather_params, m.gather_grads);
}

// Peak resident memory of this process (getrusage's ru_maxrss, in KiB on Linux), in bytes.
inline size_t peak_resident_bytes() {
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
    return (size_t)usage.ru_maxrss * 1024;
}

// Starts the peak over (Linux: writing 5 to /proc/self/clear_refs resets the high-water mark that
// ru_maxrss reports), so the peak of training is not the start-up's, when the full model was loaded.
inline bool peak_resident_reset() {
    FILE* f = fopen("/proc/self/clear_refs", "w");
    if (f == nullptr) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}
