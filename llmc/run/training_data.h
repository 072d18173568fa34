// The data of one process (the train and val loaders, the accumulation steps, the step count) and the
// learning-rate schedule, from the flags.
#pragma once

#include <cstdint>
#include <cstdio>

#include "../gpt2_config.h"
#include "../io/dataloader.h"
#include "../parallel/comm.h"
#include "args.h"
#include "schedulers.h"

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
        int64_t available = dataloader_epoch_samples(&data->val) / B;
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
    data->epoch_steps = dataloader_epoch_samples(&data->train) / ((int64_t)B * data->grad_accum_steps * num_processes);
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

// Every process must read the same data (the processes deal out one stream): node-local copies with the
// same names but other lengths or tokens would train on something else, silently. The processes compare
// their shard counts, then each shard's name, length and fingerprint (dataloader.h), and all stop
// together, process 0 naming the shard and the processes that differ (check_same_config).
inline void check_same_data(const ProcessGroup& world, const TrainingData& data) {
    if (!comm_active(world)) return;
    const DataLoader* loaders[2] = {&data.train, &data.val};
    const char* names[2] = {"train", "val"};
    std::string counts;
    for (int i = 0; i < 2; i++) counts += std::string(i ? "\n" : "") + names[i] + " data: shards=" + std::to_string(loaders[i]->files.size());
    check_same_config(world, counts);
    std::string shards;
    for (int i = 0; i < 2; i++) {
        for (size_t f = 0; f < loaders[i]->files.size(); f++) {
            char line[128];
            snprintf(line, sizeof(line), "=%ld tokens, fingerprint %08x", (long)loaders[i]->file_tokens[f],
                     loaders[i]->file_prints[f]);
            shards += std::string(shards.empty() ? "" : "\n") + names[i] + " shard '" + loaders[i]->files[f] + "'" + line;
        }
    }
    if (!shards.empty()) check_same_config(world, shards);
}
