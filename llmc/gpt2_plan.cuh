// The CUDA trainer's plan of a run (train_gpt2.cu), which needs no device memory: GPT2Plan, the model's
// shape, layout and settings as gpt2_setup decides them; the device memory they take (the model state
// at each ZeRO stage, the activations at each recompute level, Muon's scratch, -oo 1's host memory),
// checked before anything is allocated; -b auto's and -r auto's choices; and the bytes a step is
// predicted to move, which the tests compare with what the communicator counts.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpt2_config.h"
#include "optimizer.h"
#include "parallel/grad_buckets.h"
#include "parallel/layout.h"
#include "parallel/grad_compression.h"
#include "parallel/local_steps.h"
#include "parallel/matrix_owners.h"
#include "parallel/model_state.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "run/args.h"
#include "run/memory_plan.h"
#include "utils.h"

#include "cuda_common.cuh"
#include "adamw8.cuh"             // adamw8_gpu_bytes
#include "parallel/grad_compression.cuh"  // grad_compression_gpu_bytes
#include "fp8_linear.cuh"                 // fp8_training_bytes
#include "gpt2_activations.cuh"
#include "attention.cuh"          // check_attention_shape
#include "muon.cuh"               // muon_scratch_layout
#include "optimizer_offload.cuh"  // offload_host_bytes

// A run of the CUDA trainer as gpt2_setup and gpt2_allocate_activations decide it, before and apart from
// its device memory: the model's shape on this process, the parallel layout, the ZeRO shard and buckets,
// the optimizer and the settings that size the activations. GPT2 (train_gpt2.cu) is one of these plus
// its device memory; everything below reads only this.
struct GPT2Plan {
    GPT2Config config;
    size_t num_parameters = 0;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t param_offsets[NUM_PARAMETER_TENSORS];
    // data parallelism (llmc/parallel/layout.h: its groups over llmc/parallel/comm.h's NCCL backend, and the
    // ZeRO stage, 1 only with an NCCL communicator; llmc/parallel/grad_buckets.h)
    ParallelLayout layout;
    ShardLayout shard;                  // params (and grads but with -z 2) are padded to shard.padded_size
    size_t opt_begin = 0, opt_end = 0;  // the parameters this process's AdamW updates; m, v, master hold these
    std::vector<std::vector<GradSlice>> grad_buckets;
    bool packed_grads = false;    // -z 2: grads_memory is this process's shard of the gradient (shard.shard_size)
    bool sharded_params = false;  // -z 3: params_memory is this process's shard of the parameters too
    bool use_master_weights = false;
    OptimizerPlan optimizer;  // -opt: adamw, or muon (llmc/muon.cuh) on the block matrices, with their owners
    bool offload = false;     // -oo 1: the optimizer's state in pinned host memory
    int local_steps = 0, local_outer = 1;  // -lh, -lo with several data-parallel processes (llmc/parallel/local_steps.cuh)
    std::string grad_compression = "none";  // -gc, -gr likewise (llmc/parallel/grad_compression.cuh)
    int grad_rank = 4;
    // the data-parallel sum runs bucket by bucket during the last backward; -lh and -gc have their own
    bool reduces_in_buckets() const { return local_steps == 0 && grad_compression == "none"; }
    int recompute = 1;
    bool gelu_fusion = false;
    bool fp8_matmuls = false;     // -fp8 1: the block's linears in FP8 (llmc/fp8_linear.cuh)
    bool fp8_head = false;        // -fp8 2: and the LM head's forward and input gradient
    bool flash_attention = true;  // -fa; always false in the fp32 build
    int head_chunks = 0;          // -lc: the LM head in chunks of rows (head_chunk_rows), its gradient in the forward
    // pipeline parallelism (llmc/parallel/pipeline.h): config is this stage's (num_layers = its layers;
    // the whole model's is model_config); every stage keeps wte, wpe, lnfw and lnfb. tensor_origin[i]:
    // where this process's tensor i starts in the whole model's tensor i (0 without a pipeline)
    GPT2Config model_config;
    size_t tensor_origin[NUM_PARAMETER_TENSORS] = {};
    bool first_stage() const { return layout.pp_rank == 0; }
    bool last_stage() const { return layout.pp_rank == layout.pp - 1; }
    int batch_size = 0, seq_len = 0;  // the (B, T) the activations are allocated for
    int act_slots = 1;                // sets of activations (a pipeline stage keeps one per micro-batch in flight)
    ContextParallel cp;               // -cp: this process's positions of every sequence (llmc/parallel/context_split.h)
    size_t in_use_before = 0;         // device bytes in use before the model's allocations (context, cuBLAS)
};

// -fp8 1 or 2 (llmc/fp8_linear.cuh): true where it can run; fatal, with the reason, where it cannot: FP8 tensor
// cores (sm_89 and later) and the bf16 build, and not with the fused epilogues (-ge 1, -bg 1), which its
// products do not have.
inline bool fp8_training_possible(const TrainArgs& args) {
#if defined(ENABLE_FP32) || defined(ENABLE_FP16)
    fatal("flag -fp8 %d: FP8 training runs in the bf16 build (make train_gpt2cu) on an sm_89+ GPU; this is the %s build",
          args.fp8, PRECISION_NAME);
#endif
    int device = 0, major = 0, minor = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major * 10 + minor < 89) {
        fatal("flag -fp8 %d: FP8 matmuls need FP8 tensor cores (sm_89 and later: Ada, Hopper); this GPU is sm_%d%d",
              args.fp8, major, minor);
    }
    if (args.gelu_fusion || args.bias_grad_epilogue) {
        fatal("flag -fp8 %d with %s: the FP8 products take no GELU or bias-gradient epilogue; use %s", args.fp8,
              args.gelu_fusion ? "-ge 1" : "-bg 1", args.gelu_fusion ? "-ge 0" : "-bg 0");
    }
    return true;
}

// Decides the run's plan from the whole model's shape and the flags, over `world` (the run's processes;
// `distributed`: several, over NCCL): the layout and this process's stage and slices of the model, where
// each of its tensors starts in the whole one, the settings that size the activations, the optimizer, the
// ZeRO shard and gradient buckets. Nothing is allocated; a shape the kernels cannot take is refused here.
inline void gpt2_plan_init(GPT2Plan* plan, const GPT2Config& whole, const TrainArgs& args, const ProcessGroup& world,
                           bool distributed) {
    validate_config(whole, "model");
    if (whole.channels % 8 != 0 || (whole.channels / whole.num_heads) % 8 != 0) {
        fatal("the CUDA trainer needs channels and head size divisible by 8 (C %d, NH %d)", whole.channels,
              whole.num_heads);
    }
    if (!distributed && (args.pipeline_parallel > 1 || args.tensor_parallel > 1)) {
        fatal("flag -%s %d: %s are processes; launch %d or more", args.pipeline_parallel > 1 ? "pp" : "tp",
              std::max(args.pipeline_parallel, args.tensor_parallel),
              args.pipeline_parallel > 1 ? "pipeline stages" : "tensor-parallel ranks",
              args.pipeline_parallel * args.tensor_parallel);
    }
    if (!distributed && args.context_parallel > 1) fatal("flag -cp %d: its processes are GPUs; launch %d or more", args.context_parallel, args.context_parallel);
    // one GPU without NCCL: the whole model (-tp, -pp, -cp are refused above; -z has nothing to shard)
    plan->layout = distributed ? parallel_layout_from_args(world, args, whole) : parallel_layout_init(world, 1, 1, 0, whole);
    const int tp = plan->layout.tp;
    if (tp > 1 && (whole.padded_vocab_size / tp) % 8 != 0) {
        fatal("-tp %d: each process's %d vocabulary rows must be a multiple of 8 (16-byte loads)", tp,
              whole.padded_vocab_size / tp);
    }
    plan->model_config = whole;
    const GPT2Config cfg = layout_stage_config(plan->layout, whole);
    plan->config = cfg;
    // this process's tensors: its stage's layers, and with -tp its slices of them (llmc/parallel/tensor_parallel.h)
    tp_param_sizes(cfg, tp, plan->param_sizes);
    plan->num_parameters = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        plan->param_offsets[i] = plan->num_parameters;
        plan->num_parameters += plan->param_sizes[i];
    }
    // where this process's part of tensor i starts in the whole tensor (its stochastic rounding's seed):
    // a stage's layers start at layer_begin; a tensor-parallel slice is counted as the tp_rank-th block
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t whole_layer = plan->param_sizes[i] / cfg.num_layers * (tp_param_is_replicated(i) ? 1 : tp);
        plan->tensor_origin[i] = pp_param_is_shared(i) ? 0 : whole_layer * plan->layout.layer_begin;
        if (!tp_param_is_replicated(i)) plan->tensor_origin[i] += (size_t)plan->layout.tp_rank * plan->param_sizes[i];
    }
    if (plan->layout.pp > 1) {  // the activation slots of this stage's schedule over a step's micro-batches
        int m = args.B == BATCH_AUTO ? 1 : validate_batch_args(args, whole, plan->layout.dp);
        plan->act_slots = pp_activation_slots(args.pipeline_schedule, plan->layout.pp, plan->layout.pp_rank, m);
    }
#if defined(ENABLE_FP32)
    plan->use_master_weights = false;  // the parameters are fp32 already
#else
    plan->use_master_weights = args.master_weights != 0;
#endif
    OptimizerKind optimizer_kind;
    if (!optimizer_from_name(args.optimizer, &optimizer_kind)) fatal("flag -opt: unknown optimizer '%s'", args.optimizer.c_str());
    plan->recompute = args.recompute;
    plan->gelu_fusion = args.gelu_fusion != 0;
    if (args.fp8) plan->fp8_matmuls = fp8_training_possible(args);
    plan->fp8_head = plan->fp8_matmuls && args.fp8 == 2;
    plan->flash_attention = args.flash_attention != 0 && FLASH_ATTENTION_AVAILABLE;
    plan->head_chunks = args.head_chunks;
    check_attention_shape(cfg.channels / tp, cfg.num_heads / tp, plan->flash_attention);
    size_t n = plan->num_parameters;
    int zero_stage = plan->layout.zero_stage;
    plan->optimizer = optimizer_plan(optimizer_kind, cfg, plan->layout.dp);
    if (optimizer_kind == OPT_ADAFACTOR) plan->use_master_weights = false;  // its state is its factors alone
    // 8-bit AdamW is for when memory is short: its moments take 2 bytes a parameter, fp32 master weights
    // would add 4; as Adafactor, it rounds the floatX parameters stochastically instead (llmc/adamw8.cuh)
    if (optimizer_kind == OPT_ADAMW8) plan->use_master_weights = false;
    plan->offload = args.offload_optimizer != 0;
    if (plan->layout.dp > 1) {
        plan->local_steps = args.local_steps, plan->local_outer = args.local_outer;
        plan->grad_compression = args.grad_compression, plan->grad_rank = args.grad_rank;
    }
    if (plan->local_steps > 0 && sizeof(floatX) != sizeof(float) && !plan->use_master_weights) {
        fatal("flag -lh %d with -w 0: the replicas' changes are averaged in fp32, on the master weights (use -w 1)",
              plan->local_steps);
    }
    // shards of a multiple of 8 elements start 16 bytes apart (x128 loads); N is a multiple of C, so
    // one process's shard is exactly [0, N)
    plan->shard = aligned_shard_layout(n, plan->layout.dp, plan->layout.dp_rank, 8);
    plan->opt_begin = zero_stage >= 1 ? plan->shard.begin : 0;
    plan->opt_end = zero_stage >= 1 ? plan->shard.end : n;
    if (distributed) plan->grad_buckets = gradient_buckets(cfg, zero_stage, plan->shard.shard_size, tp);
    plan->packed_grads = zero_stage >= 2;
    plan->sharded_params = zero_stage == 3;
}

// The part [*begin, *end) of the flat gradient vector that grads_memory holds from its element 0: all of
// it, or with -z 2 and 3 this process's shard.
void held_gradient_range(const GPT2Plan* model, size_t* begin, size_t* end) {
    *begin = model->packed_grads ? shard_first(model->shard) : 0;
    *end = model->packed_grads ? *begin + model->shard.shard_size : model->num_parameters;
}

// The LM head's rows of wte on this process under -fp8 2 (its FP8 weight's scratch), else 0.
size_t fp8_head_rows(const GPT2Plan* model) {
    return model->fp8_head && model->last_stage() ? model->config.padded_vocab_size / model->layout.tp : 0;
}

// -fp8's state and scratch for a pass over (B, T) (llmc/fp8_linear.cuh), allocated after the activations
// and counted with them (the same at every -r); 0 without -fp8.
size_t fp8_activation_bytes(const GPT2Plan* model, int B, int T) {
    if (!model->fp8_matmuls) return 0;
    const ParallelLayout& lay = model->layout;
    return fp8_training_bytes(model->model_config.num_layers, model->fp8_head, (size_t)B * (T / lay.cp),
                              model->config.channels, model->config.channels / lay.tp, fp8_head_rows(model));
}

// Bytes of activations at a recompute level and attention path (the memory plan, -r auto, -b auto, the
// start-up report): with a pipeline, this stage's layers and its slots.
size_t activation_bytes(const GPT2Plan* model, int B, int T, int recompute, bool flash) {
    std::vector<ActivationTensors> unused(model->act_slots);
    const ParallelLayout& lay = model->layout;
    size_t R = sp_rows_per_rank((size_t)B * T, lay.tp, lay.sequence_parallel);  // a stage's rows of its input
    size_t pipe = lay.pp > 1 ? align_up_256(R * model->config.channels * sizeof(floatX)) : 0;
    return layout_activations(unused.data(), nullptr, model->config, B, T / lay.cp, recompute, flash, model->act_slots,
                              model->last_stage(), lay.tp, lay.sequence_parallel, lay.cp, lay.cp_mode, model->fp8_head,
                              model->head_chunks) + pipe +
           fp8_activation_bytes(model, B, T);  // -cp: T/cp positions
}

// The least recomputation level whose activations for (B, T) fit in `room` bytes; -1 if none does.
int least_recompute_that_fits(const GPT2Plan* model, int B, int T, size_t room) {
    for (int r = 0; r <= 3; r++) {
        if (activation_bytes(model, B, T, r, model->flash_attention) <= room) return r;
    }
    return -1;
}

// Model state per process (parameters, gradients, AdamW's m and v, master weights, and the packed and
// gathering buffers), predicted for each ZeRO stage from the shard arithmetic, beside what the
// allocations took (cudaMemGetInfo before and after): the ZeRO paper's Ψ(2 + 2 + 12)/N ladder with
// this trainer's buffers.
// The optimizer's fp32 state for opt_n parameters (all, or a ZeRO shard): AdamW's m and v (Muon's
// momentum in m) and the master weights (-w 1); Adafactor's factors (the whole state on every process;
// no m, no master weights).
void optimizer_state_floats(const GPT2Plan* model, size_t opt_n, size_t* m, size_t* v, size_t* master) {
    bool adafactor = model->optimizer.kind == OPT_ADAFACTOR, eight_bit = model->optimizer.kind == OPT_ADAMW8;
    *m = adafactor || eight_bit ? 0 : opt_n;
    *v = adafactor ? adafactor_state_size(model->optimizer.tensors) : eight_bit ? 0 : opt_n;
    *master = model->use_master_weights ? opt_n : 0;
}

// 8-bit AdamW's device bytes for the range [begin, end): its codes and block maxima (llmc/adamw8.h), the
// block table and edge buffers of its plan (llmc/adamw8.cuh), and the 2 P floats of the maxima's exchange
// (llmc/parallel/zero_blocks.h); 0 for another optimizer.
size_t adamw8_device_bytes(const GPT2Plan* model, size_t begin, size_t end) {
    if (model->optimizer.kind != OPT_ADAMW8) return 0;
    return adamw8_gpu_bytes(end - begin, adamw8_blocks_in(model->optimizer.tensors, begin, end), model->layout.dp);
}

size_t predicted_model_state_bytes(const GPT2Plan* model, int z) {
    const size_t n = model->num_parameters, P = (size_t)model->layout.dp, X = sizeof(floatX);
    const size_t padded = model->shard.padded_size, S = model->shard.shard_size;
    const size_t buffers = X * zero_buffer_elements(model->grad_buckets);
    if (P == 1) z = 0;
    size_t params = z == 3 ? X * S + buffers : X * padded;
    size_t grads = z >= 2 ? X * S + buffers : X * padded;
    size_t m, v, master;
    optimizer_state_floats(model, z >= 1 ? model->shard.end - model->shard.begin : n, &m, &v, &master);
    if (model->offload) return params + grads;  // -oo 1: the optimizer's state is in host memory
    size_t eight_bit = z >= 1 ? adamw8_device_bytes(model, model->shard.begin, model->shard.end) : adamw8_device_bytes(model, 0, n);
    return params + grads + (m + v + master) * sizeof(float) + eight_bit;
}

// The device memory -oo 1 would free: AdamW's state (0 when offloaded already, or for another optimizer)
size_t offload_saving_bytes(const GPT2Plan* model) {
    if (model->offload || model->optimizer.kind != OPT_ADAMW) return 0;
    size_t m, v, master;
    optimizer_state_floats(model, model->opt_end - model->opt_begin, &m, &v, &master);
    return (m + v + master) * sizeof(float);
}

// -oo 1: the pinned host memory of this process's offloaded AdamW (its state and the copies' staging)
size_t offload_host_bytes(const GPT2Plan* model) {
    return model->offload ? offload_host_bytes(model->opt_end - model->opt_begin, model->use_master_weights) : 0;
}

// The elements of the parameter and gradient arrays this process allocates: padded to whole shards, or
// with -z 3 (parameters) and -z 2, 3 (gradients) its shard.
size_t parameter_array_elements(const GPT2Plan* model) {
    return model->sharded_params ? model->shard.shard_size : model->shard.padded_size;
}
size_t gradient_array_elements(const GPT2Plan* model) {
    return model->packed_grads ? model->shard.shard_size : model->shard.padded_size;
}

// What the model state allocates on this process (gpt2_allocate_model_state), beside what it would be
// without sharding: the parameters and gradients (with -z 2, 3 their shards and the packed and gathering
// buffers, llmc/parallel/zero_device.cuh), the optimizer's state.
void print_model_state_allocation(const GPT2Plan* model) {
    size_t n = model->num_parameters, opt_n = model->opt_end - model->opt_begin;
    size_t grad_n = gradient_array_elements(model), param_n = parameter_array_elements(model);
    size_t buffers = model->packed_grads ? zero_buffer_elements(model->grad_buckets) : 0;
    size_t packed_n = buffers, gathered_n = model->sharded_params ? buffers : 0;
    size_t m_n, v_n, master_n;
    optimizer_state_floats(model, opt_n, &m_n, &v_n, &master_n);
    size_t opt_floats = m_n + v_n + master_n;
    printf("parameters: %zu (%s), %.1f MiB per process", n, PRECISION_NAME, (param_n + gathered_n) * sizeof(floatX) / 1048576.0);
    if (model->sharded_params) {
        printf(" (-z 3: a shard of %zu and gathering buffers of %zu; %.1f MiB unsharded)", param_n, gathered_n,
               n * sizeof(floatX) / 1048576.0);
    }
    printf("; gradients %.1f MiB per process", (grad_n + packed_n) * sizeof(floatX) / 1048576.0);
    if (model->packed_grads) {
        printf(" (-z %d: a shard of %zu and packed buffers of %zu; %.1f MiB unsharded)", model->layout.zero_stage, grad_n,
               packed_n, n * sizeof(floatX) / 1048576.0);
    }
    printf("\n");
    double all_mib = (model->use_master_weights ? 3 : 2) * n * sizeof(float) / 1048576.0;
    if (model->optimizer.kind == OPT_ADAMW8) {
        size_t bytes = adamw8_device_bytes(model, model->opt_begin, model->opt_end);
        printf("optimizer: 8-bit AdamW over %zu parameters on this process (%s), m and v in 8 bits in blocks of %zu: "
               "%.2f MiB per process (AdamW's m and v would take %.1f MiB), no master weights (stochastic rounding)\n",
               opt_n, model->layout.zero_stage >= 1 ? "ZeRO shard" : "all", ADAMW8_BLOCK, bytes / 1048576.0,
               2 * opt_n * sizeof(float) / 1048576.0);
    } else if (model->optimizer.kind == OPT_ADAFACTOR) {
        printf("optimizer: Adafactor over %zu tensors (each layer's its own), factored second moments of %zu floats "
               "(%.2f MiB; AdamW's m and v would take %.1f MiB), no master weights (stochastic rounding)\n",
               model->optimizer.tensors.size(), v_n, v_n * sizeof(float) / 1048576.0, 2 * n * sizeof(float) / 1048576.0);
    } else {
        printf("optimizer: AdamW over %zu parameters on this process (%s), m, v%s %.1f MiB per process (%.1f MiB "
               "unsharded)%s\n", opt_n, model->layout.zero_stage >= 1 ? "ZeRO shard" : "all",
               model->use_master_weights ? " and fp32 master weights" : "", opt_floats * sizeof(float) / 1048576.0, all_mib,
               model->offload ? ", offloaded (-oo 1): in pinned host memory, updated by the CPU" : "");
    }
}

void print_model_state_memory(const GPT2Plan* model, int zero_stage, size_t measured) {
    printf("model state per process: %.1f MiB allocated (cudaMemGetInfo), %.1f MiB predicted for -z %d; -z 0/1/2/3 "
           "with %d process(es):", measured / 1048576.0, predicted_model_state_bytes(model, zero_stage) / 1048576.0,
           zero_stage, model->layout.dp);
    for (int z = 0; z <= 3; z++) printf(" %.1f", predicted_model_state_bytes(model, z) / 1048576.0);
    printf(" MiB\n");
}

// What is kept free beside the planned allocations for what the run allocates later or lazily (kernel
// modules loaded at their first launch, cuBLASLt and NCCL internals): 512 MiB, or a 32nd of a smaller
// device's memory (the emulator's EMU_DEVICE_MEMORY in tests).
size_t memory_headroom(size_t total_bytes) { return std::min<size_t>(512ull << 20, total_bytes / 32); }

// Stops the run before allocating when the model state would not fit the free device memory, with the
// flags that shrink it (nothing has run yet: no out-of-memory error halfway through a step).
void check_model_state_fits(const GPT2Plan* model) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    size_t need = predicted_model_state_bytes(model, model->layout.zero_stage) + memory_headroom(total_bytes);
    if (need <= free_bytes) return;
    const double MiB = 1048576.0;
    const int z = model->layout.zero_stage;
    char ways[256] = "";
    if (model->use_master_weights) {
        size_t master = (z >= 1 ? model->shard.end - model->shard.begin : model->num_parameters) * sizeof(float);
        snprintf(ways, sizeof(ways), " -w 0 (no fp32 master weights: %.1f MiB),",
                 (predicted_model_state_bytes(model, z) - master) / MiB);
    }
    if (offload_saving_bytes(model) > 0) {
        snprintf(ways + strlen(ways), sizeof(ways) - strlen(ways), " -oo 1 (AdamW's state in host memory: %.1f MiB),",
                 (predicted_model_state_bytes(model, z) - offload_saving_bytes(model)) / MiB);
    }
    snprintf(ways + strlen(ways), sizeof(ways) - strlen(ways), " or more GPUs with -z 3 (%.1f MiB each on 8)",
             (double)predicted_model_state_bytes(model, 3) * model->layout.dp / 8 / MiB);
    fatal("the model state (%zu parameters: weights, gradients, AdamW's moments%s) needs %.1f MiB per process with "
          "-z %d and %d process(es), and %.1f MiB of the device's %.1f are free (%.1f MiB kept for the run's later "
          "allocations): nothing was allocated. Ways to fit:%s",
          model->num_parameters, model->use_master_weights ? ", master weights" : "",
          predicted_model_state_bytes(model, z) / MiB, z,
          model->layout.dp, free_bytes / MiB, total_bytes / MiB, memory_headroom(total_bytes) / MiB, ways);
}

// Muon's Newton-Schulz scratch, bytes (0 for another optimizer): for the largest block matrix, fcw's 4C·C
// (C: the whole model's channels), and with -tp the slices gathered and the matrix put together, with
// -z 2 and 3 the matrix gathered from the shards
size_t muon_scratch_bytes(const GPT2Plan* model) {
    if (model->optimizer.kind != OPT_MUON) return 0;
    MuonScratch unused;
    size_t C = model->config.channels;
    int matrices = model->layout.tp > 1 ? 2 : model->layout.zero_stage >= 2 ? 1 : 0;  // llmc/parallel/muon_step.h
    return muon_scratch_layout(nullptr, 4 * C * C, C, &unused) + matrices * 4 * C * C * sizeof(floatX);
}

// The run's device memory before the activations: what was in use before the model (the CUDA context,
// cuBLAS's workspace), the model state, Muon's scratch.
MemoryPlan gpt2_memory_plan_before_activations(const GPT2Plan* model) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    MemoryPlan plan;
    plan.capacity = total_bytes;
    plan.headroom = memory_headroom(total_bytes);
    const double MiB = 1048576.0;
    const int z = model->layout.zero_stage;
    char note[160];
    plan.add("in use before the model", model->in_use_before, "the CUDA context, cuBLAS's 32 MiB workspace");
    snprintf(note, sizeof(note), "-z %d of %d process(es); -z 0/1/2/3: %.1f %.1f %.1f %.1f MiB", z, model->layout.dp,
             predicted_model_state_bytes(model, 0) / MiB, predicted_model_state_bytes(model, 1) / MiB,
             predicted_model_state_bytes(model, 2) / MiB, predicted_model_state_bytes(model, 3) / MiB);
    const char* state = model->offload                            ? "model state (w, grads; -oo 1)"
                        : model->optimizer.kind == OPT_ADAFACTOR ? "model state (w, grads, factors)"
                        : model->optimizer.kind == OPT_ADAMW8    ? "model state (w, grads, m, v in 8 bits)"
                        : model->use_master_weights              ? "model state (w, grads, m, v, master)"
                                                                 : "model state (w, grads, m, v)";
    plan.add(state, predicted_model_state_bytes(model, z), note);
    if (model->offload) {
        plan.add_host(model->use_master_weights ? "AdamW m, v, master (-oo 1)" : "AdamW m, v (-oo 1)",
                      offload_host_bytes(model), "pinned; with the gradient and parameter staging copies");
    }
    if (muon_scratch_bytes(model) > 0) plan.add("Muon scratch", muon_scratch_bytes(model), "Newton-Schulz buffers");
    if (model->grad_compression != "none") {
        plan.add("-gc state", grad_compression_gpu_bytes(model->grad_compression, model->grad_rank, optimizer_tensors(model->config),
                                                         model->num_parameters, model->layout.dp), "residuals, buffers");
    }
    if (model->local_steps > 0) {
        plan.add("-lh state", local_steps_state_bytes(model->num_parameters, model->local_outer),
                 model->local_outer == 1 ? "anchor, outer momentum (fp32)" : "anchor (fp32)");
    }
    return plan;
}

// What a plan leaves for the activations: the device's memory less the plan's rows and the headroom.
size_t memory_room(const MemoryPlan& plan) {
    return plan.capacity > plan.total() + plan.headroom ? plan.capacity - plan.total() - plan.headroom : 0;
}

// The run's device memory, predicted (-P 1 prints it and exits; the start-up compares it with
// cudaMemGetInfo): the rows above and the activations at `recompute` (RECOMPUTE_AUTO: the least that
// fits, as gpt2_allocate_activations will choose; -r 3 when none does).
MemoryPlan gpt2_memory_plan(const GPT2Plan* model, int B, int T, int recompute) {
    MemoryPlan plan = gpt2_memory_plan_before_activations(model);
    const double MiB = 1048576.0;
    size_t act[4], fp8 = fp8_activation_bytes(model, B, T);  // in each activation_bytes; here a row of its own
    for (int r = 0; r <= 3; r++) act[r] = activation_bytes(model, B, T, r, model->flash_attention) - fp8;
    int level = recompute;
    if (level == RECOMPUTE_AUTO) {
        level = least_recompute_that_fits(model, B, T, memory_room(plan));
        if (level < 0) level = 3;
    }
    char note[160];
    snprintf(note, sizeof(note), "B=%d T=%d%s; -r 0/1/2/3: %.1f %.1f %.1f %.1f MiB", B, T,
             recompute == RECOMPUTE_AUTO ? ", the least -r that fits" : "", act[0] / MiB, act[1] / MiB, act[2] / MiB,
             act[3] / MiB);
    plan.add("activations at -r " + std::to_string(level), act[level], note);
    if (fp8 > 0) {
        plan.add("FP8 state and scratch", fp8, model->fp8_head ? "-fp8 2: scales, amax history, the 8-bit operands (the "
                                                                 "LM head's e5m2 dlogits: in the activations)"
                                                               : "-fp8 1: scales, amax history, the 8-bit operands");
    }
    return plan;
}

// -b auto: the largest micro-batch B dividing the sequences each process takes per step (-d / (T x
// processes)) whose activations fit what the plan leaves (at -r, or with -r auto at whichever level
// fits: a larger micro-batch first, then the least recomputation). Bigger micro-batches keep the GPU
// busier; the step computes the same -d tokens either way (accumulation makes up the rest).
int choose_batch(const GPT2Plan* model, const TrainArgs& args, int processes) {
    long per_process = (long)args.T * processes;
    if (args.total_batch_tokens % per_process != 0) {
        fatal("flag -b auto: total batch -d %ld is not a multiple of T*(data-parallel processes) = %d*%d", args.total_batch_tokens,
              args.T, processes);
    }
    long sequences = args.total_batch_tokens / per_process;
    size_t room = memory_room(gpt2_memory_plan_before_activations(model));
    for (long b = std::min<long>(sequences, 1 << 20); b >= 1; b--) {
        if (sequences % b != 0) continue;
        int r = args.recompute;  // the level asked, or -r auto's choice at this B; -1: none fits
        if (r == RECOMPUTE_AUTO) {
            r = least_recompute_that_fits(model, (int)b, args.T, room);
        } else if (activation_bytes(model, (int)b, args.T, r, model->flash_attention) > room) {
            r = -1;
        }
        if (r >= 0) {
            printf("batch: -b auto chose B=%ld (%ld micro-step(s) of -d %ld tokens): its activations at -r %d, %.1f "
                   "MiB, fit the %.1f MiB the model leaves\n", b, sequences / b, args.total_batch_tokens, r,
                   activation_bytes(model, (int)b, args.T, r, model->flash_attention) / 1048576.0,
                   room / 1048576.0);
            return (int)b;
        }
    }
    fatal("flag -b auto: not even B=1 at T=%d fits the %.1f MiB the model leaves (-r %s): a shorter -t, -r 3, or more "
          "GPUs with -z 2 or 3", args.T, room / 1048576.0,
          args.recompute == RECOMPUTE_AUTO ? "auto" : std::to_string(args.recompute).c_str());
}

// Bytes one process moves per training step (sent plus received, as llmc/parallel/comm.h counts a ring:
// 2(P-1)/P of a collective's size for a reduce-scatter or an all-gather, twice that for an all-reduce),
// with A micro-steps, for the model's ZeRO stage; X bytes per element, S the padded shard. A gather
// moves what this process does not hold: -z 3 gathers the blocks twice per micro-step and the outer
// tensors once per step, and this process holds `mine` of each (its shard's part, rank 0's wte and
// wpe in full). The scalar sums (losses) go uncounted, the gradient norm's one float is 16 bytes. A
// step right after an evaluation or a sample moves less with -z 3 (the outer tensors are gathered).
double predicted_data_parallel_bytes(const GPT2Plan* model, int A) {
    const double P = model->layout.dp, X = sizeof(floatX), N = (double)model->num_parameters;
    const double S = (double)model->shard.shard_size, f = (P - 1) / P;
    if (P == 1 || model->local_steps > 0) return 0.0;  // -lh: nothing but every H steps' synchronization
    if (model->grad_compression != "none") {
        return grad_compression_step_bytes(model->grad_compression, model->grad_rank, optimizer_tensors(model->config), (int)P);
    }
    const int z = model->layout.zero_stage;
    // -opt muon (llmc/parallel/matrix_owners.h): each matrix broadcast by its owner; -z 1 first gathers U
    double muon = 0;
    const OptimizerPlan& opt = model->optimizer;
    for (size_t k = 0; k < opt.tensors.size(); k++) {
        size_t n = opt.tensors[k].size() / model->layout.tp;  // with -tp this process's slice
        if (opt.owner[k] >= 0) muon += 2.0 * (double)(n - n / (size_t)P) * X;
    }
    if (opt.kind == OPT_MUON && z == 1) muon += 2 * S * (P - 1) * X;
    if (opt.kind == OPT_MUON && z >= 2) muon += 2.0 * (double)matrix_shard_gathered(opt, model->opt_begin, model->opt_end) * X;
    if (z == 0) return 2 * 2 * N * X * f + muon;
    double reduce = 2 * N * X * f, all_gather = 2 * S * (P - 1) * X, norm = 16;
    if (z == 1) return reduce + all_gather + norm + muon;
    if (z == 2) return A * reduce + all_gather + norm + muon;
    const int L = model->config.num_layers;
    double outer = (double)packed_size(model->grad_buckets[L]), outer_mine = 0;
    for (const GradSlice& s : model->grad_buckets[L]) outer_mine += s.owner == model->layout.dp_rank ? s.count : 0;
    double blocks = N - outer, blocks_mine = (double)(model->shard.end - model->shard.begin) - outer_mine;
    return A * (reduce + 2 * 2 * (blocks - blocks_mine) * X) + 2 * (outer - outer_mine) * X + norm + muon;
}

// With tensor or pipeline parallelism, add (as comm.h counts them, each process's 1/P share rounded
// down) tensor parallelism's all-reduces of (B, T, C) per micro-step (the embedding on the first stage,
// two per layer forward, two backward, one more with -r 3's recomputation, the LM head's input
// gradient and the classifier's two sums of B·T floats on the last stage; its max goes uncounted) and
// its broadcasts of the replicated gradients per step, and the stages' sums of the shared tensors'
// gradients (two all-reduces: wte and wpe, lnfw and lnfb) and the stage-to-stage messages (per
// micro-step a (B, T, C) tensor in and a gradient out to the previous stage, one out and one in from
// the next). The gradient norm is then summed on the host (uncounted).
// With -sq 1 each all-reduce of a (B, T, C) sum is a reduce-scatter and each layernorm output is
// gathered, G = 2(P-1)·R·C elements each (R rows per process): per layer 4 in the forward (2 gathers,
// 2 reduce-scatters), 6 in the backward (d(residual) and the layernorm output gathered twice each, 2
// reduce-scatters), 3 more with -r 3 (block_forward_to_fc again), 1 more with -ge 1 at -r 1 or 2 (ln2 for the fc matmul again); the
// embedding's reduce-scatter and its gradient's gather on the first stage; lnf's gather and its
// gradient's reduce-scatter on the last; and per step the all-reduce of the layernorms' gradients.
double predicted_comm_bytes(const GPT2Plan* model, int A) {
    const ParallelLayout& lay = model->layout;
    double bytes = predicted_data_parallel_bytes(model, A);
    bytes += context_parallel_step_bytes(lay.cp_mode, lay.cp, model->batch_size, model->seq_len, model->config.channels / lay.tp,
                                         model->config.num_layers, A, model->recompute, sizeof(floatX), ULYSSES_BACKWARD_COLUMNS);
    if (lay.tp == 1 && lay.pp == 1) return bytes;
    if (lay.zero_stage >= 1 && lay.dp > 1) bytes -= 16;  // the norm's float, summed on the host instead
    const size_t X = sizeof(floatX);
    auto all_reduce_bytes = [](size_t n, size_t P, size_t x) { return 2.0 * (double)(n - n / P) * 2 * x; };
    size_t BT = (size_t)model->batch_size * model->seq_len / lay.cp, C = model->config.channels;  // -cp: its rows
    size_t R = sp_rows_per_rank(BT, lay.tp, lay.sequence_parallel);  // a process's rows of the residual stream
    if (lay.tp > 1) {
        size_t BTC = BT * C, P = lay.tp;
        double micro = 0, classifier = all_reduce_bytes(2 * BT, P, sizeof(float));
        if (lay.sequence_parallel) {
            double G = 2.0 * (double)((P - 1) * R * C) * X;
            int r = model->recompute, per_layer = 10 + (r >= 3 ? 3 : 0) + (r >= 1 && r < 3 && model->gelu_fusion ? 1 : 0);
            micro = model->config.num_layers * per_layer * G;
            if (model->first_stage()) micro += 2 * G;
            if (model->last_stage()) micro += 2 * G + classifier;
        } else {
            micro = model->config.num_layers * (4 + (model->recompute >= 3 ? 1 : 0)) * all_reduce_bytes(BTC, P, X);
            if (model->first_stage()) micro += all_reduce_bytes(BTC, P, X);
            if (model->last_stage()) micro += all_reduce_bytes(BTC, P, X) + classifier;
        }
        bytes += A * micro;
        const OptimizerPlan& opt = model->optimizer;  // -opt muon: the owned matrices' slices gathered
        for (size_t k = 0; k < opt.tensors.size(); k++) {
            if (opt.owner[k] == lay.dp_rank) bytes += 2.0 * (double)((P - 1) * (opt.tensors[k].size() / P)) * X;
        }
        size_t begin, end;  // -z 2, 3: the replicated tensors' parts in this process's shard
        held_gradient_range(model, &begin, &end);
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            size_t lo = std::max(begin, model->param_offsets[i]), hi = std::min(end, model->param_offsets[i] + model->param_sizes[i]);
            size_t n = lo < hi ? hi - lo : 0;
            if (tp_param_is_replicated(i)) bytes += 2.0 * (double)(n - n / P) * X;
            if (lay.sequence_parallel && sp_param_is_partial(i)) bytes += all_reduce_bytes(n, P, X);
        }
    }
    if (lay.pp > 1) {
        size_t outer[2] = {model->param_offsets[P_LN1W], model->num_parameters - model->param_offsets[P_LNFW]};
        for (size_t n : outer) bytes += all_reduce_bytes(n, lay.pp, X);
        int neighbours = (model->first_stage() ? 0 : 1) + (model->last_stage() ? 0 : 1);
        bytes += (double)A * neighbours * 2 * (R * C) * X;  // its rows of the residual stream (all without -sq)
    }
    return bytes;
}

// -oo 1: stops the run before allocating when the pinned host memory it needs is more than the host
// has available (pinned pages cannot be swapped out).
void check_offload_fits_host(const GPT2Plan* model) {
    size_t need = offload_host_bytes(model), available = host_available_bytes();
    if (need == 0 || available == 0 || need <= available) return;
    fatal("-oo 1: AdamW's offloaded state and its copies need %.1f MiB of pinned host memory per process, and the "
          "host has %.1f MiB available: nothing was allocated. Ways to fit: -z 1 or more with more processes (each "
          "offloads its shard), or -oo 0", need / 1048576.0, available / 1048576.0);
}

// -r auto: the least recomputation whose activations fit the free device memory (all levels give the
// same bits, so the choice changes the speed and the memory, never the results). A level that does
// not fit, chosen or forced, stops the run here, before the activations are allocated, with the
// levels and batch sizes that would fit.
int choose_recompute(const GPT2Plan* model, int B, int T, int asked) {
    bool flash = model->flash_attention;
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    size_t room = free_bytes > memory_headroom(total_bytes) ? free_bytes - memory_headroom(total_bytes) : 0;
    auto fits = [&](int r, int b) { return activation_bytes(model, b, T, r, flash) <= room; };
    int least = least_recompute_that_fits(model, B, T, room);
    const double MiB = 1048576.0;
    if (asked == RECOMPUTE_AUTO && least >= 0) {
        printf("recompute: -r auto chose -r %d: its activations, %.1f MiB, fit the %.1f MiB free (less %.1f MiB kept "
               "for later allocations)%s\n", least, activation_bytes(model, B, T, least, flash) / MiB,
               free_bytes / MiB, memory_headroom(total_bytes) / MiB, least == 0 ? "" : "; less recomputation does not");
        return least;
    }
    if (asked != RECOMPUTE_AUTO && fits(asked, B)) return asked;
    std::string ways;
    if (least >= 0) {
        ways = " -r " + std::to_string(least) + " (or -r auto)";
    } else {
        int b = B;
        while (b > 1 && !fits(3, b)) b /= 2;
        if (fits(3, b)) ways = " -b " + std::to_string(b) + " with -r 3 (-d keeps the total batch by accumulation),";
        if (offload_saving_bytes(model) > 0) {
            char freed[96];
            snprintf(freed, sizeof(freed), " -oo 1 (AdamW's state in host memory frees %.1f MiB),", offload_saving_bytes(model) / MiB);
            ways += freed;
        }
        ways += std::string(ways.empty() ? "" : " or") + " a shorter -t, or more GPUs with -z 2 or 3 (less model state each)";
    }
    fatal("activations for B=%d T=%d need %.1f MiB at -r %s (-r 0/1/2/3: %.1f %.1f %.1f %.1f MiB), and %.1f MiB "
          "are free after the model state (less %.1f MiB kept for later allocations): nothing was run. Ways to "
          "fit:%s", B, T, activation_bytes(model, B, T, asked == RECOMPUTE_AUTO ? 3 : asked, flash) / MiB,
          asked == RECOMPUTE_AUTO ? "3 (the least -r auto can reach)" : std::to_string(asked).c_str(),
          activation_bytes(model, B, T, 0, flash) / MiB, activation_bytes(model, B, T, 1, flash) / MiB,
          activation_bytes(model, B, T, 2, flash) / MiB, activation_bytes(model, B, T, 3, flash) / MiB,
          free_bytes / MiB, memory_headroom(total_bytes) / MiB, ways.c_str());
}

// -r auto on several processes: each chooses, and all take the most any needs (-r 3 recomputes a block's
// tensor-parallel all-reduce, so every process must run the same level).
int agree_recompute(const GPT2Plan* model, int B, int T, int asked) {
    int mine = choose_recompute(model, B, T, asked);
    if (asked != RECOMPUTE_AUTO) return mine;
    int all = (int)all_reduce_extreme(model->layout.world, (uint64_t)mine, false, "-r auto's choice");
    if (all != mine) printf("recompute: -r %d, the most any process needs (this one: -r %d)\n", all, mine);
    return all;
}

// -P 1's batch: -b, or what -b auto would choose on this process.
inline int planned_batch(const GPT2Plan* model, const TrainArgs& args) {
    return args.B == BATCH_AUTO ? choose_batch(model, args, model->layout.dp) : args.B;
}

// -b auto on several processes: every process's choice divides the sequences a step takes, so the least
// fits all.
int agree_batch(const GPT2Plan* model, const TrainArgs& args) {
    if (model->layout.pp > 1) fatal("flag -b auto with -pp: a stage's activation slots depend on the batch; give -b");
    int mine = choose_batch(model, args, model->layout.dp);
    int all = (int)all_reduce_extreme(model->layout.world, (uint64_t)mine, true, "-b auto's choice");
    if (all != mine) printf("batch: -b auto: B=%d, the least any process could take (this one: %d)\n", all, mine);
    return all;
}

// The start-up's predictions beside what happened: the bytes a step will move (metrics.jsonl counts
// them), the device memory in use, and the memory plan (-P 1) against it.
void print_predictions_and_memory(const GPT2Plan* model, const TrainArgs& args, int micro_steps) {
    const ParallelLayout& layout = model->layout;
    if (layout.dp > 1 || layout.pp > 1 || layout.tp > 1) {
        printf("communication: %.0f bytes per step predicted for -z %d, %d data-parallel process(es), tp %d, %d "
               "stage(s), %d micro-step(s) (counted in metrics.jsonl's comm_bytes)\n",
               predicted_comm_bytes(model, micro_steps), layout.zero_stage, layout.dp, layout.tp, layout.pp, micro_steps);
        if (model->cp.on()) {  // (in the backward's scratch: no buffers of its own)
            const GPT2Config& c = model->config;
            printf("%s\n", context_parallel_describe(model->cp, model->batch_size, model->seq_len, c.channels / layout.tp,
                                                     c.num_layers, micro_steps, model->recompute, sizeof(floatX),
                                                     ULYSSES_BACKWARD_COLUMNS).c_str());
        }
        if (model->local_steps > 0) {
            printf("communication: -lh %d: %.0f bytes at each synchronization (after every %d steps and the last)\n",
                   model->local_steps, local_steps_sync_bytes(model->num_parameters, layout.dp, sizeof(floatX)), model->local_steps);
        }
    }
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("device memory: %s in use of %s\n", memory_text(total_bytes - free_bytes).c_str(),
           memory_text(total_bytes).c_str());
    size_t planned = gpt2_memory_plan(model, args.B, args.T, model->recompute).total(), used = total_bytes - free_bytes;
    printf("memory: %zu bytes planned (-P 1), %zu in use (cudaMemGetInfo): %+.2f%%; %zu of each were in use before "
           "the model (the device's count: other processes' too)\n",
           planned, used, 100.0 * ((double)used - (double)planned) / (double)planned, model->in_use_before);
}
