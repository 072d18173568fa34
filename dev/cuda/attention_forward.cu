// Causal self-attention forward, version by version, for (B, T, C, NH) = (8, 1024, 768, 12), head size 64:
//   att = softmax_causal(q·kᵀ / sqrt(hs)) per head,  out = att·v,  with q, k, v side by side in qkv (B, T, 3C).
// Checked against attention_forward() of llmc/attention.h (out always; att where a version stores it;
// the per-row log-sum-exp where a version saves that instead) and timed.
//
// The two numbers: the useful (causal) work is 2 products of T(T+1)/2 x hs per head: 12.9 GFLOP, ~16 us
// at 790 TFLOP/s. Storing att (B, NH, T, T) in bf16 is 201 MB, ~70 us at 3 TB/s; qkv and out are 50 MB.
// So a version that materializes att is bound by that tensor, and one that never writes it (v3, as in
// flash attention) can be bound by the matrix units. The rate below counts the causal flops only.
//
//   make -C dev/cuda bin/attention_forward && dev/cuda/bin/attention_forward
#include "harness.cuh"

#include "../../llmc/attention.cuh"
#include "../../llmc/attention.h"
#include "flash_wgmma.cuh"

constexpr int HS = 64;  // head size: the kernels below keep a row of it in registers

// ----------------------------------------------------------------------------
// v1: one thread per query row (b, h, t). Pass 1: the scores q·k[t2] for t2 <= t, with a running max
// and sum of exponentials. Pass 2: the scores again, turned into probabilities, written to att and
// accumulated into a 64-float output row held in registers. The threads of a warp are 32 consecutive
// queries of one head, so they read the same k and v rows at the same time (broadcasts), but all the
// arithmetic runs on the fp32 units and the scores are computed twice.

__global__ void attention_forward_v1_kernel(floatX* out, floatX* att, const floatX* qkv, int B, int T, int NH) {
    int row_index = blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t)
    if (row_index >= B * NH * T) return;
    int C = NH * HS;
    int t = row_index % T, h = (row_index / T) % NH, b = row_index / (NH * T);
    const floatX* q = qkv + ((size_t)b * T + t) * 3 * C + h * HS;
    const floatX* k0 = qkv + (size_t)b * T * 3 * C + C + h * HS;  // k of (b, t2 = 0, h); v at + C
    float scale = rsqrtf((float)HS);
    float q_row[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) q_row[i] = (float)q[i];

    float max_score = -INFINITY, sum = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
        const floatX* k = k0 + (size_t)t2 * 3 * C;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < HS; i++) dot += q_row[i] * (float)k[i];
        float score = dot * scale;
        float new_max = fmaxf(max_score, score);
        sum = sum * expf(max_score - new_max) + expf(score - new_max);
        max_score = new_max;
    }
    float inv_sum = 1.0f / sum;
    floatX* att_row = att + (size_t)row_index * T;
    float acc[HS] = {};
    for (int t2 = 0; t2 <= t; t2++) {
        const floatX* k = k0 + (size_t)t2 * 3 * C;
        const floatX* v = k + C;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < HS; i++) dot += q_row[i] * (float)k[i];
        float p = expf(dot * scale - max_score) * inv_sum;
        att_row[t2] = (floatX)p;
#pragma unroll
        for (int i = 0; i < HS; i++) acc[i] += p * (float)v[i];
    }
    for (int t2 = t + 1; t2 < T; t2++) att_row[t2] = (floatX)0.0f;
    floatX* out_row = out + ((size_t)b * T + t) * C + h * HS;
#pragma unroll
    for (int i = 0; i < HS; i++) out_row[i] = (floatX)acc[i];
}

void attention_forward_v1(floatX* out, floatX* att, const floatX* qkv, int B, int T, int C, int NH, int block_size) {
    if (C != NH * HS) fatal("attention_forward_v1 is written for head size %d, got C %d, NH %d", HS, C, NH);
    attention_forward_v1_kernel<<<ceil_div_int((long)B * NH * T, block_size), block_size>>>(out, att, qkv, B, T, NH);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's attention_forward (llmc/attention.cuh): permute qkv into per-head q, k, v; one batched
// cuBLAS GEMM for all (T, T) score matrices; a causal softmax kernel in place; a second batched GEMM
// for att·v; un-permute. Tensor cores for the products, but the full T x T squares are computed (twice
// the causal work), and the scores and probabilities make a round trip through memory: 3 passes over
// 201 MB.

// ----------------------------------------------------------------------------
// v3 is llmc's flash forward (llmc/attention_flash.cuh) as first written, fused on the tensor
// cores (mma.sync, llmc/mma.cuh). A block of 4 warps owns 64 queries of one head; each warp 16 of them.
// The warp keeps its queries' q fragments in registers, and walks the key tiles (64 keys) up to the
// diagonal:
//   S (16 x 64) = q·kᵀ by mma, scaled into log2 units; masked on the diagonal tile;
//   online softmax: the running row max grows, the previous output and sum are rescaled by
//   2^(old max - new max), and P = 2^(S - max) stays in registers;
//   O (16 x hs) += P·v by mma, P's accumulator fragments reused directly as the A operand.
// K and V tiles are double-buffered in shared memory with cp.async (the next tile loads while this one
// is used); V is read with ldmatrix.trans since it is stored key-major. att never exists: the bytes are
// qkv in and out out (plus the per-row log-sum-exp the backward needs), and only the causal half of the
// work is done. Blocks with the most key tiles (the last queries) are launched first, so the short ones
// fill in at the end. Any T (a partial last tile is padded with zero rows) and head sizes that are
// multiples of 8 up to 128 (compiled for the size rounded up to 16, the extra columns zero).

// ----------------------------------------------------------------------------
// v4 is llmc's flash forward today (FlashVersion::v4, the trainer's default): v3 with fewer
// instructions per score beside the mma's. v3 multiplies each score by the scale (log2 units) before
// the row max, then subtracts the max and calls exp2f, which wraps the MUFU instruction in a
// subnormal-range scaling (a compare, two multiplies). v4 takes the max over the raw scores and
// computes 2^(s·c - max·c) as one FFMA into ex2.approx: a multiply and the scaling fewer per score,
// 32 scores per lane per key tile. Should be faster where the forward is issue-bound (the H100's
// first run measured 146 TFLOP/s, a fifth of cuBLAS's rate). The error ex2.approx adds (order
// 2^-22 relative) is far under the bf16 P it feeds.

// ----------------------------------------------------------------------------
// v5: v4 held to 128 registers at head size 64 (__launch_bounds__(128, 4), llmc/attention_flash.cuh's
// flash_forward_min_blocks). On sm_90 ptxas gives v4 131 registers, which fits 3 blocks (12 warps) on
// an SM where shared memory (46 KB a block of 228 KB) would fit 4; v5 gets the fourth, with no spill
// (dev/cuda/kernel_report.py --all dev/cuda/bin/attention_forward shows both). Should be faster if the
// forward is latency-bound (each warp's tile step is a dependent chain: mma, max, shuffle, exp, mma),
// unless the 3 registers cost instructions. On sm_80 both land at 128 registers and shared memory
// keeps 3 blocks: the same kernel in effect.

// ----------------------------------------------------------------------------
// v6: v4's algorithm on Hopper's warpgroup product (wgmma, llmc/wgmma.cuh; sm_90a), head size 64. The
// block's 4 warps are one warpgroup, which issues each tile's two products as 4 wgmma's each instead of
// the warps' 64 mma.sync's: S (64 x 64) = q·kᵀ with both operands in shared memory (K-major), then
// O (64 x 64) += P·v with P from registers (mma.sync's A fragment, packed as v4 packs it) and v read
// N-major. The tiles sit in shared memory in the 128-byte swizzle wgmma reads (flash_wgmma.cuh), loaded
// by the same cp.async double buffer, no ldmatrix.
// The accumulator fragments are mma.sync's, so v4's mask, online softmax, log-sum-exp and store run
// unchanged on them. Each product waits for its result at once (no overlap of the softmax with the
// next product, no bulk-tensor copies, no producer warps: FlashAttention-3's further steps); a GPU
// times it against v4 before anything else is built on it. Other GPUs (and the emulator's check of
// head sizes other than 64: none here) run v4.

__global__ void __launch_bounds__(128) attention_forward_v6_kernel(const AttentionProblem p) {
    extern __shared__ unsigned char v6_shared[];
    unsigned char* tiles = wg_tiles(v6_shared);  // q, then two stages of k and of v
    unsigned char* q_tile = tiles;
    // stage s of k and of v (computed, not an array a run-time index would put in local memory)
    auto k_tile = [&](int stage) { return tiles + (1 + stage) * WG_TILE_BYTES; };
    auto v_tile = [&](int stage) { return tiles + (3 + stage) * WG_TILE_BYTES; };
    const int hs = HS, Tq = p.Tq, Tk = p.Tk;
    int q_index = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    int b = blockIdx.y / p.NH, h = blockIdx.y % p.NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX *q_head = p.q.head(b, h, hs), *k_head = p.k.head(b, h, hs), *v_head = p.v.head(b, h, hs);
    int last_tile = p.causal ? q_index : (Tk - 1) / FLASH_TILE;

    wg_load_tile(q_tile, q_head, p.q.row, q_index * FLASH_TILE, Tq);
    wg_load_tile(k_tile(0), k_head, p.k.row, 0, Tk);
    wg_load_tile(v_tile(0), v_head, p.v.row, 0, Tk);
    cp_async_commit();

    const float step = (1.0f / sqrtf((float)hs)) * FLASH_LOG2E;
    int query0 = q_index * FLASH_TILE + warp * 16 + lane / 4;  // the lane's rows: query0 and query0 + 8
    float o[HS / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};

    for (int j = 0; j <= last_tile; j++) {
        int stage = j % 2;
        if (j + 1 <= last_tile) {
            wg_load_tile(k_tile(1 - stage), k_head, p.k.row, (j + 1) * FLASH_TILE, Tk);
            wg_load_tile(v_tile(1 - stage), v_head, p.v.row, (j + 1) * FLASH_TILE, Tk);
        }
        cp_async_commit();
        cp_async_wait<1>();   // tile j (and q) have landed
        fence_proxy_async();  // what cp.async and the zero stores wrote, to the tensor cores' reads
        __syncthreads();

        float s[FLASH_TILE / 8][4];
        wgmma_fence();
        wg_abt(s, q_tile, k_tile(stage));
        wgmma_commit();
        wgmma_wait<0>();
        if (p.causal ? j == q_index : (j + 1) * FLASH_TILE > Tk) {
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
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 2));
            float new_max = fmaxf(row_max[r], tile_max[r]);
            alpha[r] = exp2_approx((row_max[r] - new_max) * step);
            row_max[r] = new_max;
            row_sum[r] *= alpha[r];
            max_log2[r] = new_max * step;
        }
#pragma unroll
        for (int nt = 0; nt < FLASH_TILE / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pe = exp2_approx(fmaf(s[nt][e], step, -max_log2[e / 2]));
                s[nt][e] = pe;
                row_sum[e / 2] += pe;
            }
        }
        uint32_t a[FLASH_TILE / 16][4];  // P as the A fragments of the k16 steps
        wg_pack_a(a, s);
#pragma unroll
        for (int nt = 0; nt < HS / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] *= alpha[e / 2];
        }
        wgmma_fence();  // o and a were written since the last wait
        wg_pb(o, a, v_tile(stage));
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();  // every thread is done with this stage before it is refilled
    }

    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
        inv_sum[r] = 1.0f / row_sum[r];
        int query = query0 + 8 * r;
        if (lane % 4 == 0 && query < Tq) {
            p.lse[(size_t)blockIdx.y * p.stat_row + query] = (row_max[r] * step + log2f(row_sum[r])) / FLASH_LOG2E;
        }
    }
    flash_store_rows<HS>(p.out.head(b, h, hs), p.out.row, o, query0, inv_sum, Tq, hs, lane);
}

// v6 where wgmma runs (an sm_90 GPU, or the emulator), else v4
void attention_forward_v6(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    if (C != NH * HS) fatal("attention_forward_v6 is written for head size %d, got C %d, NH %d", HS, C, NH);
    if (dev::device().prop.major != 9) {
        attention_flash_forward<FlashVersion::v4>(out, lse, qkv, B, T, NH, HS, 0);
        return;
    }
    static bool configured = false;
    size_t shared = 5 * WG_TILE_BYTES + 1024;  // the tiles and the slack to align them
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(attention_forward_v6_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
        configured = true;
    }
    dim3 grid(ceil_div_int(T, FLASH_TILE), B * NH);
    attention_forward_v6_kernel<<<grid, 128, shared>>>(attention_sequence(qkv, out, lse, B, T, NH, HS));
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

// Checks (and, outside the check mode, times) every version at sequence length T; 1 if a check failed.
static int check_and_time(int T) {
    const int B = dev::B, C = dev::C, NH = dev::NH;
    const size_t BTC = (size_t)B * T * C, att_elements = (size_t)B * NH * T * T;

    std::vector<float> qkv = dev::random_floatX(3 * BTC, -2.0f, 2.0f);
    std::vector<float> ref_out(BTC), ref_att(att_elements);
    attention_forward(ref_out.data(), ref_att.data(), qkv.data(), B, T, C, NH);

    // lse = ln(sum_j exp(s_j)) of each row's scaled scores, from the CPU's probabilities: s[m] - ln(att[m])
    // at the row's largest probability m (what the flash version saves instead of att)
    std::vector<float> ref_lse((size_t)B * NH * T);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                size_t row_index = ((size_t)b * NH + h) * T + t;
                const float* row = ref_att.data() + row_index * T;
                int m = (int)(std::max_element(row, row + t + 1) - row);
                const float* q = qkv.data() + ((size_t)b * T + t) * 3 * C + h * HS;
                const float* k = qkv.data() + ((size_t)b * T + m) * 3 * C + C + h * HS;
                float dot = 0.0f;
                for (int i = 0; i < HS; i++) dot += q[i] * k[i];
                ref_lse[row_index] = dot / sqrtf((float)HS) - logf(row[m]);
            }
        }
    }

    size_t saved_elements = std::max(attention_saved_elements(B, T, NH, false), attention_saved_elements(B, T, NH, true));
    size_t scratch_elements = std::max(attention_scratch_elements(B, T, C, NH, false),
                                       attention_scratch_elements(B, T, C, NH, true));
    dev::DeviceBuffer<floatX> d_qkv(3 * BTC), d_out(BTC), d_att(std::max(att_elements, saved_elements));
    dev::DeviceBuffer<floatX> d_scratch(scratch_elements);
    dev::upload(d_qkv, qkv);

    double flops = 4.0 * B * NH * HS * ((double)T * (T + 1) / 2);
    double bytes = 4.0 * BTC * sizeof(floatX);  // qkv in, out out: the floor of a version that skips att
    dev::Report report = dev::make_report("attention_forward, T " + std::to_string(T), bytes, flops);
    bool att_written = false;  // set by each launch: does this version store att (else the lse, in d_att)?
    std::vector<dev::Version> versions = {
        {"v1 thread per query row, fp32 units", {64, 128, 256},
         [&](int bs) {
             att_written = true;
             attention_forward_v1(d_out.ptr, d_att.ptr, d_qkv.ptr, B, T, C, NH, bs);
         }},
        {"v2 llmc -fa 0: cuBLAS + softmax", {0},
         [&](int) {
             att_written = true;
             attention_forward(d_out.ptr, d_att.ptr, d_qkv.ptr, d_scratch.ptr, B, T, C, NH, false, 0);
         }},
        {"v3 flash: mma.sync, online softmax", {0},
         [&](int) {
             att_written = false;
             attention_flash_forward<FlashVersion::v3>(d_out.ptr, reinterpret_cast<float*>(d_att.ptr), d_qkv.ptr, B,
                                                       T, NH, C / NH, 0);
         }},
        {"v4 llmc flash: v3, scale in the FFMA, ex2.approx", {0},
         [&](int) {
             att_written = false;
             attention_forward(d_out.ptr, d_att.ptr, d_qkv.ptr, d_scratch.ptr, B, T, C, NH, true, 0);
         }},
        {"v5 flash: v4 at 128 registers, 4 blocks/SM", {0},
         [&](int) {
             att_written = false;
             attention_flash_forward<FlashVersion::v5>(d_out.ptr, reinterpret_cast<float*>(d_att.ptr), d_qkv.ptr, B,
                                                       T, NH, C / NH, 0);
         }},
        {dev::device().prop.major == 9 ? "v6 flash: v4 on wgmma (sm_90a)" : "v6 flash: wgmma is sm_90's; v4 here", {0},
         [&](int) {
             att_written = false;
             attention_forward_v6(d_out.ptr, reinterpret_cast<float*>(d_att.ptr), d_qkv.ptr, B, T, C, NH);
         }},
    };
    dev::run_versions(&report, versions,
                      [&] {
                          dev::poison(d_out);
                          dev::poison(d_att);
                      },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "out", dev::download(d_out), ref_out, dev::TOL_ATTENTION);
                          if (att_written) {
                              std::vector<float> att = dev::download(d_att);
                              dev::check_tensor(&result, "att", att.data(), ref_att.data(), att_elements,
                                                dev::TOL_ATTENTION);
                          } else {
                              std::vector<float> lse(ref_lse.size());
                              cudaCheck(cudaMemcpy(lse.data(), d_att.ptr, lse.size() * sizeof(float),
                                                   cudaMemcpyDeviceToHost));
                              dev::check_tensor(&result, "lse", lse.data(), ref_lse.data(), lse.size(),
                                                dev::TOL_REDUCTION);
                          }
                          return result;
                      });
    return dev::finish(report);
}

int main(int argc, char** argv) {
    dev::device_init("attention_forward", argc, argv);
    cublas_setup();
    int failed = dev::check_partial_only() ? 0 : check_and_time(dev::T);
    // the check mode also runs a length whose last 64-query tile is partial (T = 300: 4 whole tiles
    // and 44 rows), so the flash kernels' padded rows and masked tile edges are checked too
    if (dev::check_only) failed |= check_and_time(dev::T - 20);
    cublas_teardown();
    return failed;
}
