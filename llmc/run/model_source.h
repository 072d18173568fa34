// The model a run starts from, as the -e flag names it: a descriptor (d6 ... d48: GPT-2's random
// initialization, llmc/gpt2_init.h, from the run's seed) or a model file (llmc/io/checkpoint.h). The
// flag-to-file glue of both trainers; the initialization itself is the model's.
#pragma once

#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../gpt2_init.h"
#include "../io/checkpoint.h"
#include "../utils.h"

// The shape named by -e, without its parameters (-P 1 plans from it): a descriptor's, or a checkpoint
// file's header (checked as model_file_read checks it, the payload unread).
inline GPT2Config gpt2_config_from_flag(const std::string& name) {
    GPT2Config cfg;
    if (config_from_descriptor(name.c_str(), &cfg)) return cfg;
    if (looks_like_descriptor(name.c_str())) {
        fatal("flag -e: unknown model descriptor '%s' (d6, d12, d24, d36 or d48, each with an optional context: "
              "d6:4096)", name.c_str());
    }
    int version;
    BlockChecksums sums;
    fcloseCheck(model_file_open(name, &cfg, &version, &sums, true));  // the parameters' read notes a missing checksum
    return cfg;
}

// Parameters named by -e: a descriptor (random init from `seed`) or a checkpoint file (v3 or v5).
inline std::vector<float> gpt2_parameters_from_flag(const std::string& name, unsigned seed, GPT2Config* cfg) {
    if (config_from_descriptor(name.c_str(), cfg)) return gpt2_random_parameters(*cfg, seed);
    if (looks_like_descriptor(name.c_str())) {
        fatal("flag -e: unknown model descriptor '%s' (d6, d12, d24, d36 or d48, each with an optional context: "
              "d6:4096)", name.c_str());
    }
    std::vector<float> params;
    model_file_read(name, cfg, &params);
    return params;
}
