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
#include "../io/llmc_state.h"
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
    state.data_sample = loader.position.sample;
    state.data_epoch_samples = dataloader_epoch_samples(&loader);
    state.data_fingerprint = loader.fingerprint;
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
    state->loss_scale_dynamic = s.dynamic;
    state->clean_steps = s.clean_steps;
    state->consecutive_skipped = s.consecutive;
    state->skipped_total = s.skipped_total;
    state->updates = s.updates;
}

// S continues from the file only where the file's S was a dynamic scale too: a run that scales resuming
// the checkpoint of one that did not (bf16, fp32, the CPU trainer: S = 1 there) keeps the S of its flags.
inline void loss_scaler_restore(LossScaler* s, const TrainState& state) {
    if (state.loss_scale_dynamic && s->dynamic) s->scale = state.loss_scale;
    s->clean_steps = state.clean_steps;
    s->consecutive = state.consecutive_skipped;
    s->skipped_total = state.skipped_total;
    s->updates = state.updates;
}

// llm.c's (shard, batch) as a place in this stream: as it is where llm.c's loader reads this stream (not
// shuffled, shards of whole batches, the same processes; llm.c does not record B: this run's is taken),
// else where this run would be after `step` steps of `samples_per_step` samples; a note says which.
inline DataPosition llmc_data_position(const LlmcState& l, const DataLoader& loader, int step, int64_t samples_per_step) {
    DataPosition by_step = dataloader_position_at(&loader, (int64_t)step * samples_per_step);
    std::string why = l.shuffled ? "llm.c's loader shuffled, in an order of its own" : llmc_stream_mismatch(loader, l.num_processes);
    if (why.empty() && !llmc_position_in_data(loader, l.shard, l.batch)) {
        why = "it lies past this data (" + std::to_string(loader.files.size()) + " shard(s)): other data than llm.c's run read?";
    }
    if (!why.empty()) {
        printf("resume: llm.c's data position (shard %ld, batch %ld) is not a place in this stream: %s; the run "
               "continues this stream where it would be after step %d: sample %ld of epoch %ld\n", (long)l.shard,
               (long)l.batch, why.c_str(), step, (long)by_step.sample, (long)by_step.epoch);
        return by_step;
    }
    // llm.c counts no epochs: the one that puts the sample nearest to where the step would be
    int64_t E = dataloader_epoch_samples(&loader), sample = llmc_position_in_stream(loader, l.shard, l.batch);
    int64_t at = (int64_t)step * samples_per_step, epoch = std::max<int64_t>(0, (at - sample + E / 2) / E);
    printf("resume: llm.c's data position (shard %ld, batch %ld of B=%d x T=%d x %d processes; llm.c does not record "
           "B: this run's) is sample %ld of epoch %ld of this stream: the run continues there\n", (long)l.shard,
           (long)l.batch, loader.B, loader.T, loader.num_processes, (long)sample, (long)epoch);
    return DataPosition{epoch, sample};
}

// llm.c's state file as one of ours (llmc/io/llmc_state.h): what it holds (the step, every step an update,
// AdamW's m and v, the master weights) and its data position placed in this stream (the note comes from
// process 0's file); what it does not record (B, T, the accumulation, the sampler, a loss scale) is this
// run's. Its data position is then this version's kind, of this data set.
inline TrainState train_state_from_llmc(LlmcState l, const DataLoader& loader, int grad_accum_steps, uint64_t sampler_rng,
                                        int64_t num_parameters, int step, int64_t samples_per_step) {
    TrainState s;
    s.num_processes = s.data_processes = l.num_processes;
    s.rank = l.rank;
    s.B = loader.B;
    s.T = loader.T;
    s.grad_accum_steps = grad_accum_steps;
    s.step = s.updates = l.step;
    if (l.rank == 0) {
        DataPosition p = llmc_data_position(l, loader, step, samples_per_step);
        s.data_epoch = p.epoch;
        s.data_sample = p.sample;
    }
    s.data_epoch_samples = dataloader_epoch_samples(&loader);
    s.sampler_rng = sampler_rng;
    s.num_parameters = num_parameters;
    s.shard_offset = l.shard_offset;
    s.shard_length = l.shard_length;
    s.optimizer = OPT_ADAMW;
    s.m = std::move(l.m);
    s.v = std::move(l.v);
    s.master = std::move(l.master);
    return s;
}

// The place in the data stream where a resumed run continues, from the checkpoint's state. Version 5
// stores it as it is, a position in the stream of T-token samples that any B and process count continue
// (llmc/io/dataloader.h); it must belong to this data set: as many samples an epoch, and the same
// fingerprint. Older versions stored a place in an order of B*T-token units (version 4) or of each
// process's samples (3 and older), which this stream does not have: the run continues where this
// version's run would be after the same number of steps, `samples_per_step` samples a step, with a note.
inline DataPosition data_position_from_state(const TrainState& state, DataLoader* loader, const std::string& dir,
                                             int step, int64_t samples_per_step) {
    if (state.version >= 5) {
        if (state.data_epoch_samples != dataloader_epoch_samples(loader) ||
            (state.data_fingerprint != 0 && state.data_fingerprint != loader->fingerprint)) {
            fatal("checkpoint %d in %s: its data position is sample %ld of epoch %ld of a data set of %ld samples of "
                  "T=%d tokens (fingerprint %016llx); the training data now (-i) holds %ld such samples (fingerprint "
                  "%016llx). The data changed since the checkpoint: resume with the data it was written with", step,
                  dir.c_str(), (long)state.data_sample, (long)state.data_epoch, (long)state.data_epoch_samples,
                  loader->T, (unsigned long long)state.data_fingerprint, (long)dataloader_epoch_samples(loader),
                  (unsigned long long)loader->fingerprint);
        }
        return DataPosition{state.data_epoch, state.data_sample};
    }
    DataPosition p = dataloader_position_at(loader, (int64_t)step * samples_per_step);
    printf("resume: checkpoint %d was written by an older version of this program (state version %d), whose data "
           "order this version does not have; the run continues this version's sample stream where it would be "
           "after step %d: sample %ld of epoch %ld\n", step, state.version, step, (long)p.sample, (long)p.epoch);
    return p;
}

// Restores the optimizer state of parameters [opt_begin, opt_end) from checkpoint `step`, whatever
// process count and layout wrote it. Each state file holds one segment of the checkpoint-order
// parameter vector, [shard_offset, shard_offset + shard_length): all of it (-z 0) or a ZeRO-1 shard.
// The segments this process needs are assembled from as many of the checkpoint's files as cover its
// range (with -z 0 the first file does). Checks that the files belong to this run (same model, T
// and tokens per step, complete coverage); then moves the data loader to the saved position (the
// same for any B and process count: data_position_from_state) and restores the sampler. The returned
// state's m, v (and master, when the files have it) are (opt_end - opt_begin) long (m empty for
// Adafactor); the trainer copies them into place. The files must have been written with the run's
// optimizer (-opt): another one's moments mean nothing to it. For Adafactor, [opt_begin, opt_end)
// indexes its whole state vector (llmc/optimizer.h), not the parameters. For 8-bit AdamW (blocks8, the
// model's blocks: llmc/adamw8.h) the returned state's moments8 holds the range's codes and its blocks' maxima.
inline TrainState train_state_restore(const std::string& dir, int step, const ProcessGroup& pg, int grad_accum_steps,
                                      size_t num_parameters, size_t opt_begin, size_t opt_end, DataLoader* loader,
                                      uint64_t* sampler_rng, int optimizer = OPT_ADAMW,
                                      const Adamw8Blocks* blocks8 = nullptr) {
    (void)pg;  // every process reads what it needs; the data-parallel size is loader->num_processes
    std::string first_path = checkpoint_state_path(dir, step, 0);
    if (!file_exists(first_path)) {
        fatal("checkpoint %d in %s has no state file for process 0 (%s)", step, dir.c_str(), first_path.c_str());
    }
    // ours, or llm.c's (llmc_state.h): the first file says which, and all of a checkpoint's files are alike
    const bool llmc = llmc_state_file(first_path);
    long our_tokens = (long)loader->B * loader->T * grad_accum_steps * loader->num_processes;
    auto read_piece = [&](const std::string& path, TrainState* piece) {
        if (!llmc) {
            state_file_read(path, piece);
            return;
        }
        if (!llmc_state_file(path)) fatal("state file '%s' is not llm.c's like the others of checkpoint %d", path.c_str(), step);
        LlmcState l;
        llmc_state_read(path, (int64_t)num_parameters, &l);
        if (l.rank == 0) {
            printf("resume: checkpoint %d in %s was written by llm.c (%d process%s%s), whose state file records neither B, "
                   "T nor the tokens per step: this run continues with B=%d T=%d and %ld tokens per step (llm.c's -b, -t "
                   "and -d continue it as it was)\n", step, dir.c_str(), l.num_processes, l.num_processes == 1 ? "" : "es",
                   l.master.empty() ? "" : ", fp32 master weights", loader->B, loader->T, our_tokens);
        }
        *piece = train_state_from_llmc(std::move(l), *loader, grad_accum_steps, *sampler_rng, (int64_t)num_parameters,
                                       step, our_tokens / loader->T);
    };
    TrainState first;
    read_piece(first_path, &first);
    if (first.optimizer != optimizer) {
        fatal("checkpoint %d in %s was written with -opt %s%s; this run has -opt %s (resume with -opt %s, or start a "
              "fresh run in another -o)", step, dir.c_str(), optimizer_name(first.optimizer), llmc ? " (by llm.c)" : "",
              optimizer_name(optimizer), optimizer_name(first.optimizer));
    }
    // B and the process count may differ (the stream is one of T-token samples); T and the tokens per
    // step may not: they define the samples and the step
    long written_tokens = (long)first.B * first.T * first.grad_accum_steps * first.data_processes;
    if (!llmc && (first.T != loader->T || written_tokens != our_tokens)) {
        fatal("state file '%s' was written with B=%d T=%d x %d accumulation steps x %d data-parallel processes = %ld "
              "tokens per step; this run has B=%d T=%d x %d x %d = %ld (resume with the same -t and -d; -b, -b auto "
              "and the process count may change)", first_path.c_str(), first.B, first.T, first.grad_accum_steps,
              first.data_processes, written_tokens, loader->B, loader->T, grad_accum_steps, loader->num_processes,
              our_tokens);
    }
    size_t n = opt_end - opt_begin;
    TrainState state = first;  // header fields (step, data position, sampler, loss scale) from process 0
    state.rank = 0;
    state.shard_offset = (int64_t)opt_begin;
    state.shard_length = (int64_t)n;
    const bool eight_bit = optimizer == OPT_ADAMW8;
    if (eight_bit && !blocks8) fatal("train_state_restore: -opt adamw8 without its blocks");
    state.m.assign(state_has_first_moment(optimizer) ? n : 0, 0.0f);
    state.v.assign(state_has_fp32_v(optimizer) ? n : 0, 0.0f);
    std::vector<bool> block_read;  // 8-bit AdamW: the range's blocks whose maxima a file gave already
    if (eight_bit) {
        state.moments8 = adamw8_state(*blocks8, opt_begin, opt_end);
        block_read.assign(state.moments8.m_max.size(), false);
    }
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
            read_piece(path, &piece);
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
        if (!state.v.empty()) std::copy_n(piece.v.begin() + from, count, state.v.begin() + to);
        if (eight_bit) {  // the codes of [begin, end) and the maxima of the blocks holding them
            const Adamw8State& have = piece.moments8;
            Adamw8State& want = state.moments8;
            size_t b0, b1;
            blocks8->blocks_of(begin, end, &b0, &b1);
            if (have.block_begin > b0 || have.block_end < b1) {
                fatal("state file '%s' holds the 8-bit maxima of blocks [%zu, %zu), not all those of its parameters "
                      "[%zu, %zu) in this model (corrupt?)", path.c_str(), have.block_begin, have.block_end, begin, end);
            }
            std::copy_n(have.m.begin() + from, count, want.m.begin() + to);
            std::copy_n(have.v.begin() + from, count, want.v.begin() + to);
            // a block cut by a shard boundary is in two files, which must agree on its maxima (the whole block's)
            for (size_t b = b0; b < b1; b++) {
                float a = have.m_max[b - have.block_begin], v = have.v_max[b - have.block_begin];
                size_t k = b - want.block_begin;
                if (block_read[k] && (want.m_max[k] != a || want.v_max[k] != v)) {
                    fatal("checkpoint %d in %s: state file '%s' and the one before it disagree on the 8-bit maxima of "
                          "block %zu, which both hold part of (corrupt checkpoint?)", step, dir.c_str(), path.c_str(), b);
                }
                want.m_max[k] = a, want.v_max[k] = v, block_read[k] = true;
            }
        }
        if (!state.master.empty()) std::copy_n(piece.master.begin() + from, count, state.master.begin() + to);
        covered.push_back({begin, end});
    }
    if (!covered_all()) {
        fatal("checkpoint %d in %s: its state files do not cover parameters [%zu, %zu) that this process updates "
              "(corrupt or incomplete checkpoint)", step, dir.c_str(), opt_begin, opt_end);
    }
    if (state.step != step) fatal("state file '%s' is for step %ld", first_path.c_str(), (long)state.step);
    DataPosition position = data_position_from_state(state, loader, dir, step, our_tokens / loader->T);
    dataloader_seek(loader, position);
    *sampler_rng = state.sampler_rng;
    return state;
}
