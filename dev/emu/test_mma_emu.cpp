// One-warp unit tests of the emulated tensor-core primitives of llmc/mma.cuh (dev/emu/mma_emu.h).
// Each kernel is one warp that loads known matrices, applies one primitive and writes what every lane
// got; the expected values are worked out here from the PTX ISA's definitions, element by element
// (the per-element index formulas of "Matrix Fragments for mma.m16n8k16", not the emulation's code).
// Entries are small integers, exact in bf16, so the fp32 sums are exact and compared with ==.
// Built like every emulated CUDA source (cu2cpp.sh rewrites the <<< >>> launches): make emu-test-mma.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../../llmc/mma.cuh"

namespace {

template <typename T>
T* to_device(const std::vector<T>& host) {
    T* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

uint16_t bf16_bits(float x) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    uint16_t bits;
    memcpy(&bits, &b, 2);
    return bits;
}

float bf16_value(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float x;
    memcpy(&x, &wide, 4);
    return x;
}

// small integers in [-range, range], a fixed pseudo-random pattern
float small_int(int i, int salt, int range) { return (float)(((i * 7 + salt * 13 + (i * i) % 11) % (2 * range + 1)) - range); }

// ----------------------------------------------------------------------------
// mma.m16n8k16 with the PTX ISA's per-element fragment formulas (groupID = lane >> 2,
// threadID_in_group = lane % 4). A has 8 elements a0..a7 per lane, two per .b32 register, element
// a(2j) in the low half of register j; likewise B (b0..b3) and C/D (c0..c3, one fp32 each).
//   A: row = groupID for a0, a1, a4, a5, groupID + 8 otherwise;  col = threadID_in_group * 2 + (i & 1), + 8 for i >= 4
//   B: row = threadID_in_group * 2 + (i & 1), + 8 for i >= 2;     col = groupID
//   C: row = groupID for c0, c1, groupID + 8 otherwise;         col = threadID_in_group * 2 + (i & 1)

__device__ int a_row(int lane, int i) { return (i < 2 || (i >= 4 && i < 6)) ? lane / 4 : lane / 4 + 8; }
__device__ int a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
__device__ int b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
__device__ int b_col(int lane, int) { return lane / 4; }
__device__ int c_row(int lane, int i) { return i < 2 ? lane / 4 : lane / 4 + 8; }
__device__ int c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }

// A (16x16 row-major bf16 bits), B (16x8: B[k][n] at k * 8 + n), C and D (16x8 fp32, row-major)
__global__ void mma_kernel(float* D, const uint16_t* A, const uint16_t* B, const float* C) {
    int lane = threadIdx.x;
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    for (int i = 0; i < 8; i++) a[i / 2] |= (uint32_t)A[a_row(lane, i) * 16 + a_col(lane, i)] << (16 * (i % 2));
    for (int i = 0; i < 4; i++) b[i / 2] |= (uint32_t)B[b_row(lane, i) * 8 + b_col(lane, i)] << (16 * (i % 2));
    float d[4];
    for (int i = 0; i < 4; i++) d[i] = C[c_row(lane, i) * 8 + c_col(lane, i)];
    mma_bf16_16816(d, a, b);
    for (int i = 0; i < 4; i++) D[c_row(lane, i) * 8 + c_col(lane, i)] = d[i];
}

TEST(EmuMma, M16n8k16MatchesThePlainProduct) {
    std::vector<uint16_t> A(16 * 16), B(16 * 8);
    std::vector<float> C(16 * 8);
    for (int i = 0; i < 16 * 16; i++) A[i] = bf16_bits(small_int(i, 1, 8));
    for (int i = 0; i < 16 * 8; i++) B[i] = bf16_bits(small_int(i, 2, 8));
    for (int i = 0; i < 16 * 8; i++) C[i] = small_int(i, 3, 100);
    uint16_t* dA = to_device(A);
    uint16_t* dB = to_device(B);
    float* dC = to_device(C);
    float* dD = to_device(std::vector<float>(16 * 8, -12345.0f));
    mma_kernel<<<1, 32>>>(dD, dA, dB, dC);
    std::vector<float> D = to_host(dD, 16 * 8);
    for (int m = 0; m < 16; m++) {
        for (int n = 0; n < 8; n++) {
            double expected = C[m * 8 + n];
            for (int k = 0; k < 16; k++) expected += (double)bf16_value(A[m * 16 + k]) * bf16_value(B[k * 8 + n]);
            EXPECT_EQ(D[m * 8 + n], (float)expected) << "D[" << m << "][" << n << "]";
        }
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}

// the summation model (mma_emu.h): c and the 16 products in one wide sum, rounded once. Starting from
// c = 2^24, fp32 additions one by one would lose each +1 to rounding (ties to even) and leave 2^24; the
// wide sum gives 2^24 + 16 exactly. Documents the model; that an H100 gives the same here is not checked
// (its sum is wider than fp32, by how much is not documented).
TEST(EmuMma, AccumulatesInOneWideSumRoundedOnce) {
    std::vector<uint16_t> A(16 * 16, bf16_bits(1.0f)), B(16 * 8, bf16_bits(1.0f));
    std::vector<float> C(16 * 8, 16777216.0f);
    uint16_t* dA = to_device(A);
    uint16_t* dB = to_device(B);
    float* dC = to_device(C);
    float* dD = to_device(std::vector<float>(16 * 8, 0.0f));
    mma_kernel<<<1, 32>>>(dD, dA, dB, dC);
    std::vector<float> D = to_host(dD, 16 * 8);
    for (float d : D) EXPECT_EQ(d, 16777232.0f);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}

// ----------------------------------------------------------------------------
// ex2.approx.ftz.f32 (exp2_approx): within 2^-22 of 2^x (plus two float roundings, 2^-23), not the
// correctly rounded value everywhere (a model that is never off would let a kernel's tolerance rely
// on exactness), subnormal results flushed to +0, and the softmax's special values.

__global__ void exp2_approx_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = exp2_approx(in[i]);
}

TEST(EmuEx2Approx, WithinItsBoundFlushesSubnormalsAndIsNotCorrectlyRounded) {
    std::vector<float> in;
    for (int i = 0; i < 2000; i++) in.push_back(-100.0f + 0.1f * (float)i + 0.0123f);  // -100 .. 100
    in.push_back(-INFINITY), in.push_back(INFINITY), in.push_back(0.0f), in.push_back(-130.0f);
    in.push_back(-126.5f);
    float* d_in = to_device(in);
    float* d_out = to_device(std::vector<float>(in.size(), 0.0f));
    int n = (int)in.size();
    exp2_approx_kernel<<<(n + 127) / 128, 128>>>(d_out, d_in, n);
    std::vector<float> out = to_host(d_out, in.size());
    int inexact = 0;
    for (int i = 0; i < 2000; i++) {
        double exact = std::exp2((double)in[i]);
        EXPECT_LE(std::fabs(out[i] - exact), (0x1p-22 + 0x1p-23) * exact) << "2^" << in[i];
        if (out[i] != (float)exact) inexact++;
    }
    EXPECT_GT(inexact, 500);                // most results are off by the modeled error
    EXPECT_EQ(out[2000], 0.0f);             // 2^-inf
    EXPECT_TRUE(std::isinf(out[2001]));     // 2^inf
    EXPECT_NEAR(out[2002], 1.0f, 0x1p-22);  // 2^0
    EXPECT_EQ(out[2003], 0.0f);             // 2^-130: subnormal, flushed (exp2f gives 7.3e-40)
    EXPECT_EQ(out[2004], 0.0f);             // 2^-126.5 < 2^-126, the smallest normal float
    cudaFree(d_in), cudaFree(d_out);
}

// ----------------------------------------------------------------------------
// ldmatrix.x4: four 8x8 b16 matrices in shared memory, at scattered places with a padded row stride;
// lane 8m + r gives the address of row r of matrix m. out[lane][m] is register m of each lane.

constexpr int LDS = 40;  // shared row stride in b16 (80 bytes, a multiple of 16)

__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* matrices, int trans) {
    __shared__ __align__(16) uint16_t tile[32 * LDS];
    int lane = threadIdx.x;
    // matrix m, row r lives at tile row 8m + r, columns 8 * ((m + 1) % 4) .. + 7
    for (int i = lane; i < 4 * 64; i += 32) {
        int m = i / 64, r = (i / 8) % 8, c = i % 8;
        tile[(8 * m + r) * LDS + 8 * ((m + 1) % 4) + c] = matrices[i];
    }
    __syncwarp();
    int m = lane / 8, r = lane % 8;
    const uint16_t* row = &tile[(8 * m + r) * LDS + 8 * ((m + 1) % 4)];
    uint32_t regs[4];
    if (trans) {
        ldmatrix_x4_trans(regs, row);
    } else {
        ldmatrix_x4(regs, row);
    }
    for (int j = 0; j < 4; j++) out[lane * 4 + j] = regs[j];
}

std::vector<uint32_t> run_ldmatrix(const std::vector<uint16_t>& matrices, bool trans) {
    uint16_t* d_matrices = to_device(matrices);
    uint32_t* d_out = to_device(std::vector<uint32_t>(32 * 4, 0xDEADBEEFu));
    ldmatrix_kernel<<<1, 32>>>(d_out, d_matrices, trans ? 1 : 0);
    std::vector<uint32_t> out = to_host(d_out, 32 * 4);
    cudaFree(d_matrices), cudaFree(d_out);
    return out;
}

// element (r, c) of matrix m: a distinct value for every element
std::vector<uint16_t> numbered_matrices() {
    std::vector<uint16_t> matrices(4 * 64);
    for (int i = 0; i < 4 * 64; i++) matrices[i] = (uint16_t)(0x1000 + i);
    return matrices;
}

TEST(EmuLdmatrix, X4GivesEachLaneItsRowPair) {
    std::vector<uint16_t> M = numbered_matrices();
    std::vector<uint32_t> out = run_ldmatrix(M, false);
    // PTX ISA: each thread receives row lane/4, elements 2(lane%4) (low half) and 2(lane%4)+1 (high half)
    for (int lane = 0; lane < 32; lane++) {
        for (int m = 0; m < 4; m++) {
            int r = lane / 4, c = 2 * (lane % 4);
            uint32_t expected = (uint32_t)M[m * 64 + r * 8 + c] | ((uint32_t)M[m * 64 + r * 8 + c + 1] << 16);
            EXPECT_EQ(out[lane * 4 + m], expected) << "lane " << lane << " matrix " << m;
        }
    }
}

TEST(EmuLdmatrix, X4TransGivesEachLaneItsColumnPair) {
    std::vector<uint16_t> M = numbered_matrices();
    std::vector<uint32_t> out = run_ldmatrix(M, true);
    // .trans: the same fragment of the transposed matrix, element (r, c) of it being M[c][r]
    for (int lane = 0; lane < 32; lane++) {
        for (int m = 0; m < 4; m++) {
            int r = lane / 4, c = 2 * (lane % 4);
            uint32_t expected = (uint32_t)M[m * 64 + c * 8 + r] | ((uint32_t)M[m * 64 + (c + 1) * 8 + r] << 16);
            EXPECT_EQ(out[lane * 4 + m], expected) << "lane " << lane << " matrix " << m;
        }
    }
}

// ldmatrix feeding mma, as dev/cuda's kernels use them: A (16x16) row-major and B stored as 8 rows of
// 16 k values (the "col" operand) in shared memory; x4 gives A's four registers, and for B one x4
// over its two 8x8 halves [n][0..7], [n][8..15] gives b0, b1 (registers 0 and 1).
__global__ void ldmatrix_mma_kernel(float* D, const uint16_t* A, const uint16_t* Bt) {
    __shared__ __align__(16) uint16_t a_tile[16 * 24];
    __shared__ __align__(16) uint16_t b_tile[8 * 24];
    int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) a_tile[(i / 16) * 24 + i % 16] = A[i];
    for (int i = lane; i < 128; i += 32) b_tile[(i / 16) * 24 + i % 16] = Bt[i];
    __syncwarp();
    uint32_t a[4], b[4];
    // matrices: 0 = rows 0-7 k 0-7, 1 = rows 8-15 k 0-7, 2 = rows 0-7 k 8-15, 3 = rows 8-15 k 8-15
    ldmatrix_x4(a, &a_tile[(lane % 16) * 24 + (lane / 16) * 8]);
    // matrices 0, 1 = n 0-7 with k 0-7 and k 8-15; lanes 16-31 repeat them (registers 2, 3 unused)
    ldmatrix_x4(b, &b_tile[(lane % 8) * 24 + ((lane / 8) % 2) * 8]);
    float d[4] = {0, 0, 0, 0};
    mma_bf16_16816(d, a, b);
    int g = lane / 4, t = lane % 4;
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

TEST(EmuMma, LdmatrixFragmentsFeedMma) {
    std::vector<uint16_t> A(256), Bt(128);  // Bt[n][k] = B[k][n]
    for (int i = 0; i < 256; i++) A[i] = bf16_bits(small_int(i, 4, 6));
    for (int i = 0; i < 128; i++) Bt[i] = bf16_bits(small_int(i, 5, 6));
    uint16_t* dA = to_device(A);
    uint16_t* dBt = to_device(Bt);
    float* dD = to_device(std::vector<float>(128, -1.0f));
    ldmatrix_mma_kernel<<<1, 32>>>(dD, dA, dBt);
    std::vector<float> D = to_host(dD, 128);
    for (int m = 0; m < 16; m++) {
        for (int n = 0; n < 8; n++) {
            double expected = 0.0;
            for (int k = 0; k < 16; k++) expected += (double)bf16_value(A[m * 16 + k]) * bf16_value(Bt[n * 16 + k]);
            EXPECT_EQ(D[m * 8 + n], (float)expected) << "D[" << m << "][" << n << "]";
        }
    }
    cudaFree(dA), cudaFree(dBt), cudaFree(dD);
}

// ----------------------------------------------------------------------------
// .sync.aligned: every lane of the warp must execute the same warp-wide instruction at the same point.
// Lane `odd` executes ldmatrix where the others execute mma (the same count of warp-wide calls, another
// instruction): the run must stop naming it, whichever lane is the odd one (the first, one in the middle,
// the last: the emulator compares each lane with its neighbour on a circle, so the ends matter).
__global__ void odd_lane_kernel(float* D, const uint16_t* A, int odd) {
    __shared__ __align__(16) uint16_t tile[16 * 16];
    int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) tile[i] = A[i];
    __syncwarp();
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    if (lane == odd) {
        ldmatrix_x4(a, &tile[(lane % 16) * 16 + (lane / 16) * 8]);
    } else {
        mma_bf16_16816(d, a, b);
    }
    D[lane] = d[0] + (float)a[0];
}

TEST(EmuMma, LanesAtDifferentWarpWideInstructionsStopTheRun) {
    if (emu::race_checking()) GTEST_SKIP() << "not a race: the plain build checks it";
    uint16_t* dA = to_device(std::vector<uint16_t>(256, bf16_bits(1.0f)));
    float* dD = to_device(std::vector<float>(32, 0.0f));
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    for (int odd : {0, 13, 31}) {
        auto launch = [&] {
            odd_lane_kernel<<<1, 32>>>(dD, dA, odd);
            cudaDeviceSynchronize();
        };
        EXPECT_DEATH(launch(), "all lanes must execute the same instructions") << "odd lane " << odd;
    }
    cudaFree(dA), cudaFree(dD);
}

// ----------------------------------------------------------------------------
// cp.async: two groups of 16 bytes per lane; what each lane sees in its destinations before any wait,
// after wait_group 1 (the older group must have landed) and after wait_group 0 (both). The source is
// 0x01.. bytes, the destination starts as 0xAA. The PTX ISA allows the data to land any time before
// the covering wait; the emulator's default (EMU_CP_ASYNC=wait) lands it exactly at the wait, which is
// what the "before" expectations check. Reading a destination before its wait is therefore a race with
// the copy, which the race checker (EMU_TSAN) reports: there the test expects that report instead.

__global__ void cp_async_kernel(uint32_t* seen, const uint4* src) {
    __shared__ __align__(16) uint4 dst[64];
    int lane = threadIdx.x;
    dst[lane] = make_uint4(0xAAAAAAAAu, 0xAAAAAAAAu, 0xAAAAAAAAu, 0xAAAAAAAAu);
    dst[32 + lane] = dst[lane];
    cp_async16(&dst[lane], &src[lane]);
    cp_async_commit();
    cp_async16(&dst[32 + lane], &src[32 + lane]);
    cp_async_commit();
    seen[lane * 6 + 0] = dst[lane].x;
    seen[lane * 6 + 1] = dst[32 + lane].x;
    cp_async_wait<1>();
    seen[lane * 6 + 2] = dst[lane].x;
    seen[lane * 6 + 3] = dst[32 + lane].x;
    cp_async_wait<0>();
    seen[lane * 6 + 4] = dst[lane].x;
    seen[lane * 6 + 5] = dst[32 + lane].w;
}

TEST(EmuCpAsync, DataLandsAtTheCoveringWaitGroup) {
    std::vector<uint4> src(64);
    for (int i = 0; i < 64; i++) src[i] = make_uint4(0x01000000u + i, 1, 2, 0x02000000u + i);
    uint4* d_src = to_device(src);
    uint32_t* d_seen = to_device(std::vector<uint32_t>(32 * 6, 0));
    if (emu::race_checking()) {  // in a child: a report here would fail the whole program
        GTEST_FLAG_SET(death_test_style, "threadsafe");
        auto launch = [&] {
            cp_async_kernel<<<1, 32>>>(d_seen, d_src);
            cudaDeviceSynchronize();
        };
        EXPECT_EXIT(
            {
                launch();
                fflush(stdout);
                _exit(emu::race_reports() > 0 ? 3 : 0);
            },
            testing::ExitedWithCode(3), "cuda-emu: data-race in kernel .*by cp.async of block \\(0,0,0\\) thread");
        cudaFree(d_src), cudaFree(d_seen);
        return;
    }
    cp_async_kernel<<<1, 32>>>(d_seen, d_src);
    std::vector<uint32_t> seen = to_host(d_seen, 32 * 6);
    for (int lane = 0; lane < 32; lane++) {
        const uint32_t* s = &seen[lane * 6];
        EXPECT_EQ(s[0], 0xAAAAAAAAu) << "lane " << lane << ": group 0 visible before any wait";
        EXPECT_EQ(s[1], 0xAAAAAAAAu) << "lane " << lane << ": group 1 visible before any wait";
        EXPECT_EQ(s[2], 0x01000000u + lane) << "lane " << lane << ": group 0 missing after wait_group 1";
        EXPECT_EQ(s[3], 0xAAAAAAAAu) << "lane " << lane << ": group 1 visible after wait_group 1";
        EXPECT_EQ(s[4], 0x01000000u + lane) << "lane " << lane << ": group 0 missing after wait_group 0";
        EXPECT_EQ(s[5], 0x02000000u + 32 + lane) << "lane " << lane << ": group 1 missing after wait_group 0";
    }
    cudaFree(d_src), cudaFree(d_seen);
}

}  // namespace
