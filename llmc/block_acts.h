// One block's activations at layer l, as both trainers' block_forward, block_backward and
// block_recompute read and write them: views into the stacked (L, ...) tensors of a trainer's activation
// table (llmc/gpt2_activations.h on the CPU in float, llmc/gpt2_activations.cuh on the GPU in floatX),
// found through the table's per-layer strides. What a table keeps per layer and what it keeps once
// (recomputation's one-layer buffers, a stride of 0, the same storage at every l) is each table's rule;
// the view is the same for both.
#pragma once

#include <cstddef>
#include <type_traits>

template <typename Act>
struct BlockActsOf {
    const Act* residual;  // (B, T, C)   the block's input: encoded, or the previous block's residual3
    Act* ln1;             // (B, T, C)
    float* ln1_mean;      // (B, T)
    float* ln1_rstd;      // (B, T)
    Act* qkv;             // (B, T, 3C)
    Act* atty;            // (B, T, C)
    Act* att;             // what attention keeps: (B, NH, T, T), or flash's statistics on the GPU
    Act* attproj;         // (B, T, C)   attproj's output before the residual add
    Act* residual2;       // (B, T, C)
    Act* ln2;             // (B, T, C)
    float* ln2_mean;      // (B, T)
    float* ln2_rstd;      // (B, T)
    Act* fch;             // (B, T, 4C)
    Act* fch_gelu;        // (B, T, 4C)
    Act* fcproj;          // (B, T, C)   fcproj's output before the residual add
    Act* residual3;       // (B, T, C)   the block's output
    size_t layer;         // l, this process's (a pipeline stage's own count)
};

// Per-layer steps, in elements, through a table's stacked tensors for one pass over (B, T): layer l's
// slice of a tensor starts l steps in. 0 for a tensor the table keeps once (recomputed, or scratch).
struct LayerStrides {
    size_t ln;     // ln1, ln2
    size_t stats;  // the layernorms' means and reciprocal deviations
    size_t qkv, atty, att, attproj, residual2, fch, fch_gelu, fcproj, residual3;
};

// Block l's views into table `a` (any struct with the tensors named as in BlockActsOf).
template <typename Acts>
auto block_acts(const Acts& a, const LayerStrides& s, size_t l) {
    using Act = std::remove_pointer_t<decltype(a.ln1)>;
    return BlockActsOf<Act>{l == 0 ? a.encoded : a.residual3 + (l - 1) * s.residual3,
                            a.ln1 + l * s.ln,
                            a.ln1_mean + l * s.stats,
                            a.ln1_rstd + l * s.stats,
                            a.qkv + l * s.qkv,
                            a.atty + l * s.atty,
                            a.att + l * s.att,
                            a.attproj + l * s.attproj,
                            a.residual2 + l * s.residual2,
                            a.ln2 + l * s.ln,
                            a.ln2_mean + l * s.stats,
                            a.ln2_rstd + l * s.stats,
                            a.fch + l * s.fch,
                            a.fch_gelu + l * s.fch_gelu,
                            a.fcproj + l * s.fcproj,
                            a.residual3 + l * s.residual3,
                            l};
}
