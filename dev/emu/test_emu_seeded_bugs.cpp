// Seeded bugs: the emulator's checks, themselves tested. Each test takes a small copy of a kernel
// pattern from llmc/, plants one bug that compute-sanitizer or a GPU would expose, and asserts that
// one of the emulator's checks catches it, and that the correct kernel passes the same check:
//   poison        shared memory starts every block as 0xFF bytes (NaN): unwritten reads show
//   thread order  EMU_THREAD_ORDER=forward and reverse give different results (test/run_tests.sh
//                 compares the GPU suite's outputs in both orders)
//   race checker  the EMU_TSAN=1 build (ThreadSanitizer, build/emu-tsan/) reports the data race
//   AddressSanitizer  the EMU_ASAN=1 build (build/emu-asan/) stops at an access outside an allocation
//   initcheck     the same build reports a read of device memory that nothing wrote
// The race tests run only in the EMU_TSAN=1 build, the bounds test only in the EMU_ASAN=1 build
// (elsewhere they are skipped); the initcheck tests show in other builds what the poison sees. The table of bugs and checks is in dev/emu/README.md. Built like every
// emulated CUDA source (cu2cpp.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <unistd.h>
#include <vector>

#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "../../llmc/wgmma.cuh"

namespace {

template <typename T>
T* device_copy(const std::vector<T>& h) {
    T* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

// Copies `rows` rows of `used` floats from the host into the first `used` columns of a device matrix
// with `padded` columns, a row at a time; the other columns stay unwritten.
cudaError_t upload_rows(float* d, const std::vector<float>& h, int rows, int used, int padded) {
    for (int r = 0; r < rows; r++) {
        cudaError_t e = cudaMemcpy(d + r * padded, h.data() + r * used, used * sizeof(float), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

// Runs `launch` (launches and a synchronize) in a child process (a gtest death test); the child ends
// with status 3 when the race checker reported a race and 0 when it did not. `report` must match
// what the child printed (the "cuda-emu: data-race in kernel ..." lines).
void expect_race(const std::function<void()>& launch, const char* report) {
    EXPECT_EXIT(
        {
            launch();
            cudaDeviceSynchronize();
            fflush(stdout);
            _exit(emu::race_reports() > 0 ? 3 : 0);  // _exit: ThreadSanitizer's own exit status stays out of it
        },
        testing::ExitedWithCode(3), report);
}

// Runs `launch` here and expects no race report (a report would also make the whole test program
// exit with ThreadSanitizer's status 66).
void expect_no_race(const std::function<void()>& launch) {
    int before = emu::race_reports();
    launch();
    cudaDeviceSynchronize();
    EXPECT_EQ(emu::race_reports(), before) << "the race checker reported the correct kernel";
}

// runs `launch` in forward and in reverse thread order and returns both results
template <typename T>
std::vector<std::vector<T>> in_both_orders(const std::function<std::vector<T>()>& launch) {
    std::vector<std::vector<T>> results;
    for (auto order : {emu::ThreadOrder::forward, emu::ThreadOrder::reverse}) {
        emu::set_thread_order(order);
        results.push_back(launch());
    }
    emu::set_thread_order(emu::ThreadOrder::forward);
    return results;
}

#define SKIP_WITHOUT_RACE_CHECKER()                                                               \
    if (!emu::race_checking()) GTEST_SKIP() << "needs the race checker: make -f dev/emu/tsan.mk " \
                                               "emu-test-seeded-bugs (README.md)"

}  // namespace

// ----------------------------------------------------------------------------
// kernels (in a named namespace: the emulator names kernels from the dynamic symbol table)

namespace emu_seeded {

__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// llmc/cuda_common.cuh's block_reduce (a sum), with two bugs to seed: without `leading_sync` a second
// call's write of warp_results races with the first call's reads in other warps; with `all_slots`
// every lane reads a warp slot, also those of warps the block does not have (never written).
__device__ float block_sum(float value, bool leading_sync, bool all_slots) {
    __shared__ float warp_results[32];
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int num_warps = blockDim.x / 32;
    if (leading_sync) __syncthreads();
    value = warp_sum(value);
    if (lane == 0) warp_results[warp] = value;
    __syncthreads();
    value = all_slots || lane < num_warps ? warp_results[lane] : 0.0f;
    return warp_sum(value);
}

// the sum and the sum of squares of each block's slice: two block reductions in a row, as layernorm's
// mean and variance are
__global__ void two_sums_kernel(float* out, const float* in, bool leading_sync, bool all_slots) {
    float x = in[blockIdx.x * blockDim.x + threadIdx.x];
    float sum = block_sum(x, leading_sync, all_slots);
    float sum_sq = block_sum(x * x, leading_sync, all_slots);
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = sum;
        out[2 * blockIdx.x + 1] = sum_sq;
    }
}

// reverses a block's slice through shared memory; `sync` is the __syncthreads between write and read
__global__ void reverse_kernel(float* data, bool sync) {
    __shared__ float buffer[256];
    int t = threadIdx.x, n = blockDim.x;
    buffer[t] = data[blockIdx.x * n + t];
    if (sync) __syncthreads();
    data[blockIdx.x * n + t] = buffer[n - 1 - t];
}

// each lane hands its value to the next lane through shared memory; `sync` is the __syncwarp
// between write and read (lanes of a warp are not in lock-step since Volta)
__global__ void rotate_in_warp_kernel(int* out, bool sync) {
    __shared__ int slots[32];
    int lane = threadIdx.x;
    slots[lane] = lane * 10;
    if (sync) __syncwarp();
    out[lane] = slots[(lane + 31) % 32];
}

// every thread counts itself into a shared total with atomicAdd; `sync` is the __syncthreads before
// thread 0 reads the total (the atomics order the additions, not the read)
__global__ void count_then_read_kernel(int* out, bool sync) {
    __shared__ int total;
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    atomicAdd(&total, 1);
    if (sync) __syncthreads();
    if (threadIdx.x == 0) *out = total;
}

// llmc/encoder.cuh's backward for the token embedding, one thread per (position, channel) in one or
// several blocks: position t adds its gradient row into row tokens[t] of dwte. Positions with the same
// token add into the same row, so the additions must be atomic; `atomic` chooses.
__global__ void encoder_backward_kernel(float* dwte, const float* dout, const int* tokens, int C, bool atomic) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int t = i / C, c = i % C;
    float* row = dwte + tokens[t] * C;
    if (atomic) {
        atomicAdd(&row[c], dout[t * C + c]);
    } else {
        row[c] += dout[t * C + c];
    }
}

// an element-wise kernel (as gelu_forward is) whose bound check is off by one: thread n reads and
// writes one element past the end of both arrays
__global__ void scale_kernel(float* out, const float* in, int n, bool off_by_one) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (off_by_one ? i <= n : i < n) out[i] = 2.0f * in[i];
}

// the maximum of each row of logits, as the softmax of the classifier takes it, one thread per row;
// `columns` is how far it reads. The rows are padded to `padded` columns (as the vocabulary is padded
// to a multiple of 128) and only the first `used` of each were written: reading up to `padded` reads
// never-written memory. fmaxf(NaN, x) is x, so the emulator's NaN poison vanishes and the result is
// right; on a GPU the padding holds whatever was there before, which may be the largest value.
__global__ void row_max_kernel(float* out, const float* logits, int padded, int columns) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    float m = -INFINITY;
    for (int c = 0; c < columns; c++) m = fmaxf(m, logits[row * padded + c]);
    out[row] = m;
}

// the "last block" reduction (dev/cuda/matmul_backward_bias.cu's v3), one thread per block: each block
// writes its partial, takes a ticket, and the block with the last ticket sums all partials. `fences`:
// the __threadfence between the partial and the ticket, and between the ticket and the reads (PTX's
// release and acquire patterns); without them the reads race with the other blocks' writes.
__global__ void last_block_sum_kernel(float* out, float* partials, unsigned* ticket, bool fences) {
    partials[blockIdx.x] = (float)(blockIdx.x + 1);
    if (fences) __threadfence();
    bool last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    if (!last) return;
    if (fences) __threadfence();
    float sum = 0.0f;
    for (unsigned b = 0; b < gridDim.x; b++) sum += partials[b];
    *out = sum;
    atomicExch(ticket, 0u);
}

__global__ void store_kernel(int* p, int value) { *p = value; }
__global__ void add_one_kernel(int* dst, const int* src) { *dst = *src + 1; }

// Lanes hand values on through shared memory in tiles of 8 (cooperative groups): lane t reads the slot
// of t - 1 in its own tile (wrapping inside the tile) or, with `across_tiles`, of t - 1 in the warp, so
// lanes 8, 16, 24 and 0 read another tile's slot. `sync` between write and read: 0 none, 1 tile.sync()
// (orders the 8 lanes of the caller's tile, no others), 2 __syncwarp() (all 32 lanes).
__global__ void rotate_in_tiles_kernel(int* out, bool across_tiles, int sync) {
    __shared__ int slots[32];
    cooperative_groups::thread_block_tile<8> tile = cooperative_groups::tiled_partition<8>(cooperative_groups::this_thread_block());
    int lane = threadIdx.x;
    slots[lane] = lane * 10;
    if (sync == 1) tile.sync();
    if (sync == 2) __syncwarp();
    int in_tile = lane - (int)tile.thread_rank() + ((int)tile.thread_rank() + 7) % 8;
    out[lane] = slots[across_tiles ? (lane + 31) % 32 : in_tile];
}

// llmc/attention_flash.cuh's key loop in small: a double-buffered cp.async pipeline over `tiles` tiles of
// 64 x 4 floats, one 16-byte copy a thread (64 threads, 2 warps). Iteration j waits for tile j's stage,
// reads the other warp's part of it, and has already issued tile j + 1 into the other stage. `end_sync`
// is the barrier that ends an iteration: without it a thread of a fast warp, in iteration j + 1, issues
// tile j + 2 into the stage the slow warp still reads for tile j.
__global__ void staged_sums_kernel(float* out, const float* in, int tiles, bool end_sync) {
    __shared__ __align__(16) float stage[2][256];
    int t = threadIdx.x, other = (t + 32) % 64;
    cp_async16(&stage[0][4 * t], in + 4 * t);
    cp_async_commit();
    float sum = 0.0f;
    for (int j = 0; j < tiles; j++) {
        if (j + 1 < tiles) cp_async16(&stage[(j + 1) % 2][4 * t], in + (j + 1) * 256 + 4 * t);
        cp_async_commit();
        cp_async_wait<1>();  // tile j has landed (this thread's copy)
        __syncthreads();     // and every thread's
        for (int i = 0; i < 4; i++) sum += stage[j % 2][4 * other + i];
        if (end_sync) __syncthreads();  // every warp is done with the stage before it is refilled
    }
    out[t] = sum;
}

// One warpgroup, D (64 x 64) = A (64 x 16) · Bᵀ (B: 64 x 16), both in the 128-byte swizzled tiles of
// llmc/wgmma.cuh, from integer values (exact sums). `bug` 1: the threads overwrite B with zeros after
// the mma_async is issued and meet at a barrier, before its wait_group (the refill of a stage the
// tensor cores may still read); 2: they read their accumulators before the wait; 3: no wgmma.fence
// before the product; 4: a descriptor with a base offset. 0: the correct order.
__global__ void wgmma_product_kernel(float* out, const float* a, const float* b, int bug) {
    extern __shared__ unsigned char dynamic_smem[];
    unsigned char* tile_a = dynamic_smem;  // 1024-byte aligned in the emulator, as the swizzle needs
    unsigned char* tile_b = dynamic_smem + 64 * 128;
    int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int i = t; i < 64 * 16; i += 128) {
        *(__nv_bfloat16*)(tile_a + wgmma_tile_offset(i / 16, i % 16)) = __float2bfloat16(a[i]);
        *(__nv_bfloat16*)(tile_b + wgmma_tile_offset(i / 16, i % 16)) = __float2bfloat16(b[i]);
    }
    fence_proxy_async();
    __syncthreads();
    float d[32];
    if (bug != 3) wgmma_fence();
    uint64_t desc_a = wgmma_tile_descriptor(tile_a, 0, 0);
    if (bug == 4) desc_a |= 1ull << 49;  // a base offset
    wgmma_m64n64k16_ss<0, 0>(d, desc_a, wgmma_tile_descriptor(tile_b, 0, 0), 0);
    wgmma_commit();
    if (bug == 1) {
        for (int i = t; i < 64 * 16; i += 128) *(__nv_bfloat16*)(tile_b + wgmma_tile_offset(i / 16, i % 16)) = __float2bfloat16(0.0f);
        __syncthreads();
    }
    float early = d[0];
    wgmma_wait<0>();
    for (int i = 0; i < 32; i++) {
        int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * q + (i & 1);
        out[row * 64 + col] = bug == 2 && i == 0 ? early : d[i];
    }
}

// The same product with the tiles loaded by cp.async (bf16 in global memory, 16 bytes a copy). A
// cp.async writes shared memory through the generic proxy and wgmma reads it through the async proxy:
// each thread fences what it copied (fence.proxy.async) before the barrier. `fence` false leaves that out.
__global__ void wgmma_cp_async_kernel(float* out, const __nv_bfloat16* a, const __nv_bfloat16* b, bool fence) {
    extern __shared__ unsigned char dynamic_smem[];
    unsigned char* tile_a = dynamic_smem;
    unsigned char* tile_b = dynamic_smem + 64 * 128;
    int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int c = t; c < 64 * 2; c += 128) {  // chunk c: row c / 2, columns 8 (c % 2) to 8 (c % 2) + 7
        int row = c / 2, col = 8 * (c % 2);
        cp_async16(tile_a + wgmma_tile_offset(row, col), a + row * 16 + col);
        cp_async16(tile_b + wgmma_tile_offset(row, col), b + row * 16 + col);
    }
    cp_async_commit();
    cp_async_wait<0>();
    if (fence) fence_proxy_async();
    __syncthreads();
    float d[32];
    wgmma_fence();
    wgmma_m64n64k16_ss<0, 0>(d, wgmma_tile_descriptor(tile_a, 0, 0), wgmma_tile_descriptor(tile_b, 0, 0), 0);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 32; i++) {
        int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * q + (i & 1);
        out[row * 64 + col] = d[i];
    }
}

}  // namespace emu_seeded

using namespace emu_seeded;

// ----------------------------------------------------------------------------
// bugs the poison catches

// 4 warps, yet every lane of the last reduction reads one of 32 warp slots: slots 4..31 were never
// written. With zero-filled (or carried-over) shared memory the sum came out right and the bug hid.
TEST(EmuSeededBug, BlockReduceReadsUnwrittenWarpSlots) {
    int blocks = 3, threads = 128;
    std::vector<float> in(blocks * threads);
    for (size_t i = 0; i < in.size(); i++) in[i] = (float)(i % 7) - 3.0f;
    float* d_in = device_copy(in);
    float* d_out = device_copy(std::vector<float>(2 * blocks));
    for (bool all_slots : {true, false}) {
        two_sums_kernel<<<blocks, threads>>>(d_out, d_in, true, all_slots);
        std::vector<float> out = download(d_out, 2 * blocks);
        for (int b = 0; b < blocks; b++) {
            float sum = 0, sum_sq = 0;
            for (int t = 0; t < threads; t++) sum += in[b * threads + t], sum_sq += in[b * threads + t] * in[b * threads + t];
            if (all_slots) {
                EXPECT_TRUE(std::isnan(out[2 * b])) << "block " << b << ": the unwritten slots did not read as NaN";
            } else {
                EXPECT_EQ(out[2 * b], sum) << "block " << b;
                EXPECT_EQ(out[2 * b + 1], sum_sq) << "block " << b;
            }
        }
    }
    cudaFree(d_in), cudaFree(d_out);
}

TEST(EmuSeededBug, OffByOneBoundReadsPastTheAllocation) {
#if !defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "needs AddressSanitizer: make EMU_ASAN=1 build/emu-asan/test_emu_seeded_bugs";
#endif
    int n = 100;
    float* d_in = device_copy(std::vector<float>(n, 1.0f));
    float* d_out = device_copy(std::vector<float>(n, 0.0f));
    auto off_by_one = [&] {
        scale_kernel<<<1, 128>>>(d_out, d_in, n, true);
        cudaDeviceSynchronize();
    };
    EXPECT_DEATH(off_by_one(), "AddressSanitizer: use-after-poison.*READ of size 4.*emu_seeded::scale_kernel.*"
                               "cuda-emu: AddressSanitizer: the address is 0 bytes past the end of device allocation "
                               "0x[0-9a-f]+ of 400 bytes \\(out of bounds\\)");
    scale_kernel<<<1, 128>>>(d_out, d_in, n, false);
    EXPECT_EQ(download(d_out, n), std::vector<float>(n, 2.0f));
    cudaFree(d_in), cudaFree(d_out);
}

// ----------------------------------------------------------------------------
// reads of never-written device memory: initcheck (the EMU_ASAN=1 build, dev/emu/device_memory.cpp)

TEST(EmuSeededBug, RowMaximumReadsTheNeverWrittenPadding) {
    int rows = 4, used = 5, padded = 8;
    std::vector<float> host(rows * used);
    for (size_t i = 0; i < host.size(); i++) host[i] = (float)((i * 7) % 11) - 5.0f;
    float* d_logits = nullptr;
    ASSERT_EQ(cudaMalloc(&d_logits, rows * padded * sizeof(float)), cudaSuccess);
    // the used columns of every row, from the host; the padding columns are never written
    ASSERT_EQ(upload_rows(d_logits, host, rows, used, padded), cudaSuccess);
    float* d_out = device_copy(std::vector<float>(rows, 0.0f));
    std::vector<float> expected(rows, -INFINITY);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < used; c++) expected[r] = std::max(expected[r], host[r * used + c]);
    auto buggy = [&] { row_max_kernel<<<1, rows>>>(d_out, d_logits, padded, padded); };
    if (emu::initchecking()) {  // in a child: a report here would make the whole program exit with 67
        EXPECT_EXIT(
            {
                buggy();
                cudaDeviceSynchronize();
                fflush(stdout);
                _exit(emu::initcheck_reports() > 0 ? 3 : 0);  // _exit: initcheck's own exit status stays out of it
            },
            testing::ExitedWithCode(3),
            "cuda-emu: initcheck: kernel emu_seeded::row_max_kernel\\(float\\*, float const\\*, int, int\\) block "
            "\\(0,0,0\\) thread \\(0,0,0\\) reads 4 bytes at 0x[0-9a-f]+ that nothing wrote \\(device allocation "
            "0x[0-9a-f]+ of 128 bytes, offset 20\\)\n  at .*test_emu_seeded_bugs.cpp:[0-9]+");
    } else {  // the poison misses it: the result is the right one
        buggy();
        EXPECT_EQ(download(d_out, rows), expected) << "the NaN poison no longer vanishes in fmaxf: update the table";
    }
    int before = emu::initcheck_reports();
    row_max_kernel<<<1, rows>>>(d_out, d_logits, padded, used);
    EXPECT_EQ(download(d_out, rows), expected);
    EXPECT_EQ(emu::initcheck_reports(), before) << "initcheck reported the correct kernel";
    cudaFree(d_logits), cudaFree(d_out);
}

// A weight gradient accumulated by a GEMM with beta = 1 (as matmul's backward adds into dweight) into a
// buffer nobody zeroed: C = A·B + C reads never-written C. The poison catches it (NaN plus anything is
// NaN); initcheck names the read: the emulated cuBLAS declares what it reads.
TEST(EmuSeededBug, GemmAccumulatesIntoANeverZeroedGradient) {
    int m = 4, n = 3, k = 2;
    float* d_a = device_copy(std::vector<float>(m * k, 1.0f));
    float* d_b = device_copy(std::vector<float>(k * n, 2.0f));
    float* d_c = nullptr;
    ASSERT_EQ(cudaMalloc(&d_c, m * n * sizeof(float)), cudaSuccess);  // the bug: no cudaMemset(d_c, 0, ...)
    cublasHandle_t handle;
    ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    float alpha = 1.0f, beta = 1.0f;
    auto accumulate = [&] {
        EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a, CUDA_R_32F, m, d_b, CUDA_R_32F, k,
                               &beta, d_c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
        cudaDeviceSynchronize();
    };
    if (emu::initchecking()) {
        EXPECT_EXIT(
            {
                accumulate();
                fflush(stdout);
                _exit(emu::initcheck_reports() > 0 ? 3 : 0);
            },
            testing::ExitedWithCode(3),
            "cuda-emu: initcheck: cuBLAS GEMM \\(emulated\\) operand C \\(beta != 0\\) reads 16 bytes at 0x[0-9a-f]+ that "
            "nothing wrote \\(device allocation 0x[0-9a-f]+ of 48 bytes, offset 0\\)");
    } else {
        accumulate();
        for (float c : download(d_c, m * n)) EXPECT_TRUE(std::isnan(c)) << "the never-written C did not read as NaN";
    }
    ASSERT_EQ(cudaMemset(d_c, 0, m * n * sizeof(float)), cudaSuccess);  // the fix
    int before = emu::initcheck_reports();
    accumulate();
    EXPECT_EQ(download(d_c, m * n), std::vector<float>(m * n, 4.0f));  // k = 2 products of 1·2
    EXPECT_EQ(emu::initcheck_reports(), before) << "initcheck reported the zeroed gradient";
    cublasDestroy(handle);
    cudaFree(d_a), cudaFree(d_b), cudaFree(d_c);
}

// ----------------------------------------------------------------------------
// bugs the thread orders catch (and the race checker)

TEST(EmuSeededBug, MissingSyncthreadsBeforeReadingOtherThreadsSlots) {
    int n = 64;
    std::vector<float> in(n);
    for (int i = 0; i < n; i++) in[i] = (float)i;
    float* d = device_copy(in);
    auto run = [&](bool sync) {
        return in_both_orders<float>([&] {
            cudaMemcpy(d, in.data(), n * sizeof(float), cudaMemcpyHostToDevice);
            reverse_kernel<<<1, n>>>(d, sync);
            return download(d, n);
        });
    };
    if (emu::race_checking()) {  // the buggy kernel runs in a child: a report here would fail the whole program
        expect_race([&] { reverse_kernel<<<1, n>>>(d, false); },
                    "cuda-emu: data-race in kernel emu_seeded::reverse_kernel\\(float\\*, bool\\).*static shared memory\\) by "
                    "reverse_kernel block \\(0,0,0\\) thread");
        expect_no_race([&] { reverse_kernel<<<1, n>>>(d, true); });
        cudaFree(d);
        return;
    }
    auto buggy = run(false), correct = run(true);
    EXPECT_NE(buggy[0], buggy[1]) << "the thread orders did not show the missing __syncthreads";
    EXPECT_EQ(correct[0], correct[1]);
    for (int t = 0; t < n; t++) EXPECT_EQ(correct[0][t], (float)(n - 1 - t));
    cudaFree(d);
}

TEST(EmuSeededBug, MissingSyncwarpBetweenLanes) {
    int* d = device_copy(std::vector<int>(32));
    auto run = [&](bool sync) {
        return in_both_orders<int>([&] {
            rotate_in_warp_kernel<<<1, 32>>>(d, sync);
            return download(d, 32);
        });
    };
    if (emu::race_checking()) {  // the buggy kernel runs in a child: a report here would fail the whole program
        expect_race([&] { rotate_in_warp_kernel<<<1, 32>>>(d, false); },
                    "cuda-emu: data-race in kernel emu_seeded::rotate_in_warp_kernel.*static shared memory");
        expect_no_race([&] { rotate_in_warp_kernel<<<1, 32>>>(d, true); });
        cudaFree(d);
        return;
    }
    auto buggy = run(false), correct = run(true);
    EXPECT_NE(buggy[0], buggy[1]) << "the thread orders did not show the missing __syncwarp";
    EXPECT_EQ(buggy[0][0], -1) << "forward order: lane 0 reads lane 31's slot before lane 31 wrote it (poison)";
    EXPECT_EQ(correct[0], correct[1]);
    for (int lane = 0; lane < 32; lane++) EXPECT_EQ(correct[0][lane], (lane + 31) % 32 * 10);
    cudaFree(d);
}

TEST(EmuSeededBug, ReadingAnAtomicTotalWithoutABarrier) {
    int threads = 96;
    int* d = device_copy(std::vector<int>(1));
    auto run = [&](bool sync) {
        return in_both_orders<int>([&] {
            count_then_read_kernel<<<1, threads>>>(d, sync);
            return download(d, 1);
        });
    };
    if (emu::race_checking()) {  // the buggy kernel runs in a child: a report here would fail the whole program
        expect_race([&] { count_then_read_kernel<<<1, threads>>>(d, false); },
                    "cuda-emu: data-race in kernel emu_seeded::count_then_read_kernel.*(atomic).*static shared memory");
        expect_no_race([&] { count_then_read_kernel<<<1, threads>>>(d, true); });
        cudaFree(d);
        return;
    }
    auto buggy = run(false), correct = run(true);
    EXPECT_NE(buggy[0], buggy[1]) << "the thread orders did not show the missing __syncthreads";
    EXPECT_EQ(correct[0][0], threads);
    EXPECT_EQ(correct[1][0], threads);
    cudaFree(d);
}

// ----------------------------------------------------------------------------
// bugs only the race checker catches: the emulator runs a block's threads one at a time between
// synchronization points, so these give the right answer in either thread order

// block_reduce called twice in a row without its leading __syncthreads: a fast warp's second write of
// warp_results[w] can overwrite the slot before a slow warp has read the first result from it
TEST(EmuSeededBug, BlockReduceTwiceWithoutItsLeadingSyncthreads) {
    SKIP_WITHOUT_RACE_CHECKER();
    int threads = 128;
    std::vector<float> in(threads, 1.0f);
    float* d_in = device_copy(in);
    float* d_out = device_copy(std::vector<float>(2));
    expect_race([&] { two_sums_kernel<<<1, threads>>>(d_out, d_in, false, false); },
                "cuda-emu: data-race in kernel emu_seeded::two_sums_kernel.*static shared memory\\) by two_sums_kernel block "
                "\\(0,0,0\\) thread \\(([0-9]+),0,0\\).*static shared memory\\) by two_sums_kernel block \\(0,0,0\\) thread");
    expect_no_race([&] { two_sums_kernel<<<1, threads>>>(d_out, d_in, true, false); });
    EXPECT_EQ(download(d_out, 2), std::vector<float>({(float)threads, (float)threads}));
    cudaFree(d_in), cudaFree(d_out);
}

// several threads add into one global row with a plain read-modify-write: lost updates on a GPU.
// One block of T * C threads, or T blocks of C threads (one per position; the threads of one block
// touch different addresses, so the race is between blocks: they run one after the other here, but
// the race checker does not order them). The repeated tokens sit two positions apart.
void encoder_backward_test(bool one_block) {
    int C = 8;
    std::vector<int> tokens = {3, 1, 3, 0, 3, 1};  // token 3 three times, token 1 twice
    int T = (int)tokens.size(), V = 4;
    std::vector<float> dout(T * C);
    for (int i = 0; i < T * C; i++) dout[i] = (float)(i % 5);
    int* d_tokens = device_copy(tokens);
    float* d_dout = device_copy(dout);
    float* d_dwte = device_copy(std::vector<float>(V * C, 0.0f));
    dim3 grid = one_block ? 1 : T, block = one_block ? T * C : C;
    expect_race([&] { encoder_backward_kernel<<<grid, block>>>(d_dwte, d_dout, d_tokens, C, false); },
                one_block ? "cuda-emu: data-race in kernel emu_seeded::encoder_backward_kernel.*of 4 bytes at 0x[0-9a-f]+ "
                            "\\(global memory\\) by encoder_backward_kernel block \\(0,0,0\\) thread"
                          : "cuda-emu: data-race in kernel emu_seeded::encoder_backward_kernel.*\\(global memory\\) by "
                            "encoder_backward_kernel block \\(([0-9]),0,0\\) thread.*\\(global memory\\) by "
                            "encoder_backward_kernel block \\(([0-9]),0,0\\) thread");
    expect_no_race([&] { encoder_backward_kernel<<<grid, block>>>(d_dwte, d_dout, d_tokens, C, true); });
    std::vector<float> expected(V * C, 0.0f);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) expected[tokens[t] * C + c] += dout[t * C + c];
    EXPECT_EQ(download(d_dwte, V * C), expected);
    cudaFree(d_tokens), cudaFree(d_dout), cudaFree(d_dwte);
}

TEST(EmuSeededBug, EncoderBackwardWithoutAtomicsInOneBlock) {
    SKIP_WITHOUT_RACE_CHECKER();
    encoder_backward_test(true);
}

TEST(EmuSeededBug, EncoderBackwardWithoutAtomicsAcrossBlocks) {
    SKIP_WITHOUT_RACE_CHECKER();
    encoder_backward_test(false);
}

TEST(EmuSeededBug, LastBlockReductionWithoutThreadfence) {
    int blocks = 6;
    float* d_out = device_copy(std::vector<float>{0.0f});
    float* d_partials = device_copy(std::vector<float>(blocks, 0.0f));
    unsigned* d_ticket = device_copy(std::vector<unsigned>{0u});
    if (emu::race_checking()) {
        expect_race([&] { last_block_sum_kernel<<<blocks, 1>>>(d_out, d_partials, d_ticket, false); },
                    "cuda-emu: data-race in kernel emu_seeded::last_block_sum_kernel.*\\(global memory\\) by "
                    "last_block_sum_kernel block \\(5,0,0\\) thread \\(0,0,0\\)");
        expect_no_race([&] { last_block_sum_kernel<<<blocks, 1>>>(d_out, d_partials, d_ticket, true); });
    } else {  // blocks run one after another here: the sum is right either way
        last_block_sum_kernel<<<blocks, 1>>>(d_out, d_partials, d_ticket, false);
        EXPECT_EQ(download(d_out, 1)[0], 21.0f) << "the plain build now catches the missing fences: update the table";
        last_block_sum_kernel<<<blocks, 1>>>(d_out, d_partials, d_ticket, true);
    }
    EXPECT_EQ(download(d_out, 1)[0], 21.0f);  // 1 + 2 + ... + 6
    EXPECT_EQ(download(d_ticket, 1)[0], 0u);
    cudaFree(d_out), cudaFree(d_partials), cudaFree(d_ticket);
}

// x = 1 on one stream, then y = x + 1 on another (as the gradient all-reduce on its own stream reads
// what the backward pass wrote), with or without cudaStreamWaitEvent between them. Returns y.
int produce_consume(bool with_event) {
    cudaStream_t compute, comm;
    cudaEvent_t ready;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    int* x = device_copy(std::vector<int>{0});
    int* y = device_copy(std::vector<int>{0});
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

// The stream orders catch it when the consumer's stream runs first (EMU_STREAM_ORDER=newest, the
// default: the newer stream first); the race checker whichever runs first.
TEST(EmuSeededBug, MissingStreamWaitEvent) {
    if (emu::race_checking()) {  // the buggy launches run in a child: a report here would fail the whole program
        expect_race([] { produce_consume(false); },
                    "cuda-emu: data-race in kernel emu_seeded::(store|add_one)_kernel.*by (add_one|store)_kernel block "
                    "\\(0,0,0\\) thread \\(0,0,0\\).*by (store|add_one)_kernel block \\(0,0,0\\) thread");
        expect_no_race([] { EXPECT_EQ(produce_consume(true), 2); });
        return;
    }
    EXPECT_EQ(produce_consume(false), 1) << "the consumer's (newer) stream should have run first";
    EXPECT_EQ(produce_consume(true), 2);
    emu::set_stream_order(emu::StreamOrder::issue);
    EXPECT_EQ(produce_consume(false), 2);
    emu::set_stream_order(emu::StreamOrder::newest_stream_first);
}

// a tile's sync orders its own lanes only: reading another tile's slot after tile.sync() is a race, as
// on the GPU (the other tile may not have written yet); the thread orders do not show it (every lane
// writes before any tile's sync opens, in both orders), the race checker does
TEST(EmuSeededBug, TileSyncDoesNotOrderOtherTiles) {
    SKIP_WITHOUT_RACE_CHECKER();
    int* d = device_copy(std::vector<int>(32));
    expect_race([&] { rotate_in_tiles_kernel<<<1, 32>>>(d, false, 0); },
                "cuda-emu: data-race in kernel emu_seeded::rotate_in_tiles_kernel.*static shared memory");
    expect_race([&] { rotate_in_tiles_kernel<<<1, 32>>>(d, true, 1); },
                "cuda-emu: data-race in kernel emu_seeded::rotate_in_tiles_kernel.*static shared memory");
    expect_no_race([&] { rotate_in_tiles_kernel<<<1, 32>>>(d, false, 1); });
    expect_no_race([&] { rotate_in_tiles_kernel<<<1, 32>>>(d, true, 2); });
    std::vector<int> out = download(d, 32);
    for (int lane = 0; lane < 32; lane++) EXPECT_EQ(out[lane], (lane + 31) % 32 * 10);
    cudaFree(d);
}

// A cp.async may land any time from its issue to the wait that covers it. The emulator's default
// lands it at the wait, after the next barrier here, so the sums come out right in both thread orders
// whether or not the refill waits for the slow warp; the race checker sees the copy's write as made at
// the issue (exec.cpp's copy windows) and reports the refill (before those windows it did not: the
// write was seen at the wait only, ordered after the slow warp's reads by the barrier in between).
TEST(EmuSeededBug, CpAsyncRefillsAStageAnotherWarpStillReads) {
    SKIP_WITHOUT_RACE_CHECKER();
    const int tiles = 3;  // the least with a refill of a stage read before
    std::vector<float> in(tiles * 256);
    for (size_t i = 0; i < in.size(); i++) in[i] = (float)(i % 7);
    float* d_in = device_copy(in);
    float* d_out = device_copy(std::vector<float>(64));
    expect_race([&] { staged_sums_kernel<<<1, 64>>>(d_out, d_in, tiles, false); },
                "cuda-emu: data-race in kernel emu_seeded::staged_sums_kernel.*\\(static shared memory\\) by cp.async "
                "of block \\(0,0,0\\) thread");
    expect_no_race([&] { staged_sums_kernel<<<1, 64>>>(d_out, d_in, tiles, true); });
    std::vector<float> out = download(d_out, 64);
    for (int t = 0; t < 64; t++) {
        float sum = 0.0f;
        for (int j = 0; j < tiles; j++) {
            for (int i = 0; i < 4; i++) sum += in[j * 256 + 4 * ((t + 32) % 64) + i];
        }
        EXPECT_EQ(out[t], sum) << "thread " << t;
    }
    cudaFree(d_in), cudaFree(d_out);
}

// wgmma (llmc/wgmma.cuh) is asynchronous: the tensor cores may read shared memory and write the
// accumulators any time until the wait_group. The emulator reads the operands at the wait and holds the
// accumulators as NaN until then (dev/emu/wgmma_emu.h): a refill before the wait computes with the new
// contents (and the race checker names the read "by wgmma.mma_async"), an early read of an
// accumulator sees NaN.
TEST(EmuSeededBug, WgmmaOperandsAndAccumulatorsTouchedBeforeTheWait) {
    std::vector<float> a(64 * 16), b(64 * 16), expected(64 * 64);
    for (int i = 0; i < 64 * 16; i++) a[i] = (float)(i % 7 - 3), b[i] = (float)(i % 5 - 2);
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < 64; n++) {
            float sum = 0.0f;
            for (int k = 0; k < 16; k++) sum += a[m * 16 + k] * b[n * 16 + k];
            expected[m * 64 + n] = sum;
        }
    float* d_a = device_copy(a);
    float* d_b = device_copy(b);
    float* d_out = device_copy(std::vector<float>(64 * 64));
    const size_t smem = 2 * 64 * 128;
    if (emu::race_checking()) {  // the buggy kernel in a child (a report here would fail the whole program)
        expect_race([&] { wgmma_product_kernel<<<1, 128, smem>>>(d_out, d_a, d_b, 1); },
                    "cuda-emu: data-race in kernel emu_seeded::wgmma_product_kernel.*by wgmma.mma_async of block \\(0,0,0\\)");
        expect_no_race([&] { wgmma_product_kernel<<<1, 128, smem>>>(d_out, d_a, d_b, 0); });
    }
    for (int bug : {0, 1, 2}) {
        if (bug == 1 && emu::race_checking()) continue;  // run in the child above
        SCOPED_TRACE("bug " + std::to_string(bug));
        wgmma_product_kernel<<<1, 128, smem>>>(d_out, d_a, d_b, bug);
        std::vector<float> out = download(d_out, 64 * 64);
        int wrong = 0;
        for (int i = 0; i < 64 * 64; i++) wrong += !(out[i] == expected[i]);
        if (bug == 0) EXPECT_EQ(wrong, 0);
        if (bug == 1) EXPECT_GT(wrong, 64 * 64 / 2) << "the refill before the wait went unseen";
        if (bug == 2) {
            EXPECT_TRUE(std::isnan(out[0])) << "the accumulator read before the wait was " << out[0];
            EXPECT_EQ(wrong, 128) << "thread t's first accumulator alone";  // one an accumulator's thread
        }
    }
    cudaFree(d_a), cudaFree(d_b), cudaFree(d_out);
}

// On a GPU a missing fence.proxy.async between a cp.async and the wgmma that reads its data shows as
// stale operands now and then; the emulator's memory has one proxy, so it notes which thread's cp.async
// wrote each 16-byte chunk and whether that thread fenced since (dev/emu/mma_emu.h), and stops the run
// at the wgmma's issue.
TEST(EmuSeededBug, WgmmaReadsWhatACpAsyncWroteWithoutTheProxyFence) {
    if (emu::race_checking()) GTEST_SKIP() << "not a race: the plain and ASan builds check it";
    std::vector<__nv_bfloat16> a(64 * 16), b(64 * 16);
    std::vector<float> expected(64 * 64);
    for (int i = 0; i < 64 * 16; i++) a[i] = __float2bfloat16((float)(i % 7 - 3)), b[i] = __float2bfloat16((float)(i % 5 - 2));
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < 64; n++) {
            float sum = 0.0f;
            for (int k = 0; k < 16; k++) sum += __bfloat162float(a[m * 16 + k]) * __bfloat162float(b[n * 16 + k]);
            expected[m * 64 + n] = sum;
        }
    __nv_bfloat16* d_a = device_copy(a);
    __nv_bfloat16* d_b = device_copy(b);
    float* d_out = device_copy(std::vector<float>(64 * 64));
    const size_t smem = 2 * 64 * 128;
    wgmma_cp_async_kernel<<<1, 128, smem>>>(d_out, d_a, d_b, true);
    std::vector<float> out = download(d_out, 64 * 64);
    int wrong = 0;
    for (int i = 0; i < 64 * 64; i++) wrong += !(out[i] == expected[i]);
    EXPECT_EQ(wrong, 0) << "with the fence";
    auto unfenced = [&] {
        wgmma_cp_async_kernel<<<1, 128, smem>>>(d_out, d_a, d_b, false);
        cudaDeviceSynchronize();
    };
    EXPECT_DEATH(unfenced(), "wgmma.mma_async.m64n64k16 in block \\(0,0,0\\) thread [0-9]+ reads shared address 0x[0-9a-f]+, "
                             "which a cp.async of thread [0-9]+ wrote \\(the generic proxy\\) with no fence.proxy.async");
    cudaFree(d_a), cudaFree(d_b), cudaFree(d_out);
}

// What the emulator refuses outright, each with its message: an mma_async without a wgmma.fence since the
// last wait, a descriptor it does not emulate (a base offset), a warpgroup of fewer than 128 threads.
TEST(EmuSeededBug, WgmmaMisuseStopsTheRunNamingIt) {
    if (emu::race_checking()) GTEST_SKIP() << "not a race: the plain and ASan builds check it";
    std::vector<float> a(64 * 16, 1.0f), b(64 * 16, 1.0f);
    float* d_a = device_copy(a);
    float* d_b = device_copy(b);
    float* d_out = device_copy(std::vector<float>(64 * 64));
    const size_t smem = 2 * 64 * 128;
    auto run = [&](int threads, int bug) {
        wgmma_product_kernel<<<1, threads, smem>>>(d_out, d_a, d_b, bug);
        cudaDeviceSynchronize();
    };
    EXPECT_DEATH(run(128, 3), "wgmma.mma_async.m64n64k16 in block \\(0,0,0\\) thread 0: no wgmma.fence since");
    EXPECT_DEATH(run(128, 4), "has a base offset \\(1\\): not emulated");
    EXPECT_DEATH(run(96, 0), "wgmma.fence needs all 128 threads of a warpgroup .* the block of 96 threads");
    cudaFree(d_a), cudaFree(d_b), cudaFree(d_out);
}

// what the race checker must not report: barriers, shuffles, atomics, several blocks and launches
// reusing the same shared and global memory, copies between the host and the device
TEST(EmuSeededBug, CorrectKernelsAreNotReported) {
    SKIP_WITHOUT_RACE_CHECKER();
    int blocks = 4, threads = 256;
    std::vector<float> in(blocks * threads);
    for (size_t i = 0; i < in.size(); i++) in[i] = (float)(i % 3);
    float* d_in = device_copy(in);
    float* d_out = device_copy(std::vector<float>(2 * blocks));
    expect_no_race([&] {
        for (int launch = 0; launch < 2; launch++) {
            two_sums_kernel<<<blocks, threads>>>(d_out, d_in, true, false);
            reverse_kernel<<<blocks, threads>>>(d_in, true);
        }
    });
    std::vector<float> out = download(d_out, 2 * blocks);
    for (int b = 0; b < blocks; b++) {
        float sum = 0;
        for (int t = 0; t < threads; t++) sum += in[b * threads + t];
        EXPECT_EQ(out[2 * b], sum);
    }
    cudaFree(d_in), cudaFree(d_out);
}

int main(int argc, char** argv) {
    setenv("EMU_REGISTER_WARNINGS", "0", 0);  // these kernels are not in the ptxas table
    testing::InitGoogleTest(&argc, argv);
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    return RUN_ALL_TESTS();
}
