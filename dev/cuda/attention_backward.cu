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

#include "../../llmc/attention.cuh"
#include "../../llmc/attention.h"
#include "flash_wgmma.cuh"

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
// v3 is llmc's flash backward (llmc/attention_flash.cuh) as first written, fused on the tensor
// cores (mma.sync, llmc/mma.cuh). att is never read: each tile of probabilities is recomputed from q, k
// and the forward's log-sum-exp per row, P = exp(scale q·kᵀ - lse), which the forward saves instead of
// att (B·NH·T floats instead of B·NH·T² bf16). With D = rowsum(dout * out) (a small first kernel),
// dscore = P * (dout·vᵀ - D). Then:
//   kernel 1, a block per 64 keys of a head, walking the query tiles from the diagonal down; each warp
//     owns 16 keys and works in the transposed frame (rows = keys): Pᵀ = exp(k·qᵀ scale - lse),
//     dv += Pᵀ·dout, dPᵀ = v·doutᵀ, dSᵀ = Pᵀ * (dPᵀ - D), dk += dSᵀ·q. dk and dv stay in registers
//     until the block is done.
//   kernel 2, a block per 64 queries, walking the key tiles up to the diagonal (the forward's frame):
//     S, P and dP again, dq += dS·k.
// Splitting dq into its own pass recomputes two of the products (7 instead of 5) but makes every
// output owned by one warp: no atomics, so the result is deterministic like v2's. Accumulator
// fragments are reused as the next product's A operand; an operand stored with its k dimension
// across rows (dout and q as B of dv and dk, k as B of dq) is read with ldmatrix.trans. Any T and
// head sizes that are multiples of 8 up to 128, as the forward.

// ----------------------------------------------------------------------------
// v4 is llmc's flash backward today (FlashVersion::v4, the trainer's default): v3 with fewer
// instructions per score. v3 computes every score's key and query index and compares them on every
// tile, though only the diagonal tile (and, for kernel 1, a partial last query tile) has a masked
// pair; v4 masks those tiles alone. Kernel 1 keeps the log-sum-exps in log2 units in shared memory (a
// multiply fewer per score), and every exponential is ex2.approx instead of exp2f. Should be faster
// where the kernels are issue-bound (the H100's first run: 95 TFLOP/s, dkv and dq the two costliest
// kernels after the GEMMs).

// ----------------------------------------------------------------------------
// v5: v4's two kernels on Hopper's warpgroup product (wgmma, flash_wgmma.cuh; sm_90a), head size 64.
// The block's 4 warps are one warpgroup. Per tile, the two products from shared memory are issued
// together and awaited once (dkv: Pᵀ = k·qᵀ and dPᵀ = v·doutᵀ; dq: P = q·kᵀ and dP = dout·vᵀ), then the
// products with a register operand (dkv: dv += Pᵀ·dout and dk += dSᵀ·q; dq: dq += dS·k), their B
// tiles read N-major. k and v are read from shared memory by every product instead of held as
// fragments (v4 holds 32 registers of each in the dkv kernel). The same arithmetic as v4 otherwise:
// the order of each product's sums is the tensor cores' (the ISA does not say it), so the bits may
// differ from v4's; the tolerances are the same. Other GPUs run v4.

__global__ void __launch_bounds__(128) attention_backward_v5_dkv_kernel(const AttentionProblem p) {
    extern __shared__ unsigned char v5_shared[];
    unsigned char* tiles = wg_tiles(v5_shared);  // k, v, then two stages of q and of dout
    unsigned char* k_tile = tiles;
    unsigned char* v_tile = tiles + WG_TILE_BYTES;
    auto q_tile = [&](int stage) { return tiles + (2 + stage) * WG_TILE_BYTES; };
    auto dout_tile = [&](int stage) { return tiles + (4 + stage) * WG_TILE_BYTES; };
    float* lse_of = reinterpret_cast<float*>(tiles + 6 * WG_TILE_BYTES);  // [2][64], log2 units
    float* delta_of = lse_of + 2 * FLASH_TILE;                            // [2][64]
    const int hs = WG_HS, Tq = p.Tq, Tk = p.Tk;
    int k_index = blockIdx.x;
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int num_q_tiles = (Tq + FLASH_TILE - 1) / FLASH_TILE;
    int first_q_tile = p.causal ? k_index : 0;
    auto load_query_tile = [&](int stage, int q_index) {
        wg_load_tile(q_tile(stage), p.q.head(b, h, hs), p.q.row, q_index * FLASH_TILE, Tq);
        wg_load_tile(dout_tile(stage), p.dout.head(b, h, hs), p.dout.row, q_index * FLASH_TILE, Tq);
        int i = threadIdx.x % FLASH_TILE, query = q_index * FLASH_TILE + i;
        size_t stat = (size_t)blockIdx.y * p.stat_row + query;
        if (threadIdx.x < FLASH_TILE) {
            lse_of[stage * FLASH_TILE + i] = query < Tq ? p.lse[stat] * FLASH_LOG2E : 0.0f;
        } else {
            delta_of[stage * FLASH_TILE + i] = query < Tq ? p.delta[stat] : 0.0f;
        }
    };
    wg_load_tile(k_tile, p.k.head(b, h, hs), p.k.row, k_index * FLASH_TILE, Tk);
    wg_load_tile(v_tile, p.v.head(b, h, hs), p.v.row, k_index * FLASH_TILE, Tk);
    load_query_tile(0, first_q_tile);
    cp_async_commit();

    const float scale = 1.0f / sqrtf((float)hs);
    const float scale_log2 = scale * FLASH_LOG2E;
    int key0 = k_index * FLASH_TILE + warp * 16 + lane / 4;  // the lane's keys: key0 and key0 + 8
    float dk[WG_HS / 8][4] = {}, dv[WG_HS / 8][4] = {};

    for (int q_index = first_q_tile; q_index < num_q_tiles; q_index++) {
        int stage = (q_index - first_q_tile) % 2;
        if (q_index + 1 < num_q_tiles) load_query_tile(1 - stage, q_index + 1);
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async();  // what cp.async and the zero stores wrote, to the tensor cores' reads
        __syncthreads();
        float pt[FLASH_TILE / 8][4], ds[FLASH_TILE / 8][4];  // Pᵀ and dPᵀ (16 keys x 64 queries a warp)
        wgmma_fence();
        wg_abt(pt, k_tile, q_tile(stage));
        wg_abt(ds, v_tile, dout_tile(stage));
        wgmma_commit();
        wgmma_wait<0>();
        if ((p.causal && q_index == k_index) || (q_index + 1) * FLASH_TILE > Tq) {
            flash_mask(pt, key0, q_index * FLASH_TILE, true, p.causal, Tq, Tk, lane);
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
            int column = stage * FLASH_TILE + nt * 8 + (lane % 4) * 2;  // and + 1
            float2 lse = *reinterpret_cast<const float2*>(&lse_of[column]);
            float2 delta = *reinterpret_cast<const float2*>(&delta_of[column]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                pt[nt][e] = exp2_approx(fmaf(pt[nt][e], scale_log2, -(e % 2 ? lse.y : lse.x)));
                ds[nt][e] = pt[nt][e] * (ds[nt][e] - (e % 2 ? delta.y : delta.x));  // dSᵀ
            }
        }
        uint32_t a_p[4][4], a_ds[4][4];
        wg_pack_a(a_p, pt);
        wg_pack_a(a_ds, ds);
        wgmma_fence();
        wg_pb(dv, a_p, dout_tile(stage));  // dv += Pᵀ·dout
        wg_pb(dk, a_ds, q_tile(stage));    // dk += dSᵀ·q
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();  // every thread is done with this stage before it is refilled
    }
    const float dk_factor[2] = {scale, scale}, dv_factor[2] = {1.0f, 1.0f};
    flash_store_rows<WG_HS>(p.dk.head(b, h, hs), p.dk.row, dk, key0, dk_factor, Tk, hs, lane, p.accumulate);
    flash_store_rows<WG_HS>(p.dv.head(b, h, hs), p.dv.row, dv, key0, dv_factor, Tk, hs, lane, p.accumulate);
}

__global__ void __launch_bounds__(128) attention_backward_v5_dq_kernel(const AttentionProblem p) {
    extern __shared__ unsigned char v5_shared[];
    unsigned char* tiles = wg_tiles(v5_shared);  // q, dout, then two stages of k and of v
    unsigned char* q_tile = tiles;
    unsigned char* dout_tile = tiles + WG_TILE_BYTES;
    auto k_tile = [&](int stage) { return tiles + (2 + stage) * WG_TILE_BYTES; };
    auto v_tile = [&](int stage) { return tiles + (4 + stage) * WG_TILE_BYTES; };
    const int hs = WG_HS, Tq = p.Tq, Tk = p.Tk;
    int q_index = gridDim.x - 1 - blockIdx.x;  // longest first
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX *k_head = p.k.head(b, h, hs), *v_head = p.v.head(b, h, hs);
    int last_tile = p.causal ? q_index : (Tk - 1) / FLASH_TILE;

    wg_load_tile(q_tile, p.q.head(b, h, hs), p.q.row, q_index * FLASH_TILE, Tq);
    wg_load_tile(dout_tile, p.dout.head(b, h, hs), p.dout.row, q_index * FLASH_TILE, Tq);
    wg_load_tile(k_tile(0), k_head, p.k.row, 0, Tk);
    wg_load_tile(v_tile(0), v_head, p.v.row, 0, Tk);
    cp_async_commit();

    const float scale = 1.0f / sqrtf((float)hs);
    const float scale_log2 = scale * FLASH_LOG2E;
    int query0 = q_index * FLASH_TILE + warp * 16 + lane / 4;
    float row_lse_log2[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int query = query0 + 8 * r;
        row_lse_log2[r] = query < Tq ? p.lse[(size_t)blockIdx.y * p.stat_row + query] * FLASH_LOG2E : 0.0f;
        row_delta[r] = query < Tq ? p.delta[(size_t)blockIdx.y * p.stat_row + query] : 0.0f;
    }
    float dq[WG_HS / 8][4] = {};

    for (int k_index = 0; k_index <= last_tile; k_index++) {
        int stage = k_index % 2;
        if (k_index + 1 <= last_tile) {
            wg_load_tile(k_tile(1 - stage), k_head, p.k.row, (k_index + 1) * FLASH_TILE, Tk);
            wg_load_tile(v_tile(1 - stage), v_head, p.v.row, (k_index + 1) * FLASH_TILE, Tk);
        }
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
        float pt[FLASH_TILE / 8][4], ds[FLASH_TILE / 8][4];  // P and dP
        wgmma_fence();
        wg_abt(pt, q_tile, k_tile(stage));
        wg_abt(ds, dout_tile, v_tile(stage));
        wgmma_commit();
        wgmma_wait<0>();
        if (p.causal ? k_index == q_index : (k_index + 1) * FLASH_TILE > Tk) {
            flash_mask(pt, query0, k_index * FLASH_TILE, false, p.causal, Tq, Tk, lane);
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pe = exp2_approx(fmaf(pt[nt][e], scale_log2, -row_lse_log2[e / 2]));
                ds[nt][e] = pe * (ds[nt][e] - row_delta[e / 2]);
            }
        }
        uint32_t a_ds[4][4];
        wg_pack_a(a_ds, ds);
        wgmma_fence();
        wg_pb(dq, a_ds, k_tile(stage));  // dq += dS·k
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();
    }
    const float dq_factor[2] = {scale, scale};
    flash_store_rows<WG_HS>(p.dq.head(b, h, hs), p.dq.row, dq, query0, dq_factor, Tq, hs, lane, p.accumulate);
}

// v5 where wgmma runs (an sm_90 GPU, or the emulator), else v4
void attention_backward_v5(floatX* dqkv, float* delta, const floatX* dout, const floatX* qkv, const floatX* out,
                           const float* lse, int B, int T, int C, int NH) {
    if (C != NH * WG_HS) fatal("attention_backward_v5 is written for head size %d, got C %d, NH %d", WG_HS, C, NH);
    if (dev::device().prop.major != 9) {
        attention_flash_backward<FlashVersion::v4>(dqkv, delta, dout, qkv, out, lse, B, T, NH, WG_HS, 0);
        return;
    }
    static bool configured = false;
    size_t shared = 6 * WG_TILE_BYTES + 4 * FLASH_TILE * sizeof(float) + 1024;  // tiles, lse and delta, alignment
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(attention_backward_v5_dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        cudaCheck(cudaFuncSetAttribute(attention_backward_v5_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        configured = true;
    }
    attention_delta_kernel<<<ceil_div_int(B * NH * T, 256), 256>>>(delta, dout, out, B, T, NH, WG_HS);
    cudaCheckLaunch();
    AttentionProblem p = attention_sequence_backward(dqkv, delta, dout, qkv, lse, B, T, NH, WG_HS);
    dim3 grid(ceil_div_int(T, FLASH_TILE), B * NH);
    attention_backward_v5_dkv_kernel<<<grid, 128, shared>>>(p);
    cudaCheckLaunch();
    attention_backward_v5_dq_kernel<<<grid, 128, shared>>>(p);
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

// Checks (and, outside the check mode, times) every version at sequence length T; 1 if a check failed.
static int check_and_time(int T) {
    const int B = dev::B, C = dev::C, NH = dev::NH;
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
    dev::DeviceBuffer<floatX> d_att(std::max(att_elements, attention_saved_elements(B, T, NH, false)));
    dev::DeviceBuffer<floatX> d_scratch(std::max(attention_scratch_elements(B, T, C, NH, false),
                                                 attention_scratch_elements(B, T, C, NH, true)));
    dev::DeviceBuffer<float> d_dscore(att_elements);
    dev::DeviceBuffer<floatX> d_out(BTC);
    dev::DeviceBuffer<float> d_lse((size_t)B * NH * T);  // what the flash forward saves
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
    dev::Report report = dev::make_report("attention_backward, T " + std::to_string(T), bytes, flops);
    std::vector<dev::Version> versions = {
        {"v1 thread per row, fp32 units, 3 kernels", {64, 128, 256},
         [&](int bs) {
             attention_backward_v1(d_dqkv.ptr, d_dscore.ptr, d_dout.ptr, d_qkv.ptr, d_att.ptr, B, T, C, NH, bs);
         }},
        {"v2 llmc -fa 0: cuBLAS + softmax backward", {0},
         [&](int) {
             attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_att.ptr, d_scratch.ptr, B, T, C, NH,
                                false, 0);
         }},
        {"v3 flash: recompute P, mma.sync", {0},
         [&](int) {
             attention_flash_backward<FlashVersion::v3>(d_dqkv.ptr, reinterpret_cast<float*>(d_scratch.ptr),
                                                        d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, NH,
                                                        C / NH, 0);
         }},
        {"v4 llmc flash: v3, mask only where needed, ex2.approx", {0},
         [&](int) {
             attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, reinterpret_cast<floatX*>(d_lse.ptr),
                                d_scratch.ptr, B, T, C, NH, true, 0);
         }},
        {dev::device().prop.major == 9 ? "v5 flash: v4 on wgmma (sm_90a)" : "v5 flash: wgmma is sm_90's; v4 here", {0},
         [&](int) {
             attention_backward_v5(d_dqkv.ptr, reinterpret_cast<float*>(d_scratch.ptr), d_dout.ptr, d_qkv.ptr,
                                   d_out.ptr, d_lse.ptr, B, T, C, NH);
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
    return dev::finish(report);
}

int main(int argc, char** argv) {
    dev::device_init("attention_backward", argc, argv);
    cublas_setup();
    int failed = dev::check_partial_only() ? 0 : check_and_time(dev::T);
    // the check mode also runs a length whose last 64-query tile is partial (T = 300: 4 whole tiles
    // and 44 rows), so the flash kernels' padded rows and masked tile edges are checked too
    if (dev::check_only) failed |= check_and_time(dev::T - 20);
    cublas_teardown();
    return failed;
}
