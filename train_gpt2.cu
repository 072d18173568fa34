/*
GPT-2 training on NVIDIA GPUs in BF16 mixed precision (or fp32 with PRECISION=FP32): the same model,
flags, logs and checkpoint files as train_gpt2.cpp, with each layer's forward and backward a CUDA
kernel or a cuBLASLt call from the llmc/ .cuh headers. doc/cuda.md explains the design.
One GPU, or one process per GPU on one or many nodes with NCCL (-z 0 all-reduce, -z 1 ZeRO-1):
llmc/nccl.cuh and doc/data_parallel.md.

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
#include "llmc/args.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/gpt2_config.h"
#include "llmc/gpt2_init.h"
#include "llmc/logger.h"
#include "llmc/loss_scaler.h"
#include "llmc/output_lock.h"
#include "llmc/rand.h"
#include "llmc/hellaswag.h"
#include "llmc/sampler.h"
#include "llmc/schedulers.h"
#include "llmc/tokenizer_file.h"
#include "llmc/train_common.h"
#include "llmc/utils.h"

#include "llmc/cuda_common.cuh"
#include "llmc/adamw.cuh"
#include "llmc/attention.cuh"
#include "llmc/classifier.cuh"
#include "llmc/encoder.cuh"
#include "llmc/gelu.cuh"
#include "llmc/layernorm.cuh"
#include "llmc/matmul.cuh"
#include "llmc/nccl.cuh"
#include "llmc/phase_events.cuh"

#if defined(ENABLE_FP32)
constexpr int MODEL_VERSION_NATIVE = MODEL_VERSION_FP32;
#elif defined(ENABLE_FP16)
constexpr int MODEL_VERSION_NATIVE = MODEL_VERSION_FP32;  // llm.c's format has no fp16 version; fp16 widens exactly
#else
constexpr int MODEL_VERSION_NATIVE = MODEL_VERSION_BF16;
#endif

// Dynamic loss scaling (llmc/loss_scaler.h) in the FP16 build only: bf16 has fp32's exponent range,
// so its gradients do not underflow, and fp32 needs nothing.
#if defined(ENABLE_FP16)
constexpr bool USE_LOSS_SCALING = true;
#else
constexpr bool USE_LOSS_SCALING = false;
#endif

// ----------------------------------------------------------------------------
// Parameters: 16 tensors in checkpoint order, pointers into one device allocation.

using ParameterTensors = ParameterTensorsOf<floatX>;  // llmc/gpt2_config.h

// ----------------------------------------------------------------------------
// Activations: everything the forward keeps for the backward, the backward's per-layer gradient
// buffers and all scratch, carved out of one device allocation (each piece 256-byte aligned).
// With recomputation some per-layer tensors shrink to one layer's worth that the backward refills:
//   -r 1: fch_gelu is recomputed from fch;  -r 2: also ln1 and ln2 from the residual stream;
//   -r 3: every block tensor but residual3 (the next block's input): the backward reruns the block's
//         forward from its input first (about one more forward pass of compute).

struct ActivationTensors {
    floatX* encoded;     // (B, T, C)
    floatX* ln1;         // (L, B, T, C), or (B, T, C) with -r 2
    float* ln1_mean;     // (L, B, T)
    float* ln1_rstd;     // (L, B, T)
    floatX* qkv;         // (L, B, T, 3C); with -r 3 this and the others below but residual3: 1 layer
    floatX* atty;        // (L, B, T, C)
    floatX* att;         // (L, attention_saved_elements): flash's lse (B, NH, T) fp32, or (B, NH, T, T)
    floatX* residual2;   // (L, B, T, C)
    floatX* ln2;         // (L, B, T, C), or (B, T, C) with -r 2
    float* ln2_mean;     // (L, B, T)
    float* ln2_rstd;     // (L, B, T)
    floatX* fch;         // (L, B, T, 4C) before GELU
    floatX* fch_gelu;    // (L, B, T, 4C), or (B, T, 4C) with -r 1 or 2
    floatX* residual3;   // (L, B, T, C)
    floatX* lnf;         // (B, T, C)
    float* lnf_mean;     // (B, T)
    float* lnf_rstd;     // (B, T)
    floatX* logits;      // (B, T, Vp); the classifier overwrites it with dlogits when training
    float* losses;       // (B, T)
    // scratch, reused by every layer
    floatX* proj;        // (B, T, C) output of attproj or fcproj before the residual add
    floatX* attn_scratch;// attention_scratch_elements
    floatX* dresidual;   // (B, T, C) gradient flowing down the residual stream
    floatX* dln;         // (B, T, C) gradient of a layernorm output
    floatX* datty;       // (B, T, C)
    floatX* dqkv;        // (B, T, 3C)
    floatX* dfch;        // (B, T, 4C)
    float* reduce_scratch;  // partial sums of dbias/dweight/grad norm
    float* grad_norm_sq;    // (1)
    int* inputs;         // (B, T)
    int* targets;        // (B, T)
    int* encoder_buckets;// encoder_buckets_ints(B, T)
};

// Per-layer steps, in elements, through the (L, ...) activation tensors for a pass over (B, T). Each
// layer's slice starts on 256 bytes, like the one-layer buffers that recomputation uses instead: cuBLASLt
// is told each pointer's real alignment (matmul.cuh), so equal alignment means the same algorithm for a
// layer's matmuls at every -r level, which -r 0/1/2 giving the same bits relies on. 0 for a tensor
// that recomputation keeps for one layer only.
struct LayerStrides {
    size_t ln;        // ln1, ln2
    size_t qkv, atty, att, residual2, residual3;
    size_t fch, fch_gelu;
};

inline size_t aligned_elements(size_t count) { return align_up_256(count * sizeof(floatX)) / sizeof(floatX); }

LayerStrides layer_strides(const GPT2Config& cfg, int B, int T, int recompute, bool flash) {
    size_t C = cfg.channels, BT = (size_t)B * T;
    LayerStrides s;
    bool block = recompute >= 3;  // the whole block is recomputed: one layer of everything but residual3
    s.ln = recompute >= 2 ? 0 : aligned_elements(BT * C);
    s.qkv = block ? 0 : aligned_elements(BT * 3 * C);
    s.atty = block ? 0 : aligned_elements(BT * C);
    s.att = block ? 0 : aligned_elements(attention_saved_elements(B, T, cfg.num_heads, flash));
    s.residual2 = block ? 0 : aligned_elements(BT * C);
    s.residual3 = aligned_elements(BT * C);
    s.fch = block ? 0 : aligned_elements(BT * 4 * C);
    s.fch_gelu = recompute >= 1 ? 0 : aligned_elements(BT * 4 * C);
    return s;
}

// Lays out the activations for (B, T), recompute level and attention path; with base == nullptr only
// counts bytes.
size_t layout_activations(ActivationTensors* a, char* base, const GPT2Config& cfg, int B, int T, int recompute,
                          bool flash) {
    size_t L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, Vp = cfg.padded_vocab_size;
    size_t BT = (size_t)B * T;
    LayerStrides all = layer_strides(cfg, B, T, 0, flash);  // a kept tensor holds L of these
    size_t L_block = recompute >= 3 ? 1 : L, L_ln = recompute >= 2 ? 1 : L, L_gelu = recompute >= 1 ? 1 : L;
    size_t reduce_floats = std::max({layernorm_backward_scratch_floats(C), matmul_backward_scratch_floats(4 * C),
                                     (size_t)NORM_BLOCKS});
    size_t offset = 0;
    auto take = [&](auto** ptr, size_t count) {
        using Elem = std::remove_pointer_t<std::remove_reference_t<decltype(*ptr)>>;
        *ptr = base ? reinterpret_cast<Elem*>(base + offset) : nullptr;
        offset += align_up_256(count * sizeof(Elem));
    };
    take(&a->encoded, BT * C);
    take(&a->ln1, L_ln * all.ln);
    take(&a->ln1_mean, L * BT);
    take(&a->ln1_rstd, L * BT);
    take(&a->qkv, L_block * all.qkv);
    take(&a->atty, L_block * all.atty);
    take(&a->att, L_block * all.att);
    take(&a->residual2, L_block * all.residual2);
    take(&a->ln2, L_ln * all.ln);
    take(&a->ln2_mean, L * BT);
    take(&a->ln2_rstd, L * BT);
    take(&a->fch, L_block * all.fch);
    take(&a->fch_gelu, L_gelu * all.fch_gelu);
    take(&a->residual3, L * all.residual3);
    take(&a->lnf, BT * C);
    take(&a->lnf_mean, BT);
    take(&a->lnf_rstd, BT);
    take(&a->logits, BT * Vp);
    take(&a->losses, BT);
    take(&a->proj, BT * C);
    take(&a->attn_scratch, attention_scratch_elements(B, T, C, NH, flash));
    take(&a->dresidual, BT * C);
    take(&a->dln, BT * C);
    take(&a->datty, BT * C);
    take(&a->dqkv, BT * 3 * C);
    take(&a->dfch, BT * 4 * C);
    take(&a->reduce_scratch, reduce_floats);
    take(&a->grad_norm_sq, 1);
    take(&a->inputs, BT);
    take(&a->targets, BT);
    take(&a->encoder_buckets, encoder_buckets_ints(B, T));
    return offset;
}

struct GPT2 {
    GPT2Config config;
    size_t num_parameters = 0;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t param_offsets[NUM_PARAMETER_TENSORS];
    floatX* params_memory = nullptr;  // one allocation: the 16 tensors
    floatX* grads_memory = nullptr;   // one allocation: their gradients
    float* opt_memory = nullptr;      // one allocation: AdamW m, v, and the master weights if kept
    float *m_memory = nullptr, *v_memory = nullptr, *master_memory = nullptr;
    ParameterTensors params, grads;
    // data parallelism (llmc/nccl.cuh, llmc/grad_buckets.h); dp is null in the tests' single models
    DataParallel* dp = nullptr;
    int zero_stage = 0;               // 1 only with an NCCL communicator
    ShardLayout shard;                // params and grads are padded to shard.padded_size
    size_t opt_begin = 0, opt_end = 0;  // the parameters this process's AdamW updates; m, v, master hold these
    std::vector<std::vector<GradSlice>> grad_buckets;
    bool reduce_in_backward = false;  // set for the last micro-step: reduce each layer's gradients as it finishes
    bool use_master_weights = false;
    int recompute = 1;
    bool gelu_fusion = false;
    bool flash_attention = true;  // -fa; always false in the fp32 build
    // activations, allocated once for the run's (B, T)
    int batch_size = 0, seq_len = 0;
    char* acts_memory = nullptr;
    ActivationTensors acts;
    EncoderBuckets buckets;
    float* host_losses = nullptr;   // (B, T), pinned: copies into it do not block the host
    float* host_norm_sq = nullptr;  // (1), pinned
    cudaStream_t stream = nullptr;
};

// Waits for the compute stream. With several processes its work can depend on theirs, so the wait
// goes through the watchdog (dp_wait), which gives up after -pt seconds instead of hanging.
void gpt2_sync(GPT2* model, const char* what) {
    if (model->dp != nullptr) {
        dp_wait(*model->dp, model->stream, what);
    } else {
        cudaCheck(cudaStreamSynchronize(model->stream));
    }
}

// Uploads fp32 host parameters (checkpoint order) to the device as floatX, and this process's part
// [opt_begin, opt_end) of them to the master weights.
void gpt2_upload_parameters(GPT2* model, const std::vector<float>& params) {
    std::vector<floatX> converted(model->num_parameters);
    for (size_t i = 0; i < model->num_parameters; i++) converted[i] = host_to_floatX(params[i]);
    cudaCheck(cudaMemcpy(model->params_memory, converted.data(), model->num_parameters * sizeof(floatX),
                         cudaMemcpyHostToDevice));
    if (model->master_memory) {
        cudaCheck(cudaMemcpy(model->master_memory, params.data() + model->opt_begin,
                             (model->opt_end - model->opt_begin) * sizeof(float), cudaMemcpyHostToDevice));
    }
}

// The device parameters as fp32 on the host (exact: bf16 widens to fp32 without rounding).
std::vector<float> gpt2_download_parameters(const GPT2* model) {
    std::vector<floatX> raw(model->num_parameters);
    cudaCheck(cudaMemcpy(raw.data(), model->params_memory, model->num_parameters * sizeof(floatX),
                         cudaMemcpyDeviceToHost));
    std::vector<float> params(model->num_parameters);
    for (size_t i = 0; i < model->num_parameters; i++) params[i] = host_from_floatX(raw[i]);
    return params;
}

// Allocates the model for cfg. With an NCCL communicator (dp), the flat parameter and gradient
// arrays are padded to whole shards (llmc/grad_buckets.h) and, with -z 1, AdamW's moments and master
// weights cover this process's shard only.
void gpt2_setup(GPT2* model, const GPT2Config& cfg, const TrainArgs& args, DataParallel* dp = nullptr) {
    validate_config(cfg, "model");
    if (cfg.channels % 8 != 0 || (cfg.channels / cfg.num_heads) % 8 != 0) {
        fatal("the CUDA trainer needs channels and head size divisible by 8 (C %d, NH %d)", cfg.channels,
              cfg.num_heads);
    }
    model->config = cfg;
    param_tensor_sizes(cfg, model->param_sizes);
    param_tensor_offsets(cfg, model->param_offsets);
    model->num_parameters = num_parameters(cfg);
#if defined(ENABLE_FP32)
    model->use_master_weights = false;  // the parameters are fp32 already
#else
    model->use_master_weights = args.master_weights != 0;
#endif
    model->recompute = args.recompute;
    model->gelu_fusion = args.gelu_fusion != 0;
    model->flash_attention = args.flash_attention != 0 && FLASH_ATTENTION_AVAILABLE;
    check_attention_shape(cfg.channels, cfg.num_heads, model->flash_attention);
    size_t n = model->num_parameters;
    bool distributed = dp != nullptr && dp->nccl;
    model->dp = dp;
    model->zero_stage = distributed ? args.zero_stage : 0;
    // shards of a multiple of 8 elements start 16 bytes apart (x128 loads); N is a multiple of C, so
    // one process's shard is exactly [0, N)
    model->shard = aligned_shard_layout(n, distributed ? dp->size : 1, distributed ? dp->rank : 0, 8);
    model->opt_begin = model->zero_stage == 1 ? model->shard.begin : 0;
    model->opt_end = model->zero_stage == 1 ? model->shard.end : n;
    if (distributed) model->grad_buckets = gradient_buckets(cfg, model->zero_stage, model->shard.shard_size);
    size_t padded = model->shard.padded_size, opt_n = model->opt_end - model->opt_begin;
    cudaCheck(cudaMalloc(&model->params_memory, padded * sizeof(floatX)));
    cudaCheck(cudaMalloc(&model->grads_memory, padded * sizeof(floatX)));
    cudaCheck(cudaMemset(model->params_memory, 0, padded * sizeof(floatX)));
    cudaCheck(cudaMemset(model->grads_memory, 0, padded * sizeof(floatX)));
    size_t opt_floats = (model->use_master_weights ? 3 : 2) * opt_n;
    cudaCheck(cudaMalloc(&model->opt_memory, std::max<size_t>(opt_floats, 1) * sizeof(float)));
    cudaCheck(cudaMemset(model->opt_memory, 0, opt_floats * sizeof(float)));
    model->m_memory = model->opt_memory;
    model->v_memory = model->opt_memory + opt_n;
    model->master_memory = model->use_master_weights ? model->opt_memory + 2 * opt_n : nullptr;
    point_parameters(&model->params, model->params_memory, cfg);
    point_parameters(&model->grads, model->grads_memory, cfg);
    cudaCheck(cudaStreamCreate(&model->stream));
    printf("parameters: %zu (%s), %.1f MiB; gradients %.1f MiB\n", n, PRECISION_NAME, n * sizeof(floatX) / 1048576.0,
           n * sizeof(floatX) / 1048576.0);
    double all_mib = (model->use_master_weights ? 3 : 2) * n * sizeof(float) / 1048576.0;
    printf("optimizer: AdamW over %zu parameters on this process (%s), m, v%s %.1f MiB per process (%.1f MiB "
           "unsharded)\n", opt_n, model->zero_stage == 1 ? "ZeRO-1 shard" : "all",
           model->use_master_weights ? " and fp32 master weights" : "", opt_floats * sizeof(float) / 1048576.0, all_mib);
}

// Builds the model from a checkpoint file, or (for a descriptor) from a random initialization;
// returns the fp32 parameters it was built from.
std::vector<float> gpt2_build(GPT2* model, const std::string& name, const TrainArgs& args, DataParallel* dp = nullptr) {
    GPT2Config cfg;
    std::vector<float> params = gpt2_parameters_from_flag(name, (unsigned)args.seed, &cfg);
    gpt2_setup(model, cfg, args, dp);
    gpt2_upload_parameters(model, params);
    return params;
}

// Bytes of activations at a recompute level and attention path (for the start-up report).
size_t activation_bytes(const GPT2Config& cfg, int B, int T, int recompute, bool flash) {
    ActivationTensors unused;
    return layout_activations(&unused, nullptr, cfg, B, T, recompute, flash);
}

void gpt2_allocate_activations(GPT2* model, int B, int T) {
    bool flash = model->flash_attention;
    size_t bytes = activation_bytes(model->config, B, T, model->recompute, flash);
    cudaCheck(cudaMalloc(&model->acts_memory, bytes));
    layout_activations(&model->acts, model->acts_memory, model->config, B, T, model->recompute, flash);
    model->buckets.device = model->acts.encoder_buckets;
    model->batch_size = B;
    model->seq_len = T;
    cudaCheck(cudaMallocHost(&model->host_losses, (size_t)B * T * sizeof(float)));
    cudaCheck(cudaMallocHost(&model->host_norm_sq, sizeof(float)));
    size_t none = activation_bytes(model->config, B, T, 0, flash);
    printf("activations: %.1f MiB for B=%d T=%d (recompute -r %d saves %.1f MiB; -r 0/1/2/3:", bytes / 1048576.0, B,
           T, model->recompute, (none - bytes) / 1048576.0);
    for (int r = 0; r <= 3; r++) printf(" %.1f", activation_bytes(model->config, B, T, r, flash) / 1048576.0);
    printf(" MiB)\n");
    if (FLASH_ATTENTION_AVAILABLE) {
        size_t with_flash = activation_bytes(model->config, B, T, model->recompute, true);
        size_t with_cublas = activation_bytes(model->config, B, T, model->recompute, false);
        printf("attention: %s; activations with flash (-fa 1) %.1f MiB, with cuBLAS + softmax (-fa 0) %.1f MiB\n",
               flash ? "flash (-fa 1)" : "cuBLAS + softmax (-fa 0)", with_flash / 1048576.0, with_cublas / 1048576.0);
    } else {
        printf("attention: cuBLAS + softmax, storing (B, NH, T, T) per layer (the fp32 build has no flash attention: "
               "it needs the bf16 tensor cores)\n");
    }
}

// ----------------------------------------------------------------------------
// forward, backward, update

// Forward pass over inputs (B, T) (host arrays). With targets, also the per-position losses (fetch their
// mean with gpt2_mean_loss); with dloss > 0 the classifier also leaves d(loss)/d(logits) in
// acts.logits, scaled by dloss, ready for gpt2_backward. Nothing here waits for the GPU.
void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss = 0.0f) {
    const GPT2Config& cfg = model->config;
    int L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    if ((size_t)B * T > (size_t)model->batch_size * model->seq_len || T > model->seq_len) {
        fatal("gpt2_forward: B=%d T=%d exceeds the allocated B=%d T=%d", B, T, model->batch_size, model->seq_len);
    }
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V))) {
            fatal("gpt2_forward: token id at position %d is outside 0..%d", i, V - 1);
        }
    }
    const ParameterTensors& p = model->params;
    const ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;
    size_t BT = (size_t)B * T;
    LayerStrides ls = layer_strides(cfg, B, T, model->recompute, model->flash_attention);

    cudaCheck(cudaMemcpyAsync(a.inputs, inputs, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets) cudaCheck(cudaMemcpyAsync(a.targets, targets, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (dloss > 0.0f) encoder_prepare_backward(&model->buckets, inputs, B, T, V, stream);

    encoder_forward(a.encoded, a.inputs, p.wte, p.wpe, B, T, C, stream);
    // layer 0's ln1; every later layernorm is fused with the residual add that precedes it
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.encoded, p.ln1w, p.ln1b, (int)BT, C, stream);
    for (int l = 0; l < L; l++) {
        const floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * ls.residual3;
        floatX* ln1 = a.ln1 + l * ls.ln;
        floatX* qkv = a.qkv + l * ls.qkv;
        floatX* atty = a.atty + l * ls.atty;
        floatX* residual2 = a.residual2 + l * ls.residual2;
        floatX* ln2 = a.ln2 + l * ls.ln;
        floatX* fch = a.fch + l * ls.fch;
        floatX* fch_gelu = a.fch_gelu + l * ls.fch_gelu;
        floatX* residual3 = a.residual3 + l * ls.residual3;

        matmul_forward(qkv, nullptr, ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, (int)BT, C, 3 * C, stream);
        attention_forward(atty, a.att + l * ls.att, qkv, a.attn_scratch, B, T, C, NH, model->flash_attention, stream);
        matmul_forward(a.proj, nullptr, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, (int)BT, C, C, stream);
        fused_residual_layernorm_forward(residual2, ln2, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, residual, a.proj,
                                         p.ln2w + l * C, p.ln2b + l * C, (int)BT, C, stream);
        if (model->gelu_fusion) {
            matmul_forward(fch_gelu, fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, (int)BT, C, 4 * C, stream);
        } else {
            matmul_forward(fch, nullptr, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, (int)BT, C, 4 * C, stream);
            gelu_forward(fch_gelu, fch, BT * 4 * C, stream);
        }
        matmul_forward(a.proj, nullptr, fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, (int)BT, 4 * C,
                       C, stream);
        if (l + 1 < L) {
            fused_residual_layernorm_forward(residual3, a.ln1 + (l + 1) * ls.ln, a.ln1_mean + (l + 1) * BT,
                                             a.ln1_rstd + (l + 1) * BT, residual2, a.proj, p.ln1w + (l + 1) * C,
                                             p.ln1b + (l + 1) * C, (int)BT, C, stream);
        } else {
            fused_residual_layernorm_forward(residual3, a.lnf, a.lnf_mean, a.lnf_rstd, residual2, a.proj, p.lnfw,
                                             p.lnfb, (int)BT, C, stream);
        }
    }
    matmul_forward(a.logits, nullptr, a.lnf, p.wte, nullptr, (int)BT, C, Vp, stream);
    if (targets) fused_classifier(a.logits, a.losses, a.targets, dloss, (int)BT, V, Vp, dloss > 0.0f, stream);
}

// Mean of the per-position losses of the last forward with targets; waits for the GPU.
float gpt2_mean_loss(GPT2* model, int B, int T) {
    size_t BT = (size_t)B * T;
    cudaCheck(cudaMemcpyAsync(model->host_losses, model->acts.losses, BT * sizeof(float), cudaMemcpyDeviceToHost,
                              model->stream));
    gpt2_sync(model, "the loss (and the gradient reduction before it)");
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += model->host_losses[i];
    return (float)(sum / BT);
}

void gpt2_zero_grad(GPT2* model) {
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, model->shard.padded_size * sizeof(floatX), model->stream));
}

// Backward pass of the last forward, which must have been called with dloss > 0 (so acts.logits
// holds dlogits). Accumulates (+=) into the parameter gradients. With reduce_in_backward, each layer's
// gradients are handed to the communication stream as soon as that layer is done (llmc/grad_buckets.h),
// and the compute stream's later work waits for all of those reductions.
void gpt2_backward(GPT2* model, int B, int T) {
    const GPT2Config& cfg = model->config;
    int L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, Vp = cfg.padded_vocab_size;
    const ParameterTensors& p = model->params;
    const ParameterTensors& g = model->grads;
    const ActivationTensors& a = model->acts;
    cudaStream_t stream = model->stream;
    size_t BT = (size_t)B * T;
    LayerStrides ls = layer_strides(cfg, B, T, model->recompute, model->flash_attention);
    float* reduce = a.reduce_scratch;

    // logits -> lnf -> the residual stream
    matmul_backward(a.dln, g.wte, nullptr, reduce, a.logits, a.lnf, p.wte, nullptr, (int)BT, C, Vp, stream);
    cudaCheck(cudaMemsetAsync(a.dresidual, 0, BT * C * sizeof(floatX), stream));
    const floatX* final_residual = a.residual3 + (L - 1) * ls.residual3;
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, reduce, a.dln, final_residual, p.lnfw, a.lnf_mean, a.lnf_rstd,
                       (int)BT, C, stream);

    for (int l = L - 1; l >= 0; l--) {
        const floatX* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * ls.residual3;
        floatX* ln1 = a.ln1 + l * ls.ln;
        floatX* qkv = a.qkv + l * ls.qkv;
        floatX* atty = a.atty + l * ls.atty;
        floatX* residual2 = a.residual2 + l * ls.residual2;
        floatX* ln2 = a.ln2 + l * ls.ln;
        floatX* fch = a.fch + l * ls.fch;
        floatX* fch_gelu = a.fch_gelu + l * ls.fch_gelu;
        float* ln1_mean = a.ln1_mean + l * BT, *ln1_rstd = a.ln1_rstd + l * BT;
        float* ln2_mean = a.ln2_mean + l * BT, *ln2_rstd = a.ln2_rstd + l * BT;

        // recompute what the forward did not keep (same kernels, same inputs: the same bits); ln2 first,
        // since with -ge 1 the GELU output is recomputed from it
        if (model->recompute >= 3) {
            // the whole block again, from its input, as the forward ran it (whose ln1 came out of the
            // previous block's fused residual + layernorm: the same bits, as -r 2 relies on too)
            layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, (int)BT, C, stream);
            matmul_forward(qkv, nullptr, ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, (int)BT, C, 3 * C,
                           stream);
            attention_forward(atty, a.att + l * ls.att, qkv, a.attn_scratch, B, T, C, NH, model->flash_attention,
                              stream);
            matmul_forward(a.proj, nullptr, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, (int)BT, C, C,
                           stream);
            fused_residual_layernorm_forward(residual2, ln2, ln2_mean, ln2_rstd, residual, a.proj, p.ln2w + l * C,
                                             p.ln2b + l * C, (int)BT, C, stream);
            if (model->gelu_fusion) {
                matmul_forward(fch_gelu, fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, (int)BT, C,
                               4 * C, stream);
            } else {
                matmul_forward(fch, nullptr, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, (int)BT, C, 4 * C,
                               stream);
                gelu_forward(fch_gelu, fch, BT * 4 * C, stream);
            }
        } else if (model->recompute >= 2) {
            layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, (int)BT, C, stream);
            layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, (int)BT, C, stream);
        }
        if (model->recompute >= 3) {
            // done above
        } else if (model->recompute >= 1 && model->gelu_fusion) {
            // The forward's GELU came out of cuBLASLt's epilogue, applied to the fp32 accumulator before
            // rounding; gelu_forward on the stored bf16 fch can differ by one bf16 ulp. So the fc matmul
            // is run again, the same call on the same inputs and equally aligned pointers (layer_strides):
            // the same algorithm, the same bits. Its pre-GELU aux output (the same bits as fch) lands in
            // dfch, free until the fcproj backward below overwrites it. Cost: one more (B·T, C)x(C, 4C)
            // matmul per layer, a third more forward matmul flops, about 11% of a step's.
            matmul_forward(fch_gelu, a.dfch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, (int)BT, C, 4 * C,
                           stream);
        } else if (model->recompute >= 1) {
            gelu_forward(fch_gelu, fch, BT * 4 * C, stream);
        }

        // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
        if (model->gelu_fusion) {  // dfch straight from the matmul's DGELU epilogue
            matmul_backward(a.dfch, g.fcprojw + (size_t)l * C * 4 * C, g.fcprojb + l * C, reduce, a.dresidual, fch_gelu,
                            p.fcprojw + (size_t)l * C * 4 * C, fch, (int)BT, 4 * C, C, stream);
        } else {
            matmul_backward(a.dfch, g.fcprojw + (size_t)l * C * 4 * C, g.fcprojb + l * C, reduce, a.dresidual, fch_gelu,
                            p.fcprojw + (size_t)l * C * 4 * C, nullptr, (int)BT, 4 * C, C, stream);
            gelu_backward(a.dfch, fch, a.dfch, BT * 4 * C, stream);
        }
        matmul_backward(a.dln, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C, reduce, a.dfch, ln2,
                        p.fcw + (size_t)l * 4 * C * C, nullptr, (int)BT, C, 4 * C, stream);
        layernorm_backward(a.dresidual, g.ln2w + l * C, g.ln2b + l * C, reduce, a.dln, residual2, p.ln2w + l * C,
                           ln2_mean, ln2_rstd, (int)BT, C, stream);

        // attention: residual2 = residual + attproj(attention(qkv(ln1(residual))))
        matmul_backward(a.datty, g.attprojw + (size_t)l * C * C, g.attprojb + l * C, reduce, a.dresidual, atty,
                        p.attprojw + (size_t)l * C * C, nullptr, (int)BT, C, C, stream);
        attention_backward(a.dqkv, a.datty, qkv, atty, a.att + l * ls.att, a.attn_scratch, B, T, C, NH,
                           model->flash_attention, stream);
        matmul_backward(a.dln, g.qkvw + (size_t)l * 3 * C * C, g.qkvb + l * 3 * C, reduce, a.dqkv, ln1,
                        p.qkvw + (size_t)l * 3 * C * C, nullptr, (int)BT, C, 3 * C, stream);
        layernorm_backward(a.dresidual, g.ln1w + l * C, g.ln1b + l * C, reduce, a.dln, residual, p.ln1w + l * C,
                           ln1_mean, ln1_rstd, (int)BT, C, stream);
        if (model->reduce_in_backward) dp_reduce_bucket(*model->dp, model->grads_memory, model->grad_buckets[l], stream);
    }
    encoder_backward(g.wte, g.wpe, a.dresidual, model->buckets, B, T, C, stream);
    if (model->reduce_in_backward) {
        dp_reduce_bucket(*model->dp, model->grads_memory, model->grad_buckets[L], stream);
        dp_join(*model->dp, stream);
    }
}

// L2 norm of all parameter gradients together (deterministic order); waits for the GPU. With -z 1 each
// process holds the reduced gradient of its shard only: it sums the squares over its shard (padding
// included, which is zero) and the processes add their sums.
double gpt2_grad_norm(GPT2* model) {
    const floatX* grads = model->grads_memory;
    size_t n = model->num_parameters;
    if (model->zero_stage == 1) {
        grads += (size_t)model->shard.rank * model->shard.shard_size;
        n = model->shard.shard_size;
    }
    sum_of_squares(model->acts.grad_norm_sq, model->acts.reduce_scratch, grads, n, model->stream);
    if (model->zero_stage == 1) dp_all_reduce_floats(*model->dp, model->acts.grad_norm_sq, 1, model->stream);
    cudaCheck(cudaMemcpyAsync(model->host_norm_sq, model->acts.grad_norm_sq, sizeof(float), cudaMemcpyDeviceToHost,
                              model->stream));
    gpt2_sync(model, "the gradient norm");
    return std::sqrt((double)*model->host_norm_sq);
}

// One AdamW update (t = number of this update, from 1) of parameters [opt_begin, opt_end), per tensor
// so weight decay reaches only the 2-D tensors. grad_scale is the clipping factor. With -z 1, the
// updated shards are then all-gathered, so every process has all the new parameters.
void gpt2_update(GPT2* model, float learning_rate, float weight_decay, float grad_scale, int t) {
    AdamWHyper hyper;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t off = model->param_offsets[i];
        size_t begin = std::max(off, model->opt_begin);
        size_t end = std::min(off + model->param_sizes[i], model->opt_end);
        if (begin >= end) continue;
        size_t opt_index = begin - model->opt_begin;
        AdamWSettings s;
        s.lr = learning_rate;
        s.beta1 = hyper.beta1;
        s.beta2 = hyper.beta2;
        s.eps = hyper.eps;
        s.weight_decay = param_tensor_is_decayed(i) ? weight_decay : 0.0f;
        s.grad_scale = grad_scale;
        s.t = t;
        // a fixed function of (step, tensor, where this part of the tensor starts): the rounding bits
        // of a tensor cut between two shards do not repeat, and a whole tensor draws what one GPU draws
        s.seed = (uint32_t)t * 2654435761u + (uint32_t)i * 40503u + (uint32_t)(begin - off) * 2246822519u;
        adamw_update(model->params_memory + begin, model->master_memory ? model->master_memory + opt_index : nullptr,
                     model->grads_memory + begin, model->m_memory + opt_index, model->v_memory + opt_index, end - begin,
                     s, model->stream);
    }
    if (model->zero_stage == 1) dp_all_gather(*model->dp, model->params_memory, model->shard.shard_size, model->stream);
}

void gpt2_free(GPT2* model) {
    cudaCheck(cudaFree(model->params_memory));
    cudaCheck(cudaFree(model->grads_memory));
    cudaCheck(cudaFree(model->opt_memory));
    cudaCheck(cudaFree(model->acts_memory));
    cudaCheck(cudaFreeHost(model->host_losses));
    cudaCheck(cudaFreeHost(model->host_norm_sq));
    cudaCheck(cudaStreamDestroy(model->stream));
}

// ----------------------------------------------------------------------------
// The training run

// Dense BF16 tensor-core peak of the device, for MFU; 0 when the model is not in the table.
double bf16_peak_flops(const cudaDeviceProp& prop) {
    struct Peak { const char* name; double tflops; };
    static const Peak peaks[] = {{"H200", 989.0}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"H100", 989.0},
                                 {"H800", 989.0}, {"A100", 312.0},      {"A800", 312.0},     {"L40S", 362.0},
                                 {"L40", 181.0},  {"L4", 121.0},   {"A10G", 70.0},       {"A10", 125.0},      {"RTX 4090", 165.0},
                                 {"RTX 3090", 71.0}};
    for (const Peak& p : peaks) {
        if (strstr(prop.name, p.name)) return p.tflops * 1e12;
    }
    return 0.0;
}

// One sample (llmc/train_common.h has the loop and the settings, shared with the CPU trainer): the
// logits of the window's last position, fetched from the device and widened to fp32.
void generate_sample(GPT2* model, const SampleSettings& settings, uint64_t* rng, const TokenizerFile* tok) {
    int Vp = model->config.padded_vocab_size;
    std::vector<floatX> raw(Vp);
    std::vector<float> logits(Vp);
    generate_sample(settings, model->config.vocab_size, rng, tok, [&](const int* window, int length) {
        gpt2_forward(model, window, nullptr, 1, length);
        cudaCheck(cudaMemcpyAsync(raw.data(), model->acts.logits + (size_t)(length - 1) * Vp, Vp * sizeof(floatX),
                                  cudaMemcpyDeviceToHost, model->stream));
        cudaCheck(cudaStreamSynchronize(model->stream));
        for (int v = 0; v < Vp; v++) logits[v] = host_from_floatX(raw[v]);
        return (const float*)logits.data();
    });
}

// HellaSwag accuracy (llmc/hellaswag.h) in batches of the training shape (B rows of T tokens): the
// activations are allocated for exactly that, so T must hold the longest context + ending.
HellaSwagResult hellaswag_eval(GPT2* model, const HellaSwagSet& set, const TrainArgs& args, const DataParallel& dp) {
    if (set.longest_row > model->seq_len) {
        fatal("HellaSwag: the longest example needs %d tokens; run with -t %d or more", set.longest_row, set.longest_row);
    }
    HellaSwagResult local = hellaswag_evaluate(set, args.hellaswag_examples, dp.rank, dp.size, model->batch_size,
        model->seq_len, [&](const int* inputs, const int* targets, int rows, int cols, float* losses) {
            gpt2_forward(model, inputs, targets, rows, cols);
            size_t n = (size_t)rows * cols;
            cudaCheck(cudaMemcpyAsync(model->host_losses, model->acts.losses, n * sizeof(float),
                                      cudaMemcpyDeviceToHost, model->stream));
            gpt2_sync(model, "the HellaSwag losses");
            std::copy(model->host_losses, model->host_losses + n, losses);
        });
    HellaSwagResult total;
    total.examples = dp_sum(dp, local.examples, "the HellaSwag count");
    total.correct = dp_sum(dp, local.correct, "the HellaSwag count");
    total.correct_norm = dp_sum(dp, local.correct_norm, "the HellaSwag count");
    total.correct_token = dp_sum(dp, local.correct_token, "the HellaSwag count");
    return total;
}

// Mean loss over num_batches val batches of every process.
float validation_loss(GPT2* model, DataLoader* loader, int num_batches, const DataParallel& dp) {
    dataloader_reset(loader);
    double sum = 0.0;
    for (int i = 0; i < num_batches; i++) {
        dataloader_next_batch(loader);
        gpt2_forward(model, loader->inputs.data(), loader->targets.data(), loader->B, loader->T);
        sum += gpt2_mean_loss(model, loader->B, loader->T);
    }
    return (float)(dp_sum(dp, sum, "the val loss") / ((double)num_batches * dp.size));
}

// Rank 0 writes the weights (every rank holds all of them), every rank its state file: m, v and the
// master weights of the parameters it updates, [opt_begin, opt_end), from the device. DONE is marked
// once all are written.
void save_checkpoint(const GPT2* model, const std::string& dir, int step, const DataLoader& loader,
                     uint64_t sampler_rng, int grad_accum_steps, const LossScaler& scaler, const DataParallel& dp) {
    if (dp.rank == 0) {
        std::vector<float> params = gpt2_download_parameters(model);
        model_file_write(checkpoint_model_path(dir, step), model->config, params.data(), MODEL_VERSION_NATIVE);
    }
    size_t opt_n = model->opt_end - model->opt_begin;
    TrainState state = train_state_header(step, loader, sampler_rng, grad_accum_steps, dp_process_group(dp),
                                          model->num_parameters, model->opt_begin, model->opt_end);
    state.m.resize(opt_n);
    state.v.resize(opt_n);
    cudaCheck(cudaMemcpy(state.m.data(), model->m_memory, opt_n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(state.v.data(), model->v_memory, opt_n * sizeof(float), cudaMemcpyDeviceToHost));
    if (model->master_memory) {
        state.master.resize(opt_n);
        cudaCheck(cudaMemcpy(state.master.data(), model->master_memory, opt_n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    train_state_set_scaler(&state, scaler);
    state_file_write(checkpoint_state_path(dir, step, dp.rank), state);
    dp_barrier(dp, "the other processes' checkpoint files");
    if (dp.rank == 0) checkpoint_mark_done(dir, step);
    dp_barrier(dp, "rank 0's checkpoint marker");
    printf("checkpoint: wrote step %d to %s\n", step, dir.c_str());
}

// Restores this process's optimizer state, step and data position from checkpoint `step`
// (train_state_restore assembles this process's optimizer range from the checkpoint's state files,
// whatever process count wrote them, and checks batch and model). The master weights come from
// the state file when it has them (ours with -w 1); otherwise they stay as loaded from the model file
// (a CPU trainer's checkpoint, whose model file is fp32).
void load_state(GPT2* model, const std::string& dir, int step, DataLoader* loader, uint64_t* sampler_rng,
                int grad_accum_steps, LossScaler* scaler, const DataParallel& dp) {
    size_t opt_n = model->opt_end - model->opt_begin;
    TrainState state = train_state_restore(dir, step, dp_process_group(dp), grad_accum_steps, model->num_parameters,
                                           model->opt_begin, model->opt_end, loader, sampler_rng);
    loss_scaler_restore(scaler, state);
    cudaCheck(cudaMemcpy(model->m_memory, state.m.data(), opt_n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(model->v_memory, state.v.data(), opt_n * sizeof(float), cudaMemcpyHostToDevice));
    if (model->master_memory && !state.master.empty()) {
        cudaCheck(cudaMemcpy(model->master_memory, state.master.data(), opt_n * sizeof(float), cudaMemcpyHostToDevice));
    }
}

#ifndef TESTING
int main(int argc, char** argv) {
    TrainArgs args;
    parse_args(argc, argv, &args, true);
    // rank, process count, GPU, and the NCCL communicator when there are (or may be) several processes
    DataParallel dp = dp_init(args, &argc, &argv);
    // rank 0 speaks for the run; the others print only errors (stderr)
    if (dp.rank != 0 && freopen("/dev/null", "w", stdout) == nullptr) fatal("could not silence rank %d", dp.rank);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dp.device));
    double peak_flops = args.peak_gflops > 0 ? args.peak_gflops * 1e9 : bf16_peak_flops(prop);
    printf("train_gpt2cu (%s, CUDA) on %s (sm_%d%d, %d SMs, %.1f GiB)\n", PRECISION_NAME, prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    if (dp.nccl) {
        int version = 0;
        ncclGetVersion(&version);
        printf("data parallel: %d process(es) started by %s, one GPU each (NCCL %d), ZeRO stage -z %d, timeout -pt %g s\n",
               dp.size, launch_method_name(dp.method), version, args.zero_stage, dp.timeout_s);
    }
    // one run per output directory (llmc/output_lock.h); held until the process ends
    if (!args.output_dir.empty() && dp.rank == 0) {
        make_dir_check(args.output_dir);
        output_dir_lock(args.output_dir);
    }
    printf("settings: recompute -r %d, master weights -w %d%s, GELU fusion -ge %d, flash attention -fa %d%s\n",
           args.recompute, args.master_weights, std::is_same<floatX, float>::value ? " (fp32 build: not needed)" : "",
           args.gelu_fusion, args.flash_attention, FLASH_ATTENTION_AVAILABLE ? "" : " (this build: cuBLAS path)");
    cublas_setup();

    // the model: from the newest complete checkpoint when resuming, else from -e
    int resume_step = -1;
    if (args.resume) {
        resume_step = (int)checkpoint_find_latest(args.output_dir);
        if (resume_step < 0) printf("resume: no complete checkpoint in %s, starting from scratch\n", args.output_dir.c_str());
    }
    GPT2 model;
    std::vector<float> initial;
    if (resume_step >= 0) {
        printf("resume: continuing from step %d in %s\n", resume_step, args.output_dir.c_str());
        initial = gpt2_build(&model, checkpoint_model_path(args.output_dir, resume_step), args, &dp);
    } else {
        initial = gpt2_build(&model, args.model, args, &dp);
    }
    const GPT2Config& cfg = model.config;
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d (padded %d), %zu parameters\n", cfg.num_layers, cfg.channels,
           cfg.num_heads, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, model.num_parameters);
    // what all processes must agree on: the shared description, plus what only this trainer has
    char extra[256];
    snprintf(extra, sizeof(extra), " cuda: %s ge=%d fa=%d processes=%d pg=%d pt=%g resume_step=%d", PRECISION_NAME,
             args.gelu_fusion, args.flash_attention, dp.size, args.gpus_per_node, args.comm_timeout, resume_step);
    dp_check_same_config(dp, run_description(args, cfg, initial.data(), model.num_parameters) + extra);
    std::vector<float>().swap(initial);

    TrainingData data;
    training_data_init(&data, args, cfg, dp.rank, dp.size, resume_step);
    DataLoader& train_loader = data.train;
    int B = args.B, T = args.T, grad_accum_steps = data.grad_accum_steps, max_steps = data.max_steps;
    gpt2_allocate_activations(&model, B, T);
    size_t free_bytes, total_bytes;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("device memory: %.1f GiB in use of %.1f GiB\n", (total_bytes - free_bytes) / 1073741824.0,
           total_bytes / 1073741824.0);

    LRScheduler scheduler = lr_scheduler_from_args(args, max_steps);

    TokenizerFile tokenizer;
    int eot;
    bool have_tokenizer = load_sample_tokenizer(args, cfg, &tokenizer, &eot);
    SampleSettings sample_settings = sample_settings_from_args(args, cfg, eot);
    HellaSwagSet hellaswag;
    if (args.hellaswag_every > 0) {
        hellaswag_load_for_run(args.hellaswag_path, cfg.vocab_size, have_tokenizer ? &tokenizer : nullptr, &hellaswag);
    }

    if (!args.output_dir.empty()) make_dir_check(args.output_dir);
    uint64_t sampler_rng = (uint64_t)args.sample_seed;
    LossScaler scaler = loss_scaler_from_args(args, USE_LOSS_SCALING);
    if (resume_step >= 0) {
        load_state(&model, args.output_dir, resume_step, &train_loader, &sampler_rng, grad_accum_steps, &scaler, dp);
    }
    if (scaler.dynamic) {
        printf("loss scaling: S %g, x%g after %d clean steps, x%g on overflow\n", scaler.scale, scaler.growth,
               scaler.growth_interval, scaler.backoff);
    }
    Logger logger;
    logger_open(&logger, dp.rank == 0 ? args.output_dir : std::string(), resume_step);

    double flops_per_step = flops_per_token(cfg, T) * B * T * grad_accum_steps;  // per GPU
    if (args.overfit_single_batch && max_steps > 0) dataloader_next_batch(&train_loader);  // the one batch every step reuses
    int start_step = resume_step >= 0 ? resume_step : 0;
    // the step breakdown (llmc/phase_timer.h): host phases by the clock, GPU ones by events, NVTX for both
    PhaseTimer timer;
    timer.on_begin = nvtx_phase_begin;
    timer.on_end = nvtx_phase_end;
    GpuPhases gpu_phases;
    gpu_phases_create(&gpu_phases);
    for (int step = start_step; step <= max_steps; step++) {
        bool last = step == max_steps;
        if (is_val_step(args, step, max_steps)) {
            float val_loss = validation_loss(&model, &data.val, args.val_batches, dp);
            printf("step %d: val loss %.6f\n", step, val_loss);
            logger_log_val(&logger, step, val_loss);
        }
        if (is_hellaswag_step(args, step, max_steps)) {
            HellaSwagResult hs = hellaswag_eval(&model, hellaswag, args, dp);
            printf("step %d: HellaSwag acc %.4f acc_norm %.4f acc_token %.4f (%.0f examples)\n", step, hs.acc(),
                   hs.acc_norm(), hs.acc_token(), hs.examples);
            logger_log_hellaswag(&logger, step, hs.acc(), hs.acc_norm(), hs.acc_token(), (long)hs.examples);
        }
        phase_reset(&timer);
        if (is_checkpoint_step(args, step, start_step, max_steps)) {
            phase_begin(&timer, PHASE_CHECKPOINT);
            save_checkpoint(&model, args.output_dir, step, train_loader, sampler_rng, grad_accum_steps, scaler, dp);
            phase_end(&timer);
        }
        if (dp.rank == 0 && is_sample_step(args, step, max_steps)) {
            generate_sample(&model, sample_settings, &sampler_rng, have_tokenizer ? &tokenizer : nullptr);
        }
        if (last) break;

        gpt2_sync(&model, "the previous step");
        auto start = std::chrono::steady_clock::now();
        gpt2_zero_grad(&model);
        double loss_sum = 0.0;
        // every position of every micro-step of every process weighs the same in the step's mean loss;
        // times S, the loss scale (1 unless FP16): the gradients come out S times too large
        float dloss = scaler.scale / ((float)B * T * grad_accum_steps * dp.size);
        float step_scale = scaler.scale;  // the S these gradients carry (the scaler may move it below)
        for (int micro = 0; micro < grad_accum_steps; micro++) {
            phase_begin(&timer, PHASE_DATA);
            if (!args.overfit_single_batch) dataloader_next_batch(&train_loader);
            phase_end(&timer);
            // the last micro-step completes the gradients: reduce each layer's while the backward goes on
            bool last_micro = micro == grad_accum_steps - 1;
            model.reduce_in_backward = dp.nccl && last_micro;
            // -ni (testing): rank 0's last micro-step of this step stands for one bad micro-batch
            float micro_dloss = dp.rank == 0 && last_micro && is_inject_step(args, step) ? INFINITY : dloss;
            gpu_phase_begin(&gpu_phases, PHASE_FORWARD, model.stream);
            gpt2_forward(&model, train_loader.inputs.data(), train_loader.targets.data(), B, T, micro_dloss);
            gpu_phase_end(&gpu_phases, PHASE_FORWARD, model.stream);
            gpu_phase_begin(&gpu_phases, PHASE_BACKWARD, model.stream);
            gpt2_backward(&model, B, T);
            gpu_phase_end(&gpu_phases, PHASE_BACKWARD, model.stream);
            loss_sum += gpt2_mean_loss(&model, B, T);  // waits for the stream: the events are done
            gpu_phases_collect(&gpu_phases, &timer.times);
        }
        model.reduce_in_backward = false;
        // comm: the global gradient norm (with several GPUs the gradients were reduced during the
        // backward, overlapped with it, and the backward's time includes the wait for the last bucket)
        phase_begin(&timer, PHASE_COMM);
        double scaled_norm = gpt2_grad_norm(&model);  // global: every process decides the same
        phase_end(&timer);
        float lr = lr_at_step(scheduler, step);
        float grad_scale = loss_scaler_grad_scale(scaler, scaled_norm, 1.0);  // 1/S and the clipping
        bool apply = loss_scaler_step(&scaler, scaled_norm, step);
        phase_begin(&timer, PHASE_OPTIMIZER);
        if (apply) gpt2_update(&model, lr, args.weight_decay, grad_scale, (int)scaler.updates);
        gpt2_sync(&model, "the parameter update");
        phase_end(&timer);
        double grad_norm = scaled_norm / step_scale;
        float loss = (float)(dp_sum(dp, loss_sum, "the step's loss") / ((double)grad_accum_steps * dp.size));
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        double tokens_per_s = (double)data.tokens_per_step / (ms / 1000.0);
        StepThroughput throughput = step_throughput(flops_per_step, ms, peak_flops);  // MFU n/a: GPU not in the table
        char note[128] = "";
        int at = 0;
        if (scaler.dynamic) at += snprintf(note, sizeof(note), " | scale %g", step_scale);
        if (!apply) snprintf(note + at, sizeof(note) - at, " | SKIPPED: non-finite gradient norm (%ld so far)", (long)scaler.skipped_total);
        printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s%s\n", step, max_steps,
               loss, lr, grad_norm, ms, tokens_per_s, step_breakdown_text(timer.times, throughput, peak_flops).c_str(),
               note);
        logger_log_train(&logger, step, loss, lr, (float)grad_norm, ms, tokens_per_s, !apply, (long)scaler.skipped_total,
                         scaler.dynamic ? step_scale : 0.0f, -1, step_breakdown_json(timer.times, throughput, peak_flops));
    }
    gpu_phases_destroy(&gpu_phases);
    logger_close(&logger);
    gpt2_free(&model);
    cublas_teardown();
    dp_finalize(&dp);
    return 0;
}
#endif
