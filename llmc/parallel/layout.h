// The process layout of a 3D-parallel run: tensor (TP), data (DP) and pipeline (PP) parallel.
//
// `mpirun -np 8 ./train_gpt2 -tp 2 -pp 2` runs TP 2 x PP 2 and DP 8 / (2 * 2) = 2. Each process has one
// coordinate per dimension, and the world rank is
//
//     rank = tp_rank + tp * (dp_rank + dp * pp_rank)          (Megatron-LM's order)
//
// so the TP peers of a process are its neighbours (ranks 0,1 | 2,3 | ...): on a real machine they share a
// node, where the per-layer all-reduces of tensor parallelism are cheap. The DP peers are tp apart and
// the pipeline stages tp*dp apart. For np 8, tp 2, pp 2:
//
//     rank:     0 1 2 3 4 5 6 7
//     tp_rank:  0 1 0 1 0 1 0 1
//     dp_rank:  0 0 1 1 0 0 1 1
//     pp_rank:  0 0 0 0 1 1 1 1
//
// One sub-group (communicator) per dimension: the processes that differ only in that coordinate.
// Gradients are summed over the DP group, activations over the TP group, and sent along the PP group.
//
// Context parallelism (-cp, llmc/parallel/context_parallel.h) splits each sequence's positions over cp
// processes that otherwise behave as data-parallel peers: their gradients are partial sums over the same
// batch's tokens, summed over the data-parallel group like any replica's, and ZeRO shards over them too.
// So they live inside the data-parallel group, as its neighbours:
//
//     dp_rank = cp_rank + cp * replica          (the replica: which batches the process reads)
//
// and cp_group holds the processes that differ only in cp_rank (the same batch, other positions).
//
// A layout is refused, with the reason, when it cannot split the model: the sizes must divide the
// process count, TP must divide the head count (whole heads per process) and the padded vocabulary (the
// embedding is split by rows of wte), and there cannot be more stages than layers.
//
// The layout is the one owner of "where am I": built once from the flags (-tp, -pp, -z) at start-up,
// it holds the groups, the ZeRO stage of the data-parallel group and the layers of this process's
// pipeline stage; the trainers and the schemes (llmc/zero*.h, tensor_parallel.h, pipeline.h) ask it
// and never derive these again.
#pragma once

#include <string>

#include "../gpt2_config.h"
#include "../utils.h"
#include "comm.h"
#include "context_split.h"
#include "pipeline.h"

struct ParallelLayout {
    int tp = 1, pp = 1, dp = 1;                 // sizes; tp * pp * dp = world.size
    int tp_rank = 0, pp_rank = 0, dp_rank = 0;  // this process's coordinates
    ProcessGroup world;
    ProcessGroup tp_group, pp_group, dp_group;  // the processes differing only in that coordinate
    bool sequence_parallel = false;             // -sq 1: rows of the residual stream split over tp_group
    int cp = 1, cp_rank = 0;                    // -cp: each sequence's positions split over cp_group
    ContextMode cp_mode = ContextMode::ring;    // -cpm: which positions each holds (context_split.h)
    ProcessGroup cp_group;                      // the cp processes of one replica (inside dp_group)
    int zero_stage = 0;                         // -z: what the data-parallel group shards (llmc/parallel/zero.h)
    int layer_begin = 0, layer_end = 0;         // this pipeline stage's layers [layer_begin, layer_end)
};

// One process holding the whole model (and the default of a model built before the layout is known).
inline ParallelLayout single_process_layout(const GPT2Config& cfg) {
    ParallelLayout lay;
    lay.layer_end = cfg.num_layers;
    return lay;
}

// The world rank of the process at (tp_rank, dp_rank, pp_rank).
inline int layout_rank(const ParallelLayout& lay, int tp_rank, int dp_rank, int pp_rank) {
    return tp_rank + lay.tp * (dp_rank + lay.dp * pp_rank);
}

// The data-parallel replicas, the processes reading different batches: the data-parallel group's
// processes over context parallelism's (the loader's rank and count of them).
inline int layout_data_rank(const ParallelLayout& lay) { return lay.dp_rank / lay.cp; }
inline int layout_data_size(const ParallelLayout& lay) { return lay.dp / lay.cp; }

// Why the layout cannot run (world_size processes, the model cfg), or "" when it can.
inline std::string parallel_layout_problem(int world_size, int tp, int pp, const GPT2Config& cfg, int cp = 1,
                                           ContextMode cp_mode = ContextMode::ring) {
    char text[512];
    if (tp < 1 || pp < 1 || cp < 1) {
        snprintf(text, sizeof(text), "-tp %d -pp %d -cp %d: sizes must be at least 1", tp, pp, cp);
    } else if (world_size % (tp * pp) != 0) {
        snprintf(text, sizeof(text), "-tp %d x -pp %d = %d does not divide the %d process(es); the data-parallel size "
                 "is processes / (tp * pp), so launch a multiple of %d processes", tp, pp, tp * pp, world_size, tp * pp);
    } else if (world_size % (tp * pp * cp) != 0) {
        snprintf(text, sizeof(text), "-cp %d does not divide the %d data-parallel process(es) (processes / (tp * pp)); "
                 "launch a multiple of %d processes", cp, world_size / (tp * pp), tp * pp * cp);
    } else if (cfg.num_heads % tp != 0) {
        snprintf(text, sizeof(text), "-tp %d does not divide the model's %d attention heads (each process computes "
                 "whole heads)", tp, cfg.num_heads);
    } else if (cfg.padded_vocab_size % tp != 0 || cfg.padded_vocab_size / tp < 1) {
        snprintf(text, sizeof(text), "-tp %d does not divide the padded vocabulary %d (the embedding and the LM head "
                 "are split by vocabulary rows)", tp, cfg.padded_vocab_size);
    } else if (pp > cfg.num_layers) {
        snprintf(text, sizeof(text), "-pp %d: more pipeline stages than the model's %d layers", pp, cfg.num_layers);
    } else {
        return context_heads_problem(cp, cp_mode, cfg.num_heads / tp);  // (T is checked with the flags)
    }
    return text;
}

// Splits the world into the three groups; fatal (with the reason) for a layout that cannot run.
// Every process must call it with the same arguments.
inline ParallelLayout parallel_layout_init(const ProcessGroup& world, int tp, int pp, int zero_stage,
                                           const GPT2Config& cfg, int cp = 1, ContextMode cp_mode = ContextMode::ring) {
    std::string problem = parallel_layout_problem(world.size, tp, pp, cfg, cp, cp_mode);
    if (!problem.empty()) fatal("process layout: %s", problem.c_str());
    ParallelLayout lay;
    lay.world = world;
    lay.tp = tp;
    lay.pp = pp;
    lay.dp = world.size / (tp * pp);
    lay.tp_rank = world.rank % tp;
    lay.dp_rank = (world.rank / tp) % lay.dp;
    lay.pp_rank = world.rank / (tp * lay.dp);
    // color: the other two coordinates, flattened; key: the coordinate along the group. A dimension
    // of size 1 is this process alone, one as large as the world is the world: neither needs a split
    // (so data parallelism alone runs over any backend, NCCL's included)
    auto group = [&](int size, int color, int key) {
        return size == 1 ? ProcessGroup() : size == world.size ? world : process_group_split(world, color, key);
    };
    lay.tp_group = group(tp, lay.dp_rank + lay.dp * lay.pp_rank, lay.tp_rank);
    lay.dp_group = group(lay.dp, lay.tp_rank + tp * lay.pp_rank, lay.dp_rank);
    lay.pp_group = group(pp, lay.tp_rank + tp * lay.dp_rank, lay.pp_rank);
    lay.cp = cp;
    lay.cp_mode = cp_mode;
    lay.cp_rank = lay.dp_rank % cp;
    lay.cp_group = group(cp, lay.tp_rank + tp * (lay.dp_rank / cp + lay.dp / cp * lay.pp_rank), lay.cp_rank);
    lay.cp_group.name = "context-parallel";
    lay.tp_group.name = "tensor-parallel";
    lay.dp_group.name = "data-parallel";
    lay.pp_group.name = "pipeline";
    // a data-parallel group of one process has nothing to shard (with -cp, its processes share it): ZeRO's stages are data parallelism's
    if (zero_stage > 0 && lay.dp == 1) {
        printf("one data-parallel process: nothing to shard, -z %d runs as -z 0\n", zero_stage);
        zero_stage = 0;
    }
    lay.zero_stage = zero_stage;
    pp_stage_layers(cfg.num_layers, pp, lay.pp_rank, &lay.layer_begin, &lay.layer_end);
    return lay;
}

// "tp 2 x pp 2 x dp 2" and this process's coordinates, for the start-up line.
inline std::string parallel_layout_describe(const ParallelLayout& lay) {
    char text[200], cp[64] = "";
    if (lay.cp > 1) snprintf(cp, sizeof(cp), ", context parallel: %d replica(s) x cp %d", lay.dp / lay.cp, lay.cp);
    snprintf(text, sizeof(text), "tp %d x pp %d x dp %d%s%s (rank %d: tp_rank %d, pp_rank %d, dp_rank %d)", lay.tp, lay.pp,
             lay.dp, lay.sequence_parallel ? ", sequence parallel" : "", cp, lay.world.rank, lay.tp_rank, lay.pp_rank,
             lay.dp_rank);
    return text;
}
