// A checkpoint's model and optimizer state, written and read back across the process layout: once for
// both trainers. A trainer describes its state (CheckpointModel: its place in the layout, its optimizer's
// range, its vectors read out as fp32 host vectors, and how host vectors reach its backend's collectives);
// this file decides who writes what.
//
//   no tp, no pp   world rank 0 writes the model file; every process writes its state file with its
//                  optimizer range [opt_begin, opt_end) (its ZeRO shard, or all of it); Adafactor's state
//                  is whole on every process, so process 0's file holds it all
//   -tp or -pp     the slices, then the stages, are put together (llmc/parallel/model_state.h): world
//                  rank 0 writes the whole model and the whole optimizer state (one segment [0, N)), the
//                  others state files with empty segments, so that any layout of either trainer resumes it
//   -cf llmc       as with no tp, no pp, but each state file is llm.c's (llmc/io/llmc_state.h), master
//                  weights always included (the fp32 parameters where the run keeps none)
//
// Resuming reads what this process needs from whichever layout wrote the checkpoint (train_state_restore)
// and cuts this process's part out of the whole model's vectors (layout_local_part).
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../adamw8.h"
#include "../io/checkpoint.h"
#include "../optimizer.h"
#include "../parallel/comm.h"
#include "../parallel/layout.h"
#include "../parallel/model_state.h"
#include "../parallel/pipeline.h"
#include "../parallel/zero.h"
#include "checkpoint_writer.h"
#include "run_loop.h"
#include "train_common.h"

// The optimizer vectors a trainer reads out for a checkpoint.
enum CheckpointVector { CKPT_M, CKPT_V, CKPT_MASTER };

struct CheckpointModel {
    const ParallelLayout* layout = nullptr;
    GPT2Config whole, local;          // the whole model; this process's stage of it
    size_t num_parameters = 0;        // this process's parameters (its stage, its -tp slices)
    size_t opt_begin = 0, opt_end = 0;  // the part its optimizer updates (-z 1..3: its shard)
    ShardLayout shard;
    OptimizerKind optimizer = OPT_ADAMW;
    bool has_master = false;          // fp32 master weights beside the parameters (the CUDA trainer's -w 1)
    int model_version = 0;            // the model file's format (llmc/io/checkpoint.h)
    bool parameters_collective = false;  // -z 3: every process takes part in reading the parameters
    // this process's num_parameters parameters, fp32
    std::function<std::vector<float>()> parameters;
    // CKPT_M, CKPT_V, CKPT_MASTER over [opt_begin, opt_end); Adafactor's CKPT_V: its whole (stage's) state
    std::function<std::vector<float>(CheckpointVector which)> optimizer_vector;
    // the parameters of [opt_begin, opt_end), fp32 (-cf llmc's master weights where the run keeps none); every
    // process calls it (-z 3: it may gather)
    std::function<std::vector<float>()> optimizer_parameters;
    // -opt adamw8: the codes of [opt_begin, opt_end) and their blocks' maxima (llmc/adamw8.h)
    std::function<Adamw8State()> moments8;
    // state of this process's own beyond the optimizer's (-gc's residuals, -lh's replica): extra sections of
    // its state file, of the kinds own_kinds, restored from its own file (-y 1 needs the same processes then)
    std::function<std::vector<StateSection>()> own_sections;
    std::vector<int32_t> own_kinds;
    CommStaging staging;
};

// The flag whose state a section of each process's own holds; null for the other kinds.
inline const char* own_section_flag(int32_t kind) {
    switch (kind) {
        case STATE_SECTION_ERROR_FEEDBACK: return "-gc powersgd";
        case STATE_SECTION_POWERSGD: return "-gc powersgd";
        case STATE_SECTION_SIGN_ESTIMATES: return "-gc sign";
        case STATE_SECTION_LOCAL_STEPS: return "-lh";
        case STATE_SECTION_MATMUL_CHOICES: return "-at 1";
        default: return nullptr;
    }
}

// The fields both trainers' models hold under the same names: the layout, the whole and the local shapes,
// the optimizer's range, the shard layout and the optimizer. The trainer adds the rest.
template <typename Model>
CheckpointModel checkpoint_model_of(const Model& model) {
    CheckpointModel c;
    c.layout = &model.layout;
    c.whole = model.model_config;
    c.local = model.config;
    c.num_parameters = model.num_parameters;
    c.opt_begin = model.opt_begin;
    c.opt_end = model.opt_end;
    c.shard = model.shard;
    c.optimizer = model.optimizer.kind;
    return c;
}

// Puts checkpoint `step` together in host memory (collective: the gathers across the layout) and writes
// it: at once, or with -ca 1 by this process's writer thread while training goes on
// (checkpoint_writer.h; the run loop completes it).
inline void checkpoint_save_state(const CheckpointModel& m, const TrainRun& run, int step) {
    const ParallelLayout& lay = *m.layout;
    const ProcessGroup& world = lay.world;
    const std::string& dir = run.args.output_dir;
    const bool writer = world.rank == 0;
    auto header = [&](size_t n, size_t begin, size_t end) {
        return train_state_header(step, run.data.train, run.sampler_rng, run.data.grad_accum_steps, world, n, begin, end);
    };
    CheckpointJob job;
    job.dir = dir;
    job.step = step;
    job.rank = world.rank;
    job.write_model = writer;
    job.model_version = m.model_version;
    TrainState state;
    const bool llmc = run.args.checkpoint_format == "llmc";  // AdamW, no -tp or -pp (args.h)
    if (lay.tp == 1 && lay.pp == 1) {
        if (writer || m.parameters_collective) {
            std::vector<float> params = m.parameters();
            if (writer) job.params = std::move(params);
        }
        job.model_config = m.local;
        if (m.optimizer == OPT_ADAFACTOR) {  // the whole state, on every process: process 0 writes it
            state = header(m.num_parameters, 0, writer ? adafactor_state_size(optimizer_tensors(m.local)) : 0);
            if (writer) state.v = m.optimizer_vector(CKPT_V);
        } else if (m.optimizer == OPT_ADAMW8) {  // each process its range's codes (args.h: no -tp, -pp, -cf llmc)
            state = header(m.num_parameters, m.opt_begin, m.opt_end);
            state.moments8 = m.moments8();
            if (m.has_master) state.master = m.optimizer_vector(CKPT_MASTER);
        } else {
            state = header(m.num_parameters, m.opt_begin, m.opt_end);
            state.m = m.optimizer_vector(CKPT_M);
            state.v = m.optimizer_vector(CKPT_V);
            // -cf llmc without master weights: the fp32 parameters of the optimizer's range stand in for them
            if (m.has_master) state.master = m.optimizer_vector(CKPT_MASTER);
            else if (llmc) state.master = m.optimizer_parameters();
        }
    } else {  // the whole model and optimizer state, put together on world rank 0
        if (m.optimizer == OPT_ADAMW8) fatal("checkpoint: -opt adamw8 with -tp or -pp (refused at start-up, args.h)");
        size_t N = num_parameters(m.whole), n = m.num_parameters;
        auto whole = [&](const std::vector<float>& mine, size_t begin, size_t end) {
            std::vector<float> local = zero_gather_local(lay.dp_group, m.shard, mine, begin, end, n, m.staging);
            return layout_gather_full(lay, m.whole, local.data(), n, m.staging);
        };
        std::vector<float> params = whole(m.parameters(), 0, n);
        if (writer) job.params = std::move(params);
        job.model_config = m.whole;
        if (m.optimizer == OPT_ADAFACTOR) {  // -pp: the stages' factored states, put together
            std::vector<float> v;  // the first data-parallel replica's stages (every replica holds the same)
            if (lay.dp_rank == 0) {
                std::vector<std::vector<float>> stages = pp_gather_vectors(lay.pp_group, m.optimizer_vector(CKPT_V), [&](int s) {
                    return adafactor_state_size(optimizer_tensors(pp_stage_config(m.whole, lay.pp, s)));
                }, m.staging);
                if (lay.pp_rank == 0) v = adafactor_whole_state(m.whole, stages);
            }
            state = header(N, 0, writer ? v.size() : 0);
            if (writer) state.v = v;
        } else {
            std::vector<float> mo = whole(m.optimizer_vector(CKPT_M), m.opt_begin, m.opt_end);
            std::vector<float> v = whole(m.optimizer_vector(CKPT_V), m.opt_begin, m.opt_end);
            std::vector<float> master;
            if (m.has_master) master = whole(m.optimizer_vector(CKPT_MASTER), m.opt_begin, m.opt_end);
            state = header(N, 0, writer ? N : 0);
            if (writer) {
                state.m = mo;
                state.v = v;
                state.master = master;
            }
        }
    }
    state.optimizer = m.optimizer;  // AdamW, Muon (its momentum where AdamW's m is), Adafactor, 8-bit AdamW
    if (m.own_sections) state.sections = m.own_sections();
    train_state_set_scaler(&state, run.scaler);  // the skip counters and S, as of this step
    if (llmc) {
        job.llmc = true;
        job.llmc_state = llmc_state_of(std::move(state), run.data.train, run.data.grad_accum_steps);
    } else {
        job.state = std::move(state);
    }
    if (run.args.checkpoint_async) {
        checkpoint_writer_start(std::move(job));
        return;
    }
    auto all = [&](const char* what) { barrier(world, what); };
    checkpoint_job_write(job);
    all("the other processes' checkpoint files");
    checkpoint_mark_complete(dir, step, world.rank, all);
}

// This process's optimizer state from checkpoint run->resume_step (m, v and master over [opt_begin,
// opt_end), master empty where the checkpoint has none; Adafactor: v, its whole or its stage's state),
// with the data position, the sampler and the loss scaler restored.
inline TrainState checkpoint_restore_state(const CheckpointModel& m, TrainRun* run) {
    const ParallelLayout& lay = *m.layout;
    const std::string& dir = run->args.output_dir;
    int step = run->resume_step, accum = run->data.grad_accum_steps;
    DataLoader* loader = &run->data.train;
    uint64_t* rng = &run->sampler_rng;
    TrainState state;
    if (m.optimizer == OPT_ADAFACTOR) {  // its whole state vector, which process 0's file holds (-pp: the whole model's)
        bool stages = lay.pp > 1;
        size_t n = stages ? num_parameters(m.whole) : m.num_parameters;
        state = train_state_restore(dir, step, lay.dp_group, accum, n, 0,
                                    adafactor_state_size(optimizer_tensors(stages ? m.whole : m.local)), loader, rng,
                                    OPT_ADAFACTOR);
        if (stages) state.v = layout_local_adafactor_state(lay, m.whole, state.v);
    } else if (lay.tp == 1 && lay.pp == 1) {
        Adamw8Blocks blocks8 = adamw8_blocks(optimizer_tensors(m.local));
        state = train_state_restore(dir, step, lay.dp_group, accum, m.num_parameters, m.opt_begin, m.opt_end, loader, rng,
                                    m.optimizer, &blocks8);
    } else {  // the whole state, then this process's part (its stage's layers, its slices) and its -z shard of that
        size_t N = num_parameters(m.whole);
        state = train_state_restore(dir, step, lay.dp_group, accum, N, 0, N, loader, rng, m.optimizer);
        for (std::vector<float>* v : {&state.m, &state.v, &state.master}) {
            if (!v->empty()) *v = layout_local_part(lay, m.whole, *v, m.opt_begin, m.opt_end);
        }
    }
    loss_scaler_restore(&run->scaler, state);
    // -gc's residuals and factors, -lh's state and -at 1's matmul algorithms (extra sections) are each
    // process's own: a run that uses a kind takes it from its own file, which needs the processes that wrote
    // them (but for the algorithms, which another process count times afresh); a run without drops it.
    // -lh's replicas differ between synchronizations: their moments come from their own files too.
    bool read_own = false, own_moments = false, drop_choices = false;
    for (const StateSection& s : state.sections) {
        const char* flag = own_section_flag(s.kind);
        if (!flag) continue;
        bool used = s.kind == STATE_SECTION_MATMUL_CHOICES ? run->args.matmul_autotune != 0
                                                           : std::find(m.own_kinds.begin(), m.own_kinds.end(), s.kind) != m.own_kinds.end();
        if (!used) {
            if (lay.world.rank == 0) printf("resume: checkpoint %d holds %s's %s; this run has no %s and drops them\n", step, flag,
                                            state_section_name(s.kind), flag);
        } else if (state.num_processes != lay.world.size && s.kind == STATE_SECTION_MATMUL_CHOICES) {
            // another layout computes other products anyway: only the last bits are at stake, so it times afresh
            if (lay.world.rank == 0) printf("resume: checkpoint %d holds the -at 1 matmul algorithms of %d processes; this run "
                                            "has %d and times its own\n", step, state.num_processes, lay.world.size);
            drop_choices = true;
        } else if (state.num_processes != lay.world.size) {
            fatal("checkpoint %d in %s holds the %s of %d processes, each its own; this run has %d: resume %s with as many "
                  "processes (or without %s, which drops them)", step, dir.c_str(), state_section_name(s.kind),
                  state.num_processes, lay.world.size, flag, flag);
        } else {
            read_own = true;
            own_moments |= s.kind == STATE_SECTION_LOCAL_STEPS;
        }
    }
    if (read_own && lay.world.rank != 0) {  // process 0's file gave its own already
        TrainState mine;
        state_file_read(checkpoint_state_path(dir, step, lay.world.rank), &mine);
        state.sections = std::move(mine.sections);
        if (own_moments) {  // -z 0 (args.h): its file holds the moments of every parameter
            state.m = std::move(mine.m);
            state.v = std::move(mine.v);
            state.master = std::move(mine.master);
            state.moments8 = std::move(mine.moments8);
        }
    }
    if (drop_choices) {  // process 0's, not this process's own
        state.sections.erase(std::remove_if(state.sections.begin(), state.sections.end(),
                                            [](const StateSection& s) { return s.kind == STATE_SECTION_MATMUL_CHOICES; }),
                             state.sections.end());
    }
    return state;
}
