// The debug state (../shared/FORMATS.md, "Test state"; llm.c's gpt2_124M_debug_state.bin is one): a batch
// and what a reference implementation computed on it, to check a model against. Header magic 20240327,
// version 2, h[2] B, h[3] T; then int32 inputs (B, T), int32 targets (B, T), fp32 logits (B, T, V), the
// fp32 mean loss, and the fp32 gradients of all 16 parameter tensors in checkpoint order (padded vocab).
// Read by check_gpt2 (a model + debug state pair, as llm.c's test_gpt2 checks one) and by the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../utils.h"

constexpr int32_t DEBUG_STATE_MAGIC = 20240327;
constexpr int32_t DEBUG_STATE_VERSION = 2;

struct DebugState {
    int B = 0, T = 0;
    std::vector<int> inputs, targets;  // (B, T)
    std::vector<float> logits;         // (B, T, V)
    float loss = 0;
    std::vector<float> grads;          // all 16 tensors, checkpoint order
};

// How far a tensor is from its reference: the largest |a - b| over the array, relative to the largest |b|,
// one number per tensor that does not blow up on elements that happen to be near zero (check_gpt2 and the
// tests measure with it).
inline double max_rel_error(const float* a, const float* b, size_t n) {
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        max_diff = std::max(max_diff, std::fabs((double)a[i] - b[i]));
        max_ref = std::max(max_ref, std::fabs((double)b[i]));
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

// V: the model's vocabulary (unpadded), num_params: its parameter count (padded); the file's size must match.
inline DebugState debug_state_read(const std::string& path, int V, size_t num_params) {
    DebugState s;
    const char* what = "debug state";
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, DEBUG_STATE_MAGIC, &DEBUG_STATE_VERSION, 1, header);
    s.B = header[2];
    s.T = header[3];
    if (s.B < 1 || s.T < 1 || (int64_t)s.B * s.T > ((int64_t)1 << 30)) {
        fatal("%s '%s' has an inconsistent header: B=%d T=%d", what, path.c_str(), s.B, s.T);
    }
    size_t BT = (size_t)s.B * s.T;
    expect_file_size(fp, path.c_str(), what, HEADER_BYTES + (long)(BT * 8 + BT * V * 4 + 4 + num_params * 4));
    s.inputs.resize(BT);
    s.targets.resize(BT);
    s.logits.resize(BT * V);
    s.grads.resize(num_params);
    freadCheck(s.inputs.data(), 4, BT, fp);
    freadCheck(s.targets.data(), 4, BT, fp);
    freadCheck(s.logits.data(), 4, BT * V, fp);
    freadCheck(&s.loss, 4, 1, fp);
    freadCheck(s.grads.data(), 4, num_params, fp);
    fcloseCheck(fp);
    for (size_t i = 0; i < BT; i++) {
        if (s.inputs[i] < 0 || s.inputs[i] >= V || s.targets[i] < 0 || s.targets[i] >= V) {
            fatal("%s '%s': token %d at %zu is outside the model's vocabulary of %d", what, path.c_str(),
                  s.inputs[i] < 0 || s.inputs[i] >= V ? s.inputs[i] : s.targets[i], i, V);
        }
    }
    return s;
}
