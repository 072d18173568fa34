// Context parallelism's split of a sequence (llmc/parallel/context_parallel.h has the CPU's attention,
// context_parallel.cuh the GPU's): which positions each of the -cp processes holds, the runs it cannot
// split, each process's share of a batch (its tokens, its rows of wpe) and what the schemes' buffers and
// traffic come to. Host code only, apart from the attention, so that the flags (llmc/run/args.h), the
// layout and both trainers use it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../utils.h"
#include "comm.h"

enum class ContextMode { ring, ulysses };

inline const char* context_mode_name(ContextMode m) { return m == ContextMode::ring ? "ring" : "ulysses"; }

inline bool context_mode_from_name(const std::string& name, ContextMode* mode) {
    if (name == "ring") *mode = ContextMode::ring;
    else if (name == "ulysses") *mode = ContextMode::ulysses;
    else return false;
    return true;
}

// Why -cp N -cpm mode cannot split sequences of T positions, or "" (the flags check -t; each pass its T).
inline std::string context_split_problem(int N, ContextMode mode, int T) {
    char text[320] = "";
    if (N > 1 && mode == ContextMode::ring && T % (2 * N) != 0) {
        snprintf(text, sizeof(text), "-cp %d -cpm ring: T = %d does not divide into %d chunks (the ring's causal split "
                 "is load-balanced: each process holds a chunk from the front and its mirror from the back); use a T "
                 "divisible by %d", N, T, 2 * N, 2 * N);
    } else if (N > 1 && mode == ContextMode::ulysses && T % N != 0) {
        snprintf(text, sizeof(text), "-cp %d -cpm ulysses: T = %d does not divide into %d chunks", N, T, N);
    }
    return text;
}

// Why -cp N -cpm mode cannot split the attention of `heads` heads per process (-tp's share), or "" (the layout
// checks it).
inline std::string context_heads_problem(int N, ContextMode mode, int heads) {
    char text[320] = "";
    if (N > 1 && mode == ContextMode::ulysses && heads % N != 0) {
        snprintf(text, sizeof(text), "-cp %d -cpm ulysses: the all-to-all gives each process whole heads, and %d does "
                 "not divide the %d heads of a process (-tp's share); use -cpm ring", N, N, heads);
    }
    return text;
}

// The global position of row t (of T/N) of process `rank`'s share of each sequence.
inline int context_position(ContextMode mode, int N, int rank, int T, int t) {
    if (mode == ContextMode::ulysses) return rank * (T / N) + t;
    int chunk = T / (2 * N);
    return t < chunk ? rank * chunk + t : (2 * N - 1 - rank) * chunk + (t - chunk);
}

// Which of a query half-chunk's keys in a key half-chunk are visible: the ring's rows are two chunks of
// the 2N (rank r: chunk r, then chunk 2N-1-r), half qh (0 or 1) of process me's against half kh of
// process src's. 2: every key (an earlier chunk), 1: the causal triangle (the same chunk), 0: none.
inline int ring_visibility(int N, int me, int qh, int src, int kh) {
    int q_chunk = qh ? 2 * N - 1 - me : me, k_chunk = kh ? 2 * N - 1 - src : src;
    return k_chunk < q_chunk ? 2 : k_chunk == q_chunk ? 1 : 0;
}

// The scheme's state on one process: its group and mode, the current pass's split, and its buffers.
struct ContextParallel {
    ProcessGroup group;                   // the N processes sharing each sequence (size 1: off)
    ContextMode mode = ContextMode::ring;
    int T = 0, Tl = 0;                    // the sequence's positions and this process's share, T / N
    std::vector<int> tokens;              // (2, B, Tl): its rows' inputs, then targets
    std::vector<float> wpe;               // (Tl, C): wpe's rows at its positions; their gradient in the backward
    std::vector<float> buffer[4];         // ring: the travelling chunks (2) and the running lse; Ulysses: 4 staging
    bool on() const { return group.size > 1; }
    int position(int rank, int t) const { return context_position(mode, group.size, rank, T, t); }
    size_t bytes() const {
        size_t n = tokens.size() * sizeof(int) + wpe.size() * sizeof(float);
        for (const std::vector<float>& b : buffer) n += b.size() * sizeof(float);
        return n;
    }
};

// Floats of each of the scheme's 4 buffers for micro-batches of B rows of T positions, Cl = C/tp
// channels and NH heads (of this tensor-parallel rank): the memory plan's row.
inline void context_parallel_buffer_sizes(ContextMode mode, int N, size_t B, size_t T, size_t Cl, size_t NH, size_t out[4]) {
    size_t rows = B * (T / N);
    if (mode == ContextMode::ring) {
        out[0] = out[1] = rows * 4 * Cl;  // a chunk's k, v, dk, dv, twice (the one in use, the one arriving)
        out[2] = rows * NH;               // the running log-sum-exp of each query row and head
        out[3] = 0;
    } else {
        out[0] = out[1] = out[2] = out[3] = rows * 3 * Cl;  // q, k, v of NH/N heads at all T positions, and staging
    }
}

// Bytes of the whole scheme state for the plan: the buffers, the tokens, the wpe table.
inline size_t context_parallel_state_bytes(ContextMode mode, int N, size_t B, size_t T, size_t C, size_t Cl, size_t NH) {
    if (N <= 1) return 0;
    size_t sizes[4], floats = (T / N) * C;
    context_parallel_buffer_sizes(mode, N, B, T, Cl, NH, sizes);
    for (size_t s : sizes) floats += s;
    return floats * sizeof(float) + 2 * B * (T / N) * sizeof(int);
}

// The bytes one micro-batch's forward (or backward) moves per process over L layers, as comm.h counts
// them (each side counts what it sends and what it receives): the ring's N-1 hops of K and V forward,
// and backward N-1 hops of K, V and N of dK, dV; Ulysses's all-to-alls of q, k, v (3 columns) and the
// output (1) forward, and backward q, k, v, dout and dqkv (7), each moving (N-1)/N of its block.
inline double context_parallel_pass_bytes(ContextMode mode, int N, size_t B, size_t T, size_t Cl, size_t L, bool backward,
                                          size_t element_bytes = sizeof(float), int backward_columns = 7) {
    if (N <= 1) return 0.0;
    double rows = (double)B * (T / N), f = (double)element_bytes;
    if (mode == ContextMode::ring) {
        double hops = backward ? (N - 1) + N : N - 1;  // each hop 2·Cl columns
        return L * 2.0 * hops * rows * 2 * Cl * f;
    }
    double columns = backward ? backward_columns : 4.0;  // (the GPU's backward sends the output too: 8)
    return L * 2.0 * (N - 1) * rows * columns * Cl / N * f;
}

// The bytes of a training step of `micro` micro-batches (-r 3 runs each block's forward again in the
// backward), of element_bytes each.
inline double context_parallel_step_bytes(ContextMode mode, int N, size_t B, size_t T, size_t Cl, size_t L, int micro,
                                          int recompute, size_t element_bytes = sizeof(float), int backward_columns = 7) {
    double forward = context_parallel_pass_bytes(mode, N, B, T, Cl, L, false, element_bytes);
    return micro * (forward * (recompute >= 3 ? 2 : 1) +
                    context_parallel_pass_bytes(mode, N, B, T, Cl, L, true, element_bytes, backward_columns));
}

// The start-up line: the split and this process's share, the buffers, and the step's predicted traffic.
inline std::string context_parallel_describe(const ContextParallel& cp, int B, int T, int Cl, int L, int micro, int recompute,
                                             size_t element_bytes = sizeof(float), int backward_columns = 7) {
    const int N = cp.group.size, Tl = T / N;
    std::string spans;
    for (int t = 0; t < Tl; t++) {  // this process's positions as runs "a-b"
        int first = context_position(cp.mode, N, cp.group.rank, T, t), last = first;
        while (t + 1 < Tl && context_position(cp.mode, N, cp.group.rank, T, t + 1) == last + 1) last++, t++;
        spans += (spans.empty() ? "" : ", ") + std::to_string(first) + "-" + std::to_string(last);
    }
    char text[512];
    snprintf(text, sizeof(text), "context parallel: -cp %d -cpm %s, positions %s of each row's %d on this process; "
             "buffers %.3f MiB; attention traffic %.0f bytes per step predicted (%d micro-batch(es), %d layer(s))", N,
             context_mode_name(cp.mode), spans.c_str(), T, cp.bytes() / 1048576.0,
             context_parallel_step_bytes(cp.mode, N, B, T, Cl, L, micro, recompute, element_bytes, backward_columns), micro, L);
    return text;
}

// Starts the scheme on `group` (its size N; 1: off) for B rows of T positions: the tokens' buffer and,
// with host_buffers, the CPU trainer's (the CUDA trainer's schemes work in its backward scratch).
inline void context_parallel_start(const ProcessGroup& group, ContextMode mode, int B, int T, int C, int Cl, int NH,
                                   ContextParallel* cp, bool host_buffers = true) {
    cp->group = group;
    cp->mode = mode;
    if (!cp->on()) return;
    int N = group.size;
    std::string problem = context_split_problem(N, mode, T) + context_heads_problem(N, mode, NH);
    if (!problem.empty()) fatal("%s", problem.c_str());
    cp->tokens.assign(2 * (size_t)B * (T / N), 0);
    if (!host_buffers) return;
    size_t sizes[4];
    context_parallel_buffer_sizes(mode, N, B, T, Cl, NH, sizes);
    for (int i = 0; i < 4; i++) cp->buffer[i].assign(sizes[i], 0.0f);
    cp->wpe.assign((size_t)(T / N) * C, 0.0f);
}

// A pass over B rows of T positions: this process's T/N positions of each row. Points *inputs and
// *targets (when not null) at its rows' tokens and *wpe (when wpe is not null) at its positions' rows of
// wpe, and returns T/N.
inline int context_parallel_enter(ContextParallel* cp, int B, int T, const int** inputs, const int** targets,
                                  float** wpe, int C) {
    int N = cp->group.size;
    std::string problem = context_split_problem(N, cp->mode, T);
    if (!problem.empty()) fatal("%s", problem.c_str());
    if ((size_t)B * (T / N) * 2 > cp->tokens.size()) {
        fatal("context parallelism: B=%d T=%d is larger than the %zu rows allocated", B, T, cp->tokens.size() / 2);
    }
    cp->T = T;
    cp->Tl = T / N;
    int Tl = cp->Tl;
    if (inputs == nullptr) return Tl;  // (a backward: the forward's rows)
    int* in = cp->tokens.data();
    int* tg = in + (size_t)B * Tl;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Tl; t++) {
            size_t from = (size_t)b * T + cp->position(cp->group.rank, t);
            in[(size_t)b * Tl + t] = (*inputs)[from];
            if (*targets) tg[(size_t)b * Tl + t] = (*targets)[from];
        }
    }
    *inputs = in;
    if (*targets) *targets = tg;
    if (wpe == nullptr) return Tl;  // (the backward's encoder needs no wpe)
    for (int t = 0; t < Tl; t++) {
        memcpy(cp->wpe.data() + (size_t)t * C, *wpe + (size_t)cp->position(cp->group.rank, t) * C, C * sizeof(float));
    }
    *wpe = cp->wpe.data();
    return Tl;
}

// The backward's end of the embedding: the (Tl, C) gradient the encoder left in cp->wpe (cleared by
// context_parallel_dwpe before it) added into dwpe's rows at this process's positions.
inline float* context_parallel_dwpe(ContextParallel* cp) {
    std::fill(cp->wpe.begin(), cp->wpe.end(), 0.0f);
    return cp->wpe.data();
}
inline void context_parallel_add_dwpe(const ContextParallel& cp, float* dwpe, int C) {
    for (int t = 0; t < cp.Tl; t++) {
        float* row = dwpe + (size_t)cp.position(cp.group.rank, t) * C;
        const float* d = cp.wpe.data() + (size_t)t * C;
        for (int c = 0; c < C; c++) row[c] += d[c];
    }
}
