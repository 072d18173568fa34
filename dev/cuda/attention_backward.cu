// Causal self-attention backward, version by version, for (B, T, C, NH) = (8, 1024, 768, 12), head size 64:
//   datt = dout·vᵀ,  dv = attᵀ·dout,  dscore = att * (datt - rowsum(att * datt)) / sqrt(hs),
//   dq = dscore·k,  dk = dscoreᵀ·q,  all per head, into dqkv (B, T, 3C).
// Inputs: qkv and dout random; att (B, NH, T, T) from the CPU forward, stored in bf16 as the GPU forward
// saves it (v3 takes the forward's out and per-row log-sum-exp instead). Checked against
// attention_backward() of llmc/attention.h (which adds into dqkv: it starts from zero, so both compute
// the same overwrite) and timed.
//
// The two numbers: four products of T(T+1)/2 x hs per head (causal): 25.8 GFLOP, ~33 us at 790 TFLOP/s.
// Bytes: att read (201 MB) and, for versions that materialize it, datt written and read again (402 MB);
// qkv, dout, dqkv: 75 MB. Versions that keep the (T, T) matrices in memory are bound by those bytes;
// one that recomputes them per tile (v3) can be bound by the matrix units. The rate below counts the
// four causal products only (v3 does 7, recomputing two for its separate dq pass).
//
//   make -C dev/cuda bin/attention_backward && dev/cuda/bin/attention_backward
#include "harness.cuh"
#include "mma.cuh"

#include "../../llmc/attention.cuh"
#include "../../llmc/attention.h"

constexpr int HS = 64;  // head size: the kernels below keep a row of it in registers

// ----------------------------------------------------------------------------
// v1: the formulas, one thread per row, on the fp32 units, in three kernels so no two threads ever add
// into the same element:
//   1. per query row (b, h, t): datt[t2] = dout[t]·v[t2] into an fp32 scratch (B, NH, T, T), then the
//      row's sum of att * datt, then dscore in place of datt;
//   2. per query row: dq[t] = sum over t2 <= t of dscore[t, t2] k[t2];
//   3. per key row (b, h, t2): dk[t2] = sum over t >= t2 of dscore[t, t2] q[t], and
//      dv[t2] = sum over t >= t2 of att[t, t2] dout[t]; a warp's threads are consecutive t2, so the
//      column reads of dscore and att are coalesced.

__global__ void attention_backward_v1_dscore_kernel(float* dscore, const floatX* att, const floatX* dout,
                                                    const floatX* qkv, int B, int T, int NH) {
    int row_index = blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t)
    if (row_index >= B * NH * T) return;
    int C = NH * HS;
    int t = row_index % T, h = (row_index / T) % NH, b = row_index / (NH * T);
    const floatX* dy = dout + ((size_t)b * T + t) * C + h * HS;
    const floatX* v0 = qkv + (size_t)b * T * 3 * C + 2 * C + h * HS;
    float dy_row[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) dy_row[i] = (float)dy[i];
    const floatX* att_row = att + (size_t)row_index * T;
    float* ds_row = dscore + (size_t)row_index * T;
    float weighted = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        const floatX* v = v0 + (size_t)t2 * 3 * C;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < HS; i++) dot += dy_row[i] * (float)v[i];
        ds_row[t2] = dot;
        weighted += (float)att_row[t2] * dot;
    }
    float scale = rsqrtf((float)HS);
    for (int t2 = 0; t2 <= t; t2++) ds_row[t2] = (float)att_row[t2] * (ds_row[t2] - weighted) * scale;
}

__global__ void attention_backward_v1_dq_kernel(floatX* dqkv, const float* dscore, const floatX* qkv, int B, int T,
                                                int NH) {
    int row_index = blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t)
    if (row_index >= B * NH * T) return;
    int C = NH * HS;
    int t = row_index % T, h = (row_index / T) % NH, b = row_index / (NH * T);
    const floatX* k0 = qkv + (size_t)b * T * 3 * C + C + h * HS;
    const float* ds_row = dscore + (size_t)row_index * T;
    float acc[HS] = {};
    for (int t2 = 0; t2 <= t; t2++) {
        const floatX* k = k0 + (size_t)t2 * 3 * C;
        float ds = ds_row[t2];
#pragma unroll
        for (int i = 0; i < HS; i++) acc[i] += ds * (float)k[i];
    }
    floatX* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * HS;
#pragma unroll
    for (int i = 0; i < HS; i++) dq[i] = (floatX)acc[i];
}

__global__ void attention_backward_v1_dkv_kernel(floatX* dqkv, const float* dscore, const floatX* att,
                                                 const floatX* dout, const floatX* qkv, int B, int T, int NH) {
    int col_index = blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t2)
    if (col_index >= B * NH * T) return;
    int C = NH * HS;
    int t2 = col_index % T, h = (col_index / T) % NH, b = col_index / (NH * T);
    size_t head_square = ((size_t)b * NH + h) * T * T;
    const floatX* q0 = qkv + (size_t)b * T * 3 * C + h * HS;
    const floatX* dy0 = dout + (size_t)b * T * C + h * HS;
    float dk[HS] = {}, dv[HS] = {};
    for (int t = t2; t < T; t++) {
        float ds = dscore[head_square + (size_t)t * T + t2];
        float a = (float)att[head_square + (size_t)t * T + t2];
        const floatX* q = q0 + (size_t)t * 3 * C;
        const floatX* dy = dy0 + (size_t)t * C;
#pragma unroll
        for (int i = 0; i < HS; i++) {
            dk[i] += ds * (float)q[i];
            dv[i] += a * (float)dy[i];
        }
    }
    floatX* dk_out = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * HS;
    floatX* dv_out = dk_out + C;
#pragma unroll
    for (int i = 0; i < HS; i++) {
        dk_out[i] = (floatX)dk[i];
        dv_out[i] = (floatX)dv[i];
    }
}

void attention_backward_v1(floatX* dqkv, float* dscore /* (B, NH, T, T) fp32 */, const floatX* dout,
                           const floatX* qkv, const floatX* att, int B, int T, int C, int NH, int block_size) {
    if (C != NH * HS) fatal("attention_backward_v1 is written for head size %d, got C %d, NH %d", HS, C, NH);
    int rows = B * NH * T;
    attention_backward_v1_dscore_kernel<<<ceil_div_int(rows, block_size), block_size>>>(dscore, att, dout, qkv, B, T,
                                                                                       NH);
    cudaCheckLaunch();
    attention_backward_v1_dq_kernel<<<ceil_div_int(rows, block_size), block_size>>>(dqkv, dscore, qkv, B, T, NH);
    cudaCheckLaunch();
    attention_backward_v1_dkv_kernel<<<ceil_div_int(rows, block_size), block_size>>>(dqkv, dscore, att, dout, qkv, B,
                                                                                    T, NH);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's attention_backward (llmc/attention.cuh): permute qkv and dout into per-head layouts,
// four batched cuBLAS GEMMs on the full T x T squares (datt, dv, dq, dk) around a softmax-backward
// kernel in place over datt, and a permute back into dqkv. The products run on the tensor cores;
// what remains is the traffic of att and datt (B, NH, T, T) through memory, and twice the causal work.

// ----------------------------------------------------------------------------
// v3: fused, flash-attention style, on the tensor cores (mma.sync, see mma.cuh). att is never read:
// each tile of probabilities is recomputed from q, k and the forward's log-sum-exp per row,
// P = exp(scale q·kᵀ - lse), which the forward has to save instead of att (B·NH·T floats instead of
// B·NH·T² bf16). With D = rowsum(dout * out) (a small first kernel), dscore = P * (dout·vᵀ - D). Then:
//   kernel 1, a block per 64 keys of a head, walking the query tiles from the diagonal down; each warp
//     owns 16 keys and works in the transposed frame (rows = keys): Pᵀ = exp(k·qᵀ scale - lse),
//     dv += Pᵀ·dout, dPᵀ = v·doutᵀ, dSᵀ = Pᵀ * (dPᵀ - D), dk += dSᵀ·q. dk and dv stay in registers
//     until the block is done.
//   kernel 2, a block per 64 queries, walking the key tiles up to the diagonal (the forward's frame):
//     S, P and dP again, dq += dS·k.
// Splitting dq into its own pass recomputes two of the products (7 instead of 5) but makes every
// output owned by one warp: no atomics, so the result is deterministic like v2's. Accumulator
// fragments are reused as the next product's A operand; an operand stored with its k dimension
// across rows (dout and q as B of dv and dk, k as B of dq) is read with ldmatrix.trans.

constexpr int FB_BR = 64;  // queries per tile
constexpr int FB_BC = 64;  // keys per tile
constexpr int FB_THREADS = 128;
constexpr int FB_LDS = HS + 8;  // shared row stride in bf16: 144 bytes, conflict-free ldmatrix
constexpr float LOG2E = 1.4426950408889634f;

// D[b, h, t] = sum over d of dout[b, t, h, d] * out[b, t, h, d]: one thread per row
__global__ void attention_backward_v3_delta_kernel(float* delta, const floatX* dout, const floatX* out, int B, int T,
                                                   int NH) {
    int row_index = blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t)
    if (row_index >= B * NH * T) return;
    int t = row_index % T, h = (row_index / T) % NH, b = row_index / (NH * T);
    size_t offset = ((size_t)b * T + t) * NH * HS + h * HS;
    float sum = 0.0f;
#pragma unroll
    for (int d = 0; d < HS; d += x128::size) {
        x128 dy = load128(dout + offset + d);
        x128 o = load128(out + offset + d);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum += (float)dy[k] * (float)o[k];
    }
    delta[row_index] = sum;
}

// 64 rows x 64 values from a (B, T, row_stride) tensor into shared memory: 512 chunks of 16 bytes
__device__ inline void flash_load_rows(floatX (*dst)[FB_LDS], const floatX* src, int row_stride) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int chunk = threadIdx.x + i * FB_THREADS;
        int r = chunk / 8, col = (chunk % 8) * 8;
        cp_async16(&dst[r][col], src + (size_t)r * row_stride + col);
    }
}

// c (8 tiles of 16x8) = A (16 x 64, 4 fragments) · Bᵀ, where B is 64 rows x 64 values in shared memory
// (rows = the product's columns, values along k): the pattern of q·kᵀ
__device__ inline void flash_mma_abt(float (*c)[4], const uint32_t (*a)[4], const floatX (*b)[FB_LDS], int lane) {
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++) {
#pragma unroll
        for (int pair = 0; pair < 4; pair++) {
            uint32_t r[4];
            ldmatrix_x4(r, &b[pair * 16 + lane % 8 + (lane / 16) * 8][kc * 16 + ((lane / 8) % 2) * 8]);
            uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma_bf16_16816(c[2 * pair], a[kc], b0);
            mma_bf16_16816(c[2 * pair + 1], a[kc], b1);
        }
    }
}

// acc (8 tiles of 16x8) += P (16 x 64, accumulator fragments) · B, where B is 64 rows (along k) x 64
// values (the product's columns) in shared memory: the pattern of att·v
__device__ inline void flash_mma_pb(float (*acc)[4], const float (*p)[4], const floatX (*b)[FB_LDS], int lane) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        uint32_t a[4] = {pack_bf16x2(p[2 * kc][0], p[2 * kc][1]), pack_bf16x2(p[2 * kc][2], p[2 * kc][3]),
                         pack_bf16x2(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                         pack_bf16x2(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
        for (int pair = 0; pair < HS / 16; pair++) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, &b[kc * 16 + lane % 8 + ((lane / 8) % 2) * 8][pair * 16 + (lane / 16) * 8]);
            uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma_bf16_16816(acc[2 * pair], a, b0);
            mma_bf16_16816(acc[2 * pair + 1], a, b1);
        }
    }
}

// a warp's 16 rows of a 64 x 64 shared tile as A fragments (4 chunks of 16 along k)
__device__ inline void flash_load_a(uint32_t (*a)[4], const floatX (*tile)[FB_LDS], int row0, int lane) {
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++) ldmatrix_x4(a[kc], &tile[row0 + lane % 16][kc * 16 + (lane / 16) * 8]);
}

struct FlashKVShared {
    floatX k[FB_BC][FB_LDS];
    floatX v[FB_BC][FB_LDS];
    floatX q[2][FB_BR][FB_LDS];
    floatX dout[2][FB_BR][FB_LDS];
    float lse[2][FB_BR];
    float delta[2][FB_BR];
};

// kernel 1: dk and dv for 64 keys of one head
__global__ void __launch_bounds__(FB_THREADS) attention_backward_v3_dkv_kernel(floatX* dqkv, const floatX* qkv,
                                                                                const floatX* dout, const float* lse,
                                                                                const float* delta, int T, int NH) {
    extern __shared__ __align__(16) unsigned char flash_kv_shared[];
    FlashKVShared& sh = *reinterpret_cast<FlashKVShared*>(flash_kv_shared);
    int C = NH * HS;
    int k_tile = blockIdx.x;  // tile 0 has the most query tiles below it, and starts first
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX* q_head = qkv + (size_t)b * T * 3 * C + h * HS;  // q of (b, t = 0, h); k at + C, v at + 2C
    const floatX* dout_head = dout + (size_t)b * T * C + h * HS;
    const float* lse_head = lse + (size_t)blockIdx.y * T;  // (b, h) rows
    const float* delta_head = delta + (size_t)blockIdx.y * T;
    int num_q_tiles = T / FB_BR;

    auto load_query_tile = [&](int stage, int q_tile) {
        flash_load_rows(sh.q[stage], q_head + (size_t)q_tile * FB_BR * 3 * C, 3 * C);
        flash_load_rows(sh.dout[stage], dout_head + (size_t)q_tile * FB_BR * C, C);
        if (threadIdx.x < FB_BR / 4) {
            cp_async16(&sh.lse[stage][threadIdx.x * 4], lse_head + q_tile * FB_BR + threadIdx.x * 4);
        } else if (threadIdx.x < FB_BR / 2) {
            int i = threadIdx.x - FB_BR / 4;
            cp_async16(&sh.delta[stage][i * 4], delta_head + q_tile * FB_BR + i * 4);
        }
    };
    flash_load_rows(sh.k, q_head + (size_t)k_tile * FB_BC * 3 * C + C, 3 * C);
    flash_load_rows(sh.v, q_head + (size_t)k_tile * FB_BC * 3 * C + 2 * C, 3 * C);
    load_query_tile(0, k_tile);
    cp_async_commit();

    const float scale = rsqrtf((float)HS);
    const float scale_log2 = scale * LOG2E;
    int key0 = k_tile * FB_BC + warp * 16 + lane / 4;  // the lane's keys: key0 and key0 + 8
    uint32_t k_frag[HS / 16][4], v_frag[HS / 16][4];
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

    for (int q_tile = k_tile; q_tile < num_q_tiles; q_tile++) {
        int stage = (q_tile - k_tile) % 2;
        if (q_tile + 1 < num_q_tiles) load_query_tile(1 - stage, q_tile + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (q_tile == k_tile) {
            flash_load_a(k_frag, sh.k, warp * 16, lane);
            flash_load_a(v_frag, sh.v, warp * 16, lane);
        }
        // Pᵀ (16 keys x 64 queries) = exp(k·qᵀ scale - lse), 0 where key > query
        float p[FB_BR / 8][4] = {};
        flash_mma_abt(p, k_frag, sh.q[stage], lane);
#pragma unroll
        for (int nt = 0; nt < FB_BR / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int query_in_tile = nt * 8 + (lane % 4) * 2 + e % 2;
                int key = key0 + 8 * (e / 2);
                float x = p[nt][e] * scale_log2 - sh.lse[stage][query_in_tile] * LOG2E;
                p[nt][e] = key > q_tile * FB_BR + query_in_tile ? 0.0f : exp2f(x);
            }
        }
        flash_mma_pb(dv, p, sh.dout[stage], lane);  // dv += Pᵀ·dout
        // dPᵀ = v·doutᵀ, then dSᵀ = Pᵀ * (dPᵀ - D) in place of dPᵀ
        float ds[FB_BR / 8][4] = {};
        flash_mma_abt(ds, v_frag, sh.dout[stage], lane);
#pragma unroll
        for (int nt = 0; nt < FB_BR / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int query_in_tile = nt * 8 + (lane % 4) * 2 + e % 2;
                ds[nt][e] = p[nt][e] * (ds[nt][e] - sh.delta[stage][query_in_tile]);
            }
        }
        flash_mma_pb(dk, ds, sh.q[stage], lane);  // dk += dSᵀ·q
        __syncthreads();  // all warps are done with this stage before it is refilled
    }

    floatX* dk0 = dqkv + ((size_t)b * T + key0) * 3 * C + C + h * HS;
    floatX* dk1 = dk0 + (size_t)8 * 3 * C;
#pragma unroll
    for (int nt = 0; nt < HS / 8; nt++) {
        int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<__nv_bfloat162*>(dk0 + col) = __floats2bfloat162_rn(dk[nt][0] * scale, dk[nt][1] * scale);
        *reinterpret_cast<__nv_bfloat162*>(dk1 + col) = __floats2bfloat162_rn(dk[nt][2] * scale, dk[nt][3] * scale);
        *reinterpret_cast<__nv_bfloat162*>(dk0 + C + col) = __floats2bfloat162_rn(dv[nt][0], dv[nt][1]);
        *reinterpret_cast<__nv_bfloat162*>(dk1 + C + col) = __floats2bfloat162_rn(dv[nt][2], dv[nt][3]);
    }
}

struct FlashQShared {
    floatX q[FB_BR][FB_LDS];
    floatX dout[FB_BR][FB_LDS];
    floatX k[2][FB_BC][FB_LDS];
    floatX v[2][FB_BC][FB_LDS];
};

// kernel 2: dq for 64 queries of one head
__global__ void __launch_bounds__(FB_THREADS) attention_backward_v3_dq_kernel(floatX* dqkv, const floatX* qkv,
                                                                               const floatX* dout, const float* lse,
                                                                               const float* delta, int T, int NH) {
    extern __shared__ __align__(16) unsigned char flash_q_shared[];
    FlashQShared& sh = *reinterpret_cast<FlashQShared*>(flash_q_shared);
    int C = NH * HS;
    int q_tile = gridDim.x - 1 - blockIdx.x;  // longest first
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX* q_head = qkv + (size_t)b * T * 3 * C + h * HS;
    const floatX* dout_head = dout + (size_t)b * T * C + h * HS;

    flash_load_rows(sh.q, q_head + (size_t)q_tile * FB_BR * 3 * C, 3 * C);
    flash_load_rows(sh.dout, dout_head + (size_t)q_tile * FB_BR * C, C);
    flash_load_rows(sh.k[0], q_head + C, 3 * C);
    flash_load_rows(sh.v[0], q_head + 2 * C, 3 * C);
    cp_async_commit();

    const float scale = rsqrtf((float)HS);
    const float scale_log2 = scale * LOG2E;
    int query0 = q_tile * FB_BR + warp * 16 + lane / 4;  // the lane's rows: query0 and query0 + 8
    float row_lse_log2[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_lse_log2[r] = lse[(size_t)blockIdx.y * T + query0 + 8 * r] * LOG2E;
        row_delta[r] = delta[(size_t)blockIdx.y * T + query0 + 8 * r];
    }
    uint32_t q_frag[HS / 16][4], dout_frag[HS / 16][4];
    float dq[HS / 8][4] = {};

    for (int k_tile = 0; k_tile <= q_tile; k_tile++) {
        int stage = k_tile % 2;
        if (k_tile + 1 <= q_tile) {
            flash_load_rows(sh.k[1 - stage], q_head + (size_t)(k_tile + 1) * FB_BC * 3 * C + C, 3 * C);
            flash_load_rows(sh.v[1 - stage], q_head + (size_t)(k_tile + 1) * FB_BC * 3 * C + 2 * C, 3 * C);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (k_tile == 0) {
            flash_load_a(q_frag, sh.q, warp * 16, lane);
            flash_load_a(dout_frag, sh.dout, warp * 16, lane);
        }
        // P = exp(q·kᵀ scale - lse), 0 where key > query
        float p[FB_BC / 8][4] = {};
        flash_mma_abt(p, q_frag, sh.k[stage], lane);
#pragma unroll
        for (int nt = 0; nt < FB_BC / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k_tile * FB_BC + nt * 8 + (lane % 4) * 2 + e % 2;
                float x = p[nt][e] * scale_log2 - row_lse_log2[e / 2];
                p[nt][e] = key > query0 + 8 * (e / 2) ? 0.0f : exp2f(x);
            }
        }
        // dP = dout·vᵀ, then dS = P * (dP - D) in place
        float ds[FB_BC / 8][4] = {};
        flash_mma_abt(ds, dout_frag, sh.v[stage], lane);
#pragma unroll
        for (int nt = 0; nt < FB_BC / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) ds[nt][e] = p[nt][e] * (ds[nt][e] - row_delta[e / 2]);
        }
        flash_mma_pb(dq, ds, sh.k[stage], lane);  // dq += dS·k
        __syncthreads();
    }

    floatX* dq0 = dqkv + ((size_t)b * T + query0) * 3 * C + h * HS;
    floatX* dq1 = dq0 + (size_t)8 * 3 * C;
#pragma unroll
    for (int nt = 0; nt < HS / 8; nt++) {
        int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<__nv_bfloat162*>(dq0 + col) = __floats2bfloat162_rn(dq[nt][0] * scale, dq[nt][1] * scale);
        *reinterpret_cast<__nv_bfloat162*>(dq1 + col) = __floats2bfloat162_rn(dq[nt][2] * scale, dq[nt][3] * scale);
    }
}

// dqkv overwritten. out and lse are what a flash forward saves: the output (B, T, C) and the natural-log
// log-sum-exp of each row's scaled scores (B, NH, T); delta is (B, NH, T) floats of scratch.
void attention_backward_v3(floatX* dqkv, float* delta, const floatX* dout, const floatX* qkv, const floatX* out,
                           const float* lse, int B, int T, int C, int NH) {
    if (C != NH * HS || T % FB_BR != 0) {
        fatal("attention_backward_v3 needs head size %d and T divisible by %d (C %d, NH %d, T %d)", HS, FB_BR, C, NH,
              T);
    }
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(attention_backward_v3_dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)sizeof(FlashKVShared)));
        cudaCheck(cudaFuncSetAttribute(attention_backward_v3_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)sizeof(FlashQShared)));
        configured = true;
    }
    attention_backward_v3_delta_kernel<<<ceil_div_int((long)B * NH * T, 256), 256>>>(delta, dout, out, B, T, NH);
    cudaCheckLaunch();
    dim3 grid(T / FB_BR, B * NH);
    attention_backward_v3_dkv_kernel<<<grid, FB_THREADS, sizeof(FlashKVShared)>>>(dqkv, qkv, dout, lse, delta, T, NH);
    cudaCheckLaunch();
    attention_backward_v3_dq_kernel<<<grid, FB_THREADS, sizeof(FlashQShared)>>>(dqkv, qkv, dout, lse, delta, T, NH);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

// part 0, 1 or 2 (dq, dk, dv) of a (B, T, 3C) tensor, as (B, T, C): each is checked on its own scale
std::vector<float> qkv_part(const std::vector<float>& qkv, int part, size_t BT, int C) {
    std::vector<float> result(BT * C);
    for (size_t bt = 0; bt < BT; bt++) {
        std::copy(qkv.begin() + bt * 3 * C + (size_t)part * C, qkv.begin() + bt * 3 * C + (size_t)(part + 1) * C,
                  result.begin() + bt * C);
    }
    return result;
}

int main(int argc, char** argv) {
    dev::device_init("attention_backward", argc, argv);
    cublas_setup();
    const int B = dev::B, T = dev::T, C = dev::C, NH = dev::NH;
    const size_t BTC = (size_t)B * T * C, att_elements = (size_t)B * NH * T * T;

    std::vector<float> qkv = dev::random_floatX(3 * BTC, -2.0f, 2.0f);
    std::vector<float> dout = dev::random_floatX(BTC, -1.0f, 1.0f);
    std::vector<float> out(BTC), att(att_elements);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    // what a flash forward saves instead of att (for v3): the log-sum-exp of each row's scaled scores,
    // lse = s[m] - log(att[m]) at the row's largest probability m, and out (in bf16)
    std::vector<float> lse((size_t)B * NH * T);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                size_t row_index = ((size_t)b * NH + h) * T + t;
                const float* row = att.data() + row_index * T;
                int m = (int)(std::max_element(row, row + t + 1) - row);
                const float* q = qkv.data() + ((size_t)b * T + t) * 3 * C + h * HS;
                const float* k = qkv.data() + ((size_t)b * T + m) * 3 * C + C + h * HS;
                float dot = 0.0f;
                for (int i = 0; i < HS; i++) dot += q[i] * k[i];
                lse[row_index] = dot / sqrtf((float)HS) - logf(row[m]);
            }
        }
    }
    for (float& a : att) a = dev::round_to_floatX(a);  // as the GPU forward stores it
    std::vector<float> ref_dqkv(3 * BTC, 0.0f);         // the CPU op adds into dqkv: start at zero
    attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

    dev::DeviceBuffer<floatX> d_qkv(3 * BTC), d_dout(BTC), d_dqkv(3 * BTC);
    dev::DeviceBuffer<floatX> d_att(std::max(att_elements, attention_saved_elements(B, T, NH)));
    dev::DeviceBuffer<floatX> d_scratch(attention_scratch_elements(B, T, C, NH));
    dev::DeviceBuffer<float> d_dscore(att_elements);
    dev::DeviceBuffer<floatX> d_out(BTC);
    dev::DeviceBuffer<float> d_lse((size_t)B * NH * T), d_delta((size_t)B * NH * T);
    dev::upload(d_qkv, qkv);
    dev::upload(d_dout, dout);
    dev::upload(d_out, out);
    dev::upload(d_lse, lse);
    {
        std::vector<float> att_padded(d_att.n, 0.0f);
        std::copy(att.begin(), att.end(), att_padded.begin());
        dev::upload(d_att, att_padded);
    }

    double flops = 8.0 * B * NH * HS * ((double)T * (T + 1) / 2);
    double bytes = (double)att_elements * sizeof(floatX) + 7.0 * BTC * sizeof(floatX);
    dev::Report report = dev::make_report("attention_backward", bytes, flops);
    std::vector<dev::Version> versions = {
        {"v1 thread per row, fp32 units, 3 kernels", {64, 128, 256},
         [&](int bs) {
             attention_backward_v1(d_dqkv.ptr, d_dscore.ptr, d_dout.ptr, d_qkv.ptr, d_att.ptr, B, T, C, NH, bs);
         }},
        {"v2 llmc: cuBLAS + softmax backward kernel", {0},
         [&](int) {
             attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_att.ptr, d_scratch.ptr, B, T, C, NH, 0);
         }},
        {"v3 flash: recompute P per tile, mma.sync", {0},
         [&](int) {
             attention_backward_v3(d_dqkv.ptr, d_delta.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, C, NH);
         }},
    };
    dev::run_versions(&report, versions, [&] { dev::poison(d_dqkv); },
                      [&] {
                          dev::CheckResult result;
                          std::vector<float> dqkv = dev::download(d_dqkv);
                          const char* names[3] = {"dq", "dk", "dv"};
                          for (int part = 0; part < 3; part++) {
                              dev::check_tensor(&result, names[part], qkv_part(dqkv, part, (size_t)B * T, C),
                                                qkv_part(ref_dqkv, part, (size_t)B * T, C), dev::TOL_ATTENTION);
                          }
                          return result;
                      });
    cublas_teardown();
    return dev::finish(report);
}
