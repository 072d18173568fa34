// Context parallelism's split of a sequence (llmc/parallel/context_parallel.h has the scheme): which
// positions each of the -cp processes holds, and the runs it cannot split. Apart from the scheme, so
// that the flags (llmc/run/args.h) and the layout check them before anything is built.
#pragma once

#include <cstdio>
#include <string>

enum class ContextMode { ring, ulysses };

inline const char* context_mode_name(ContextMode m) { return m == ContextMode::ring ? "ring" : "ulysses"; }

inline bool context_mode_from_name(const std::string& name, ContextMode* mode) {
    if (name == "ring") *mode = ContextMode::ring;
    else if (name == "ulysses") *mode = ContextMode::ulysses;
    else return false;
    return true;
}

// Why -cp N -cpm mode cannot split sequences of T positions with `heads` heads per process, or "".
inline std::string context_parallel_problem(int N, ContextMode mode, int T, int heads) {
    char text[320] = "";
    if (N <= 1) return "";
    if (mode == ContextMode::ring && T % (2 * N) != 0) {
        snprintf(text, sizeof(text), "-cp %d -cpm ring: T = %d does not divide into %d chunks (the ring's causal split "
                 "is load-balanced: each process holds a chunk from the front and its mirror from the back); use a T "
                 "divisible by %d", N, T, 2 * N, 2 * N);
    } else if (mode == ContextMode::ulysses && T % N != 0) {
        snprintf(text, sizeof(text), "-cp %d -cpm ulysses: T = %d does not divide into %d chunks", N, T, N);
    } else if (mode == ContextMode::ulysses && heads % N != 0) {
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
