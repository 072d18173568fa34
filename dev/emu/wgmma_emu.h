// Hopper's warpgroup matrix multiply (llmc/wgmma.cuh), emulated: the wrappers at the end of this file
// take the place of wgmma.cuh's inline PTX (left out under CUDA_EMULATION); prelude.h includes this file
// after mma_emu.h, whose lane exchange it uses. Semantics from the PTX ISA, 9.7.15 ("Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions"): wgmma.mma_async.m64nNk16.f32.bf16.bf16 with
// A from shared memory (a descriptor) or from registers, B from shared memory, and wgmma.fence,
// commit_group and wait_group. Checked by dev/cuda/wgmma_check.cu (on a GPU as well, which settles
// whether this reading of the ISA is the hardware's) and dev/emu/test_emu_seeded_bugs.cpp.
//
// Asynchrony. An mma_async computes nothing when issued: it is queued in the issuing thread's list,
// its accumulators saved and then overwritten with NaN (they belong to the tensor cores until the wait:
// a kernel that reads them early sees NaN, as a GPU may show it garbage). wgmma.commit_group makes the
// queued ones a group; wgmma.wait_group N computes, oldest first, every group but the newest N, reading
// shared memory only then (the latest a GPU may read it: a kernel that refills an operand's buffer
// before waiting computes with the new contents), and writes the accumulators back. Products chained
// into the same accumulators (the canonical k loop) see each other's results, in issue order, as the
// ISA orders same-shape accumulations. The race checker (EMU_TSAN) sees each read as made anywhere
// from the wgmma.fence before the issue to the wait (exec.cpp's race_check_async_read).
//
// Each thread computes its own accumulators (rows 16w + g, +8, columns 8j + 2q, +1: llmc/wgmma.cuh)
// from the operands: a shared-memory operand through its descriptor (every thread reads what it needs),
// a register A through the lane exchange of its warp (a warp's 16 rows are its lanes' registers). The
// arithmetic is mma_emu.h's: the 16 exact products and the accumulator summed in double, rounded once
// (the ISA leaves the order and rounding unspecified).
//
// Checked, each a failure with a message: a partial warpgroup; lanes of a warp that pass different
// descriptors, flags or shapes; an mma_async with no wgmma.fence since the thread's last wait_group
// (stricter than the ISA, which asks for the fence only where the registers were touched since: after
// a wait a kernel reads its results); a descriptor with a base offset (not emulated); an operand
// outside the block's dynamic shared memory (the shared window: exec.cpp). Not checked: that the four
// warps pass the same descriptors (each warp is checked alone), that register A is left untouched until
// the wait (it is read at the issue). fence.proxy.async: an operand a cp.async wrote must have had its
// writer's fence before the issue (mma_emu.h's proxy tracking; ordinary stores are not seen).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

namespace emu_wgmma {

inline void require_full_warpgroup(const char* what) {
    int first = emu_mma::linear_thread() & ~127;
    int threads = (int)(blockDim.x * blockDim.y * blockDim.z);
    if (first + 128 > threads)
        emu::fail("%s needs all 128 threads of a warpgroup (4 warps from a multiple of 4), but the block of %d threads "
                  "leaves warpgroup %d partial", what, threads, first / 128);
}

// ----------------------------------------------------------------------------
// the descriptor and the canonical layouts (PTX ISA 9.7.15.5.1.2: "Shared Memory Matrix Layout", the
// canonical layouts' table and "Matrix Descriptor Format")

struct Descriptor {
    size_t start, lbo, sbo;  // bytes
    int mode;                // 0 none, 1 128B, 2 64B, 3 32B
};

inline Descriptor decode(uint64_t bits, const char* what) {
    Descriptor d;
    d.start = (size_t)(bits & 0x3FFF) << 4;
    d.lbo = (size_t)((bits >> 16) & 0x3FFF) << 4;
    d.sbo = (size_t)((bits >> 32) & 0x3FFF) << 4;
    d.mode = (int)(bits >> 62);
    if (((bits >> 49) & 7) != 0)
        emu::fail("%s: the descriptor 0x%016llx has a base offset (%d): not emulated (the swizzle's pattern must start on "
                  "its own alignment)", what, (unsigned long long)bits, (int)((bits >> 49) & 7));
    return d;
}

// The bytes of a swizzled row (the atom's width): 128, 64 or 32; 0 without swizzle.
inline size_t swizzle_bytes(int mode) { return mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0; }

// The swizzle acts on the shared address itself: the 16-byte chunk (address bits 4 and up, as many
// as the atom has chunks in a row) is XORed with the 128-byte row's index within the atom (bits 7 up).
inline size_t swizzle(size_t address, int mode) {
    size_t chunks = swizzle_bytes(mode) / 16;  // 8, 4, 2 (0: none)
    if (chunks == 0) return address;
    return address ^ (((address >> 7) & (chunks - 1)) << 4);
}

// The shared address of element (r, k) of an operand read through descriptor d: r its row of A (m) or
// column of B (n), k in 0..15; K-major (trans 0) or M/N-major (trans 1). Core matrices are 8 rows of
// 16 bytes; without swizzle LBO steps along the leading dimension's core matrices and SBO along the
// other's; with swizzle an atom is 8 rows of S bytes, LBO unused for K-major (16 bf16 fit in a row),
// and for M/N-major LBO steps from one atom's S/2 elements of r to the next, SBO from 8 k to the next.
inline size_t element_address(const Descriptor& d, int trans, int r, int k) {
    size_t S = swizzle_bytes(d.mode);
    size_t a;
    if (trans == 0) {
        if (S == 0) a = d.start + (r % 8) * 16 + (r / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo;
        else a = d.start + (r % 8) * S + (r / 8) * d.sbo + k * 2;
    } else {
        if (S == 0) a = d.start + (r % 8) * 2 + (r / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
        else a = d.start + (r % (S / 2)) * 2 + (r / (S / 2)) * d.lbo + (k % 8) * S + (k / 8) * d.sbo;
    }
    return swizzle(a, d.mode);
}

// The block's shared window, fetched once an operation: an element's load is then arithmetic and a copy
// (with a call an element, attention_backward's v5 was make test's slowest program under ASan).
struct Window {
    const unsigned char* base;
    size_t bytes;
    int race_window;  // the race checker's window of the reads (-1: no race checker)
};

inline float load_bf16(const Window& sw, const Descriptor& d, int trans, int r, int k, const char* what) {
    size_t address = element_address(d, trans, r, k);
    if (address + 2 > sw.bytes) emu::shared_window_overrun(address, 2, sw.bytes, what);
    const unsigned char* p = sw.base + address;
    if (sw.race_window >= 0) emu::race_check_async_read(sw.race_window, p, 2);
    uint16_t bits;
    memcpy(&bits, p, 2);
    return emu_mma::bf16_to_float(bits);
}

// ----------------------------------------------------------------------------
// the queue of each thread

struct Operation {
    float* d;           // the accumulators (the thread's registers), N/2 of them
    int n;              // N
    bool a_registers;   // A from registers (a_rows) or shared memory (desc_a)
    float a_rows[2][16];
    uint64_t desc_a, desc_b;
    int trans_a, trans_b;
    bool accumulate;
    int window;         // the race checker's window of the issue
};

struct Accumulators {   // the values of a d the tensor cores hold (from its first pending operation on)
    float* d;
    int n;
    std::vector<float> values;
};

struct Queue {
    uint3 block{~0u, ~0u, ~0u};
    bool fenced = false;
    int window = -1;  // the race checker's window of the operations issued since the fence
    std::vector<Operation> uncommitted;
    std::deque<std::vector<Operation>> groups;
    std::vector<Accumulators> held;
};

// this thread's queue, emptied if a thread of another block left it
inline Queue& queue() {
    static thread_local Queue queues[1024];
    Queue& q = queues[emu_mma::linear_thread()];
    if (q.block.x != blockIdx.x || q.block.y != blockIdx.y || q.block.z != blockIdx.z) {
        q = Queue();
        q.block = blockIdx;
    }
    return q;
}

inline Accumulators* held(Queue& q, float* d) {
    for (Accumulators& a : q.held)
        if (a.d == d) return &a;
    return nullptr;
}

// One operation, at the wait: this thread's N/2 accumulators.
inline void compute(Queue& q, const Operation& op) {
    const char* what = "wgmma.mma_async";
    Accumulators* acc = held(q, op.d);
    int t = emu_mma::linear_thread() % 128, w = t / 32, g = (t % 32) / 4, qd = t % 4;
    int rows[2] = {16 * w + g, 16 * w + g + 8};
    Window sw;
    sw.base = emu::shared_window(&sw.bytes, what);
    sw.race_window = emu::race_checking() ? op.window : -1;
    float a[2][16];
    if (op.a_registers) {
        memcpy(a, op.a_rows, sizeof(a));
    } else {
        Descriptor da = decode(op.desc_a, what);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k++) a[h][k] = load_bf16(sw, da, op.trans_a, rows[h], k, what);
    }
    Descriptor db = decode(op.desc_b, what);
    for (int j = 0; j < op.n / 8; j++) {
        for (int c = 0; c < 2; c++) {
            int col = 8 * j + 2 * qd + c;
            float b[16];
            for (int k = 0; k < 16; k++) b[k] = load_bf16(sw, db, op.trans_b, col, k, what);
            for (int h = 0; h < 2; h++) {
                float& out = acc->values[4 * j + 2 * h + c];
                double sum = op.accumulate ? (double)out : 0.0;  // the 16 exact products and D, rounded once
                for (int k = 0; k < 16; k++) sum += (double)a[h][k] * b[k];
                out = (float)sum;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// the instructions

// .sync.aligned: every lane of the warp at the same instruction with the same operands (descriptors,
// flags; for the register form its A registers come back from the exchange)
inline const emu_mma::LaneSlot* exchange(const char* what, uint64_t desc_a, uint64_t desc_b, const uint32_t* a,
                                         uint32_t flags) {
    const emu_mma::LaneSlot* slots = emu_mma::exchange(what, [&](emu_mma::LaneSlot& s) {
        s.regs[0] = (uint32_t)desc_a;
        s.regs[1] = (uint32_t)(desc_a >> 32);
        s.regs[2] = (uint32_t)desc_b;
        s.regs[3] = (uint32_t)(desc_b >> 32);
        for (int i = 0; i < 4; i++) s.regs[4 + i] = a ? a[i] : 0;
        s.address = reinterpret_cast<const void*>((uintptr_t)flags);
    });
    int lane = emu_mma::linear_thread() & 31, first = a ? 2 : 0;  // the register form has no desc_a
    for (int l = 0; l < 32; l++) {
        if (slots[l].address != slots[lane].address ||
            memcmp(slots[l].regs + first, slots[lane].regs + first, (4 - first) * sizeof(uint32_t)) != 0)
            emu::fail("%s (.aligned) in block (%u,%u,%u): lanes %d and %d of warp %d pass different descriptors, shapes "
                      "or flags", what, blockIdx.x, blockIdx.y, blockIdx.z, lane, l, emu_mma::linear_thread() / 32);
    }
    return slots;
}

// At the issue (the tensor cores may read from then on): every chunk of shared memory this thread's
// share of the product reads that a cp.async wrote has had its writer's fence.proxy.async (mma_emu.h).
// A 16-byte chunk holds 8 consecutive elements along the contiguous dimension: k for a K-major operand
// (k 0 and 8 stand for a row), r for an M/N-major one (every k).
inline void require_operands_fenced(const Operation& op, const char* what) {
    emu_mma::Bookkeeping hidden;
    const emu_mma::ProxyTrack& track = emu_mma::proxy_track();
    int t = emu_mma::linear_thread() % 128, w = t / 32, g = (t % 32) / 4, qd = t % 4;
    auto check = [&](uint64_t bits, int trans, int r) {
        Descriptor d = decode(bits, what);
        for (int k = 0; k < 16; k += trans == 0 ? 8 : 1)
            emu_mma::proxy_require_fenced(track, element_address(d, trans, r, k), what);
    };
    if (!op.a_registers)
        for (int h = 0; h < 2; h++) check(op.desc_a, op.trans_a, 16 * w + g + 8 * h);
    for (int j = 0; j < op.n / 8; j++)
        for (int c = 0; c < 2; c++) check(op.desc_b, op.trans_b, 8 * j + 2 * qd + c);
}

inline void mma_async(const char* what, float* d, int n, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
                      int trans_a, int trans_b, int accumulate) {
    require_full_warpgroup(what);
    uint32_t flags = (uint32_t)n | (uint32_t)trans_a << 16 | (uint32_t)trans_b << 17 | (uint32_t)(accumulate != 0) << 18;
    const emu_mma::LaneSlot* slots = exchange(what, desc_a, desc_b, a, flags);
    emu_mma::Bookkeeping hidden;
    Queue& q = queue();
    if (!q.fenced)
        emu::fail("%s in block (%u,%u,%u) thread %d: no wgmma.fence since the warpgroup's last wgmma.wait_group (or the "
                  "kernel's start): the accumulator and A registers must be fenced before the tensor cores use them",
                  what, blockIdx.x, blockIdx.y, blockIdx.z, emu_mma::linear_thread());
    Operation op;
    op.d = d;
    op.n = n;
    op.a_registers = a != nullptr;
    op.desc_a = desc_a;
    op.desc_b = desc_b;
    op.trans_a = trans_a;
    op.trans_b = trans_b;
    op.accumulate = accumulate != 0;
    if (a != nullptr) {  // rows g and g + 8 of the warp's 16: a[j] of lane 4g' + q' holds row g' + 8 (j & 1)
        int g = (emu_mma::linear_thread() % 32) / 4;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k++) {
                int lane = 4 * g + (k % 8) / 2, reg = h + 2 * (k / 8);
                op.a_rows[h][k] = emu_mma::bf16_to_float((slots[lane].regs[4 + reg] >> (16 * (k % 2))) & 0xFFFFu);
            }
    }
    require_operands_fenced(op, what);
    op.window = q.window;
    if (held(q, d) == nullptr) {
        Accumulators acc{d, n, std::vector<float>(d, d + n / 2)};
        q.held.push_back(std::move(acc));
        for (int i = 0; i < n / 2; i++) d[i] = __builtin_nanf("");  // the tensor cores' now
    } else if (held(q, d)->n != n) {
        emu::fail("%s: the accumulators of a pending m64n%dk16 used by an m64n%dk16", what, held(q, d)->n, n);
    }
    q.uncommitted.push_back(op);
}

// The race checker's window for the reads of the operations issued until the next wait opens here, a
// little before their issue (one window a batch, not one an operation: ThreadSanitizer has room for
// about 8000 contexts); a write of an operand between the fence and the wait is a bug all the same.
inline void fence() {
    require_full_warpgroup("wgmma.fence");
    emu_mma::exchange("wgmma.fence", [](emu_mma::LaneSlot&) {});
    int window = emu::race_check_copy_issue("wgmma.mma_async");
    emu_mma::Bookkeeping hidden;
    queue().fenced = true;
    queue().window = window;
}

inline void commit() {
    require_full_warpgroup("wgmma.commit_group");
    emu_mma::exchange("wgmma.commit_group", [](emu_mma::LaneSlot&) {});
    emu_mma::Bookkeeping hidden;
    Queue& q = queue();
    q.groups.push_back(std::move(q.uncommitted));
    q.uncommitted.clear();
}

// every group but the newest `pending` completes: computed now, in issue order; accumulators with no
// pending operation left go back to their registers
inline void wait(int pending) {
    require_full_warpgroup("wgmma.wait_group");
    emu_mma::exchange("wgmma.wait_group", [](emu_mma::LaneSlot&) {});
    emu_mma::Bookkeeping hidden;
    Queue& q = queue();
    while ((int)q.groups.size() > pending) {
        for (const Operation& op : q.groups.front()) compute(q, op);  // its reads seen in its window (load_bf16)
        q.groups.pop_front();
    }
    for (size_t i = 0; i < q.held.size();) {
        bool busy = false;
        for (const Operation& op : q.uncommitted) busy |= op.d == q.held[i].d;
        for (const auto& group : q.groups)
            for (const Operation& op : group) busy |= op.d == q.held[i].d;
        if (busy) {
            i++;
            continue;
        }
        memcpy(q.held[i].d, q.held[i].values.data(), q.held[i].values.size() * sizeof(float));
        q.held.erase(q.held.begin() + (long)i);
    }
    q.fenced = false;
}

}  // namespace emu_wgmma

// llmc/wgmma.cuh's wrappers (the names its kernels call), with the emulated bodies above.
inline void wgmma_fence() { emu_wgmma::fence(); }
inline void wgmma_commit() { emu_wgmma::commit(); }
template <int pending>
inline void wgmma_wait() {
    emu_wgmma::wait(pending);
}
inline void fence_proxy_async() { emu_mma::proxy_fence(); }
template <int TRANS_A, int TRANS_B>
inline void wgmma_m64n64k16_ss(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma::mma_async("wgmma.mma_async.m64n64k16", d, 64, nullptr, desc_a, desc_b, TRANS_A, TRANS_B, accumulate);
}
template <int TRANS_B>
inline void wgmma_m64n64k16_rs(float* d, const uint32_t* a, uint64_t desc_b, int accumulate) {
    emu_wgmma::mma_async("wgmma.mma_async.m64n64k16", d, 64, a, 0, desc_b, 0, TRANS_B, accumulate);
}
template <int TRANS_A, int TRANS_B>
inline void wgmma_m64n128k16_ss(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma::mma_async("wgmma.mma_async.m64n128k16", d, 128, nullptr, desc_a, desc_b, TRANS_A, TRANS_B, accumulate);
}
template <int TRANS_B>
inline void wgmma_m64n128k16_rs(float* d, const uint32_t* a, uint64_t desc_b, int accumulate) {
    emu_wgmma::mma_async("wgmma.mma_async.m64n128k16", d, 128, a, 0, desc_b, 0, TRANS_B, accumulate);
}
