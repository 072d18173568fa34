// Host code of the training loop that the CPU and CUDA trainers share: what goes into a state file
// and how a resumed run checks and restores it, the description that all processes must agree on,
// when to evaluate, checkpoint and sample, and how a sample is generated and printed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <utility>
#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../io/checkpoint.h"
#include "../io/dataloader.h"
#include "../io/output_lock.h"
#include "../parallel/comm.h"
#include "../rand.h"
#include "../tokenizer/prompt.h"
#include "../tokenizer/tokenizer_file.h"
#include "args.h"
#include "loss_scaler.h"
#include "sampler.h"
#include "schedulers.h"

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

// Process 0 speaks for the run, a line at a time (a log redirected to a file keeps every line a kill
// -9 would otherwise lose in a full buffer); the others print only errors (stderr).
inline void stdout_for_process(int rank) {
    if (rank != 0 && freopen("/dev/null", "w", stdout) == nullptr) fatal("could not silence process %d", rank);
    setvbuf(stdout, nullptr, _IOLBF, 0);
}

// One run per output directory (llmc/io/output_lock.h): process 0 makes -o and locks it until it ends.
inline void output_dir_lock_for_run(const TrainArgs& args, int rank) {
    if (!args.output_dir.empty() && rank == 0) {
        make_dir_check(args.output_dir);
        output_dir_lock(args.output_dir);
    }
}

// -y 1: the newest complete checkpoint in -o, whose model file the run starts from; -1 (from -e) when
// not resuming or when there is none. A fresh run refuses a directory that holds another run's
// checkpoints. Resuming, process 0 first removes what crashed or failed checkpoints left (files of a
// step without its DONE marker, .tmp files), which could otherwise keep a disk full.
inline int resume_step_from_args(const TrainArgs& args, int rank) {
    if (!args.resume) {
        // a fresh run does not mix with the checkpoints of another: a later -y 1 would resume those
        std::vector<int64_t> steps = checkpoint_complete_steps(args.output_dir);
        if (!steps.empty()) {
            std::string list;
            for (int64_t s : steps) list += (list.empty() ? "" : ", ") + std::to_string(s);
            fatal("-o %s holds the checkpoints of an earlier run (steps %s): continue that run with -y 1, or give this "
                  "one another -o (or remove them)", args.output_dir.c_str(), list.c_str());
        }
        return -1;
    }
    if (rank == 0) {
        std::vector<std::string> removed = checkpoint_remove_incomplete(args.output_dir);
        if (!removed.empty()) {
            std::string names;
            for (const std::string& name : removed) names += " " + name;
            printf("resume: removed %zu incomplete checkpoint file%s from %s (no DONE marker, or half written):%s\n",
                   removed.size(), removed.size() == 1 ? "" : "s", args.output_dir.c_str(), names.c_str());
        }
    }
    int step = (int)checkpoint_find_latest(args.output_dir);
    if (step < 0) {
        printf("resume: no complete checkpoint in %s, starting from scratch\n", args.output_dir.c_str());
    } else {
        printf("resume: continuing from step %d in %s\n", step, args.output_dir.c_str());
    }
    return step;
}

inline void print_model_summary(const GPT2Config& cfg, size_t num_parameters) {
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d (padded %d), %zu parameters\n", cfg.num_layers, cfg.channels,
           cfg.num_heads, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, num_parameters);
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

// The data of one process and the step count it gives: the train loader (shuffled unless -sh 0), the
// val loader (when -v > 0; -m must fit in it), the accumulation steps that make up -d, and -x or one
// epoch. A resumed checkpoint past the last step is refused.
struct TrainingData {
    DataLoader train, val;
    int grad_accum_steps = 1;
    int max_steps = 0;
    int64_t epoch_steps = 0;
    long tokens_per_step = 0;  // all processes together
};

inline void training_data_init(TrainingData* data, const TrainArgs& args, const GPT2Config& cfg, int rank,
                               int num_processes, int resume_step) {
    data->grad_accum_steps = validate_batch_args(args, cfg, num_processes);
    int B = args.B, T = args.T;
    data->tokens_per_step = (long)B * T * data->grad_accum_steps * num_processes;
    if (args.val_every > 0) {
        dataloader_init(&data->val, args.val_pattern, B, T, rank, num_processes, false, cfg.vocab_size);
        // -m counts the batches of all data-parallel processes together (run_loop.h: run_validation_loss)
        int64_t available = dataloader_epoch_units(&data->val);
        if (args.val_batches > available) {
            fatal("flag -m: %d val batches but the val data (%s) holds only %ld of B=%d x T=%d", args.val_batches,
                  args.val_pattern.c_str(), (long)available, B, T);
        }
    }
    if (args.max_steps == 0) {  // -x 0: no training, so no training data is read
        if (resume_step > 0) fatal("resume: the checkpoint is at step %d, past -x 0", resume_step);
        data->max_steps = 0;
        printf("-x 0: no training; the model is evaluated and sampled as it is\n");
        return;
    }
    dataloader_init(&data->train, args.train_pattern, B, T, rank, num_processes, args.shuffle != 0, cfg.vocab_size);
    data->epoch_steps = dataloader_epoch_units(&data->train) / ((int64_t)data->grad_accum_steps * num_processes);
    data->max_steps = args.max_steps > 0 ? args.max_steps : (int)data->epoch_steps;
    if (data->max_steps < 1) {
        fatal("the training data (%s) is too small for one step of %ld tokens", args.train_pattern.c_str(),
              data->tokens_per_step);
    }
    if (resume_step > data->max_steps) {
        fatal("resume: the checkpoint is at step %d, past -x %d", resume_step, data->max_steps);
    }
    printf("batch: B=%d T=%d x %d accumulation step(s) x %d process(es) = %ld tokens per step; %d steps (one epoch "
           "is %ld)\n", B, T, data->grad_accum_steps, num_processes, data->tokens_per_step, data->max_steps,
           (long)data->epoch_steps);
}

inline LRScheduler lr_scheduler_from_args(const TrainArgs& args, int max_steps) {
    LRScheduler scheduler;
    parse_lr_schedule(args.schedule.c_str(), &scheduler.type);  // checked by parse_args
    scheduler.learning_rate = args.learning_rate;
    scheduler.warmup_steps = args.warmup_steps;
    scheduler.max_steps = max_steps;
    scheduler.final_frac = args.final_lr_frac;
    return scheduler;
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

// Everything that must agree across processes, one "name=value" line each (check_same_config names
// the lines that differ): every flag but those that may differ between processes by design (-pr, the
// rank; -e, whose weights the checksum stands for; -pk, -tk, -bp, local to each process's printing and
// files), the model's shape, a checksum of the initial weights (so a different -e file or seed is caught
// too) and the step it resumes from.
inline std::string run_description(const TrainArgs& args, const GPT2Config& cfg, const float* params, size_t num_params,
                                   int resume_step) {
    uint64_t checksum = 0;
    for (size_t i = 0; i < num_params; i += 4099) {
        uint32_t bits;
        memcpy(&bits, &params[i], 4);
        checksum = checksum * 31 + bits;
    }
    TrainArgs copy = args;
    std::string text;
    for (const FlagSpec& spec : flag_specs(&copy)) {
        std::string name = spec.name;
        if (name == "-pr" || name == "-e" || name == "-pk" || name == "-tk" || name == "-bp") continue;
        text += name + "=" + flag_value_text(spec) + "\n";
    }
    char model[256];
    snprintf(model, sizeof(model), "model=L %d C %d NH %d V %d maxT %d\nweights=%016llx\nresume step=%d", cfg.num_layers,
             cfg.channels, cfg.num_heads, cfg.vocab_size, cfg.max_seq_len, (unsigned long long)checksum, resume_step);
    return text + model;
}

// The loop's schedule. At step N the parameters have had N updates; the last step (N = max_steps)
// only evaluates, checkpoints and samples. A resumed run does not rewrite the checkpoint it started
// from; checkpoints are taken before sampling, so a resumed run samples the same text.
inline bool is_val_step(const TrainArgs& args, int step, int max_steps) {
    return args.val_every > 0 && (step % args.val_every == 0 || step == max_steps);
}
inline bool is_checkpoint_step(const TrainArgs& args, int step, int start_step, int max_steps) {
    return args.checkpoint_every > 0 && step != start_step && (step % args.checkpoint_every == 0 || step == max_steps);
}
inline bool is_hellaswag_step(const TrainArgs& args, int step, int max_steps) {
    return args.hellaswag_every > 0 && (step % args.hellaswag_every == 0 || step == max_steps);
}
inline bool is_sample_step(const TrainArgs& args, int step, int max_steps) {
    return args.sample_every > 0 && ((step > 0 && step % args.sample_every == 0) || step == max_steps);
}

// Writes a token's bytes to stdout (its id without a tokenizer), with control characters other than
// newline and tab shown as '?' so a sample cannot disturb the terminal.
inline void print_token(const TokenizerFile* tok, int id) {
    if (tok == nullptr) {
        printf("%d ", id);
        return;
    }
    for (unsigned char c : tokenizer_file_decode(*tok, id)) putchar(c < 32 && c != '\n' && c != '\t' ? '?' : c);
}

// The tokenizer for printing samples (if its file exists) and the token a sample starts from.
inline bool load_sample_tokenizer(const TrainArgs& args, const GPT2Config& cfg, TokenizerFile* tok, int* eot) {
    bool have = tokenizer_file_read(args.tokenizer_path, tok);
    *eot = have ? tok->eot_token : 50256;
    if (*eot >= cfg.vocab_size) *eot = cfg.vocab_size - 1;  // a small test vocabulary has no GPT-2 end-of-text
    if (args.sample_every > 0 && !have) {
        printf("samples print as token ids: no tokenizer file at %s (-tk)\n", args.tokenizer_path.c_str());
    }
    return have;
}

// What a sample is: `count` tokens after end-of-text and the prompt's tokens (-sp), each drawn with
// temperature and top-k (llmc/run/sampler.h) from the model's distribution given the tokens so far (at
// most the last T of them).
struct SampleSettings {
    int count = 0, T = 0, eot = 0, top_k = 0;
    float temperature = 1.0f;
    std::vector<int> prompt;
};

inline SampleSettings sample_settings_from_args(const TrainArgs& args, const GPT2Config& cfg, int eot) {
    SampleSettings s;
    s.count = args.gen_tokens;
    s.T = args.T;
    s.eot = eot;
    s.top_k = args.top_k;
    s.temperature = args.temperature;
    if (!args.prompt.empty()) {
        s.prompt = encode_prompt(args.prompt, args.bpe_dir, cfg.vocab_size);
        printf("sample prompt: %zu tokens\n", s.prompt.size());
    }
    return s;
}

// Prints one sample: the prompt, then the generated tokens as they come. last_logits(window, length)
// runs the model on tokens window[0..length) and returns the logits (V or more) of the last position;
// each trainer supplies its own. One coin is drawn per token whatever the settings, so the random
// stream (saved in checkpoints) advances the same way.
template <typename LastLogits>
void generate_sample(const SampleSettings& s, int V, uint64_t* rng, const TokenizerFile* tok, LastLogits last_logits) {
    std::vector<int> tokens = {s.eot};
    tokens.insert(tokens.end(), s.prompt.begin(), s.prompt.end());
    printf("--- sample ---\n");
    for (int id : s.prompt) print_token(tok, id);
    for (int i = 0; i < s.count; i++) {
        int context = std::min((int)tokens.size(), s.T);
        const float* logits = last_logits(tokens.data() + tokens.size() - context, context);
        float coin = xorshift_uniform(rng);
        int next = sample_token(logits, V, s.temperature, s.top_k, coin);
        tokens.push_back(next);
        print_token(tok, next);
        fflush(stdout);
    }
    printf("\n--------------\n");
}
