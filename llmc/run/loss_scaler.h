// What the trainers do with a step whose gradients are not finite, and dynamic loss scaling (FP16).
// Shared by train_gpt2.cpp and train_gpt2.cu; host code, no GPU needed.
//
// Skipping: one bad micro-batch (an overflow, a NaN from a bad input) gives a global gradient norm of
// inf or NaN. Clipping cannot rescue it (inf/inf is NaN), and one AdamW update with it turns every
// weight and both moments into NaN for good. So such a step is skipped: weights and moments stay as
// they were. The norm is global (summed over every process after the gradient reduction), so every
// process sees the same norm and makes the same choice. Skipped steps are not AdamW updates: the bias
// corrections count applied updates only (as PyTorch's GradScaler does by not calling step()). After
// `max_consecutive` skips in a row the run stops, naming the step: something is wrong that skipping
// will not fix, and the weights are still the last good ones.
//
// Dynamic loss scaling (Micikevicius et al., "Mixed Precision Training", 2018): fp16 holds magnitudes
// down to 2^-24 only, and many gradient elements of a small model are smaller; they round to zero. The
// loss, hence every gradient, is multiplied by S before the backward and the gradients are divided by
// S again in fp32 (in AdamW's kernel, together with the clipping factor). S is as large as the
// gradients allow: on overflow (a non-finite norm) the step is skipped and S *= backoff; after
// growth_interval clean steps in a row S *= growth. With BF16 or FP32 S stays 1.
#pragma once

#include <cmath>
#include <cstdint>

#include "../utils.h"

struct LossScaler {
    // dynamic loss scaling (the FP16 build); otherwise scale stays 1
    bool dynamic = false;
    float scale = 1.0f;
    int growth_interval = 2000;
    float growth = 2.0f, backoff = 0.5f;
    int clean_steps = 0;  // clean steps since S last changed
    // skipping, in every build
    int max_consecutive = 8;
    int64_t skipped_total = 0;
    int consecutive = 0;
    int64_t updates = 0;  // AdamW updates applied so far (the t of the next one is updates + 1)
};

// The start-up line of a dynamic scaler (the FP16 build's); nothing otherwise.
inline void loss_scaler_print(const LossScaler& s) {
    if (!s.dynamic) return;
    printf("loss scaling: S %g, x%g after %d clean steps, x%g on overflow\n", s.scale, s.growth, s.growth_interval, s.backoff);
}

// Looks at step `step`'s global gradient norm (of the gradients as computed, scaled by S) and decides:
// true to apply the update, false to skip it. Moves S. Stops the run after max_consecutive skips.
inline bool loss_scaler_step(LossScaler* s, double scaled_norm, int step) {
    bool finite = std::isfinite(scaled_norm);
    if (finite) {
        s->consecutive = 0;
        s->updates++;
        if (s->dynamic && ++s->clean_steps >= s->growth_interval) {
            float grown = s->scale * s->growth;
            if (std::isfinite(grown)) s->scale = grown;
            s->clean_steps = 0;
        }
        return true;
    }
    s->skipped_total++;
    s->consecutive++;
    if (s->dynamic) {
        s->scale *= s->backoff;
        s->clean_steps = 0;
    }
    if (s->consecutive >= s->max_consecutive) {
        fatal("step %d: the gradient norm was not finite (%g) in %d consecutive steps (-ns %d); stopping. No "
              "update was applied in those steps, so the weights are those of step %d%s", step, scaled_norm,
              s->consecutive, s->max_consecutive, step - s->consecutive + 1,
              s->dynamic ? " (loss scale went down to the value printed in the step lines)" : "");
    }
    return false;
}

// The factor AdamW multiplies each stored gradient by: undo S, then clip to norm max_norm.
inline float loss_scaler_grad_scale(const LossScaler& s, double scaled_norm, double max_norm) {
    double norm = scaled_norm / s.scale;
    double clip = norm > max_norm ? max_norm / norm : 1.0;
    return (float)(clip / s.scale);
}
