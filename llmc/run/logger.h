// Run logs in an output directory:
//   DIR/main.log       llm.c's line format: "s:STEP trl:LOSS lr:LR norm:NORM" and "s:STEP tel:LOSS"
//   DIR/metrics.jsonl  one JSON object per line: {"step": N, "train_loss": ..., "lr": ..., "grad_norm": ...,
//                      "skipped": false, "skipped_steps": 0, ["loss_scale": S,] "ms": ..., "tokens_per_s": ...,
//                      "ms_data": ..., "ms_forward": ..., ..., "flops_per_s": ..., "mfu": ...} (llmc/run/phase_timer.h),
//                      {"step": N, "val_loss": ...} and, with -hs,
//                      {"step": N, "hellaswag_acc": ..., "hellaswag_acc_norm": ..., "hellaswag_acc_token": ...,
//                      "hellaswag_examples": ...} (llmc/run/hellaswag.h); main.log gets "s:N eval:ACC_NORM" as llm.c
// A skipped step (llmc/run/loss_scaler.h: its gradient norm was not finite) has "skipped": true; "skipped_steps"
// counts them since the run began; a non-finite loss or norm is written as null (JSON has no inf/NaN).
// Losses are printed with 9 significant digits (float's full precision). Step N's train loss is the
// loss of the forward pass made with the parameters after N updates.
// On resume from step S, lines for steps >= S (written by the interrupted run after its checkpoint)
// are dropped first, so the logs read as if the run had never stopped.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../utils.h"

struct Logger {
    FILE* main_log = nullptr;
    FILE* metrics = nullptr;
    std::string main_path, metrics_path;
};

// Pushes the lines just written to the files. A write that failed (a full disk, a quota, a file-size
// limit) stops the run, naming the file, as a failed checkpoint does: a run whose record cannot be kept
// would go on with nothing saying so (and its next checkpoint would meet the same disk).
inline void logger_flush(Logger* logger) {
    FILE* files[2] = {logger->main_log, logger->metrics};
    const std::string* paths[2] = {&logger->main_path, &logger->metrics_path};
    for (int i = 0; i < 2; i++) {
        if (fflush(files[i]) != 0 || ferror(files[i])) {
            fatal("could not write the run's log '%s': %s (a full disk or quota?). The run stops here; its "
                  "checkpoints so far are complete, and -y 1 resumes from the newest once there is room",
                  paths[i]->c_str(), strerror(errno));
        }
    }
}

// Step number of a log line ("s:12 ..." or {"step": 12, ...}), or -1.
inline long log_line_step(const std::string& line) {
    const char* p = line.c_str();
    if (strncmp(p, "s:", 2) == 0) return strtol(p + 2, nullptr, 10);
    const char* key = strstr(p, "\"step\":");
    if (key) return strtol(key + 7, nullptr, 10);
    return -1;
}

// Rewrites `path` keeping only the lines whose step is below `step`.
inline void log_truncate_from_step(const std::string& path, long step) {
    if (!file_exists(path)) return;
    FILE* in = fopenCheck(path.c_str(), "r");
    std::vector<std::string> kept;
    char buffer[4096];
    std::string line;
    while (fgets(buffer, sizeof(buffer), in)) {
        line += buffer;
        if (line.back() != '\n') continue;  // a longer line continues in the next buffer
        if (log_line_step(line) < step) kept.push_back(line);
        line.clear();
    }
    // a last line without its newline: kept (with one, so the next append starts a new line) if below `step`
    if (!line.empty() && log_line_step(line) < step) kept.push_back(line + "\n");
    fcloseCheck(in);
    AtomicFile out = atomic_open(path);
    for (const std::string& l : kept) atomic_write(&out, l.data(), l.size());
    atomic_commit(&out);
}

// Opens the logs in `dir` (nothing is logged if dir is empty). A fresh run starts them empty; a run
// resumed at `resume_step` keeps what came before it.
inline void logger_open(Logger* logger, const std::string& dir, long resume_step) {
    if (dir.empty()) return;
    std::string main_path = dir + "/main.log", metrics_path = dir + "/metrics.jsonl";
    if (resume_step >= 0) {
        log_truncate_from_step(main_path, resume_step);
        log_truncate_from_step(metrics_path, resume_step);
    }
    const char* mode = resume_step >= 0 ? "a" : "w";
    logger->main_path = main_path;
    logger->metrics_path = metrics_path;
    logger->main_log = fopenCheck(main_path.c_str(), mode);
    logger->metrics = fopenCheck(metrics_path.c_str(), mode);
}

// A number for JSON: %.9g, or null for inf and NaN.
inline std::string json_number(double value) {
    if (!std::isfinite(value)) return "null";
    char text[64];
    snprintf(text, sizeof(text), "%.9g", value);
    return text;
}

// skipped: this step's update was skipped; skipped_steps: all skipped so far; loss_scale <= 0: none;
// extra: more fields (", \"key\": value ...", e.g. the time breakdown of llmc/run/phase_timer.h).
inline void logger_log_train(Logger* logger, long step, float loss, float lr, float grad_norm, double ms,
                             double tokens_per_s, bool skipped = false, long skipped_steps = 0,
                             float loss_scale = 0.0f, long long comm_bytes = -1,
                             const std::string& extra = std::string()) {
    if (logger->main_log == nullptr) return;
    fprintf(logger->main_log, "s:%ld trl:%.9g lr:%.6g norm:%.6g%s\n", step, loss, lr, grad_norm,
            skipped ? " skipped:1" : "");
    std::string fields = loss_scale > 0.0f ? ", \"loss_scale\": " + json_number(loss_scale) : "";
    // bytes this process sent and received in the step's collectives (llmc/parallel/comm.h)
    if (comm_bytes >= 0) fields += ", \"comm_bytes\": " + std::to_string(comm_bytes);
    fprintf(logger->metrics,
            "{\"step\": %ld, \"train_loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"skipped\": %s, \"skipped_steps\": %ld%s, "
            "\"ms\": %.3f, \"tokens_per_s\": %.1f%s}\n",
            step, json_number(loss).c_str(), lr, json_number(grad_norm).c_str(), skipped ? "true" : "false",
            skipped_steps, fields.c_str(), ms, tokens_per_s, extra.c_str());
    logger_flush(logger);
}

inline void logger_log_val(Logger* logger, long step, float val_loss) {
    if (logger->main_log == nullptr) return;
    fprintf(logger->main_log, "s:%ld tel:%.9g\n", step, val_loss);
    fprintf(logger->metrics, "{\"step\": %ld, \"val_loss\": %.9g}\n", step, val_loss);
    logger_flush(logger);
}

inline void logger_log_hellaswag(Logger* logger, long step, double acc, double acc_norm, double acc_token,
                                 long examples) {
    if (logger->main_log == nullptr) return;
    fprintf(logger->main_log, "s:%ld eval:%.6f\n", step, acc_norm);
    fprintf(logger->metrics,
            "{\"step\": %ld, \"hellaswag_acc\": %.6f, \"hellaswag_acc_norm\": %.6f, \"hellaswag_acc_token\": %.6f, "
            "\"hellaswag_examples\": %ld}\n", step, acc, acc_norm, acc_token, examples);
    logger_flush(logger);
}

inline void logger_close(Logger* logger) {
    if (logger->main_log) fcloseCheck(logger->main_log);
    if (logger->metrics) fcloseCheck(logger->metrics);
    logger->main_log = logger->metrics = nullptr;
}
