// Causal self-attention without the (T, T) matrix (flash attention), on the bf16 tensor cores through
// mma.sync (mma.cuh). The trainer's default; attention.cuh picks between this and the cuBLAS path.
//
// Forward: a block of 4 warps owns 64 queries of one head, each warp 16 of them, and walks the key
// tiles (64 keys each) up to the diagonal. Per tile: S = q·kᵀ by mma (fp32), scaled into log2 units
// and masked above the diagonal; the online softmax raises the running row max m and rescales the
// running sum l and output O by 2^(m_old - m_new); P = 2^(S - m) stays in registers and O += P·v by
// mma, P's accumulator fragments reused as the A operand. The block stores O / l and, per row, the
// log-sum-exp lse = ln(sum_j exp(s_j)) of its scaled scores s (fp32, (B, NH, T)): all the backward
// needs to rebuild any tile of probabilities, P = exp(s - lse). Nothing of size T x T is ever stored.
//
// Backward, with D = rowsum(dout * out) (a small first kernel) and dS = P * (dout·vᵀ - D):
//   kernel 1, a block per 64 keys, walks the query tiles from the diagonal down in the transposed frame
//     (rows = keys): Pᵀ, dv += Pᵀ·dout, dSᵀ, dk += dSᵀ·q; dk and dv stay in registers to the end.
//   kernel 2, a block per 64 queries, walks the key tiles up to the diagonal: P, dS, dq += dS·k.
// Every output element is owned by one warp and summed in a fixed order: no atomics, so two runs give
// the same bits. The price is recomputing two of the products for dq (7 products instead of 5).
//
// The kernels take an AttentionProblem (below): one process's whole causal sequence, or for context
// parallelism's ring (llmc/parallel/context_parallel.cuh) a chunk of queries against a chunk of keys and
// values in buffers of their own, causal when both hold the same positions and fully visible when every
// key comes earlier. A fully visible problem walks every key tile and masks only the padded keys of
// the last; its lse is over the chunk's keys (the ring merges chunks by it), and its backward, given
// the whole softmax's lse and D, adds into dq, dk and dv (accumulate).
//
// Versions of the three kernels, a template argument (dev/cuda/attention_forward.cu and
// attention_backward.cu time them; the trainer runs v4; v5, below, differs from v4 only in the
// forward's register bound):
//   v3, as first written: the forward scales every score into log2 units before the max; the backward
//     masks every tile (an index computation and a compare per score); exp2f.
//   v4: fewer instructions per score, the tensor cores' share of the issue slots larger. The forward
//     keeps the scores raw and folds the scale into the exponent's one FFMA, 2^(s·c - m·c); the
//     backward masks only the tiles that need it (the diagonal one, and the last query tile when T is
//     not a multiple of 64) and keeps the log-sum-exps in log2 units from the start; every exponential is ex2.approx (mma.cuh), one MUFU instruction instead of exp2f's
//     range scaling around it (the error, of the order of 2^-22 relative, is far under bf16's 2^-8).
//
// Shapes: any T (the last tile is padded with zero rows; queries past T are masked and never stored)
// and any head size hs that is a multiple of 8 up to 128. The kernels are compiled for D = hs rounded
// up to 16 (mma's k step), the extra columns zero in shared memory: zeros add nothing to q·kᵀ, and the
// output columns past hs are not stored. The row stride in shared memory is D + 8 bf16 so the 8 rows
// an ldmatrix reads fall in distinct banks.
//
// bf16 only: the fp32 (-DENABLE_FP32) and fp16 (-DENABLE_FP16) builds have no tensor-core path here
// (the kernels use bf16 mma.sync) and run the cuBLAS path.
#pragma once

#include "cuda_common.cuh"

// One attention problem, as the kernels take it: B·NH heads, each Tq queries against Tk keys. An
// operand is rows of a (B, rows, NH·hs) tensor: head h of row t of sequence b starts at
// base + b·batch + t·row + h·hs. One process's whole sequence is q, k and v inside qkv (Tq = Tk = T,
// causal); context parallelism's ring (llmc/parallel/context_parallel.cuh) gives a chunk of this
// process's queries and a key/value chunk that arrived from another process, in buffers of their own,
// causal when both hold the same positions and fully visible when the keys all come earlier. The
// statistics of (b, h) are at lse + (b·NH + h)·stat_row (and delta likewise): the log-sum-exp of each
// query's scaled scores over the problem's keys, and the backward's rowsum(dout * out).
struct HeadRows {
    floatX* base = nullptr;
    long batch = 0;
    int row = 0;
    __host__ __device__ floatX* head(int b, int h, int hs) const { return base + b * batch + h * hs; }
};

struct AttentionProblem {
    HeadRows q, k, v;
    HeadRows out;         // the forward writes it (normalized over the problem's keys)
    HeadRows dout;        // the backward's: dout, and dq, dk, dv laid out as q, k, v
    HeadRows dq, dk, dv;
    float* lse = nullptr;  // the forward writes it; the backward reads it (with delta) for the whole softmax
    const float* delta = nullptr;
    int stat_row = 0;
    int B = 0, NH = 0, hs = 0, Tq = 0, Tk = 0;
    bool causal = true;       // key j is visible to query i iff j <= i; otherwise every key is
    bool accumulate = false;  // the backward adds into dq, dk, dv (the ring's chunks) instead of setting them
};

// One process's whole causal sequence: q, k, v inside qkv (B, T, 3·NH·hs), out (B, T, NH·hs), lse (B, NH, T).
inline AttentionProblem attention_sequence(const floatX* qkv, floatX* out, float* lse, int B, int T, int NH, int hs) {
    AttentionProblem p;
    long C = (long)NH * hs;
    floatX* base = const_cast<floatX*>(qkv);
    p.q = HeadRows{base, T * 3 * C, (int)(3 * C)};
    p.k = HeadRows{base + C, T * 3 * C, (int)(3 * C)};
    p.v = HeadRows{base + 2 * C, T * 3 * C, (int)(3 * C)};
    p.out = HeadRows{out, T * C, (int)C};
    p.lse = lse;
    p.stat_row = T;
    p.B = B, p.NH = NH, p.hs = hs, p.Tq = p.Tk = T;
    return p;
}

// The backward's problem for one process's whole sequence: q, k, v inside qkv, their gradients into
// dqkv (same layout), dout as out, the forward's lse and delta = rowsum(dout * out) (attention_delta_kernel).
inline AttentionProblem attention_sequence_backward(floatX* dqkv, const float* delta, const floatX* dout,
                                                    const floatX* qkv, const float* lse, int B, int T, int NH, int hs) {
    AttentionProblem p = attention_sequence(qkv, nullptr, const_cast<float*>(lse), B, T, NH, hs);
    AttentionProblem g = attention_sequence(dqkv, const_cast<floatX*>(dout), nullptr, B, T, NH, hs);
    p.dout = g.out;
    p.dq = g.q, p.dk = g.k, p.dv = g.v;
    p.delta = delta;
    return p;
}

// D[b, h, t] = rowsum(dout * out) (the backward of a softmax over keys in chunks needs it whole), the sum over the head's values of dout * out: one thread per row (b, h, t)
__global__ void attention_delta_kernel(float* delta, const floatX* dout, const floatX* out, int B, int T, int NH,
                                             int hs) {
    int row_index = blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t)
    if (row_index >= B * NH * T) return;
    int t = row_index % T, h = (row_index / T) % NH, b = row_index / (NH * T);
    size_t offset = ((size_t)b * T + t) * NH * hs + h * hs;
    float sum = 0.0f;
    for (int d = 0; d < hs; d += x128::size) {
        x128 dy = load128(dout + offset + d);
        x128 o = load128(out + offset + d);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)dy[k] * (float)o[k];
    }
    delta[row_index] = sum;
}

#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
#define LLMC_FLASH_ATTENTION 1

#include <cmath>

#include "mma.cuh"

constexpr int FLASH_TILE = 64;     // queries per block and keys per tile (a block's 4 warps x 16 rows)
constexpr int FLASH_THREADS = 128;
constexpr int FLASH_MAX_HEAD_SIZE = 128;
constexpr float FLASH_LOG2E = 1.4426950408889634f;

enum class FlashVersion { v3, v4, v5 };

// Occupancy, by design: a block is 4 warps (64 rows, 16 per warp: the mma tile's height), and what a
// warp holds in registers, with each block's shared memory, sets how many blocks share an SM (64K
// registers; 164 KB of shared memory on sm_80, 228 KB on sm_90, 1 KB of it reserved per block). At
// head size 64 (every GPT-2 size):
//   forward: q's fragments, a 16 x 64 score tile and a 16 x 64 output accumulator, 128 registers on
//     sm_80 and 131 on sm_90 (ptxas), and 46 KB of tiles (q, two stages of k and v): 3 blocks (12
//     warps) on either, bound by shared memory on sm_80 and by the 3 registers past 128 on sm_90.
//   backward dk/dv: two accumulators (dk, dv) and k's and v's fragments, 241-243 registers, and 56 KB:
//     2 blocks (8 warps). We take 8 warps rather than spill: each warp has two independent products
//     per tile in flight, which the scheduler interleaves.
//   backward dq: 165-167 registers and 55 KB: 2 blocks on sm_80 (shared memory), 3 on sm_90.
// Tiles of 64 keys make each K/V tile loaded into shared memory feed 4 warps' products.
// v5 is v4 with the forward held to 128 registers at head size 64 (__launch_bounds__ with 4 blocks
// per SM: no spill on either architecture), so sm_90 gets its fourth block; the backward is v4's.
// Whether 16 warps beat 12 there (more latency hidden behind the exponentials, against whatever ptxas
// gives up for 3 registers) is for a GPU to say: dev/cuda/attention_forward.cu times v4 and v5, and the
// trainer stays on v4 until it has.
template <int D, FlashVersion V>
constexpr int flash_forward_min_blocks() {
    return V == FlashVersion::v5 && D == 64 ? 4 : 1;
}

template <FlashVersion V>
__device__ inline float flash_exp2(float x) {
    if constexpr (V != FlashVersion::v3) {
        return exp2_approx(x);
    } else {
        return exp2f(x);
    }
}

// Scores a query does not see to -inf (so 2^score is 0) in a warp's 16 x 64 tile of accumulator
// fragments: the lane's rows are row0 and row0 + 8, its columns col0 + nt*8 + (lane%4)*2 + {0, 1}.
// Causal: keys after their query; and keys at or past Tk (a padded column, or row in the backward's
// transposed frame, keys_are_rows, where a query at or past Tq is masked too).
__device__ inline void flash_mask(float (*s)[4], int row0, int col0, bool keys_are_rows, bool causal, int Tq, int Tk,
                                  int lane) {
#pragma unroll
    for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = row0 + 8 * (e / 2), col = col0 + nt * 8 + (lane % 4) * 2 + e % 2;
            bool masked = keys_are_rows ? ((causal && row > col) || col >= Tq) : ((causal && col > row) || col >= Tk);
            if (masked) s[nt][e] = -INFINITY;
        }
    }
}

// ----------------------------------------------------------------------------
// kernels

template <int D>
struct FlashTile {
    floatX rows[FLASH_TILE][D + 8];
};

// Rows row0 .. row0+63 of a (T, row_stride) head view into a tile; rows past T and columns past hs
// become zeros. One 16-byte cp.async per 8 values (hs and the row starts are multiples of 8 values).
// v3: a loop over the tile's chunks whose trip count the compiler cannot see, and a 64-bit product
// per chunk. v4: each thread's D/16 chunks unrolled (their rows and columns depend only on threadIdx.x
// and are hoisted out of the tile loop), one 64-bit product per tile and 32-bit offsets from it.
template <int D, FlashVersion V>
__device__ inline void flash_load_tile(FlashTile<D>& tile, const floatX* src, size_t row_stride, int row0, int T,
                                       int hs) {
    constexpr int chunks_per_row = D / 8;
    if constexpr (V != FlashVersion::v3) {
        static_assert(FLASH_TILE * chunks_per_row % FLASH_THREADS == 0, "every thread loads as many chunks");
        const floatX* base = src + (size_t)row0 * row_stride;
        int rows_left = T - row0;
#pragma unroll
        for (int i = 0; i < FLASH_TILE * chunks_per_row / FLASH_THREADS; i++) {
            int chunk = threadIdx.x + i * FLASH_THREADS;
            int r = chunk / chunks_per_row, col = (chunk % chunks_per_row) * 8;
            if (r < rows_left && col < hs) {
                cp_async16(&tile.rows[r][col], base + (r * (int)row_stride + col));
            } else {
                *reinterpret_cast<int4*>(&tile.rows[r][col]) = make_int4(0, 0, 0, 0);
            }
        }
    } else {
        for (int chunk = threadIdx.x; chunk < FLASH_TILE * chunks_per_row; chunk += FLASH_THREADS) {
            int r = chunk / chunks_per_row, col = (chunk % chunks_per_row) * 8;
            if (row0 + r < T && col < hs) {
                cp_async16(&tile.rows[r][col], src + (size_t)(row0 + r) * row_stride + col);
            } else {
                *reinterpret_cast<int4*>(&tile.rows[r][col]) = make_int4(0, 0, 0, 0);
            }
        }
    }
}

// a warp's 16 rows of a tile, columns kc*16 .. kc*16+15, as one mma A fragment
template <int D>
__device__ inline void flash_load_a_step(uint32_t* a, const FlashTile<D>& tile, int row0, int kc, int lane) {
    ldmatrix_x4(a, &tile.rows[row0 + lane % 16][kc * 16 + (lane / 16) * 8]);
}

// a warp's 16 rows of a tile as mma A fragments, D/16 chunks along k
template <int D>
__device__ inline void flash_load_a(uint32_t (*a)[4], const FlashTile<D>& tile, int row0, int lane) {
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) flash_load_a_step(a[kc], tile, row0, kc, lane);
}

// c (8 tiles of 16x8) += A's columns kc*16 .. kc*16+15 (one mma A fragment) · those of Bᵀ, with B a
// tile of 64 rows (the product's columns) of D values: one k step of the pattern of q·kᵀ
template <int D>
__device__ inline void flash_mma_abt_step(float (*c)[4], const uint32_t* a, const FlashTile<D>& b, int kc, int lane) {
#pragma unroll
    for (int pair = 0; pair < FLASH_TILE / 16; pair++) {
        uint32_t r[4];
        ldmatrix_x4(r, &b.rows[pair * 16 + lane % 8 + (lane / 16) * 8][kc * 16 + ((lane / 8) % 2) * 8]);
        uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        mma_bf16_16816(c[2 * pair], a, b0);
        mma_bf16_16816(c[2 * pair + 1], a, b1);
    }
}

// c (8 tiles of 16x8) = A (16 x D, fragments held in registers) · Bᵀ: the pattern of q·kᵀ
template <int D>
__device__ inline void flash_mma_abt(float (*c)[4], const uint32_t (*a)[4], const FlashTile<D>& b, int lane) {
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) flash_mma_abt_step(c, a[kc], b, kc, lane);
}

// The same product with A read from a tile's rows a_row0 .. a_row0+15 one k step at a time: 4
// registers for A instead of D/4, for a kernel that cannot hold A's fragments across its loop
// (the same mma's in the same order, so the same bits)
template <int D>
__device__ inline void flash_mma_abt_shared_a(float (*c)[4], const FlashTile<D>& a, int a_row0, const FlashTile<D>& b,
                                              int lane) {
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        uint32_t a_kc[4];
        flash_load_a_step(a_kc, a, a_row0, kc, lane);
        flash_mma_abt_step(c, a_kc, b, kc, lane);
    }
}

// acc (D/8 tiles of 16x8) += P (16 x 64, accumulator fragments, rounded to bf16) · B, with B a tile of
// 64 rows (along k) of D values (the product's columns): the pattern of P·v
template <int D>
__device__ inline void flash_mma_pb(float (*acc)[4], const float (*p)[4], const FlashTile<D>& b, int lane) {
#pragma unroll
    for (int kc = 0; kc < FLASH_TILE / 16; kc++) {
        uint32_t a[4] = {pack_bf16x2(p[2 * kc][0], p[2 * kc][1]), pack_bf16x2(p[2 * kc][2], p[2 * kc][3]),
                         pack_bf16x2(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                         pack_bf16x2(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
        for (int pair = 0; pair < D / 16; pair++) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, &b.rows[kc * 16 + lane % 8 + ((lane / 8) % 2) * 8][pair * 16 + (lane / 16) * 8]);
            uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma_bf16_16816(acc[2 * pair], a, b0);
            mma_bf16_16816(acc[2 * pair + 1], a, b1);
        }
    }
}

// Stores a warp's 16 x D accumulator rows (two per lane: row0 and row0 + 8), times the per-row factor,
// into rows of a (T, row_stride) view, or adds them there (accumulate); rows past T and columns past hs
// are skipped.
template <int D>
__device__ inline void flash_store_rows(floatX* dst, size_t row_stride, const float (*acc)[4], int row0,
                                        const float* factor, int T, int hs, int lane, bool accumulate = false) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + 8 * r;
        if (row >= T) continue;
        floatX* out = dst + (size_t)row * row_stride;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            int col = nt * 8 + (lane % 4) * 2;
            if (col >= hs) break;
            __nv_bfloat162* to = reinterpret_cast<__nv_bfloat162*>(out + col);
            float x = acc[nt][2 * r] * factor[r], y = acc[nt][2 * r + 1] * factor[r];
            if (accumulate) {
                float2 before = __bfloat1622float2(*to);
                x += before.x, y += before.y;
            }
            *to = __floats2bfloat162_rn(x, y);
        }
    }
}

template <int D>
struct FlashForwardShared {
    FlashTile<D> q, k[2], v[2];
};

template <int D, FlashVersion V>
__global__ void __launch_bounds__(FLASH_THREADS, flash_forward_min_blocks<D, V>()) attention_flash_forward_kernel(
    const AttentionProblem p) {
    extern __shared__ __align__(16) unsigned char flash_shared[];
    FlashForwardShared<D>& sh = *reinterpret_cast<FlashForwardShared<D>*>(flash_shared);
    const int hs = p.hs, Tq = p.Tq, Tk = p.Tk;
    int q_tile = gridDim.x - 1 - blockIdx.x;  // the longest rows first, so the short blocks fill in at the end
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX *q_head = p.q.head(b, h, hs), *k_head = p.k.head(b, h, hs), *v_head = p.v.head(b, h, hs);
    // causal: the key tiles up to the diagonal; otherwise all of them
    int last_tile = p.causal ? q_tile : (Tk - 1) / FLASH_TILE;

    flash_load_tile<D, V>(sh.q, q_head, p.q.row, q_tile * FLASH_TILE, Tq, hs);
    flash_load_tile<D, V>(sh.k[0], k_head, p.k.row, 0, Tk, hs);
    flash_load_tile<D, V>(sh.v[0], v_head, p.v.row, 0, Tk, hs);
    cp_async_commit();

    const float scale_log2 = (1.0f / sqrtf((float)hs)) * FLASH_LOG2E;  // as the backward computes it
    // log2 units per unit of the running scores: v3 scales each score first, v4 folds it into the FFMA
    const float step = V != FlashVersion::v3 ? scale_log2 : 1.0f;
    int query0 = q_tile * FLASH_TILE + warp * 16 + lane / 4;  // the lane's rows: query0 and query0 + 8
    uint32_t q_frag[D / 16][4];
    float o[D / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};  // this lane's share; the 4 lanes of a row are added at the end

    for (int j = 0; j <= last_tile; j++) {
        int stage = j % 2;
        if (j + 1 <= last_tile) {
            flash_load_tile<D, V>(sh.k[1 - stage], k_head, p.k.row, (j + 1) * FLASH_TILE, Tk, hs);
            flash_load_tile<D, V>(sh.v[1 - stage], v_head, p.v.row, (j + 1) * FLASH_TILE, Tk, hs);
        }
        cp_async_commit();
        cp_async_wait<1>();  // all but the group just committed: tile j (and q) have landed
        __syncthreads();
        if (j == 0) flash_load_a(q_frag, sh.q, warp * 16, lane);

        float s[FLASH_TILE / 8][4] = {};
        flash_mma_abt(s, q_frag, sh.k[stage], lane);
        if constexpr (V == FlashVersion::v3) {
#pragma unroll
            for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] *= scale_log2;
            }
        }
        // on the diagonal tile mask keys after the query (that covers the zero rows past T too); with every
        // key visible, the zero rows past Tk of the last tile
        if (p.causal ? j == q_tile : (j + 1) * FLASH_TILE > Tk) {
            flash_mask(s, query0, j * FLASH_TILE, false, p.causal, Tq, Tk, lane);
        }
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nt][e]);
        }
        float alpha[2], max_log2[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            // the 4 lanes holding a row are 4g .. 4g+3
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 2));
            float new_max = fmaxf(row_max[r], tile_max[r]);          // finite: key 0 is in every row's first tile
            alpha[r] = flash_exp2<V>((row_max[r] - new_max) * step);  // 0 on the first tile
            row_max[r] = new_max;
            row_sum[r] *= alpha[r];
            max_log2[r] = new_max * step;
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = flash_exp2<V>(fmaf(s[nt][e], step, -max_log2[e / 2]));  // v3: s - max exactly
                s[nt][e] = p;
                row_sum[e / 2] += p;
            }
        }
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] *= alpha[e / 2];
        }
        flash_mma_pb(o, s, sh.v[stage], lane);
        __syncthreads();  // every warp is done with this stage before it is refilled
    }

    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
        inv_sum[r] = 1.0f / row_sum[r];
        int query = query0 + 8 * r;
        // lse in natural-log units: (max + log2(sum)) / log2(e)
        if (lane % 4 == 0 && query < Tq) {
            p.lse[(size_t)blockIdx.y * p.stat_row + query] = (row_max[r] * step + log2f(row_sum[r])) / FLASH_LOG2E;
        }
    }
    flash_store_rows<D>(p.out.head(b, h, hs), p.out.row, o, query0, inv_sum, Tq, hs, lane);
}

template <int D>
struct FlashKVShared {
    FlashTile<D> k, v, q[2], dout[2];
    float lse[2][FLASH_TILE];
    float delta[2][FLASH_TILE];
};

// kernel 1: dk and dv for 64 keys of one head
template <int D, FlashVersion V>
__global__ void __launch_bounds__(FLASH_THREADS) attention_flash_backward_dkv_kernel(
    const AttentionProblem p) {
    extern __shared__ __align__(16) unsigned char flash_shared[];
    FlashKVShared<D>& sh = *reinterpret_cast<FlashKVShared<D>*>(flash_shared);
    const int hs = p.hs, Tq = p.Tq, Tk = p.Tk;
    int k_tile = blockIdx.x;  // tile 0 has the most query tiles after it, and starts first
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int num_q_tiles = (Tq + FLASH_TILE - 1) / FLASH_TILE;
    int first_q_tile = p.causal ? k_tile : 0;  // causal: the queries from the diagonal on

    // lse and D with plain loads: a head's rows start at any float offset, too unaligned for cp.async.
    // v4 keeps lse in log2 units. The operands' addresses are formed from p at each tile rather than
    // held: at head sizes over 96 the registers they would take are the last ones free.
    const float lse_unit = V != FlashVersion::v3 ? FLASH_LOG2E : 1.0f;
    auto load_query_tile = [&](int stage, int q_tile) {
        flash_load_tile<D, V>(sh.q[stage], p.q.head(b, h, hs), p.q.row, q_tile * FLASH_TILE, Tq, hs);
        flash_load_tile<D, V>(sh.dout[stage], p.dout.head(b, h, hs), p.dout.row, q_tile * FLASH_TILE, Tq, hs);
        int i = threadIdx.x % FLASH_TILE, query = q_tile * FLASH_TILE + i;
        size_t stat = (size_t)blockIdx.y * p.stat_row + query;  // row query of (b, h)
        if (threadIdx.x < FLASH_TILE) {
            sh.lse[stage][i] = query < Tq ? p.lse[stat] * lse_unit : 0.0f;
        } else {
            sh.delta[stage][i] = query < Tq ? p.delta[stat] : 0.0f;
        }
    };
    flash_load_tile<D, V>(sh.k, p.k.head(b, h, hs), p.k.row, k_tile * FLASH_TILE, Tk, hs);
    flash_load_tile<D, V>(sh.v, p.v.head(b, h, hs), p.v.row, k_tile * FLASH_TILE, Tk, hs);
    load_query_tile(0, first_q_tile);
    cp_async_commit();

    const float scale = 1.0f / sqrtf((float)hs);
    const float scale_log2 = scale * FLASH_LOG2E;
    int key0 = k_tile * FLASH_TILE + warp * 16 + lane / 4;  // the lane's keys: key0 and key0 + 8
    // The warp's 16 rows of k and v as mma A fragments, loaded once and held (D/4 registers each) up to
    // hs 96. Above it the accumulators dk and dv alone take D registers, and with k and v held too a
    // thread needs more than its 255 (ptxas spilled at D 112 and 128): v4 reads them from shared
    // memory again at each query tile instead (D/16 ldmatrix more per product, against the D/16 x 4 the
    // product loads for its B operand).
    constexpr bool hold_kv = V == FlashVersion::v3 || D <= 96;
    uint32_t k_frag[hold_kv ? D / 16 : 1][4], v_frag[hold_kv ? D / 16 : 1][4];
    float dk[D / 8][4] = {}, dv[D / 8][4] = {};

    for (int q_tile = first_q_tile; q_tile < num_q_tiles; q_tile++) {
        int stage = (q_tile - first_q_tile) % 2;
        if (q_tile + 1 < num_q_tiles) load_query_tile(1 - stage, q_tile + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (hold_kv && q_tile == first_q_tile) {
            flash_load_a<D>(k_frag, sh.k, warp * 16, lane);
            flash_load_a<D>(v_frag, sh.v, warp * 16, lane);
        }
        // Pᵀ (16 keys x 64 queries) = exp(k·qᵀ scale - lse); 0 for a key after the query (causal), or a
        // query past Tq (v4: only the diagonal tile and a partial last tile have such pairs)
        float pt[FLASH_TILE / 8][4] = {};
        if constexpr (hold_kv) {
            flash_mma_abt(pt, k_frag, sh.q[stage], lane);
        } else {
            flash_mma_abt_shared_a(pt, sh.k, warp * 16, sh.q[stage], lane);
        }
        if (V == FlashVersion::v3 || (p.causal && q_tile == k_tile) || (q_tile + 1) * FLASH_TILE > Tq) {
            flash_mask(pt, key0, q_tile * FLASH_TILE, true, p.causal, Tq, Tk, lane);
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
            int query_in_tile = nt * 8 + (lane % 4) * 2;  // and + 1
            float2 row_lse = *reinterpret_cast<const float2*>(&sh.lse[stage][query_in_tile]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float lse_e = e % 2 ? row_lse.y : row_lse.x;
                if constexpr (V != FlashVersion::v3) {
                    pt[nt][e] = flash_exp2<V>(fmaf(pt[nt][e], scale_log2, -lse_e));
                } else {
                    pt[nt][e] = flash_exp2<V>(pt[nt][e] * scale_log2 - lse_e * FLASH_LOG2E);
                }
            }
        }
        flash_mma_pb(dv, pt, sh.dout[stage], lane);  // dv += Pᵀ·dout
        // dPᵀ = v·doutᵀ, then dSᵀ = Pᵀ * (dPᵀ - D) in its place
        float ds[FLASH_TILE / 8][4] = {};
        if constexpr (hold_kv) {
            flash_mma_abt(ds, v_frag, sh.dout[stage], lane);
        } else {
            flash_mma_abt_shared_a(ds, sh.v, warp * 16, sh.dout[stage], lane);
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
            float2 row_delta = *reinterpret_cast<const float2*>(&sh.delta[stage][nt * 8 + (lane % 4) * 2]);
#pragma unroll
            for (int e = 0; e < 4; e++) ds[nt][e] = pt[nt][e] * (ds[nt][e] - (e % 2 ? row_delta.y : row_delta.x));
        }
        flash_mma_pb(dk, ds, sh.q[stage], lane);  // dk += dSᵀ·q
        __syncthreads();  // every warp is done with this stage before it is refilled
    }

    const float dk_factor[2] = {scale, scale}, dv_factor[2] = {1.0f, 1.0f};
    flash_store_rows<D>(p.dk.head(b, h, hs), p.dk.row, dk, key0, dk_factor, Tk, hs, lane, p.accumulate);
    flash_store_rows<D>(p.dv.head(b, h, hs), p.dv.row, dv, key0, dv_factor, Tk, hs, lane, p.accumulate);
}

template <int D>
struct FlashQShared {
    FlashTile<D> q, dout, k[2], v[2];
};

// kernel 2: dq for 64 queries of one head
template <int D, FlashVersion V>
__global__ void __launch_bounds__(FLASH_THREADS) attention_flash_backward_dq_kernel(
    const AttentionProblem p) {
    extern __shared__ __align__(16) unsigned char flash_shared[];
    FlashQShared<D>& sh = *reinterpret_cast<FlashQShared<D>*>(flash_shared);
    const int hs = p.hs, Tq = p.Tq, Tk = p.Tk;
    int q_tile = gridDim.x - 1 - blockIdx.x;  // longest first
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX *k_head = p.k.head(b, h, hs), *v_head = p.v.head(b, h, hs);
    int last_tile = p.causal ? q_tile : (Tk - 1) / FLASH_TILE;  // causal: up to the diagonal

    flash_load_tile<D, V>(sh.q, p.q.head(b, h, hs), p.q.row, q_tile * FLASH_TILE, Tq, hs);
    flash_load_tile<D, V>(sh.dout, p.dout.head(b, h, hs), p.dout.row, q_tile * FLASH_TILE, Tq, hs);
    flash_load_tile<D, V>(sh.k[0], k_head, p.k.row, 0, Tk, hs);
    flash_load_tile<D, V>(sh.v[0], v_head, p.v.row, 0, Tk, hs);
    cp_async_commit();

    const float scale = 1.0f / sqrtf((float)hs);
    const float scale_log2 = scale * FLASH_LOG2E;
    int query0 = q_tile * FLASH_TILE + warp * 16 + lane / 4;  // the lane's rows: query0 and query0 + 8
    float row_lse_log2[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int query = query0 + 8 * r;
        row_lse_log2[r] = query < Tq ? p.lse[(size_t)blockIdx.y * p.stat_row + query] * FLASH_LOG2E : 0.0f;
        row_delta[r] = query < Tq ? p.delta[(size_t)blockIdx.y * p.stat_row + query] : 0.0f;
    }
    uint32_t q_frag[D / 16][4], dout_frag[D / 16][4];
    float dq[D / 8][4] = {};

    for (int k_tile = 0; k_tile <= last_tile; k_tile++) {
        int stage = k_tile % 2;
        if (k_tile + 1 <= last_tile) {
            flash_load_tile<D, V>(sh.k[1 - stage], k_head, p.k.row, (k_tile + 1) * FLASH_TILE, Tk, hs);
            flash_load_tile<D, V>(sh.v[1 - stage], v_head, p.v.row, (k_tile + 1) * FLASH_TILE, Tk, hs);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (k_tile == 0) {
            flash_load_a(q_frag, sh.q, warp * 16, lane);
            flash_load_a(dout_frag, sh.dout, warp * 16, lane);
        }
        // P = exp(q·kᵀ scale - lse), 0 for a key after the query (v4: only the diagonal tile has them) or,
        // with every key visible, past Tk
        float pt[FLASH_TILE / 8][4] = {};
        flash_mma_abt(pt, q_frag, sh.k[stage], lane);
        if (V == FlashVersion::v3 || (p.causal ? k_tile == q_tile : (k_tile + 1) * FLASH_TILE > Tk)) {
            flash_mask(pt, query0, k_tile * FLASH_TILE, false, p.causal, Tq, Tk, lane);
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) pt[nt][e] = flash_exp2<V>(fmaf(pt[nt][e], scale_log2, -row_lse_log2[e / 2]));
        }
        // dP = dout·vᵀ, then dS = P * (dP - D) in its place
        float ds[FLASH_TILE / 8][4] = {};
        flash_mma_abt(ds, dout_frag, sh.v[stage], lane);
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) ds[nt][e] = pt[nt][e] * (ds[nt][e] - row_delta[e / 2]);
        }
        flash_mma_pb(dq, ds, sh.k[stage], lane);  // dq += dS·k
        __syncthreads();
    }

    const float dq_factor[2] = {scale, scale};
    flash_store_rows<D>(p.dq.head(b, h, hs), p.dq.row, dq, query0, dq_factor, Tq, hs, lane, p.accumulate);
}

// ----------------------------------------------------------------------------
// launchers

// Each kernel instance may use more than the default 48 KiB of shared memory (D = 128: 103 KiB for
// the dk/dv kernel, more than the 99 KiB of an sm_86/sm_89 GPU); the opt-in is per kernel, once.
template <typename Kernel>
inline void flash_allow_shared(Kernel kernel, size_t bytes, int hs, bool* done) {
    if (*done) return;
    int device = 0, limit = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)limit) {
        fatal("flash attention at head size %d needs %zu bytes of shared memory per block, this GPU allows %d: "
              "use -fa 0", hs, bytes, limit);
    }
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = true;
}

template <int D, FlashVersion V>
inline void attention_flash_forward_launch(const AttentionProblem& p, cudaStream_t stream) {
    static bool configured = false;
    size_t shared = sizeof(FlashForwardShared<D>);
    flash_allow_shared(attention_flash_forward_kernel<D, V>, shared, p.hs, &configured);
    dim3 grid(ceil_div_int(p.Tq, FLASH_TILE), p.B * p.NH);
    attention_flash_forward_kernel<D, V><<<grid, FLASH_THREADS, shared, stream>>>(p);
    cudaCheckLaunch();
}

template <int D, FlashVersion V>
inline void attention_flash_backward_launch(const AttentionProblem& p, cudaStream_t stream) {
    static bool kv_configured = false, q_configured = false;
    size_t kv_shared = sizeof(FlashKVShared<D>), q_shared = sizeof(FlashQShared<D>);
    flash_allow_shared(attention_flash_backward_dkv_kernel<D, V>, kv_shared, p.hs, &kv_configured);
    flash_allow_shared(attention_flash_backward_dq_kernel<D, V>, q_shared, p.hs, &q_configured);
    dim3 kv_grid(ceil_div_int(p.Tk, FLASH_TILE), p.B * p.NH), q_grid(ceil_div_int(p.Tq, FLASH_TILE), p.B * p.NH);
    attention_flash_backward_dkv_kernel<D, V><<<kv_grid, FLASH_THREADS, kv_shared, stream>>>(p);
    cudaCheckLaunch();
    attention_flash_backward_dq_kernel<D, V><<<q_grid, FLASH_THREADS, q_shared, stream>>>(p);
    cudaCheckLaunch();
}

// The launchers for the head size rounded up to 16 (shapes checked by the caller: hs a multiple of 8,
// at most FLASH_MAX_HEAD_SIZE). V: the version (above); only dev/cuda asks for v3. The forward writes
// p.out and p.lse; the backward reads p.lse and p.delta and writes (or adds into) p.dq, p.dk, p.dv.
template <FlashVersion V = FlashVersion::v4>
inline void attention_flash_forward(const AttentionProblem& p, cudaStream_t stream) {
    switch ((p.hs + 15) / 16) {
        case 1: attention_flash_forward_launch<16, V>(p, stream); break;
        case 2: attention_flash_forward_launch<32, V>(p, stream); break;
        case 3: attention_flash_forward_launch<48, V>(p, stream); break;
        case 4: attention_flash_forward_launch<64, V>(p, stream); break;
        case 5: attention_flash_forward_launch<80, V>(p, stream); break;
        case 6: attention_flash_forward_launch<96, V>(p, stream); break;
        case 7: attention_flash_forward_launch<112, V>(p, stream); break;
        case 8: attention_flash_forward_launch<128, V>(p, stream); break;
        default: fatal("flash attention takes head sizes up to %d, got %d", FLASH_MAX_HEAD_SIZE, p.hs);
    }
}

template <FlashVersion V = FlashVersion::v4>
inline void attention_flash_backward(const AttentionProblem& p, cudaStream_t stream) {
    switch ((p.hs + 15) / 16) {
        case 1: attention_flash_backward_launch<16, V>(p, stream); break;
        case 2: attention_flash_backward_launch<32, V>(p, stream); break;
        case 3: attention_flash_backward_launch<48, V>(p, stream); break;
        case 4: attention_flash_backward_launch<64, V>(p, stream); break;
        case 5: attention_flash_backward_launch<80, V>(p, stream); break;
        case 6: attention_flash_backward_launch<96, V>(p, stream); break;
        case 7: attention_flash_backward_launch<112, V>(p, stream); break;
        case 8: attention_flash_backward_launch<128, V>(p, stream); break;
        default: fatal("flash attention takes head sizes up to %d, got %d", FLASH_MAX_HEAD_SIZE, p.hs);
    }
}

// One process's whole sequence: lse (B, NH, T) fp32; delta (B, NH, T) fp32 scratch.
template <FlashVersion V = FlashVersion::v4>
inline void attention_flash_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int hs,
                                    cudaStream_t stream) {
    attention_flash_forward<V>(attention_sequence(qkv, out, lse, B, T, NH, hs), stream);
}

// dqkv overwritten. out and lse: what attention_flash_forward wrote (either version).
template <FlashVersion V = FlashVersion::v4>
inline void attention_flash_backward(floatX* dqkv, float* delta, const floatX* dout, const floatX* qkv,
                                     const floatX* out, const float* lse, int B, int T, int NH, int hs,
                                     cudaStream_t stream) {
    attention_delta_kernel<<<ceil_div_int(B * NH * T, 256), 256, 0, stream>>>(delta, dout, out, B, T, NH, hs);
    cudaCheckLaunch();
    attention_flash_backward<V>(attention_sequence_backward(dqkv, delta, dout, qkv, lse, B, T, NH, hs), stream);
}

#endif  // LLMC_FLASH_ATTENTION
