// Warp-level tensor-core primitives (sm_80+) for the flash attention kernels (attention.cuh) and the
// dev/cuda matmul: the asynchronous global->shared copy, ldmatrix, and the bf16 mma.sync m16n8k16 with
// fp32 accumulators; and the one special-function instruction flash attention's softmax leans on,
// ex2.approx.
//
// mma.sync.m16n8k16.row.col: D (16x8, fp32) = A (16x16, bf16, row-major) · B (16x8, bf16, "col": stored
// as 8 rows of 16 k values) + C. With g = lane / 4 and i = lane % 4, each lane holds:
//   A: a0 = A[g][2i, 2i+1]   a1 = A[g+8][2i, 2i+1]   a2 = A[g][2i+8, 2i+9]   a3 = A[g+8][2i+8, 2i+9]
//   B: b0 = B[2i, 2i+1][g]   b1 = B[2i+8, 2i+9][g]
//   C, D: c0, c1 = D[g][2i, 2i+1]   c2, c3 = D[g+8][2i, 2i+1]
// (two bf16 per 32-bit register, the lower column in the lower half).
//
// ldmatrix.x4 loads four 8x8 bf16 matrices from shared memory; lanes 8m..8m+7 give the addresses of
// matrix m's 8 rows (16 bytes each), and register m of every lane receives matrix m's elements
// [lane/4][2(lane%4), 2(lane%4)+1], which is exactly the A/B fragment layout above. With .trans each
// lane receives [2(lane%4), 2(lane%4)+1][lane/4] instead: a matrix stored k-major serves as B.
//
// ex2.approx.ftz.f32 is 2^x in one MUFU instruction, not correctly rounded (relative error of the order
// of 2^-22) and with subnormal results flushed to zero; exp2f without -use_fast_math wraps the same
// instruction in a few more to scale subnormal results, which a softmax never needs.
//
// Under the CPU emulator (CUDA_EMULATION, dev/emu) these six wrappers are not defined here: the
// emulator supplies functions of the same names with emulated bodies from the PTX ISA's definitions
// (dev/emu/mma_emu.h, tested one warp at a time by dev/emu/test_mma_emu.cpp).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#if !defined(CUDA_EMULATION)

__device__ inline uint32_t shared_address(const void* pointer) {
    return (uint32_t)__cvta_generic_to_shared(pointer);
}

// 16 bytes global -> shared, bypassing L1 (.cg); completes at cp_async_wait
__device__ inline void cp_async16(void* shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared)), "l"(global));
}

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// waits until at most `pending` of this thread's committed groups are still in flight
template <int pending>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

__device__ inline void ldmatrix_x4(uint32_t* r, const void* shared) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(shared)));
}

__device__ inline void ldmatrix_x4_trans(uint32_t* r, const void* shared) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(shared)));
}

// d (4 floats) += a (4 regs) · b (2 regs)
__device__ inline void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 2^x, approximately (above); 2^-inf = +0
__device__ inline float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif  // !CUDA_EMULATION

// two floats -> one register of two bf16, `lo` in the lower half
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&pair);
}
