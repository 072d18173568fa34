// What goes into a process's state file beside the optimizer's vectors (step, data position, sampler,
// loss scaler), and how a resumed run checks the checkpoint's files and restores from them, whatever
// layout wrote them; the end of every checkpoint (the state file, then the DONE marker).
#pragma once

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "../io/checkpoint.h"
#include "../io/dataloader.h"
#include "../parallel/comm.h"
#include "args.h"
#include "loss_scaler.h"

// The state file of one process, without the optimizer buffers (the trainer fills m, v, master from
// its own memory, host or device). The process updates parameters [opt_begin, opt_end).
inline TrainState train_state_header(int step, const DataLoader& loader, uint64_t sampler_rng, int grad_accum_steps,
                                     const ProcessGroup& pg, size_t num_parameters, size_t opt_begin, size_t opt_end) {
    TrainState state;
    state.num_processes = pg.size;  // the processes that wrote the checkpoint (one state file each)
    state.rank = pg.rank;
    state.data_processes = loader.num_processes;
    state.B = loader.B;
    state.T = loader.T;
    state.grad_accum_steps = grad_accum_steps;
    state.step = step;
    state.data_epoch = loader.position.epoch;
    state.data_unit = loader.position.unit;
    state.data_epoch_units = dataloader_epoch_units(&loader);
    state.sampler_rng = sampler_rng;
    state.num_parameters = (int64_t)num_parameters;
    state.shard_offset = (int64_t)opt_begin;
    state.shard_length = (int64_t)(opt_end - opt_begin);
    return state;
}

// The skip counters and the loss scale go into the state file, so a resumed run skips, counts and
// scales exactly as the uninterrupted run would.
inline LossScaler loss_scaler_from_args(const TrainArgs& args, bool dynamic) {
    LossScaler s;
    s.dynamic = dynamic;
    s.scale = dynamic ? args.loss_scale : 1.0f;
    s.growth_interval = args.loss_scale_window;
    s.growth = args.loss_scale_growth;
    s.backoff = args.loss_scale_backoff;
    s.max_consecutive = args.max_skipped_steps;
    return s;
}

inline void train_state_set_scaler(TrainState* state, const LossScaler& s) {
    state->loss_scale = s.scale;
    state->clean_steps = s.clean_steps;
    state->consecutive_skipped = s.consecutive;
    state->skipped_total = s.skipped_total;
    state->updates = s.updates;
}

// A state file without a loss scale (version 1) keeps the run's initial S.
inline void loss_scaler_restore(LossScaler* s, const TrainState& state) {
    if (state.loss_scale > 0.0f && s->dynamic) s->scale = state.loss_scale;
    s->clean_steps = state.clean_steps;
    s->consecutive = state.consecutive_skipped;
    s->skipped_total = state.skipped_total;
    s->updates = state.updates;
}

// The end of every checkpoint: this process's state file (with the loss scaler's counters), then, once
// every process has written its files, the DONE marker that makes the checkpoint complete. Until then
// an error removes the checkpoint's files (checkpoint_begin, called by the run loop before the trainer
// writes the model file). barrier(what) waits for every process of the run.
template <typename Barrier>
void checkpoint_finish(const std::string& dir, int step, int rank, TrainState* state, const LossScaler& scaler,
                       Barrier barrier) {
    train_state_set_scaler(state, scaler);
    state_file_write(checkpoint_state_path(dir, step, rank), *state);
    barrier("the other processes' checkpoint files");
    {
        // not while an error exit removes this process's files (the watchdog's thread may be at it)
        std::lock_guard<std::recursive_mutex> commit(files_commit_mutex());
        if (rank == 0) checkpoint_mark_done(dir, step);
        checkpoint_end(dir, step, rank);
    }
    barrier("rank 0's checkpoint marker");
    printf("checkpoint: wrote step %d to %s\n", step, dir.c_str());
}

// The place in the data stream where a resumed run continues, from the checkpoint's state (written
// by `data_processes` processes). Version 4 stores it as it is, a stream position that any process count
// continues (llmc/io/dataloader.h); it must belong to this data set, whose epochs must have as many units.
// Older versions stored "sample k of the s-th shard of the epoch" of each of P processes, from a loader
// that left out the last U mod P units of every shard and, before version 3, shuffled each rank's own
// samples. Such a position converts exactly (to unit k*P of that shard: the stream then goes on as the
// writing run did) where that loader read this one's stream: with P = 1, or with a P that divides
// every shard's U (shuffled, from version 3 on). Otherwise the checkpoint is refused rather than
// continued in an order the run never had.
inline DataPosition data_position_from_state(const TrainState& state, DataLoader* loader, const std::string& dir,
                                             int step) {
    if (state.version >= 4) {
        if (state.data_epoch_units != dataloader_epoch_units(loader)) {
            fatal("checkpoint %d in %s: its data position is unit %ld of epoch %ld of a data set of %ld units of B=%d "
                  "x T=%d tokens; the training data now (-i) holds %ld such units. The data changed since the "
                  "checkpoint: resume with the data it was written with", step, dir.c_str(), (long)state.data_unit,
                  (long)state.data_epoch, (long)state.data_epoch_units, loader->B, loader->T,
                  (long)dataloader_epoch_units(loader));
        }
        return DataPosition{state.data_epoch, state.data_unit};
    }
    int P = state.data_processes;
    if (P > 1) {
        if (loader->shuffle && state.version < 3) {
            fatal("checkpoint %d in %s was written by an older version of this program (state version %d) with %d "
                  "data-parallel processes, whose shuffle gave each process an order of its own; this version deals "
                  "one order to all processes, so the run cannot continue in its order. Resume it with the program "
                  "that wrote it, or start a new run from its model file (-e)", step, dir.c_str(), state.version, P);
        }
        for (size_t f = 0; f < loader->files.size(); f++) {
            int64_t units = dataloader_units_in_file(loader, (int)f);
            if (units % P != 0) {
                fatal("checkpoint %d in %s was written by an older version of this program (state version %d), "
                      "whose %d data-parallel processes left out the last %ld of the %ld units of B*T tokens of "
                      "shard '%s'; this version reads every unit, so the run cannot continue in its order. Resume "
                      "it with the program that wrote it, or start a new run from its model file (-e)", step,
                      dir.c_str(), state.version, P, (long)(units % P), (long)units, loader->files[f].c_str());
            }
        }
    }
    DataPosition p = dataloader_position_in_shard(loader, state.data_epoch, state.data_shard, state.data_sample * P);
    printf("resume: the data position of state version %d (epoch %ld, shard %ld, sample %ld of %d process(es)) is "
           "unit %ld of epoch %ld of the data stream\n", state.version, (long)state.data_epoch, (long)state.data_shard,
           (long)state.data_sample, P, (long)p.unit, (long)p.epoch);
    return p;
}

// Restores the optimizer state of parameters [opt_begin, opt_end) from checkpoint `step`, whatever
// process count and layout wrote it. Each state file holds one segment of the checkpoint-order
// parameter vector, [shard_offset, shard_offset + shard_length): all of it (-z 0) or a ZeRO-1 shard.
// The segments this process needs are assembled from as many of the checkpoint's files as cover its
// range (with -z 0 the first file does). Checks that the files belong to this run (same model, B, T
// and tokens per step, complete coverage); then moves the data loader to the saved position (the
// same for any process count: data_position_from_state) and restores the sampler. The returned
// state's m, v (and master, when the files have it) are (opt_end - opt_begin) long (m empty for
// Adafactor); the trainer copies them into place. The files must have been written with the run's
// optimizer (-opt): another one's moments mean nothing to it. For Adafactor, [opt_begin, opt_end)
// indexes its whole state vector (llmc/optimizer.h), not the parameters.
inline TrainState train_state_restore(const std::string& dir, int step, const ProcessGroup& pg, int grad_accum_steps,
                                      size_t num_parameters, size_t opt_begin, size_t opt_end, DataLoader* loader,
                                      uint64_t* sampler_rng, int optimizer = OPT_ADAMW) {
    (void)pg;  // every process reads what it needs; the data-parallel size is loader->num_processes
    std::string first_path = checkpoint_state_path(dir, step, 0);
    if (!file_exists(first_path)) {
        fatal("checkpoint %d in %s has no state file for process 0 (%s)", step, dir.c_str(), first_path.c_str());
    }
    TrainState first;
    state_file_read(first_path, &first);
    if (first.optimizer != optimizer) {
        fatal("checkpoint %d in %s was written with -opt %s; this run has -opt %s (resume with -opt %s, or start a "
              "fresh run in another -o)", step, dir.c_str(), optimizer_name(first.optimizer), optimizer_name(optimizer),
              optimizer_name(first.optimizer));
    }
    long written_tokens = (long)first.B * first.T * first.grad_accum_steps * first.data_processes;
    long our_tokens = (long)loader->B * loader->T * grad_accum_steps * loader->num_processes;
    if (first.B != loader->B || first.T != loader->T || written_tokens != our_tokens) {
        fatal("state file '%s' was written with B=%d T=%d x %d accumulation steps x %d data-parallel processes = %ld "
              "tokens per step; this run has B=%d T=%d x %d x %d = %ld (resume with the same -b, -t and -d)",
              first_path.c_str(), first.B, first.T, first.grad_accum_steps, first.data_processes, written_tokens,
              loader->B, loader->T, grad_accum_steps, loader->num_processes, our_tokens);
    }
    size_t n = opt_end - opt_begin;
    TrainState state = first;  // header fields (step, data position, sampler, loss scale) from process 0
    state.rank = 0;
    state.shard_offset = (int64_t)opt_begin;
    state.shard_length = (int64_t)n;
    state.m.assign(state_has_first_moment(optimizer) ? n : 0, 0.0f);
    state.v.assign(n, 0.0f);
    state.master.assign(first.master.empty() ? 0 : n, 0.0f);
    std::vector<std::pair<size_t, size_t>> covered;  // pieces of [opt_begin, opt_end) filled so far
    auto covered_all = [&]() {
        std::sort(covered.begin(), covered.end());
        size_t reach = opt_begin;
        for (auto& piece : covered) {
            if (piece.first > reach) return false;
            reach = std::max(reach, piece.second);
        }
        return reach >= opt_end;
    };
    for (int rank = 0; rank < state.num_processes && !covered_all(); rank++) {
        std::string path = checkpoint_state_path(dir, step, rank);
        if (!file_exists(path)) {
            fatal("checkpoint %d in %s was written by %d processes but has no state file for process %d (%s)", step,
                  dir.c_str(), first.num_processes, rank, path.c_str());
        }
        TrainState piece;
        if (rank == 0) {
            piece = std::move(first);
        } else {
            state_file_read(path, &piece);
        }
        if (piece.num_processes != state.num_processes || piece.rank != rank || piece.step != state.step ||
            piece.master.empty() != state.master.empty() || piece.optimizer != state.optimizer) {
            fatal("state file '%s' does not belong with the other files of checkpoint %d (process %d of %d, step %ld)",
                  path.c_str(), step, piece.rank, piece.num_processes, (long)piece.step);
        }
        if (piece.num_parameters != (int64_t)num_parameters) {
            fatal("state file '%s' holds optimizer state for %ld parameters; this model has %zu", path.c_str(),
                  (long)piece.num_parameters, num_parameters);
        }
        size_t begin = std::max(opt_begin, (size_t)piece.shard_offset);
        size_t end = std::min(opt_end, (size_t)(piece.shard_offset + piece.shard_length));
        if (begin >= end) continue;
        size_t from = begin - piece.shard_offset, to = begin - opt_begin, count = end - begin;
        if (!state.m.empty()) std::copy_n(piece.m.begin() + from, count, state.m.begin() + to);
        std::copy_n(piece.v.begin() + from, count, state.v.begin() + to);
        if (!state.master.empty()) std::copy_n(piece.master.begin() + from, count, state.master.begin() + to);
        covered.push_back({begin, end});
    }
    if (!covered_all()) {
        fatal("checkpoint %d in %s: its state files do not cover parameters [%zu, %zu) that this process updates "
              "(corrupt or incomplete checkpoint)", step, dir.c_str(), opt_begin, opt_end);
    }
    if (state.step != step) fatal("state file '%s' is for step %ld", first_path.c_str(), (long)state.step);
    DataPosition position = data_position_from_state(state, loader, dir, step);
    dataloader_seek(loader, position);
    *sampler_rng = state.sampler_rng;
    return state;
}
