// Muon's constants and the small functions both trainers share (llmc/muon.h on the CPU, llmc/muon.cuh on
// the GPU): torch.optim.Muon's defaults, its lerp, its learning-rate adjustment.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "host_device.h"

struct MuonHyper {
    float momentum = 0.95f;
    float a = 3.4445f, b = -4.7750f, c = 2.0315f;  // torch.optim._muon's DEFAULT_A, _B, _C
    float eps = 1e-7f;
    int ns_steps = 5;
};

// torch.lerp(start, end, w): start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w), the
// two forms that keep the result exact at w = 0 and w = 1.
HOST_DEVICE inline float lerp_as_torch(float start, float end, float w) {
    return fabsf(w) < 0.5f ? start + w * (end - start) : end - (end - start) * (1.0f - w);
}

// torch.optim.Muon's default learning-rate adjustment for a (rows, cols) matrix.
inline double muon_lr_ratio(size_t rows, size_t cols) { return std::sqrt(std::max(1.0, (double)rows / (double)cols)); }

// Multiply-adds of NS5 on a (rows, cols) matrix, for balancing the work between processes.
inline double newton_schulz_flops(size_t rows, size_t cols, int steps) {
    double n = (double)std::min(rows, cols), m = (double)std::max(rows, cols);
    return 2.0 * steps * (2.0 * n * n * m + n * n * n);
}
