// Causal self-attention forward, version by version, for (B, T, C, NH) = (8, 1024, 768, 12), head size 64:
//   att = softmax_causal(q·kᵀ / sqrt(hs)) per head,  out = att·v,  with q, k, v side by side in qkv (B, T, 3C).
// Checked against attention_forward() of llmc/attention.h (out always; att where a version stores it)
// and timed.
//
// The two numbers: the useful (causal) work is 2 products of T(T+1)/2 x hs per head: 12.9 GFLOP, ~16 us
// at 790 TFLOP/s. Storing att (B, NH, T, T) in bf16 is 201 MB, ~70 us at 3 TB/s; qkv and out are 50 MB.
// So a version that materializes att is bound by that tensor, and one that never writes it (v3, as in
// flash attention) can be bound by the matrix units. The rate below counts the causal flops only.
//
//   make -C dev/cuda bin/attention_forward && dev/cuda/bin/attention_forward
#include "harness.cuh"
#include "mma.cuh"

#include "../../llmc/attention.cuh"
#include "../../llmc/attention.h"

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
// v3: fused, flash-attention style, on the tensor cores (mma.sync, see mma.cuh). A block of 4 warps
// owns 64 queries of one head; each warp 16 of them. The warp keeps its queries' q fragments in
// registers, and walks the key tiles (64 keys) up to the diagonal:
//   S (16 x 64) = q·kᵀ by mma, scaled into log2 units; masked on the diagonal tile;
//   online softmax: the running row max grows, the previous output and sum are rescaled by
//   2^(old max - new max), and P = 2^(S - max) stays in registers;
//   O (16 x 64) += P·v by mma, P's accumulator fragments reused directly as the A operand.
// K and V tiles are double-buffered in shared memory with cp.async (the next tile loads while this one
// is used); V is read with ldmatrix.trans since it is stored key-major. att never exists: the bytes are
// qkv in and out out, and only the causal half of the work is done. Blocks with the most key tiles
// (the last queries) are launched first, so the short ones fill in at the end.

constexpr int FA_BR = 64;  // queries per block
constexpr int FA_BC = 64;  // keys per tile
constexpr int FA_THREADS = 128;
constexpr int FA_LDS = HS + 8;  // shared row stride in bf16: 144 bytes, so ldmatrix rows hit distinct banks

__global__ void __launch_bounds__(FA_THREADS) attention_forward_v3_kernel(floatX* out, const floatX* qkv, int T,
                                                                           int NH) {
    __shared__ __align__(16) floatX q_shared[FA_BR][FA_LDS];
    __shared__ __align__(16) floatX k_shared[2][FA_BC][FA_LDS];
    __shared__ __align__(16) floatX v_shared[2][FA_BC][FA_LDS];
    int C = NH * HS;
    int q_tile = gridDim.x - 1 - blockIdx.x;  // longest first
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int q_start = q_tile * FA_BR;
    const floatX* head = qkv + (size_t)b * T * 3 * C + h * HS;  // q of (b, t = 0, h); k at + C, v at + 2C

    // 64 rows x 64 values = 512 chunks of 16 bytes, 4 per thread
    auto load_rows = [&](floatX(*dst)[FA_LDS], int t0, int offset) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int chunk = threadIdx.x + i * FA_THREADS;
            int r = chunk / 8, col = (chunk % 8) * 8;
            cp_async16(&dst[r][col], head + (size_t)(t0 + r) * 3 * C + offset + col);
        }
    };
    int num_tiles = q_tile + 1;  // key tiles 0 .. q_tile (FA_BR == FA_BC)
    load_rows(q_shared, q_start, 0);
    load_rows(k_shared[0], 0, C);
    load_rows(v_shared[0], 0, 2 * C);
    cp_async_commit();

    const float scale_log2 = rsqrtf((float)HS) * 1.4426950408889634f;  // 1/sqrt(hs) * log2(e)
    int query0 = q_start + warp * 16 + lane / 4;  // the lane's rows: query0 and query0 + 8
    uint32_t q_frag[HS / 16][4];
    float o[HS / 8][4] = {};
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};  // this lane's share; the 4 lanes of a row are added at the end

    for (int j = 0; j < num_tiles; j++) {
        if (j + 1 < num_tiles) {
            load_rows(k_shared[(j + 1) % 2], (j + 1) * FA_BC, C);
            load_rows(v_shared[(j + 1) % 2], (j + 1) * FA_BC, 2 * C);
        }
        cp_async_commit();
        cp_async_wait<1>();  // everything but the group just committed: tile j (and q) have landed
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int kc = 0; kc < HS / 16; kc++) {
                ldmatrix_x4(q_frag[kc], &q_shared[warp * 16 + lane % 16][kc * 16 + (lane / 16) * 8]);
            }
        }
        int stage = j % 2;

        // S = q·kᵀ: 8 tiles of 8 keys
        float s[FA_BC / 8][4] = {};
#pragma unroll
        for (int kc = 0; kc < HS / 16; kc++) {
#pragma unroll
            for (int pair = 0; pair < FA_BC / 16; pair++) {
                uint32_t r[4];
                int key = pair * 16 + lane % 8 + (lane / 16) * 8;
                int col = kc * 16 + ((lane / 8) % 2) * 8;
                ldmatrix_x4(r, &k_shared[stage][key][col]);
                uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma_bf16_16816(s[2 * pair], q_frag[kc], b0);
                mma_bf16_16816(s[2 * pair + 1], q_frag[kc], b1);
            }
        }

        // scale, mask the diagonal tile, and the online softmax update
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < FA_BC / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = j * FA_BC + nt * 8 + (lane % 4) * 2 + e % 2;
                float x = s[nt][e] * scale_log2;
                if (j == q_tile && key > query0 + 8 * (e / 2)) x = -INFINITY;
                s[nt][e] = x;
                tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            // the 4 lanes holding a row are lanes 4g .. 4g+3
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 2));
            float new_max = fmaxf(row_max[r], tile_max[r]);  // finite: every row has a key <= itself here
            alpha[r] = exp2f(row_max[r] - new_max);           // 0 on the first tile
            row_max[r] = new_max;
            row_sum[r] *= alpha[r];
        }
#pragma unroll
        for (int nt = 0; nt < FA_BC / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] - row_max[e / 2]);
                s[nt][e] = p;
                row_sum[e / 2] += p;
            }
        }
#pragma unroll
        for (int nt = 0; nt < HS / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] *= alpha[e / 2];
        }

        // O += P·v: P's fragments for keys 16kc..16kc+15 are S tiles 2kc and 2kc+1
#pragma unroll
        for (int kc = 0; kc < FA_BC / 16; kc++) {
            uint32_t a[4] = {pack_bf16x2(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2(s[2 * kc][2], s[2 * kc][3]),
                             pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                             pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int pair = 0; pair < HS / 16; pair++) {
                uint32_t r[4];
                int key = kc * 16 + lane % 8 + ((lane / 8) % 2) * 8;
                int col = pair * 16 + (lane / 16) * 8;
                ldmatrix_x4_trans(r, &v_shared[stage][key][col]);
                uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma_bf16_16816(o[2 * pair], a, b0);
                mma_bf16_16816(o[2 * pair + 1], a, b1);
            }
        }
        __syncthreads();  // all warps are done with this stage before it is refilled
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
    }
    float inv0 = 1.0f / row_sum[0], inv1 = 1.0f / row_sum[1];
    floatX* out0 = out + ((size_t)b * T + query0) * C + h * HS;
    floatX* out1 = out0 + (size_t)8 * C;
#pragma unroll
    for (int nt = 0; nt < HS / 8; nt++) {
        int col = nt * 8 + (lane % 4) * 2;
        *reinterpret_cast<__nv_bfloat162*>(out0 + col) = __floats2bfloat162_rn(o[nt][0] * inv0, o[nt][1] * inv0);
        *reinterpret_cast<__nv_bfloat162*>(out1 + col) = __floats2bfloat162_rn(o[nt][2] * inv1, o[nt][3] * inv1);
    }
}

void attention_forward_v3(floatX* out, const floatX* qkv, int B, int T, int C, int NH) {
    if (C != NH * HS || T % FA_BR != 0) {
        fatal("attention_forward_v3 needs head size %d and T divisible by %d (C %d, NH %d, T %d)", HS, FA_BR, C, NH, T);
    }
    dim3 grid(T / FA_BR, B * NH);
    attention_forward_v3_kernel<<<grid, FA_THREADS>>>(out, qkv, T, NH);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("attention_forward", argc, argv);
    cublas_setup();
    const int B = dev::B, T = dev::T, C = dev::C, NH = dev::NH;
    const size_t BTC = (size_t)B * T * C, att_elements = (size_t)B * NH * T * T;

    std::vector<float> qkv = dev::random_floatX(3 * BTC, -2.0f, 2.0f);
    std::vector<float> ref_out(BTC), ref_att(att_elements);
    attention_forward(ref_out.data(), ref_att.data(), qkv.data(), B, T, C, NH);

    dev::DeviceBuffer<floatX> d_qkv(3 * BTC), d_out(BTC), d_att(std::max(att_elements, attention_saved_elements(B, T, NH)));
    dev::DeviceBuffer<floatX> d_scratch(attention_scratch_elements(B, T, C, NH));
    dev::upload(d_qkv, qkv);

    double flops = 4.0 * B * NH * HS * ((double)T * (T + 1) / 2);
    double bytes = 4.0 * BTC * sizeof(floatX);  // qkv in, out out: the floor of a version that skips att
    dev::Report report = dev::make_report("attention_forward", bytes, flops);
    bool att_written = false;  // set by each launch: does this version store att?
    std::vector<dev::Version> versions = {
        {"v1 thread per query row, fp32 units", {64, 128, 256},
         [&](int bs) {
             att_written = true;
             attention_forward_v1(d_out.ptr, d_att.ptr, d_qkv.ptr, B, T, C, NH, bs);
         }},
        {"v2 llmc: cuBLAS + softmax kernel", {0},
         [&](int) {
             att_written = true;
             attention_forward(d_out.ptr, d_att.ptr, d_qkv.ptr, d_scratch.ptr, B, T, C, NH, 0);
         }},
        {"v3 flash: fused, mma.sync, online softmax", {0},
         [&](int) {
             att_written = false;
             attention_forward_v3(d_out.ptr, d_qkv.ptr, B, T, C, NH);
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
                          }
                          return result;
                      });
    cublas_teardown();
    return dev::finish(report);
}
