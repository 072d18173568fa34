/*
GPT-2 training on NVIDIA GPUs in BF16 mixed precision (or fp32 with PRECISION=FP32): the same model,
flags, logs and checkpoint files as train_gpt2.cpp, with each layer's forward and backward a CUDA
kernel or a cuBLASLt call from the llmc/ .cuh headers. doc/cuda.md explains the design.
One GPU, or one process per GPU on one or many nodes with NCCL (-z 0 all-reduce, -z 1 ZeRO-1, -z 2 ZeRO-2, -z 3 ZeRO-3):
llmc/parallel/gpu_start.cuh, llmc/parallel/comm_nccl.cuh and doc/data_parallel.md; pipeline stages (-pp, -pm) over NCCL send/receive:
llmc/parallel/pipeline.h and doc/model_parallel.md; tensor parallelism (-tp) over NCCL all-reduces:
llmc/parallel/tensor_parallel.h.

    tokens -> encoder -> L x [ ln1 -> qkv -> attention -> attproj -> +residual
                               ln2 -> fc -> gelu -> fcproj -> +residual ] -> lnf -> logits (x wteᵀ) -> loss

Mixed precision: parameters, gradients and activations are stored in floatX (bf16); every kernel
computes in fp32; AdamW keeps fp32 moments and fp32 master weights (-w 1) and rounds the bf16 copy
stochastically from them. Everything that is not a kernel (flags, data, checkpoints, schedules, logs,
sampling) is the CPU trainer's host code from the llmc/ .h headers.

Run `./train_gpt2cu -h` for the flags.
*/
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/adamw.h"  // AdamWHyper and clip_scale(), shared with the CPU trainer
#include "llmc/gpt2_config.h"
#include "llmc/gpt2_init.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/dataloader.h"
#include "llmc/io/output_lock.h"
#include "llmc/optimizer.h"
#include "llmc/parallel/grad_completion.h"
#include "llmc/parallel/layout.h"
#include "llmc/parallel/matrix_owners.h"
#include "llmc/parallel/muon_step.h"
#include "llmc/parallel/model_state.h"
#include "llmc/rand.h"
#include "llmc/run/args.h"
#include "llmc/run/checkpoint_state.h"
#include "llmc/run/hellaswag.h"
#include "llmc/run/logger.h"
#include "llmc/run/loss_scaler.h"
#include "llmc/run/memory_plan.h"
#include "llmc/run/model_source.h"
#include "llmc/run/run_loop.h"
#include "llmc/run/sampler.h"
#include "llmc/run/schedulers.h"
#include "llmc/run/train_common.h"
#include "llmc/tokenizer/tokenizer_file.h"
#include "llmc/utils.h"

#include "llmc/cuda_common.cuh"  // first: floatX and the checks the kernels use
#include "llmc/adafactor.cuh"
#include "llmc/adamw.cuh"
#include "llmc/adamw8.cuh"
#include "llmc/attention.cuh"
#include "llmc/gpt2_head.cuh"  // the LM head and the classifier (llmc/classifier.cuh), -lc in chunks
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/global_norm.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul_choices.cuh"  // matmul.cuh, and -at 1's algorithms kept in the checkpoint
#include "llmc/muon.cuh"
#include "llmc/optimizer_offload.cuh"
#include "llmc/parallel/comm_nccl.cuh"
#include "llmc/parallel/zero_device.cuh"
#include "llmc/run/device_report.cuh"
#include "llmc/run/phase_events.cuh"
#include "llmc/gpt2_activations.cuh"  // the activation table
#include "llmc/gpt2_plan.cuh"         // GPT2Plan: shapes, settings, memory and byte predictions
#include "llmc/gpt2_memory.cuh"       // allocating and freeing what GPT2 points to

// The model files this build writes: bf16's own, or fp32 (llm.c's format has no fp16 version; fp16 widens exactly)
constexpr int MODEL_VERSION_NATIVE = std::is_same<floatX, __nv_bfloat16>::value ? MODEL_VERSION_BF16 : MODEL_VERSION_FP32;

// ----------------------------------------------------------------------------
// Parameters: 16 tensors in checkpoint order, pointers into one device allocation.

using ParameterTensors = ParameterTensorsOf<floatX>;  // llmc/gpt2_config.h
using BlockParams = BlockTensorsOf<const floatX>;     // one block's slices of them
using BlockGrads = BlockTensorsOf<floatX>;

// Activations: everything the forward keeps for the backward and all scratch, in one device allocation
// (llmc/gpt2_activations.cuh: ActivationTensors, and BlockActs, one block's views of them at layer l).

// The model on the device: the plan's shapes and settings (llmc/gpt2_plan.cuh: what gpt2_setup decides
// before anything is allocated, and what the memory plan and the byte prediction read), then the
// device memory (llmc/gpt2_memory.cuh allocates and frees it) and the run's state.
struct GPT2 : GPT2Plan {
    floatX* params_memory = nullptr;  // one allocation: the 16 tensors
    floatX* grads_memory = nullptr;   // one allocation: their gradients
    float* opt_memory = nullptr;      // one allocation: AdamW m, v, and the master weights if kept
    float *m_memory = nullptr, *v_memory = nullptr, *master_memory = nullptr;
    // -oo 1 (llmc/optimizer_offload.cuh): opt_memory is pinned host memory and AdamW runs on the CPU;
    // every copy to or from m, v and master says cudaMemcpyDefault, so it is right for either place
    OptimizerOffload offloaded;
    ParameterTensors params, grads;
    // data parallelism: dp (the NCCL start-up and its watchdog) is null and the layout a single process
    // in the tests' single models
    DataParallel* dp = nullptr;
    bool reduce_in_backward = false;  // set for the last micro-step: reduce each layer's gradients as it finishes
    // -z 2, 3: the packed gradient buffers and (-z 3) the gathered parameters, with their collectives
    // (llmc/parallel/zero_device.cuh); params and grads point their 4 outer tensors into them
    ZeroDevice zero;
    Adamw8Gpu adamw8;  // -opt adamw8: m and v in 8 bits over [opt_begin, opt_end) (llmc/adamw8.cuh)
    LocalStepsGpu local;  // -lh H: the replicas synchronize every H steps (llmc/parallel/local_steps.cuh)
    GradCompressionGpu compression;  // -gc sign|powersgd (llmc/parallel/grad_compression.cuh)
    Fp8Training fp8;  // -fp8 1: the block's linears in FP8 (2: and the LM head's), their scales (llmc/fp8_linear.cuh)
    void* muon_memory = nullptr;  // muon: Newton-Schulz scratch (MuonScratch)
    MuonScratch muon_scratch;
    floatX* muon_gathered = nullptr;  // -tp: (tp, a matrix's slice), every rank's slice of one matrix
    floatX* muon_whole = nullptr;     // -tp, -z 2/3: (rows, cols), one matrix put together
    floatX* pipe_grad_in = nullptr;  // (B, T, C): d(loss)/d(this stage's output), received from the next
    // activations, allocated once for the run's (B, T): act_slots sets (a pipeline stage keeps one per
    // micro-batch in flight), acts the current one, with its encoder buckets
    char* acts_memory = nullptr;
    std::vector<ActivationTensors> slots;
    std::vector<EncoderBuckets> slot_buckets;
    ActivationTensors acts;
    EncoderBuckets* buckets = nullptr;
    float* host_losses = nullptr;   // (B, T), pinned: copies into it do not block the host
    float* host_norm_sq = nullptr;  // (NUM_PARAMETER_TENSORS), pinned
    size_t logits_first_row = 0;    // the row acts.logits starts with after a forward (-lc: the last chunk's first)
    cudaStream_t stream = nullptr;
};

// Waits for the compute stream. With several processes its work can depend on theirs, so the wait
// goes through the watchdog (dp_wait), which gives up after -pt seconds instead of hanging.
void gpt2_sync(GPT2* model, const char* what) {
    if (model->dp != nullptr) dp_wait(*model->dp, model->stream, what);
    else cudaCheck(cudaStreamSynchronize(model->stream));
}

// Uploads fp32 host parameters (checkpoint order) to the device as floatX, and this process's part
// [opt_begin, opt_end) of them to the master weights.
void gpt2_upload_parameters(GPT2* model, const std::vector<float>& params, bool to_master = true) {
    // -z 3: this process's shard only, [opt_begin, opt_end) (the padding after N stays zero)
    size_t first = model->sharded_params ? model->opt_begin : 0;
    size_t last = model->sharded_params ? model->opt_end : model->num_parameters;
    std::vector<floatX> converted(last - first);
    for (size_t i = first; i < last; i++) converted[i - first] = host_to_floatX(params[i]);
    cudaCheck(cudaMemcpy(model->params_memory, converted.data(), converted.size() * sizeof(floatX),
                         cudaMemcpyHostToDevice));
    model->zero.outer_gathered = false;
    if (model->master_memory && to_master) {
        cudaCheck(cudaMemcpy(model->master_memory, params.data() + model->opt_begin,
                             (model->opt_end - model->opt_begin) * sizeof(float), cudaMemcpyDefault));
    }
}

// The device parameters as fp32 on the host (exact: bf16 widens to fp32 without rounding); -z 3: gathered,
// every process taking part.
std::vector<float> gpt2_download_parameters(GPT2* model) {
    if (model->sharded_params) {
        return zero_gather_all_parameters(&model->zero, model->num_parameters, [&](const char* what) { gpt2_sync(model, what); });
    }
    std::vector<floatX> raw(model->num_parameters);
    cudaCheck(cudaMemcpy(raw.data(), model->params_memory, model->num_parameters * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> params(model->num_parameters);
    for (size_t i = 0; i < model->num_parameters; i++) params[i] = host_from_floatX(raw[i]);
    return params;
}

void gpt2_setup(GPT2* model, const GPT2Config& whole, const TrainArgs& args, DataParallel* dp = nullptr) {
    model->dp = dp;
    cudaCheck(cudaStreamCreate(&model->stream));
    // the collectives of llmc/parallel/comm.h run over the run's processes (one without NCCL), ordered after this
    // stream's work; the layout (llmc/parallel/layout.h) splits them into tp, pp, dp (and cp) groups
    ProcessGroup world = dp != nullptr ? nccl_group(dp, model->stream) : ProcessGroup();
    gpt2_plan_init(model, whole, args, world, dp != nullptr && dp->nccl);
    matmul_configure(args.matmul_autotune != 0, args.bias_grad_epilogue != 0);  // -at 1, -bg 1 (llmc/matmul.cuh)
    size_t free_before = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_before, &total_bytes));
    model->in_use_before = total_bytes - free_before;
    if (args.plan) {  // -P 1: the plan, and nothing allocated; each process closes its communicator for mpirun
        print_memory_plan(gpt2_memory_plan(model, planned_batch(model, args), args.T, args.recompute));
        if (dp != nullptr) dp_finalize(dp);
        exit(EXIT_SUCCESS);
    }
    check_model_state_fits(model);
    check_offload_fits_host(model);
    gpt2_allocate_model_state(model);
    size_t free_after = 0;
    cudaCheck(cudaMemGetInfo(&free_after, &total_bytes));
    print_model_state_memory(model, model->layout.zero_stage, free_before - free_after);
    if (model->optimizer.kind == OPT_MUON) gpt2_allocate_muon_scratch(model);
}

// Builds the model (this process's pipeline stage of it) from a checkpoint file, or (for a descriptor)
// from a random initialization; returns the whole model's fp32 parameters it was built from.
std::vector<float> gpt2_build(GPT2* model, const std::string& name, const TrainArgs& args, DataParallel* dp = nullptr) {
    GPT2Config cfg;
    // -P 1 prints the plan and exits in gpt2_setup: the shape is all it needs (d48's random weights take
    // a minute to draw, a checkpoint's to read)
    if (args.plan) gpt2_setup(model, gpt2_config_from_flag(name), args, dp);
    std::vector<float> params = gpt2_parameters_from_flag(name, (unsigned)args.seed, &cfg);
    gpt2_setup(model, cfg, args, dp);
    if (model->layout.tp > 1 || model->layout.pp > 1) {  // this process's part (llmc/parallel/model_state.h)
        gpt2_upload_parameters(model, layout_local_part(model->layout, cfg, params, 0, model->num_parameters));
    } else {
        gpt2_upload_parameters(model, params);
    }
    const ProcessGroup& group = model->layout.dp_group;
    local_steps_gpu_start(args.local_steps, args.local_outer, group, gpt2_fp32_weights(model), model->num_parameters, &model->local);
    grad_compression_gpu_start(args.grad_compression, args.grad_rank, group, optimizer_tensors(model->config), model->num_parameters,
                               &model->compression);
    return params;
}

// Block l's parameters: the stacked tensors' slices, or (-z 3) the gathered copy, waited for if it was
// prefetched (wait = true).
BlockParams block_params(GPT2* model, int l, bool wait) {
    if (!model->sharded_params) return block_tensors<const floatX>(model->params, l, model->config.channels, model->layout.tp);
    return packed_block<const floatX>(zero_gathered_block(&model->zero, l, wait), model);
}

// ----------------------------------------------------------------------------
// forward, backward, update

// Sequence parallelism (-sq 1, llmc/parallel/tensor_parallel.h): this process's rows of a pass over B·T
// (all of them, and no collectives, without it).
SequenceShard gpt2_sequence_shard(const GPT2* model, size_t BT) {
    return sequence_shard(BT, model->layout.tp_group, model->layout.sequence_parallel, nullptr);
}

// The tensor-parallel collectives between the matmuls on this trainer's floatX device buffers, ordered on
// the compute stream (llmc/parallel/tensor_parallel.h). sp_gather: every process's rows of `mine` into
// acts.gathered, returned (`mine` itself without -sq); sp_sum: a row-parallel output's (or a
// column-parallel input gradient's) terms summed: with -sq this process's rows, reduce-scattered.
const floatX* sp_gather(GPT2* model, const floatX* mine, const SequenceShard& sq, size_t C) {
    auto copy = [&](floatX* dst, const floatX* src, size_t n) {
        cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(floatX), cudaMemcpyDeviceToDevice, model->stream));
    };
    return sp_all_gather(mine, model->acts.gathered, sq, C, model->layout.tp_group, COMM_FLOATX, copy);
}
floatX* sp_sum(GPT2* model, floatX* full, const SequenceShard& sq, size_t C) {
    return tp_sum_rows(full, sq, C, model->layout.tp_group, COMM_FLOATX);
}

// A row-parallel matmul's replicated bias: added by tensor-parallel rank 0 only, so the sum has it once.
const floatX* row_parallel_bias(const GPT2* model, const floatX* bias) { return model->layout.tp_rank == 0 ? bias : nullptr; }

// One block's forward from its ln1 (already computed) to its fch_gelu, everything but the fcproj matmul
// and the residual add that end it: qkv, attention, attproj, residual2 = residual + attproj fused with
// ln2, fc and GELU (fused into the fc matmul with -ge 1). The forward runs it for every block, and -r 3's
// recomputation again in the backward, with the same kernels on the same inputs: the same bits.
// With tensor parallelism (llmc/parallel/tensor_parallel.h) qkv and fc are this process's columns
// (its heads, its 4C/tp hidden units) and attproj its rows: attproj's output is one term of a sum over
// the processes, all-reduced before the residual add (replicated bias added by tp rank 0 only).
// With sequence parallelism (-sq 1) ln1, the residuals and ln2 hold this process's rows: each layernorm
// output is gathered for the matmul after it, attproj's terms reduce-scattered instead of all-reduced.
void block_forward_to_fc(GPT2* model, const BlockParams& w, const BlockActs& b, int B, int T) {
    const ActivationTensors& a = model->acts;
    int tp = model->layout.tp, C = model->config.channels, Cl = C / tp, NH = model->config.num_heads / tp, BT = B * T;
    SequenceShard sq = gpt2_sequence_shard(model, BT);
    cudaStream_t stream = model->stream;
    linear_forward(fp8_of(model, b, FP8_QKV), b.qkv, sp_gather(model, b.ln1, sq, C), w.qkvw, w.qkvb, BT, C, 3 * Cl, stream);
    cp_attention_forward(model->cp, context_scratch(a), b.atty, b.att, b.qkv, a.attn_scratch, B, T, Cl, NH,
                         model->flash_attention, stream);
    linear_forward(fp8_of(model, b, FP8_ATTPROJ), b.attproj, b.atty, w.attprojw, row_parallel_bias(model, w.attprojb), BT, Cl, C,
                   stream);
    const floatX* proj = sp_sum(model, b.attproj, sq, C);
    fused_residual_layernorm_forward(b.residual2, b.ln2, b.ln2_mean, b.ln2_rstd, b.residual, proj, w.ln2w, w.ln2b,
                                     (int)sq.rows, C, stream);
    const floatX* ln2 = sp_gather(model, b.ln2, sq, C);
    if (model->gelu_fusion) {
        matmul_forward(b.fch_gelu, b.fch, ln2, w.fcw, w.fcb, BT, C, 4 * Cl, stream);
    } else {
        linear_forward(fp8_of(model, b, FP8_FC), b.fch, ln2, w.fcw, w.fcb, BT, C, 4 * Cl, stream);
        gelu_forward_to_linear(fp8_of(model, b, FP8_FCPROJ), b.fch_gelu, b.fch, BT, 4 * Cl, C, stream);  // fcproj's x
    }
}

// Block l's forward: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) after
// block_forward_to_fc, the residual add fused with the layernorm that follows the block: the next
// block's ln1 (whose parameters, -z 3, are waited for here), or lnf after the last block (this process's
// rows with -sq 1, gathered for the LM head by gpt2_forward).
void block_forward(GPT2* model, int l, const BlockParams& w, const LayerStrides& ls, int B, int T) {
    const ActivationTensors& a = model->acts;
    const ParameterTensors& p = model->params;
    int L = model->config.num_layers, tp = model->layout.tp, C = model->config.channels, BT = B * T;
    SequenceShard sq = gpt2_sequence_shard(model, BT);
    const size_t R = sq.rows_per_rank, N = sq.rows;
    BlockActs b = block_acts(a, ls, l);
    cudaStream_t stream = model->stream;
    block_forward_to_fc(model, w, b, B, T);
    linear_forward(fp8_of(model, b, FP8_FCPROJ), b.fcproj, b.fch_gelu, w.fcprojw, row_parallel_bias(model, w.fcprojb), BT,
                   4 * C / tp, C, stream);
    const floatX* proj = sp_sum(model, b.fcproj, sq, C);
    if (l + 1 < L) {
        BlockParams next = block_params(model, l + 1, true);
        BlockActs nb = block_acts(a, ls, l + 1);
        fused_residual_layernorm_forward(b.residual3, nb.ln1, nb.ln1_mean, nb.ln1_rstd, b.residual2, proj, next.ln1w,
                                         next.ln1b, (int)N, C, stream);
    } else {
        floatX* lnf_mine = a.lnf + (sq.on ? model->layout.tp_rank * R * C : 0);
        fused_residual_layernorm_forward(b.residual3, lnf_mine, a.lnf_mean, a.lnf_rstd, b.residual2, proj, p.lnfw,
                                         p.lnfb, (int)N, C, stream);
    }
}

// Forward pass over inputs (B, T) (host arrays). With targets, also the per-position losses (fetch their
// mean with gpt2_mean_loss); with dloss > 0 the classifier also leaves d(loss)/d(logits) in
// acts.logits, scaled by dloss, ready for gpt2_backward (-lc: the LM head's backward is done here, chunk by
// chunk, and d(loss)/d(lnf) left in acts.lnf). acts.logits holds rows from logits_first_row on (all but
// with -lc: then the last chunk's). Nothing here waits for the GPU.
void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss = 0.0f) {
    const GPT2Config& cfg = model->config;
    int L = cfg.num_layers, C = cfg.channels, V = cfg.vocab_size, Vp = cfg.padded_vocab_size, tp = model->layout.tp;
    int Vl = Vp / tp, v_begin = model->layout.tp_rank * Vl;  // this process's vocabulary rows of wte (all without -tp)
    if ((size_t)B * T > (size_t)model->batch_size * model->seq_len || T > model->seq_len) {
        fatal("gpt2_forward: B=%d T=%d exceeds the allocated B=%d T=%d", B, T, model->batch_size, model->seq_len);
    }
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V))) {
            fatal("gpt2_forward: token id at position %d is outside 0..%d", i, V - 1);
        }
    }
    model->fp8.record = dloss > 0.0f;  // -fp8: a training forward records its tensors' amax, an evaluation none
    const ParameterTensors& p = model->params;
    const ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;
    RowPositions pos = context_parallel_positions(&model->cp, B, &T, &inputs, &targets);  // -cp: T/cp positions
    size_t BT = (size_t)B * T;
    LayerStrides ls = layer_strides(cfg, B, T, model->recompute, model->flash_attention, tp,
                                    model->layout.sequence_parallel, model->layout.cp, model->layout.cp_mode);
    SequenceShard sq = gpt2_sequence_shard(model, BT);  // -sq 1: this process's rows of the residual stream
    const size_t R = sq.rows_per_rank, N = sq.rows;
    if (sq.on && (size_t)(tp - 1) * R >= BT) {
        fatal("-sq 1: B*T = %zu rows leave tensor-parallel rank %d of %d none (each takes ceil(B*T/tp) = %zu); use "
              "a larger -b or -t, or -sq 0", BT, tp - 1, tp, R);
    }

    cudaCheck(cudaMemcpyAsync(a.inputs, inputs, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets) cudaCheck(cudaMemcpyAsync(a.targets, targets, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (dloss > 0.0f && model->first_stage()) encoder_prepare_backward(model->buckets, inputs, B, T, V, stream, v_begin, Vl);

    zero_gather_pass_begin(&model->zero, 0);  // -z 3: the outer tensors and block 0 (each later block is prefetched)
    // a pipeline stage after the first has the previous stage's output in a.encoded (llmc/parallel/pipeline.h);
    // with -tp each process embeds the tokens of its vocabulary rows and the sum is the embedding
    // (-sq 1: each process's rows of the sum: a reduce-scatter)
    if (model->first_stage()) {
        floatX* terms = sq.on ? a.attproj : a.encoded;  // -sq 1: the projections' scratch holds the sum's terms
        encoder_forward(terms, a.inputs, p.wte, p.wpe, B, T, C, stream, v_begin, Vl, pos);
        const floatX* mine = sp_sum(model, terms, sq, C);
        if (sq.on && N > 0) {
            cudaCheck(cudaMemcpyAsync(a.encoded, mine, N * C * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
        }
    }
    // layer 0's ln1; every later layernorm is fused with the residual add that precedes it
    BlockParams first = block_params(model, 0, false);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, first.ln1w, first.ln1b, (int)N, C, stream);
    for (int l = 0; l < L; l++) {
        zero_gather_prefetch(&model->zero, l + 1);
        BlockParams w = block_params(model, l, false);  // waited for by the previous block's end
        block_forward(model, l, w, ls, B, T);
    }
    // a stage before the last ends with its residual3 (its lnf, computed by the fused kernel, goes unused)
    if (!model->last_stage()) return;
    sp_all_gather(a.lnf + model->layout.tp_rank * R * C, a.lnf, sq, C, model->layout.tp_group, COMM_FLOATX,
                  [](floatX*, const floatX*, size_t) {});  // lnf's own rows are in place already
    gpt2_head_forward(model, BT, targets != nullptr, dloss);  // llmc/gpt2_head.cuh: logits, loss (-lc: in chunks)
}

// Mean of the per-position losses of the last forward with targets; waits for the GPU.
float gpt2_mean_loss(GPT2* model, int B, int T) {
    size_t BT = (size_t)B * T / model->layout.cp;  // -cp: this process's rows, and its share of their mean
    cudaCheck(cudaMemcpyAsync(model->host_losses, model->acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    gpt2_sync(model, "the loss (and the gradient reduction before it)");
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += model->host_losses[i];
    return (float)(sum / (BT * model->layout.cp));
}

void gpt2_zero_grad(GPT2* model) {
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, gradient_array_elements(model) * sizeof(floatX), model->stream));
}

// Recomputes what the forward of block b did not keep (-r 1: GELU; 2: the layernorms too; 3: the whole
// block up to the fc matmul), with the same kernels on the same inputs: the same bits.
void block_recompute(GPT2* model, const BlockParams& w, const BlockActs& b, int B, int T) {
    int tp = model->layout.tp, C = model->config.channels, Cl = C / tp;
    size_t BT = (size_t)B * T;
    SequenceShard sq = gpt2_sequence_shard(model, BT);
    const size_t N = sq.rows;
    const ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;
    if (model->recompute >= 3) {
        // the whole block again, from its input, as the forward ran it (whose ln1 came out of the
        // previous block's fused residual + layernorm: the same bits, as -r 2 relies on too)
        layernorm_forward(b.ln1, b.ln1_mean, b.ln1_rstd, b.residual, w.ln1w, w.ln1b, (int)N, C, stream);
        block_forward_to_fc(model, w, b, B, T);
    } else if (model->recompute >= 2) {  // ln2 before the GELU: with -ge 1 that is recomputed from it
        layernorm_forward(b.ln1, b.ln1_mean, b.ln1_rstd, b.residual, w.ln1w, w.ln1b, (int)N, C, stream);
        layernorm_forward(b.ln2, b.ln2_mean, b.ln2_rstd, b.residual2, w.ln2w, w.ln2b, (int)N, C, stream);
    }
    if (model->recompute >= 3) {
        // done above
    } else if (model->recompute >= 1 && model->gelu_fusion) {
        // The forward's GELU came out of cuBLASLt's epilogue, applied to the fp32 accumulator before rounding;
        // gelu_forward on the stored bf16 fch can differ by one bf16 ulp. So the fc matmul is run again, the same
        // call on the same inputs and equally aligned pointers (layer_strides): the same algorithm, the same bits.
        // Its pre-GELU aux output (the same bits as fch) lands in dfch, free until the fcproj backward below
        // overwrites it. Cost: one more (B·T, C)x(C, 4C) matmul a layer, about 11% of a step's flops.
        matmul_forward(b.fch_gelu, a.dfch, sp_gather(model, b.ln2, sq, C), w.fcw, w.fcb, (int)BT, C, 4 * Cl, stream);
    } else if (model->recompute >= 1) {
        gelu_forward(b.fch_gelu, b.fch, BT * 4 * Cl, stream);
    }
}

// One block's backward: from d(loss)/d(its output) in acts.dresidual to d(loss)/d(its input), in place,
// and the block's parameter gradients added into gl. The matmuls run column- or row-parallel under -tp
// (sp_gather/sp_sum: with -sq 1 each process's rows, gathered before a matmul, reduce-scattered after).
void block_backward(GPT2* model, const BlockParams& w, const BlockGrads& gl, const BlockActs& b, int B, int T) {
    int tp = model->layout.tp, C = model->config.channels, Cl = C / tp, NH = model->config.num_heads / tp;
    size_t BT = (size_t)B * T;
    SequenceShard sq = gpt2_sequence_shard(model, BT);
    const size_t N = sq.rows;
    const ActivationTensors& a = model->acts;
    float* reduce = a.reduce_scratch;
    cudaStream_t stream = model->stream;

    // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
    const floatX* dout = sp_gather(model, a.dresidual, sq, C);  // every row's (a.dresidual without -sq)
    if (model->gelu_fusion) {  // dfch straight from the matmul's DGELU epilogue
        matmul_backward(a.dfch, gl.fcprojw, gl.fcprojb, reduce, dout, b.fch_gelu, w.fcprojw, b.fch, (int)BT,
                        4 * Cl, C, stream);
    } else {
        linear_backward(fp8_of(model, b, FP8_FCPROJ), a.dfch, gl.fcprojw, gl.fcprojb, reduce, dout, b.fch_gelu, w.fcprojw,
                        (int)BT, 4 * Cl, C, stream);
    }
    // dfch, the gradient of gelu(fch) (of fch itself with -ge 1), through the GELU's backward and fc's
    linear_gelu_backward(fp8_of(model, b, FP8_FC), a.dln, gl.fcw, gl.fcb, reduce, a.dfch, model->gelu_fusion ? nullptr : b.fch,
                         sp_gather(model, b.ln2, sq, C), w.fcw, (int)BT, C, 4 * Cl, stream);
    const floatX* dln2 = sp_sum(model, a.dln, sq, C);
    layernorm_backward(a.dresidual, gl.ln2w, gl.ln2b, reduce, dln2, b.residual2, w.ln2w, b.ln2_mean, b.ln2_rstd,
                       (int)N, C, stream);

    // attention: residual2 = residual + attproj(attention(qkv(ln1(residual))))
    dout = sp_gather(model, a.dresidual, sq, C);
    linear_backward(fp8_of(model, b, FP8_ATTPROJ), a.datty, gl.attprojw, gl.attprojb, reduce, dout, b.atty, w.attprojw,
                    (int)BT, Cl, C, stream);
    cp_attention_backward(model->cp, context_scratch(a), a.dqkv, a.datty, b.qkv, b.atty, b.att, a.attn_scratch, B, T, Cl, NH,
                          model->flash_attention, stream);
    linear_backward(fp8_of(model, b, FP8_QKV), a.dln, gl.qkvw, gl.qkvb, reduce, a.dqkv, sp_gather(model, b.ln1, sq, C),
                    w.qkvw, (int)BT, C, 3 * Cl, stream);
    const floatX* dln1 = sp_sum(model, a.dln, sq, C);
    layernorm_backward(a.dresidual, gl.ln1w, gl.ln1b, reduce, dln1, b.residual, w.ln1w, b.ln1_mean, b.ln1_rstd,
                       (int)N, C, stream);
}

// Backward pass of the current activation slot's forward (the last forward, without a pipeline), which
// must have been called with dloss > 0 (so acts.logits holds dlogits, or with -lc acts.lnf d(loss)/d(lnf)).
// Accumulates (+=) into the parameter gradients. With reduce_in_backward, each layer's
// gradients are handed to the communication stream as soon as that layer is done (llmc/parallel/grad_buckets.h),
// and the compute stream's later work waits for all of those reductions. With -z 2 and 3 every
// micro-step is reduced so, from packed buffers into this process's gradient shard (llmc/parallel/zero_device.cuh).
void gpt2_backward(GPT2* model, int B, int T) {
    const GPT2Config& cfg = model->config;
    // -tp: the input gradient of a column-parallel matmul (qkv, fc, the LM head) is one term of a sum
    // over the processes
    int tp = model->layout.tp, L = cfg.num_layers, C = cfg.channels;
    const ParameterTensors& g = model->grads;
    const ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;
    const bool packed = model->packed_grads;  // -z 2, 3 (with two or more data-parallel processes: layout.h)
    if (packed && model->head_chunks == 0) zero_backward_begin(&model->zero);  // -lc: the forward began them
    RowPositions pos = context_parallel_positions(&model->cp, B, &T, nullptr, nullptr);  // -cp: T/cp positions
    size_t BT = (size_t)B * T;
    LayerStrides ls = layer_strides(cfg, B, T, model->recompute, model->flash_attention, tp,
                                    model->layout.sequence_parallel, model->layout.cp, model->layout.cp_mode);
    // -sq 1: dresidual, the residuals and the layernorms hold this process's N rows; d(residual) is
    // gathered for each row-parallel matmul's backward, the layernorm outputs for the weight gradients
    // of the matmuls after them, and each column-parallel input gradient is reduce-scattered (sp_sum)
    SequenceShard sq = gpt2_sequence_shard(model, BT);
    const size_t N = sq.rows;
    float* reduce = a.reduce_scratch;

    // logits -> lnf -> the residual stream
    zero_gather_pass_begin(&model->zero, L - 1);  // -z 3: block L-1 (the outer tensors are still the forward's)
    if (model->last_stage()) {
        const floatX* dlnf = sp_sum(model, gpt2_head_backward(model, BT), sq, C);  // llmc/gpt2_head.cuh
        cudaCheck(cudaMemsetAsync(a.dresidual, 0, N * C * sizeof(floatX), stream));
        const floatX* final_residual = a.residual3 + (L - 1) * ls.residual3;
        layernorm_backward(a.dresidual, g.lnfw, g.lnfb, reduce, dlnf, final_residual, model->params.lnfw, a.lnf_mean,
                           a.lnf_rstd, (int)N, C, stream);
    } else {  // a pipeline stage before the last: d(loss)/d(its output), received from the next stage
        cudaCheck(cudaMemcpyAsync(a.dresidual, model->pipe_grad_in, N * C * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  stream));
    }

    for (int l = L - 1; l >= 0; l--) {
        zero_gather_prefetch(&model->zero, l - 1);
        BlockParams w = block_params(model, l, l < L - 1);
        BlockGrads gl = packed ? packed_block(zero_block_grads(&model->zero, l), model) : block_tensors<floatX>(g, l, C, model->layout.tp);
        BlockActs b = block_acts(a, ls, l);

        block_recompute(model, w, b, B, T);
        block_backward(model, w, gl, b, B, T);
        // the block's gradients are complete: hand them to the data-parallel reduction
        if (packed) {
            zero_reduce_bucket(&model->zero, l);
        } else if (model->reduce_in_backward) {
            reduce_gradient_bucket(model->layout.dp_group, model->grads_memory, COMM_FLOATX, model->grad_buckets[l]);
        }
    }
    // a stage after the first sends a.dresidual, d(loss)/d(its input), to the previous stage
    // (-sq 1: the embedding's gradients need every row's)
    if (model->first_stage()) {
        encoder_backward(g.wte, g.wpe, sp_gather(model, a.dresidual, sq, C), *model->buckets, B, T, C, stream, pos);
    }
    if (packed) {
        zero_reduce_bucket(&model->zero, L);
    } else if (model->reduce_in_backward) {
        reduce_gradient_bucket(model->layout.dp_group, model->grads_memory, COMM_FLOATX, model->grad_buckets[L]);
        comm_join(model->layout.dp_group);
    }
}

// L2 norm of all parameter gradients together (deterministic order); waits for the GPU. With -z 1..3
// each process holds the reduced gradient of its shard only: it sums the squares over its shard (padding
// included, which is zero) and the processes add their sums. Under tensor or pipeline parallelism each
// tensor is counted once (llmc/parallel/grad_completion.h: gradient_norm_ranges); the ranges' sums are
// added on the host in order, then over the groups.
double gpt2_grad_norm(GPT2* model) {
    const ParallelLayout& lay = model->layout;
    size_t begin = 0, end = model->num_parameters;  // of the flat vector
    if (lay.zero_stage >= 1) {
        begin = shard_first(model->shard);
        end = begin + model->shard.shard_size;
    }
    float* sums = model->acts.grad_norm_sq;
    size_t held_begin, held_end;  // -z 2, 3: the gradient array is the shard
    held_gradient_range(model, &held_begin, &held_end);
    if (lay.tp == 1 && lay.pp == 1) {
        sum_of_squares(sums, model->acts.reduce_scratch, model->grads_memory + (begin - held_begin), end - begin,
                       model->stream);
        if (lay.zero_stage >= 1) {
            all_reduce_sum(lay.dp_group, sums, 1);
            comm_join(lay.dp_group);
        }
        cudaCheck(cudaMemcpyAsync(model->host_norm_sq, sums, sizeof(float), cudaMemcpyDeviceToHost, model->stream));
        gpt2_sync(model, "the gradient norm");
        return std::sqrt((double)model->host_norm_sq[0]);
    }
    std::vector<std::pair<size_t, size_t>> ranges =
        gradient_norm_ranges(lay, model->param_offsets, model->param_sizes, begin, end);
    cudaCheck(cudaMemsetAsync(sums, 0, NUM_PARAMETER_TENSORS * sizeof(float), model->stream));
    for (size_t k = 0; k < ranges.size(); k++) {
        sum_of_squares(sums + k, model->acts.reduce_scratch, model->grads_memory + (ranges[k].first - held_begin),
                       ranges[k].second - ranges[k].first, model->stream);
    }
    cudaCheck(cudaMemcpyAsync(model->host_norm_sq, sums, NUM_PARAMETER_TENSORS * sizeof(float), cudaMemcpyDeviceToHost,
                              model->stream));
    gpt2_sync(model, "the gradient norm");
    double sum_sq = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) sum_sq += model->host_norm_sq[i];
    return gradient_norm(lay, sum_sq);
}

// One AdamW update (t = number of this update, from 1) of parameters [opt_begin, opt_end), per tensor
// so weight decay reaches only the 2-D tensors. grad_scale is the clipping factor. With
// skip_muon_matrices, the block matrices are left to Muon.
void gpt2_update_adamw(GPT2* model, float learning_rate, float weight_decay, float grad_scale, int t,
                       bool skip_muon_matrices = false) {
    std::vector<OffloadPart> parts;   // -oo 1: the tensors' parts, updated on the host after the loop
    std::vector<AdamWTensor> tensors;  // else: on the device, in one launch (llmc/adamw.cuh)
    AdamWSettings common{};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (skip_muon_matrices && muon_param_is_matrix(i)) continue;
        size_t off = model->param_offsets[i];
        size_t begin = std::max(off, model->opt_begin);
        size_t end = std::min(off + model->param_sizes[i], model->opt_end);
        if (begin >= end) continue;
        size_t opt_index = begin - model->opt_begin;
        AdamWSettings s = adamw_settings(learning_rate, param_tensor_is_decayed(i) ? weight_decay : 0.0f, grad_scale, t,
                                         rounding_seed(t, i, model->tensor_origin[i] + begin - off));
        const floatX* grads = grad_at(model, begin);
        floatX* params = param_at(model, begin);
        common = s;
        if (model->offload) {
            parts.push_back({opt_index, opt_index + (end - begin), s});
            continue;
        }
        tensors.push_back({params, model->master_memory ? model->master_memory + opt_index : nullptr, grads,
                           model->m_memory + opt_index, model->v_memory + opt_index, end - begin, s.weight_decay, s.seed});
    }
    adamw_update_many(tensors, common, model->stream);
    if (model->offload) {  // the range [opt_begin, opt_end) is contiguous in the device arrays too
        offload_adamw_step(&model->offloaded, parts, param_at(model, model->opt_begin), grad_at(model, model->opt_begin),
                           model->m_memory, model->v_memory, model->master_memory, model->stream);
    }
}

// One Muon update: AdamW on the tensors that are not block matrices, then Muon's step over the layout
// (llmc/parallel/muon_step.h) with this trainer's kernels (llmc/muon.cuh) and device copies.
void gpt2_update_muon(GPT2* model, const OptimizerStep& s) {
    MuonHyper hyper;
    gpt2_update_adamw(model, s.lr, s.weight_decay, s.grad_scale, s.t, true);
    cudaStream_t stream = model->stream;
    size_t shard_start = shard_first(model->shard);  // -z 2, 3: element 0 of the gradient (-z 3: parameter) array
    MuonOps<floatX> ops;
    ops.type = COMM_FLOATX;
    ops.grads = model->grads_memory;
    ops.grads_base = model->packed_grads ? shard_start : 0;
    ops.whole = model->muon_whole;
    ops.gathered = model->muon_gathered;
    ops.momentum = [&](size_t begin, size_t end) {
        muon_momentum(ops.grads + (begin - ops.grads_base), model->m_memory + (begin - model->opt_begin), end - begin,
                      hyper, s.grad_scale, stream);
    };
    ops.orthogonalize = [&](floatX* matrix, size_t rows, size_t cols) {
        muon_orthogonalize(matrix, (int)rows, (int)cols, hyper, &model->muon_scratch, stream);
    };
    ops.apply = [&](const OptimizerTensor& t, size_t begin, size_t end, const floatX* update) {
        size_t opt_index = begin - model->opt_begin;
        muon_apply(param_at(model, begin),
                   model->master_memory ? model->master_memory + opt_index : nullptr, update, end - begin, s.muon_lr,
                   s.weight_decay, (float)(s.muon_lr * muon_lr_ratio(t.rows, t.cols)),
                   rounding_seed(s.t, t.param, begin - model->param_offsets[t.param]), stream);
    };
    ops.copy2d = [&](floatX* dst, size_t dpitch, const floatX* src, size_t spitch, size_t width, size_t height) {
        size_t x = sizeof(floatX);
        cudaCheck(cudaMemcpy2DAsync(dst, std::max(dpitch, width) * x, src, std::max(spitch, width) * x, width * x, height,
                                    cudaMemcpyDeviceToDevice, stream));
    };
    muon_step(model->optimizer, model->layout, model->shard, muon_place_of(*model), ops);
}

// One Adafactor update (llmc/adafactor.cuh) of every tensor, each layer's its own: factored for the 2-D
// ones (which -c decays), per element for the vectors. Every process holds the whole (small) state and
// the whole reduced gradient (-z 1: the reduce-scatter's shards all-gathered first, the bytes of the
// parameters' all-gather it replaces; llmc/parallel/matrix_owners.h), so all compute the same bits and
// no parameters are gathered afterwards. The scratch is the gradient norm's, done with by now.
void gpt2_update_adafactor(GPT2* model, const OptimizerStep& s) {
    zero_gather_reduced_gradient(model->layout, model->grads_memory, model->shard.shard_size, COMM_FLOATX);
    AdafactorScratch scratch{model->acts.grad_norm_sq, model->acts.reduce_scratch};
    for (const OptimizerTensor& t : model->optimizer.tensors) {
        uint32_t seed = rounding_seed(s.t, t.param, model->tensor_origin[t.param] + t.offset - model->param_offsets[t.param]);
        adafactor_update(model->params_memory + t.offset, model->grads_memory + t.offset, model->v_memory + t.state_offset,
                         (int)t.rows, (int)t.cols, s.lr, t.is_matrix() ? s.weight_decay : 0.0f, s.grad_scale, s.t, seed,
                         scratch, model->stream);
    }
}

// One 8-bit AdamW update (llmc/adamw8.cuh) of parameters [opt_begin, opt_end): no master weights, one
// rounding seed per update (the flat index makes each element's bits), the cut blocks' exchange under ZeRO.
void gpt2_update_adamw8(GPT2* model, const OptimizerStep& s) {
    AdamWSettings settings = adamw_settings(s.lr, s.weight_decay, s.grad_scale, s.t, rounding_seed(s.t, 0, 0));
    adamw8_gpu_step(&model->adamw8, param_at(model, model->opt_begin), grad_at(model, model->opt_begin), settings,
                    model->layout, model->shard, [model](const char* what) { gpt2_sync(model, what); }, model->stream);
}

// One optimizer update of the step (-opt). With -z 1 and 2, the updated shards are then all-gathered, so
// every process has all the new parameters.
void gpt2_update(GPT2* model, const OptimizerStep& s) {
    switch (model->optimizer.kind) {
        case OPT_MUON: gpt2_update_muon(model, s); break;
        case OPT_ADAFACTOR: gpt2_update_adafactor(model, s); break;
        case OPT_ADAMW8: gpt2_update_adamw8(model, s); break;
        default: gpt2_update_adamw(model, s.lr, s.weight_decay, s.grad_scale, s.t); break;
    }
    model->zero.outer_gathered = false;  // -z 3: the next pass gathers the new values
    if (model->optimizer.kind != OPT_ADAFACTOR) {  // Adafactor updated every parameter on every process
        zero_gather_updated_parameters(model->layout, model->params_memory, model->shard.shard_size, COMM_FLOATX);
    }
}

// ----------------------------------------------------------------------------
// The training run

// One sample (llmc/run/sample_text.h has the loop and the settings, shared with the CPU trainer): the
// logits of the window's last position, fetched from the device and widened to fp32.
void generate_sample(GPT2* model, const SampleSettings& settings, uint64_t* rng, const TokenizerFile* tok) {
    int Vp = model->config.padded_vocab_size;
    std::vector<floatX> raw(Vp);
    std::vector<float> logits(Vp);
    generate_sample(settings, model->config.vocab_size, rng, tok, [&](const int* window, int length) {
        gpt2_forward(model, window, nullptr, 1, length);
        size_t row = (size_t)(length - 1) - model->logits_first_row;  // -lc: the logits start at a later row
        cudaCheck(cudaMemcpyAsync(raw.data(), model->acts.logits + row * Vp, Vp * sizeof(floatX),
                                  cudaMemcpyDeviceToHost, model->stream));
        cudaCheck(cudaStreamSynchronize(model->stream));
        for (int v = 0; v < Vp; v++) logits[v] = host_from_floatX(raw[v]);
        return (const float*)logits.data();
    });
}

// HellaSwag accuracy (llmc/run/hellaswag.h) in batches of the training shape (B rows of T tokens): the
// activations are allocated for exactly that, so T must hold the longest context + ending.
HellaSwagResult hellaswag_eval(GPT2* model, const HellaSwagSet& set, const TrainArgs& args) {
    if (set.longest_row > model->seq_len) {
        fatal("HellaSwag: the longest example needs %d tokens; run with -t %d or more", set.longest_row, set.longest_row);
    }
    return hellaswag_evaluate_group(model->layout.dp_group, set, args.hellaswag_examples, model->batch_size, model->seq_len,
        [&](const int* inputs, const int* targets, int rows, int cols, float* losses) {
            gpt2_forward(model, inputs, targets, rows, cols);
            size_t n = (size_t)rows * cols;
            cudaCheck(cudaMemcpyAsync(model->host_losses, model->acts.losses, n * sizeof(float),
                                      cudaMemcpyDeviceToHost, model->stream));
            gpt2_sync(model, "the HellaSwag losses");
            std::copy(model->host_losses, model->host_losses + n, losses);
        });
}

// ----------------------------------------------------------------------------
// Checkpoints (llmc/run/checkpoint_state.h decides who writes what across the layout)

// The model's state as a checkpoint reads it: the parameters widened to fp32 (-z 3: gathered, every
// process taking part), the optimizer's vectors copied out of the device (or, -oo 1, pinned host memory).
CheckpointModel gpt2_checkpoint_model(GPT2* model) {
    CheckpointModel c = checkpoint_model_of(*model);
    c.has_master = model->master_memory != nullptr;
    c.model_version = MODEL_VERSION_NATIVE;
    c.parameters_collective = model->sharded_params;
    c.parameters = [model] { return gpt2_download_parameters(model); };
    c.optimizer_vector = [model](CheckpointVector which) {
        size_t n = model->optimizer.kind == OPT_ADAFACTOR ? adafactor_state_size(model->optimizer.tensors)
                                                          : model->opt_end - model->opt_begin;
        const float* src = which == CKPT_M ? model->m_memory : which == CKPT_V ? model->v_memory : model->master_memory;
        std::vector<float> host(n);
        cudaCheck(cudaMemcpy(host.data(), src, n * sizeof(float), cudaMemcpyDefault));
        return host;
    };
    c.optimizer_parameters = [model] {  // -w 0 (the bf16 parameters widened); -z 3 gathers them on every process
        std::vector<float> all = gpt2_download_parameters(model);
        return std::vector<float>(all.begin() + model->opt_begin, all.begin() + model->opt_end);
    };
    c.moments8 = [model] { return adamw8_gpu_download(model->adamw8); };
    c.own_kinds = model->local.scheme.every ? std::vector<int32_t>{STATE_SECTION_LOCAL_STEPS}
                                            : grad_compression_own_kinds(model->compression.host);
    c.own_sections = [model] {  // -lh: its replica, anchor and momentum; -gc: its residuals (and Q); -fp8: the scales
        std::vector<StateSection> s = grad_compression_gpu_sections(model->compression);
        if (model->local.scheme.every) s = {local_steps_gpu_section(model->local, gpt2_download_parameters(model))};
        if (model->fp8.on) s.push_back(fp8_training_section(model->fp8));  // the same on every process
        if (matmul_algorithms.autotune) s.push_back(matmul_choices_section());  // -at 1: the algorithms it took
        return s;
    };
    c.staging = device_staging(model->stream, [model](const char* what) { gpt2_sync(model, what); });
    return c;
}

// Restores this process's optimizer state, step and data position from checkpoint run->resume_step,
// whatever layout or trainer wrote it. The master weights come from the state file when it has them
// (ours with -w 1); otherwise they stay as loaded from the model file (a CPU trainer's checkpoint, whose
// model file is fp32).
void gpt2_resume(GPT2* model, TrainRun* run) {
    TrainState state = checkpoint_restore_state(gpt2_checkpoint_model(model), run);
    fp8_training_restore(&model->fp8, state.sections);
    if (matmul_algorithms.autotune) matmul_choices_restore(state.sections);
    if (model->compression.on()) grad_compression_gpu_restore(&model->compression, state.sections);
    if (model->optimizer.kind == OPT_ADAFACTOR) {
        size_t length = adafactor_state_size(model->optimizer.tensors);
        cudaCheck(cudaMemcpy(model->v_memory, state.v.data(), length * sizeof(float), cudaMemcpyHostToDevice));
        return;
    }
    if (model->optimizer.kind == OPT_ADAMW8) {  // no master weights: the parameters came from the model file
        adamw8_gpu_upload(&model->adamw8, state.moments8);
        return;
    }
    size_t opt_n = model->opt_end - model->opt_begin;
    cudaCheck(cudaMemcpy(model->m_memory, state.m.data(), opt_n * sizeof(float), cudaMemcpyDefault));
    cudaCheck(cudaMemcpy(model->v_memory, state.v.data(), opt_n * sizeof(float), cudaMemcpyDefault));
    if (model->master_memory && !state.master.empty()) {
        cudaCheck(cudaMemcpy(model->master_memory, state.master.data(), opt_n * sizeof(float), cudaMemcpyDefault));
    }
    std::vector<float> replica;  // -lh: this process's own parameters (its master weights came with m and v)
    if (model->local.scheme.every) local_steps_gpu_restore(&model->local, state.sections, gpt2_fp32_weights(model), &replica);
    if (!replica.empty()) gpt2_upload_parameters(model, replica, false);
}

// ----------------------------------------------------------------------------
// Pipeline parallelism (-pp, llmc/parallel/pipeline.h): this process runs one stage's layers over the
// step's micro-batches in the order of the schedule (-pm), receiving the (B, T, C) residual stream from
// the previous stage and d(loss)/d(output) from the next over NCCL, in the build's floatX.

// The model's side of a pipeline schedule over micro-batches of (B, T) tokens, micro-batch i at
// inputs + i * B * T (and targets likewise): each in its own activation slot; with dloss > 0 the
// forward also leaves the last stage's dlogits (INFINITY for bad_micro: -ni, testing). The output sent
// on is the micro-batch's own residual3; the gradient sent back is the backward's scratch dresidual,
// which the next exchange sends before any later backward writes it (and a received gradient lands in
// pipe_grad_in, never in the buffer being sent).
PipelineStageHooks gpt2_pipeline_hooks(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss,
                                       int bad_micro) {
    size_t BT = (size_t)B * T, L = model->config.num_layers;
    const ParallelLayout& lay = model->layout;
    LayerStrides ls = layer_strides(model->config, B, T / lay.cp, model->recompute, model->flash_attention, lay.tp,
                                    lay.sequence_parallel, lay.cp, lay.cp_mode);  // -cp: its T/cp positions of each row
    PipelineStageHooks h;  // a stage's input and output: its rows of the residual stream (B·T without -sq)
    h.boundary_elements = sp_rows_per_rank(BT / lay.cp, lay.tp, lay.sequence_parallel) * model->config.channels;
    h.select = [=](int micro) { gpt2_use_activation_slot(model, micro % model->act_slots); };
    h.forward = [=](int micro) {
        float d = dloss > 0.0f && micro == bad_micro ? INFINITY : dloss;
        gpt2_forward(model, inputs + micro * BT, targets + micro * BT, B, T, d);
        return model->last_stage() ? (double)gpt2_mean_loss(model, B, T) : 0.0;
    };
    h.backward = [=](int) { gpt2_backward(model, B, T); };
    h.activation_in = [=] { return (void*)model->acts.encoded; };
    h.activation_out = [=] { return (void*)(model->acts.residual3 + (L - 1) * ls.residual3); };
    h.gradient_in = [=] { return (void*)model->pipe_grad_in; };
    h.gradient_out = [=] { return (void*)model->acts.dresidual; };
    return h;
}

// The gradients of a step under tensor or pipeline parallelism, made complete
// (llmc/parallel/grad_completion.h: tp rank 0's replicated tensors, the stages' shared ones summed), then
// the sum over the data-parallel replicas (-z 0 all-reduce, -z 1 to the shards' owners), bucket by bucket
// as llmc/parallel/grad_buckets.h cuts them. With pipeline stages all of it after the step's last
// backward, not during it: the stage sum must come first, as -z 1's shards of stages of different sizes
// do not line up. With tensor parallelism alone the data-parallel sum runs during the last backward
// (reduced_in_backward; gpt2_forward_backward) and the tp broadcast after it: broadcasting tp rank 0's
// sum over the replicas gives every rank the same bits as summing tp rank 0's broadcast values (the
// layernorms' -sq sums are then taken in the other order).
void gpt2_model_parallel_reduce_gradients(GPT2* model, bool reduced_in_backward = false) {
    const ProcessGroup& dp = model->layout.dp_group;
    floatX* g = model->grads_memory;
    size_t held_begin, held_end;  // -z 2, 3: the shard (its replicated parts match its tp peers' shards)
    held_gradient_range(model, &held_begin, &held_end);
    complete_model_parallel_gradients(model->layout, g, held_begin, held_end, model->param_offsets, model->param_sizes,
                                      COMM_FLOATX);
    // -z 2, 3: each micro-step's gradients were reduced into the shards during its backward
    if (!comm_active(dp) || model->packed_grads || reduced_in_backward) return;
    for (const std::vector<GradSlice>& bucket : model->grad_buckets) reduce_gradient_bucket(dp, g, COMM_FLOATX, bucket);
    comm_join(dp);
}

// A pipeline step's forwards and backwards through the schedule (timed by the host as the forward
// phase, as the forwards and backwards interleave); *note gets the measured bubble.
double gpt2_pipeline_forward_backward(GPT2* model, PipelineComm* pipe, const std::string& schedule,
                                      const StepBatches& b, float dloss, int bad_micro, PhaseTimer* timer,
                                      std::string* note) {
    phase_begin(timer, PHASE_FORWARD);
    PipelineStepResult r = pipeline_run(pipe, schedule, b.count,
                                        gpt2_pipeline_hooks(model, b.inputs.data(), b.targets.data(), b.B, b.T, dloss, bad_micro));
    gpt2_model_parallel_reduce_gradients(model);
    gpt2_sync(model, "the pipeline's gradient reductions");
    phase_end(timer);
    timer->times.interleaved = true;
    *note = r.note;
    return r.loss_sum;
}

// A step's forwards and backwards (llmc/run/run_loop.h's forward_backward), timed on the GPU by events.
// The last micro-batch completes the gradients: with several GPUs each layer's are reduced over the
// data-parallel group while the backward goes on (and the backward's time includes the wait for the
// last bucket); with -tp the tensor-parallel group's sums and broadcasts follow.
double gpt2_forward_backward(GPT2* model, const StepBatches& b, float dloss, int bad_micro, GpuPhases* phases,
                             PhaseTimer* timer) {
    double loss_sum = 0.0;
    bool tensor_parallel = model->layout.tp > 1;  // its reductions follow the last backward
    for (int micro = 0; micro < b.count; micro++) {
        model->reduce_in_backward = comm_active(model->layout.dp_group) && micro == b.count - 1 && model->reduces_in_buckets();
        gpu_phase_begin(phases, PHASE_FORWARD, model->stream);
        gpt2_forward(model, b.inputs_of(micro), b.targets_of(micro), b.B, b.T, micro == bad_micro ? INFINITY : dloss);
        gpu_phase_end(phases, PHASE_FORWARD, model->stream);
        gpu_phase_begin(phases, PHASE_BACKWARD, model->stream);
        gpt2_backward(model, b.B, b.T);
        gpu_phase_end(phases, PHASE_BACKWARD, model->stream);
        if (tensor_parallel && micro == b.count - 1) gpt2_model_parallel_reduce_gradients(model, model->reduce_in_backward);
        loss_sum += gpt2_mean_loss(model, b.B, b.T);  // waits for the stream: the events are done
        gpu_phases_collect(phases, &timer->times);
    }
    model->reduce_in_backward = false;
    return loss_sum;
}

// The run loop's hooks (llmc/run/run_loop.h) for this model on this process. pipe and note live as long
// as the hooks: a pipeline's transfers and the last step's measured bubble.
RunHooks gpt2_run_hooks(GPT2* model, const TrainArgs& args, GpuPhases* phases, PipelineComm* pipe, std::string* note) {
    const ProcessGroup& dp = model->layout.dp_group;
    std::string schedule = args.pipeline_schedule;
    bool pipeline = model->layout.pp > 1;
    RunHooks h;
    h.zero_grad = [=] {
        gpt2_sync(model, "the previous step");
        gpt2_zero_grad(model);
    };
    h.forward_backward = [=](const StepBatches& b, float dloss, int bad_micro, PhaseTimer* timer) {
        if (pipeline) return gpt2_pipeline_forward_backward(model, pipe, schedule, b, dloss, bad_micro, timer, note);
        return gpt2_forward_backward(model, b, dloss, bad_micro, phases, timer);
    };
    // the global gradient norm (with several GPUs the gradients were reduced during the backward)
    h.grad_norm = [=] { return gpt2_grad_norm(model); };  // the gradients were reduced during the backward
    if (model->compression.on()) {  // or -gc's reduction after it
        auto sync = [model](const char* what) { gpt2_sync(model, what); };
        h.complete_gradients = [=](float S) {
            grad_compression_gpu_reduce(dp, &model->compression, model->grads_memory, model->stream, sync, S);
        };
    }
    h.update = [=](bool apply, const OptimizerStep& s) {
        if (apply) gpt2_update(model, s);
        fp8_step_end(&model->fp8, model->layout.world, model->stream);  // -fp8: the next step's scales
        floatX* rounded = model->master_memory ? model->params_memory : nullptr;  // -lh: the floatX copy of the weights
        local_steps_gpu_after_update(dp, &model->local, s.step, s.last, gpt2_fp32_weights(model), rounded, model->grads_memory,
                                     COMM_FLOATX, model->stream);
        gpt2_sync(model, "the parameter update");
    };
    h.eval_loss = [=](const int* inputs, const int* targets, int B, int T) {
        if (pipeline) return pipeline_forward_only(pipe, gpt2_pipeline_hooks(model, inputs, targets, B, T, 0.0f, -1));
        gpt2_forward(model, inputs, targets, B, T);
        return (double)gpt2_mean_loss(model, B, T);
    };
    h.hellaswag = [=, &args](const HellaSwagSet& set) { return hellaswag_eval(model, set, args); };
    h.save_checkpoint = [=](const TrainRun& run, int step) { checkpoint_save_state(gpt2_checkpoint_model(model), run, step); };
    // -z 3: a forward gathers each block from every process, so all of them sample (the same number of
    // forwards whatever tokens they draw); only process 0's output is shown
    h.sample = [=, &dp](TrainRun* run) {
        if (dp.rank == 0 || model->sharded_params) {
            generate_sample(model, run->sample_settings, &run->sampler_rng, run_tokenizer(*run));
        }
    };
    run_hooks_sums(&h, &model->layout);  // over the replicas and stages, over the world
    h.comm_bytes = [] { return (long long)comm_bytes_moved; };
    if (pipeline) h.step_note = [=] { return *note; };
    return h;
}

#ifndef TESTING
int main(int argc, char** argv) {
    stop_signals_install();  // SIGTERM, SIGUSR1: stop at a step boundary, even one still to come (stop_signal.h)
    TrainArgs args;
    parse_args(argc, argv, &args, true);
    // rank, process count, GPU, and the NCCL communicator when there are (or may be) several processes
    DataParallel dp = dp_init(args.launch, &argc, &argv, std::string("train_gpt2cu (") + PRECISION_NAME + ")");
    stdout_for_process(dp.rank);
    double peak_flops = describe_device(dp, args);
    output_dir_lock_for_run(args, dp.rank);
    cublas_setup();

    // the model: from the newest complete checkpoint when resuming (-y 1), else from -e
    int resume_step = resume_step_from_args(args, dp.rank);
    GPT2 model;
    std::vector<float> initial =
        gpt2_build(&model, resume_step >= 0 ? checkpoint_model_path(args.output_dir, resume_step) : args.model, args, &dp);
    const GPT2Config& cfg = model.model_config;  // the whole model (model.config: this pipeline stage's)
    const ParallelLayout& layout = model.layout;
    print_model_summary(cfg, initial.size());
    // what all processes must agree on: the shared description, plus what only this trainer has
    char extra[64];
    snprintf(extra, sizeof(extra), "\nprecision=%s", PRECISION_NAME);
    check_same_config(layout.world, run_description(args, cfg, initial.data(), initial.size(), resume_step) + extra);
    std::vector<float>().swap(initial);
    if (args.B == BATCH_AUTO) args.B = agree_batch(&model, args);

    // the run: data of this data-parallel replica (every stage of a pipeline reads the same), schedules,
    // evaluation, sampling (llmc/run/run_loop.h)
    TrainRun run;
    train_run_init(&run, args, cfg, layout.world, layout_data_rank(layout), layout_data_size(layout), resume_step, USE_LOSS_SCALING);
    int m = run.data.grad_accum_steps;
    if (layout.tp > 1 || layout.pp > 1) printf("layout: %s\n", parallel_layout_describe(layout).c_str());
    if (layout.pp > 1) {
        printf("%s\n", pipeline_describe(layout.pp, layout.pp_rank, layout.layer_begin, layout.layer_end, cfg.num_layers,
                                         args.pipeline_schedule, m).c_str());
    }
    gpt2_allocate_activations(&model, args.B, args.T);
    print_predictions_and_memory(&model, args, m);
    if (resume_step >= 0) gpt2_resume(&model, &run);
    loss_scaler_print(run.scaler);
    run.peak_flops = peak_flops;
    // per GPU: its stage's layers, 1/tp of them
    run.flops_per_step = flops_per_token(model.config, args.T) * args.B * args.T * m / (layout.tp * layout.cp);
    // -ni (testing): the last micro-batch of rank 0, or of the first pipeline's last stage, stands for a bad one
    run.injects_bad_micro = layout.dp_rank == 0 && model.last_stage();
    // the step breakdown (llmc/run/phase_timer.h): host phases by the clock, GPU ones by events, NVTX for both
    run.timer.on_begin = nvtx_phase_begin;
    run.timer.on_end = nvtx_phase_end;
    GpuPhases gpu_phases;
    gpu_phases_create(&gpu_phases);
    PipelineComm pipe;
    pipe.pp = layout.pp_group;
    pipe.type = COMM_FLOATX;
    pipe.drain = [&model] { gpt2_sync(&model, "a pipeline stage's exchange with its neighbours"); };
    std::string note;
    int status = train_run_loop(&run, gpt2_run_hooks(&model, args, &gpu_phases, &pipe, &note));
    print_run_reports(&model);
    gpu_phases_destroy(&gpu_phases);
    gpt2_free(&model);
    cublas_teardown();
    dp_finalize(&dp);
    return status;
}
#endif
