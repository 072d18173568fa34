// The classifier's softmax + cross-entropy + logits gradient, version by version, over (N, Vp) =
// (8192, 50304) logits of which the first V = 50257 columns are real:
//   losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]
//   dlogits[n, v] = (softmax(logits[n, :V])[v] - [v == target[n]]) * dloss  (v < V),  0 in the padding
// with dlogits written over the logits, as the trainer does. Checked against crossentropy_forward() and
// crossentropy_softmax_backward() of llmc/crossentropy.h and timed.
//
// The logits are restored before every run. Their padding columns are NaN, so a version that reads
// them, or leaves them unwritten, fails the check.
//
// The two numbers: read the logits once and write the gradient once: 2 x 824 MB = 1.65 GB, ~550 us at
// 3 TB/s: the largest memory-bound op of the step. An exp per element. The row (100 KB) is too big for
// one warp and fits one block's shared memory, which frames the versions.
//
//   make -C dev/cuda bin/fused_classifier && dev/cuda/bin/fused_classifier
#include "harness.cuh"

#include "../../llmc/classifier.cuh"
#include "../../llmc/crossentropy.h"

// ----------------------------------------------------------------------------
// v1: unfused, the forward and backward as the CPU has them. Kernel 1, a block per row: the max, then
// the sum of exponentials (two passes over the row, 2-byte loads), then the loss, saving max and sum.
// Kernel 2, a thread per element: the gradient from the saved statistics. Kernel 2 reads the logits
// again after the whole tensor has gone by, so from memory: 3 passes over 824 MB instead of 2.

__global__ void classifier_v1_stats_kernel(float* row_max, float* row_sum, float* losses, const floatX* logits,
                                           const int* targets, int V, int Vp) {
    int n = blockIdx.x;
    const floatX* row = logits + (size_t)n * Vp;
    float thread_max = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) thread_max = fmaxf(thread_max, (float)row[v]);
    float m = block_reduce_max(thread_max);
    float thread_sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) thread_sum += expf((float)row[v] - m);
    float s = block_reduce_sum(thread_sum);
    if (threadIdx.x == 0) {
        row_max[n] = m;
        row_sum[n] = s;
        losses[n] = logf(s) + m - (float)row[targets[n]];
    }
}

__global__ void classifier_v1_dlogits_kernel(floatX* logits, const float* row_max, const float* row_sum,
                                             const int* targets, float dloss, int N, int V, int Vp) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * Vp) return;
    int n = idx / Vp, v = idx % Vp;
    float grad = 0.0f;
    if (v < V) grad = (expf((float)logits[idx] - row_max[n]) / row_sum[n] - (v == targets[n] ? 1.0f : 0.0f)) * dloss;
    logits[idx] = (floatX)grad;
}

void fused_classifier_v1(floatX* logits, float* losses, float* stats /* 2N */, const int* targets, float dloss, int N,
                         int V, int Vp, int block_size) {
    classifier_v1_stats_kernel<<<N, block_size>>>(stats, stats + N, losses, logits, targets, V, Vp);
    cudaCheckLaunch();
    classifier_v1_dlogits_kernel<<<ceil_div_int((long)N * Vp, block_size), block_size>>>(logits, stats, stats + N,
                                                                                       targets, dloss, N, V, Vp);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's fused_classifier (llmc/classifier.cuh): one block of 1024 threads per row; one pass
// keeps an online (max, sum) per thread over 16-byte chunks, a block reduction merges them and gives
// the loss, a second pass writes the gradient. The second pass re-reads a row the block read
// microseconds earlier: with ~2 blocks per SM, ~26 MB of rows are in flight, under the 50 MB L2, so
// that re-read should come from L2 and the tensor crosses DRAM twice.

// ----------------------------------------------------------------------------
// v3: v2 with the row staged in shared memory (Vp bf16 = 98 KB, allowed after raising the block's
// dynamic shared-memory limit). The row is read from global memory exactly once, the statistics and the
// gradient then read shared memory. Whether that beats v2 depends on whether v2's re-read really hit
// L2, and on what the 98 KB costs in occupancy (2 blocks per SM at most): the measurement decides.

__global__ void fused_classifier_v3_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V,
                                           int Vp) {
    extern __shared__ __align__(16) unsigned char classifier_shared[];
    floatX* cached = reinterpret_cast<floatX*>(classifier_shared);  // (Vp)
    int n = blockIdx.x;
    floatX* row = logits + (size_t)n * Vp;
    float thread_max = -INFINITY;
    for (int v = threadIdx.x * x128::size; v < Vp; v += blockDim.x * x128::size) {
        x128 x = load128cs(row + v);
        store128(cached + v, x);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (v + k < V) thread_max = fmaxf(thread_max, (float)x[k]);
        }
    }
    float row_max = block_reduce_max(thread_max);  // its barrier also publishes `cached` to the block
    float thread_sum = 0.0f;
    for (int v = threadIdx.x * x128::size; v < V; v += blockDim.x * x128::size) {
        x128 x = load128(cached + v);
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            if (v + k < V) thread_sum += expf((float)x[k] - row_max);
        }
    }
    float row_sum = block_reduce_sum(thread_sum);
    int target = targets[n];
    if (threadIdx.x == 0) losses[n] = logf(row_sum) + row_max - (float)cached[target];
    float inv_sum = 1.0f / row_sum;
    for (int v = threadIdx.x * x128::size; v < Vp; v += blockDim.x * x128::size) {
        x128 x = load128(cached + v);
        x128 d;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            int col = v + k;
            float grad = 0.0f;
            if (col < V) grad = (expf((float)x[k] - row_max) * inv_sum - (col == target ? 1.0f : 0.0f)) * dloss;
            d[k] = (floatX)grad;
        }
        store128cs(row + v, d);
    }
}

void fused_classifier_v3(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                         int block_size) {
    if (Vp % x128::size != 0) fatal("fused_classifier_v3 needs Vp divisible by %d, got %d", x128::size, Vp);
    size_t shared_bytes = (size_t)Vp * sizeof(floatX);
    static size_t configured = 0;
    if (configured < shared_bytes) {
        cudaCheck(cudaFuncSetAttribute(fused_classifier_v3_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared_bytes));
        configured = shared_bytes;
    }
    fused_classifier_v3_kernel<<<N, block_size, shared_bytes>>>(logits, losses, targets, dloss, V, Vp);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("fused_classifier", argc, argv);
    const int N = dev::B * dev::T, V = dev::V, Vp = dev::Vp;
    const size_t elements = (size_t)N * Vp;
    const float dloss = 1.0f / N;

    std::vector<float> logits = dev::random_floatX(elements, -4.0f, 4.0f);
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int v = V; v < Vp; v++) logits[(size_t)n * Vp + v] = NAN;  // the padding: never read, always zeroed
    }
    std::vector<int> targets = dev::random_tokens(N, V);
    std::vector<float> ref_losses(N), ref_dlogits(elements);
    crossentropy_forward(ref_losses.data(), logits.data(), targets.data(), N, V, Vp);
    crossentropy_softmax_backward(ref_dlogits.data(), logits.data(), targets.data(), dloss, N, V, Vp);

    dev::DeviceBuffer<floatX> d_logits0(elements), d_logits(elements);
    dev::DeviceBuffer<float> d_losses(N), d_stats(2 * (size_t)N);
    dev::DeviceBuffer<int> d_targets(N);
    dev::upload(d_logits0, logits);
    logits.clear();
    logits.shrink_to_fit();
    dev::upload(d_targets, targets);

    double bytes = 2.0 * elements * sizeof(floatX) + (double)N * (sizeof(int) + sizeof(float));
    dev::Report report = dev::make_report("fused_classifier", bytes, 0.0);
    std::vector<dev::Version> versions = {
        {"v1 unfused: stats kernel + gradient kernel", {256, 512, 1024},
         [&](int bs) {
             fused_classifier_v1(d_logits.ptr, d_losses.ptr, d_stats.ptr, d_targets.ptr, dloss, N, V, Vp, bs);
         }},
        {"v2 llmc: block per row, online max, 2 passes", {0},
         [&](int) { fused_classifier(d_logits.ptr, d_losses.ptr, d_targets.ptr, dloss, N, V, Vp, true, 0); }},
        {"v3 v2 + row staged in shared memory", {256, 512, 1024},
         [&](int bs) { fused_classifier_v3(d_logits.ptr, d_losses.ptr, d_targets.ptr, dloss, N, V, Vp, bs); }},
    };
    dev::run_versions(&report, versions,
                      [&] {
                          dev::copy(d_logits, d_logits0);
                          dev::poison(d_losses);
                      },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "losses", dev::download(d_losses), ref_losses, dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "dlogits", dev::download(d_logits), ref_dlogits,
                                            dev::TOL_ELEMENTWISE);
                          return result;
                      });
    return dev::finish(report);
}
