// The CPU trainer's memory plan (train_gpt2.cpp; -P 1 prints it, and the run checks it against what it
// allocated): from the shapes and the layout alone, nothing allocated. llmc/gpt2_plan.cuh is the CUDA
// trainer's.
#pragma once

#include <cstdio>
#include <vector>

#include "gpt2_activations.h"
#include "gpt2_config.h"
#include "adamw8.h"
#include "optimizer.h"
#include "parallel/context_parallel.h"
#include "parallel/grad_compression.h"
#include "parallel/layout.h"
#include "parallel/local_steps.h"
#include "parallel/matrix_owners.h"
#include "parallel/model_state.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "parallel/zero_sharded.h"
#include "run/args.h"
#include "run/memory_plan.h"

// The run's memory per process, from the shapes alone (llmc/run/memory_plan.h; -P 1 prints it before
// anything is allocated): this process's parameters and gradients (its stage's layers, its tensor-
// parallel slices, padded or sharded as gpt2_setup_optimizer does), the optimizer's state, ZeRO-2/3's
// unit buffers (llmc/parallel/zero_sharded.h), the activation sets (layout_activations) and the
// backward scratch. Every one is a float vector the trainer allocates, so the plan is exact; the
// process's other memory (the program, OpenMP and MPI, the data loader's shard) is not in it.
MemoryPlan gpt2_memory_plan(const GPT2Config& model_cfg, const ParallelLayout& lay, OptimizerKind kind,
                            const TrainArgs& args, int m) {
    GPT2Config cfg = layout_stage_config(lay, model_cfg);
    size_t sizes[NUM_PARAMETER_TENSORS], n = 0;
    tp_param_sizes(cfg, lay.tp, sizes);
    for (size_t s : sizes) n += s;
    const ShardLayout sh = shard_layout(n, lay.dp, lay.dp_rank);
    const int z = lay.zero_stage;
    const size_t F = sizeof(float), opt_n = z >= 1 ? sh.end - sh.begin : n;
    OptimizerPlan opt = optimizer_plan(kind, cfg, lay.dp);
    size_t moments_bytes = (kind == OPT_ADAFACTOR ? adafactor_state_size(opt.tensors) : 2 * opt_n) * sizeof(float);
    if (kind == OPT_ADAMW8) {  // the codes and the maxima of the blocks holding the range (llmc/adamw8.h)
        moments_bytes = adamw8_state_bytes(opt_n, adamw8_blocks_in(opt.tensors, z >= 1 ? sh.begin : 0, z >= 1 ? sh.end : n));
    }
    size_t gathers = 0;
    if (z >= 2) {  // the outer unit and a block's, for the gradients (and a reduce-scatter piece); -z 3 params too
        std::vector<ZeroUnit> units = zero_units(cfg);
        size_t outer = units[ZERO_OUTER_UNIT].size, block = units.size() > 1 ? units[1].size : 0;
        gathers = (outer + 2 * block) * (z == 3 ? 2 : 1);
    }
    bool last = lay.pp_rank == lay.pp - 1;
    int slots = lay.pp > 1 ? pp_activation_slots(args.pipeline_schedule, lay.pp, lay.pp_rank, m) : 1;
    const int Tl = args.T / lay.cp;  // -cp: this process's positions of each row
    auto activations = [&](int r) {
        return layout_activations(nullptr, nullptr, cfg, args.B, Tl, r, lay.tp, last, lay.sequence_parallel, lay.cp);
    };
    size_t set = activations(args.recompute);
    size_t scratch_sizes[NUM_SCRATCH_TENSORS], scratch = 0;
    backward_scratch_sizes(cfg, args.B, Tl, lay.tp, last, scratch_sizes, lay.sequence_parallel);
    for (size_t n_i : scratch_sizes) scratch += n_i;
    char note[160];
    MemoryPlan plan;
    snprintf(note, sizeof(note), "fp32, %zu of this process's %zu; %s", z == 3 ? sh.shard_size : sh.padded_size, n,
             z == 3 ? "-z 3: its shard" : "padded to whole shards");
    plan.add("parameters", (z == 3 ? sh.shard_size : sh.padded_size) * F, note);
    plan.add("gradients", (z >= 2 ? sh.shard_size : sh.padded_size) * F, z >= 2 ? "-z 2, 3: its shard" : "");
    snprintf(note, sizeof(note), "%s over %zu parameters%s", optimizer_name(kind), opt_n, z >= 1 ? " (its ZeRO shard)" : "");
    plan.add(kind == OPT_ADAFACTOR ? "optimizer state (factors)" : kind == OPT_ADAMW8 ? "optimizer state (m, v in 8 bits)"
             : "optimizer state (m, v)", moments_bytes, note);
    if (gathers > 0) plan.add("ZeRO unit buffers", gathers * F, "a block's and the outer tensors' gathers and reductions");
    snprintf(note, sizeof(note), "B=%d T=%d at -r %d, %d set(s); -r 0/1/2/3 a set: %.1f %.1f %.1f %.1f MiB", args.B,
             args.T, args.recompute, slots,
             activations(0) * F / 1048576.0, activations(1) * F / 1048576.0, activations(2) * F / 1048576.0,
             activations(3) * F / 1048576.0);
    plan.add("activations", set * slots * F, note);
    plan.add("backward scratch", scratch * F, last ? "with the logits' gradient" : "");
    if (lay.cp > 1) {
        size_t C = cfg.channels, Cl = C / lay.tp;
        plan.add("-cp buffers", context_parallel_state_bytes(lay.cp_mode, lay.cp, args.B, args.T, C, Cl, cfg.num_heads / lay.tp),
                 lay.cp_mode == ContextMode::ring ? "K/V chunks, their gradients, log-sum-exps; tokens, wpe rows"
                                                  : "all-to-all staging; tokens, wpe rows");
    }
    if (lay.dp > 1 && args.grad_compression != "none") {
        plan.add("-gc state", grad_compression_state_bytes(args.grad_compression, args.grad_rank, optimizer_tensors(cfg), n, lay.dp),
                 args.grad_compression == "sign" ? "h, H, every process's bits and scales" : "residuals, Q, P and Q's buffers");
    }
    if (lay.dp > 1 && args.local_steps > 0) {
        plan.add("-lh state", local_steps_state_bytes(n, args.local_outer), args.local_outer == 1 ? "anchor, outer momentum" : "anchor");
    }
    return plan;
}

// Bytes of the arrays the plan counts, as allocated (their sizes, not the process's resident memory).

// The bytes per parameter of the optimizer's state (the ZeRO formula's K, llmc/parallel/zero_sharded.h):
// AdamW's two fp32 moments (Muon's momentum in their place; Adafactor's factors are counted as AdamW's
// there), 8-bit AdamW's codes and block maxima.
inline double optimizer_bytes_per_parameter(OptimizerKind kind) {
    return kind == OPT_ADAMW8 ? ADAMW8_BYTES_PER_PARAMETER : 2.0 * sizeof(float);
}

// What the optimizer keeps and does on this process (-opt): its state's memory, and for Muon which
// matrices this process orthogonalizes and what that adds to a step's communication.
inline void optimizer_print(const OptimizerPlan& opt, const ParallelLayout& layout, size_t opt_begin, size_t opt_end,
                            const ShardLayout& shard, size_t num_parameters, size_t adafactor_state) {
    const ProcessGroup& dp = layout.dp_group;
    const ProcessGroup& tp = layout.tp_group;
    const char* zero_names[4] = {"all", "ZeRO-1 shard", "ZeRO-2 shard", "ZeRO-3 shard"};
    const char* range = zero_names[layout.zero_stage];
    size_t n = opt_end - opt_begin;
    auto mib = [](size_t floats) { return floats * sizeof(float) / 1048576.0; };
    if (opt.kind == OPT_ADAMW) {
        printf("optimizer: AdamW over %zu parameters on this process (%s), moments %.1f MiB per process\n", n, range,
               mib(2 * n));
        return;
    }
    if (opt.kind == OPT_ADAMW8) {
        size_t blocks = adamw8_blocks_in(opt.tensors, opt_begin, opt_end);
        printf("optimizer: 8-bit AdamW over %zu parameters on this process (%s), moments in %zu blocks of %zu: %.2f MiB "
               "per process (fp32 moments would be %.1f MiB)\n", n, range, blocks, ADAMW8_BLOCK,
               adamw8_state_bytes(n, blocks) / 1048576.0, mib(2 * n));
        return;
    }
    if (opt.kind == OPT_ADAFACTOR) {
        size_t state = adafactor_state, adamw = 2 * num_parameters;
        printf("optimizer: Adafactor over %zu tensors (each layer's its own), factored second moments of %zu floats "
               "(%.2f MiB) whole on every process; AdamW's moments would be %zu floats (%.1f MiB): saves %.1f MiB per "
               "process%s\n", opt.tensors.size(), state, mib(state), adamw, mib(adamw), mib(adamw) - mib(state),
               dp.size > 1 ? " (against AdamW at -z 0)" : "");
        return;
    }
    size_t matrices = 0, mine = 0, matrix_floats = 0;
    double work = 0, my_work = 0;
    for (size_t k = 0; k < opt.tensors.size(); k++) {
        if (opt.owner[k] < 0) continue;
        double w = newton_schulz_flops(opt.tensors[k].rows, opt.tensors[k].cols, MuonHyper().ns_steps);
        matrices++, work += w, matrix_floats += opt.tensors[k].size() / tp.size;  // this process's slices
        if (opt.owner[k] == dp.rank) mine++, my_work += w;
    }
    printf("optimizer: Muon on %zu block matrices (each layer's its own), AdamW on the other tensors; momentum and "
           "moments over %zu parameters (%s), %.1f MiB per process\n", matrices, n, range, mib(2 * n));
    if (dp.size > 1) {
        double P = dp.size, gather = layout.zero_stage == 1 ? 8.0 * shard.padded_size * (P - 1) / P : 0;
        if (layout.zero_stage >= 2) gather = 8.0 * matrix_shard_gathered(opt, opt_begin, opt_end);
        printf("optimizer: this process orthogonalizes %zu of the %zu matrices, %.2f of %.2f GFLOP per step; Muon adds "
               "%.1f MiB per step to this process's communication (llmc/parallel/matrix_owners.h: %sthe orthogonalized "
               "matrices' broadcasts %.1f MiB)\n", mine, matrices, my_work / 1e9, work / 1e9,
               (gather + 8.0 * matrix_floats * (P - 1) / P) / 1048576.0,
               layout.zero_stage == 1 ? "the Nesterov updates' all-gather, "
               : layout.zero_stage >= 2 ? "each matrix's update gathered, " : "",
               8.0 * matrix_floats * (P - 1) / P / 1048576.0);
    }
    if (tp.size > 1) {  // each owned matrix gathered whole over the TP group (llmc/parallel/muon_step.h)
        size_t owned = 0;
        for (size_t k = 0; k < opt.tensors.size(); k++) owned += opt.owner[k] == dp.rank ? opt.tensors[k].size() : 0;
        printf("optimizer: -tp %d: this process's TP group gathers the %zu matrices its data-parallel rank owns whole for "
               "Newton-Schulz, %.1f MiB per step (each of its ranks orthogonalizes them and keeps its slice)\n", tp.size,
               mine, 8.0 * owned * (tp.size - 1) / tp.size / 1048576.0);
    }
}
