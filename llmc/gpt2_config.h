// GPT-2's hyperparameters and the layout of its 16 parameter tensors, shared by every trainer and tool.
//
// The parameters live in one flat allocation, tensor after tensor in checkpoint order
// (../shared/FORMATS.md), so a checkpoint is read with one fread and the optimizer walks one array.
// This header only computes sizes and offsets; each trainer allocates in its own precision.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>

#include "utils.h"

struct GPT2Config {
    int max_seq_len;        // maxT, e.g. 1024
    int vocab_size;         // V, e.g. 50257
    int padded_vocab_size;  // Vp: V rounded up to a multiple of 128, e.g. 50304
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
};

constexpr int NUM_PARAMETER_TENSORS = 16;

// Index of each tensor in checkpoint order.
enum ParamIndex {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB
};

inline const char* param_tensor_name(int i) {
    static const char* names[NUM_PARAMETER_TENSORS] = {
        "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
    return names[i];
}

// Weight decay applies to the 2-D matrices only: embeddings and linear weights, never biases or
// LayerNorm parameters.
inline bool param_tensor_is_decayed(int i) {
    return i == P_WTE || i == P_WPE || i == P_QKVW || i == P_ATTPROJW || i == P_FCW || i == P_FCPROJW;
}

inline int pad_vocab(int vocab_size) { return (int)ceil_div(vocab_size, 128) * 128; }

// Number of elements of each tensor.
inline void param_tensor_sizes(const GPT2Config& cfg, size_t sizes[NUM_PARAMETER_TENSORS]) {
    size_t Vp = cfg.padded_vocab_size, C = cfg.channels, L = cfg.num_layers, maxT = cfg.max_seq_len;
    sizes[P_WTE] = Vp * C;
    sizes[P_WPE] = maxT * C;
    sizes[P_LN1W] = L * C;
    sizes[P_LN1B] = L * C;
    sizes[P_QKVW] = L * 3 * C * C;
    sizes[P_QKVB] = L * 3 * C;
    sizes[P_ATTPROJW] = L * C * C;
    sizes[P_ATTPROJB] = L * C;
    sizes[P_LN2W] = L * C;
    sizes[P_LN2B] = L * C;
    sizes[P_FCW] = L * 4 * C * C;
    sizes[P_FCB] = L * 4 * C;
    sizes[P_FCPROJW] = L * C * 4 * C;
    sizes[P_FCPROJB] = L * C;
    sizes[P_LNFW] = C;
    sizes[P_LNFB] = C;
}

inline size_t num_parameters(const GPT2Config& cfg) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    size_t total = 0;
    for (size_t s : sizes) total += s;
    return total;
}

// Element offset of each tensor inside the flat parameter array.
inline void param_tensor_offsets(const GPT2Config& cfg, size_t offsets[NUM_PARAMETER_TENSORS]) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    param_tensor_sizes(cfg, sizes);
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        offsets[i] = offset;
        offset += sizes[i];
    }
}

// Pointers to the 16 tensors inside one flat allocation of element type T (float on the CPU, the
// CUDA trainer's floatX on the GPU); per-layer tensors are stacked over L.
template <typename T>
struct ParameterTensorsOf {
    T* wte;       // (Vp, C)
    T* wpe;       // (maxT, C)
    T* ln1w;      // (L, C)
    T* ln1b;      // (L, C)
    T* qkvw;      // (L, 3C, C)
    T* qkvb;      // (L, 3C)
    T* attprojw;  // (L, C, C)
    T* attprojb;  // (L, C)
    T* ln2w;      // (L, C)
    T* ln2b;      // (L, C)
    T* fcw;       // (L, 4C, C)
    T* fcb;       // (L, 4C)
    T* fcprojw;   // (L, C, 4C)
    T* fcprojb;   // (L, C)
    T* lnfw;      // (C)
    T* lnfb;      // (C)
};

// Points each tensor at memory + offsets[i]: any layout of the 16 tensors, e.g. a tensor-parallel
// rank's smaller slices (train_gpt2.cpp).
template <typename T>
void point_parameters_at(ParameterTensorsOf<T>* p, T* memory, const size_t* offsets) {
    T** ptrs[NUM_PARAMETER_TENSORS] = {&p->wte,      &p->wpe,      &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb,
                                       &p->attprojw, &p->attprojb, &p->ln2w, &p->ln2b, &p->fcw,  &p->fcb,
                                       &p->fcprojw,  &p->fcprojb,  &p->lnfw, &p->lnfb};
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) *ptrs[i] = memory + offsets[i];
}

// Points each tensor at its offset in `memory` (N elements in checkpoint order). Every tensor starts
// at a multiple of C elements, so with C % 8 == 0 each is 16-byte aligned for 2-byte types.
template <typename T>
void point_parameters(ParameterTensorsOf<T>* p, T* memory, const GPT2Config& cfg) {
    size_t offsets[NUM_PARAMETER_TENSORS];
    param_tensor_offsets(cfg, offsets);
    point_parameters_at(p, memory, offsets);
}

// One transformer block's parameters (or their gradients): views of its slices, wherever they are
// stored. Here they point into the stacked (L, ...) tensors; a parallel layout may point them elsewhere.
template <typename T>
struct BlockTensorsOf {
    T* ln1w;      // (C)
    T* ln1b;      // (C)
    T* qkvw;      // (3C, C)
    T* qkvb;      // (3C)
    T* attprojw;  // (C, C)
    T* attprojb;  // (C)
    T* ln2w;      // (C)
    T* ln2b;      // (C)
    T* fcw;       // (4C, C)
    T* fcb;       // (4C)
    T* fcprojw;   // (C, 4C)
    T* fcprojb;   // (C)
};
// Block l's slices of the stacked parameter (or gradient) tensors; with tensor parallelism (tp > 1)
// the split tensors hold C/tp of their rows or columns (llmc/parallel/tensor_parallel.h).
template <typename T, typename U>
BlockTensorsOf<T> block_tensors(const ParameterTensorsOf<U>& p, size_t l, size_t C, size_t tp = 1) {
    size_t Cl = C / tp;
    return {p.ln1w + l * C,          p.ln1b + l * C,      p.qkvw + l * 3 * Cl * C, p.qkvb + l * 3 * Cl,
            p.attprojw + l * C * Cl, p.attprojb + l * C,  p.ln2w + l * C,          p.ln2b + l * C,
            p.fcw + l * 4 * Cl * C,  p.fcb + l * 4 * Cl,  p.fcprojw + l * 4 * Cl * C, p.fcprojb + l * C};
}

// Forward FLOPs per token for the training FLOP estimate: 6N for the matmuls of forward+backward plus
// 6·L·C·T for attention's scores and weighted sum (the usual estimate, e.g. the PaLM paper appendix).
inline double flops_per_token(const GPT2Config& cfg, int T) {
    double N = (double)num_parameters(cfg);
    return 6.0 * N + 6.0 * cfg.num_layers * cfg.channels * (double)T;
}

// Checks that a configuration read from a file or built from flags is usable.
inline void validate_config(const GPT2Config& cfg, const char* source) {
    if (cfg.max_seq_len <= 0 || cfg.vocab_size <= 0 || cfg.num_layers <= 0 || cfg.num_heads <= 0 ||
        cfg.channels <= 0) {
        fatal("%s: model sizes must be positive (maxT %d, V %d, L %d, NH %d, C %d)", source, cfg.max_seq_len,
              cfg.vocab_size, cfg.num_layers, cfg.num_heads, cfg.channels);
    }
    if (cfg.channels % cfg.num_heads != 0) {
        fatal("%s: channels %d are not divisible by the %d heads", source, cfg.channels, cfg.num_heads);
    }
    if (cfg.padded_vocab_size < cfg.vocab_size || cfg.padded_vocab_size % 128 != 0) {
        fatal("%s: padded vocab %d must be a multiple of 128 and at least the vocab %d", source,
              cfg.padded_vocab_size, cfg.vocab_size);
    }
    // keep every tensor well inside size_t and every per-layer index inside int arithmetic we use
    if (cfg.max_seq_len > 1 << 20 || cfg.vocab_size > 1 << 24 || cfg.num_layers > 1024 || cfg.channels > 1 << 16) {
        fatal("%s: model sizes are implausibly large (maxT %d, V %d, L %d, C %d)", source, cfg.max_seq_len,
              cfg.vocab_size, cfg.num_layers, cfg.channels);
    }
}

// The model descriptors "d6", "d12", ... name GPT-2 shapes by depth (GPT-2 small is d12), with GPT-2's
// context of 1024 positions; "d6:4096" is the same shape with another context (maxT, the rows of wpe), for
// sequences longer than GPT-2's. Returns false if `name` is not a descriptor (then it is taken as a
// checkpoint path); a descriptor with a bad context ("d6:0", "d6:x") is an error.
constexpr int MAX_DESCRIPTOR_CONTEXT = 1 << 20;
inline bool config_from_descriptor(const char* name, GPT2Config* cfg) {
    struct Shape { const char* name; int L, C, NH; };
    static const Shape shapes[] = {
        {"d6", 6, 384, 6}, {"d12", 12, 768, 12}, {"d24", 24, 1024, 16}, {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25}};
    const char* colon = strchr(name, ':');
    size_t depth_length = colon ? (size_t)(colon - name) : strlen(name);
    for (const Shape& s : shapes) {
        if (strlen(s.name) == depth_length && strncmp(name, s.name, depth_length) == 0) {
            int context = 1024;
            if (colon) {
                char* end = nullptr;
                long value = strtol(colon + 1, &end, 10);
                if (colon[1] < '0' || colon[1] > '9' || *end != '\0' || value < 1 || value > MAX_DESCRIPTOR_CONTEXT) {
                    fatal("model descriptor '%s': the context after ':' must be a number of positions from 1 to %d "
                          "(e.g. %.*s:4096)", name, MAX_DESCRIPTOR_CONTEXT, (int)depth_length, name);
                }
                context = (int)value;
            }
            cfg->max_seq_len = context;
            cfg->vocab_size = 50257;
            cfg->padded_vocab_size = pad_vocab(50257);
            cfg->num_layers = s.L;
            cfg->channels = s.C;
            cfg->num_heads = s.NH;
            return true;
        }
    }
    return false;
}

// True for strings of the form "d<digits>" or "d<digits>:...", which we treat as descriptors (and reject if
// unknown).
inline bool looks_like_descriptor(const char* name) {
    if (name[0] != 'd' || name[1] < '0' || name[1] > '9') return false;
    const char* p = name + 1;
    while (*p >= '0' && *p <= '9') p++;
    return *p == '\0' || *p == ':';
}
