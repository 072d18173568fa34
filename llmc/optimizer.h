// Which optimizer updates the parameters (-opt), and the tensors it updates one by one.
//
// AdamW (llmc/adamw.h) is element-wise: it walks the flat parameter array in any cut (ZeRO shards);
// 8-bit AdamW (llmc/adamw8.h) too, with its moments encoded in blocks of 256 counted from each tensor's start.
// The matrix optimizers look at whole matrices: Muon (llmc/muon.h) orthogonalizes each one, Adafactor
// (llmc/adafactor.h) keeps a row and a column factor of each one's second moment and scales each
// tensor's step by its RMS. Their unit is one layer's slice of a stacked (L, ...) tensor, or a whole
// unstacked tensor (wte, wpe, lnfw, lnfb): 4 + 12 L tensors, listed by optimizer_tensors().
//
//   tensor           shape seen      Muon                  Adafactor
//   wte, wpe         (rows, C)       AdamW, decayed        factored, decayed
//   qkvw, attprojw,  (3C, C) (C, C)  orthogonalized,       factored, decayed
//   fcw, fcprojw     (4C, C) (C, 4C) decayed
//   biases, ln*, lnf (n)             AdamW, no decay       one variance per element, no decay
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gpt2_config.h"

// The numbers are the state file's (llmc/io/checkpoint.h): do not renumber.
enum OptimizerKind { OPT_ADAMW = 0, OPT_MUON = 1, OPT_ADAFACTOR = 2, OPT_ADAMW8 = 3 };

inline const char* optimizer_name(int kind) {
    switch (kind) {
        case OPT_ADAMW: return "adamw";
        case OPT_MUON: return "muon";
        case OPT_ADAFACTOR: return "adafactor";
        case OPT_ADAMW8: return "adamw8";
    }
    return "unknown";
}

inline bool optimizer_from_name(const std::string& name, OptimizerKind* kind) {
    for (OptimizerKind k : {OPT_ADAMW, OPT_MUON, OPT_ADAFACTOR, OPT_ADAMW8}) {
        if (name == optimizer_name(k)) {
            *kind = k;
            return true;
        }
    }
    return false;
}

// The four weight matrices of a block: Muon orthogonalizes each layer's; AdamW updates everything else.
inline bool muon_param_is_matrix(int i) { return i == P_QKVW || i == P_ATTPROJW || i == P_FCW || i == P_FCPROJW; }

// One tensor as a matrix optimizer sees it: elements [offset, offset + rows * cols) of the flat parameter
// array, row-major (rows, cols); a vector has rows = 1. state_offset: where its Adafactor state starts
// in the whole state vector (adafactor_state_size).
struct OptimizerTensor {
    int param;  // ParamIndex
    int layer;  // -1 for an unstacked tensor
    size_t offset, rows, cols;
    size_t state_offset;
    bool is_matrix() const { return rows > 1; }
    size_t size() const { return rows * cols; }
};

// The part [begin, end) of tensor t that lies in a process's optimizer range [opt_begin, opt_end)
// (all of it, or its ZeRO shard's piece); false if none.
inline bool tensor_part_in(const OptimizerTensor& t, size_t opt_begin, size_t opt_end, size_t* begin, size_t* end) {
    *begin = t.offset > opt_begin ? t.offset : opt_begin;
    *end = t.offset + t.size() < opt_end ? t.offset + t.size() : opt_end;
    return *begin < *end;
}

// A stacked tensor's layer as this process holds it, as one run (rows 1): its place in the local flat
// vector of param_offsets and param_sizes (with -tp this rank's slice, llmc/parallel/tensor_parallel.h;
// without, t itself as a run). L: the layers the local vector holds.
inline OptimizerTensor local_tensor(const OptimizerTensor& t, const size_t* param_offsets, const size_t* param_sizes,
                                    size_t L) {
    OptimizerTensor mine = t;
    size_t per_layer = param_sizes[t.param] / L;
    mine.offset = param_offsets[t.param] + (size_t)t.layer * per_layer;
    mine.rows = 1, mine.cols = per_layer;
    return mine;
}

// Adafactor's state of one tensor: rows + cols factors for a matrix, one variance per element for a vector.
inline size_t adafactor_state_of(const OptimizerTensor& t) { return t.is_matrix() ? t.rows + t.cols : t.cols; }

// The 4 + 12 L tensors in checkpoint order (each stacked tensor's layers in order), for a whole model
// (not a tensor-parallel rank's slices).
inline std::vector<OptimizerTensor> optimizer_tensors(const GPT2Config& cfg) {
    size_t C = cfg.channels, L = cfg.num_layers;
    size_t offsets[NUM_PARAMETER_TENSORS];
    param_tensor_offsets(cfg, offsets);
    // each tensor's per-layer shape: (rows, cols); rows = 1 for vectors
    const size_t shape[NUM_PARAMETER_TENSORS][2] = {
        {(size_t)cfg.padded_vocab_size, C}, {(size_t)cfg.max_seq_len, C}, {1, C}, {1, C}, {3 * C, C}, {1, 3 * C},
        {C, C}, {1, C}, {1, C}, {1, C}, {4 * C, C}, {1, 4 * C}, {C, 4 * C}, {1, C}, {1, C}, {1, C}};
    std::vector<OptimizerTensor> tensors;
    size_t state = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        bool stacked = i != P_WTE && i != P_WPE && i != P_LNFW && i != P_LNFB;
        for (size_t l = 0; l < (stacked ? L : 1); l++) {
            OptimizerTensor t = {i, stacked ? (int)l : -1, offsets[i] + l * shape[i][0] * shape[i][1], shape[i][0],
                                 shape[i][1], state};
            state += adafactor_state_of(t);
            tensors.push_back(t);
        }
    }
    return tensors;
}

// The length of the whole Adafactor state vector: each tensor's, one after another.
inline size_t adafactor_state_size(const std::vector<OptimizerTensor>& tensors) {
    size_t n = 0;
    for (const OptimizerTensor& t : tensors) n += adafactor_state_of(t);
    return n;
}

// A run's optimizer and, for the matrix optimizers, the tensors they update one by one and (Muon under
// data parallelism) which process orthogonalizes each matrix (llmc/parallel/matrix_owners.h).
struct OptimizerPlan {
    OptimizerKind kind = OPT_ADAMW;
    std::vector<OptimizerTensor> tensors;  // muon, adafactor, adamw8: optimizer_tensors()
    std::vector<int> owner;                // muon: per tensor, a block matrix's owner; -1 for the other tensors
};
