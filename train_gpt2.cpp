/*
GPT-2 training on the CPU in fp32: the reference that every other trainer in this project is checked
against. Every layer's forward and backward is written by hand in the llmc/ headers (plain loops, OpenMP); this
file wires them into the model, and the model into a training loop:

    tokens -> encoder -> L x [ ln1 -> qkv -> attention -> attproj -> +residual
                               ln2 -> fc -> gelu -> fcproj -> +residual ] -> lnf -> logits (x wteᵀ) -> loss

Run `./train_gpt2 -h` for the flags; README.md shows a complete run.
*/
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/adafactor.h"
#include "llmc/adamw.h"
#include "llmc/adamw8.h"
#include "llmc/attention.h"
#include "llmc/run/cpu_peak.h"
#include "llmc/crossentropy.h"
#include "llmc/encoder.h"
#include "llmc/gelu.h"
#include "llmc/gpt2_config.h"
#include "llmc/gpt2_activations.h"
#include "llmc/gpt2_init.h"
#include "llmc/gpt2_plan.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/dataloader.h"
#include "llmc/io/output_lock.h"
#include "llmc/layernorm.h"
#include "llmc/matmul.h"
#include "llmc/muon.h"
#include "llmc/optimizer.h"
#include "llmc/parallel/comm_mpi.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/parallel/grad_completion.h"
#include "llmc/parallel/grad_compression.h"
#include "llmc/parallel/local_steps.h"
#include "llmc/parallel/layout.h"
#include "llmc/parallel/matrix_owners.h"
#include "llmc/parallel/muon_step.h"
#include "llmc/parallel/model_state.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/tensor_parallel.h"
#include "llmc/parallel/zero.h"
#include "llmc/parallel/zero_blocks.h"
#include "llmc/parallel/zero_sharded.h"
#include "llmc/rand.h"
#include "llmc/residual.h"
#include "llmc/run/args.h"
#include "llmc/run/checkpoint_state.h"
#include "llmc/run/hellaswag.h"
#include "llmc/run/logger.h"
#include "llmc/run/loss_scaler.h"
#include "llmc/run/memory_plan.h"
#include "llmc/run/model_source.h"
#include "llmc/run/phase_timer.h"
#include "llmc/run/run_loop.h"
#include "llmc/run/sampler.h"
#include "llmc/run/schedulers.h"
#include "llmc/run/train_common.h"
#include "llmc/tokenizer/tokenizer_file.h"
#include "llmc/utils.h"

// ----------------------------------------------------------------------------
// Parameters: 16 tensors in checkpoint order, pointers into one flat array.

using ParameterTensors = ParameterTensorsOf<float>;  // llmc/gpt2_config.h

using BlockParams = BlockTensorsOf<const float>;  // llmc/gpt2_config.h
using BlockGrads = BlockTensorsOf<float>;

// The same views into a ZeRO-2/3 unit buffer (llmc/parallel/zero_sharded.h), where the 12 slices lie one after another.
template <typename T>
BlockTensorsOf<T> block_tensors_in_unit(T* buf, const ZeroUnit& u) {
    auto at = [&](int k) { return buf + u.slices[k].unit_offset; };
    return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11)};
}

// Unit 0 (wte, wpe, lnfw, lnfb) as parameter tensors; the per-block tensors are left null.
template <typename T>
ParameterTensorsOf<T> outer_tensors_in_unit(T* buf, const ZeroUnit& u) {
    ParameterTensorsOf<T> p = {};
    p.wte = buf + u.slices[0].unit_offset;
    p.wpe = buf + u.slices[1].unit_offset;
    p.lnfw = buf + u.slices[2].unit_offset;
    p.lnfb = buf + u.slices[3].unit_offset;
    return p;
}

struct GPT2 {
    GPT2Config config;
    size_t num_parameters = 0;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t param_offsets[NUM_PARAMETER_TENSORS];
    std::vector<float> params_memory, grads_memory;  // (N), padded to the shard layout's size; or the shard (S)
    ParameterTensors params, grads;                  // views of the full arrays (null where sharded)
    size_t params_base = 0, grads_base = 0;          // flat index of element 0: 0, or the shard's begin
    // the optimizer's element-wise work covers parameters [opt_begin, opt_end): all of them, or this
    // process's ZeRO-1/2/3 shard
    ShardLayout shard;
    size_t opt_begin = 0, opt_end = 0;
    ZeroSharding zero;  // -z 2, -z 3: the units and their buffers (llmc/parallel/zero_sharded.h)
    ZeroMemory memory;  // bytes of model state allocated on this process
    // -opt and what its moments hold (llmc/io/checkpoint.h's m and v): AdamW's, (opt_end - opt_begin)
    // each; Muon's momentum in m on the block matrices (their v stays 0), AdamW's elsewhere; Adafactor no
    // m, and its whole factored state in v (every process has all of it: llmc/parallel/matrix_owners.h)
    OptimizerPlan optimizer;
    std::vector<float> m_memory, v_memory;
    // -opt adamw8: m and v in 8 bits over [opt_begin, opt_end), in the blocks of the flat vector (llmc/adamw8.h)
    Adamw8Blocks blocks8;
    Adamw8State moments8;
    // -gc sign|powersgd: the data-parallel gradients compressed, with this process's error feedback
    // (llmc/parallel/grad_compression.h); kind none: all-reduced in fp32
    GradCompression compression;
    // -lh H: the replicas synchronize every H steps (llmc/parallel/local_steps.h); every 0: every step
    LocalSteps local;
    ContextParallel cp;  // -cp: this process's positions of every sequence (llmc/parallel/context_parallel.h)
    // this process's place in the run (llmc/parallel/layout.h): its groups, ZeRO stage, layers.
    // With tensor parallelism (tp > 1) the arrays above hold this rank's slices, and num_parameters
    // and param_sizes/offsets are local (llmc/parallel/model_state.h moves state to and from the whole)
    ParallelLayout layout;
    std::vector<float> ce_max;   // (B*T) vocabulary-parallel cross-entropy: each row's max
    std::vector<double> ce_sum;  // (B*T) and sum of exponentials (also the fused cross-entropy's sums)
    // the last forward left each row's exponentials in scratch.dlogits and their sums in ce_sum
    // (llmc/crossentropy.h), so the backward only scales them (without tensor parallelism, with one set
    // of activations: a pipeline's later forwards would overwrite the scratch before the backward)
    bool ce_exps_kept = false;
    // pipeline parallelism (llmc/parallel/pipeline.h): with pp > 1, config is this stage's (num_layers = its
    // layers [layout.layer_begin, layout.layer_end)) and model_config the whole model's
    GPT2Config model_config;
    bool first_stage() const { return layout.pp_rank == 0; }
    bool last_stage() const { return layout.pp_rank == layout.pp - 1; }
    // activations, allocated on the first forward for (batch_size, seq_len); a pipeline stage keeps
    // act_slots sets of them (one per micro-batch in flight) and computes in slot act_slot
    int batch_size = 0, seq_len = 0;
    int recompute = 0;  // -r: what the activations keep (ActivationTensors)
    int act_slots = 1, act_slot = 0;
    size_t acts_per_slot = 0;
    std::vector<std::vector<float>> slot_ce_max;    // the other slots' ce_max and ce_sum
    std::vector<std::vector<double>> slot_ce_sum;
    std::vector<float> acts_memory, scratch_memory;
    // gpt2_zero_grad left the weight and bias gradients stale: the next backward sets them
    bool grads_unset = false;
    ActivationTensors acts;
    BackwardScratch scratch;
};

// Sizes the flat parameter and gradient arrays (zero-filled where new, padded for the collectives)
// and the optimizer's state for the parameters this process updates: all of them (-z 0) or its shard
// (-z 1, see llmc/parallel/zero.h). -z 2 keeps only the shard of the gradients, -z 3 of the parameters too
// (llmc/parallel/zero_sharded.h); a sharded array is replaced, so the full one's memory goes back.
// Muon's matrices are dealt to the data-parallel processes by their Newton-Schulz work; Adafactor's state
// is whole on every process (llmc/parallel/matrix_owners.h).
void gpt2_setup_optimizer(GPT2* model) {
    const ProcessGroup& pg = model->layout.dp_group;
    int zero_stage = model->layout.zero_stage;
    const ShardLayout& sh = model->shard = shard_layout(model->num_parameters, pg.size, pg.rank);
    if (zero_stage == 3) {
        std::vector<float> mine(sh.shard_size, 0.0f);
        std::copy(model->params_memory.begin() + sh.begin, model->params_memory.begin() + sh.end, mine.begin());
        model->params_memory.swap(mine);
        model->params = {};
        model->params_base = sh.begin;
    } else {
        model->params_memory.resize(sh.padded_size, 0.0f);
        point_parameters_at(&model->params, model->params_memory.data(), model->param_offsets);  // local offsets with -tp
        model->params_base = 0;
    }
    if (zero_stage >= 2) {
        std::vector<float>(sh.shard_size, 0.0f).swap(model->grads_memory);
        model->grads = {};
        model->grads_base = sh.begin;
        zero_sharding_init(&model->zero, model->config, pg, sh, zero_stage == 3);
    } else {
        model->grads_memory.resize(sh.padded_size, 0.0f);
        point_parameters_at(&model->grads, model->grads_memory.data(), model->param_offsets);
        model->grads_base = 0;
        model->zero = ZeroSharding();
    }
    model->opt_begin = zero_stage >= 1 ? sh.begin : 0;
    model->opt_end = zero_stage >= 1 ? sh.end : model->num_parameters;
    model->optimizer = optimizer_plan(model->optimizer.kind, model->config, pg.size);
    const OptimizerPlan& opt = model->optimizer;
    // new vectors, not assign(): a shrunk vector would keep (and the process keep resident) its old size
    const bool eight_bit = opt.kind == OPT_ADAMW8;
    size_t moments = eight_bit ? 0 : model->opt_end - model->opt_begin;
    size_t second = opt.kind == OPT_ADAFACTOR ? adafactor_state_size(opt.tensors) : moments;
    std::vector<float>(opt.kind == OPT_ADAFACTOR ? 0 : moments, 0.0f).swap(model->m_memory);
    std::vector<float>(second, 0.0f).swap(model->v_memory);
    model->blocks8 = eight_bit ? adamw8_blocks(opt.tensors) : Adamw8Blocks();
    model->moments8 = eight_bit ? adamw8_state(model->blocks8, model->opt_begin, model->opt_end) : Adamw8State();
    ZeroMemory& mem = model->memory;
    mem.params = model->params_memory.size() * sizeof(float);
    mem.grads = model->grads_memory.size() * sizeof(float);
    mem.optimizer = (model->m_memory.size() + model->v_memory.size()) * sizeof(float) + model->moments8.bytes();
    const ZeroSharding& zs = model->zero;
    mem.gather_params = (zs.outer_params.size() + zs.block_params[0].size() + zs.block_params[1].size()) * sizeof(float);
    mem.gather_grads = (zs.outer_grads.size() + zs.block_grads.size() + zs.shard_part.size()) * sizeof(float);
}

void gpt2_setup(GPT2* model, const GPT2Config& cfg) {
    validate_config(cfg, "model");
    model->config = cfg;
    model->model_config = cfg;
    model->layout = single_process_layout(cfg);
    param_tensor_sizes(cfg, model->param_sizes);
    param_tensor_offsets(cfg, model->param_offsets);
    model->num_parameters = num_parameters(cfg);
    model->params_memory.clear();
    model->grads_memory.clear();
    gpt2_setup_optimizer(model);  // one process, until gpt2_distribute knows better
}

// Builds the model from fp32 parameters (N, checkpoint order).
void gpt2_init_from(GPT2* model, const GPT2Config& cfg, const std::vector<float>& params) {
    gpt2_setup(model, cfg);
    std::copy(params.begin(), params.end(), model->params_memory.begin());
}

void gpt2_load_checkpoint(GPT2* model, const std::string& path) {
    GPT2Config cfg;
    std::vector<float> params;
    model_file_read(path, &cfg, &params);
    gpt2_init_from(model, cfg, params);
}

// Keeps this process's part of the whole model's parameters (llmc/parallel/model_state.h): its
// pipeline stage's layers and the shared tensors, its tensor-parallel slices of them; config, sizes
// and offsets become the local ones. Call before gpt2_setup_optimizer. One process keeps everything.
void gpt2_keep_local_part(GPT2* model) {
    const ParallelLayout& lay = model->layout;
    if (lay.pp == 1 && lay.tp == 1) return;
    model->config = layout_stage_config(lay, model->model_config);
    tp_param_sizes(model->config, lay.tp, model->param_sizes);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        model->param_offsets[i] = offset;
        offset += model->param_sizes[i];
    }
    model->params_memory = layout_local_part(lay, model->model_config, model->params_memory, 0, offset);
    model->num_parameters = offset;
    model->grads_memory.assign(offset, 0.0f);
}

// Points model->acts at activation slot `slot` (pipeline: the micro-batch's own set), keeping each
// slot's cross-entropy statistics with it.
void gpt2_use_activation_slot(GPT2* model, int slot);

// The activations for (B, T), `slots` sets of them (a pipeline stage keeps one per micro-batch in
// flight, llmc/parallel/pipeline.h), and the backward scratch.
void gpt2_allocate_activations(GPT2* model, int B, int T, int slots = 1) {
    const GPT2Config& cfg = model->config;
    size_t tp = model->layout.tp, cp = model->layout.cp;  // this rank's C/tp columns, Vp/tp logits, T/cp positions
    bool sp = model->layout.sequence_parallel;
    int Tl = T / (int)cp;
    size_t total = layout_activations(nullptr, nullptr, cfg, B, Tl, model->recompute, tp, model->last_stage(), sp, cp);
    model->acts_memory.assign(total * slots, 0.0f);
    layout_activations(&model->acts, model->acts_memory.data(), cfg, B, Tl, model->recompute, tp, model->last_stage(), sp, cp);
    context_parallel_start(model->layout.cp_group, model->layout.cp_mode, B, T, cfg.channels, cfg.channels / tp,
                           cfg.num_heads / tp, &model->cp);
    model->acts_per_slot = total;
    model->act_slots = slots;
    model->act_slot = 0;
    model->slot_ce_max.assign(slots, {});
    model->slot_ce_sum.assign(slots, {});
    float** scratch_ptrs[] = {&model->scratch.dresidual, &model->scratch.dln, &model->scratch.datty,
                              &model->scratch.dqkv, &model->scratch.dfch, &model->scratch.dfch_gelu,
                              &model->scratch.dlogits, &model->scratch.gathered};
    size_t scratch_sizes[NUM_SCRATCH_TENSORS];
    backward_scratch_sizes(cfg, B, Tl, tp, model->last_stage(), scratch_sizes, sp);
    size_t scratch_total = 0;
    for (size_t s : scratch_sizes) scratch_total += s;
    model->scratch_memory.assign(scratch_total, 0.0f);
    float* p = model->scratch_memory.data();
    for (int i = 0; i < NUM_SCRATCH_TENSORS; i++) {
        *scratch_ptrs[i] = p;
        p += scratch_sizes[i];
    }
    model->batch_size = B;
    model->seq_len = T;
    printf("activations: %.1f MiB for B=%d T=%d at recompute -r %d (-r 0/1/2/3:", total * slots * 4.0 / (1 << 20), B,
           T, model->recompute);
    for (int r = 0; r <= 3; r++) {
        printf(" %.1f", layout_activations(nullptr, nullptr, cfg, B, Tl, r, tp, model->last_stage(), sp, cp) * 4.0 / (1 << 20));
    }
    printf(" MiB a set), %d set(s), backward scratch %.1f MiB\n", slots, scratch_total * 4.0 / (1 << 20));
}

void gpt2_use_activation_slot(GPT2* model, int slot) {
    if (slot == model->act_slot) return;
    model->ce_max.swap(model->slot_ce_max[model->act_slot]);
    model->ce_sum.swap(model->slot_ce_sum[model->act_slot]);
    model->ce_max.swap(model->slot_ce_max[slot]);
    model->ce_sum.swap(model->slot_ce_sum[slot]);
    layout_activations(&model->acts, model->acts_memory.data() + (size_t)slot * model->acts_per_slot, model->config,
                       model->batch_size, model->seq_len / model->layout.cp, model->recompute, model->layout.tp,
                       model->last_stage(), model->layout.sequence_parallel, model->layout.cp);
    model->act_slot = slot;
}

// One transformer block, forward: a.residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))), where
// residual2 = a.residual + attproj(attention(qkv(ln1(a.residual)))). Fills every view of `a`.
// With a TP group of tp > 1 (llmc/parallel/tensor_parallel.h), w and the qkv..fch views are this rank's slices:
// qkv and fc produce C/tp columns (NH/tp heads), attproj and fcproj are row-parallel, one all-reduce each.
// With sequence parallelism (sq on) the residual stream and the layernorms hold this rank's sq.rows rows:
// each layernorm's output is all-gathered for the matmul after it, and each all-reduce is a reduce-scatter.
// With context parallelism (cp) T is this process's positions of each row, and attention is the scheme's.
void block_forward(const BlockParams& w, const BlockActs& a, int B, int T, int C, int NH, const ProcessGroup& tp = ProcessGroup(),
                   const SequenceShard& sq = SequenceShard(), ContextParallel* cp = nullptr) {
    int BT = B * T, Cl = C / tp.size, N = sq.on ? (int)sq.rows : BT;  // N: rows of the residual stream here
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual, w.ln1w, w.ln1b, N, C);
    matmul_forward(a.qkv, sp_all_gather(a.ln1, sq, C, tp), w.qkvw, w.qkvb, BT, C, 3 * Cl);
    cp_attention_forward(cp, a.atty, a.att, a.qkv, B, T, Cl, NH / tp.size);
    row_parallel_forward(a.attproj, a.atty, w.attprojw, w.attprojb, BT, Cl, C, tp, sq);
    residual_forward(a.residual2, a.residual, a.attproj, (size_t)N * C);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, N, C);
    matmul_forward(a.fch, sp_all_gather(a.ln2, sq, C, tp), w.fcw, w.fcb, BT, C, 4 * Cl);
    gelu_forward(a.fch_gelu, a.fch, (size_t)BT * 4 * Cl);
    row_parallel_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, BT, 4 * Cl, C, tp, sq);
    residual_forward(a.residual3, a.residual2, a.fcproj, (size_t)N * C);
}

// Forward pass over inputs (B, T). With targets, also the per-position losses and their mean, which
// is returned; without, returns -1 and only the logits are meaningful. A pipeline stage runs its own
// layers: after the first, acts.encoded holds the previous stage's output; before the last, it stops
// after its blocks (returns 0) and the output is the last block's residual3.
float gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config& cfg = model->config;
    int L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    if (model->acts_memory.empty()) gpt2_allocate_activations(model, B, T);
    if ((size_t)B * T > (size_t)model->batch_size * model->seq_len || T > cfg.max_seq_len) {
        fatal("gpt2_forward: B=%d T=%d exceeds the allocated B=%d T=%d (or maxT %d)", B, T, model->batch_size,
              model->seq_len, cfg.max_seq_len);
    }
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V))) {
            fatal("gpt2_forward: token id at position %d is outside 0..%d", i, V - 1);
        }
    }
    model->ce_exps_kept = false;
    ParameterTensors p = model->params;
    const ActivationTensors& a = model->acts;
    // -z 3: unit 0 and then each block are gathered just before they are used (llmc/parallel/zero_sharded.h)
    ZeroSharding* zs = model->layout.zero_stage == 3 ? &model->zero : nullptr;
    const float* shard_params = model->params_memory.data();
    if (zs) {
        p = outer_tensors_in_unit((float*)zero_gather_outer(zs, shard_params), zs->units[ZERO_OUTER_UNIT]);
        zero_blocks_begin(zs);
    }
    // -cp: from here on this process's T/cp positions of each row: their tokens and rows of wpe
    ContextParallel* cp = model->cp.on() ? &model->cp : nullptr;
    if (cp) T = context_parallel_enter(cp, B, T, &inputs, &targets, &p.wpe, C);
    size_t BT = (size_t)B * T;

    // tensor parallel: this rank holds vocabulary rows [v0, v0 + Vl) of wte and computes those logits
    // (sequence parallel: this rank's rows of the residual stream, llmc/parallel/tensor_parallel.h)
    const ProcessGroup& tp = model->layout.tp_group;
    int Vl = Vp / tp.size, v0 = tp.rank * Vl;
    SequenceShard sq = sequence_shard(BT, tp, model->layout.sequence_parallel, model->scratch.gathered);
    if (model->first_stage()) tp_encoder_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C, v0, Vl, tp, sq);
    LayerStrides ls = layer_strides(model->config, B, T, a.recompute, tp.size, sq.rows_per_rank, model->layout.cp);
    for (int l = 0; l < L; l++) {
        BlockParams w = zs ? block_tensors_in_unit(zero_gather_block(zs, l, l + 1 < L ? l + 1 : -1, shard_params),
                                                   zs->units[zero_block_unit(l)])
                           : block_tensors<const float>(p, l, C, tp.size);
        block_forward(w, block_acts(a, ls, l), B, T, C, NH, tp, sq, cp);
    }
    if (!model->last_stage()) return 0.0f;
    const float* final_residual = a.residual3 + (L - 1) * sq.rows_per_rank * C;
    float* lnf_mine = a.lnf + (sq.on ? tp.rank * sq.rows_per_rank * C : 0);  // gathered in place below
    layernorm_forward(lnf_mine, a.lnf_mean, a.lnf_rstd, final_residual, p.lnfw, p.lnfb, (int)sq.rows, C);
    sp_all_gather(lnf_mine, a.lnf, sq, C, tp, COMM_FLOAT32, host_copy);
    matmul_forward(a.logits, a.lnf, p.wte, (const float*)nullptr, (int)BT, C, Vl);

    if (targets == nullptr) return -1.0f;
    if (tp.size == 1 && model->act_slots == 1) {  // the backward's dlogits scratch is free until then
        model->ce_sum.resize(BT);
        crossentropy_forward_keep_exps(a.losses, model->scratch.dlogits, model->ce_sum.data(), a.logits, targets,
                                       (int)BT, V, Vp);
        model->ce_exps_kept = true;
    } else if (tp.size == 1) {
        crossentropy_forward(a.losses, a.logits, targets, (int)BT, V, Vp);
    } else {
        tp_crossentropy_forward(a.losses, a.logits, targets, (int)BT, V, v0, Vl, tp, &model->ce_max, &model->ce_sum);
    }
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += a.losses[i];
    return (float)(sum / ((double)BT * model->layout.cp));  // -cp: this process's share of the rows' mean
}

// Clears the gradients before a step's first micro-step. Half a gigabyte at d12 would be written here
// and read back by the backward's first += into it, so where it can, the next backward *sets* instead:
// each weight and bias gradient's first contribution is a matrix product (the LM head's for wte), which
// then stores where it would add (llmc/matmul.h, the same bits). Only the tensors that are just added
// into (wpe, the layernorms') are cleared. That needs every such tensor's first contribution to come from
// this process's own backward: not with ZeRO-2/3 (unit buffers) or a pipeline (a stage never touches the
// other stages' tensors), which clear everything as before.
void gpt2_zero_grad(GPT2* model) {
    if (model->layout.zero_stage < 2 && model->layout.pp == 1) {
        const int added_into[] = {P_WPE, P_LN1W, P_LN1B, P_LN2W, P_LN2B, P_LNFW, P_LNFB};
        for (int i : added_into) {
            memset(model->grads_memory.data() + model->param_offsets[i], 0, model->param_sizes[i] * sizeof(float));
        }
        model->grads_unset = true;
        return;
    }
    float* g = model->grads_memory.data();
    long n = (long)model->grads_memory.size();
#pragma omp parallel for schedule(static)  // every thread takes its part of the memory bandwidth
    for (long i = 0; i < n; i++) g[i] = 0.0f;
}

// One transformer block, backward. On entry s.dresidual is d(loss)/d(block output); on return it is
// d(loss)/d(block input). Accumulates (+=) into the block's parameter gradients g; uses s as scratch.
// With set_grads, the four weights' and biases' gradients are set (=) rather than accumulated
// (gpt2_zero_grad); the layernorms' are always accumulated. The matrix products set the scratch
// gradients they produce, so those need no clearing either.
// With sequence parallelism (sq on) s.dresidual holds this rank's sq.rows rows: it is all-gathered for
// each row-parallel matmul's backward, the layernorm outputs again for the weight gradients after them,
// and each column-parallel input gradient is reduce-scattered back to this rank's rows.
void block_backward(const BlockGrads& g, const BlockParams& w, const BlockActs& a, const BackwardScratch& s, int B,
                    int T, int C, int NH, const ProcessGroup& tp = ProcessGroup(), bool set_grads = false,
                    const SequenceShard& sq = SequenceShard(), ContextParallel* cp = nullptr) {
    int BT = B * T, Cl = C / tp.size, N = sq.on ? (int)sq.rows : BT;
    auto zero = [](float* x, size_t n) { memset(x, 0, n * sizeof(float)); };
    const bool set = true;  // set_dinp: the scratch gradient starts with this product
    // the conjugate of a row-parallel matmul's all-reduce (or, with sq, its reduce-scatter): this rank's
    // rows of d(layernorm input), summed over the group
    auto sum_dln = [&]() -> const float* { return tp_sum_rows(s.dln, sq, C, tp); };

    // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
    matmul_backward(s.dfch_gelu, g.fcprojw, g.fcprojb, sp_all_gather(s.dresidual, sq, C, tp), a.fch_gelu, w.fcprojw,
                    BT, 4 * Cl, C, set, set_grads);
    zero(s.dfch, (size_t)BT * 4 * Cl);
    gelu_backward(s.dfch, a.fch, s.dfch_gelu, (size_t)BT * 4 * Cl);
    matmul_backward(s.dln, g.fcw, g.fcb, s.dfch, sp_all_gather(a.ln2, sq, C, tp), w.fcw, BT, C, 4 * Cl, set, set_grads);
    layernorm_backward(s.dresidual, g.ln2w, g.ln2b, sum_dln(), a.residual2, w.ln2w, a.ln2_mean, a.ln2_rstd, N, C);

    // attention: residual2 = residual + attproj(attention(qkv(ln1(residual))))
    matmul_backward(s.datty, g.attprojw, g.attprojb, sp_all_gather(s.dresidual, sq, C, tp), a.atty, w.attprojw, BT,
                    Cl, C, set, set_grads);
    zero(s.dqkv, (size_t)BT * 3 * Cl);
    cp_attention_backward(cp, s.dqkv, s.datty, a.atty, a.qkv, a.att, B, T, Cl, NH / tp.size);
    matmul_backward(s.dln, g.qkvw, g.qkvb, s.dqkv, sp_all_gather(a.ln1, sq, C, tp), w.qkvw, BT, C, 3 * Cl, set, set_grads);
    layernorm_backward(s.dresidual, g.ln1w, g.ln1b, sum_dln(), a.residual, w.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
}

// Refills what -r did not keep of one block's activations, with the forward's own functions on the
// same inputs: the same bits as the forward produced. -r 3 reruns the whole block (residual3 comes
// out as stored); -r 2 the layernorms (their mean and rstd come out as stored); -r 1 the GELU.
void block_recompute(const BlockParams& w, const BlockActs& a, int recompute, int B, int T, int C, int NH,
                     const ProcessGroup& tp = ProcessGroup(), const SequenceShard& sq = SequenceShard(),
                     ContextParallel* cp = nullptr) {
    int BT = B * T, Cl = C / tp.size, N = sq.on ? (int)sq.rows : BT;
    if (recompute >= 3) {
        block_forward(w, a, B, T, C, NH, tp, sq, cp);
        return;
    }
    if (recompute >= 2) {
        layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.residual, w.ln1w, w.ln1b, N, C);
        layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, N, C);
    }
    if (recompute >= 1) gelu_forward(a.fch_gelu, a.fch, (size_t)BT * 4 * Cl);
}

// Backward pass of the last forward (same inputs, targets, B, T). Accumulates (+=) into the parameter
// gradients; dloss is the weight of each position's loss in the objective, 1/(B*T*grad_accum_steps).
// A pipeline stage before the last starts from scratch.dresidual = d(loss)/d(its output), received from
// the next stage; one after the first leaves d(loss)/d(its input) there for the previous stage.
void gpt2_backward(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss) {
    const GPT2Config& cfg = model->config;
    int L = cfg.num_layers, C = cfg.channels, NH = cfg.num_heads, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    ParameterTensors p = model->params;
    ParameterTensors g = model->grads;
    const ActivationTensors& a = model->acts;
    const BackwardScratch& s = model->scratch;
    ContextParallel* cp = model->cp.on() ? &model->cp : nullptr;  // -cp: this process's positions, as in the forward
    if (cp) T = context_parallel_enter(cp, B, T, &inputs, &targets, nullptr, C);
    size_t BT = (size_t)B * T;
    auto zero = [](float* x, size_t n) { memset(x, 0, n * sizeof(float)); };
    // -z 2/3: each unit's gradient goes into a unit buffer and is reduce-scattered into this process's
    // shard once it is final; -z 3 gathers each block's parameters again (unit 0's are still gathered)
    ZeroSharding* zs = model->layout.zero_stage >= 2 ? &model->zero : nullptr;
    const float* shard_params = model->params_memory.data();
    float* shard_grads = model->grads_memory.data();
    bool set_grads = model->grads_unset && !zs;  // the first backward after gpt2_zero_grad sets, later ones add
    model->grads_unset = false;
    if (zs) {
        zero(zs->outer_grads.data(), zs->outer_grads.size());
        g = outer_tensors_in_unit(zs->outer_grads.data(), zs->units[ZERO_OUTER_UNIT]);
        if (model->layout.zero_stage == 3) {
            p = outer_tensors_in_unit((float*)zs->outer_params.data(), zs->units[ZERO_OUTER_UNIT]);
            zero_blocks_begin(zs);
        }
    }

    // loss -> logits -> lnf (tensor parallel: this rank's vocabulary rows, then the sum over ranks)
    const ProcessGroup& tp = model->layout.tp_group;
    int Vl = Vp / tp.size, v0 = tp.rank * Vl;
    SequenceShard sq = sequence_shard(BT, tp, model->layout.sequence_parallel, s.gathered);
    size_t R = sq.rows_per_rank;  // rows of each layer's residual-stream tensors (B·T without -sq)
    LayerStrides ls = layer_strides(model->config, B, T, a.recompute, tp.size, R, model->layout.cp);
    if (model->last_stage()) {  // else the next stage sent d(loss)/d(output) into s.dresidual
        if (model->ce_exps_kept) {
            crossentropy_backward_from_exps(s.dlogits, model->ce_sum.data(), targets, dloss, (int)BT, V, Vp);
            model->ce_exps_kept = false;  // scaled in place: a second backward must recompute them
        } else if (tp.size == 1) {
            crossentropy_softmax_backward(s.dlogits, a.logits, targets, dloss, (int)BT, V, Vp);
        } else {
            tp_crossentropy_backward(s.dlogits, a.logits, targets, dloss, (int)BT, V, v0, Vl, model->ce_max, model->ce_sum);
        }
        // the LM head's is wte's first contribution (the encoder's comes last)
        matmul_backward(s.dln, g.wte, (float*)nullptr, s.dlogits, a.lnf, p.wte, (int)BT, C, Vl, true, set_grads);
        const float* dlnf = tp_sum_rows(s.dln, sq, C, tp);
        zero(s.dresidual, sq.rows * C);
        const float* final_residual = a.residual3 + (L - 1) * R * C;
        layernorm_backward(s.dresidual, g.lnfw, g.lnfb, dlnf, final_residual, p.lnfw, a.lnf_mean, a.lnf_rstd,
                           (int)sq.rows, C);
    }

    // the blocks, last to first; dresidual holds d(loss)/d(residual stream) at the block's output
    for (int l = L - 1; l >= 0; l--) {
        const ZeroUnit* unit = zs ? &zs->units[zero_block_unit(l)] : nullptr;
        BlockParams w = zs && model->layout.zero_stage == 3
                            ? block_tensors_in_unit(zero_gather_block(zs, l, l - 1, shard_params), *unit)
                            : block_tensors<const float>(p, l, C, tp.size);
        BlockGrads gl = zs ? block_tensors_in_unit(zs->block_grads.data(), *unit) : block_tensors<float>(g, l, C, tp.size);
        BlockActs ba = block_acts(a, ls, l);
        block_recompute(w, ba, model->recompute, B, T, C, NH, tp, sq, cp);
        if (zs) zero(zs->block_grads.data(), zs->block_grads.size());
        block_backward(gl, w, ba, s, B, T, C, NH, tp, set_grads, sq, cp);
        if (zs) zero_reduce_scatter_unit(zs, zero_block_unit(l), zs->block_grads.data(), shard_grads);
    }
    if (model->first_stage()) {  // with -sq every row's gradient: wte's rows and wpe see them all
        float* dwpe = cp ? context_parallel_dwpe(cp) : g.wpe;  // -cp: its positions' rows, added into g.wpe's
        tp_encoder_backward(g.wte, dwpe, sp_all_gather(s.dresidual, sq, C, tp), inputs, B, T, C, v0, Vl, tp);
        if (cp) context_parallel_add_dwpe(*cp, g.wpe, C);
    }
    if (zs) zero_reduce_scatter_unit(zs, ZERO_OUTER_UNIT, zs->outer_grads.data(), shard_grads);
}

// One AdamW update (t = number of this update, from 1) of parameters [opt_begin, opt_end), tensor by
// tensor so that weight decay reaches only the 2-D tensors. grad_scale is the clipping factor. With
// skip_muon_matrices, the block matrices are left to Muon.
void gpt2_update_adamw(GPT2* model, float learning_rate, float weight_decay, float grad_scale, int t,
                       bool skip_muon_matrices = false) {
    AdamWHyper hyper;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (skip_muon_matrices && muon_param_is_matrix(i)) continue;
        size_t begin = std::max(model->param_offsets[i], model->opt_begin);
        size_t end = std::min(model->param_offsets[i] + model->param_sizes[i], model->opt_end);
        if (begin >= end) continue;
        float wd = param_tensor_is_decayed(i) ? weight_decay : 0.0f;
        size_t m_index = begin - model->opt_begin;
        adamw_update(model->params_memory.data() + (begin - model->params_base),
                     model->grads_memory.data() + (begin - model->grads_base),
                     model->m_memory.data() + m_index, model->v_memory.data() + m_index, end - begin, hyper,
                     learning_rate, wd, grad_scale, t);
    }
}

// One 8-bit AdamW update (llmc/adamw8.h) of parameters [opt_begin, opt_end); with ZeRO the blocks cut by
// the shard's edges are completed with the neighbours' maxima (llmc/parallel/zero_blocks.h).
void gpt2_update_adamw8(GPT2* model, const OptimizerStep& s) {
    const size_t begin = model->opt_begin;
    adamw8_update(model->params_memory.data() + (begin - model->params_base),
                  model->grads_memory.data() + (begin - model->grads_base), &model->moments8, model->blocks8, AdamWHyper(),
                  s.lr, s.weight_decay, s.grad_scale, s.t, [&](std::vector<Adamw8Edge>& edges) {
                      zero_complete_adamw8_edges(model->layout, model->shard, model->blocks8, edges, host_staging());
                  });
}

// One Muon update: AdamW on the tensors that are not block matrices, then Muon's step over the layout
// (llmc/parallel/muon_step.h) with this trainer's loops (llmc/muon.h) and host copies.
void gpt2_update_muon(GPT2* model, const OptimizerStep& s) {
    MuonHyper hyper;
    gpt2_update_adamw(model, s.lr, s.weight_decay, s.grad_scale, s.t, true);
    size_t largest = 0;  // the scratch: one matrix whole (-z 2/3, -tp), and with -tp every rank's slice of one
    for (const OptimizerTensor& t : model->optimizer.tensors) largest = std::max(largest, t.size());
    bool tp = model->layout.tp > 1;
    std::vector<float> whole(tp || model->layout.zero_stage >= 2 ? largest : 0), gathered(tp ? largest : 0), scratch;
    MuonOps<float> ops;
    ops.type = COMM_FLOAT32;
    ops.grads = model->grads_memory.data();
    ops.grads_base = model->grads_base;
    ops.whole = whole.data();
    ops.gathered = gathered.data();
    ops.momentum = [&](size_t begin, size_t end) {
        muon_momentum(model->m_memory.data() + (begin - model->opt_begin), ops.grads + (begin - ops.grads_base),
                      end - begin, hyper.momentum, s.grad_scale);
    };
    ops.orthogonalize = [&](float* matrix, size_t rows, size_t cols) {
        newton_schulz(matrix, (int)rows, (int)cols, hyper, &scratch);
    };
    ops.apply = [&](const OptimizerTensor& t, size_t begin, size_t end, const float* update) {
        float adjusted_lr = (float)(s.muon_lr * muon_lr_ratio(t.rows, t.cols));  // the whole matrix's shape
        muon_apply(model->params_memory.data() + (begin - model->params_base), update, end - begin, s.muon_lr,
                   s.weight_decay, adjusted_lr);
    };
    ops.copy2d = [](float* dst, size_t dpitch, const float* src, size_t spitch, size_t width, size_t height) {
        for (size_t r = 0; r < height; r++) memcpy(dst + r * dpitch, src + r * spitch, width * sizeof(float));
    };
    muon_step(model->optimizer, model->layout, model->shard, muon_place_of(*model), ops);
}

// One Adafactor update (llmc/adafactor.h) of every tensor, each layer's its own: factored for the 2-D
// ones (which -c decays), per element for the vectors. -z 1 first gathers the reduced gradient's shards:
// every process holds the whole (small) state and updates every parameter, the same bits everywhere.
void gpt2_update_adafactor(GPT2* model, const OptimizerStep& s) {
    AdafactorHyper hyper;
    float* params = model->params_memory.data();
    float* grads = model->grads_memory.data();
    zero_gather_reduced_gradient(model->layout, grads, model->shard.shard_size, COMM_FLOAT32);
    for (const OptimizerTensor& t : model->optimizer.tensors) {
        float* state = model->v_memory.data() + t.state_offset;
        if (t.is_matrix()) {
            adafactor_update_matrix(params + t.offset, grads + t.offset, state, state + t.rows, t.rows, t.cols, hyper,
                                    s.lr, s.weight_decay, s.grad_scale, s.t);
        } else {
            adafactor_update_vector(params + t.offset, grads + t.offset, state, t.cols, hyper, s.lr, 0.0f,
                                    s.grad_scale, s.t);
        }
    }
}

// One optimizer update of the step (-opt), for parameters [opt_begin, opt_end) and what the optimizer
// needs beyond them.
void gpt2_update(GPT2* model, const OptimizerStep& s) {
    switch (model->optimizer.kind) {
        case OPT_ADAMW: gpt2_update_adamw(model, s.lr, s.weight_decay, s.grad_scale, s.t); break;
        case OPT_MUON: gpt2_update_muon(model, s); break;
        case OPT_ADAFACTOR: gpt2_update_adafactor(model, s); break;
        case OPT_ADAMW8: gpt2_update_adamw8(model, s); break;
    }
}

// The end of a step, after every micro-step's backward: the gradients made complete over the layout
// (llmc/parallel/grad_completion.h: the tensor-parallel replicas' broadcast, the stages' shared tensors'
// sums, the data-parallel sum as the ZeRO stage cuts it); their global norm follows (gpt2_grad_norm).
// loss_scale: the S the gradients carry (the run loop's; 1 here, where no loss scaling runs).
void gpt2_complete_gradients(GPT2* model, float loss_scale) {
    const ParallelLayout& lay = model->layout;
    float* grads = model->grads_memory.data();
    // -tp and -pp come with -z 0 or 1: the gradient array is whole (grads_base 0)
    complete_model_parallel_gradients(lay, grads, 0, model->num_parameters, model->param_offsets, model->param_sizes,
                                      COMM_FLOAT32);
    if (model->compression.on()) {
        grad_compression_reduce(lay.dp_group, &model->compression, grads, loss_scale);
    } else if (model->local.every == 0) {  // -lh: each replica's own until it synchronizes
        reduce_gradients_over_replicas(lay, grads, model->num_parameters, model->shard.shard_size, COMM_FLOAT32);
    }
}

// The global norm of the completed gradients: this process's ranges (its shard, its slices), summed
// over the groups that split them.
double gpt2_grad_norm(GPT2* model) {
    const ParallelLayout& lay = model->layout;
    float* grads = model->grads_memory.data();
    double sum_sq = 0.0;
    for (auto r : gradient_norm_ranges(lay, model->param_offsets, model->param_sizes, model->opt_begin, model->opt_end)) {
        sum_sq += sum_of_squares(grads + (r.first - model->grads_base), r.second - r.first);
    }
    return gradient_norm(lay, sum_sq);
}

// The update of a step whose norm was finite (llmc/run/loss_scaler.h decides): the optimizer's, with the
// clipping factor, then with -z 1 and -z 2 every process gathers the others' updated shards (-z 3 keeps
// its shard only: the next forward gathers what it needs; Adafactor updated every parameter everywhere).
void gpt2_apply_update(GPT2* model, const OptimizerStep& settings) {
    gpt2_update(model, settings);
    if (model->optimizer.kind != OPT_ADAFACTOR) {  // Adafactor updated every parameter on every process
        zero_gather_updated_parameters(model->layout, model->params_memory.data(), model->shard.shard_size, COMM_FLOAT32);
    }
}

// The full parameters (N) on process 0, for a model file or a sample: with -z 3 the shards are gathered
// there for the moment (empty elsewhere); otherwise every process has them already.
std::vector<float> gpt2_full_parameters(const GPT2* model) {
    const ProcessGroup& pg = model->layout.dp_group;
    const std::vector<float>& mine = model->params_memory;
    if (model->layout.zero_stage != 3) return std::vector<float>(mine.begin(), mine.begin() + model->num_parameters);
    std::vector<float> full(pg.rank == 0 ? model->shard.padded_size : 0);
    gather_to_rank0(pg, mine.data(), model->shard.shard_size, full.data());
    full.resize(pg.rank == 0 ? model->num_parameters : 0);
    return full;
}

// ----------------------------------------------------------------------------
// The training run: the model's side of llmc/run/run_loop.h

// One sample (llmc/run/sample_text.h has the loop and the settings): the logits of the window's last position.
void generate_sample(GPT2* model, const SampleSettings& settings, uint64_t* rng, const TokenizerFile* tok) {
    generate_sample(settings, model->config.vocab_size, rng, tok, [&](const int* window, int length) {
        gpt2_forward(model, window, nullptr, 1, length);
        return (const float*)model->acts.logits + (size_t)(length - 1) * model->config.padded_vocab_size;
    });
}

// A sample from process 0. With -z 3 every process gathers the shards for it, and process 0 samples
// from a full copy of the parameters made for the moment.
void gpt2_sample(GPT2* model, TrainRun* run) {
    const ParallelLayout& lay = model->layout;
    if (lay.zero_stage == 3 || lay.cp > 1) {  // -cp: a window's positions are not split
        std::vector<float> full = gpt2_full_parameters(model);
        if (lay.world.rank == 0) {
            GPT2 whole;
            gpt2_init_from(&whole, model->config, full);
            gpt2_allocate_activations(&whole, 1, run->args.T);
            generate_sample(&whole, run->sample_settings, &run->sampler_rng, run_tokenizer(*run));
        }
    } else if (lay.world.rank == 0) {
        generate_sample(model, run->sample_settings, &run->sampler_rng, run_tokenizer(*run));
    }
}

// HellaSwag accuracy (llmc/run/hellaswag.h), 4 rows of the longest example's length per forward. The
// activations grow to hold them if the training batch is smaller; training then uses a part of them.
HellaSwagResult hellaswag_eval(GPT2* model, const HellaSwagSet& set, const TrainArgs& args, const ProcessGroup& pg,
                               std::vector<HellaSwagScore>* details = nullptr) {
    const int R = 4, Tr = set.longest_row;
    if (Tr > model->config.max_seq_len) {
        fatal("HellaSwag: an example needs %d tokens, more than the model's maximum %d", Tr, model->config.max_seq_len);
    }
    if (model->acts_memory.empty() || (size_t)R * Tr > (size_t)model->batch_size * model->seq_len ||
        Tr > model->seq_len) {
        gpt2_allocate_activations(model, std::max({model->batch_size, args.B, R}), std::max({model->seq_len, args.T, Tr}));
    }
    return hellaswag_evaluate_group(pg, set, args.hellaswag_examples, R, Tr,
        [&](const int* inputs, const int* targets, int rows, int cols, float* losses) {
            gpt2_forward(model, inputs, targets, rows, cols);
            std::copy(model->acts.losses, model->acts.losses + (size_t)rows * cols, losses);
        }, details);
}

// The model's side of a pipeline schedule (llmc/parallel/pipeline.h) over micro-batches of (B, T) tokens, micro-batch
// i at inputs + i * B * T (and targets likewise): each micro-batch's forward and backward in its own
// activation slot, with dloss, or INFINITY for bad_micro (-ni, testing).
PipelineStageHooks gpt2_pipeline_hooks(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss,
                                       int bad_micro) {
    size_t BT = (size_t)B * T, L = model->config.num_layers;
    // a stage's input and output: its rows of the residual stream (all B·T without -sq)
    size_t BTC = sp_rows_per_rank(BT / model->layout.cp, model->layout.tp, model->layout.sequence_parallel) * model->config.channels;
    PipelineStageHooks h;
    h.boundary_elements = BTC;
    h.select = [=](int micro) { gpt2_use_activation_slot(model, micro % model->act_slots); };
    h.forward = [=](int micro) { return (double)gpt2_forward(model, inputs + micro * BT, targets + micro * BT, B, T); };
    h.backward = [=](int micro) {
        gpt2_backward(model, inputs + micro * BT, targets + micro * BT, B, T, micro == bad_micro ? INFINITY : dloss);
    };
    h.activation_in = [=] { return model->acts.encoded; };
    h.activation_out = [=] { return model->acts.residual3 + (L - 1) * BTC; };
    h.gradient_in = h.gradient_out = [=] { return model->scratch.dresidual; };
    return h;
}

// A step's forwards and backwards (llmc/run/run_loop.h's forward_backward): micro-batch after micro-batch,
// or through the pipeline's schedule, whose forwards and backwards interleave (the breakdown counts all
// of it as forward; *note gets the measured bubble).
double gpt2_forward_backward(GPT2* model, PipelineComm* pipe, const std::string& schedule, const StepBatches& b,
                             float dloss, int bad_micro, PhaseTimer* timer, std::string* note) {
    if (model->layout.pp > 1) {
        phase_begin(timer, PHASE_FORWARD);
        PipelineStepResult r = pipeline_run(
            pipe, schedule, b.count, gpt2_pipeline_hooks(model, b.inputs.data(), b.targets.data(), b.B, b.T, dloss, bad_micro));
        phase_end(timer);
        timer->times.interleaved = true;
        *note = r.note;
        return r.loss_sum;
    }
    double loss_sum = 0.0;
    for (int micro = 0; micro < b.count; micro++) {
        phase_begin(timer, PHASE_FORWARD);
        loss_sum += gpt2_forward(model, b.inputs_of(micro), b.targets_of(micro), b.B, b.T);
        phase_end(timer);
        phase_begin(timer, PHASE_BACKWARD);
        gpt2_backward(model, b.inputs_of(micro), b.targets_of(micro), b.B, b.T, micro == bad_micro ? INFINITY : dloss);
        phase_end(timer);
    }
    return loss_sum;
}

// The mean loss of one evaluation batch; a pipeline passes it through its stages (0 before the last).
double gpt2_eval_loss(GPT2* model, PipelineComm* pipe, const int* inputs, const int* targets, int B, int T) {
    if (model->layout.pp > 1) return pipeline_forward_only(pipe, gpt2_pipeline_hooks(model, inputs, targets, B, T, 0.0f, -1));
    return gpt2_forward(model, inputs, targets, B, T);
}

// The model's state as a checkpoint reads it (llmc/run/checkpoint_state.h decides who writes what across
// the layout): the parameters (-z 3: gathered to process 0, every process taking part) and the optimizer's
// vectors as they are; host memory is what MPI moves.
CheckpointModel gpt2_checkpoint_model(GPT2* model) {
    CheckpointModel c = checkpoint_model_of(*model);
    c.model_version = MODEL_VERSION_FP32;
    c.parameters_collective = model->layout.zero_stage == 3;
    c.parameters = [model] { return gpt2_full_parameters(model); };
    c.optimizer_vector = [model](CheckpointVector which) { return which == CKPT_M ? model->m_memory : model->v_memory; };
    c.optimizer_parameters = [model] {  // held by every process: its shard with -z 3, all of them otherwise
        auto first = model->params_memory.begin() - model->params_base;
        return std::vector<float>(first + model->opt_begin, first + model->opt_end);
    };
    c.moments8 = [model] { return model->moments8; };
    c.own_kinds = grad_compression_own_kinds(model->compression);
    if (model->local.every) c.own_kinds.push_back(STATE_SECTION_LOCAL_STEPS);
    c.own_sections = [model] {
        std::vector<StateSection> own = grad_compression_sections(model->compression);
        if (model->local.every) own.push_back(local_steps_section(model->local, model->params_memory.data(), model->num_parameters));
        return own;
    };
    c.staging = host_staging();
    return c;
}

// Resumes the optimizer state, data position, sampler and loss scaler (and the parameters, from master
// weights) from checkpoint run->resume_step, whatever layout or trainer wrote it.
void gpt2_resume(GPT2* model, TrainRun* run) {
    TrainState state = checkpoint_restore_state(gpt2_checkpoint_model(model), run);
    model->m_memory = state.m;
    model->v_memory = state.v;
    if (model->optimizer.kind == OPT_ADAMW8) model->moments8 = state.moments8;
    if (model->compression.on()) grad_compression_restore(&model->compression, state.sections);
    if (model->local.every) local_steps_restore(&model->local, state.sections, model->params_memory.data(), model->num_parameters);
    for (const StateSection& s : state.sections) {  // the CUDA trainer's -fp8 1 (llmc/fp8_linear.cuh)
        if (s.kind == STATE_SECTION_FP8_SCALES) printf("resume: the checkpoint holds FP8 scaling state; this trainer has no FP8 and drops it\n");
    }
    // Master weights in the checkpoint (the CUDA trainer's -w 1, llm.c's) are the fp32 parameters, more exact
    // than a bf16 model file: each process takes its optimizer range's, then they are shared as after an update.
    if (!state.master.empty()) {
        std::copy(state.master.begin(), state.master.end(), model->params_memory.begin() + (model->opt_begin - model->params_base));
        zero_gather_updated_parameters(model->layout, model->params_memory.data(), model->shard.shard_size, COMM_FLOAT32);
    }
}


// This process's part of the model for the layout: its pipeline stage's layers, its tensor-parallel
// slices of them, and its ZeRO shard of what the optimizer updates; the optimizer's state (-opt); the
// gradients' compression (-gc: llmc/parallel/grad_compression.h) or local steps (-lh: local_steps.h).
void gpt2_distribute(GPT2* model, const ParallelLayout& layout, OptimizerKind optimizer, const TrainArgs& args) {
    const ProcessGroup& dp = layout.dp_group;
    model->layout = layout;
    model->optimizer.kind = optimizer;
    gpt2_keep_local_part(model);
    gpt2_setup_optimizer(model);
    optimizer_print(model->optimizer, model->layout, model->opt_begin, model->opt_end, model->shard, model->num_parameters,
                    model->v_memory.size());
    zero_memory_print(layout.zero_stage, model->num_parameters, dp.size, model->memory,
                      optimizer_bytes_per_parameter(optimizer));
    grad_compression_start(args.grad_compression, args.grad_rank, dp, optimizer_tensors(model->config), model->num_parameters,
                           &model->compression);
    local_steps_start(args.local_steps, args.local_outer, dp, model->params_memory.data(), model->num_parameters, &model->local);
}

size_t gpt2_allocated_bytes(const GPT2* model) {
    size_t floats = model->params_memory.size() + model->grads_memory.size() + model->m_memory.size() +
                    model->v_memory.size() + model->acts_memory.size() + model->scratch_memory.size();
    floats += model->local.anchor.size() + model->local.momentum.size();
    return floats * sizeof(float) + model->cp.bytes() + model->moments8.bytes() + model->memory.gather_params + model->memory.gather_grads +
           model->compression.state_bytes();
}

// The activations of a step's micro-batches (B, T): one set, or on a pipeline stage one per micro-batch
// in flight (llmc/parallel/pipeline.h), with the stage's report; then this process's memory.
void gpt2_allocate_for_run(GPT2* model, const TrainArgs& args, int m) {
    const std::string& schedule = args.pipeline_schedule;
    int pp = model->layout.pp, stage = model->layout.pp_rank;
    model->recompute = args.recompute;
    gpt2_allocate_activations(model, args.B, args.T, pp > 1 ? pp_activation_slots(schedule, pp, stage, m) : 1);
    if (pp > 1) {
        printf("%s\n", pipeline_describe(pp, stage, model->layout.layer_begin, model->layout.layer_end,
                                         model->model_config.num_layers, schedule, m,
                                         model->acts_per_slot * sizeof(float)).c_str());
    }
    if (model->cp.on()) {
        const GPT2Config& c = model->config;
        printf("%s\n", context_parallel_describe(model->cp, args.B, args.T, c.channels / model->layout.tp, c.num_layers, m,
                                                 args.recompute).c_str());
    }
    auto mib = [](size_t floats) { return floats * sizeof(float) / 1048576.0; };
    const char* state = model->optimizer.kind == OPT_ADAMW ? "AdamW moments" : "optimizer state";
    printf("memory per process: parameters %.3f MiB, gradients %.3f MiB, %s %.3f MiB, activations %.3f "
           "MiB, backward scratch %.3f MiB\n", mib(model->params_memory.size()), mib(model->grads_memory.size()), state,
           mib(model->m_memory.size() + model->v_memory.size()) + model->moments8.bytes() / 1048576.0, mib(model->acts_memory.size()),
           mib(model->scratch_memory.size()));
}

// The run loop's hooks (llmc/run/run_loop.h) for this model, layout and ZeRO stage. pipe and note live as
// long as the hooks: the pipeline's transfers and the last step's measured bubble.
RunHooks gpt2_run_hooks(GPT2* model, const TrainArgs& args, PipelineComm* pipe, std::string* note) {
    const ProcessGroup& dp = model->layout.dp_group;
    std::string schedule = args.pipeline_schedule;
    RunHooks h;
    h.zero_grad = [=] { gpt2_zero_grad(model); };
    h.forward_backward = [=](const StepBatches& b, float dloss, int bad_micro, PhaseTimer* timer) {
        return gpt2_forward_backward(model, pipe, schedule, b, dloss, bad_micro, timer, note);
    };
    h.complete_gradients = [=](float S) { gpt2_complete_gradients(model, S); };
    h.grad_norm = [=] { return gpt2_grad_norm(model); };
    h.update = [=](bool apply, const OptimizerStep& settings) {
        if (apply) gpt2_apply_update(model, settings);
        if (local_steps_sync_due(model->local, settings.step, settings.last)) {
            local_steps_sync(dp, &model->local, model->params_memory.data(), model->num_parameters);
        }
    };
    h.eval_loss = [=](const int* in, const int* tg, int B, int T) { return gpt2_eval_loss(model, pipe, in, tg, B, T); };
    h.hellaswag = [=, &dp, &args](const HellaSwagSet& set) { return hellaswag_eval(model, set, args, dp); };
    h.save_checkpoint = [=](const TrainRun& run, int step) { checkpoint_save_state(gpt2_checkpoint_model(model), run, step); };
    h.sample = [=](TrainRun* run) { gpt2_sample(model, run); };
    h.step_note = [=] { return *note; };
    h.comm_bytes = [] { return (long long)comm_bytes_moved; };
    if (args.peak_gflops <= 0) h.measure_peak = [] { return cpu_fma_peak_flops(); };  // not for -pk
    run_hooks_sums(&h, &model->layout);
    return h;
}

#ifndef TESTING
int main(int argc, char** argv) {
    stop_signals_install();  // SIGTERM, SIGUSR1: stop at a step boundary, even one still to come (stop_signal.h)
    ProcessGroup world = process_group_init(&argc, &argv);
    TrainArgs args;
    parse_args(argc, argv, &args, false);
    start_up_check(world, "train_gpt2 (fp32 CPU)", args.launch.timeout_s);  // watched from here on; one program
    stdout_for_process(world.rank);
    printf("train_gpt2 (fp32 CPU): %d process(es) x %d OpenMP threads\n", world.size, omp_get_max_threads());
    output_dir_lock_for_run(args, world.rank);

    // the model: from the newest complete checkpoint when resuming (-y 1), else from -e
    int resume_step = resume_step_from_args(args, world.rank);
    OptimizerKind optimizer = OPT_ADAMW;
    optimizer_from_name(args.optimizer, &optimizer);  // checked by parse_args
    std::string model_name = resume_step >= 0 ? checkpoint_model_path(args.output_dir, resume_step) : args.model;
    {  // the memory plan from the shapes alone, before anything is read or allocated: -P 1 prints it and
       // stops; a run whose arrays alone exceed the host's available memory stops here
        GPT2Config shape = gpt2_config_from_flag(model_name);
        ParallelLayout layout = parallel_layout_from_args(world, args, shape);
        MemoryPlan plan = gpt2_memory_plan(shape, layout, optimizer, args, validate_batch_args(args, shape, layout_data_size(layout)));
        plan.capacity = host_available_bytes();
        plan.place = "the host (MemAvailable, shared by the processes on it)";
        if (args.plan) {
            print_memory_plan(plan);
            process_group_finalize(world);
            return EXIT_SUCCESS;
        }
        if (!plan.fits()) {
            fatal("the run's arrays need %.1f MiB per process (-P 1 shows them) and the host has %.1f MiB available: "
                  "nothing was allocated. Ways to fit: a smaller -b (-d keeps the total batch by accumulation), -r 3, "
                  "or more processes with -z 1, 2 or 3, -tp or -pp", plan.total() / 1048576.0, plan.capacity / 1048576.0);
        }
    }
    GPT2 model;
    GPT2Config cfg;
    std::vector<float> params = gpt2_parameters_from_flag(model_name, (unsigned)args.seed, &cfg);
    gpt2_init_from(&model, cfg, params);
    print_model_summary(cfg, model.num_parameters);
    check_same_config(world, run_description(args, cfg, params.data(), model.num_parameters, resume_step));
    std::vector<float>().swap(params);

    // the process layout (llmc/parallel/layout.h) and this process's part of the model
    ParallelLayout layout = parallel_layout_from_args(world, args, cfg);
    printf("layout: %s\n", parallel_layout_describe(layout).c_str());
    gpt2_distribute(&model, layout, optimizer, args);

    // the run: data of this data-parallel rank, schedules, evaluation, sampling (llmc/run/run_loop.h)
    TrainRun run;
    train_run_init(&run, args, cfg, world, layout_data_rank(layout), layout_data_size(layout), resume_step, false);
    gpt2_allocate_for_run(&model, args, run.data.grad_accum_steps);
    {
        size_t planned = gpt2_memory_plan(cfg, layout, optimizer, args, run.data.grad_accum_steps).total();
        size_t allocated = gpt2_allocated_bytes(&model);
        printf("memory: %zu bytes planned (-P 1), %zu allocated (the model's arrays): %+.2f%%\n", planned, allocated,
               100.0 * ((double)allocated - (double)planned) / (double)planned);
    }
    // MFU's denominator: this process's threads' FMA peak (llmc/run/cpu_peak.h), or -pk; the numerator its
    // share of the model's FLOPs (its stage's layers, 1/tp of them)
    run.peak_flops = args.peak_gflops > 0 ? args.peak_gflops * 1e9 : cpu_fma_peak_flops();
    printf("peak: %.1f GFLOP/s fp32 (%s)\n", run.peak_flops / 1e9,
           args.peak_gflops > 0 ? "-pk" : "measured FMA loop, llmc/run/cpu_peak.h; -pk to set");
    run.flops_per_step = flops_per_token(model.config, args.T) * args.B * args.T * run.data.grad_accum_steps / (layout.tp * layout.cp);
    // -ni (testing): the last stage of the first pipeline stands for one bad micro-batch
    run.injects_bad_micro = layout.tp_rank == 0 && layout.dp_rank == 0 && layout.pp_rank == layout.pp - 1;
    // the peak resident memory reported at the end is that of training, not of loading the full model
    bool peak_from_here = peak_resident_reset();
    if (resume_step >= 0) gpt2_resume(&model, &run);

    PipelineComm pipe;
    pipe.pp = layout.pp_group;
    std::string note;
    int status = train_run_loop(&run, gpt2_run_hooks(&model, args, &pipe, &note));
    printf("peak resident memory of process 0: %.1f MiB (getrusage, %s)\n", peak_resident_bytes() / 1048576.0,
           peak_from_here ? "since training began" : "since start-up");
    process_group_finalize(world);
    return status;
}
#endif
