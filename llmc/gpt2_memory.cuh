// The CUDA trainer's memory (train_gpt2.cu): the model state on the device (parameters, gradients, the
// optimizer's state; with -z 2 and 3 a shard of them and the packed and gathering buffers of
// llmc/parallel/zero_device.cuh; with -oo 1 the optimizer's state in pinned host memory), Muon's scratch
// and the activation slots, allocated from the plan (llmc/gpt2_plan.cuh: sizes, offsets, shard, ZeRO
// stage, recompute level) and freed. Templates on the trainer's model struct, which holds the plan and
// the pointers (train_gpt2.cu's GPT2: what each one holds is said there).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gpt2_config.h"
#include "cuda_common.cuh"
#include "attention.cuh"  // FLASH_ATTENTION_AVAILABLE
#include "gpt2_activations.cuh"
#include "gpt2_plan.cuh"
#include "muon.cuh"
#include "optimizer_offload.cuh"
#include "parallel/grad_compression.cuh"
#include "parallel/local_steps.cuh"
#include "parallel/zero_device.cuh"

// Points the 4 outer tensors (wte, wpe, lnfw, lnfb) one after another into `packed` (bucket L's packed
// layout, llmc/parallel/grad_buckets.h); the stacked block tensors stay null (-z 2, 3 use packed blocks).
inline void point_outer_packed(ParameterTensorsOf<floatX>* t, floatX* packed, const size_t* sizes) {
    *t = ParameterTensorsOf<floatX>{};
    t->wte = packed;
    t->wpe = t->wte + sizes[P_WTE];
    t->lnfw = t->wpe + sizes[P_WPE];
    t->lnfb = t->lnfw + sizes[P_LNFW];
}

// Block l's 12 slices, packed one after another from `packed` (a bucket's buffer, gradients or gathered
// parameters).
template <typename T, typename Model>
BlockTensorsOf<T> packed_block(T* packed, const Model* model) {
    T* at[NUM_PARAMETER_TENSORS];
    for (int i = P_LN1W; i <= P_FCPROJB; i++) {
        at[i] = i == P_LN1W ? packed : at[i - 1] + model->param_sizes[i - 1] / model->config.num_layers;
    }
    return {at[P_LN1W], at[P_LN1B], at[P_QKVW], at[P_QKVB], at[P_ATTPROJW], at[P_ATTPROJB],
            at[P_LN2W], at[P_LN2B], at[P_FCW],  at[P_FCB],  at[P_FCPROJW],  at[P_FCPROJB]};
}

// Where flat element e of the parameters (of the gradients) is on the device: -z 3 (-z 2 and 3) keeps a
// shard of them, whose element 0 is flat element rank * shard_size.
template <typename Model>
floatX* param_at(Model* model, size_t e) {
    return model->params_memory + (model->sharded_params ? e - shard_first(model->shard) : e);
}
template <typename Model>
floatX* grad_at(Model* model, size_t e) {
    return model->grads_memory + (model->packed_grads ? e - shard_first(model->shard) : e);
}

// The model state on the device (with -oo 1 the optimizer's in pinned host memory): parameters and
// gradients, the flat arrays padded to whole shards with several processes (llmc/parallel/grad_buckets.h;
// with -z 2 and 3 a shard of them, and the packed and gathering buffers), the optimizer's state (with
// -z 1 to 3 for this process's shard only); the tensors pointed into them. Everything zero; gpt2_build
// fills the parameters.
template <typename Model>
void gpt2_allocate_model_state(Model* model) {
    size_t opt_n = model->opt_end - model->opt_begin;
    size_t grad_n = gradient_array_elements(model), param_n = parameter_array_elements(model);
    cudaCheck(cudaMalloc(&model->params_memory, param_n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&model->grads_memory, grad_n * sizeof(floatX)));
    cudaCheck(cudaMemset(model->params_memory, 0, param_n * sizeof(floatX)));
    cudaCheck(cudaMemset(model->grads_memory, 0, grad_n * sizeof(floatX)));
    if (model->packed_grads) {  // -z 2, 3: the packed gradient buffers; -z 3: the gathering ones
        zero_device_allocate(&model->zero, &model->layout.dp_group, &model->shard, &model->grad_buckets,
                             model->params_memory, model->grads_memory, model->sharded_params, model->stream);
    }
    size_t m_n, v_n, master_n;
    optimizer_state_floats(model, opt_n, &m_n, &v_n, &master_n);
    size_t opt_floats = m_n + v_n + master_n;
    if (model->offload) {  // -oo 1: pinned host memory, AdamW on the CPU
        cudaCheck(cudaMallocHost(&model->opt_memory, std::max<size_t>(opt_floats, 1) * sizeof(float)));
        memset(model->opt_memory, 0, opt_floats * sizeof(float));
        offload_init(&model->offloaded, opt_n);
    } else {
        cudaCheck(cudaMalloc(&model->opt_memory, std::max<size_t>(opt_floats, 1) * sizeof(float)));
        cudaCheck(cudaMemset(model->opt_memory, 0, opt_floats * sizeof(float)));
    }
    model->m_memory = model->opt_memory;
    model->v_memory = model->opt_memory + m_n;
    model->master_memory = model->use_master_weights ? model->opt_memory + m_n + v_n : nullptr;
    if (model->optimizer.kind == OPT_ADAMW8) {  // its codes and block maxima (llmc/adamw8.cuh)
        adamw8_gpu_allocate(&model->adamw8, model->optimizer.tensors, model->opt_begin, model->opt_end, model->layout.dp);
    }
    if (model->sharded_params) {
        point_outer_packed(&model->params, model->zero.gathered_outer, model->param_sizes);
    } else {
        point_parameters_at(&model->params, model->params_memory, model->param_offsets);
    }
    if (model->packed_grads) {
        point_outer_packed(&model->grads, model->zero.packed_outer, model->param_sizes);
    } else {
        point_parameters_at(&model->grads, model->grads_memory, model->param_offsets);
    }
    print_model_state_allocation(model);
}

// -opt muon's Newton-Schulz scratch (not model state: allocated after the state's measurement)
template <typename Model>
void gpt2_allocate_muon_scratch(Model* model) {
    // Muon's momentum lives in m at the block matrices' places (their v stays 0), as in the CPU trainer;
    // its scratch is not model state (allocated after the measurement above)
    size_t C = model->config.channels, bytes = muon_scratch_bytes(model);
    cudaCheck(cudaMalloc(&model->muon_memory, bytes));
    size_t own = muon_scratch_layout(model->muon_memory, 4 * C * C, C, &model->muon_scratch);
    if (model->layout.tp > 1) {  // tp x a slice, then the whole matrix (llmc/parallel/muon_step.h)
        model->muon_gathered = (floatX*)((char*)model->muon_memory + own);
        model->muon_whole = model->muon_gathered + 4 * C * C;
    } else if (model->layout.zero_stage >= 2) {  // a matrix gathered from the shards
        model->muon_whole = (floatX*)((char*)model->muon_memory + own);
    }
    printf("optimizer: -opt muon: the 4 block matrices of each layer orthogonalized by Newton-Schulz in %s "
           "(cuBLASLt), AdamW on the rest; %.1f MiB of scratch%s\n", PRECISION_NAME, bytes / 1048576.0,
           model->layout.dp > 1 ? "; each matrix by its owner, then broadcast" : "");
}

// Makes activation slot k the current one (a pipeline's micro-batch, llmc/parallel/pipeline.h).
template <typename Model>
void gpt2_use_activation_slot(Model* model, int k) {
    model->acts = model->slots[k];
    model->buckets = &model->slot_buckets[k];
}

// The activations for the run's (B, T) (llmc/gpt2_activations.cuh), at the recompute level every process
// agrees on: act_slots sets of them in one allocation (a pipeline stage keeps one per micro-batch in
// flight) and the pinned host buffers the loss and the norm come back through; with a report of what
// each recompute level and attention path would take.
template <typename Model>
void gpt2_allocate_activations(Model* model, int B, int T) {
    bool flash = model->flash_attention;
    model->recompute = agree_recompute(model, B, T, model->recompute);
    size_t bytes = activation_bytes(model, B, T, model->recompute, flash);
    cudaCheck(cudaMalloc(&model->acts_memory, bytes));
    model->slots.resize(model->act_slots);
    model->slot_buckets.resize(model->act_slots);
    const ParallelLayout& lay = model->layout;  // -cp: T/cp positions of each row (llmc/parallel/context_split.h)
    size_t slots_bytes = layout_activations(model->slots.data(), model->acts_memory, model->config, B, T / lay.cp,
                                            model->recompute, flash, model->act_slots, model->last_stage(), lay.tp,
                                            lay.sequence_parallel, lay.cp, lay.cp_mode, model->fp8_head,
                                            model->head_chunks);
    const GPT2Config& c = model->config;
    context_parallel_start(lay.cp_group, lay.cp_mode, B, T, c.channels, c.channels / lay.tp, c.num_heads / lay.tp, &model->cp,
                           false);
    for (int k = 0; k < model->act_slots; k++) model->slot_buckets[k].device = model->slots[k].encoder_buckets;
    gpt2_use_activation_slot(model, 0);
    // a pipeline stage's received gradient: after the slots, in the same allocation (activation_bytes counts it)
    if (model->layout.pp > 1) model->pipe_grad_in = reinterpret_cast<floatX*>(model->acts_memory + slots_bytes);
    if (model->fp8_matmuls) {  // -fp8: its state and scratch last (activation_bytes counts them)
        size_t C = model->config.channels, rows = (size_t)B * (T / lay.cp), fp8 = fp8_activation_bytes(model, B, T);
        size_t Vl = fp8_head_rows(model);
        fp8_training_start(&model->fp8, model->acts_memory + bytes - fp8, model->model_config.num_layers, model->fp8_head,
                           rows, C, C / lay.tp, Vl);
        printf("%s; %.1f MiB of FP8 state and scratch (in the activations below)\n",
               fp8_training_describe((long)rows, (int)C, (int)(C / lay.tp), model->fp8_head, (long)Vl).c_str(),
               fp8 / 1048576.0);
    }
    model->batch_size = B;
    model->seq_len = T;
    cudaCheck(cudaMallocHost(&model->host_losses, (size_t)B * T * sizeof(float)));
    cudaCheck(cudaMallocHost(&model->host_norm_sq, NUM_PARAMETER_TENSORS * sizeof(float)));
    size_t none = activation_bytes(model, B, T, 0, flash);
    printf("activations: %.1f MiB for B=%d T=%d (recompute -r %d saves %.1f MiB; -r 0/1/2/3:", bytes / 1048576.0, B,
           T, model->recompute, (none - bytes) / 1048576.0);
    for (int r = 0; r <= 3; r++) printf(" %.1f", activation_bytes(model, B, T, r, flash) / 1048576.0);
    printf(" MiB)\n");
    if (model->head_chunks > 0 && model->last_stage()) {
        size_t BT = (size_t)B * (T / lay.cp), rows = head_chunk_rows(BT, model->head_chunks, model->fp8_head);
        size_t row_bytes = (size_t)model->config.padded_vocab_size / lay.tp * (sizeof(floatX) + (model->fp8_head ? 1 : 0));
        printf("LM head: %zu chunk(s) of up to %zu rows (-lc %d), each with its gradient at once: logits of %.1f MiB "
               "instead of %.1f MiB\n", (BT + rows - 1) / rows, rows, model->head_chunks, rows * row_bytes / 1048576.0,
               BT * row_bytes / 1048576.0);
    }
    if (model->cp.on() && model->cp.mode == ContextMode::ring) {
        printf("attention: -cpm ring, %s on each pair of chunks, keeping each row's log-sum-exp (no (T, T) scores)\n",
               flash ? "flash (-fa 1)" : "plain kernels");
    } else if (FLASH_ATTENTION_AVAILABLE) {
        size_t with_flash = activation_bytes(model, B, T, model->recompute, true);
        size_t with_cublas = activation_bytes(model, B, T, model->recompute, false);
        printf("attention: %s; activations with flash (-fa 1) %.1f MiB, with cuBLAS + softmax (-fa 0) %.1f MiB\n",
               flash ? "flash (-fa 1)" : "cuBLAS + softmax (-fa 0)", with_flash / 1048576.0, with_cublas / 1048576.0);
    } else {
        printf("attention: cuBLAS + softmax, storing (B, NH, T, T) per layer (the fp32 build has no flash attention: "
               "it needs the bf16 tensor cores)\n");
    }
}

// The fp32 weights -lh averages: the master weights, or the fp32 build's parameters (gpt2_plan_init
// refuses -lh with neither).
template <typename Model>
float* gpt2_fp32_weights(Model* model) { return model->master_memory ? model->master_memory : (float*)model->params_memory; }

// After the run: where -oo 1's host updates spent their time, and -at 1's choices.
template <typename Model>
void print_run_reports(const Model* model) {
    if (model->offload) offload_print_report(model->offloaded);
    if (matmul_algorithms.autotune) printf("%s\n", matmul_autotune_report().c_str());
}

// Frees everything gpt2_setup and gpt2_allocate_activations allocated, and the stream.
template <typename Model>
void gpt2_free(Model* model) {
    cudaCheck(cudaFree(model->params_memory));
    cudaCheck(cudaFree(model->grads_memory));
    zero_device_free(&model->zero);
    if (model->offload) {
        cudaCheck(cudaFreeHost(model->opt_memory));
        offload_free(&model->offloaded);
    } else {
        cudaCheck(cudaFree(model->opt_memory));
    }
    cudaCheck(cudaFree(model->muon_memory));
    adamw8_gpu_free(&model->adamw8);
    local_steps_gpu_free(&model->local);
    grad_compression_gpu_free(&model->compression);
    cudaCheck(cudaFree(model->acts_memory));
    cudaCheck(cudaFreeHost(model->host_losses));
    cudaCheck(cudaFreeHost(model->host_norm_sq));
    cudaCheck(cudaStreamDestroy(model->stream));
}

