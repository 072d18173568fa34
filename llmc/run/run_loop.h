// The training run, once for both trainers: what happens at each step and in which order, given a
// small set of hooks through which a trainer runs its model. The trainer owns the model (its memory,
// forward, backward, update, where its parameters live); this file owns everything around it:
//
//   for step = start .. max_steps:
//       val loss (-v), HellaSwag (-he)            hooks.eval_loss over -m val batches; hooks.hellaswag
//       checkpoint (-n)                           hooks.save_checkpoint
//       sample (-s)                               hooks.sample
//       (the last step only evaluates, checkpoints and samples)
//       SIGTERM or SIGUSR1 on any process: a checkpoint of this step, and the run ends (stop_signal.h)
//       zero_grad; read the step's micro-batches  hooks.zero_grad; the train loader
//       forward and backward of every micro-batch hooks.forward_backward (a pipeline runs its schedule)
//       combine the gradients, global norm       hooks.complete_gradients, hooks.grad_norm
//       skip a non-finite step, or update        llmc/run/loss_scaler.h; hooks.update
//       the step line and metrics.jsonl          timings by phase (llmc/run/phase_timer.h), MFU
//
// At step N the parameters have had N updates. Every process runs the loop; the hooks that involve
// other processes (sums, checkpoints, a sample under ZeRO-3) are collective and every process reaches
// them at the same point of the same step. Only process 0 prints and logs (the others' stdout is
// silenced by the trainer).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "args.h"
#include "hellaswag.h"
#include "logger.h"
#include "phase_timer.h"
#include "checkpoint_writer.h"
#include "stop_signal.h"
#include "train_common.h"
#include "../parallel/layout.h"
#include "../parallel/watchdog.h"

// The micro-batches of one step, read by the loop before any forward: count of them, each B rows of T
// tokens, inputs and targets (count, B, T).
struct StepBatches {
    int count = 0, B = 0, T = 0;
    std::vector<int> inputs, targets;
    const int* inputs_of(int micro) const { return inputs.data() + (size_t)micro * B * T; }
    const int* targets_of(int micro) const { return targets.data() + (size_t)micro * B * T; }
};

struct TrainRun;

// One update's settings (the loop's hooks.update): the step's learning rates (-l's schedule for AdamW,
// Adafactor; -ml's, the same shape, for Muon), -c, the factor the gradients are multiplied by (1/S and the
// clipping) and t, the update's number from 1; the step's number (from 0) and whether it is the run's last.
struct OptimizerStep {
    float lr = 0.0f, muon_lr = 0.0f;
    float weight_decay = 0.0f;
    float grad_scale = 1.0f;
    int t = 0;
    int step = 0;
    bool last = false;
};

// What the loop asks of a trainer. Unset optional hooks are skipped.
struct RunHooks {
    // Clears (or marks stale) the gradients before a step's first micro-batch.
    std::function<void()> zero_grad;
    // The forwards and backwards of one step over its micro-batches. dloss is each position's weight
    // in the step's mean loss (times the loss scale S); micro-batch bad_micro (-ni, testing; -1 for
    // none) uses INFINITY instead. Times its forward and backward phases in timer. Returns the sum of
    // the micro-batches' mean losses on this process (0 where it computes no loss: a pipeline stage
    // before the last).
    std::function<double(const StepBatches& batches, float dloss, int bad_micro, PhaseTimer* timer)> forward_backward;
    // Optional: completes the step's gradients over the processes (the collectives that make them
    // whole); unset where nothing is left to do (the CUDA trainer reduced them during the backward). S:
    // the loss scale the gradients carry (1 but in the FP16 build), for state kept in the gradient's
    // own units (-gc's error feedback).
    std::function<void(float S)> complete_gradients;
    // The gradients' global norm as computed (times S), the same on every process (its sums over the
    // processes included).
    std::function<double()> grad_norm;
    // The end of a step's optimizer phase: with apply, the optimizer's update with these settings (and
    // whatever must follow it, e.g. gathering ZeRO shards); without, the step is skipped.
    std::function<void(bool apply, const OptimizerStep& settings)> update;
    // A per-process number summed over the model's data-parallel replicas: over the pipeline stages
    // (where only the last has a loss) and the data-parallel processes. Collective; `what` names it in
    // the error of a process that waits too long.
    std::function<double(double value, const char* what)> sum_over_replicas;
    // The mean loss of a forward pass over one batch (B, T) of inputs and targets on this process (0 on a
    // pipeline stage before the last).
    std::function<double(const int* inputs, const int* targets, int B, int T)> eval_loss;
    // HellaSwag's counts over every process (llmc/run/hellaswag.h: hellaswag_evaluate_all). Collective.
    std::function<HellaSwagResult(const HellaSwagSet& set)> hellaswag;
    // Writes checkpoint `step` (llmc/io/checkpoint.h; the run's loader, sampler and scaler go into the
    // state files). Collective.
    std::function<void(const TrainRun& run, int step)> save_checkpoint;
    // Prints a sample (sample_text.h's generate_sample) with the run's settings. Called on every
    // process: the trainer decides which process prints (collective under ZeRO-3).
    std::function<void(TrainRun* run)> sample;
    // Optional: text appended to the step line (a pipeline's measured bubble).
    std::function<std::string()> step_note;
    // Optional: bytes this process has communicated so far (metrics.jsonl's comm_bytes; unset: -1).
    std::function<long long()> comm_bytes;
    // A number summed over every process of the run (all of its groups). Collective; unset: one process.
    std::function<double(double value, const char* what)> sum_over_world;
    // Optional: measures MFU's denominator again, for a step that ran above it (phase_timer.h's
    // peak_after_step); unset where the peak is not measured (a GPU's table, -pk).
    std::function<double()> measure_peak;
};

// The hooks' sums over processes, the same in every trainer: over the model's replicas (the pipeline's
// stages, then the data-parallel group) and over the whole world. The layout outlives the hooks.
inline void run_hooks_sums(RunHooks* h, const ParallelLayout* lay) {
    h->sum_over_replicas = [lay](double x, const char* what) {
        return all_reduce_sum(lay->dp_group, all_reduce_sum(lay->pp_group, x, what), what);
    };
    h->sum_over_world = [lay](double x, const char* what) { return all_reduce_sum(lay->world, x, what); };
}

// HellaSwag over the data-parallel group (llmc/run/hellaswag.h): each process its share of the examples
// (row_losses: its model's per-position losses), the counts summed.
template <typename RowLosses>
HellaSwagResult hellaswag_evaluate_group(const ProcessGroup& dp, const HellaSwagSet& set, int max_examples, int R,
                                         int Tr, RowLosses row_losses, std::vector<HellaSwagScore>* details = nullptr) {
    auto sum = [&](double x) { return all_reduce_sum(dp, x, "the HellaSwag count"); };
    return hellaswag_evaluate_all(set, max_examples, dp.rank, dp.size, R, Tr, row_losses, sum, details);
}

// The run's state outside the model: data, schedule, sampling, evaluation, skipping and scaling, logs.
struct TrainRun {
    TrainArgs args;
    TrainingData data;
    LRScheduler scheduler;
    LRScheduler muon_scheduler;  // -opt muon: -ml's, with the schedule of -l
    TokenizerFile tokenizer;
    bool have_tokenizer = false;
    SampleSettings sample_settings;
    HellaSwagSet hellaswag;
    LossScaler scaler;
    uint64_t sampler_rng = 0;
    Logger logger;
    int world_rank = 0, dp_size = 1;
    bool local_steps = false;  // -lh with more than one data-parallel process: gradients are each replica's own
    int resume_step = -1;  // the checkpoint this run resumed from, or -1
    bool injects_bad_micro = false;  // -ni: this process's last micro-batch of an inject step is made bad
    double flops_per_step = 0.0;     // this process's model FLOPs per step (MFU's numerator)
    double peak_flops = 0.0;         // MFU's denominator (0: unknown)
    PhaseTimer timer;
};

// The tokenizer samples print with (null: token ids).
inline const TokenizerFile* run_tokenizer(const TrainRun& run) { return run.have_tokenizer ? &run.tokenizer : nullptr; }

// Everything but the model, before the trainer allocates activations and restores a checkpoint into
// run->data.train, run->sampler_rng and run->scaler: the data of this data-parallel rank (dp_rank of
// dp_size), the same on every process of `world` (check_same_data), the learning-rate schedule, the sampling settings and tokenizer, the HellaSwag set, the
// output directory, the loss scaler (dynamic: FP16's loss scaling; otherwise skipping only).
inline void train_run_init(TrainRun* run, const TrainArgs& args, const GPT2Config& cfg, const ProcessGroup& world,
                           int dp_rank, int dp_size, int resume_step, bool dynamic_loss_scale) {
    if (args.checkpoint_format == "llmc") {  // what llm.c's state file cannot hold (llmc/io/llmc_state.h)
        size_t N = num_parameters(cfg);
        if (dynamic_loss_scale) fatal("flag -cf llmc: llm.c's state file has no loss scale for this FP16 build; use -cf ours");
        if (args.zero_stage > 0 && dp_size > 1 && N % dp_size != 0) {
            fatal("flag -cf llmc with -z %d: llm.c shards the optimizer state in equal parts, and %zu parameters do not "
                  "divide among %d processes (use -z 0 or -cf ours)", args.zero_stage, N, dp_size);
        }
    }
    run->args = args;
    run->world_rank = world.rank;
    run->dp_size = dp_size;
    run->local_steps = args.local_steps > 0 && dp_size > 1;
    run->resume_step = resume_step;
    training_data_init(&run->data, args, cfg, dp_rank, dp_size, resume_step);
    check_same_data(world, run->data);
    run->scheduler = lr_scheduler_from_args(args, run->data.max_steps);
    run->muon_scheduler = run->scheduler;
    run->muon_scheduler.learning_rate = args.muon_learning_rate;
    int eot;
    run->have_tokenizer = load_sample_tokenizer(args, cfg, &run->tokenizer, &eot);
    run->sample_settings = sample_settings_from_args(args, cfg, eot);
    if (args.hellaswag_every > 0) {
        hellaswag_load_for_run(args.hellaswag_path, cfg.vocab_size, run_tokenizer(*run), &run->hellaswag);
    }
    if (!args.output_dir.empty()) make_dir_check(args.output_dir);
    run->sampler_rng = (uint64_t)args.sample_seed;
    run->scaler = loss_scaler_from_args(args, dynamic_loss_scale);
}

// Mean loss over the first -m val batches, the same batches on any layout: the val loader is not
// shuffled, so data-parallel process r's k-th batch is the val data's batch k*P + r, counting across
// its shards (llmc/io/dataloader.h), and process r counts its k-th batches while k*P + r < m. Every
// process runs the same number of forwards, ceil(m / P) (a forward may be collective: ZeRO-3's
// gathers, a pipeline); the losses of batches past m (which may wrap to the val data's start) are not
// counted.
inline float run_validation_loss(TrainRun* run, const RunHooks& hooks) {
    DataLoader* val = &run->data.val;
    dataloader_reset(val);
    int m = run->args.val_batches, P = run->dp_size, r = val->process_rank;
    double sum = 0.0;
    for (int k = 0; k < (m + P - 1) / P; k++) {
        dataloader_next_batch(val);
        double loss = hooks.eval_loss(val->inputs.data(), val->targets.data(), val->B, val->T);
        if ((long)k * P + r < m) sum += loss;
    }
    return (float)(hooks.sum_over_replicas(sum, "the val loss") / (double)m);
}

// The step's micro-batches from the train loader (with -a, the one batch read before the loop).
inline void read_step_batches(TrainRun* run, StepBatches* batches) {
    DataLoader& loader = run->data.train;
    int m = run->data.grad_accum_steps;
    size_t BT = (size_t)loader.B * loader.T;
    batches->count = m;
    batches->B = loader.B;
    batches->T = loader.T;
    batches->inputs.resize(m * BT);
    batches->targets.resize(m * BT);
    for (int micro = 0; micro < m; micro++) {
        if (!run->args.overfit_single_batch) dataloader_next_batch(&loader);
        std::copy(loader.inputs.begin(), loader.inputs.begin() + BT, batches->inputs.begin() + micro * BT);
        std::copy(loader.targets.begin(), loader.targets.begin() + BT, batches->targets.begin() + micro * BT);
    }
}

// One training step (after the step's evaluation, checkpoint and sample): prints and logs its line.
inline void run_train_step(TrainRun* run, const RunHooks& hooks, int step, StepBatches* batches) {
    const TrainArgs& args = run->args;
    PhaseTimer* timer = &run->timer;
    LossScaler* scaler = &run->scaler;
    int m = run->data.grad_accum_steps, max_steps = run->data.max_steps;
    auto start = std::chrono::steady_clock::now();
    long long comm_before = hooks.comm_bytes ? hooks.comm_bytes() : -1;
    hooks.zero_grad();
    phase_begin(timer, PHASE_DATA);
    read_step_batches(run, batches);
    phase_end(timer);
    // every position of every micro-batch of every process weighs the same in the step's mean loss;
    // times S, the loss scale (1 unless FP16): the gradients come out S times too large
    // (-lh: each replica steps alone on its own batches' mean, llmc/parallel/local_steps.h)
    float dloss = scaler->scale / ((float)batches->B * batches->T * m * (run->local_steps ? 1 : run->dp_size));
    float step_scale = scaler->scale;  // the S these gradients carry (the scaler may move it below)
    int bad_micro = run->injects_bad_micro && is_inject_step(args, step) ? m - 1 : -1;
    double loss_sum = hooks.forward_backward(*batches, dloss, bad_micro, timer);
    phase_begin(timer, PHASE_COMM);
    float loss = (float)(hooks.sum_over_replicas(loss_sum, "the step's loss") / ((double)m * run->dp_size));
    if (hooks.complete_gradients) hooks.complete_gradients(step_scale);
    phase_end(timer);
    phase_begin(timer, PHASE_GRADNORM);
    double scaled_norm = hooks.grad_norm();  // global: every process decides the same
    phase_end(timer);
    OptimizerStep update;
    float lr = update.lr = lr_at_step(run->scheduler, step);
    update.muon_lr = lr_at_step(run->muon_scheduler, step);
    update.weight_decay = args.weight_decay;
    update.grad_scale = loss_scaler_grad_scale(*scaler, scaled_norm, 1.0);  // 1/S and the clipping
    bool apply = loss_scaler_step(scaler, scaled_norm, step);
    update.t = (int)scaler->updates;
    update.step = step;
    update.last = step + 1 == max_steps;
    phase_begin(timer, PHASE_OPTIMIZER);
    hooks.update(apply, update);
    phase_end(timer);
    double grad_norm = scaled_norm / step_scale;
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    double tokens_per_s = (double)run->data.tokens_per_step / (ms / 1000.0);
    StepThroughput throughput = step_throughput(run->flops_per_step, ms, run->peak_flops);
    if (throughput.mfu > 1.0 && hooks.measure_peak) {  // the peak was measured low: measure it again
        double was = run->peak_flops;
        run->peak_flops = peak_after_step(was, throughput.flops_per_s, hooks.measure_peak);
        printf("note: step %d ran at %.1f GFLOP/s, above the %.1f GFLOP/s peak measured at start-up (a busy or "
               "throttled core then); measured again, the peak is %.1f GFLOP/s, and MFU is of that from here on\n",
               step, throughput.flops_per_s / 1e9, was / 1e9, run->peak_flops / 1e9);
        throughput = step_throughput(run->flops_per_step, ms, run->peak_flops);
    }
    std::string note;
    char text[128];
    if (scaler->dynamic) {
        snprintf(text, sizeof(text), " | scale %g", step_scale);
        note += text;
    }
    if (args.optimizer == "muon") {
        snprintf(text, sizeof(text), " | muon lr %.3e", update.muon_lr);
        note += text;
    }
    if (!apply) {
        snprintf(text, sizeof(text), " | SKIPPED: non-finite gradient norm (%ld so far)", (long)scaler->skipped_total);
        note += text;
    }
    if (hooks.step_note) note += hooks.step_note();
    printf("step %4d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s%s\n", step, max_steps, loss, lr,
           grad_norm, ms, tokens_per_s, step_breakdown_text(timer->times, throughput, run->peak_flops).c_str(),
           note.c_str());
    long long comm = hooks.comm_bytes ? hooks.comm_bytes() - comm_before : -1;
    logger_log_train(&run->logger, step, loss, lr, (float)grad_norm, ms, tokens_per_s, !apply,
                     (long)scaler->skipped_total, scaler->dynamic ? step_scale : 0.0f, comm,
                     step_breakdown_json(timer->times, throughput, run->peak_flops));
}

// A checkpoint written in the background (-ca 1, llmc/run/checkpoint_writer.h): complete once every
// process's files are written, which the processes agree on here (an all-reduce, only while one is in
// flight). wait: block until this process's are; otherwise a process not yet done leaves it for the
// next step boundary. Collective.
inline void run_checkpoint_settle(const RunHooks& hooks, bool wait) {
    if (!checkpoint_writer_in_flight()) return;
    if (wait) checkpoint_writer_wait();
    double pending = checkpoint_writer_done() ? 0.0 : 1.0;
    if (hooks.sum_over_world) pending = hooks.sum_over_world(pending, "the check for a finished checkpoint");
    if (pending > 0.0) return;
    checkpoint_writer_complete([&](const char* what) {
        if (hooks.sum_over_world) hooks.sum_over_world(0.0, what);  // an all-reduce is a barrier
    });
}

// Checkpoint `step` (collective): an error exit from here until it is complete removes its files. One
// still written in the background is completed first.
inline void run_save_checkpoint(TrainRun* run, const RunHooks& hooks, int step) {
    run_checkpoint_settle(hooks, true);
    checkpoint_begin(run->args.output_dir, step, run->world_rank);
    hooks.save_checkpoint(*run, step);
}

// The signal that asks the run to stop, received by any process (0: none); the same on every process.
inline int run_stop_signal(const RunHooks& hooks) {
    int mine = stop_signal_received;
    if (!hooks.sum_over_world) return mine;
    // SIGTERM counts 2^20, SIGUSR1 1: with fewer than 2^20 processes the sum reaches 2^20 when any has
    // SIGTERM (named first), else 1 when any has SIGUSR1 (several SIGUSR1s are not a SIGTERM)
    const double term = 1 << 20;
    double sum = hooks.sum_over_world(mine == SIGTERM ? term : mine ? 1.0 : 0.0, "the check for a stop signal");
    return sum >= term ? SIGTERM : sum >= 1.0 ? SIGUSR1 : 0;
}

// The loop: from the resumed step (or 0) to -x, each step's evaluation, checkpoint and sample, then its
// training (the last step only evaluates, checkpoints and samples). Opens and closes metrics.jsonl.
// Returns the process's exit status: 0, or EXIT_STOPPED_BY_SIGNAL when a signal stopped the run.
inline int train_run_loop(TrainRun* run, const RunHooks& hooks) {
    const TrainArgs& args = run->args;
    int max_steps = run->data.max_steps;
    logger_open(&run->logger, run->world_rank == 0 ? args.output_dir : std::string(), run->resume_step);
    if (args.overfit_single_batch && max_steps > 0) {  // the one batch every step reuses: the stream's first, resumed or not
        DataPosition saved = run->data.train.position;
        dataloader_reset(&run->data.train);
        dataloader_next_batch(&run->data.train);
        if (run->resume_step >= 0) dataloader_seek(&run->data.train, saved);  // the checkpoints keep the resumed position
    }
    int start_step = run->resume_step >= 0 ? run->resume_step : 0;
    StepBatches batches;
    stop_signals_install();  // the trainers install them first thing too (a signal during start-up)
    watchdog_set_limit(args.watchdog_s);  // start-up is over: from now on a wait may last -wt seconds
    // a signal that came while the run started (loading, resuming, allocating): nothing has trained
    // since the checkpoint it started from (or from scratch), so the run ends before its first step
    if (int signal = run_stop_signal(hooks)) {
        printf("%s during start-up: stopping before step %d, nothing trained to checkpoint; exit status %d "
               "(-y 1 continues from the newest checkpoint there is)\n", stop_signal_name(signal), start_step,
               EXIT_STOPPED_BY_SIGNAL);
        logger_close(&run->logger);
        return EXIT_STOPPED_BY_SIGNAL;
    }
    for (int step = start_step; step <= max_steps; step++) {
        watchdog_step = step;
        flight_set_step(step);
        run_checkpoint_settle(hooks, false);  // -ca 1: the checkpoint in flight, if every process has written it
        if (int signal = step > start_step ? run_stop_signal(hooks) : 0) {
            // steps start_step .. step - 1 are done: the parameters have had `step` updates
            if (!args.output_dir.empty()) run_save_checkpoint(run, hooks, step);
            run_checkpoint_settle(hooks, true);
            flight_dump(std::string(stop_signal_name(signal)) + " at step " + std::to_string(step));  // the collectives so far
            printf("%s: stopping at step %d, %s; exit status %d\n", stop_signal_name(signal), step,
                   args.output_dir.empty() ? "no checkpoint (no -o)" : "checkpoint written (-y 1 continues from it)",
                   EXIT_STOPPED_BY_SIGNAL);
            logger_close(&run->logger);
            return EXIT_STOPPED_BY_SIGNAL;
        }
        if (is_val_step(args, step, max_steps)) {
            float val_loss = run_validation_loss(run, hooks);
            printf("step %d: val loss %.6f\n", step, val_loss);
            logger_log_val(&run->logger, step, val_loss);
        }
        if (is_hellaswag_step(args, step, max_steps)) {
            HellaSwagResult hs = hooks.hellaswag(run->hellaswag);
            printf("step %d: HellaSwag acc %.4f acc_norm %.4f acc_token %.4f (%.0f examples)\n", step, hs.acc(),
                   hs.acc_norm(), hs.acc_token(), hs.examples);
            logger_log_hellaswag(&run->logger, step, hs.acc(), hs.acc_norm(), hs.acc_token(), (long)hs.examples);
        }
        phase_reset(&run->timer);
        if (is_checkpoint_step(args, step, start_step, max_steps)) {
            phase_begin(&run->timer, PHASE_CHECKPOINT);
            run_save_checkpoint(run, hooks, step);
            phase_end(&run->timer);
        }
        if (is_sample_step(args, step, max_steps)) hooks.sample(run);
        if (step == max_steps) break;
        run_train_step(run, hooks, step, &batches);
    }
    run_checkpoint_settle(hooks, true);
    logger_close(&run->logger);
    return 0;
}
