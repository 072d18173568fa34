// The tensor-core primitives of llmc/mma.cuh, emulated: the wrappers at the end of this file take the
// place of mma.cuh's inline PTX (which mma.cuh leaves out under CUDA_EMULATION). prelude.h includes
// this file, so every emulated source has them and nothing in llmc/ names the emulator. Semantics from the
// PTX ISA: "Warp-level matrix load instruction: ldmatrix", "Matrix Fragments for mma.m16n8k16 with
// floating point type" and "Data movement: cp.async". Tests: dev/emu/test_mma_emu.cpp.
//
// Warp-collective exchange. ldmatrix and mma are .sync.aligned: a lane's result depends on the other
// lanes' registers or addresses. Each lane writes what it contributes into its slot of a per-warp
// scratch area, all lanes meet in __syncwarp (the core's warp collective: every lane arrives before any
// goes on), and each lane then computes its own result from all slots. The scratch is double-buffered
// by the parity of the lane's count of such calls: a fast lane's next call writes the other half, and
// it cannot get two calls ahead, since the next __syncwarp waits for every lane. The count and the
// instruction are in the slot too, so lanes that do not execute the same instruction in the same order
// (undefined for .aligned instructions) fail loudly. The scratch is `thread_local`: one host thread
// runs one block at a time. It and the cp.async queues are the emulator's bookkeeping, hidden from the
// race checker (EMU_TSAN); the instructions' reads and writes of shared and global memory are seen.
//
// mma arithmetic. Each product of two bf16 values is exact in fp32 (8 + 8 significant bits <= 24), so
// only the additions round. A tensor core does not add them one by one in fp32: it sums the 16
// products and c at once, wider than fp32, and rounds the result (its exact alignment and truncation
// are not documented). Emulated so: the sum in double, rounded once to nearest even. This matters
// beyond the last bits: a kernel that takes the same dot product once on mma and once in an fp32 loop
// (flash attention's dP = dout·v and D = dout·out) gets two different roundings on a GPU, and an
// emulator that summed in the loop's order would hide that (an H100 showed it: dq and dk at T = 1,
// exactly zero in fp32 order, came out as rounding noise). Results can differ from a GPU's in the last
// bits of the accumulator, never more.
//
// cp.async. The copy is asynchronous: the data may land any time between the cp.async and the
// cp.async.wait_group that covers its group. Two faithful extremes, chosen with EMU_CP_ASYNC:
//   wait  (default)  the 16 bytes are read from global memory at the cp.async and written to shared
//                    memory only at the covering wait_group, so a thread that reads the destination
//                    before waiting (or another thread that reads it before that thread waited and
//                    the block synchronized) sees the old contents, as a GPU may show it.
//   issue            written at once (as a plain copy), which exposes the opposite race: a copy into a
//                    buffer other threads are still reading.
// A correct kernel passes under both. Copies never waited for are dropped when the block that issued
// them is followed by another block or launch (on a GPU they would land in shared memory nobody reads).
// The race checker (EMU_TSAN) sees the whole window whichever the mode: at the default's wait the write
// is made in a TSan context holding the issuing thread's clock of the issue (exec.cpp's
// race_check_copy_issue), so a refill issued while other warps still read the stage is reported even
// though the bytes land after the next barrier.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include <cuda_runtime.h>

namespace emu_mma {

// the emulator's bookkeeping in a scope, hidden from the race checker (emu::race_check_pause)
struct Bookkeeping {
    Bookkeeping() { emu::race_check_pause(); }
    ~Bookkeeping() { emu::race_check_resume(); }
};

inline int linear_thread() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// what one lane contributes to a warp-wide operation: up to 8 registers, or an address
struct LaneSlot {
    uint32_t regs[8];
    const void* address;
    uint32_t call;     // the lane's count of warp-wide calls
    const char* what;  // the instruction
};

// The scratch of every warp-wide instruction (one, whatever the instruction: a template's own statics
// would give each its own slots and counts, and lanes at different instructions would never meet in one)
struct WarpScratch {
    LaneSlot slots[2][1024];
    uint32_t calls[1024];
};
inline WarpScratch& warp_scratch() {
    static thread_local WarpScratch scratch;
    return scratch;
}

// Publishes this lane's slot (filled by `fill`) and waits for the warp; returns the warp's 32 slots.
template <typename Fill>
inline const LaneSlot* exchange(const char* what, Fill fill) {
    Bookkeeping hidden;
    WarpScratch& scratch = warp_scratch();
    auto& slots = scratch.slots;
    uint32_t* calls = scratch.calls;
    int thread = linear_thread();
    uint32_t call = calls[thread]++;
    LaneSlot& mine = slots[call & 1][thread];
    fill(mine);
    mine.call = call;
    mine.what = what;
    __syncwarp();
    const LaneSlot* warp = &slots[call & 1][thread & ~31];
    // Each lane compares the next lane's slot (lane 31 lane 0's): if any two lanes of the warp are at
    // different calls or instructions, two neighbours on that circle are, and one of them fails. (All 32
    // compares a lane, 1024 a warp, were a sixth of an emulated flash kernel's time.) The same literal is
    // the same pointer: strcmp only where they differ.
    int next = ((thread & 31) + 1) & 31;
    if (warp[next].call != call || (warp[next].what != what && strcmp(warp[next].what, what) != 0))
        emu::fail("%s (.sync.aligned) in block (%u,%u,%u): lane %d is at its warp-wide call %u (%s) while lane %d "
                  "is at call %u (%s); all lanes must execute the same instructions",
                  what, blockIdx.x, blockIdx.y, blockIdx.z, thread % 32, call, what, next, warp[next].call,
                  warp[next].what);
    return warp;
}

inline void require_full_warp(const char* what) {
    int warp_start = linear_thread() & ~31;
    int threads = (int)(blockDim.x * blockDim.y * blockDim.z);
    if (warp_start + 32 > threads)
        emu::fail("%s needs all 32 lanes of a warp (.sync.aligned), but the block of %d threads leaves warp %d partial",
                  what, threads, warp_start / 32);
}

inline float bf16_to_float(uint32_t bits16) {
    uint32_t bits = bits16 << 16;
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

inline void require_shared(const void* p, size_t bytes, const char* what) {
    if (((uintptr_t)p & 15) != 0) emu::fail("%s: shared address %p is not 16-byte aligned", what, p);
    if (emu::is_device_pointer(p, bytes)) emu::fail("%s: address %p is in global memory, not shared memory", what, p);
}

// ----------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16: lanes 8m..8m+7 give the addresses of matrix m's
// rows (8 b16 each, 16 bytes). Register m of lane l: without .trans the pair (row l/4, columns 2(l%4)
// and 2(l%4)+1) of matrix m; with .trans the pair (rows 2(l%4) and 2(l%4)+1, column l/4): the
// fragment of the transposed matrix. The lower column (row, with .trans) goes in the lower 16 bits.

inline void ldmatrix_x4(uint32_t* r, const void* shared, bool trans) {
    const char* what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    require_full_warp(what);
    require_shared(shared, 16, what);
    const LaneSlot* slots = exchange(what, [&](LaneSlot& slot) { slot.address = shared; });
    int lane = linear_thread() & 31;
    for (int m = 0; m < 4; m++) {
        if (!trans) {
            const uint16_t* row = static_cast<const uint16_t*>(slots[8 * m + lane / 4].address);
            r[m] = (uint32_t)row[2 * (lane % 4)] | ((uint32_t)row[2 * (lane % 4) + 1] << 16);
        } else {
            const uint16_t* row0 = static_cast<const uint16_t*>(slots[8 * m + 2 * (lane % 4)].address);
            const uint16_t* row1 = static_cast<const uint16_t*>(slots[8 * m + 2 * (lane % 4) + 1].address);
            r[m] = (uint32_t)row0[lane / 4] | ((uint32_t)row1[lane / 4] << 16);
        }
    }
}

// ----------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = a · b + d. With g = lane / 4, t = lane % 4:
//   A (16x16): reg 0 = A[g][2t, 2t+1], reg 1 = A[g+8][2t, 2t+1], reg 2 = A[g][2t+8, 2t+9], reg 3 = A[g+8][2t+8, 2t+9]
//   B (16x8):  reg 0 = B[2t, 2t+1][g], reg 1 = B[2t+8, 2t+9][g]
//   C, D (16x8, fp32): d0, d1 = D[g][2t, 2t+1], d2, d3 = D[g+8][2t, 2t+1]

inline void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
    require_full_warp("mma.sync.m16n8k16");
    const LaneSlot* slots = exchange("mma.sync.m16n8k16", [&](LaneSlot& slot) {
        for (int i = 0; i < 4; i++) slot.regs[i] = a[i];
        slot.regs[4] = b[0];
        slot.regs[5] = b[1];
    });
    int lane = linear_thread() & 31;
    int g = lane / 4, t = lane % 4;
    // this lane's rows g, g + 8 of A and columns 2t, 2t + 1 of B, read from the lanes that hold them (the
    // layout above: lane 4g' + q holds A[g'][2q, 2q+1] and A[g'][2q+8, 2q+9], and of B column g' the rows
    // 2q, 2q+1 and 2q+8, 2q+9)
    float a_rows[2][16], b_cols[2][16];
    for (int q = 0; q < 4; q++) {
        const LaneSlot& row_lane = slots[g * 4 + q];  // A[g][2q, 2q+1, 2q+8, 2q+9] and A[g+8][...]
        for (int half = 0; half < 2; half++) {
            a_rows[half][2 * q] = bf16_to_float(row_lane.regs[half] & 0xFFFFu);
            a_rows[half][2 * q + 1] = bf16_to_float(row_lane.regs[half] >> 16);
            a_rows[half][2 * q + 8] = bf16_to_float(row_lane.regs[half + 2] & 0xFFFFu);
            a_rows[half][2 * q + 9] = bf16_to_float(row_lane.regs[half + 2] >> 16);
        }
        for (int j = 0; j < 2; j++) {
            const LaneSlot& col_lane = slots[(2 * t + j) * 4 + q];  // B[2q, 2q+1, 2q+8, 2q+9][2t + j]
            b_cols[j][2 * q] = bf16_to_float(col_lane.regs[4] & 0xFFFFu);
            b_cols[j][2 * q + 1] = bf16_to_float(col_lane.regs[4] >> 16);
            b_cols[j][2 * q + 8] = bf16_to_float(col_lane.regs[5] & 0xFFFFu);
            b_cols[j][2 * q + 9] = bf16_to_float(col_lane.regs[5] >> 16);
        }
    }
    // the 16 exact products and c in one wide sum each, rounded once (see the top); the four sums side by
    // side, each in k's order
    double acc0 = d[0], acc1 = d[1], acc2 = d[2], acc3 = d[3];
    for (int k = 0; k < 16; k++) {
        double a0 = a_rows[0][k], a1 = a_rows[1][k], b0 = b_cols[0][k], b1 = b_cols[1][k];
        acc0 += a0 * b0;  // D[g][2t]
        acc1 += a0 * b1;  // D[g][2t+1]
        acc2 += a1 * b0;  // D[g+8][2t]
        acc3 += a1 * b1;  // D[g+8][2t+1]
    }
    d[0] = (float)acc0, d[1] = (float)acc1, d[2] = (float)acc2, d[3] = (float)acc3;
}

// ----------------------------------------------------------------------------
// cp.async.cg.shared.global 16 bytes, cp.async.commit_group, cp.async.wait_group N (per thread)

struct PendingCopy {
    void* shared;
    unsigned char bytes[16];
    int window;  // the race checker's window of the copy (emu::race_check_copy_issue)
};

struct CopyQueue {
    uint3 block{~0u, ~0u, ~0u};  // the block whose thread owns these copies
    std::vector<PendingCopy> uncommitted;
    std::deque<std::vector<PendingCopy>> groups;  // committed, oldest first
};

// ----------------------------------------------------------------------------
// Proxies (sm_90). wgmma (wgmma_emu.h) reads shared memory through the async proxy; a cp.async writes it
// through the generic proxy, and what it wrote is visible to the async proxy only after a
// fence.proxy.async by the thread whose copy it was (a barrier then orders that for the others: the PTX
// ISA's memory consistency model, "proxies"). The emulator's memory has one proxy, where a missing fence
// would go unseen on the CPU and show on a GPU as stale operands now and then. So it keeps, for each
// 16-byte chunk of the block's dynamic shared memory that a cp.async landed in, the thread whose copy it
// was and that thread's count of fences then; a wgmma operand in a chunk whose writer has not fenced
// since stops the run (proxy_require_fenced). Ordinary stores are not tracked (the emulator does not
// see them; a kernel must fence those as well).

struct ProxyTrack {
    unsigned long long block = ~0ull;  // emu::block_serial() of the block the entries are for
    const unsigned char* base = nullptr;  // its dynamic shared memory (the shared window)
    std::vector<uint32_t> writer;      // per chunk: 0, or the thread whose cp.async landed there + 1
    std::vector<uint32_t> fences_then; // that thread's count of fences at the landing
    std::vector<uint32_t> fences;      // per thread of the block: its fence.proxy.async so far
};

// the calling block's tracking, started afresh at a block's first use (one call for a batch of uses)
inline ProxyTrack& proxy_track() {
    static thread_local ProxyTrack track;
    unsigned long long block = emu::block_serial();
    if (track.block != block) {
        size_t bytes;
        track.base = emu::shared_window(&bytes, "fence.proxy.async");
        track.writer.assign(bytes / 16, 0);
        track.fences_then.assign(bytes / 16, 0);
        track.fences.assign(1024, 0);
        track.block = block;
    }
    return track;
}

// a cp.async of this thread landed its 16 bytes at `shared`
inline void proxy_note_generic_write(ProxyTrack& track, const void* shared) {
    const unsigned char* p = static_cast<const unsigned char*>(shared);
    // static shared memory lies outside the window: wgmma reads the dynamic window only
    if (p < track.base || p >= track.base + 16 * track.writer.size()) return;
    size_t chunk = (size_t)(p - track.base) / 16;
    int thread = linear_thread();
    track.writer[chunk] = (uint32_t)thread + 1;
    track.fences_then[chunk] = track.fences[thread];
}

inline void proxy_fence() {
    Bookkeeping hidden;
    proxy_track().fences[linear_thread()]++;
}

// `what` reads the chunk at `offset` of the dynamic shared memory through the async proxy
inline void proxy_require_fenced(const ProxyTrack& track, size_t offset, const char* what) {
    size_t chunk = offset / 16;
    if (chunk >= track.writer.size() || track.writer[chunk] == 0) return;
    uint32_t writer = track.writer[chunk] - 1;
    if (track.fences[writer] == track.fences_then[chunk])
        emu::fail("%s in block (%u,%u,%u) thread %d reads shared address 0x%zx, which a cp.async of thread %u wrote "
                  "(the generic proxy) with no fence.proxy.async by that thread since: the tensor cores (the async "
                  "proxy) need it, then a barrier", what, blockIdx.x, blockIdx.y, blockIdx.z, linear_thread(),
                  chunk * 16, writer);
}

inline bool copy_at_issue() {
    static const bool at_issue = emu::env_choice("EMU_CP_ASYNC", "wait", "issue");
    return at_issue;
}

// this thread's queue, emptied if it was left by a thread of another block
inline CopyQueue& copy_queue() {
    static thread_local CopyQueue queues[1024];
    CopyQueue& q = queues[linear_thread()];
    if (q.block.x != blockIdx.x || q.block.y != blockIdx.y || q.block.z != blockIdx.z) {
        q.uncommitted.clear();
        q.groups.clear();
        q.block = blockIdx;
    }
    return q;
}

inline void cp_async16(void* shared, const void* global) {
    require_shared(shared, 16, "cp.async");
    if (((uintptr_t)global & 15) != 0 || !emu::is_device_pointer(global, 16))
        emu::fail("cp.async: source %p is not 16 bytes of global memory on a 16-byte boundary", global);
    if (copy_at_issue()) {
        memcpy(shared, global, 16);
        Bookkeeping hidden;
        proxy_note_generic_write(proxy_track(), shared);
        return;
    }
    PendingCopy copy;
    copy.shared = shared;
    memcpy(copy.bytes, global, 16);  // the read of global memory
    copy.window = emu::race_check_copy_issue();
    Bookkeeping hidden;
    copy_queue().uncommitted.push_back(copy);
}

inline void cp_async_commit() {
    Bookkeeping hidden;
    CopyQueue& q = copy_queue();
    q.groups.push_back(std::move(q.uncommitted));
    q.uncommitted.clear();
}

// the copies of every committed group but the newest `pending` land now
inline void cp_async_wait(int pending) {
    Bookkeeping hidden;
    CopyQueue& q = copy_queue();
    if ((int)q.groups.size() <= pending) return;
    ProxyTrack& track = proxy_track();
    while ((int)q.groups.size() > pending) {
        for (const PendingCopy& copy : q.groups.front()) {
            // the copy lands: the race checker sees the write as made anywhere from the issue to here
            emu::race_check_copy_land(copy.window, copy.shared, 16);
            memcpy(copy.shared, copy.bytes, 16);
            proxy_note_generic_write(track, copy.shared);
        }
        q.groups.pop_front();
    }
}

// ----------------------------------------------------------------------------
// ex2.approx.ftz.f32, d = 2^a on the MUFU unit: not correctly rounded. Modeled as 2^a rounded to
// float, then moved by 2^-22 of itself up or down (the sign from a hash of a's bits, so it differs from
// element to element and from run to run of nothing), about the size of the hardware's error; a kernel
// whose tolerances only hold for the precise exp2f fails here. .ftz: a subnormal result is +0 (and a
// subnormal a is 0, which changes nothing: 2^0 and 2^tiny are both 1). -inf gives +0, +inf gives +inf,
// NaN gives NaN.
inline float ex2_approx_ftz(float a) {
    if (std::isnan(a)) return a;
    if (std::isinf(a)) return a > 0 ? a : 0.0f;
    float exact = (float)std::exp2((double)a);
    uint32_t bits;
    memcpy(&bits, &a, sizeof(bits));
    uint32_t hash = bits * 2654435761u;
    float moved = exact * (1.0f + ((hash >> 31) ? 1.0f : -1.0f) * 0x1p-22f);
    if (std::isfinite(exact) && std::fabs(moved) < 0x1p-126f) return 0.0f;  // flush to zero
    return moved;
}

}  // namespace emu_mma

// llmc/mma.cuh's wrappers (the names its kernels call), with the emulated bodies above.
inline void cp_async16(void* shared, const void* global) { emu_mma::cp_async16(shared, global); }
inline void cp_async_commit() { emu_mma::cp_async_commit(); }
template <int pending>
inline void cp_async_wait() {
    emu_mma::cp_async_wait(pending);
}
inline void ldmatrix_x4(uint32_t* r, const void* shared) { emu_mma::ldmatrix_x4(r, shared, false); }
inline void ldmatrix_x4_trans(uint32_t* r, const void* shared) { emu_mma::ldmatrix_x4(r, shared, true); }
inline void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) { emu_mma::mma_bf16_16816(d, a, b); }
inline float exp2_approx(float x) { return emu_mma::ex2_approx_ftz(x); }
