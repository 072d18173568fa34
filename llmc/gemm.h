// The CPU's matrix product engine: C (M×N) += A (M×K) · B (K×N), A and B given as strided views, so
// one routine, gemm_accumulate(), serves every product of the model whatever its layout (matmul.h's
// three Linear products, attention's six). It follows the classic Goto/BLIS scheme:
//   1. cut K into slabs of KC and N into blocks of NC, so one packed B block (KC×NC) stays in cache;
//   2. copy ("pack") that block of B into panels NR columns wide, contiguous along k, and the rows of
//      A into panels MR rows tall, so the inner loop reads memory strictly in order whatever the
//      original strides were;
//   3. a micro-kernel keeps an MR×NR tile of C in registers and, for each k, adds the outer product
//      of an MR column of A and an NR row of B: MR·NR multiply-adds per MR+NR loads;
//   4. while one block of B is multiplied, ask for the next block's lines a few per micro-tile, so
//      that packing it finds them in cache instead of waiting on main memory (GemmPrefetcher).
// When A has few rows (B·T = 256: the forward and dinp products of a small batch), B's panels are
// packed a few at a time instead, each group just before its tiles and prefetched one group ahead
// (gemm_accumulate_panels): a whole block prefetched ahead would not fit in L2 beside the A in use.
// An `overwrite` product (C = A·B) stores its first k slab instead of adding it: a gradient's first
// contribution needs no cleared buffer.
//
// Reaching the FMA peak (doc/cpu_trainer.md, "How the GEMM reaches peak"): an AVX2 core with two FMA
// units retires two 8-wide fused multiply-adds per cycle, each with a latency of 4-5 cycles, so it
// needs at least ~10 independent accumulators in flight and at most ~1 load per FMA. The 6×16 tile
// is 12 accumulator registers (6 rows × 2 vectors of 8), plus 2 for the row of B and 1 for a
// broadcast element of A: 15 of the 16 ymm registers; per k it does 12 FMAs for 2 vector loads and 6
// broadcasts. The fp32 micro-kernel is written with FMA intrinsics: under -std=c++17 the compiler
// does not fuse `acc += a * b` (it must round the product), which would halve the peak. Other scalar
// types (the tests' float64) use the plain loop.
//
// Threads: each takes a rectangle of C and does all of its work alone (its own packed panels), with
// no barrier inside the product, so a thread the OS pauses delays only its own part. The split is
// along whichever of M and N makes the operand every thread must pack in full the smaller one. Every
// element of C is summed in the same order (k slab by k slab, k ascending) whatever the split, so the
// result does not depend on the thread count. Causal attention's products skip their zero triangles
// (GemmTriangle).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GEMM_AVX2 1
#endif

// The blocking parameters, for a core with a 32 KiB L1d, a 512 KiB L2 and a large shared L3 (AMD Zen
// 3 here; Intel's client cores are alike):
constexpr int GEMM_MR = 6;     // rows of C per micro-tile: 6×2 accumulators + 3 = 15 of 16 ymm registers
constexpr int GEMM_NR = 16;    // columns of C per micro-tile: two 8-float vectors
constexpr int GEMM_KC = 256;   // depth of a slab: a B micro-panel (KC×NR fp32 = 16 KiB) fills half the L1
                               // and stays there while every A micro-panel of the block streams past it
constexpr int GEMM_MC = 144;   // rows of A packed at a time (multiple of MR): MC×KC fp32 = 144 KiB, a
                               // quarter of L2, so the A block stays in L2 while B panels come and go
constexpr int GEMM_NC = 3072;  // columns of B packed at a time (multiple of NR): KC×NC fp32 = 3 MiB,
                               // from L3, reused for every MC block of A

// A strided view of a matrix: element (i, j) is data[i * row_stride + j * col_stride].
template <typename Real>
struct MatrixView {
    const Real* data;
    size_t row_stride;
    size_t col_stride;
    const Real& at(size_t i, size_t j) const { return data[i * row_stride + j * col_stride]; }
};

// Causal attention multiplies triangular matrices; a triangle names the zeros a product may skip,
// micro-tile by micro-tile (indices are those of the views passed in):
//   lower_c  only C[i][j] with j <= i is wanted: tiles wholly above the diagonal are not computed
//            (left as they were); the rest of a tile the diagonal crosses is computed like any other
//   lower_a  A[i][k] = 0 for k > i: a tile of rows i0..i1-1 sums k < i1 only
//   upper_a  A[i][k] = 0 for k < i: a tile of rows i0..i1-1 sums k >= i0 only
// Dropping those terms gives the same bits: a tile's sums start from +0, a zero term adds ±0, and
// x + ±0 = x for every x that is not -0, which a sum starting from +0 never is (round to nearest).
// With `overwrite`, a tile whose k range is empty is still stored (as zeros); lower_c's skipped tiles
// are not written at all.
enum class GemmTriangle { none, lower_c, lower_a, upper_a };

// Adds an MR×NR tile held in `acc` to C (or stores it there, `overwrite`, plus the tile's columns of
// `bias` when there is one); at the matrix edge only its top-left mr×nr part.
template <typename Real>
static inline void gemm_store_tile(const Real (&acc)[GEMM_MR][GEMM_NR], Real* c, size_t ldc, int mr, int nr,
                                   bool overwrite, const Real* bias) {
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) {
            c[i * ldc + j] = !overwrite ? c[i * ldc + j] + acc[i][j] : bias ? acc[i][j] + bias[j] : acc[i][j];
        }
    }
}

// C[mr×nr] += A panel (kc×MR) · B panel (kc×NR), the plain loop (any scalar type).
template <typename Real>
static inline void gemm_micro_kernel(int kc, const Real* __restrict a, const Real* __restrict b, Real* c,
                                     size_t ldc, int mr, int nr, bool overwrite, const Real* bias) {
    Real acc[GEMM_MR][GEMM_NR] = {};
    for (int k = 0; k < kc; k++) {
        const Real* ak = a + k * GEMM_MR;
        const Real* bk = b + k * GEMM_NR;
        for (int i = 0; i < GEMM_MR; i++) {
            for (int j = 0; j < GEMM_NR; j++) acc[i][j] += ak[i] * bk[j];
        }
    }
    gemm_store_tile(acc, c, ldc, mr, nr, overwrite, bias);
}

#ifdef GEMM_AVX2
// The same for fp32 with AVX2 FMAs. The twelve accumulators are named variables, not an array: GCC
// keeps an array of vectors in memory and would store every one of them back at each k. Always
// inlined: called once per tile (~400 cycles of FMAs), a call costs a few percent, and GCC stops
// inlining it on its own once the loop around it grows.
__attribute__((always_inline)) static inline void gemm_micro_kernel_avx2(int kc, const float* __restrict a, const float* __restrict b, float* c,
                                          size_t ldc, int mr, int nr, bool overwrite, const float* bias) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;  // row i: ci0, ci1
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    // the C tile is read only after the k loop, and it is usually not in cache (C is MBs): ask for its
    // lines now so that the ~kc·12/2 cycles of FMAs hide the memory latency instead of waiting on it
    for (int i = 0; i < mr && !overwrite; i++) {
        _mm_prefetch((const char*)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char*)(c + i * ldc + GEMM_NR - 1), _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), ai;
        ai = _mm256_broadcast_ss(a + 0), c00 = _mm256_fmadd_ps(ai, b0, c00), c01 = _mm256_fmadd_ps(ai, b1, c01);
        ai = _mm256_broadcast_ss(a + 1), c10 = _mm256_fmadd_ps(ai, b0, c10), c11 = _mm256_fmadd_ps(ai, b1, c11);
        ai = _mm256_broadcast_ss(a + 2), c20 = _mm256_fmadd_ps(ai, b0, c20), c21 = _mm256_fmadd_ps(ai, b1, c21);
        ai = _mm256_broadcast_ss(a + 3), c30 = _mm256_fmadd_ps(ai, b0, c30), c31 = _mm256_fmadd_ps(ai, b1, c31);
        ai = _mm256_broadcast_ss(a + 4), c40 = _mm256_fmadd_ps(ai, b0, c40), c41 = _mm256_fmadd_ps(ai, b1, c41);
        ai = _mm256_broadcast_ss(a + 5), c50 = _mm256_fmadd_ps(ai, b0, c50), c51 = _mm256_fmadd_ps(ai, b1, c51);
        a += GEMM_MR;
        b += GEMM_NR;
    }
    const __m256 acc[GEMM_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (mr == GEMM_MR && nr == GEMM_NR && overwrite) {
        __m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps(), bias1 = bias ? _mm256_loadu_ps(bias + 8) : bias0;
        for (int i = 0; i < GEMM_MR; i++) {
            _mm256_storeu_ps(c + i * ldc, bias ? _mm256_add_ps(acc[i][0], bias0) : acc[i][0]);
            _mm256_storeu_ps(c + i * ldc + 8, bias ? _mm256_add_ps(acc[i][1], bias1) : acc[i][1]);
        }
    } else if (mr == GEMM_MR && nr == GEMM_NR) {
        for (int i = 0; i < GEMM_MR; i++) {
            float* ci = c + i * ldc;
            _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
            _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
        }
    } else {
        alignas(32) float tile[GEMM_MR][GEMM_NR];
        for (int i = 0; i < GEMM_MR; i++) {
            _mm256_store_ps(tile[i], acc[i][0]);
            _mm256_store_ps(tile[i] + 8, acc[i][1]);
        }
        gemm_store_tile(tile, c, ldc, mr, nr, overwrite, bias);
    }
}
#endif

#ifdef GEMM_AVX2
// Transposes the 8×8 block held in r[0..7] (r[i] = row i) in place: 24 shuffles for 64 floats.
static inline void gemm_transpose8x8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

// Packing a panel whose source runs along k (B = Wᵀ in the forward, A = a row-major activation) is
// a transpose; done 8×8 in registers it costs a load and a store per 8 floats instead of per float.
// One full B panel: dst[k][0..16) = src_j[k] for the 16 columns j, src_j = col0 + j * ld.
static inline void gemm_pack_b_panel_transposed_avx2(float* dst, const float* col0, size_t ld, int kc) {
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
        for (int half = 0; half < 2; half++) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(col0 + (size_t)(half * 8 + j) * ld + k);
            gemm_transpose8x8(r);
            for (int kk = 0; kk < 8; kk++) _mm256_store_ps(dst + (k + kk) * GEMM_NR + half * 8, r[kk]);
        }
    }
    for (; k < kc; k++) {
        for (int j = 0; j < GEMM_NR; j++) dst[k * GEMM_NR + j] = col0[(size_t)j * ld + k];
    }
}

// One full A panel: dst[k][0..6) = row_i[k] for the 6 rows i, row_i = row0 + i * ld. Each k's 6
// values are written with one 8-wide store whose last 2 lanes spill into the next k's slot (or past
// the panel: the packing buffer has slack) and are overwritten by the next store.
static inline void gemm_pack_a_panel_transposed_avx2(float* dst, const float* row0, size_t ld, int kc) {
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
        for (int i = 0; i < GEMM_MR; i++) r[i] = _mm256_loadu_ps(row0 + (size_t)i * ld + k);
        r[6] = r[7] = _mm256_setzero_ps();
        gemm_transpose8x8(r);
        for (int kk = 0; kk < 8; kk++) _mm256_storeu_ps(dst + (k + kk) * GEMM_MR, r[kk]);
    }
    for (; k < kc; k++) {
        for (int i = 0; i < GEMM_MR; i++) dst[k * GEMM_MR + i] = row0[(size_t)i * ld + k];
    }
}
#endif

// Packing where the source is already contiguous across the panels: for each k, `width` floats at
// src + k * k_stride, cut into panels of W (NR for B, MR for A), [panel][k][W], the last one
// zero-padded. 8 k at a time across all panels, so memory is read in 8 long sequential runs that the
// hardware prefetcher follows, and written 8·W floats at a time; panel by panel would read one cache
// line from each of kc rows far apart, and wait on every one.
template <int W, typename Real>
static void gemm_pack_runs(Real* dst, const Real* src, size_t k_stride, int width, int kc) {
    int full = width / W, rest = width - full * W;
    const size_t panel = (size_t)kc * W;
    for (int kb = 0; kb < kc; kb += 8) {
        int kn = std::min(8, kc - kb);
        for (int p = 0; p < full; p++) {
            Real* d = dst + p * panel + (size_t)kb * W;
            for (int k = 0; k < kn; k++) memcpy(d + k * W, src + (size_t)(kb + k) * k_stride + p * W, sizeof(Real) * W);
        }
        for (int k = kb; rest && k < kb + kn; k++) {
            const Real* s = src + (size_t)k * k_stride + full * W;
            for (int j = 0; j < W; j++) dst[full * panel + (size_t)k * W + j] = j < rest ? s[j] : Real(0);
        }
    }
}

// Packs B[k0:k0+kc, j0:j0+nc] as panels of W columns, [panel][k][W], zero-padding the last panel.
// W = NR packs B; W = MR packs A, as the columns of Aᵀ (gemm_pack_a).
template <int W, typename Real>
static void gemm_pack_panels(Real* dst, MatrixView<Real> B, int k0, int kc, int j0, int nc) {
    if (B.col_stride == 1) {  // rows of B are contiguous: W floats per k into each panel
        gemm_pack_runs<W>(dst, &B.at(k0, j0), B.row_stride, nc, kc);
        return;
    }
    for (int jp = 0; jp * W < nc; jp++, dst += (size_t)kc * W) {
        int j_first = j0 + jp * W, width = std::min(W, nc - jp * W);
        if (width < W) std::fill(dst, dst + (size_t)kc * W, Real(0));
        // columns of B are contiguous (B = Wᵀ, or A row-major): read each column along k
#ifdef GEMM_AVX2
        if constexpr (std::is_same<Real, float>::value) {
            if (width == W && B.row_stride == 1) {
                if constexpr (W == GEMM_NR) gemm_pack_b_panel_transposed_avx2(dst, &B.at(k0, j_first), B.col_stride, kc);
                if constexpr (W == GEMM_MR) gemm_pack_a_panel_transposed_avx2(dst, &B.at(k0, j_first), B.col_stride, kc);
                continue;
            }
        }
#endif
        for (int j = 0; j < width; j++) {
            const Real* src = &B.at(k0, j_first + j);
            for (int k = 0; k < kc; k++) dst[k * W + j] = src[(size_t)k * B.row_stride];
        }
    }
}

// Packs B[k0:k0+kc, j0:j0+nc] as panels of NR columns, [panel][k][NR], zero-padding the last panel.
template <typename Real>
static void gemm_pack_b(Real* dst, MatrixView<Real> B, int k0, int kc, int j0, int nc) {
    gemm_pack_panels<GEMM_NR>(dst, B, k0, kc, j0, nc);
}

// Packs A[i0:i0+mc, k0:k0+kc] as panels of MR rows, [panel][k][MR], zero-padding the last panel: the
// same as packing the columns i0.. of Aᵀ (whose rows are A's columns).
template <typename Real>
static void gemm_pack_a(Real* dst, MatrixView<Real> A, int i0, int mc, int k0, int kc) {
    gemm_pack_panels<GEMM_MR>(dst, MatrixView<Real>{A.data, A.col_stride, A.row_stride}, k0, kc, i0, mc);
}

// Packing reads B from main memory (the weights were last touched a whole forward or backward ago),
// and a core waiting on those reads does no arithmetic: packing from cache costs ~0.2 ns a float here,
// from memory ~0.55. So while one block of B is being multiplied, the next block's source lines are
// requested a few at a time (`issue`, once per micro-tile), and packing it finds them in cache. A
// block is a set of runs of contiguous floats: kc rows of nc floats (B row-major) or nc columns of kc
// floats (B = Wᵀ).
template <typename Real>
struct GemmPrefetcher {
    const char* base = nullptr;  // the first run
    size_t run_stride = 0;       // bytes from one run to the next
    size_t run_bytes = 0;
    int runs = 0, run = 0;
    size_t offset = 0;           // bytes of the current run's lines already requested
    size_t per_call = 0;         // lines per issue()

    // B[k0:k0+kc, j0:j0+nc], spread over `calls` issues
    void start(MatrixView<Real> B, int k0, int kc, int j0, int nc, size_t calls) {
        base = (const char*)&B.at(k0, j0);
        bool by_rows = B.col_stride == 1;
        run_stride = sizeof(Real) * (by_rows ? B.row_stride : B.col_stride);
        run_bytes = sizeof(Real) * (by_rows ? nc : kc);
        runs = by_rows ? kc : nc;
        run = 0;
        offset = 0;
        if (!by_rows && B.row_stride != 1) runs = 0;  // neither rows nor columns contiguous: nothing to follow
        size_t lines = (size_t)runs * (run_bytes / 64 + 2);  // cache lines the block spans, at most
        calls = std::max<size_t>(calls, 1);
        per_call = (lines + calls - 1) / calls;
    }
    // The next per_call lines: each run from the line holding its first byte to the line holding its
    // last. (Called once per micro-tile, so its loop is kept to a prefetch, an add and a compare.)
    void issue() {
        size_t n = per_call, off = offset;
        int r = run;
        while (n > 0 && r < runs) {
            const char* first = base + (size_t)r * run_stride;
            const char* line = (const char*)((uintptr_t)first & ~(uintptr_t)63);
            size_t span = (((uintptr_t)first + run_bytes - 1) & ~(uintptr_t)63) - (uintptr_t)line + 64;
            size_t stop = std::min(span, off + 64 * n);
            for (size_t o = off; o < stop; o += 64) __builtin_prefetch(line + o, 0, 2);
            n -= (stop - off) / 64;
            off = stop;
            if (off == span) r++, off = 0;
        }
        run = r;
        offset = off;
    }
};

// One product of a block: C[ic:ic+mc, jc:jc+nc] += packed A (mc × kc) · packed B (kc × nc), the k
// slab starting at pc, tile by tile. Each micro-tile also issues its share of `next`'s prefetches.
template <typename Real>
static void gemm_macro_kernel(Real* C, size_t ldc, const Real* packed_a, const Real* packed_b, int ic, int mc, int jc,
                              int nc, int pc, int kc, bool overwrite, GemmTriangle triangle, const Real* bias,
                              GemmPrefetcher<Real>& next) {
    // B micro-panel outer (it stays in L1), A micro-panels inner (they stream from L2)
    for (int jr = 0; jr < nc; jr += GEMM_NR) {
        const Real* b_panel = packed_b + (size_t)jr * kc;
        for (int ir = 0; ir < mc; ir += GEMM_MR) {
            Real* c = C + (size_t)(ic + ir) * ldc + jc + jr;
            int mr = std::min(GEMM_MR, mc - ir), nr = std::min(GEMM_NR, nc - jr);
            next.issue();
            // this tile's k range within the slab: all of it, unless a triangle says less
            int i0 = ic + ir, k_begin = pc, k_end = pc + kc;
            if (triangle == GemmTriangle::lower_c && jc + jr >= i0 + mr) continue;
            if (triangle == GemmTriangle::lower_a) k_end = std::min(k_end, i0 + mr);
            if (triangle == GemmTriangle::upper_a) k_begin = std::max(k_begin, i0);
            bool store = overwrite && pc == 0;
            if (k_begin >= k_end && !store) continue;
            int k_count = std::max(0, k_end - k_begin);
            const Real* a_panel = packed_a + (size_t)ir * kc + (size_t)(k_begin - pc) * GEMM_MR;
            const Real* b_tile = b_panel + (size_t)(k_begin - pc) * GEMM_NR;
            const Real* bias_tile = bias ? bias + jc + jr : nullptr;
#ifdef GEMM_AVX2
            if constexpr (std::is_same<Real, float>::value) {
                gemm_micro_kernel_avx2(k_count, a_panel, b_tile, c, ldc, mr, nr, store, bias_tile);
                continue;
            }
#endif
            gemm_micro_kernel(k_count, a_panel, b_tile, c, ldc, mr, nr, store, bias_tile);
        }
    }
}

// The packing buffers, per thread and kept between calls (allocating and faulting in MiBs at each of
// the ~100 products of a step would cost more than packing into them).
template <typename Real>
struct GemmBuffers {
    struct alignas(32) Vec8 { Real x[8]; };  // 32-byte aligned storage for the AVX2 loads
    std::vector<Vec8> a, b;
    // + one Vec8 of slack for gemm_pack_a_panel_transposed_avx2's spilling store
    Real* packed_a(size_t floats) { return grow(a, floats + 8); }
    Real* packed_b(size_t floats) { return grow(b, floats); }
    static Real* grow(std::vector<Vec8>& v, size_t floats) {
        if (v.size() * 8 < floats) v.resize((floats + 7) / 8);
        return v.data()->x;
    }
};

template <typename Real>
GemmBuffers<Real>& gemm_thread_buffers() {
    thread_local GemmBuffers<Real> buffers;
    return buffers;
}

// A thread's share when it has few rows of A (at most GEMM_MC_PANELS; at B·T = 256, every forward and
// dinp product): each k slab of A, all rows, is packed once and stays in L2, and B is packed a narrow
// group of panels at a time, just before the group's micro-tiles. While a group is multiplied, the
// next group's source is prefetched: tens of KiB, which fit in L2 beside the slab of A, where the next
// KC×NC block of gemm_accumulate_blocks does not (prefetched into L2, it would evict the A in use; not
// prefetched, packing it waits on main memory). Each C element still sums its k slabs in order, so
// the bits are those of gemm_accumulate_blocks.
constexpr int GEMM_MC_PANELS = 2 * GEMM_MC;  // 288 rows × KC fp32 = 288 KiB of packed A
template <typename Real>
void gemm_accumulate_panels(Real* C, size_t ldc, MatrixView<Real> A, MatrixView<Real> B, int i_begin, int i_end,
                            int j_begin, int j_end, int K, bool overwrite, GemmTriangle triangle, const Real* bias) {
    // Group width, measured (d12, B·T = 256, alternating steps): B = Wᵀ is packed from 16 rows of W, each
    // read along k, and one panel at a time does best; row-major B is read as kc short runs, one per
    // row of W (a TLB entry each), and 8 panels (512 bytes a run) do best.
    constexpr int widest_group = 8 * GEMM_NR;
    const int group = B.col_stride == 1 ? widest_group : GEMM_NR;
    GemmBuffers<Real>& buffers = gemm_thread_buffers<Real>();
    int mc = i_end - i_begin;
    Real* packed_a = buffers.packed_a((size_t)GEMM_MC_PANELS * GEMM_KC);  // (mc × KC) as [panel][k][MR]
    Real* packed_b = buffers.packed_b((size_t)GEMM_KC * widest_group);    // (KC × group) as [panel][k][NR]
    size_t tiles_per_group = (size_t)(mc + GEMM_MR - 1) / GEMM_MR * (group / GEMM_NR);
    for (int pc = 0; pc < K; pc += GEMM_KC) {
        int kc = std::min(GEMM_KC, K - pc), next_kc = std::min(GEMM_KC, K - pc - kc);
        gemm_pack_a(packed_a, A, i_begin, mc, pc, kc);
        for (int jr = j_begin; jr < j_end; jr += group) {
            int nr = std::min(group, j_end - jr);
            gemm_pack_b(packed_b, B, pc, kc, jr, nr);
            GemmPrefetcher<Real> next;  // the next group: this slab's next, or the next slab's first
            if (jr + nr < j_end) {
                next.start(B, pc, kc, jr + nr, std::min(group, j_end - jr - nr), tiles_per_group);
            } else if (next_kc > 0) {
                next.start(B, pc + kc, next_kc, j_begin, std::min(group, j_end - j_begin), tiles_per_group);
            }
            gemm_macro_kernel(C, ldc, packed_a, packed_b, i_begin, mc, jr, nr, pc, kc, overwrite, triangle, bias, next);
        }
    }
}

// A thread's share in general, the classic way: B packed a KC×NC block at a time (it stays in L3, its
// panels come to L1 one by one), A an MC×KC block at a time (it stays in L2), and over a block of B the
// next block of B's source is prefetched. (Prefetching the next block of A as well was measured: the
// dW products got ~4% slower, its lines evicting the packed A in use from L2.)
template <typename Real>
void gemm_accumulate_blocks(Real* C, size_t ldc, MatrixView<Real> A, MatrixView<Real> B, int i_begin, int i_end,
                            int j_begin, int j_end, int K, bool overwrite, GemmTriangle triangle, const Real* bias) {
    GemmBuffers<Real>& buffers = gemm_thread_buffers<Real>();
    Real* packed_a = buffers.packed_a((size_t)GEMM_MC * GEMM_KC);  // (MC × KC) as [panel][k][MR]
    Real* packed_b = buffers.packed_b((size_t)GEMM_KC * GEMM_NC);  // (KC × NC) as [panel][k][NR]
    for (int jc = j_begin; jc < j_end; jc += GEMM_NC) {
        int nc = std::min(GEMM_NC, j_end - jc);
        size_t panels = (nc + GEMM_NR - 1) / GEMM_NR;
        for (int pc = 0; pc < K; pc += GEMM_KC) {
            int kc = std::min(GEMM_KC, K - pc), next_kc = std::min(GEMM_KC, K - pc - kc);
            gemm_pack_b(packed_b, B, pc, kc, jc, nc);
            GemmPrefetcher<Real> next;  // the next block of B: the next k slab, or the next NC columns
            size_t tiles = (size_t)((i_end - i_begin + GEMM_MR - 1) / GEMM_MR) * panels;
            if (next_kc > 0) {
                next.start(B, pc + kc, next_kc, jc, nc, tiles);
            } else if (jc + nc < j_end) {
                next.start(B, 0, std::min(GEMM_KC, K), jc + nc, std::min(GEMM_NC, j_end - jc - nc), tiles);
            }
            for (int ic = i_begin; ic < i_end; ic += GEMM_MC) {
                int mc = std::min(GEMM_MC, i_end - ic);
                gemm_pack_a(packed_a, A, ic, mc, pc, kc);
                gemm_macro_kernel(C, ldc, packed_a, packed_b, ic, mc, jc, nc, pc, kc, overwrite, triangle, bias, next);
            }
        }
    }
}

// One thread's share: C[i_begin:i_end, j_begin:j_end] += A[i_begin:i_end, :] · B[:, j_begin:j_end].
template <typename Real>
void gemm_accumulate_block(Real* C, size_t ldc, MatrixView<Real> A, MatrixView<Real> B, int i_begin, int i_end,
                           int j_begin, int j_end, int K, bool overwrite, GemmTriangle triangle, const Real* bias) {
    if (i_end - i_begin <= GEMM_MC_PANELS) {
        gemm_accumulate_panels(C, ldc, A, B, i_begin, i_end, j_begin, j_end, K, overwrite, triangle, bias);
    } else {
        gemm_accumulate_blocks(C, ldc, A, B, i_begin, i_end, j_begin, j_end, K, overwrite, triangle, bias);
    }
}

// C (M×N, row-major, leading dimension ldc) += A (M×K) · B (K×N).
// With `overwrite`, C = A · B instead: the first k slab stores its sums where it would add them, so C
// need not be cleared first (the same bits as clearing it and adding: 0 + x = x, and a sum that starts
// from +0 is never -0). With `overwrite` and a `bias` (N), C = bias + A · B, each row starting from bias
// (the same bits as filling C's rows with bias and adding).
template <typename Real>
void gemm_accumulate(Real* C, size_t ldc, MatrixView<Real> A, MatrixView<Real> B, int M, int N, int K,
                     bool overwrite = false, GemmTriangle triangle = GemmTriangle::none, const Real* bias = nullptr) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < M && overwrite; i++) {
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = bias ? bias[j] : Real(0);
        }
        return;
    }
    // Splitting N, every thread packs all of A (M×K) and its share of B; splitting M, all of B (K×N).
    // Cut the dimension that leaves the smaller operand to be packed by every thread, in whole tiles.
    // (Sharing the packed B of a tall product, with rows handed out as threads come free, was tried:
    // the barrier each k slab then needs, with blocks of 144 rows to even out, lost more than the
    // packing saved.)
    bool split_n = N >= M;
    int tiles = split_n ? (N + GEMM_NR - 1) / GEMM_NR : (M + GEMM_MR - 1) / GEMM_MR;
    int tile = split_n ? GEMM_NR : GEMM_MR, extent = split_n ? N : M;
    // a product too small to pay for waking threads runs on the calling thread
    bool parallel = (double)M * N * K > 1e5 && tiles > 1;
#pragma omp parallel if (parallel)
    {
        int threads = omp_get_num_threads(), thread = omp_get_thread_num();
        int begin = std::min(extent, (int)((long)tiles * thread / threads) * tile);
        int end = std::min(extent, (int)((long)tiles * (thread + 1) / threads) * tile);
        if (begin < end) {
            if (split_n) {
                gemm_accumulate_block(C, ldc, A, B, 0, M, begin, end, K, overwrite, triangle, bias);
            } else {
                gemm_accumulate_block(C, ldc, A, B, begin, end, 0, N, K, overwrite, triangle, bias);
            }
        }
    }
}
