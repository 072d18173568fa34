// ZeRO stage 1: optimizer state sharded across processes.
//
// With P processes, every process holds all parameters and computes gradients for its own samples.
// Then, instead of each process summing all gradients and running AdamW over every parameter (-z 0,
// all-reduce), the gradients are reduce-scattered: process r receives the sum for its shard only,
// updates that shard of the parameters with its shard of the AdamW moments, and the updated shards
// are all-gathered so every process has the full parameters again. The moments (and, on the GPU,
// the fp32 master weights) take 1/P of the memory.
//
// Shards are equal so the collectives can use one count: shard_size = ceil(N / P) and the flat
// parameter and gradient buffers are padded to P * shard_size. Process r owns elements
// [r * shard_size, (r + 1) * shard_size); the part of it at or past N is padding (zeros, ignored).
// Any N works, whatever P is.
#pragma once

#include <cstddef>
#include <cstdint>

struct ShardLayout {
    size_t num_parameters;  // N, the real count
    int num_processes;      // P
    int rank;
    size_t shard_size;      // ceil(N / P): elements per process, padding included
    size_t padded_size;     // P * shard_size
    size_t begin, end;      // this rank's real elements [begin, end), end <= N (begin == end is possible)
};

// The flat element that is element 0 of this rank's shard: rank * shard_size (begin, unlike this, is
// clipped to N), so a flat element e of the shard sits at e - shard_first there.
inline size_t shard_first(const ShardLayout& s) { return (size_t)s.rank * s.shard_size; }

inline ShardLayout shard_layout(size_t num_parameters, int num_processes, int rank) {
    ShardLayout s;
    s.num_parameters = num_parameters;
    s.num_processes = num_processes;
    s.rank = rank;
    s.shard_size = (num_parameters + num_processes - 1) / num_processes;
    s.padded_size = s.shard_size * num_processes;
    s.begin = (size_t)rank * s.shard_size;
    if (s.begin > num_parameters) s.begin = num_parameters;
    s.end = s.begin + s.shard_size;
    if (s.end > num_parameters) s.end = num_parameters;
    return s;
}
