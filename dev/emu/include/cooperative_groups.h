// Emulated cooperative_groups.h (dev/emu): the thread block and its warp tiles as objects, the part of
// CUDA's cooperative groups that ordinary kernels use. cg::reduce and its operators are in
// cooperative_groups/reduce.h, as in the toolkit. Names and semantics follow the CUDA C++ Programming
// Guide ("Cooperative Groups").
//
//   namespace cg = cooperative_groups;
//   cg::thread_block block = cg::this_thread_block();         // block.sync() is __syncthreads()
//   cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
//   float sum = cg::reduce(warp, v, cg::plus<float>{});       // every lane of the tile gets the sum
//
// Nothing here is new machinery: a block's sync is the emulator's __syncthreads, and every tile
// collective is the emulator's warp collective (emu::warp_collective, as __shfl_*_sync are) with the
// tile's own lanes as the mask. So the checks on warp collectives apply to tiles unchanged: a lane of
// the tile that has exited or waits elsewhere is reported, never waited for; a shuffle that would read
// outside the tile returns the caller's own value, as __shfl_*_sync with width = the tile size do; and
// the race checker (EMU_TSAN) orders the tile's lanes at each collective, no other lanes.
//
// Lanes and tiles: CUDA numbers a block's threads x fastest (rank = x + X·(y + Y·z)) and warp w holds
// ranks 32w .. 32w+31. A tile of N (a power of 2 up to 32) holds ranks N·t .. N·t+N-1, so it lies inside
// one warp, at lanes (rank % 32) rounded down to a multiple of N and the N-1 after it:
//   N = 8, rank 45: lane 13, tile lanes 8..15, mask 0x0000ff00, thread_rank 5, meta_group_rank 5.
// The Programming Guide requires the parent's size to be a multiple of N; a block that is not is refused
// where it is partitioned (a GPU would leave the last tile with lanes that do not exist).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_runtime.h>

namespace cooperative_groups {

namespace emu_detail {

// the calling thread's rank in its block, x fastest, and the block's size
inline unsigned block_rank() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned block_size() { return blockDim.x * blockDim.y * blockDim.z; }

// One tile collective over `mask` (the tile's lanes) for a value of any trivially copyable type:
// values wider than the emulator's 8-byte warp slot go as several collectives of 8 bytes each.
template <typename T>
T tile_exchange(emu::WarpOp op, const char* name, unsigned mask, const T& value, int arg, int width) {
    static_assert(std::is_trivially_copyable<T>::value, "cooperative groups shuffle a trivially copyable type only");
    T result;
    unsigned char in[sizeof(T)], out[sizeof(T)];
    memcpy(in, &value, sizeof(T));
    for (size_t offset = 0; offset < sizeof(T); offset += 8) {
        size_t bytes = sizeof(T) - offset < 8 ? sizeof(T) - offset : 8;
        uint64_t bits = 0;
        memcpy(&bits, in + offset, bytes);
        bits = emu::warp_collective(op, name, mask, bits, arg, width);
        memcpy(out + offset, &bits, bytes);
    }
    memcpy(&result, out, sizeof(T));
    return result;
}

}  // namespace emu_detail

// ----------------------------------------------------------------------------
// the thread block: every thread of the launch's block

class thread_block {
  public:
    void sync() const { __syncthreads(); }
    unsigned thread_rank() const { return emu_detail::block_rank(); }  // x + X·(y + Y·z)
    unsigned size() const { return emu_detail::block_size(); }
    unsigned num_threads() const { return emu_detail::block_size(); }
    dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }  // blockIdx
    dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }  // threadIdx
    dim3 dim_threads() const { return blockDim; }
    dim3 group_dim() const { return blockDim; }  // the older name of dim_threads

  private:
    thread_block() = default;
    friend thread_block this_thread_block();
};

inline thread_block this_thread_block() { return thread_block(); }

// ----------------------------------------------------------------------------
// a tile of N consecutive threads of a block (or of a larger tile), N = 1, 2, 4, 8, 16 or 32

template <unsigned N, typename ParentT = void>
class thread_block_tile {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0,
                  "the emulator's thread_block_tile sizes are the powers of 2 up to 32 (one warp)");

  public:
    // a tile with a known parent converts to the plain thread_block_tile<N>, as in CUDA
    template <typename OtherParent>
    thread_block_tile(const thread_block_tile<N, OtherParent>& other)
        : mask_(other.mask_), meta_rank_(other.meta_rank_), meta_size_(other.meta_size_) {}

    static constexpr unsigned size() { return N; }
    static constexpr unsigned num_threads() { return N; }
    unsigned thread_rank() const { return emu_detail::block_rank() % N; }
    unsigned meta_group_rank() const { return meta_rank_; }  // which tile of the parent this is
    unsigned meta_group_size() const { return meta_size_; }  // how many tiles the parent was cut into

    // __syncwarp over the tile's lanes
    void sync() const { emu::warp_collective(emu::WarpOp::sync, "thread_block_tile::sync", mask_, 0, 0, 32); }

    // the value of the tile's thread src_rank (taken modulo N)
    template <typename T>
    T shfl(const T& var, int src_rank) const {
        return emu_detail::tile_exchange(emu::WarpOp::shfl, "thread_block_tile::shfl", mask_, var, src_rank, N);
    }
    // the value of thread_rank() + delta, or the caller's own value past the tile's end
    template <typename T>
    T shfl_down(const T& var, unsigned delta) const {
        return emu_detail::tile_exchange(emu::WarpOp::shfl_down, "thread_block_tile::shfl_down", mask_, var, (int)delta, N);
    }
    // the value of thread_rank() - delta, or the caller's own value before the tile's start
    template <typename T>
    T shfl_up(const T& var, unsigned delta) const {
        return emu_detail::tile_exchange(emu::WarpOp::shfl_up, "thread_block_tile::shfl_up", mask_, var, (int)delta, N);
    }
    // the value of thread_rank() ^ lane_mask, or the caller's own value when that is outside the tile
    template <typename T>
    T shfl_xor(const T& var, unsigned lane_mask) const {
        return emu_detail::tile_exchange(emu::WarpOp::shfl_xor, "thread_block_tile::shfl_xor", mask_, var, (int)lane_mask, N);
    }

    int any(int predicate) const {
        return (int)emu::warp_collective(emu::WarpOp::any, "thread_block_tile::any", mask_, predicate != 0, 0, 32);
    }
    int all(int predicate) const {
        return (int)emu::warp_collective(emu::WarpOp::all, "thread_block_tile::all", mask_, predicate != 0, 0, 32);
    }
    // bit r set when the tile's thread r has a nonzero predicate (bits counted from the tile's first lane)
    unsigned ballot(int predicate) const {
        unsigned warp_bits =
            (unsigned)emu::warp_collective(emu::WarpOp::ballot, "thread_block_tile::ballot", mask_, predicate != 0, 0, 32);
        return warp_bits >> __builtin_ctz(mask_);
    }

    // Emulator only: the tile's lanes in its warp (the mask its collectives use), for tests.
    unsigned emu_lane_mask() const { return mask_; }

  private:
    template <unsigned, typename>
    friend class thread_block_tile;
    template <unsigned M>
    friend thread_block_tile<M, thread_block> tiled_partition(const thread_block& parent);
    template <unsigned M, unsigned P, typename Q>
    friend thread_block_tile<M, thread_block_tile<P, Q>> tiled_partition(const thread_block_tile<P, Q>& parent);

    // the tile of the calling thread, the meta_rank-th of meta_size tiles of its parent
    thread_block_tile(unsigned meta_rank, unsigned meta_size) : meta_rank_(meta_rank), meta_size_(meta_size) {
        unsigned first_lane = emu_detail::block_rank() % 32 / N * N;
        mask_ = N == 32 ? 0xffffffffu : ((1u << N) - 1u) << first_lane;
    }

    unsigned mask_;
    unsigned meta_rank_, meta_size_;
};

// Cuts the block into tiles of N consecutive threads; the calling thread gets its own tile.
template <unsigned N>
thread_block_tile<N, thread_block> tiled_partition(const thread_block& parent) {
    unsigned threads = parent.size();
    if (threads % N != 0)
        emu::fail("block (%u,%u,%u): tiled_partition<%u> of a block of %u threads (CUDA requires the parent's size "
                  "to be a multiple of the tile size)",
                  blockIdx.x, blockIdx.y, blockIdx.z, N, threads);
    return thread_block_tile<N, thread_block>(parent.thread_rank() / N, threads / N);
}

// Cuts a tile of P into tiles of N (N <= P): the same lanes as partitioning the block into N directly,
// with meta_group_rank and meta_group_size relative to the parent tile.
template <unsigned N, unsigned P, typename Q>
thread_block_tile<N, thread_block_tile<P, Q>> tiled_partition(const thread_block_tile<P, Q>& parent) {
    static_assert(N <= P, "tiled_partition of a tile into larger tiles");
    return thread_block_tile<N, thread_block_tile<P, Q>>(parent.thread_rank() / N, P / N);
}

// cg::sync(group): the group's own barrier
template <typename Group>
void sync(const Group& group) {
    group.sync();
}

}  // namespace cooperative_groups
