// What the run is, printed and agreed: the model's summary line, and the description every process must
// share (check_same_config, llmc/parallel/comm.h, compares it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "../gpt2_config.h"
#include "args.h"

inline void print_model_summary(const GPT2Config& cfg, size_t num_parameters) {
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d (padded %d), %zu parameters\n", cfg.num_layers, cfg.channels,
           cfg.num_heads, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, num_parameters);
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
