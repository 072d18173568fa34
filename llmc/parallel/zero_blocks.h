// ZeRO over an optimizer state kept in blocks (-opt adamw8, llmc/adamw8.h), for both trainers.
//
// 8-bit AdamW encodes each block of 256 elements with the block's maxima (max |m|, max v). Its blocks
// are counted from each tensor's start, so that the state is the same in every layout, and a ZeRO shard
// boundary (element k * shard_size, llmc/parallel/zero.h) can cut one: two processes then update the two
// parts, and each needs the whole block's maxima to encode its part. Before encoding, the processes
// exchange their parts' maxima in one all-reduce (maximum) of 2 floats per boundary:
//
//   boundary:      1         2         3                  (P = 4; a block of 256 elements: [----])
//   elements:  ....|.........|.........|.........
//   blocks:   [---][--|-][----][---|--][----]
//                    ^ cut by 1          ^ cut by 3        (boundary 2 falls between blocks)
//
// A process writes its part's maxima at every boundary inside the cut blocks it holds (a shard shorter
// than a block lies inside one block with two boundaries), 0 elsewhere (both maxima are of values >= 0,
// so 0 changes nothing), and reads the whole block's maxima back from the first such boundary. Every
// process of the group takes part every step, whether its shard's edges cut a block or not. The maxima
// are exact and the maximum of floats has no order: the same bits as one process updating the block.
// (Maxima are not parameters or gradients: the all-reduce goes uncounted in comm_bytes, as comm.h says.)
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "../adamw8.h"
#include "comm.h"
#include "layout.h"
#include "zero.h"

// The boundaries k inside the block [begin, end): begin < k * shard_size < end, as [*k0, *k1).
inline void zero_boundaries_in(const ShardLayout& s, size_t begin, size_t end, size_t* k0, size_t* k1) {
    *k0 = begin / s.shard_size + 1;
    *k1 = (end + s.shard_size - 1) / s.shard_size;
}

// The cut blocks' maxima made whole. blocks: each cut block this process holds part of, as its elements
// [begin, end); maxima: 2 host floats per such block, this process's part's, replaced by the whole block's.
// A collective of the data-parallel group under ZeRO 1..3 (every process calls it); staging carries the
// host vector to the backend (host_staging() for MPI).
inline void zero_complete_block_maxima(const ProcessGroup& g, const ShardLayout& s,
                                       const std::vector<std::pair<size_t, size_t>>& blocks, float* maxima,
                                       const CommStaging& staging) {
    if (!comm_active(g)) return;
    std::vector<float> bounds(2 * (size_t)s.num_processes, 0.0f);
    for (size_t i = 0; i < blocks.size(); i++) {
        size_t k0, k1;
        zero_boundaries_in(s, blocks[i].first, blocks[i].second, &k0, &k1);
        for (size_t k = k0; k < k1; k++) bounds[2 * k] = maxima[2 * i], bounds[2 * k + 1] = maxima[2 * i + 1];
    }
    float* buf = staging.buffer(bounds.size());
    staging.put(buf, bounds.data(), bounds.size());
    all_reduce(g, buf, bounds.size(), COMM_FLOAT32, COMM_MAX);
    comm_join(g);  // NCCL: the compute stream (which the wait waits for) waits for the all-reduce
    staging.wait("the maxima of the 8-bit blocks cut by shard boundaries");
    staging.get(bounds.data(), buf, bounds.size());
    staging.release();
    for (size_t i = 0; i < blocks.size(); i++) {
        size_t k0, k1;
        zero_boundaries_in(s, blocks[i].first, blocks[i].second, &k0, &k1);
        maxima[2 * i] = bounds[2 * k0], maxima[2 * i + 1] = bounds[2 * k0 + 1];
    }
}

// The same for 8-bit AdamW's cut blocks as its update hands them over (llmc/adamw8.h: adamw8_update's
// complete_edges): their maxima made the whole blocks'. Under ZeRO 1..3 only; without, every block is whole.
inline void zero_complete_adamw8_edges(const ParallelLayout& lay, const ShardLayout& s, const Adamw8Blocks& map,
                                       std::vector<Adamw8Edge>& edges, const CommStaging& staging) {
    if (lay.zero_stage == 0) return;
    std::vector<std::pair<size_t, size_t>> blocks;
    std::vector<float> maxima;
    for (const Adamw8Edge& e : edges) {
        blocks.push_back({map.block_begin(e.block), map.block_end(e.block)});
        maxima.insert(maxima.end(), {e.m_max, e.v_max});
    }
    zero_complete_block_maxima(lay.dp_group, s, blocks, maxima.data(), staging);
    for (size_t i = 0; i < edges.size(); i++) edges[i].m_max = maxima[2 * i], edges[i].v_max = maxima[2 * i + 1];
}
