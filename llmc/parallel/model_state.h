// Moving state between the whole model and this process's part of it: a vector in checkpoint order
// (the parameters, or an AdamW moment) cut by the process layout (layout.h) into this process's
// pipeline stage (its layers, pipeline.h), its tensor-parallel slices of them (tensor_parallel.h) and
// the ZeRO shard its optimizer updates (zero.h); and put back together.
//
// A checkpoint written with tensor or pipeline parallelism holds the whole model and the whole
// optimizer state (written by world rank 0), so any layout reads it with layout_local_part: resuming
// under another layout is one call per vector.
#pragma once

#include <algorithm>
#include <vector>

#include "../gpt2_config.h"
#include "../optimizer.h"
#include "comm.h"
#include "layout.h"
#include "pipeline.h"
#include "tensor_parallel.h"
#include "zero.h"

// The model of this pipeline stage: the whole model's shapes with its layers only.
inline GPT2Config layout_stage_config(const ParallelLayout& lay, const GPT2Config& model_cfg) {
    return pp_layers_config(model_cfg, lay.layer_begin, lay.layer_end);
}

// Elements [begin, end) of this process's part of `full` (the whole model's vector, checkpoint order):
// its stage's layers and the shared tensors, then its tensor-parallel slices of them.
inline std::vector<float> layout_local_part(const ParallelLayout& lay, const GPT2Config& model_cfg,
                                            const std::vector<float>& full, size_t begin, size_t end) {
    GPT2Config stage_cfg = layout_stage_config(lay, model_cfg);
    std::vector<float> stage(num_parameters(stage_cfg));
    pp_copy_stage(model_cfg, lay.layer_begin, lay.layer_end, const_cast<float*>(full.data()), stage.data(), true);
    size_t sizes[NUM_PARAMETER_TENSORS], local_n = 0;
    tp_param_sizes(stage_cfg, lay.tp, sizes);
    for (size_t s : sizes) local_n += s;
    std::vector<float> local(local_n);
    tp_copy_slices(stage_cfg, lay.tp, lay.tp_rank, stage.data(), local.data(), true);
    return std::vector<float>(local.begin() + begin, local.begin() + end);
}

// The whole model's vector on world rank 0 (empty elsewhere) from every process's local vector (its
// tensor-parallel slices of its stage, local_n long): the first data-parallel replica's slices gathered
// to tp rank 0, which puts its stage's tensors together (tp_copy_slices); then the later stages send
// theirs to stage 0, which puts the layers in place (pp_copy_stage; stage 0's copy of the shared tensors
// last, so it stays). The other replicas hold the same vectors and send nothing. Every process of the
// run calls it; the vectors travel through the staging's buffers (comm.h).
inline std::vector<float> layout_gather_full(const ParallelLayout& lay, const GPT2Config& model_cfg, const float* local,
                                             size_t local_n, const CommStaging& st) {
    GPT2Config stage_cfg = layout_stage_config(lay, model_cfg);
    std::vector<float> stage, full;
    if (lay.dp_rank != 0) return full;
    const ProcessGroup& tp = lay.tp_group;
    if (tp.size == 1) {
        stage.assign(local, local + local_n);
    } else {
        float* slice = st.buffer(local_n);
        float* slices = st.buffer(tp.rank == 0 ? tp.size * local_n : 1);
        st.put(slice, local, local_n);
        gather(tp, slice, local_n, slices, COMM_FLOAT32);
        comm_join(tp);
        st.wait("a checkpoint's tensor-parallel slices, gathered");
        if (tp.rank == 0) {
            std::vector<float> all(tp.size * local_n);
            st.get(all.data(), slices, all.size());
            stage.assign(num_parameters(stage_cfg), 0.0f);
            for (int t = 0; t < tp.size; t++) tp_copy_slices(stage_cfg, tp.size, t, stage.data(), all.data() + t * local_n, false);
        }
        st.release();
        if (tp.rank != 0) return full;
    }
    const ProcessGroup& pp = lay.pp_group;
    if (pp.size == 1) return stage;
    std::vector<std::vector<float>> stages =
        pp_gather_vectors(pp, stage, [&](int s) { return num_parameters(pp_stage_config(model_cfg, pp.size, s)); }, st);
    if (pp.rank != 0) return full;
    full.resize(num_parameters(model_cfg));
    for (int s = pp.size - 1; s >= 0; s--) {  // stage 0 last: its copy of the shared tensors stays
        int l0, l1;
        pp_stage_layers(model_cfg.num_layers, pp.size, s, &l0, &l1);
        pp_copy_stage(model_cfg, l0, l1, full.data(), stages[s].data(), false);
    }
    return full;
}

// A local vector of n elements of which this process holds [begin, end) (`mine`, its ZeRO shard of the
// data-parallel group's shard layout), made whole on every process of the group through a padded
// buffer of the staging; all of it (begin = 0, end = n) is returned as it is.
inline std::vector<float> zero_gather_local(const ProcessGroup& dp, const ShardLayout& shard,
                                            const std::vector<float>& mine, size_t begin, size_t end, size_t n,
                                            const CommStaging& st) {
    if (begin == 0 && end == n) return mine;
    float* padded = st.buffer(shard.padded_size);
    st.put(padded + begin, mine.data(), end - begin);
    all_gather(dp, padded, shard.shard_size, COMM_FLOAT32);
    comm_join(dp);
    st.wait("the optimizer state's gather for a checkpoint");
    std::vector<float> whole(n);
    st.get(whole.data(), padded, n);
    st.release();
    return whole;
}

// Adafactor's state (-opt adafactor) is no per-parameter vector: each tensor's row and column factors
// (llmc/optimizer.h), one tensor after another. A pipeline stage holds its layers' tensors' states and
// a copy of the shared tensors' (the same on every stage: their gradients are summed over the stages).
// Copies between the whole model's state and stage [l0, l1)'s: whole -> stage when to_stage.
inline void adafactor_copy_stage(const GPT2Config& model_cfg, int l0, int l1, float* whole, float* stage, bool to_stage) {
    std::vector<OptimizerTensor> all = optimizer_tensors(model_cfg), mine = optimizer_tensors(pp_layers_config(model_cfg, l0, l1));
    for (const OptimizerTensor& t : mine) {
        int layer = t.layer < 0 ? -1 : t.layer + l0;
        for (const OptimizerTensor& w : all) {
            if (w.param != t.param || w.layer != layer) continue;
            size_t n = adafactor_state_of(t);
            if (to_stage) std::copy_n(whole + w.state_offset, n, stage + t.state_offset);
            else std::copy_n(stage + t.state_offset, n, whole + w.state_offset);
        }
    }
}

// This stage's Adafactor state from the whole model's (resuming under -pp).
inline std::vector<float> layout_local_adafactor_state(const ParallelLayout& lay, const GPT2Config& model_cfg,
                                                       const std::vector<float>& whole) {
    std::vector<float> stage(adafactor_state_size(optimizer_tensors(layout_stage_config(lay, model_cfg))));
    adafactor_copy_stage(model_cfg, lay.layer_begin, lay.layer_end, const_cast<float*>(whole.data()), stage.data(), true);
    return stage;
}

// The whole model's Adafactor state from every stage's (stage s's at stages[s]; each trainer gathers
// them to stage 0 its own way).
inline std::vector<float> adafactor_whole_state(const GPT2Config& model_cfg, std::vector<std::vector<float>>& stages) {
    std::vector<float> whole(adafactor_state_size(optimizer_tensors(model_cfg)));
    for (int s = (int)stages.size() - 1; s >= 0; s--) {  // stage 0 last: its copy of the shared tensors' state stays
        int l0, l1;
        pp_stage_layers(model_cfg.num_layers, (int)stages.size(), s, &l0, &l1);
        adafactor_copy_stage(model_cfg, l0, l1, whole.data(), stages[s].data(), false);
    }
    return whole;
}
