// Causal self-attention backward, version by version, for (B, T, C, NH) = (8, 1024, 768, 12), head size 64:
//   datt = dout·vᵀ,  dv = attᵀ·dout,  dscore = att * (datt - rowsum(att * datt)) / sqrt(hs),
//   dq = dscore·k,  dk = dscoreᵀ·q,  all per head, into dqkv (B, T, 3C).
// Inputs: qkv and dout random; att (B, NH, T, T) from the CPU forward, stored in bf16 as the GPU forward
// saves it. Checked against attention_backward() of llmc/attention.h (which adds into dqkv: it starts
// from zero, so both compute the same overwrite) and timed.
//
// The two numbers: four products of T(T+1)/2 x hs per head (causal): 25.8 GFLOP, ~33 us at 790 TFLOP/s.
// Bytes: att read (201 MB) and, for versions that materialize it, datt written and read again (402 MB);
// qkv, dout, dqkv: 75 MB. Versions that keep the (T, T) matrices in memory are bound by those bytes.
//
//   make -C dev/cuda bin/attention_backward && dev/cuda/bin/attention_backward
#include "harness.cuh"

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
// A fused backward that recomputes att per tile from q, k and the forward's row statistics
// (FlashAttention-2's) is the next lesson for this program.

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

int main() {
    dev::device_init("attention_backward");
    cublas_setup();
    const int B = dev::B, T = dev::T, C = dev::C, NH = dev::NH;
    const size_t BTC = (size_t)B * T * C, att_elements = (size_t)B * NH * T * T;

    std::vector<float> qkv = dev::random_floatX(3 * BTC, -2.0f, 2.0f);
    std::vector<float> dout = dev::random_floatX(BTC, -1.0f, 1.0f);
    std::vector<float> out(BTC), att(att_elements);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    for (float& a : att) a = dev::round_to_floatX(a);  // as the GPU forward stores it
    std::vector<float> ref_dqkv(3 * BTC, 0.0f);         // the CPU op adds into dqkv: start at zero
    attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

    dev::DeviceBuffer<floatX> d_qkv(3 * BTC), d_dout(BTC), d_dqkv(3 * BTC);
    dev::DeviceBuffer<floatX> d_att(std::max(att_elements, attention_saved_elements(B, T, NH)));
    dev::DeviceBuffer<floatX> d_scratch(attention_scratch_elements(B, T, C, NH));
    dev::DeviceBuffer<float> d_dscore(att_elements);
    dev::upload(d_qkv, qkv);
    dev::upload(d_dout, dout);
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
