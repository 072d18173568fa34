// Encoder backward, version by version, adding into the embedding gradients:
//   dwte[inp[b,t], :] += dout[b,t,:]   (a scatter: a token that occurs k times gets k rows added)
//   dwpe[t, :] += sum over b of dout[b,t,:]
// for (B, T, C) = (8, 1024, 768) with token ids drawn with text's Zipf skew, so the commonest id
// occurs ~500 times in the batch and most occur once. Checked against encoder_backward() of
// llmc/encoder.h and timed.
//
// Both outputs are added into, so they start each run from random values instead of poison; a row a
// version forgot is off by its whole increment.
//
// The two numbers: read dout (12.6 MB) and the ids, read and write the U distinct rows of dwte that
// occur (U x 1.5 KB x 2) and all of dwpe (1.6 MB x 2): ~25 MB, ~8 us at 3 TB/s. The difficulty is not
// bandwidth but the scatter: many positions add into one row, and doing that deterministically.
//
// Host work (grouping the positions by token) is done once per batch when the trainer uploads the
// inputs, and is not timed here.
//
//   make -C dev/cuda bin/encoder_backward && dev/cuda/bin/encoder_backward
#include <algorithm>
#include <numeric>

#include "harness.cuh"

#include "../../llmc/encoder.cuh"
#include "../../llmc/encoder.h"

// ----------------------------------------------------------------------------
// v1: atomics. One thread per 8 channels of one position adds them with fp32 atomicAdd into an fp32
// copy of the gradients (zeroed first), then a pass adds that copy into dwte and dwpe. Simple, but: the
// order of the atomic adds changes run to run (last-bit differences), bf16 atomics would lose
// precision on common tokens (hence fp32), and the fp32 copy has to span the whole (Vp, C) table: the
// zeroing and the final pass touch all 50304 rows, though only ~3000 occur.

__global__ void encoder_backward_v1_scatter_kernel(float* dwte32, float* dwpe32, const floatX* dout, const int* inp,
                                                   int B, int T, int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) return;
    int bt = idx / C;
    int t = bt % T;
    int c = idx % C;
    x128 d = load128(dout + idx);
    float* token_row = dwte32 + (size_t)inp[bt] * C + c;
    float* position_row = dwpe32 + (size_t)t * C + c;
#pragma unroll
    for (int k = 0; k < x128::size; k++) {
        atomicAdd(token_row + k, (float)d[k]);
        atomicAdd(position_row + k, (float)d[k]);
    }
}

// grad += scratch, 8 elements per thread
__global__ void encoder_backward_v1_fold_kernel(floatX* grad, const float* scratch, size_t n) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= n) return;
    x128 g = load128(grad + idx);
    f128 s0 = load128(scratch + idx);
    f128 s1 = load128(scratch + idx + f128::size);
#pragma unroll
    for (int k = 0; k < f128::size; k++) {
        g[k] = (floatX)((float)g[k] + s0[k]);
        g[k + f128::size] = (floatX)((float)g[k + f128::size] + s1[k]);
    }
    store128(grad + idx, g);
}

void encoder_backward_v1(floatX* dwte, floatX* dwpe, float* scratch /* (Vp + T) * C */, const floatX* dout,
                         const int* inp, int B, int T, int C, int Vp, int block_size) {
    size_t wte_elements = (size_t)Vp * C, wpe_elements = (size_t)T * C;
    float* dwte32 = scratch;
    float* dwpe32 = scratch + wte_elements;
    cudaCheck(cudaMemsetAsync(scratch, 0, (wte_elements + wpe_elements) * sizeof(float)));
    encoder_backward_v1_scatter_kernel<<<ceil_div_int((long)B * T * C / x128::size, block_size), block_size>>>(
        dwte32, dwpe32, dout, inp, B, T, C);
    cudaCheckLaunch();
    encoder_backward_v1_fold_kernel<<<ceil_div_int(wte_elements / x128::size, block_size), block_size>>>(
        dwte, dwte32, wte_elements);
    cudaCheckLaunch();
    encoder_backward_v1_fold_kernel<<<ceil_div_int(wpe_elements / x128::size, block_size), block_size>>>(
        dwpe, dwpe32, wpe_elements);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2 is llmc's encoder_backward (llmc/encoder.cuh): the host groups the positions by token (a counting
// sort) and one block owns one distinct token's row, summing its positions' rows of dout in position
// order with 4 rows of threads: deterministic, no atomics, and only the rows that occur are touched.
// Buckets are launched in token order, so the commonest token (~500 positions, 125 rows per thread)
// may start late and finish last: the kernel's time is set by its longest bucket.

// ----------------------------------------------------------------------------
// v3: v2 with the buckets launched longest first and each thread keeping two rows in flight. Blocks
// start roughly in index order, so putting the long buckets first lets the short ones fill in around
// them (longest-processing-time-first scheduling) instead of the long ones forming a tail. The block
// size sets the rows of threads per bucket (4 to 32): more shortens the long buckets and wastes
// threads on the single-position ones; the sweep shows the balance.

constexpr int ENC_MAX_ROWS = 32;

struct SortedBuckets {
    int num_buckets = 0;
    std::vector<int> host;  // [tokens (U) | starts (U+1) | positions (B*T)], buckets by decreasing size
    int* device = nullptr;  // same layout, 3 * B * T + 1 ints
};

// Groups positions by token (positions in increasing order within a bucket), largest bucket first.
void encoder_backward_v3_prepare(SortedBuckets* buckets, const std::vector<int>& inp, int V) {
    int N = (int)inp.size();
    std::vector<int> counts(V, 0);
    for (int token : inp) counts[token]++;
    std::vector<int> distinct;
    for (int v = 0; v < V; v++) {
        if (counts[v] > 0) distinct.push_back(v);
    }
    std::stable_sort(distinct.begin(), distinct.end(), [&](int a, int b) { return counts[a] > counts[b]; });
    int U = (int)distinct.size();
    buckets->num_buckets = U;
    buckets->host.assign(2 * (size_t)U + 1 + N, 0);
    int* tokens = buckets->host.data();
    int* starts = tokens + U;
    int* positions = starts + U + 1;
    std::vector<int> next_slot(V, 0);
    int offset = 0;
    for (int u = 0; u < U; u++) {
        tokens[u] = distinct[u];
        starts[u] = offset;
        next_slot[distinct[u]] = offset;
        offset += counts[distinct[u]];
    }
    starts[U] = N;
    for (int i = 0; i < N; i++) positions[next_slot[inp[i]]++] = i;
    cudaCheck(cudaMemcpy(buckets->device, buckets->host.data(), buckets->host.size() * sizeof(int),
                         cudaMemcpyHostToDevice));
}

__global__ void encoder_backward_v3_wte_kernel(floatX* dwte, const floatX* dout, const int* bucket_tokens,
                                               const int* bucket_starts, const int* bucket_positions, int C) {
    __shared__ float partial[ENC_MAX_ROWS][WARP_SIZE][x128::size];
    int bucket = blockIdx.x;
    int c = (blockIdx.y * WARP_SIZE + threadIdx.x) * x128::size;
    bool active = c < C;
    float sum[x128::size] = {};
    if (active) {
        int end = bucket_starts[bucket + 1];
        int i = bucket_starts[bucket] + threadIdx.y;
        int step = blockDim.y;
        for (; i + step < end; i += 2 * step) {
            x128 d0 = load128cs(dout + (size_t)bucket_positions[i] * C + c);
            x128 d1 = load128cs(dout + (size_t)bucket_positions[i + step] * C + c);
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum[k] += (float)d0[k];
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum[k] += (float)d1[k];
        }
        if (i < end) {
            x128 d = load128cs(dout + (size_t)bucket_positions[i] * C + c);
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum[k] += (float)d[k];
        }
    }
#pragma unroll
    for (int k = 0; k < x128::size; k++) partial[threadIdx.y][threadIdx.x][k] = sum[k];
    __syncthreads();
    if (threadIdx.y != 0 || !active) return;
    for (int y = 1; y < blockDim.y; y++) {
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum[k] += partial[y][threadIdx.x][k];
    }
    floatX* row = dwte + (size_t)bucket_tokens[bucket] * C + c;
    x128 grad = load128(row);
#pragma unroll
    for (int k = 0; k < x128::size; k++) grad[k] = (floatX)((float)grad[k] + sum[k]);
    store128(row, grad);
}

// dwpe[t, c:c+8] += sum over b of dout[b, t, c:c+8]: one thread per (t, 8 channels), B loads in flight
__global__ void encoder_backward_v3_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= T * C) return;
    float sum[x128::size] = {};
    for (int b = 0; b < B; b++) {
        x128 d = load128cs(dout + (size_t)b * T * C + idx);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum[k] += (float)d[k];
    }
    x128 grad = load128(dwpe + idx);
#pragma unroll
    for (int k = 0; k < x128::size; k++) grad[k] = (floatX)((float)grad[k] + sum[k]);
    store128(dwpe + idx, grad);
}

void encoder_backward_v3(floatX* dwte, floatX* dwpe, const floatX* dout, const SortedBuckets& buckets, int B, int T,
                         int C, int block_size) {
    int rows = block_size / WARP_SIZE;
    if (rows < 1 || rows > ENC_MAX_ROWS) fatal("encoder_backward_v3: block size %d out of range", block_size);
    encoder_backward_v3_wpe_kernel<<<ceil_div_int(T * C / x128::size, 256), 256>>>(dwpe, dout, B, T, C);
    cudaCheckLaunch();
    int U = buckets.num_buckets;
    const int* tokens = buckets.device;
    const int* starts = tokens + U;
    const int* positions = starts + U + 1;
    dim3 grid(U, ceil_div_int(C / x128::size, WARP_SIZE));
    dim3 block(WARP_SIZE, rows);
    encoder_backward_v3_wte_kernel<<<grid, block>>>(dwte, dout, tokens, starts, positions, C);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("encoder_backward", argc, argv);
    const int B = dev::B, T = dev::T, C = dev::C, V = dev::V, Vp = dev::Vp;
    const size_t BTC = (size_t)B * T * C;

    std::vector<int> inp = dev::random_tokens((size_t)B * T, V);
    std::vector<float> dout = dev::random_floatX(BTC, -1.0f, 1.0f);
    std::vector<float> dwte0 = dev::random_floatX((size_t)Vp * C, -0.1f, 0.1f);
    std::vector<float> dwpe0 = dev::random_floatX((size_t)T * C, -0.1f, 0.1f);
    std::vector<float> ref_dwte = dwte0, ref_dwpe = dwpe0;
    encoder_backward(ref_dwte.data(), ref_dwpe.data(), dout.data(), inp.data(), B, T, C);

    dev::DeviceBuffer<int> d_inp((size_t)B * T);
    dev::DeviceBuffer<floatX> d_dout(BTC), d_dwte((size_t)Vp * C), d_dwpe((size_t)T * C);
    dev::DeviceBuffer<floatX> d_dwte0((size_t)Vp * C), d_dwpe0((size_t)T * C);
    dev::DeviceBuffer<float> d_scratch((size_t)(Vp + T) * C);
    dev::upload(d_inp, inp);
    dev::upload(d_dout, dout);
    dev::upload(d_dwte0, dwte0);
    dev::upload(d_dwpe0, dwpe0);

    // the host-side grouping of both bucketed versions, done once per batch (untimed)
    dev::DeviceBuffer<int> d_buckets(encoder_buckets_ints(B, T)), d_sorted_buckets(3 * (size_t)B * T + 1);
    EncoderBuckets buckets;
    buckets.device = d_buckets.ptr;
    encoder_prepare_backward(&buckets, inp.data(), B, T, V, 0);
    SortedBuckets sorted;
    sorted.device = d_sorted_buckets.ptr;
    encoder_backward_v3_prepare(&sorted, inp, V);
    int U = sorted.num_buckets;
    const int* starts = sorted.host.data() + U;
    printf("batch: %d distinct tokens in %d positions; the commonest occurs %d times\n", U, B * T, starts[1] - starts[0]);

    double bytes = (double)BTC * sizeof(floatX) + (double)B * T * sizeof(int) +
                   2.0 * ((double)U * C + (double)T * C) * sizeof(floatX);
    dev::Report report = dev::make_report("encoder_backward", bytes, 0.0);
    std::vector<dev::Version> versions = {
        {"v1 fp32 atomics into a full-size scratch", {128, 256, 512, 1024},
         [&](int bs) { encoder_backward_v1(d_dwte.ptr, d_dwpe.ptr, d_scratch.ptr, d_dout.ptr, d_inp.ptr, B, T, C, Vp, bs); }},
        {"v2 llmc: a block per token, token order", {0},
         [&](int) { encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, buckets, B, T, C, 0); }},
        {"v3 v2 with longest buckets first", {128, 256, 512, 1024},
         [&](int bs) { encoder_backward_v3(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, sorted, B, T, C, bs); }},
    };
    dev::run_versions(&report, versions,
                      [&] {
                          dev::copy(d_dwte, d_dwte0);
                          dev::copy(d_dwpe, d_dwpe0);
                      },
                      [&] {
                          dev::CheckResult result;
                          dev::check_tensor(&result, "dwte", dev::download(d_dwte), ref_dwte, dev::TOL_REDUCTION);
                          dev::check_tensor(&result, "dwpe", dev::download(d_dwpe), ref_dwpe, dev::TOL_REDUCTION);
                          return result;
                      });
    return dev::finish(report);
}
