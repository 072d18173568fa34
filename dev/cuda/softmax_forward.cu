// Attention's causal softmax, version by version, in place over the scores of every head:
//   att[b,h,t,t2] = softmax over t2 <= t of (scale * scores[b,h,t,t2]),  0 for t2 > t,  scale = 1/sqrt(hs)
// for (B, NH, T, T) = (8, 12, 1024, 1024). Checked against the probabilities that attention_forward()
// of llmc/attention.h computes from the same q and k, and timed.
//
// The scores are made once on the host (q·kᵀ per head, the dot products attention_forward() takes) and
// uploaded in bf16; above the diagonal they are set to NaN, so a version that reads there, or does not
// overwrite it with zeros, fails the check. The rows are restored before every run (in place).
//
// The two numbers: read the lower triangle (T(T+1)/2 per head, 101 MB), write every row (201 MB):
// 302 MB, ~100 us at 3 TB/s. A few flops and one exp per element: memory bound.
//
//   make -C dev/cuda bin/softmax_forward && dev/cuda/bin/softmax_forward
#include "harness.cuh"

#include "../../llmc/attention.cuh"
#include "../../llmc/attention.h"

// ----------------------------------------------------------------------------
// v1: one thread per row, three passes (max, sum of exponentials, write), the CPU loop as it is.
// Neighbouring threads are a row (2 KB) apart: no coalescing at all.

__global__ void softmax_forward_v1_kernel(floatX* att, float scale, int num_rows, int T) {
    int row_index = blockIdx.x * blockDim.x + threadIdx.x;
    if (row_index >= num_rows) return;
    int t = row_index % T;
    floatX* row = att + (size_t)row_index * T;
    float max_score = -INFINITY;
    for (int t2 = 0; t2 <= t; t2++) max_score = fmaxf(max_score, scale * (float)row[t2]);
    float sum = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) sum += expf(scale * (float)row[t2] - max_score);
    float inv_sum = 1.0f / sum;
    for (int t2 = 0; t2 < T; t2++) {
        row[t2] = t2 <= t ? (floatX)(expf(scale * (float)row[t2] - max_score) * inv_sum) : (floatX)0.0f;
    }
}

void softmax_forward_v1(floatX* att, float scale, int num_rows, int T, int block_size) {
    softmax_forward_v1_kernel<<<ceil_div_int(num_rows, block_size), block_size>>>(att, scale, num_rows, T);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's attention_softmax_forward_kernel (llmc/attention.cuh), launched here with each block
// size: one warp per row, lanes striding by one element (coalesced, 2 bytes per load), three passes
// over the row with warp-shuffle reductions.

void softmax_forward_v2(floatX* att, float scale, int num_rows, int T, int block_size) {
    attention_softmax_forward_kernel<<<ceil_div_int(num_rows, block_size / WARP_SIZE), block_size>>>(att, scale,
                                                                                                   num_rows, T);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v3: v2 with 16-byte loads and an online max: one pass keeps a running (max, sum of exp(x - max)) per
// lane, rescaling the sum when the max grows, then the lanes' pairs are merged. Two passes over the row
// (statistics, write) instead of three, each with an eighth of the load instructions. Chunks wholly
// above the diagonal are written as zeros without being read.

__device__ inline void online_softmax_merge(float* max_value, float* sum, float other_max, float other_sum) {
    float new_max = fmaxf(*max_value, other_max);
    float a = *max_value == -INFINITY ? 0.0f : *sum * expf(*max_value - new_max);
    float b = other_max == -INFINITY ? 0.0f : other_sum * expf(other_max - new_max);
    *max_value = new_max;
    *sum = a + b;
}

__global__ void softmax_forward_v3_kernel(floatX* att, float scale, int num_rows, int T) {
    int row_index = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row_index >= num_rows) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t = row_index % T;
    floatX* row = att + (size_t)row_index * T;
    float max_value = -INFINITY, sum = 0.0f;
    for (int c = lane * x128::size; c <= t; c += WARP_SIZE * x128::size) {
        x128 x = load128(row + c);
        float chunk_max = -INFINITY;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (c + k <= t) chunk_max = fmaxf(chunk_max, scale * (float)x[k]);
        }
        float chunk_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (c + k <= t) chunk_sum += expf(scale * (float)x[k] - chunk_max);
        }
        online_softmax_merge(&max_value, &sum, chunk_max, chunk_sum);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        float other_max = __shfl_xor_sync(0xffffffff, max_value, offset);
        float other_sum = __shfl_xor_sync(0xffffffff, sum, offset);
        online_softmax_merge(&max_value, &sum, other_max, other_sum);
    }
    float inv_sum = 1.0f / sum;
    for (int c = lane * x128::size; c < T; c += WARP_SIZE * x128::size) {
        x128 y = x128::zeros();
        if (c <= t) {
            x128 x = load128(row + c);
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                if (c + k <= t) y[k] = (floatX)(expf(scale * (float)x[k] - max_value) * inv_sum);
            }
        }
        store128cs(row + c, y);
    }
}

void softmax_forward_v3(floatX* att, float scale, int num_rows, int T, int block_size) {
    if (T % x128::size != 0) fatal("softmax_forward_v3 needs T divisible by %d, got %d", x128::size, T);
    softmax_forward_v3_kernel<<<ceil_div_int(num_rows, block_size / WARP_SIZE), block_size>>>(att, scale, num_rows,
                                                                                            T);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v4: v3 with the row held in registers. T <= 1024 is at most 4 chunks of 16 bytes per lane; all the
// chunks below the diagonal are loaded before the first use, so the row crosses the memory system
// once and each lane has up to 4 loads in flight. The statistics then come from registers; the max is
// taken first (no rescaling needed when all values are at hand).

constexpr int SOFTMAX_MAX_CHUNKS = 4;  // 16-byte chunks per lane; T <= 32 * 8 * 4 = 1024

__global__ void softmax_forward_v4_kernel(floatX* att, float scale, int num_rows, int T) {
    int row_index = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row_index >= num_rows) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t = row_index % T;
    floatX* row = att + (size_t)row_index * T;
    x128 x[SOFTMAX_MAX_CHUNKS];
#pragma unroll
    for (int j = 0; j < SOFTMAX_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c <= t && c < T) x[j] = load128(row + c);
    }
    float max_value = -INFINITY;
#pragma unroll
    for (int j = 0; j < SOFTMAX_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c > t || c >= T) continue;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (c + k <= t) max_value = fmaxf(max_value, scale * (float)x[j][k]);
        }
    }
    max_value = warp_reduce_max(max_value);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < SOFTMAX_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c > t || c >= T) continue;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (c + k <= t) sum += expf(scale * (float)x[j][k] - max_value);
        }
    }
    float inv_sum = 1.0f / warp_reduce_sum(sum);
#pragma unroll
    for (int j = 0; j < SOFTMAX_MAX_CHUNKS; j++) {
        int c = (j * WARP_SIZE + lane) * x128::size;
        if (c >= T) continue;
        x128 y = x128::zeros();
        if (c <= t) {
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                if (c + k <= t) y[k] = (floatX)(expf(scale * (float)x[j][k] - max_value) * inv_sum);
            }
        }
        store128cs(row + c, y);
    }
}

void softmax_forward_v4(floatX* att, float scale, int num_rows, int T, int block_size) {
    if (T % x128::size != 0 || T > SOFTMAX_MAX_CHUNKS * WARP_SIZE * x128::size) {
        fatal("softmax_forward_v4 needs T divisible by %d and at most %d, got %d", x128::size,
              SOFTMAX_MAX_CHUNKS * WARP_SIZE * x128::size, T);
    }
    softmax_forward_v4_kernel<<<ceil_div_int(num_rows, block_size / WARP_SIZE), block_size>>>(att, scale, num_rows,
                                                                                            T);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("softmax_forward", argc, argv);
    const int B = dev::B, T = dev::T, C = dev::C, NH = dev::NH, hs = C / NH;
    const size_t square = (size_t)T * T, elements = (size_t)B * NH * square;
    const int rows = B * NH * T;
    const float scale = 1.0f / sqrtf((float)hs);

    std::vector<float> qkv = dev::random_floatX((size_t)B * T * 3 * C, -2.0f, 2.0f);
    std::vector<float> out((size_t)B * T * C), ref_att(elements);
    attention_forward(out.data(), ref_att.data(), qkv.data(), B, T, C, NH);  // the reference probabilities

    // the unscaled scores q·kᵀ per (b, h), which the kernels take as input; NaN above the diagonal
    std::vector<float> scores(elements, 0.0f);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* q = qkv.data() + (size_t)b * T * 3 * C + h * hs;
            const float* k = q + C;
            float* s = scores.data() + ((size_t)b * NH + h) * square;
            for (int t = 0; t < T; t++) {
                for (int t2 = 0; t2 <= t; t2++) {
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) dot += q[(size_t)t * 3 * C + i] * k[(size_t)t2 * 3 * C + i];
                    s[(size_t)t * T + t2] = dot;
                }
                for (int t2 = t + 1; t2 < T; t2++) s[(size_t)t * T + t2] = NAN;
            }
        }
    }

    dev::DeviceBuffer<floatX> d_scores(elements), d_att(elements);
    dev::upload(d_scores, scores);

    double bytes = ((double)B * NH * T * (T + 1) / 2 + (double)elements) * sizeof(floatX);
    dev::Report report = dev::make_report("softmax_forward", bytes, 0.0);
    const std::vector<int> blocks = {64, 128, 256, 512, 1024};
    std::vector<dev::Version> versions = {
        {"v1 one thread per row", {64, 128, 256}, [&](int bs) { softmax_forward_v1(d_att.ptr, scale, rows, T, bs); }},
        {"v2 llmc: warp per row, 3 passes", blocks, [&](int bs) { softmax_forward_v2(d_att.ptr, scale, rows, T, bs); }},
        {"v3 16-byte loads + online max: 2 passes", blocks,
         [&](int bs) { softmax_forward_v3(d_att.ptr, scale, rows, T, bs); }},
        {"v4 row held in registers: 1 pass", blocks, [&](int bs) { softmax_forward_v4(d_att.ptr, scale, rows, T, bs); }},
    };
    dev::run_versions(&report, versions, [&] { dev::copy(d_att, d_scores); },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "att", dev::download(d_att), ref_att, dev::TOL_ATTENTION);
                          return result;
                      });
    return dev::finish(report);
}
