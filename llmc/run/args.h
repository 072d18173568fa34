// Command-line flags of the trainers, shared by train_gpt2.cpp and train_gpt2.cu.
//
// Flags use llm.c's letters where llm.c has one. Every flag takes a value ("-b 4"). A value that does
// not parse, or lies outside the flag's range, is refused with a message naming the flag; nothing is
// clamped. Checks that need the model or the data (T <= maxT, batch divisibility) are done by
// validate_batch_args() once those are known.
#pragma once

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../optimizer.h"
#include "../parallel/bootstrap.h"
#include "../parallel/context_split.h"
#include "../parallel/layout.h"
#include "../utils.h"
#include "schedulers.h"

struct TrainArgs {
    // data
    std::string train_pattern = "dev/data/tinyshakespeare/tinyshakespeare_train_*.bin";
    std::string val_pattern = "dev/data/tinyshakespeare/tinyshakespeare_val_*.bin";
    std::string tokenizer_path = "gpt2_tokenizer.bin";
    int shuffle = 1;
    // model
    std::string model = "d12";  // a checkpoint path, or a descriptor d6/d12/d24/d36/d48 for random init
    int seed = 1337;            // random initialization
    // batch
    int B = 4;
    int T = 64;
    long total_batch_tokens = -1;  // -1: one micro-batch per step (B*T*processes)
    // optimization
    int max_steps = -1;            // -1: one epoch of the training data; 0: no training (evaluate, sample)
    float learning_rate = 3e-4f;
    int warmup_steps = 0;
    float final_lr_frac = 1.0f;
    std::string schedule = "cosine";
    float weight_decay = 0.0f;
    std::string optimizer = "adamw";   // adamw|muon|adafactor|adamw8 (llmc/optimizer.h)
    float muon_learning_rate = 0.02f;  // -opt muon: Muon's rate for the block matrices (-l is AdamW's)
    int overfit_single_batch = 0;
    // evaluation, sampling, output
    int val_every = 20;
    int val_batches = 20;
    int sample_every = 20;
    int gen_tokens = 64;
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0: the whole vocabulary
    std::string prompt;        // text a sample continues (after end-of-text); empty: end-of-text alone
    std::string bpe_dir;       // GPT-2's encoder.json + vocab.bpe, to tokenize the prompt (llmc/tokenizer/prompt.h)
    int sample_seed = 1337;    // the sampler's random stream
    std::string hellaswag_path;  // hellaswag_val.bin (llmc/run/hellaswag.h)
    int hellaswag_every = 0;     // 0: never
    int hellaswag_examples = 0;  // 0: all of the file
    std::string output_dir;
    int checkpoint_every = 0;
    int checkpoint_async = 0;  // -ca 1: checkpoint files written by a thread while training goes on
    std::string checkpoint_format = "ours";  // -cf llmc: state files in llm.c's format (llmc/io/llmc_state.h)
    std::string grad_compression = "none";   // -gc sign|powersgd: compressed gradient reduction (llmc/parallel/grad_compression.h)
    int grad_rank = 4;                        // -gr R: PowerSGD's rank (llmc/parallel/powersgd.h)
    int local_steps = 0;   // -lh H: replicas synchronize every H steps (llmc/parallel/local_steps.h); 0: every step
    int local_outer = 1;   // -lo 1: DiLoCo's outer Nesterov step; 0: plain averaging
    int resume = 0;
    // data parallelism (mpirun -np N)
    int zero_stage = 0;
    // model parallelism (CPU trainer; llmc/parallel/layout.h): the rest of the processes are data parallel
    int tensor_parallel = 1;
    int pipeline_parallel = 1;
    int sequence_parallel = 0;  // -sq 1: with -tp, the residual stream split by rows (tensor_parallel.h)
    int context_parallel = 1;   // -cp N: each sequence's positions split over N processes (context_parallel.h)
    std::string context_mode = "ring";  // -cpm ring|ulysses: how their attention sees every key
    std::string pipeline_schedule = "1f1b";  // gpipe|1f1b
    int recompute = 1;  // activation recomputation level, both trainers (-r); RECOMPUTE_AUTO: -r auto (CUDA)
    float peak_gflops = 0;  // MFU's denominator (-pk); 0: CPU measures it, CUDA uses its table
    // CUDA trainer only
    int master_weights = 1;
    int gelu_fusion = 0;
    int matmul_autotune = 0;  // -at 1: time cuBLASLt's candidates per matmul problem (llmc/matmul.cuh)
    int bias_grad_epilogue = 0;  // -bg 1: bias gradients from cuBLASLt's BGRADB epilogue (llmc/matmul.cuh)
    int head_chunks = 0;  // -lc N: the LM head and loss over N chunks of rows, no (B·T, Vp) logits kept (train_gpt2.cu)
    int fp8 = 0;  // -fp8 1: the block matmuls in FP8, 2: and the LM head's (llmc/fp8_linear.cuh; bf16 build, sm_89+)
    int offload_optimizer = 0;  // -oo 1: AdamW's state in pinned host memory, updated by the CPU (doc/memory.md)
    int plan = 0;  // -P 1: print the memory plan and exit without allocating (both trainers; doc/memory.md)
    int flash_attention = 1;
    // non-finite steps and loss scaling (llmc/run/loss_scaler.h); -l? are used by the FP16 build only
    int max_skipped_steps = 8;         // consecutive skipped (non-finite) steps before the run stops
    std::string inject_nonfinite;      // testing: "3,5" = steps whose gradients process 0 makes non-finite
    std::vector<int> inject_steps;     // parsed from inject_nonfinite
    float loss_scale = 65536.0f;       // initial S
    int loss_scale_window = 2000;      // clean steps before S grows
    float loss_scale_growth = 2.0f;
    float loss_scale_backoff = 0.5f;
    // CUDA trainer only: several GPUs, one process each (llmc/parallel/bootstrap.h, llmc/parallel/gpu_start.cuh)
    LaunchSettings launch;  // -pi -pn -pr -pg -ps -pf -pt: how the processes find each other (bootstrap.h)
    float watchdog_s = 1800.0f;  // -wt: the collective watchdog's limit once training runs (llmc/parallel/watchdog.h)
};

enum class FlagKind { Int, Long, Float, String };

// -r auto (the CUDA trainer): the least recomputation whose activations fit the GPU's free memory
constexpr int RECOMPUTE_AUTO = -1;
// -b auto (the CUDA trainer, with -d): the largest micro-batch that fits, accumulation making up -d
constexpr int BATCH_AUTO = -1;

struct FlagSpec {
    const char* name;  // "-b"
    FlagKind kind;
    void* field;       // the TrainArgs member it sets
    double min, max;   // numeric range, inclusive (NAN: no bound)
    bool cuda_only;
    const char* help;
};

// The flag table, bound to the members of `a`.
inline std::vector<FlagSpec> flag_specs(TrainArgs* a) {
    return {
        {"-i", FlagKind::String, &a->train_pattern, NAN, NAN, false, "train data shards (glob pattern)"},
        {"-j", FlagKind::String, &a->val_pattern, NAN, NAN, false, "val data shards (glob pattern)"},
        {"-e", FlagKind::String, &a->model, NAN, NAN, false, "model: checkpoint .bin, or d6|d12|d24|d36|d48 for random init (d6:4096: with a context of 4096 positions)"},
        {"-o", FlagKind::String, &a->output_dir, NAN, NAN, false, "output dir for main.log, metrics.jsonl, checkpoints"},
        {"-b", FlagKind::Int, &a->B, 1, 1 << 20, false, "micro-batch size B; CUDA with -d: auto, the largest that fits the GPU"},
        {"-t", FlagKind::Int, &a->T, 1, 1 << 20, false, "sequence length T (at most the model's maxT)"},
        {"-d", FlagKind::Long, &a->total_batch_tokens, -1, 1e15, false, "total batch in tokens, a multiple of B*T (-1: B*T)"},
        {"-x", FlagKind::Int, &a->max_steps, -1, INT_MAX, false, "max steps (-1: one epoch; 0: no training, only evaluate and sample)"},
        {"-l", FlagKind::Float, &a->learning_rate, 0, 10, false, "learning rate"},
        {"-u", FlagKind::Int, &a->warmup_steps, 0, INT_MAX, false, "learning rate warmup steps"},
        {"-q", FlagKind::Float, &a->final_lr_frac, 0, 1, false, "final learning rate as a fraction of -l"},
        {"-k", FlagKind::String, &a->schedule, NAN, NAN, false, "learning rate schedule: cosine|linear|constant|wsd"},
        {"-c", FlagKind::Float, &a->weight_decay, 0, 10, false, "weight decay (2-D tensors only)"},
        {"-opt", FlagKind::String, &a->optimizer, NAN, NAN, false, "optimizer: adamw|muon|adafactor|adamw8 (doc/optimizers.md)"},
        {"-ml", FlagKind::Float, &a->muon_learning_rate, 0, 10, false, "-opt muon: Muon's learning rate (block matrices; -l: AdamW's, the rest)"},
        {"-lh", FlagKind::Int, &a->local_steps, 0, 1000000, false, "local steps: data-parallel replicas synchronize every H steps (0: every step; -z 0, AdamW; doc/data_parallel.md)"},
        {"-lo", FlagKind::Int, &a->local_outer, 0, 1, false, "-lh's outer step: 1 DiLoCo's Nesterov momentum, 0 the replicas' mean"},
        {"-gc", FlagKind::String, &a->grad_compression, NAN, NAN, false, "data-parallel gradients: none|sign|powersgd (1 bit an element, or each matrix as rank -gr factors; error feedback; -z 0; doc/data_parallel.md)"},
        {"-gr", FlagKind::Int, &a->grad_rank, 1, 64, false, "-gc powersgd's rank R"},
        {"-v", FlagKind::Int, &a->val_every, 0, INT_MAX, false, "val loss every N steps (0: never)"},
        {"-m", FlagKind::Int, &a->val_batches, 1, INT_MAX, false, "val batches per val loss (all data-parallel processes together)"},
        {"-s", FlagKind::Int, &a->sample_every, 0, INT_MAX, false, "sample every N steps (0: never)"},
        {"-g", FlagKind::Int, &a->gen_tokens, 1, 1 << 20, false, "tokens to generate per sample"},
        {"-n", FlagKind::Int, &a->checkpoint_every, 0, INT_MAX, false, "checkpoint every N steps, and at the end (0: never; needs -o)"},
        {"-ca", FlagKind::Int, &a->checkpoint_async, 0, 1, false, "1: write checkpoint files in a background thread while training goes on (llmc/run/checkpoint_writer.h)"},
        {"-cf", FlagKind::String, &a->checkpoint_format, NAN, NAN, false, "state files of checkpoints: ours|llmc (llm.c's, which its -y 1 continues; AdamW, no -tp/-pp)"},
        {"-y", FlagKind::Int, &a->resume, 0, 1, false, "1: resume from the newest complete checkpoint in -o"},
        {"-a", FlagKind::Int, &a->overfit_single_batch, 0, 1, false, "1: train on the first batch only (overfit)"},
        {"-sh", FlagKind::Int, &a->shuffle, 0, 1, false, "1: shuffle the training samples (one stream whatever B and the layout); 0: file order"},
        {"-sd", FlagKind::Int, &a->seed, 0, INT_MAX, false, "seed of the random initialization"},
        {"-z", FlagKind::Int, &a->zero_stage, 0, 3, false, "ZeRO stage with several processes: 0 all-reduce, 1 shard optimizer state, 2 and gradients, 3 and parameters"},
        {"-tp", FlagKind::Int, &a->tensor_parallel, 1, 1 << 16, false, "tensor-parallel size (divides the processes, the heads and the padded vocabulary)"},
        {"-sq", FlagKind::Int, &a->sequence_parallel, 0, 1, false, "1: sequence parallelism with -tp (layernorms and residuals split by rows across the TP group)"},
        {"-cp", FlagKind::Int, &a->context_parallel, 1, 1 << 16, false, "context-parallel size: each sequence's positions split over N processes"},
        {"-cpm", FlagKind::String, &a->context_mode, NAN, NAN, false, "context parallelism's attention: ring (K/V passed around, load-balanced split) | ulysses (all-to-all to whole heads)"},
        {"-pp", FlagKind::Int, &a->pipeline_parallel, 1, 1 << 16, false, "pipeline-parallel size: stages (at most the layers)"},
        {"-pm", FlagKind::String, &a->pipeline_schedule, NAN, NAN, false, "pipeline schedule: gpipe|1f1b"},
        {"-st", FlagKind::Float, &a->temperature, 0, 100, false, "sampling temperature (0: greedy)"},
        {"-sk", FlagKind::Int, &a->top_k, 0, INT_MAX, false, "sample from the K most likely tokens only (0: all)"},
        {"-sp", FlagKind::String, &a->prompt, NAN, NAN, false, "prompt text the samples continue (tokenized with -bp)"},
        {"-bp", FlagKind::String, &a->bpe_dir, NAN, NAN, false, "dir of GPT-2's encoder.json, vocab.bpe (for -sp; else $GPT2_BPE_DIR, dev/data/gpt2-bpe)"},
        {"-ss", FlagKind::Int, &a->sample_seed, 0, INT_MAX, false, "seed of the sampler"},
        {"-hs", FlagKind::String, &a->hellaswag_path, NAN, NAN, false, "HellaSwag eval file (dev/data/hellaswag.py)"},
        {"-he", FlagKind::Int, &a->hellaswag_every, 0, INT_MAX, false, "HellaSwag accuracy every N steps and at the end (0: never)"},
        {"-hm", FlagKind::Int, &a->hellaswag_examples, 0, INT_MAX, false, "HellaSwag: the first M examples only (0: all)"},
        {"-tk", FlagKind::String, &a->tokenizer_path, NAN, NAN, false, "gpt2_tokenizer.bin, to print samples as text"},
        {"-ns", FlagKind::Int, &a->max_skipped_steps, 1, INT_MAX, false, "stop after N consecutive steps skipped for a non-finite gradient norm"},
        {"-ni", FlagKind::String, &a->inject_nonfinite, NAN, NAN, false, "testing: steps (e.g. 3,5) whose gradients process 0 makes non-finite"},
        {"-ls", FlagKind::Float, &a->loss_scale, 1, 3.0e38, true, "FP16 build: initial loss scale S"},
        {"-lw", FlagKind::Int, &a->loss_scale_window, 1, INT_MAX, true, "FP16 build: clean steps before S grows"},
        {"-lg", FlagKind::Float, &a->loss_scale_growth, 1, 1024, true, "FP16 build: factor S grows by"},
        {"-lb", FlagKind::Float, &a->loss_scale_backoff, 1e-6, 1, true, "FP16 build: factor S shrinks by on overflow"},
        {"-r", FlagKind::Int, &a->recompute, 0, 3, false, "recompute: 0 none, 1 GELU, 2 GELU and layernorms, 3 whole blocks (keep block inputs); CUDA: auto, the least that fits the GPU"},
        {"-pk", FlagKind::Float, &a->peak_gflops, 0, 1e9, false, "peak GFLOP/s for MFU (0: CPU measures its FMA peak, CUDA its table)"},
        {"-w", FlagKind::Int, &a->master_weights, 0, 1, true, "1: keep fp32 master weights"},
        {"-ge", FlagKind::Int, &a->gelu_fusion, 0, 1, true, "1: fuse GELU into the matmuls (cuBLASLt epilogues)"},
        {"-at", FlagKind::Int, &a->matmul_autotune, 0, 1, true, "1: time cuBLASLt's first 8 algorithms per matmul problem once and keep the fastest (separate runs may differ in the last bits; a resumed run takes its checkpoint's choices)"},
        {"-bg", FlagKind::Int, &a->bias_grad_epilogue, 0, 1, true, "1: bias gradients from the weight-gradient matmul's cuBLASLt epilogue (BGRADB) instead of our kernel"},
        {"-lc", FlagKind::Int, &a->head_chunks, 0, 1 << 20, true, "N: the LM head, the loss and the head's gradient in N chunks of rows (B*T/N rounded up; with -fp8 2 to a multiple of 16), each chunk's logits gone before the next: no (B*T, Vp) logits kept (0: all rows at once, their gradient kept for the backward; doc/memory.md)"},
        {"-fp8", FlagKind::Int, &a->fp8, 0, 2, true, "1: the block's four matmuls in FP8, forward and backward; 2: also the LM head's forward and input gradient (bf16 build on an sm_89+ GPU; doc/mixed_precision.md)"},
        {"-oo", FlagKind::Int, &a->offload_optimizer, 0, 1, true, "1: AdamW's state (m, v, master weights) in host memory, updated by the CPU"},
        {"-P", FlagKind::Int, &a->plan, 0, 1, false, "1: print the memory plan (per process) and exit without allocating"},
        {"-fa", FlagKind::Int, &a->flash_attention, 0, 1, true, "1: flash attention (bf16 build); 0: cuBLAS + softmax, stores (B, NH, T, T)"},
        {"-pi", FlagKind::String, &a->launch.init_method, NAN, NAN, true, "multi-GPU start: auto|mpi|tcp|file (auto: mpi under mpirun)"},
        {"-pn", FlagKind::Int, &a->launch.num_processes, 1, 1 << 16, true, "number of processes (-pi tcp|file; mpirun sets it)"},
        {"-pr", FlagKind::Int, &a->launch.process_rank, 0, (1 << 16) - 1, true, "rank of this process, 0..pn-1 (-pi tcp|file)"},
        {"-pg", FlagKind::Int, &a->launch.gpus_per_node, 0, 1024, true, "GPUs per node, GPU = rank % pg (0: all visible)"},
        {"-ps", FlagKind::String, &a->launch.server_address, NAN, NAN, true, "HOST:PORT where rank 0 listens (-pi tcp)"},
        {"-pf", FlagKind::String, &a->launch.bootstrap_file, NAN, NAN, true, "shared file for rank 0's NCCL id, new per run (-pi file)"},
        {"-pt", FlagKind::Float, &a->launch.timeout_s, 1, 86400, false, "seconds a process may wait on the others during start-up (the launch and every collective before training) before the watchdog ends the run"},
        {"-wt", FlagKind::Float, &a->watchdog_s, 1, 604800, false, "seconds a process may wait on the others once training runs before the watchdog ends the run (llmc/parallel/watchdog.h)"},
    };
}

// The value a flag's field holds, as text ("%g" for floats)
inline std::string flag_value_text(const FlagSpec& spec) {
    const char* field = (const char*)spec.field;
    char value[64];
    switch (spec.kind) {
        case FlagKind::Int:
            if ((strcmp(spec.name, "-r") == 0 && *(const int*)field == RECOMPUTE_AUTO) ||
                (strcmp(spec.name, "-b") == 0 && *(const int*)field == BATCH_AUTO)) {
                return "auto";
            }
            snprintf(value, sizeof(value), "%d", *(const int*)field);
            break;
        case FlagKind::Long: snprintf(value, sizeof(value), "%ld", *(const long*)field); break;
        case FlagKind::Float: snprintf(value, sizeof(value), "%g", *(const float*)field); break;
        case FlagKind::String: return *(const std::string*)field;
    }
    return value;
}

inline void print_usage(const char* program, bool cuda) {
    TrainArgs defaults;
    printf("Usage: %s [flags], each flag followed by a value:\n", program);
    for (const FlagSpec& spec : flag_specs(&defaults)) {
        if (spec.cuda_only && !cuda) continue;
        std::string value = flag_value_text(spec);
        printf("  %-4s %-60s (default: %s)\n", spec.name, spec.help, value.empty() ? "none" : value.c_str());
    }
}

// Parses one numeric value; refuses garbage, trailing characters and out-of-range values.
inline double parse_number(const char* flag, const char* text, bool integer, double min, double max) {
    errno = 0;
    char* end = nullptr;
    double value = integer ? (double)strtoll(text, &end, 10) : strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE || !std::isfinite(value)) {
        fatal("flag %s: '%s' is not %s", flag, text, integer ? "an integer" : "a number");
    }
    if ((!std::isnan(min) && value < min) || (!std::isnan(max) && value > max)) {
        fatal("flag %s: %s is outside the allowed range %.10g .. %.10g", flag, text, min, max);
    }
    return value;
}

// -cpm as the layout takes it (parse_args has checked the name).
inline ContextMode context_mode(const TrainArgs& args) {
    ContextMode mode = ContextMode::ring;
    context_mode_from_name(args.context_mode, &mode);
    return mode;
}

// The process layout the flags ask for (-tp, -pp, -cp, -cpm, -z, -sq; llmc/parallel/layout.h), both
// trainers'; fatal, with the reason, when it cannot run. Every process must call it.
inline ParallelLayout parallel_layout_from_args(const ProcessGroup& world, const TrainArgs& args, const GPT2Config& cfg) {
    ParallelLayout lay = parallel_layout_init(world, args.tensor_parallel, args.pipeline_parallel, args.zero_stage, cfg,
                                              args.context_parallel, context_mode(args));
    lay.sequence_parallel = args.sequence_parallel && lay.tp > 1;
    return lay;
}

// Flags that cannot be combined with the process layout (-tp, -pp): fatal, with the reason. The CUDA
// trainer (cuda) also runs ZeRO-2/3 with tensor parallelism (2-D: the data-parallel group shards each
// tensor-parallel rank's slices).
inline void check_layout_flags(const TrainArgs& args, bool cuda) {
    int tp = args.tensor_parallel, pp = args.pipeline_parallel;
    if (tp > 1 && (args.sample_every > 0 || args.hellaswag_every > 0)) {
        fatal("-tp %d: sampling (-s) and HellaSwag (-he) need the whole logits, which tensor parallelism keeps split "
              "by vocabulary; run with -s 0 (and no -he)", tp);
    }
    ContextMode cp_mode;
    if (!context_mode_from_name(args.context_mode, &cp_mode)) {
        fatal("flag -cpm: unknown context-parallel attention '%s' (ring or ulysses)", args.context_mode.c_str());
    }
    if (int cp = args.context_parallel; cp > 1) {
        if (cuda && args.sample_every > 0) {
            fatal("flag -cp %d: the CUDA trainer does not sample with context parallelism (its generation runs one "
                  "position at a time on each process); use -s 0, or the CPU trainer (train_gpt2), which samples "
                  "from its whole copy of the model", cp);
        }
        std::string problem = context_split_problem(cp, cp_mode, args.T);
        if (!problem.empty()) fatal("%s", problem.c_str());
        if (args.hellaswag_every > 0) {
            fatal("flag -cp %d: HellaSwag (-he) scores whole rows, which context parallelism splits; run it without -cp", cp);
        }
        if (args.local_steps > 0 || args.grad_compression != "none") {
            fatal("flag -cp %d with %s: a replica's gradient is the sum of its %d context-parallel processes' parts, "
                  "which -lh and -gc do not form; use them without -cp", cp, args.local_steps > 0 ? "-lh" : "-gc", cp);
        }
    }
    if (args.sequence_parallel && tp == 1) {
        fatal("flag -sq 1: sequence parallelism splits the rows of the tensor-parallel group; it needs -tp 2 or more");
    }
    // ZeRO-2/3 (llmc/parallel/zero_sharded.h) shard the flat parameter vector of a data-parallel layout; tensor and
    // pipeline parallelism split the same parameters another way
    if (args.zero_stage >= 2 && pp > 1) {
        fatal("flag -z %d: ZeRO stages 2 and 3 do not run with pipeline stages; with -pp use -z 0 or -z 1", args.zero_stage);
    }
    if (args.zero_stage >= 2 && tp > 1 && !cuda) {
        fatal("flag -z %d: the CPU trainer runs ZeRO stages 2 and 3 with data parallelism alone; with -tp use -z 0 or "
              "-z 1 (the CUDA trainer has -z 2 and 3 with -tp)", args.zero_stage);
    }
    // Muon and Adafactor take each layer's matrix whole, from the flat vector of a data-parallel layout.
    // Muon also runs on a tensor-parallel rank's slices (gathered whole, llmc/parallel/muon_step.h for both
    // trainers), on a pipeline stage's layers (each stage its own matrices; Adafactor too) and on
    // ZeRO-2/3's shards of the gradients (each matrix gathered on its own), though not on both slices and
    // shards at once (the CUDA trainer's -z 2/3 with -tp); Adafactor's factored moments of a sliced
    // matrix would need sums across the group
    bool muon = args.optimizer == "muon";
    if (muon && args.zero_stage >= 2 && tp > 1) {
        fatal("-opt muon with -z %d and -tp %d: Muon gathers either a tensor-parallel rank's slices or a ZeRO shard's "
              "part of each matrix, not both; use -z 0 or -z 1 with -tp, or -z %d without", args.zero_stage, tp,
              args.zero_stage);
    }
    // 8-bit AdamW's blocks are counted from each tensor's start in the flat vector of a data-parallel layout;
    // a rank's slices or a stage's layers would need their blocks put together for a checkpoint (not built)
    if (args.optimizer == "adamw8" && (tp > 1 || pp > 1)) {
        fatal("-opt adamw8 runs with data parallelism at every ZeRO stage, not with -tp or -pp (this run has -tp %d "
              "-pp %d): its checkpoints are not put together across slices and stages; use -opt adamw there", tp, pp);
    }
    if (args.optimizer != "adamw" && args.optimizer != "adamw8" && !muon && (args.zero_stage >= 2 || tp > 1)) {
        fatal("-opt %s runs with data parallelism and ZeRO stages 0 and 1 only, and on pipeline stages (this run has -z %d, "
              "-tp %d); use -z 0 or -z 1 without -tp, or -opt adamw", args.optimizer.c_str(), args.zero_stage, tp);
    }
    if (pp > 1 && (args.sample_every > 0 || args.hellaswag_every > 0)) {
        fatal("-pp %d: sampling (-s) and HellaSwag (-he) are not implemented through a pipeline (only the last stage "
              "has logits); run with -s 0 (and no -he)", pp);
    }
}

// Parses argv into args. Prints usage and exits 0 on -h; exits 1 on anything it cannot accept.
inline void parse_args(int argc, char** argv, TrainArgs* args, bool cuda) {
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) {
            print_usage(argv[0], cuda);
            exit(EXIT_SUCCESS);
        }
        std::vector<FlagSpec> specs = flag_specs(args);
        const FlagSpec* spec = nullptr;
        for (const FlagSpec& s : specs) {
            if (strcmp(s.name, flag) == 0 && (cuda || !s.cuda_only)) spec = &s;
        }
        if (spec == nullptr) {
            for (const FlagSpec& s : specs) {
                if (strcmp(s.name, flag) == 0) fatal("flag %s is the CUDA trainer's (train_gpt2cu): %s", flag, s.help);
            }
            fatal("unknown flag '%s' (run %s -h for the list)", flag, argv[0]);
        }
        if (i + 1 >= argc) fatal("flag %s needs a value", flag);
        const char* value = argv[++i];
        void* field = spec->field;
        switch (spec->kind) {
            case FlagKind::Int:
                if ((field == &args->B || field == &args->recompute) && strcmp(value, "auto") == 0) {
                    if (!cuda) fatal("flag %s auto: only the CUDA trainer chooses by itself (it asks the GPU's free memory)", flag);
                    *(int*)field = field == &args->B ? BATCH_AUTO : RECOMPUTE_AUTO;
                    break;
                }
                *(int*)field = (int)parse_number(flag, value, true, spec->min, spec->max);
                break;
            case FlagKind::Long: *(long*)field = (long)parse_number(flag, value, true, spec->min, spec->max); break;
            case FlagKind::Float: *(float*)field = (float)parse_number(flag, value, false, spec->min, spec->max); break;
            case FlagKind::String:
                if (value[0] == '\0') fatal("flag %s: empty value", flag);
                *(std::string*)field = value;
                break;
        }
    }
    LRSchedule schedule;
    if (!parse_lr_schedule(args->schedule.c_str(), &schedule)) {
        fatal("flag -k: unknown schedule '%s' (cosine, linear, constant or wsd)", args->schedule.c_str());
    }
    OptimizerKind optimizer;
    if (!optimizer_from_name(args->optimizer, &optimizer)) {
        fatal("flag -opt: unknown optimizer '%s' (adamw, muon, adafactor or adamw8)", args->optimizer.c_str());
    }
    if (cuda && optimizer != OPT_ADAMW && args->offload_optimizer) {
        fatal("flag -oo 1 with -opt %s: the optimizer offload runs AdamW (Muon and Adafactor keep their state on the "
              "GPU); use -opt adamw or -oo 0", args->optimizer.c_str());
    }
    args->inject_steps.clear();
    if (!args->inject_nonfinite.empty()) {
        std::string text = args->inject_nonfinite;
        size_t start = 0;
        while (start <= text.size()) {
            size_t comma = text.find(',', start);
            std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            args->inject_steps.push_back((int)parse_number("-ni", item.c_str(), true, 0, INT_MAX));
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
    }
    if (args->pipeline_schedule != "gpipe" && args->pipeline_schedule != "1f1b") {
        fatal("flag -pm: unknown pipeline schedule '%s' (gpipe or 1f1b)", args->pipeline_schedule.c_str());
    }
    if (args->grad_compression != "none" && args->grad_compression != "sign" && args->grad_compression != "powersgd") {
        fatal("flag -gc: unknown gradient compression '%s' (none, sign or powersgd)", args->grad_compression.c_str());
    }
    if (args->grad_compression != "none") {
        // each process keeps the residual of every gradient element; ZeRO's shards, -tp's slices and -pp's
        // stages would need it cut and put together
        if (args->zero_stage != 0 || args->tensor_parallel > 1 || args->pipeline_parallel > 1 || args->checkpoint_format == "llmc") {
            fatal("flag -gc %s compresses the whole gradient of data parallelism alone: it runs with -z 0 and no -tp, -pp "
                  "or -cf llmc (this run has -z %d -tp %d -pp %d -cf %s)", args->grad_compression.c_str(), args->zero_stage,
                  args->tensor_parallel, args->pipeline_parallel, args->checkpoint_format.c_str());
        }
    }
    if (args->local_steps > 0) {
        if (cuda && args->offload_optimizer) fatal("flag -lh %d with -oo 1: the synchronization runs on the GPU's master weights", args->local_steps);
        // each replica keeps its own parameters and moments between synchronizations: ZeRO's shards, -tp's
        // slices and -pp's stages are cut across replicas; Muon and Adafactor share work across processes
        if (args->zero_stage != 0 || args->tensor_parallel > 1 || args->pipeline_parallel > 1 || args->checkpoint_format == "llmc" ||
            optimizer != OPT_ADAMW || args->grad_compression != "none") {
            fatal("flag -lh %d: local steps train whole replicas alone: they run with -z 0, -opt adamw and no -tp, -pp, -gc or "
                  "-cf llmc (this run has -z %d -opt %s -tp %d -pp %d -gc %s -cf %s)", args->local_steps, args->zero_stage,
                  args->optimizer.c_str(), args->tensor_parallel, args->pipeline_parallel, args->grad_compression.c_str(),
                  args->checkpoint_format.c_str());
        }
    }
    if (args->checkpoint_format != "ours" && args->checkpoint_format != "llmc") {
        fatal("flag -cf: unknown checkpoint format '%s' (ours or llmc)", args->checkpoint_format.c_str());
    }
    if (args->checkpoint_format == "llmc" && (optimizer != OPT_ADAMW || args->tensor_parallel > 1 ||
                                              args->pipeline_parallel > 1)) {
        fatal("flag -cf llmc: llm.c's trainer runs AdamW with data parallelism only; this run has -opt %s -tp %d -pp %d "
              "(use -cf ours)", args->optimizer.c_str(), args->tensor_parallel, args->pipeline_parallel);
    }
    check_layout_flags(*args, cuda);
    if (args->total_batch_tokens == 0) fatal("flag -d: total batch must be -1 or positive");
    if (args->B == BATCH_AUTO && args->total_batch_tokens < 0) {
        fatal("flag -b auto needs -d, the total batch in tokens: -d fixes what a step computes, -b auto only how much "
              "of it runs at once");
    }
    // every process of a -z 3 forward gathers each block, so all must run the same forwards: HellaSwag
    // gives each its own examples
    if (args->zero_stage == 3 && args->hellaswag_every > 0) {
        fatal("flag -he: HellaSwag with -z 3 is not supported (each process evaluates its own examples, a number "
              "of forwards the others do not match); use -z 0, 1 or 2");
    }
    if (args->hellaswag_every > 0 && args->hellaswag_path.empty()) fatal("flag -he needs the HellaSwag file (-hs)");
    if (args->checkpoint_every > 0 && args->output_dir.empty()) fatal("flag -n needs an output directory (-o)");
    if (args->resume && args->output_dir.empty()) fatal("flag -y 1 needs the output directory (-o) to resume from");
}

// True when step is one of -ni's steps.
inline bool is_inject_step(const TrainArgs& args, int step) {
    for (int s : args.inject_steps) {
        if (s == step) return true;
    }
    return false;
}

// Checks the batch flags against the model and the number of processes; returns grad accumulation steps.
inline int validate_batch_args(const TrainArgs& args, const GPT2Config& cfg, int num_processes) {
    if (args.T > cfg.max_seq_len) {
        fatal("flag -t: sequence length %d exceeds the model's maximum %d", args.T, cfg.max_seq_len);
    }
    long tokens_per_micro_step = (long)args.B * args.T * num_processes;
    long total = args.total_batch_tokens == -1 ? tokens_per_micro_step : args.total_batch_tokens;
    if (total % tokens_per_micro_step != 0) {
        fatal("flag -d: total batch %ld tokens is not a multiple of B*T*(data-parallel replicas) = %d*%d*%d = %ld", total, args.B,
              args.T, num_processes, tokens_per_micro_step);
    }
    // the accumulation steps are counted in an int (the step's loop, the state file): refuse what does
    // not fit rather than run with a wrapped count
    long micro_batches = total / tokens_per_micro_step;
    if (micro_batches > INT_MAX) {
        fatal("flag -d: total batch %ld tokens is %ld micro-batches of B*T*(data-parallel replicas) = %ld tokens, more than the %d "
              "accumulation steps a step can take; lower -d or raise -b", total, micro_batches, tokens_per_micro_step,
              INT_MAX);
    }
    return (int)micro_batches;
}
