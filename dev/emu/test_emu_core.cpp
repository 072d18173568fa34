// Unit tests of the emulator core (dev/emu): each small kernel's expected result is worked out from
// the CUDA definitions (CUDA C++ Programming Guide, PTX ISA), not from the emulator or our callers.
// Built like every emulated CUDA source (cu2cpp.sh rewrites the <<< >>> launches); `make emu-test-core`.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExtCudaRt.h>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

namespace {

// ----------------------------------------------------------------------------
// helpers

template <typename T>
T* device_array(size_t n, int byte = 0) {
    T* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, byte, n * sizeof(T)), cudaSuccess);
    return p;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

struct ThreadOrderGuard {
    explicit ThreadOrderGuard(emu::ThreadOrder o) { emu::set_thread_order(o); }
    ~ThreadOrderGuard() { emu::set_thread_order(emu::ThreadOrder::forward); }
};

}  // namespace

// ----------------------------------------------------------------------------
// kernels (in a named namespace: the emulator finds a kernel's name in the dynamic symbol table,
// which has no internal-linkage symbols)

namespace emu_test {

// each thread reads its right neighbour's slot after writing its own; `sync` puts the barrier between
__global__ void neighbour_kernel(int* out, bool sync) {
    __shared__ int slots[64];
    int t = threadIdx.x;
    slots[t] = -1;
    __syncthreads();
    slots[t] = t;
    if (sync) __syncthreads();
    out[t] = slots[(t + 1) % blockDim.x];
}

__global__ void indices_kernel(int* out) {
    int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int threads = blockDim.x * blockDim.y * blockDim.z;
    out[block * threads + thread] = block * 1000 + thread;
}

// out[(which, lane)] for the shuffle variants; value of lane j is 100 + j
__global__ void shuffle_kernel(int* out) {
    int lane = threadIdx.x;
    int v = 100 + lane;
    out[0 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[1 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 9, 8);  // may leave the lane's segment of 8
    out[2 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 3, 8);
    out[3 * 32 + lane] = __shfl_up_sync(0xffffffffu, v, 2, 16);
    out[4 * 32 + lane] = __shfl_sync(0xffffffffu, v, 7, 8);
    out[5 * 32 + lane] = __shfl_sync(0xffffffffu, v, 9, 8);  // source lane taken modulo the width
    out[6 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 1);
    out[7 * 32 + lane] = __shfl_sync(0xffffffffu, v, 31);
    float f = (float)lane;
    for (int offset = 16; offset > 0; offset /= 2) f += __shfl_xor_sync(0xffffffffu, f, offset);
    out[8 * 32 + lane] = (int)f;
}

__global__ void vote_kernel(unsigned* out) {
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    unsigned* o = out + warp * 4;
    unsigned ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
    int any = __any_sync(0xffffffffu, lane == 17);
    int all_true = __all_sync(0xffffffffu, lane >= 0);
    int all_false = __all_sync(0xffffffffu, lane != 5);
    if (lane == 0) {
        o[0] = ballot;
        o[1] = any;
        o[2] = all_true;
        o[3] = all_false;
    }
}

// the lower 16 lanes shuffle among themselves while the upper 16 take another path
__global__ void half_warp_kernel(int* out) {
    int lane = threadIdx.x;
    if (lane < 16) {
        out[lane] = __shfl_xor_sync(0x0000ffffu, lane, 1);
    } else {
        out[lane] = __reduce_add_sync(0xffff0000u, (unsigned)lane);
    }
}

__global__ void atomic_kernel(int* count, float* sum, unsigned long long* wide) {
    atomicAdd(count, 1);
    atomicAdd(sum, 1.0f);
    atomicAdd(wide, 3ull);
}

// reverses each block's slice through dynamic shared memory
__global__ void reverse_kernel(float* data) {
    extern __shared__ __align__(16) float buffer[];
    int t = threadIdx.x;
    int n = blockDim.x;
    buffer[t] = data[blockIdx.x * n + t];
    __syncthreads();
    data[blockIdx.x * n + t] = buffer[n - 1 - t];
}

// Block 0 writes every slot of a static __shared__ array and a scalar; block 1 writes none, so it
// must read poison (0xFF bytes), not block 0's values. out: 33 words per block, the bits read.
__global__ void unwritten_static_shared_kernel(unsigned* out) {
    __shared__ float slots[32];
    __shared__ int flag;
    int t = threadIdx.x;
    if (blockIdx.x == 0) {
        slots[t] = 1.0f;
        if (t == 0) flag = 7;
    }
    __syncthreads();
    out[blockIdx.x * 33 + t] = __float_as_uint(slots[t]);
    if (t == 0) out[blockIdx.x * 33 + 32] = (unsigned)flag;
}

// nothing ever writes `never`: even the first block on a host thread must read poison, not zeros
__global__ void never_written_shared_kernel(unsigned* out) {
    __shared__ double never[4];
    out[threadIdx.x] = (unsigned)(__double_as_longlong(never[threadIdx.x]) >> 32);
}

// the same with dynamic shared memory: block 0 writes it, block 1 reads what it did not write
__global__ void unwritten_dynamic_shared_kernel(unsigned* out) {
    extern __shared__ float dynamic_slots[];
    int t = threadIdx.x;
    if (blockIdx.x == 0) dynamic_slots[t] = 2.0f;
    __syncthreads();
    out[blockIdx.x * 32 + t] = __float_as_uint(dynamic_slots[t]);
}

// threads past `active` return at once; the rest still meet at the barrier (exited threads do not block it)
__global__ void early_exit_kernel(int* out, int active) {
    __shared__ int total;
    int t = threadIdx.x;
    if (t >= active) return;
    if (t == 0) total = 0;
    __syncthreads();
    atomicAdd(&total, t);
    __syncthreads();
    out[t] = total;
}

__global__ void count_kernel(int* out) {
    int c = __syncthreads_count(threadIdx.x % 4 == 0);
    out[threadIdx.x] = c;
}

// a lane named in the mask has exited: the hardware would hang or return garbage
__global__ void missing_lane_kernel(int* out) {
    if (threadIdx.x == 7) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void store_kernel(int* p, int value) { *p = value; }
__global__ void add_one_kernel(int* dst, const int* src) { *dst = *src + 1; }
__global__ void empty_kernel(int* p) {}
__global__ void reg_heavy_kernel(int* p) {}
__global__ void __launch_bounds__(256) bounded_kernel(int* p) {}
__global__ void static_shared_kernel(int* p) {}

__global__ void bf16_kernel(__nv_bfloat16* out, const float* in, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = (__nv_bfloat16)in[i];
}

// one 128-bit load and store per thread, as the element-wise kernels do
__global__ void scale_kernel(float4* data, size_t n, float factor) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 v = __ldcs(&data[i]);
    v.x *= factor, v.y *= factor, v.z *= factor, v.w *= factor;
    __stcs(&data[i], v);
}

__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__global__ void block_sum_kernel(float* out, const float* in) {
    __shared__ float partial[32];
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

template <typename T>
__global__ void fill_kernel(T* out, T value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

// ----------------------------------------------------------------------------
// cooperative groups

// out[rank * 8 + ...]: what this_thread_block() says to each thread, and a neighbour's value read
// after block.sync() (block shaped (4, 3, 2): rank = x + 4·(y + 3·z))
__global__ void cg_block_kernel(unsigned* out) {
    __shared__ unsigned slots[24];
    cg::thread_block block = cg::this_thread_block();
    unsigned rank = block.thread_rank();
    slots[rank] = 1000 + rank;
    cg::sync(block);
    unsigned* o = out + (blockIdx.x * 24 + rank) * 8;
    o[0] = rank;
    o[1] = block.size() * 100 + block.num_threads();
    o[2] = block.group_index().x;
    o[3] = block.thread_index().x * 100 + block.thread_index().y * 10 + block.thread_index().z;
    o[4] = block.dim_threads().x * 100 + block.dim_threads().y * 10 + block.dim_threads().z;
    o[5] = block.group_dim().x * 100 + block.group_dim().y * 10 + block.group_dim().z;
    o[6] = slots[(rank + 1) % 24];
    o[7] = block.thread_rank() == (unsigned)(threadIdx.x + 4 * (threadIdx.y + 3 * threadIdx.z));
}

// One tile of N per thread, in a 1-D block: out[rank * 18 + ...] the tile's view of itself and the
// results of its collectives, each lane's value being 100 + its rank in the block.
template <unsigned N>
__global__ void cg_tile_kernel(int* out) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<N> tile = cg::tiled_partition<N>(block);
    int rank = (int)block.thread_rank();
    int v = 100 + rank;
    int* o = out + rank * 18;
    o[0] = (int)tile.thread_rank();
    o[1] = (int)tile.meta_group_rank();
    o[2] = (int)tile.meta_group_size();
    o[3] = (int)(tile.size() * 100 + tile.num_threads());
    o[4] = (int)tile.emu_lane_mask();
    o[5] = tile.shfl(v, 1);             // the tile's thread 1 (thread 0 for N = 1: 1 mod 1)
    o[6] = tile.shfl_down(v, 1);        // the next thread, or its own value at the tile's end
    o[7] = tile.shfl_up(v, 2);          // two back, or its own value in the tile's first two
    o[8] = tile.shfl_xor(v, N / 2);     // the partner in the other half of the tile (itself for N = 1)
    o[9] = cg::reduce(tile, v, cg::plus<int>());
    o[10] = cg::reduce(tile, v, cg::less<int>());
    o[11] = cg::reduce(tile, v, cg::greater<int>());
    o[12] = (int)tile.ballot(rank % 3 == 0);
    o[13] = tile.any(rank % 7 == 6) * 10 + tile.all(rank % 2 == 0);
    tile.sync();
    float f = (float)rank * 0.5f;  // multiples of 0.5: sums are exact in any order
    o[14] = (int)(cg::reduce(tile, f, cg::plus<float>()) * 2.0f);
    o[15] = cg::reduce(tile, 1 << (rank % 31), cg::bit_or<int>());
    o[16] = cg::reduce(tile, ~rank, cg::bit_and<int>());
    o[17] = cg::reduce(tile, rank * 7, cg::bit_xor<int>());
}

// tiles of 16 taking different paths: the first reduces, the second votes (disjoint masks)
__global__ void cg_divergent_tiles_kernel(int* out) {
    cg::thread_block_tile<16> tile = cg::tiled_partition<16>(cg::this_thread_block());
    int t = threadIdx.x;
    if (tile.meta_group_rank() == 0) {
        out[t] = cg::reduce(tile, t, cg::plus<int>());
    } else {
        out[t] = (int)tile.ballot(t % 2);
    }
}

// lanes exchange through shared memory inside tiles of 8, ordered by tile.sync() alone: each lane
// writes its slot, and reads its mirror in the tile after the sync
__global__ void cg_tile_sync_kernel(int* out) {
    __shared__ int slots[64];
    cg::thread_block_tile<8> tile = cg::tiled_partition<8>(cg::this_thread_block());
    int t = threadIdx.x;
    slots[t] = 10 * t;
    tile.sync();
    out[t] = slots[t - tile.thread_rank() + (7 - tile.thread_rank())];
}

// a tile of 16 cut into tiles of 4; a struct of 12 bytes shuffled (two 8-byte exchanges)
struct Triple {
    int a, b, c;
};
__global__ void cg_subtile_kernel(int* out) {
    cg::thread_block_tile<16> half = cg::tiled_partition<16>(cg::this_thread_block());
    cg::thread_block_tile<4> quad = cg::tiled_partition<4>(half);
    int t = threadIdx.x;
    Triple mine{t, 2 * t, 3 * t};
    Triple next = quad.shfl_down(mine, 1);
    out[t * 4 + 0] = (int)(quad.meta_group_rank() * 10 + quad.meta_group_size());
    out[t * 4 + 1] = (int)quad.emu_lane_mask();
    out[t * 4 + 2] = cg::reduce(quad, t, cg::plus<int>());
    out[t * 4 + 3] = next.a + next.b + next.c;
}

// a tile of 8 where thread 3 has returned before the shuffle
__global__ void cg_tile_missing_lane_kernel(int* out) {
    cg::thread_block_tile<8> tile = cg::tiled_partition<8>(cg::this_thread_block());
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = tile.shfl_xor((int)threadIdx.x, 1);
}

__global__ void cg_partition_kernel(int* out) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    out[threadIdx.x] = (int)warp.thread_rank();
}

// ----------------------------------------------------------------------------
// atomicInc/atomicDec wrap at the limit; bf16x2 and half2 atomics and arithmetic; __trap

// 7 threads increment (limit 3) and 7 decrement (limit 4) one counter each, starting at 0:
// inc: 0 1 2 3 0 1 2 3 ... ; dec: 0 -> 4 (0 wraps to the limit) 3 2 1 0 4 ...
__global__ void wrap_kernel(unsigned* counters) {
    atomicInc(&counters[0], 3u);
    atomicDec(&counters[1], 4u);
}
// 40 threads add (1, 2) into one bf16x2 and one half2 pair; out[2] = a + b and a * b on given pairs
__global__ void pair_atomic_kernel(__nv_bfloat162* bf, __half2* hf, __nv_bfloat162* out, __nv_bfloat162 a, __nv_bfloat162 b) {
    atomicAdd(bf, __floats2bfloat162_rn(1.0f, 2.0f));
    atomicAdd(hf, __floats2half2_rn(1.0f, 2.0f));
    if (threadIdx.x == 0) {
        out[0] = a + b;
        out[1] = a * b;
        out[2] = a - b;
    }
}
__global__ void trap_kernel(int* out) {
    if (threadIdx.x == 5) __trap();
    out[threadIdx.x] = 1;
}

// ----------------------------------------------------------------------------
// min and max in the global namespace, called in a kernel: out = the 8 results below
__global__ void minmax_kernel(long long* out, int a, unsigned b, long long c, float d) {
    out[0] = min(a, a + 1);
    out[1] = max(a, -a);
    out[2] = min(a, b);  // int with unsigned: compared as unsigned
    out[3] = max(c, -c);
    out[4] = (long long)min(d, 2.0f);
    out[5] = (long long)max(d, NAN);  // the other operand when one is NaN (fmaxf)
    out[6] = ullmin(5ull, 7ull) + umax(3u, 4u);
    out[7] = min((size_t)b, (size_t)9);
}

// ----------------------------------------------------------------------------
// a kernel and host functions of the same name (an overload set), as dev/cuda programs write them

__global__ void axpy_named_twice(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
// the host function of the same name: its launch of 4 arguments picks the kernel
void axpy_named_twice(float* y, const float* x, float a, int n, int block_size) {
    axpy_named_twice<<<(n + block_size - 1) / block_size, block_size>>>(y, x, a, n);
}
// and a second kernel of the same name with another parameter count
__global__ void axpy_named_twice(float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a;
}

// a kernel template, launched without its template arguments (CUDA deduces them from the launch's)
template <typename T>
__global__ void scale_in_place(T* values, T factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) values[i] *= factor;
}

// tells whether it was given a pointer: launched with NULL or 0 for `maybe`, as CUDA code does
__global__ void note_whether_given(int* out, const float* maybe) {
    out[threadIdx.x] = maybe == nullptr ? 1 : 2;
}

}  // namespace emu_test

using namespace emu_test;

// ----------------------------------------------------------------------------
// blocks, barriers, shared memory

TEST(EmuExec, IndicesCoverGridAndBlock) {
    dim3 grid(3, 2, 2), block(4, 2, 3);
    int threads = 24, blocks = 12;
    int* d = device_array<int>(threads * blocks);
    indices_kernel<<<grid, block>>>(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<int> h = download(d, threads * blocks);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < threads; t++) ASSERT_EQ(h[b * threads + t], b * 1000 + t);
    cudaFree(d);
}

TEST(EmuExec, TemplateKernelsAndLaunchArgumentTypes) {
    int n = 100;
    float* d = device_array<float>(n);
    int shared_bytes = 0;     // an int variable where the launch wants size_t
    cudaStream_t stream = 0;  // the legacy default stream
    long blocks = 4;
    fill_kernel<float><<<blocks, dim3(32), shared_bytes, stream>>>(d, 2.5, n);  // double converts to float
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> h = download(d, n);
    for (int i = 0; i < n; i++) ASSERT_EQ(h[i], 2.5f);
    cudaFree(d);
}

TEST(EmuExec, SyncthreadsOrdersSharedMemoryInBothThreadOrders) {
    for (auto order : {emu::ThreadOrder::forward, emu::ThreadOrder::reverse}) {
        ThreadOrderGuard guard(order);
        int* d = device_array<int>(64);
        neighbour_kernel<<<1, 64>>>(d, true);
        std::vector<int> h = download(d, 64);
        for (int t = 0; t < 64; t++) EXPECT_EQ(h[t], (t + 1) % 64);
        cudaFree(d);
    }
}

TEST(EmuExec, MissingSyncthreadsShowsAsDifferentResultsPerThreadOrder) {
    if (emu::race_checking())
        GTEST_SKIP() << "EMU_TSAN build: the race checker reports this kernel (test_emu_seeded_bugs.cpp checks that)";
    std::vector<int> results[2];
    int k = 0;
    for (auto order : {emu::ThreadOrder::forward, emu::ThreadOrder::reverse}) {
        ThreadOrderGuard guard(order);
        int* d = device_array<int>(64);
        neighbour_kernel<<<1, 64>>>(d, false);
        results[k++] = download(d, 64);
        cudaFree(d);
    }
    // forward: thread t runs to its end before thread t+1 writes; reverse: t+1 has already written
    EXPECT_EQ(results[0][0], -1);
    EXPECT_EQ(results[1][0], 1);
    EXPECT_NE(results[0], results[1]);
}

TEST(EmuExec, DynamicSharedMemory) {
    int n = 128, blocks = 3;
    std::vector<float> h(n * blocks);
    for (int i = 0; i < n * blocks; i++) h[i] = (float)i;
    float* d = device_array<float>(n * blocks);
    cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    reverse_kernel<<<blocks, n, n * sizeof(float)>>>(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> got = download(d, n * blocks);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) ASSERT_EQ(got[b * n + t], (float)(b * n + n - 1 - t));
    cudaFree(d);
}

// cu2cpp.sh's rewrites of what llm.c's sources hold: an `extern __shared__` array of pointers (layernorm.cuh's
// `char* params[]`), and a `>>>` that closes nested templates (encoder.cuh's
// std::vector<std::pair<uint64_t, std::vector<uint64_t>>>), which is no launch: before, the converter
// turned it into `}` and the file did not compile.
__global__ void pointer_slots_kernel(float* out, const float* in) {
    extern __shared__ const float* slots[];
    slots[threadIdx.x] = in + (blockDim.x - 1 - threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = *slots[threadIdx.x];
}

TEST(EmuExec, ConverterKeepsNestedTemplatesAndPointerSharedArrays) {
    std::vector<std::pair<int, std::vector<int>>> nested = {{1, {2, 3}}};  // a >>> that is no launch
    ASSERT_EQ(nested[0].second.size(), 2u);
    int n = 8;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = (float)i;
    float* in = device_array<float>(n);
    float* out = device_array<float>(n);
    cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    pointer_slots_kernel<<<1, n, n * sizeof(const float*)>>>(out, in);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> got = download(out, n);
    for (int t = 0; t < n; t++) EXPECT_EQ(got[t], (float)(n - 1 - t));
    cudaFree(in);
    cudaFree(out);
}

// What programs written for the GPU call beside kernels (llm.c's trainer: pinned memory with flags, managed
// memory as a fallback, advice on it, the profiler's start and stop, NVTX ranges): accepted, and the
// memory works as device memory (a kernel writes it, the host reads it back).
TEST(EmuExec, HostAndManagedAllocationsOfGpuPrograms) {
    float* pinned = nullptr;
    int* managed = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, 16 * sizeof(float), cudaHostAllocWriteCombined), cudaSuccess);
    ASSERT_EQ(cudaMallocManaged(&managed, sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMemAdvise(managed, sizeof(int), cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), cudaSuccess);
    EXPECT_EQ(cudaProfilerStart(), cudaSuccess);
    nvtxRangePush("range");
    store_kernel<<<1, 1>>>(managed, 7);
    nvtxRangePop();
    EXPECT_EQ(cudaProfilerStop(), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(download(managed, 1)[0], 7);
    cudaFree(managed);
    cudaFreeHost(pinned);
}

// A launch by call (cu2cpp.sh with EMU_LAUNCH_BY_CALL=1): a kernel template whose arguments are deduced
// as in a call, a float* given for its const T* parameter, which the pointer form cannot deduce.
template <typename T>
__global__ void scaled_copy_kernel(float* out, const T* in, T scale) {
    out[threadIdx.x] = (float)(in[threadIdx.x] * scale);
}

TEST(EmuExec, LaunchByCallDeducesTemplateArgumentsAsACall) {
    int n = 4;
    std::vector<float> h = {1, 2, 3, 4};
    float* in = device_array<float>(n);
    float* out = device_array<float>(n);
    cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    emu::LaunchConfig{1, n}.by_call([](auto... a) { scaled_copy_kernel(a...); }, out, in, 2.0f);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(download(out, n), (std::vector<float>{2, 4, 6, 8}));
    emu::LaunchConfig{1, 2048}.by_call([](auto... a) { scaled_copy_kernel(a...); }, out, in, 2.0f);  // refused
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cudaFree(in);
    cudaFree(out);
}

TEST(EmuExec, StaticSharedMemoryStartsEveryBlockPoisoned) {
    // twice: the second launch's block 0 must see its own writes again, block 1 poison again
    for (int launch = 0; launch < 2; launch++) {
        unsigned* d = device_array<unsigned>(2 * 33);
        unwritten_static_shared_kernel<<<2, 32>>>(d);
        std::vector<unsigned> h = download(d, 2 * 33);
        for (int t = 0; t < 32; t++) {
            EXPECT_EQ(h[t], 0x3f800000u) << "block 0 slot " << t;  // 1.0f
            EXPECT_EQ(h[33 + t], 0xFFFFFFFFu) << "block 1 read block 0's (or zero) value in slot " << t;
        }
        EXPECT_EQ(h[32], 7u);
        EXPECT_EQ(h[33 + 32], 0xFFFFFFFFu) << "block 1's unwritten scalar __shared__";
        cudaFree(d);
    }
    unsigned* d = device_array<unsigned>(4);
    never_written_shared_kernel<<<1, 4>>>(d);
    for (unsigned bits : download(d, 4)) EXPECT_EQ(bits, 0xFFFFFFFFu) << "a never-written __shared__ read as zero";
    cudaFree(d);
}

TEST(EmuExec, DynamicSharedMemoryStartsEveryBlockPoisoned) {
    unsigned* d = device_array<unsigned>(2 * 32);
    unwritten_dynamic_shared_kernel<<<2, 32, 32 * sizeof(float)>>>(d);
    std::vector<unsigned> h = download(d, 2 * 32);
    for (int t = 0; t < 32; t++) {
        EXPECT_EQ(h[t], 0x40000000u);  // 2.0f
        EXPECT_EQ(h[32 + t], 0xFFFFFFFFu) << "block 1 slot " << t;
    }
    cudaFree(d);
}

TEST(EmuExec, ExitedThreadsDoNotBlockBarriers) {
    int* d = device_array<int>(64, 0xFF);
    early_exit_kernel<<<1, 64>>>(d, 20);
    std::vector<int> h = download(d, 64);
    for (int t = 0; t < 20; t++) EXPECT_EQ(h[t], 19 * 20 / 2);
    EXPECT_EQ(h[20], -1);  // never written
    cudaFree(d);
}

TEST(EmuExec, SyncthreadsCount) {
    int* d = device_array<int>(96);
    count_kernel<<<1, 96>>>(d);
    std::vector<int> h = download(d, 96);
    for (int t = 0; t < 96; t++) EXPECT_EQ(h[t], 24);
    cudaFree(d);
}

// ----------------------------------------------------------------------------
// warp collectives

TEST(EmuWarp, ShufflesFollowTheCudaDefinitions) {
    int* d = device_array<int>(9 * 32);
    shuffle_kernel<<<1, 32>>>(d);
    std::vector<int> h = download(d, 9 * 32);
    for (int j = 0; j < 32; j++) {
        int seg8 = j & ~7, seg16 = j & ~15;
        EXPECT_EQ(h[0 * 32 + j], 100 + (j ^ 5)) << j;
        // xor 9 within segments of 8: a source in a later segment returns the lane's own value
        int x = j ^ 9;
        EXPECT_EQ(h[1 * 32 + j], 100 + (x >= seg8 + 8 ? j : x)) << j;
        EXPECT_EQ(h[2 * 32 + j], 100 + (j + 3 >= seg8 + 8 ? j : j + 3)) << j;
        EXPECT_EQ(h[3 * 32 + j], 100 + (j - 2 < seg16 ? j : j - 2)) << j;
        EXPECT_EQ(h[4 * 32 + j], 100 + seg8 + 7) << j;
        EXPECT_EQ(h[5 * 32 + j], 100 + seg8 + 1) << j;
        EXPECT_EQ(h[6 * 32 + j], 100 + (j == 31 ? 31 : j + 1)) << j;
        EXPECT_EQ(h[7 * 32 + j], 131) << j;
        EXPECT_EQ(h[8 * 32 + j], 31 * 32 / 2) << j;  // every lane ends with the same butterfly sum
    }
    cudaFree(d);
}

TEST(EmuWarp, BallotAnyAll) {
    unsigned* d = device_array<unsigned>(2 * 4);
    vote_kernel<<<1, 64>>>(d);
    std::vector<unsigned> h = download(d, 8);
    unsigned expected = 0;
    for (int j = 0; j < 32; j += 3) expected |= 1u << j;
    for (int w = 0; w < 2; w++) {
        EXPECT_EQ(h[w * 4 + 0], expected);
        EXPECT_EQ(h[w * 4 + 1], 1u);
        EXPECT_EQ(h[w * 4 + 2], 1u);
        EXPECT_EQ(h[w * 4 + 3], 0u);
    }
    cudaFree(d);
}

TEST(EmuWarp, PartialMasksInDivergentBranches) {
    int* d = device_array<int>(32);
    half_warp_kernel<<<1, 32>>>(d);
    std::vector<int> h = download(d, 32);
    for (int j = 0; j < 16; j++) EXPECT_EQ(h[j], j ^ 1);
    for (int j = 16; j < 32; j++) EXPECT_EQ(h[j], (16 + 31) * 16 / 2);
    cudaFree(d);
}

TEST(EmuWarpDeathTest, LaneNamedInMaskHasExited) {
    auto run = [] {
        int* d = device_array<int>(32);
        missing_lane_kernel<<<1, 32>>>(d);
        cudaDeviceSynchronize();
    };
    EXPECT_DEATH(run(),
        "lanes [0-9,]+ wait in __shfl_xor_sync\\(mask 0xffffffff\\) for lanes that have exited: 7");
}

// ----------------------------------------------------------------------------
// cooperative groups: each expected value from the Programming Guide's definitions, computed here

TEST(EmuCooperativeGroups, ThreadBlockRanksIndicesAndSync) {
    for (auto order : {emu::ThreadOrder::forward, emu::ThreadOrder::reverse}) {
        ThreadOrderGuard guard(order);
        unsigned* d = device_array<unsigned>(2 * 24 * 8);
        cg_block_kernel<<<2, dim3(4, 3, 2)>>>(d);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        std::vector<unsigned> h = download(d, 2 * 24 * 8);
        for (unsigned b = 0; b < 2; b++) {
            for (unsigned z = 0; z < 2; z++) {
                for (unsigned y = 0; y < 3; y++) {
                    for (unsigned x = 0; x < 4; x++) {
                        unsigned rank = x + 4 * (y + 3 * z);
                        const unsigned* o = &h[(b * 24 + rank) * 8];
                        EXPECT_EQ(o[0], rank);
                        EXPECT_EQ(o[1], 24u * 100 + 24u);
                        EXPECT_EQ(o[2], b);
                        EXPECT_EQ(o[3], x * 100 + y * 10 + z);
                        EXPECT_EQ(o[4], 432u);
                        EXPECT_EQ(o[5], 432u);
                        EXPECT_EQ(o[6], 1000 + (rank + 1) % 24) << "block.sync() must order the slots";
                        EXPECT_EQ(o[7], 1u);
                    }
                }
            }
        }
        cudaFree(d);
    }
}

// every field of cg_tile_kernel<N> for a block of 64 threads, from the definitions
template <unsigned N>
void check_tiles_of() {
    const int threads = 64;
    int* d = device_array<int>(threads * 18);
    cg_tile_kernel<N><<<1, threads>>>(d);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<int> h = download(d, threads * 18);
    const int n = (int)N;
    for (int r = 0; r < threads; r++) {
        const int* o = &h[r * 18];
        int base = r - r % n, tr = r % n, v = 100 + r;
        int sum = 0, ranks = 0, any = 0, all = 1, bits_or = 0, bits_and = ~0, bits_xor = 0;
        unsigned ballot = 0;
        for (int i = 0; i < n; i++) {
            int q = base + i;
            sum += 100 + q;
            ranks += q;
            if (q % 3 == 0) ballot |= 1u << i;
            any |= q % 7 == 6;
            all &= q % 2 == 0;
            bits_or |= 1 << (q % 31);
            bits_and &= ~q;
            bits_xor ^= q * 7;
        }
        unsigned first_lane = (unsigned)(r % 32) / N * N;
        unsigned mask = N == 32 ? 0xffffffffu : ((1u << N) - 1u) << first_lane;
        SCOPED_TRACE(testing::Message() << "tile of " << N << ", thread " << r);
        EXPECT_EQ(o[0], tr);
        EXPECT_EQ(o[1], r / n);
        EXPECT_EQ(o[2], threads / n);
        EXPECT_EQ(o[3], n * 100 + n);
        EXPECT_EQ((unsigned)o[4], mask) << "the tile's own lanes only";
        EXPECT_EQ(o[5], 100 + base + 1 % n);
        EXPECT_EQ(o[6], tr + 1 < n ? v + 1 : v) << "shfl_down past the tile's end returns the caller's value";
        EXPECT_EQ(o[7], tr >= 2 ? v - 2 : v);
        EXPECT_EQ(o[8], 100 + base + (tr ^ (n / 2)));
        EXPECT_EQ(o[9], sum) << "the sum of the tile's values, no other tile's";
        EXPECT_EQ(o[10], 100 + base);
        EXPECT_EQ(o[11], 100 + base + n - 1);
        EXPECT_EQ((unsigned)o[12], ballot);
        EXPECT_EQ(o[13], any * 10 + all);
        EXPECT_EQ(o[14], ranks);
        EXPECT_EQ(o[15], bits_or);
        EXPECT_EQ(o[16], bits_and);
        EXPECT_EQ(o[17], bits_xor);
    }
    cudaFree(d);
}

TEST(EmuCooperativeGroups, TilesOfEverySizeUseOnlyTheirOwnLanes) {
    check_tiles_of<1>();
    check_tiles_of<2>();
    check_tiles_of<4>();
    check_tiles_of<8>();
    check_tiles_of<16>();
    check_tiles_of<32>();
}

TEST(EmuCooperativeGroups, TileSyncOrdersSharedMemoryInBothThreadOrders) {
    for (auto order : {emu::ThreadOrder::forward, emu::ThreadOrder::reverse}) {
        ThreadOrderGuard guard(order);
        int* d = device_array<int>(64);
        cg_tile_sync_kernel<<<1, 64>>>(d);
        std::vector<int> h = download(d, 64);
        for (int t = 0; t < 64; t++) EXPECT_EQ(h[t], 10 * (t - t % 8 + 7 - t % 8)) << "thread " << t;
        cudaFree(d);
    }
}

TEST(EmuCooperativeGroups, TileOfATileAndWideValues) {
    int* d = device_array<int>(32 * 4);
    cg_subtile_kernel<<<1, 32>>>(d);
    std::vector<int> h = download(d, 32 * 4);
    for (int t = 0; t < 32; t++) {
        int base = t - t % 4, next = t % 4 < 3 ? t + 1 : t;
        EXPECT_EQ(h[t * 4 + 0], (t % 16) / 4 * 10 + 4) << "meta group of the parent tile of 16";
        EXPECT_EQ((unsigned)h[t * 4 + 1], 0xfu << base);
        EXPECT_EQ(h[t * 4 + 2], 4 * base + 6);
        EXPECT_EQ(h[t * 4 + 3], 6 * next) << "a 12-byte struct shuffled whole";
    }
    cudaFree(d);
}

TEST(EmuCooperativeGroups, DivergentTilesRunTheirOwnCollectives) {
    int* d = device_array<int>(32);
    cg_divergent_tiles_kernel<<<1, 32>>>(d);
    std::vector<int> h = download(d, 32);
    for (int t = 0; t < 16; t++) EXPECT_EQ(h[t], 15 * 16 / 2);
    for (int t = 16; t < 32; t++) EXPECT_EQ((unsigned)h[t], 0xaaaau);  // odd ranks of the tile
    cudaFree(d);
}

TEST(EmuCooperativeGroupsDeathTest, ExitedLaneOfATileIsReported) {
    auto run = [] {
        int* d = device_array<int>(32);
        cg_tile_missing_lane_kernel<<<1, 32>>>(d);
        cudaDeviceSynchronize();
    };
    // only tile 0 (lanes 0-7) waits: the other tiles of the warp complete their shuffles
    EXPECT_DEATH(run(), "lanes 0,1,2,4,5,6,7 wait in thread_block_tile::shfl_xor\\(mask 0x000000ff\\) for lanes that "
                        "have exited: 3");
}

TEST(EmuCooperativeGroupsDeathTest, PartitionOfABlockThatIsNotAMultipleIsRefused) {
    auto run = [] {
        int* d = device_array<int>(48);
        cg_partition_kernel<<<1, 48>>>(d);
        cudaDeviceSynchronize();
    };
    EXPECT_DEATH(run(), "tiled_partition<32> of a block of 48 threads");
}

// ----------------------------------------------------------------------------
// min and max; a kernel and a host function of one name

TEST(EmuExec, AtomicIncDecWrapAtTheirLimits) {
    unsigned* d = device_array<unsigned>(2);
    wrap_kernel<<<1, 7>>>(d);
    std::vector<unsigned> h = download(d, 2);
    // inc, limit 3, seven times from 0: 1 2 3 0 1 2 3 -> 3; dec, limit 4: 4 3 2 1 0 4 3 -> 3
    EXPECT_EQ(h[0], 3u);
    EXPECT_EQ(h[1], 3u);
    wrap_kernel<<<1, 5>>>(d);  // from 3: inc 0 1 2 3 0 -> 0; dec 2 1 0 4 3 -> 3
    h = download(d, 2);
    EXPECT_EQ(h[0], 0u);
    EXPECT_EQ(h[1], 3u);
    cudaFree(d);
}

TEST(EmuBf16, PairAtomicsAndArithmeticRoundEachHalf) {
    __nv_bfloat162* bf = device_array<__nv_bfloat162>(1);
    __half2* hf = device_array<__half2>(1);
    __nv_bfloat162* out = device_array<__nv_bfloat162>(3);
    // a = (1, 3), b = (2^-8, 5): a + b = (1 + 2^-8 -> 1: halfway to 1 + 2^-7, ties to even; 8),
    // a * b = (2^-8, 15), a - b = (1 - 2^-8, exact: bf16's spacing below 1 is 2^-8; -2)
    __nv_bfloat162 a = __floats2bfloat162_rn(1.0f, 3.0f), b = __floats2bfloat162_rn(std::ldexp(1.0f, -8), 5.0f);
    pair_atomic_kernel<<<1, 40>>>(bf, hf, out, a, b);
    __nv_bfloat162 bf_h = download(bf, 1)[0];
    __half2 hf_h = download(hf, 1)[0];
    std::vector<__nv_bfloat162> o = download(out, 3);
    EXPECT_EQ((float)bf_h.x, 40.0f);  // integers up to 256 are exact in bf16: every add is exact
    EXPECT_EQ((float)bf_h.y, 80.0f);
    EXPECT_EQ((float)hf_h.x, 40.0f);
    EXPECT_EQ((float)hf_h.y, 80.0f);
    EXPECT_EQ((float)o[0].x, 1.0f);
    EXPECT_EQ((float)o[0].y, 8.0f);
    EXPECT_EQ((float)o[1].x, std::ldexp(1.0f, -8));
    EXPECT_EQ((float)o[1].y, 15.0f);
    EXPECT_EQ((float)o[2].x, 1.0f - std::ldexp(1.0f, -8));
    EXPECT_EQ((float)o[2].y, -2.0f);
    cudaFree(bf), cudaFree(hf), cudaFree(out);
}

TEST(EmuExecDeathTest, TrapEndsTheProgramNamingTheThread) {
    auto run = [] {
        int* d = device_array<int>(32);
        trap_kernel<<<1, 32>>>(d);
        cudaDeviceSynchronize();
    };
    EXPECT_DEATH(run(), "kernel emu_test::trap_kernel\\(int\\*\\) block \\(0,0,0\\) thread \\(5,0,0\\) called __trap\\(\\)");
}

TEST(EmuMath, GlobalMinMaxFollowTheCudaOverloads) {
    long long* d = device_array<long long>(8);
    minmax_kernel<<<1, 1>>>(d, -3, 5u, -7, 3.5f);
    std::vector<long long> h = download(d, 8);
    EXPECT_EQ(h[0], -3);
    EXPECT_EQ(h[1], 3);
    EXPECT_EQ(h[2], 5) << "min(int, unsigned) compares as unsigned: -3 is 4294967293u";
    EXPECT_EQ(h[3], 7);
    EXPECT_EQ(h[4], 2);
    EXPECT_EQ(h[5], 3) << "max(3.5f, NaN) is 3.5f";
    EXPECT_EQ(h[6], 9);
    EXPECT_EQ(h[7], 5);
    cudaFree(d);
    // the result types of the Math API's overloads
    static_assert(std::is_same<decltype(min(1, 2u)), unsigned>::value, "min(int, unsigned) is unsigned");
    static_assert(std::is_same<decltype(max(1L, 2UL)), unsigned long>::value, "max(long, unsigned long)");
    static_assert(std::is_same<decltype(min(1LL, 2LL)), long long>::value, "min(long long, long long)");
    static_assert(std::is_same<decltype(max(1.0f, 2.0)), double>::value, "max(float, double) is double");
    static_assert(std::is_same<decltype(min(1.0f, 2.0f)), float>::value, "min(float, float) is float");
    // host code too, next to std::min and std::max, with or without `using namespace std`
    EXPECT_EQ(min(-1, 1u), 1u);
    EXPECT_EQ(max(-1, 1u), 0xffffffffu);
    EXPECT_EQ(std::min(4, 3), 3);
    EXPECT_EQ(std::max<size_t>(4, 3), 4u);
    {
        using namespace std;
        EXPECT_EQ(min(2, 3), 2);            // ::min(int, int): a non-template wins the tie with std::min
        EXPECT_EQ(max(2.5, 3.5), 3.5);
        EXPECT_EQ(min<long>(7, 8), 7);      // std::min with explicit arguments
    }
}

TEST(EmuLaunch, KernelThatSharesItsNameWithHostFunctions) {
    const int n = 100;
    std::vector<float> y0(n), x0(n);
    for (int i = 0; i < n; i++) y0[i] = (float)i, x0[i] = (float)(2 * i + 1);
    float* y = device_array<float>(n);
    float* x = device_array<float>(n);
    cudaMemcpy(y, y0.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(x, x0.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    axpy_named_twice(y, x, 0.5f, n, 32);          // the host function launches the 4-parameter kernel
    axpy_named_twice<<<(n + 63) / 64, 64>>>(y, 3, n);  // the 3-parameter kernel; 3 converts to float
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> h = download(y, n);
    for (int i = 0; i < n; i++) EXPECT_EQ(h[i], y0[i] + 0.5f * x0[i] + 3.0f) << i;
    cudaFree(y), cudaFree(x);
}

TEST(EmuLaunch, KernelTemplateWithDeducedArguments) {
    const int n = 40;
    std::vector<float> f0(n);
    std::vector<int> i0(n);
    for (int i = 0; i < n; i++) f0[i] = 0.25f * (float)i, i0[i] = i - 7;
    float* f = device_array<float>(n);
    int* k = device_array<int>(n);
    cudaMemcpy(f, f0.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(k, i0.data(), n * sizeof(int), cudaMemcpyHostToDevice);
    scale_in_place<<<2, 32>>>(f, 4.0f, n);  // T = float
    scale_in_place<<<2, 32>>>(k, -3, n);    // T = int
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> hf = download(f, n);
    std::vector<int> hk = download(k, n);
    for (int i = 0; i < n; i++) {
        EXPECT_EQ(hf[i], (float)i) << i;  // 0.25 i * 4, exact
        EXPECT_EQ(hk[i], -3 * (i - 7)) << i;
    }
    cudaFree(f), cudaFree(k);
}

TEST(EmuLaunch, NullOrZeroForAPointerParameterIsTheNullPointer) {
    int* out = device_array<int>(3);
    float* given = device_array<float>(1);
    note_whether_given<<<1, 1>>>(out, NULL);  // g++'s NULL is __null, a long once the launch has stored it
    note_whether_given<<<1, 1>>>(out + 1, 0);
    note_whether_given<<<1, 1>>>(out + 2, given);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<int> h = download(out, 3);
    EXPECT_EQ(h, (std::vector<int>{1, 1, 2}));
    cudaFree(out), cudaFree(given);
}

TEST(EmuLaunchDeathTest, NonZeroIntegerForAPointerParameterIsRefused) {
    int* out = device_array<int>(1);
    EXPECT_DEATH((note_whether_given<<<1, 1>>>(out, 16)),
                 "kernel emu_test::note_whether_given\\(int\\*, float const\\*\\) argument 2 is the integer 16 "
                 "for a pointer parameter");
    cudaFree(out);
}

TEST(EmuLaunchDeathTest, OverloadedKernelIsStillChecked) {
    std::vector<float> host(4);
    EXPECT_DEATH((axpy_named_twice<<<1, 4>>>(host.data(), 1.0f, 4)),
                 "kernel emu_test::axpy_named_twice\\(float\\*, float, int\\) argument 1 is a host pointer");
}

// ----------------------------------------------------------------------------
// atomics and bf16

TEST(EmuExec, AtomicsGiveExactIntegerSums) {
    int* count = device_array<int>(1);
    float* sum = device_array<float>(1);
    unsigned long long* wide = device_array<unsigned long long>(1);
    atomic_kernel<<<64, 256>>>(count, sum, wide);
    EXPECT_EQ(download(count, 1)[0], 64 * 256);
    EXPECT_EQ(download(sum, 1)[0], 64.0f * 256.0f);  // integers below 2^24 add exactly in fp32
    EXPECT_EQ(download(wide, 1)[0], 3ull * 64 * 256);
    cudaFree(count), cudaFree(sum), cudaFree(wide);
}

namespace {
float float_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
unsigned short bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
}  // namespace

TEST(EmuBf16, RoundsToNearestEvenLikeCvtRn) {
    EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
    EXPECT_EQ(bf16_bits(-2.0f), 0xC000);
    EXPECT_EQ(bf16_bits(float_of(0x3F808000)), 0x3F80);  // tie, even neighbour below
    EXPECT_EQ(bf16_bits(float_of(0x3F818000)), 0x3F82);  // tie, even neighbour above
    EXPECT_EQ(bf16_bits(float_of(0x3F808001)), 0x3F81);  // just above the tie
    EXPECT_EQ(bf16_bits(float_of(0x3F807FFF)), 0x3F80);  // just below
    EXPECT_EQ(bf16_bits(float_of(0xBF818000)), 0xBF82);  // sign-magnitude: the same for negatives
    EXPECT_EQ(bf16_bits(float_of(0x7F800000)), 0x7F80);  // +inf
    EXPECT_EQ(bf16_bits(float_of(0xFF800000)), 0xFF80);  // -inf
    EXPECT_EQ(bf16_bits(float_of(0x7F7FFFFF)), 0x7F80);  // FLT_MAX overflows to inf
    EXPECT_EQ(bf16_bits(float_of(0x7F7F7FFF)), 0x7F7F);  // largest that stays finite
    EXPECT_EQ(bf16_bits(float_of(0x7FC00000)), 0x7FFF);  // NaN -> canonical NaN
    EXPECT_EQ(bf16_bits(float_of(0x7F800001)), 0x7FFF);  // NaN whose payload is all in the dropped bits
    EXPECT_EQ(bf16_bits(float_of(0xFFC00001)), 0x7FFF);
    EXPECT_EQ(bf16_bits(float_of(0x00010000)), 0x0001);  // denormals are kept
    EXPECT_EQ(bf16_bits(float_of(0x00008000)), 0x0000);  // tie between 0 and the smallest denormal
    EXPECT_EQ(bf16_bits(float_of(0x00018000)), 0x0002);
    EXPECT_EQ(bf16_bits(float_of(0x80000000)), 0x8000);  // -0
}

TEST(EmuBf16, ConversionsAndLayout) {
    static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2, "bf16 layout");
    static_assert(std::is_trivially_copyable<__nv_bfloat16>::value, "bf16 is trivially copyable");
    static_assert(sizeof(__nv_bfloat162) == 4, "bf16x2 layout");
    uint32_t bits;
    float back = __bfloat162float(__ushort_as_bfloat16(0x0001));
    memcpy(&bits, &back, 4);
    EXPECT_EQ(bits, 0x00010000u);
    EXPECT_EQ((float)__ushort_as_bfloat16(0x4049), 3.140625f);
    __nv_bfloat16 x = (__nv_bfloat16)3.14159f;  // (floatX)value as the kernels write it
    EXPECT_EQ(__bfloat16_as_ushort(x), 0x4049);
    __nv_bfloat162 pair = __floats2bfloat162_rn(1.0f, -2.0f);
    EXPECT_EQ(__bfloat16_as_ushort(pair.x), 0x3F80);
    EXPECT_EQ(__bfloat16_as_ushort(pair.y), 0xC000);
    EXPECT_EQ(__bfloat16_as_ushort(__float2bfloat16(float_of(0x3F818000))), 0x3F82);
    // in a kernel too
    float* in = device_array<float>(3);
    __nv_bfloat16* out = device_array<__nv_bfloat16>(3);
    float h[3] = {float_of(0x3F808000), float_of(0x7F800001), float_of(0x3F808001)};
    cudaMemcpy(in, h, sizeof(h), cudaMemcpyHostToDevice);
    bf16_kernel<<<1, 32>>>(out, in, 3);
    std::vector<__nv_bfloat16> got = download(out, 3);
    EXPECT_EQ(__bfloat16_as_ushort(got[0]), 0x3F80);
    EXPECT_EQ(__bfloat16_as_ushort(got[1]), 0x7FFF);
    EXPECT_EQ(__bfloat16_as_ushort(got[2]), 0x3F81);
    cudaFree(in), cudaFree(out);
}

// ----------------------------------------------------------------------------
// launch limits (an H100's), reported through cudaGetLastError like a failed launch

TEST(EmuLaunch, BlockAndGridLimits) {
    int* d = device_array<int>(1);
    empty_kernel<<<1, 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    empty_kernel<<<1, 1025>>>(d);
    EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
    empty_kernel<<<1, dim3(1, 1, 65)>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    empty_kernel<<<1, dim3(32, 32, 2)>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    empty_kernel<<<dim3(1, 65536), 32>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    empty_kernel<<<0, 32>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cudaFree(d);
}

TEST(EmuLaunch, DynamicSharedMemoryNeedsTheAttributeAbove48KiB) {
    float* d = device_array<float>(1024);
    reverse_kernel<<<1, 32, 48 * 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    reverse_kernel<<<1, 32, 49 * 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024), cudaErrorInvalidValue);
    cudaGetLastError();
    EXPECT_EQ(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024), cudaSuccess);
    reverse_kernel<<<1, 32, 227 * 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    reverse_kernel<<<1, 32, 228 * 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(d);
}

TEST(EmuLaunch, StaticAndDynamicSharedMemoryShareTheDefault48KiB) {
    emu::set_kernel_resources("_ZN8emu_test20static_shared_kernelEPi", 32, 16 * 1024);
    int* d = device_array<int>(1);
    static_shared_kernel<<<1, 32, 32 * 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    static_shared_kernel<<<1, 32, 32 * 1024 + 16>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
    // opted in: at most 227 KiB in all
    EXPECT_EQ(cudaFuncSetAttribute(static_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 211 * 1024 + 1),
              cudaErrorInvalidValue);
    cudaGetLastError();
    EXPECT_EQ(cudaFuncSetAttribute(static_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 211 * 1024), cudaSuccess);
    static_shared_kernel<<<1, 32, 211 * 1024>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    cudaFree(d);
}

TEST(EmuLaunch, RegistersPerBlockFromThePtxasTable) {
    // 128 registers per thread: 4096 per warp, so at most 16 warps (512 threads) fit in 65536
    emu::set_kernel_resources("_ZN8emu_test16reg_heavy_kernelEPi", 128, 0);
    int* d = device_array<int>(1);
    reg_heavy_kernel<<<1, 512>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    reg_heavy_kernel<<<1, 544>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    cudaFuncAttributes attr;
    ASSERT_EQ(cudaFuncGetAttributes(&attr, reg_heavy_kernel), cudaSuccess);
    EXPECT_EQ(attr.numRegs, 128);
    cudaFree(d);
}

TEST(EmuLaunch, LaunchBoundsFromThePtx) {
    emu::set_kernel_resources("_ZN8emu_test14bounded_kernelEPi", 32, 0, 256);
    int* d = device_array<int>(1);
    bounded_kernel<<<1, 256>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    bounded_kernel<<<1, 288>>>(d);
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    cudaFree(d);
}

TEST(EmuLaunchDeathTest, HostPointerArgumentIsRefused) {
    std::vector<int> host(4);
    // the launch in parentheses: its commas would split the macro's arguments (with nvcc too)
    EXPECT_DEATH((add_one_kernel<<<1, 1>>>(host.data(), host.data() + 1)),
                 "kernel emu_test::add_one_kernel\\(int\\*, int const\\*\\) argument 1 is a host pointer");
}

TEST(EmuLaunch, PinnedHostAndNullPointersAreAccepted) {
    int* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, 2 * sizeof(int)), cudaSuccess);
    pinned[0] = 41;
    add_one_kernel<<<1, 1>>>(pinned + 1, pinned);
    empty_kernel<<<1, 1>>>(nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(pinned[1], 42);
    cudaFreeHost(pinned);
}

// ----------------------------------------------------------------------------
// memory

TEST(EmuMemory, MallocIsAlignedAndReadsAsNaN) {
    float* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 100 * sizeof(float)), cudaSuccess);
    EXPECT_EQ((uintptr_t)d % 256, 0u);
    EXPECT_TRUE(emu::is_device_pointer(d, 100 * sizeof(float)));
    EXPECT_TRUE(emu::is_device_pointer(d + 50, 50 * sizeof(float)));
    EXPECT_FALSE(emu::is_device_pointer(d + 50, 51 * sizeof(float)));
    std::vector<float> h = download(d, 100);
    EXPECT_TRUE(std::isnan(h[0]) && std::isnan(h[99]));
    int local;
    EXPECT_EQ(cudaMemcpy(&local, &local, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT_EQ(cudaFree(&local), cudaErrorInvalidValue);
    cudaGetLastError();
    EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// ----------------------------------------------------------------------------
// streams and events: lazy, and in an order that differs from issue order unless events say otherwise

TEST(EmuMemory, Memcpy2DCopiesRowsAndLeavesThePaddingAlone) {
    // a 3 x 4 int matrix with a host pitch of 5 ints into a device pitch of 6, then back with pitch 4
    std::vector<int> host(3 * 5);
    for (int i = 0; i < 15; i++) host[i] = 100 + i;
    int* d = device_array<int>(3 * 6, 0x7f);  // every byte 0x7f: the padding must keep it
    ASSERT_EQ(cudaMemcpy2D(d, 6 * sizeof(int), host.data(), 5 * sizeof(int), 4 * sizeof(int), 3, cudaMemcpyHostToDevice),
              cudaSuccess);
    std::vector<int> dev = download(d, 3 * 6);
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < 4; c++) EXPECT_EQ(dev[r * 6 + c], 100 + r * 5 + c);
        for (int c = 4; c < 6; c++) EXPECT_EQ(dev[r * 6 + c], 0x7f7f7f7f) << "padding written";
    }
    std::vector<int> back(3 * 4, -1);
    ASSERT_EQ(cudaMemcpy2D(back.data(), 4 * sizeof(int), d, 6 * sizeof(int), 4 * sizeof(int), 3, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) EXPECT_EQ(back[r * 4 + c], 100 + r * 5 + c);
    // a width wider than a pitch is refused, and recorded as the last error
    EXPECT_EQ(cudaMemcpy2D(d, 2 * sizeof(int), host.data(), 5 * sizeof(int), 4 * sizeof(int), 3, cudaMemcpyHostToDevice),
              cudaErrorInvalidPitchValue);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidPitchValue);
    cudaFree(d);
}

TEST(EmuStream, WorkRunsOnlyWhenTheHostWaits) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    int* d = device_array<int>(1);
    cudaDeviceSynchronize();
    store_kernel<<<1, 1, 0, s>>>(d, 7);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(*(volatile int*)d, 0);  // queued, not run (read directly: the emulator's memory is the host's)
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(*(volatile int*)d, 7);
    cudaFree(d);
    cudaStreamDestroy(s);
}

TEST(EmuStream, QueryLetsAPollingLoopFinish) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    int* d = device_array<int>(1);
    cudaDeviceSynchronize();  // else the non-blocking stream may run before device_array's memset
    store_kernel<<<1, 1, 0, s>>>(d, 3);
    cudaError_t status;
    auto start = std::chrono::steady_clock::now();
    while ((status = cudaStreamQuery(s)) == cudaErrorNotReady) {
        ASSERT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(status, cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(download(d, 1)[0], 3);
    cudaFree(d);
    cudaStreamDestroy(s);
}

namespace {
// x = 1 on `compute`; y = x + 1 on `comm` (created later), with or without the event between them
int produce_consume(bool with_event) {
    cudaStream_t compute, comm;
    cudaEvent_t ready;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    int* x = device_array<int>(1);
    int* y = device_array<int>(1);
    cudaDeviceSynchronize();
    store_kernel<<<1, 1, 0, compute>>>(x, 1);
    cudaEventRecord(ready, compute);
    if (with_event) cudaStreamWaitEvent(comm, ready, 0);
    add_one_kernel<<<1, 1, 0, comm>>>(y, x);
    cudaDeviceSynchronize();
    int result = download(y, 1)[0];
    cudaFree(x), cudaFree(y);
    cudaEventDestroy(ready);
    cudaStreamDestroy(compute), cudaStreamDestroy(comm);
    return result;
}
}  // namespace

TEST(EmuStream, EventDependencyIsHonoured) { EXPECT_EQ(produce_consume(true), 2); }

TEST(EmuStream, MissingDependencyVisiblyReorders) {
    if (emu::race_checking())
        GTEST_SKIP() << "EMU_TSAN build: this test's streams race on purpose (test_emu_seeded_bugs.cpp checks the report)";
    EXPECT_EQ(produce_consume(false), 1);  // the newer stream ran first
    emu::set_stream_order(emu::StreamOrder::issue);
    EXPECT_EQ(produce_consume(false), 2);
    emu::set_stream_order(emu::StreamOrder::newest_stream_first);
}

TEST(EmuStream, LegacyDefaultStreamSynchronizesWithBlockingStreams) {
    if (emu::race_checking())
        GTEST_SKIP() << "EMU_TSAN build: this test's streams race on purpose (test_emu_seeded_bugs.cpp checks the report)";
    cudaStream_t blocking, non_blocking;
    cudaStreamCreate(&blocking);
    cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking);
    int* x = device_array<int>(1);
    int* y = device_array<int>(1);
    cudaDeviceSynchronize();
    // blocking stream, then the default stream: the default stream's work waits
    store_kernel<<<1, 1, 0, blocking>>>(x, 5);
    add_one_kernel<<<1, 1>>>(y, x);
    EXPECT_EQ(download(y, 1)[0], 6);
    // non-blocking stream: no implicit order with the default stream, and the newer stream runs first
    cudaMemset(x, 0, sizeof(int));
    add_one_kernel<<<1, 1>>>(x, y);                   // in issue order: x = 0, then x = 6 + 1
    add_one_kernel<<<1, 1, 0, non_blocking>>>(y, x);  // in issue order y = 7 + 1; run first, y = 5 + 1
    cudaDeviceSynchronize();
    EXPECT_EQ(download(y, 1)[0], 6);
    EXPECT_EQ(download(x, 1)[0], 7);
    cudaFree(x), cudaFree(y);
    cudaStreamDestroy(blocking), cudaStreamDestroy(non_blocking);
}

TEST(EmuStream, AsyncCopyFromPageableMemoryIsStagedAtTheCall) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    int* d = device_array<int>(1);
    int value = 11;
    cudaMemcpyAsync(d, &value, sizeof(int), cudaMemcpyHostToDevice, s);
    value = 12;  // allowed: the source was copied already
    cudaStreamSynchronize(s);
    EXPECT_EQ(download(d, 1)[0], 11);
    cudaFree(d);
    cudaStreamDestroy(s);
}

TEST(EmuStream, EventsTimeAndSynchronize) {
    cudaEvent_t a, b;
    ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
    float* d = device_array<float>(1 << 16);
    cudaEventRecord(a);
    scale_kernel<<<64, 256>>>((float4*)d, (1 << 16) / 4, 2.0f);
    cudaEventRecord(b);
    float ms = -1;
    EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorNotReady);
    cudaGetLastError();
    ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(b), cudaSuccess);
    ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    EXPECT_GE(ms, 0.0f);
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaFree(d);
}

TEST(EmuDevice, OneDeviceWithAnH100sLimits) {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
    EXPECT_EQ(n, 1);
    cudaDeviceProp p;
    ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    EXPECT_EQ(p.major * 10 + p.minor, 90);
    EXPECT_EQ(p.multiProcessorCount, 132);
    EXPECT_EQ(p.sharedMemPerBlockOptin, 227u * 1024);
    EXPECT_EQ(strstr(p.name, "H100"), nullptr);  // the trainer's MFU table must not take it for a GPU
    EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
    cudaGetLastError();
}

// ----------------------------------------------------------------------------
// throughput (printed, not checked): what the emulated suite's run time is made of

TEST(EmuSpeed, ElementwiseAndBlockReduce) {
    if (emu::race_checking()) GTEST_SKIP() << "EMU_TSAN build: the race checker's speed is not the emulator's";
    size_t n4 = 1 << 20;  // 4M floats, 1M threads
    float* d = device_array<float>(n4 * 4);
    cudaDeviceSynchronize();
    auto t0 = std::chrono::steady_clock::now();
    scale_kernel<<<(unsigned)(n4 / 256), 256>>>((float4*)d, n4, 1.0f);
    cudaDeviceSynchronize();
    double s1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int blocks = 2048, threads = 512;
    float* out = device_array<float>(blocks);
    cudaMemset(d, 0, (size_t)blocks * threads * sizeof(float));
    cudaDeviceSynchronize();
    t0 = std::chrono::steady_clock::now();
    block_sum_kernel<<<blocks, threads>>>(out, d);
    cudaDeviceSynchronize();
    double s2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(download(out, 1)[0], 0.0f);
    printf("emulator throughput: elementwise %.1f M threads/s, block_reduce (512 threads, 10 shuffles + 1 barrier each) "
           "%.2f M threads/s\n",
           n4 / s1 / 1e6, (double)blocks * threads / s2 / 1e6);
    cudaFree(d), cudaFree(out);
}

int main(int argc, char** argv) {
    setenv("EMU_REGISTER_WARNINGS", "0", 0);  // these kernels are not in the ptxas table
    setenv("EMU_QUIET_LAUNCH_ERRORS", "1", 0);  // the refused launches below are meant
    testing::InitGoogleTest(&argc, argv);
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    return RUN_ALL_TESTS();
}
