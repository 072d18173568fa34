// Learning-rate schedules. All share a linear warmup over the first W steps and end at a floor of
// final_frac * lr; step counts from 0 and the last update is step max_steps - 1.
//   warmup (s < W):  lr * (s + 1) / W
//   then, with r = (s - W) / (max_steps - W) in [0, 1):
//   cosine:   floor + (lr - floor) * 0.5 * (1 + cos(pi r))
//   linear:   lr - (lr - floor) * r
//   constant: lr
//   wsd:      warmup, stable at lr until D = max(W, floor(0.8 * max_steps)), then the "1 - sqrt"
//             cooldown of the warmup-stable-decay schedule: floor + (lr - floor) (1 - sqrt((s - D) / (max_steps - D)))
// With final_frac = 1 and W = 0 every schedule is a constant rate.
#pragma once

#include <cmath>
#include <cstring>

enum class LRSchedule { Cosine, Linear, Constant, WSD };

inline bool parse_lr_schedule(const char* name, LRSchedule* out) {
    if (strcmp(name, "cosine") == 0) *out = LRSchedule::Cosine;
    else if (strcmp(name, "linear") == 0) *out = LRSchedule::Linear;
    else if (strcmp(name, "constant") == 0) *out = LRSchedule::Constant;
    else if (strcmp(name, "wsd") == 0) *out = LRSchedule::WSD;
    else return false;
    return true;
}

struct LRScheduler {
    LRSchedule type = LRSchedule::Cosine;
    double learning_rate;
    int warmup_steps;
    int max_steps;
    double final_frac;
};

inline float lr_at_step(const LRScheduler& s, int step) {
    double lr = s.learning_rate, floor_lr = s.final_frac * s.learning_rate;
    if (step < s.warmup_steps) return (float)(lr * (step + 1) / s.warmup_steps);
    double r = (double)(step - s.warmup_steps) / (double)(s.max_steps - s.warmup_steps);
    switch (s.type) {
        case LRSchedule::Cosine: return (float)(floor_lr + (lr - floor_lr) * 0.5 * (1.0 + std::cos(M_PI * r)));
        case LRSchedule::Linear: return (float)(lr - (lr - floor_lr) * r);
        case LRSchedule::Constant: return (float)lr;
        case LRSchedule::WSD: {
            int decay_start = (int)std::floor(0.8 * s.max_steps);
            if (decay_start < s.warmup_steps) decay_start = s.warmup_steps;
            if (step < decay_start) return (float)lr;
            double progress = (double)(step - decay_start) / (double)(s.max_steps - decay_start);
            return (float)(floor_lr + (lr - floor_lr) * (1.0 - std::sqrt(progress)));
        }
    }
    return (float)lr;
}
