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
    int failed = check_and_time(dev::T);
    // the check mode also runs a length whose last 64-query tile is partial (T = 300: 4 whole tiles
    // and 44 rows), so the flash kernels' padded rows and masked tile edges are checked too
    if (dev::check_only) failed |= check_and_time(dev::T - 20);
    cublas_teardown();
    return failed;
}
