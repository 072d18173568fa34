// GPT-2's random initialization, shared by the trainers so that a descriptor and a seed give the same
// starting model on the CPU and on the GPU:
//   weights N(0, 0.02); the two projections into the residual stream (attprojw, fcprojw)
//   N(0, 0.02 / sqrt(2L)) so the stream's variance does not grow with depth; biases 0; LayerNorm
//   gains 1; wte's padded rows V..Vp-1 stay 0. Draws come from llmc/rand.h, tensor by tensor.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "gpt2_config.h"
#include "rand.h"

inline std::vector<float> gpt2_random_parameters(const GPT2Config& cfg, unsigned seed) {
    size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    param_tensor_offsets(cfg, offsets);
    std::vector<float> params(num_parameters(cfg), 0.0f);
    std::mt19937 rng(seed);
    double residual_std = 0.02 / std::sqrt(2.0 * cfg.num_layers);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        float* tensor = params.data() + offsets[i];
        if (i == P_LN1W || i == P_LN2W || i == P_LNFW) {
            for (size_t j = 0; j < sizes[i]; j++) tensor[j] = 1.0f;
        } else if (i == P_WTE) {
            rand_normal_fill(tensor, (size_t)cfg.vocab_size * cfg.channels, 0.0, 0.02, rng);
        } else if (i == P_ATTPROJW || i == P_FCPROJW) {
            rand_normal_fill(tensor, sizes[i], 0.0, residual_std, rng);
        } else if (param_tensor_is_decayed(i)) {  // the other matrices: wpe, qkvw, fcw
            rand_normal_fill(tensor, sizes[i], 0.0, 0.02, rng);
        }  // biases stay 0
    }
    return params;
}
