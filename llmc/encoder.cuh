// Encoder on the GPU: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:], and its deterministic backward.
//
// The backward has to add many rows of dout into the same row of dwte when a token repeats in the
// batch. Floating-point atomics would do that in whatever order the threads arrive, so two runs would
// differ in the last bits. Instead the host, which holds the batch's tokens anyway, groups the
// positions by token (a counting sort, O(B·T + V)) once per batch when the inputs are uploaded:
// encoder_prepare_backward(). In the backward, one block owns one distinct token, sums its
// positions' rows of dout in position order and writes that token's row of dwte: no two blocks
// touch the same row, so there are no atomics and the order is fixed. dwpe is simpler: one thread
// owns (t, 8 channels) and sums over b.
#pragma once

#include <algorithm>
#include <climits>
#include <vector>

#include "cuda_common.cuh"

// Which positions a pass's T rows of each sequence hold: row t is at position t on one process; with
// context parallelism (llmc/parallel/context_split.h) rows [0, split) start at `first` and rows [split, T)
// at `second` (the ring's front chunk and its mirror; Ulysses's one contiguous span has split 0). The
// default is the identity.
struct RowPositions {
    int first = 0, split = 0, second = 0;
    __host__ __device__ int position(int t) const { return t < split ? first + t : second + (t - split); }
};

// ----------------------------------------------------------------------------
// kernels

// one thread per 16 bytes of output. wte holds the vocabulary rows [v_begin, v_begin + v_count) (all of
// them without tensor parallelism); a token outside them gives a zero row (another process has it).
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int B, int T, int C, int v_begin, int v_count, RowPositions pos) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= B * T * C) return;
    int bt = idx / C;
    int t = bt % T;
    int c = idx % C;
    int row = inp[bt] - v_begin;
    x128 result;
    if (row < 0 || row >= v_count) {
#pragma unroll
        for (int k = 0; k < x128::size; k++) result[k] = (floatX)0.0f;
    } else {
        x128 token_row = load128(wte + (size_t)row * C + c);
        x128 position_row = load128(wpe + (size_t)pos.position(t) * C + c);
#pragma unroll
        for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)token_row[k] + (float)position_row[k]);
    }
    store128(out + idx, result);
}

// dwpe[position(t), c:c+8] += sum_b dout[b, t, c:c+8]
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C, RowPositions pos) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= T * C) return;
    float sum[x128::size] = {};
    for (int b = 0; b < B; b++) {
        x128 d = load128cs(dout + (size_t)b * T * C + idx);
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum[k] += (float)d[k];
    }
    floatX* row = dwpe + (size_t)pos.position(idx / C) * C + idx % C;
    x128 grad = load128(row);
#pragma unroll
    for (int k = 0; k < x128::size; k++) grad[k] = (floatX)((float)grad[k] + sum[k]);
    store128(row, grad);
}

// Block (32, ENCODER_ROWS_PER_BLOCK) for bucket blockIdx.x and channel tile blockIdx.y (32 threads of
// 8 channels each). threadIdx.y walks the bucket's positions with stride blockDim.y; the partial sums
// are then added in threadIdx.y order.
constexpr int ENCODER_ROWS_PER_BLOCK = 4;

__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout,
                                            const int* bucket_tokens,     // (U) distinct tokens
                                            const int* bucket_starts,     // (U+1) offsets into positions
                                            const int* bucket_positions,  // (B*T) b*T+t, grouped by token
                                            int C) {
    __shared__ float partial[ENCODER_ROWS_PER_BLOCK][WARP_SIZE][x128::size];
    int bucket = blockIdx.x;
    int c = (blockIdx.y * WARP_SIZE + threadIdx.x) * x128::size;
    bool active = c < C;
    float sum[x128::size] = {};
    if (active) {
        for (int i = bucket_starts[bucket] + threadIdx.y; i < bucket_starts[bucket + 1]; i += blockDim.y) {
            x128 d = load128(dout + (size_t)bucket_positions[i] * C + c);
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

// ----------------------------------------------------------------------------
// launchers

inline void check_encoder_shape(int C) {
    if (C % x128::size != 0) {
        fatal("the CUDA encoder needs channels divisible by %d, got %d", x128::size, C);
    }
}

// With tensor parallelism (llmc/parallel/tensor_parallel.h) wte is this process's vocabulary rows
// [v_begin, v_begin + v_count): the rows of tokens outside them are zero here, and the sum over the
// processes (each token has one owner, which adds wpe too) is the embedding.
inline void encoder_forward(floatX* out,       // (B, T, C)
                            const int* inp,    // (B, T) on the device
                            const floatX* wte, // (Vp, C), or (v_count, C)
                            const floatX* wpe, // (maxT, C)
                            int B, int T, int C, cudaStream_t stream, int v_begin = 0, int v_count = INT_MAX,
                            RowPositions pos = {}) {
    check_encoder_shape(C);
    const int block_size = 256;
    int grid_size = ceil_div_int((long)B * T * C / x128::size, block_size);
    encoder_forward_kernel<<<grid_size, block_size, 0, stream>>>(out, inp, wte, wpe, B, T, C, v_begin, v_count, pos);
    cudaCheckLaunch();
}

// The batch's positions grouped by token, built on the host and mirrored on the device.
struct EncoderBuckets {
    int num_buckets = 0;           // U: distinct tokens in the batch
    std::vector<int> counts;       // (V) scratch for the counting sort
    std::vector<int> host;         // [tokens (U) | starts (U+1) | positions (B*T)]
    int* device = nullptr;         // same layout; encoder_buckets_ints(B, T) ints, owned by the caller
};

inline size_t encoder_buckets_ints(int B, int T) { return 3 * (size_t)B * T + 1; }

// Groups the positions of inp_host (B, T) by token and uploads the groups to buckets->device.
// Call it whenever the batch changes (the trainer does so when it uploads the inputs). With tensor
// parallelism only the tokens of this process's rows [v_begin, v_begin + v_count) are grouped, by
// their row in its slice of wte.
inline void encoder_prepare_backward(EncoderBuckets* buckets, const int* inp_host, int B, int T, int V,
                                     cudaStream_t stream, int v_begin = 0, int v_count = INT_MAX) {
    int N = B * T;
    buckets->counts.assign(V, 0);
    for (int i = 0; i < N; i++) {
        if (inp_host[i] < 0 || inp_host[i] >= V) {
            fatal("token %d at position %d is outside the vocabulary [0, %d)", inp_host[i], i, V);
        }
        buckets->counts[inp_host[i]]++;
    }
    int v_end = (int)std::min<long>(V, (long)v_begin + v_count);
    for (int v = 0; v < V; v++) {
        if (v < v_begin || v >= v_end) buckets->counts[v] = 0;
    }
    int U = 0;
    for (int v = 0; v < V; v++) U += buckets->counts[v] > 0;
    buckets->num_buckets = U;
    buckets->host.assign(2 * (size_t)U + 1 + N, 0);
    int* tokens = buckets->host.data();
    int* starts = tokens + U;
    int* positions = starts + U + 1;
    // counts[v] becomes the next free slot of token v in positions[], so positions stay in order
    int u = 0, offset = 0;
    for (int v = 0; v < V; v++) {
        if (buckets->counts[v] == 0) continue;
        tokens[u] = v - v_begin;
        starts[u] = offset;
        offset += buckets->counts[v];
        buckets->counts[v] = starts[u];
        u++;
    }
    starts[U] = offset;
    for (int i = 0; i < N; i++) {
        if (inp_host[i] >= v_begin && inp_host[i] < v_end) positions[buckets->counts[inp_host[i]]++] = i;
    }
    cudaCheck(cudaMemcpyAsync(buckets->device, buckets->host.data(), buckets->host.size() * sizeof(int),
                              cudaMemcpyHostToDevice, stream));
}

// Accumulates (+=) into dwte and dwpe. encoder_prepare_backward() must have seen this batch.
inline void encoder_backward(floatX* dwte,                  // (Vp, C)
                             floatX* dwpe,                  // (maxT, C)
                             const floatX* dout,            // (B, T, C)
                             const EncoderBuckets& buckets, // the batch's tokens, grouped
                             int B, int T, int C, cudaStream_t stream, RowPositions pos = {}) {
    check_encoder_shape(C);
    const int block_size = 256;
    int grid_size = ceil_div_int((long)T * C / x128::size, block_size);
    encoder_backward_wpe_kernel<<<grid_size, block_size, 0, stream>>>(dwpe, dout, B, T, C, pos);
    cudaCheckLaunch();

    int U = buckets.num_buckets;
    if (U == 0) return;  // none of this process's vocabulary rows (tensor parallelism) is in the batch
    const int* tokens = buckets.device;
    const int* starts = tokens + U;
    const int* positions = starts + U + 1;
    dim3 grid(U, ceil_div_int(C / x128::size, WARP_SIZE));
    dim3 block(WARP_SIZE, ENCODER_ROWS_PER_BLOCK);
    encoder_backward_wte_kernel<<<grid, block, 0, stream>>>(dwte, dout, tokens, starts, positions, C);
    cudaCheckLaunch();
}
