// Flash attention's pieces on Hopper's warpgroup product (llmc/wgmma.cuh), shared by
// attention_forward.cu's v6 and attention_backward.cu's v5: head size 64, a block of 128 threads (one
// warpgroup), tiles of 64 rows. Each tile sits in shared memory in the 128-byte swizzle wgmma reads
// (wgmma_tile_offset: the 16-byte chunk c of row r at chunk c ^ (r % 8)) and serves both ways: K-major
// for a product that sums over the head's 64 values (S = q·kᵀ), N-major for one that sums over the
// tile's rows (O += P·v, where v's rows are the keys P's columns run over). The accumulator fragments
// are mma.sync's (llmc/mma.cuh), so flash attention's mask, softmax and stores (attention_flash.cuh) run
// on them unchanged, and a tile of probabilities packs into the A fragments of the next product as v4
// packs it for mma.sync.
#pragma once

#include "../../llmc/attention_flash.cuh"
#include "../../llmc/mma.cuh"
#include "../../llmc/wgmma.cuh"

constexpr int WG_HS = 64;                 // the head size these kernels are written for
constexpr int WG_TILE_BYTES = 64 * 128;   // a tile: 64 rows of 64 bf16

// dynamic shared memory on the 1024-byte boundary the swizzle's pattern starts at (launch with 1024
// bytes more than the tiles need)
__device__ inline unsigned char* wg_tiles(unsigned char* dynamic_shared) {
    return reinterpret_cast<unsigned char*>(((uintptr_t)dynamic_shared + 1023) & ~(uintptr_t)1023);
}

// rows row0 .. row0+63 of a (T, row_stride) head view into a swizzled tile, by cp.async (the caller
// commits); rows past T are zeros (ordinary stores: fence_proxy_async before wgmma reads them)
__device__ inline void wg_load_tile(unsigned char* tile, const floatX* src, size_t row_stride, int row0, int T) {
    const floatX* base = src + (size_t)row0 * row_stride;
    int rows_left = T - row0;
#pragma unroll
    for (int i = 0; i < 64 * 8 / 128; i++) {  // 8 chunks of 16 bytes a row, 4 a thread
        int chunk = threadIdx.x + i * 128, r = chunk / 8, c = chunk % 8;
        unsigned char* dst = tile + wgmma_tile_offset(r, 8 * c);
        if (r < rows_left) {
            cp_async16(dst, base + (r * (int)row_stride + 8 * c));
        } else {
            *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
        }
    }
}

// c (64 x 64) = A · Bᵀ with A and B tiles of 64 rows (both K-major over the head's 64 values): 4 wgmma's,
// issued (the caller fences before and commits and waits after)
__device__ inline void wg_abt(float (*c)[4], const unsigned char* a, const unsigned char* b) {
#pragma unroll
    for (int kc = 0; kc < WG_HS / 16; kc++)
        wgmma_m64n64k16_ss<0, 0>(&c[0][0], wgmma_tile_descriptor(a, kc, 0), wgmma_tile_descriptor(b, kc, 0), kc > 0);
}

// P (the accumulator fragments of a 64 x 64 tile) rounded to bf16 as the A fragments of its 4 k16 steps
__device__ inline void wg_pack_a(uint32_t (*a)[4], const float (*p)[4]) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        a[kc][0] = pack_bf16x2(p[2 * kc][0], p[2 * kc][1]);
        a[kc][1] = pack_bf16x2(p[2 * kc][2], p[2 * kc][3]);
        a[kc][2] = pack_bf16x2(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        a[kc][3] = pack_bf16x2(p[2 * kc + 1][2], p[2 * kc + 1][3]);
    }
}

// acc (64 x 64) += P · B with P in registers (wg_pack_a) and B a tile whose 64 rows are P's columns
// (N-major): 4 wgmma's, issued
__device__ inline void wg_pb(float (*acc)[4], const uint32_t (*a)[4], const unsigned char* b) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) wgmma_m64n64k16_rs<1>(&acc[0][0], a[kc], wgmma_tile_descriptor(b, kc, 1), 1);
}
