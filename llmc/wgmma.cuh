// Hopper's warpgroup matrix multiply (wgmma, sm_90a): the tensor-core instruction that replaces
// mma.sync (llmc/mma.cuh) on an H100. Not yet used by the trainer: dev/cuda/attention_forward.cu's v6
// (flash attention's forward on it) waits for a GPU to time it. dev/cuda/wgmma_check.cu checks these
// wrappers against a CPU product, on a GPU and under the CPU emulator (dev/emu/wgmma_emu.h).
//
// One wgmma.mma_async.m64nNk16 is issued by a warpgroup, the 128 threads of 4 consecutive warps whose
// first warp is a multiple of 4, and computes D (64 x N, fp32) = A (64 x 16, bf16) · B (16 x N, bf16)
// (+ D with `accumulate`). A comes from shared memory or from registers, B from shared memory, D lives in
// registers. With w = the warp in the warpgroup, g = lane / 4, q = lane % 4:
//   D: thread's d[i], i < N/2: row 16w + g + 8((i >> 1) & 1), column 8(i >> 2) + 2q + (i & 1)
//      (for each 8 columns, the m16n8 accumulator fragment of mma.sync, for warp w's 16 rows)
//   A in registers: a[j] holds two bf16 (the lower column in the lower half), a[j]'s row
//      16w + g + 8 (j & 1), columns 2q + 8 (j >> 1) and the next: mma.sync m16n8k16's A fragment of
//      rows 16w..16w+15 (llmc/mma.cuh), so ldmatrix or a softmax's output feeds it as it feeds mma.sync
// Shared-memory operands are described by a 64-bit descriptor (wgmma_descriptor): the start address,
// two strides and a swizzle mode. The one layout used here is the 128-byte swizzle with tiles of 64
// bf16 a row (128 bytes: a head of GPT-2's attention), rows 128 bytes apart, 8 rows an atom of 1024
// bytes on a 1024-byte boundary, and within each row the 16-byte chunk c of row r stored at chunk
// c ^ (r % 8) (wgmma_tile_offset). Such a tile serves both ways:
//   K-major (trans 0):  the tile's rows are the operand's rows (A's m, B's n), its columns k;
//                       the k16 slice j starts 32 j bytes in; SBO = 1024 (8 rows to the next 8)
//   MN-major (trans 1): the tile's rows are k, its columns n (B = V in attention's P·V);
//                       the k16 slice j starts 2048 j bytes in; SBO = 1024 (8 k to the next 8)
// (LBO is not used by either at 64 columns; it is encoded as 16 bytes, as the PTX ISA assumes.)
//
// It is asynchronous: the product reads shared memory and writes D any time between the mma_async and
// the wgmma.wait_group that covers it, so D (and a register A) must not be touched in between, and the
// operands in shared memory must not change. The protocol, per warpgroup:
//   (shared memory written by ordinary stores: fence_proxy_async() in each writer, then a barrier)
//   wgmma_fence();                     before the first mma_async after the registers were touched
//   wgmma_m64n64k16_ss<0, 0>(d, ...);  any number, chained into the same d
//   wgmma_commit();                    the issued ones become a group
//   wgmma_wait<0>();                   until at most 0 groups are pending: d is readable again
//
// The PTX ISA (9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate") gives the register
// fragments only as figures; the formulas above are read off them (and CUTLASS's layouts agree).
// Accumulation: the ISA leaves the order and rounding of the 16 products' sum unspecified.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

enum WgmmaSwizzle : uint32_t { WGMMA_SWIZZLE_NONE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };

// The descriptor of a shared-memory operand: the start address (in the shared window), the leading and
// the stride dimension byte offsets (16-byte multiples), the swizzle mode; the base offset 0 (the
// swizzle's pattern starts on its alignment: 1024 bytes for 128B).
__host__ __device__ inline uint64_t wgmma_descriptor_bits(uint32_t start, uint32_t lbo, uint32_t sbo, WgmmaSwizzle swizzle) {
    return (uint64_t)((start & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | ((uint64_t)swizzle << 62);
}

__device__ inline uint64_t wgmma_descriptor(const void* shared, uint32_t lbo, uint32_t sbo, WgmmaSwizzle swizzle) {
    return wgmma_descriptor_bits((uint32_t)__cvta_generic_to_shared(shared), lbo, sbo, swizzle);
}

// The byte offset of element (row, col) of a tile of 64-bf16 rows in the 128-byte swizzle (above); the
// tile starts on a 1024-byte boundary.
__host__ __device__ inline uint32_t wgmma_tile_offset(int row, int col) {
    uint32_t chunk = (uint32_t)(col / 8) ^ (uint32_t)(row % 8);
    return (uint32_t)row * 128 + chunk * 16 + (uint32_t)(col % 8) * 2;
}

// The descriptor of the k16 slice j of such a tile, read K-major (trans 0) or MN-major (trans 1).
__device__ inline uint64_t wgmma_tile_descriptor(const void* tile, int j, int trans) {
    const char* start = static_cast<const char*>(tile) + (trans ? 2048 * j : 32 * j);
    return wgmma_descriptor(start, 16, 1024, WGMMA_SWIZZLE_128B);
}

#if !defined(CUDA_EMULATION)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Built for a target without wgmma (sm_80, or sm_90 without the "a"): the kernels that call these
// must not run there; they trap if they do.
#define WGMMA_UNAVAILABLE 1
#endif

__device__ inline void wgmma_fence() {
#ifndef WGMMA_UNAVAILABLE
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ inline void wgmma_commit() {
#ifndef WGMMA_UNAVAILABLE
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// waits until at most `pending` of the warpgroup's committed groups are still in flight
template <int pending>
__device__ inline void wgmma_wait() {
#ifndef WGMMA_UNAVAILABLE
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
#endif
}

// shared memory this thread wrote with ordinary stores becomes visible to the tensor cores' reads
__device__ inline void fence_proxy_async() {
#ifndef WGMMA_UNAVAILABLE
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#ifdef WGMMA_UNAVAILABLE
template <int TRANS_A, int TRANS_B>
__device__ inline void wgmma_m64n64k16_ss(float*, uint64_t, uint64_t, int) { __trap(); }
template <int TRANS_B>
__device__ inline void wgmma_m64n64k16_rs(float*, const uint32_t*, uint64_t, int) { __trap(); }
template <int TRANS_A, int TRANS_B>
__device__ inline void wgmma_m64n128k16_ss(float*, uint64_t, uint64_t, int) { __trap(); }
template <int TRANS_B>
__device__ inline void wgmma_m64n128k16_rs(float*, const uint32_t*, uint64_t, int) { __trap(); }
#else
// d (N/2 floats) = A · B (+ d when accumulate != 0). _ss: A from shared memory (desc_a); _rs: A from
// four registers a (its fragment, above). TRANS_A, TRANS_B: 0 K-major, 1 M- or N-major.
template <int TRANS_A, int TRANS_B>
__device__ inline void wgmma_m64n64k16_ss(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ inline void wgmma_m64n64k16_rs(float* d, const uint32_t* a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

template <int TRANS_A, int TRANS_B>
__device__ inline void wgmma_m64n128k16_ss(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ inline void wgmma_m64n128k16_rs(float* d, const uint32_t* a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
#endif  // WGMMA_UNAVAILABLE

#endif  // !CUDA_EMULATION
