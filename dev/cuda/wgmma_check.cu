// Hopper's warpgroup matrix multiply (llmc/wgmma.cuh) against a CPU product: do the wrappers, the
// descriptors, the 128-byte swizzled tile layout (wgmma_tile_offset) and the register fragments mean
// what llmc/wgmma.cuh says they mean? Not a kernel to time: the foundation the sm_90 flash attention
// will stand on (issue 52), checked before anything is built on it.
//
// On an H100 or H200 this asks the hardware; under the CPU emulator (make emu-devcuda-check) it asks
// dev/emu/wgmma_emu.h, which was written from the PTX ISA independently of llmc/wgmma.cuh's helpers:
// both passing means the emulator reads the ISA as the GPU does (in the cases below). On a GPU
// without wgmma (sm_80) it says so and exits 0.
//
// Each case: one warpgroup computes D (64 x N) = A (64 x 64) · B (64 x N) in four k16 steps chained
// into the same accumulators, from a start D of random values (accumulate) or of NaN (not: the
// instruction must ignore D). The operands' placements:
//   ss128 N=64, N=128   A and B in shared memory, K-major, 128-byte swizzle (attention's Q·Kᵀ)
//   ss-none N=64        both K-major without swizzle: 8x8 core matrices of 128 bytes, LBO 128 (the next 8
//                       k), SBO 256 (the next 8 rows), a layout of this program's own
//   rs128 N=64, N=128   A from registers (mma.sync's A fragment), B N-major, 128-byte swizzle (attention's
//                       P·V); at N = 128, B's two 64-column tiles are LBO = 8192 bytes apart
// Values: small integers first (every sum exact in fp32, so the result must equal the CPU's to the bit,
// whatever the order of the hardware's additions), then random bf16 values (against the CPU's sum in
// double, to 2^-20 of the sum of the terms' magnitudes: a few fp32 roundings).
//
//   make -C dev/cuda bin/wgmma_check && dev/cuda/bin/wgmma_check
#include "harness.cuh"

#include "../../llmc/mma.cuh"
#include "../../llmc/wgmma.cuh"

enum class Placement { ss128, ss_none, rs128 };

// A (64 x 64) K-major without swizzle: element (r, k) of k16 slice j = k / 16 at
// j·(rows·32) + (r / 8)·256 + ((k % 16) / 8)·128 + (r % 8)·16 + (k % 8)·2
__host__ __device__ inline uint32_t core_matrix_offset(int r, int k, int rows) {
    return (uint32_t)((k / 16) * rows * 32 + (r / 8) * 256 + ((k % 16) / 8) * 128 + (r % 8) * 16 + (k % 8) * 2);
}

// a_g (64 x 64) and b_g (64 k x N) row-major bf16; c_g, d_g (64 x N) fp32
template <int N, Placement P>
__global__ void __launch_bounds__(128) wgmma_case_kernel(float* d_g, const float* c_g, const floatX* a_g,
                                                        const floatX* b_g, int accumulate) {
    extern __shared__ unsigned char dynamic_smem[];
    // the tiles on 1024-byte boundaries (the 128-byte swizzle's pattern starts there)
    unsigned char* smem = (unsigned char*)(((uintptr_t)dynamic_smem + 1023) & ~(uintptr_t)1023);
    unsigned char* tile_a = smem;             // 64 rows x 128 bytes
    unsigned char* tile_b = smem + 64 * 128;  // N x 64 (K-major) or 64 x N (N-major) bf16
    const int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;

    for (int i = t; i < 64 * 64; i += 128) {
        int r = i / 64, k = i % 64;
        if (P == Placement::ss128) *(floatX*)(tile_a + wgmma_tile_offset(r, k)) = a_g[i];
        if (P == Placement::ss_none) *(floatX*)(tile_a + core_matrix_offset(r, k, 64)) = a_g[i];
    }
    for (int i = t; i < 64 * N; i += 128) {
        int k = i / N, n = i % N;  // B[k][n]
        if (P == Placement::ss128) *(floatX*)(tile_b + wgmma_tile_offset(n, k)) = b_g[i];  // row n of k's
        if (P == Placement::ss_none) *(floatX*)(tile_b + core_matrix_offset(n, k, N)) = b_g[i];
        if (P == Placement::rs128) *(floatX*)(tile_b + (n / 64) * 8192 + wgmma_tile_offset(k, n % 64)) = b_g[i];
    }
    fence_proxy_async();  // the stores above are read by the tensor cores
    __syncthreads();

    // D's fragment: d[i] at row 16w + g + 8((i >> 1) & 1), column 8(i >> 2) + 2q + (i & 1)
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * q + (i & 1);
        d[i] = accumulate ? c_g[row * N + col] : __int_as_float(0x7fffffff);  // NaN: must be ignored
    }
    // register A: mma.sync's A fragment of rows 16w..16w+15, for k16 slice j: a[j][x] = row
    // 16w + g + 8(x & 1), columns 16j + 2q + 8(x >> 1) and the next (written before the fence)
    uint32_t a[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            int row = 16 * w + g + 8 * (x & 1), col = 16 * j + 2 * q + 8 * (x >> 1);
            a[j][x] = P == Placement::rs128 ? pack_bf16x2((float)a_g[row * 64 + col], (float)a_g[row * 64 + col + 1]) : 0u;
        }
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int acc = j > 0 || accumulate;
        if (P == Placement::rs128) {
            uint64_t desc_b = wgmma_descriptor(tile_b + 2048 * j, 8192, 1024, WGMMA_SWIZZLE_128B);
            if constexpr (N == 64) wgmma_m64n64k16_rs<1>(d, a[j], desc_b, acc);
            else wgmma_m64n128k16_rs<1>(d, a[j], desc_b, acc);
        } else {
            uint64_t desc_a, desc_b;
            if (P == Placement::ss128) {
                desc_a = wgmma_tile_descriptor(tile_a, j, 0);
                desc_b = wgmma_tile_descriptor(tile_b, j, 0);
            } else {
                desc_a = wgmma_descriptor(tile_a + j * 64 * 32, 128, 256, WGMMA_SWIZZLE_NONE);
                desc_b = wgmma_descriptor(tile_b + j * N * 32, 128, 256, WGMMA_SWIZZLE_NONE);
            }
            if constexpr (N == 64) wgmma_m64n64k16_ss<0, 0>(d, desc_a, desc_b, acc);
            else wgmma_m64n128k16_ss<0, 0>(d, desc_a, desc_b, acc);
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * q + (i & 1);
        d_g[row * N + col] = d[i];
    }
}

struct Case {
    const char* name;
    int n;
    Placement placement;
};

template <int N, Placement P>
void launch(float* d, const float* c, const floatX* a, const floatX* b, int accumulate) {
    size_t smem = 1024 + 64 * 128 + (size_t)N * 128;  // the alignment's slack, A, B
    cudaCheck(cudaFuncSetAttribute(wgmma_case_kernel<N, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    wgmma_case_kernel<N, P><<<1, 128, smem>>>(d, c, a, b, accumulate);
    cudaCheckLaunch();
}

// Runs one case; returns the number of elements outside the tolerance (0 for the integer values:
// exact) and prints a line.
int run_case(const Case& cs, bool integers, int accumulate) {
    const int N = cs.n;
    std::vector<float> a(64 * 64), b(64 * N), c(64 * N);
    std::mt19937 rng((uint32_t)dev::next_seed());
    std::uniform_int_distribution<int> small(-4, 4);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto value = [&]() { return integers ? (float)small(rng) : dev::round_to_floatX(normal(rng)); };
    for (float& x : a) x = value();
    for (float& x : b) x = value();
    for (float& x : c) x = integers ? (float)small(rng) * 16.0f : normal(rng);
    dev::DeviceBuffer<floatX> d_a(a.size()), d_b(b.size());
    dev::DeviceBuffer<float> d_c(c.size()), d_d(c.size());
    dev::upload(d_a, a);
    dev::upload(d_b, b);
    dev::upload(d_c, c);
    dev::poison(d_d);
    if (cs.placement == Placement::ss128 && N == 64) launch<64, Placement::ss128>(d_d.ptr, d_c.ptr, d_a.ptr, d_b.ptr, accumulate);
    if (cs.placement == Placement::ss128 && N == 128) launch<128, Placement::ss128>(d_d.ptr, d_c.ptr, d_a.ptr, d_b.ptr, accumulate);
    if (cs.placement == Placement::ss_none) launch<64, Placement::ss_none>(d_d.ptr, d_c.ptr, d_a.ptr, d_b.ptr, accumulate);
    if (cs.placement == Placement::rs128 && N == 64) launch<64, Placement::rs128>(d_d.ptr, d_c.ptr, d_a.ptr, d_b.ptr, accumulate);
    if (cs.placement == Placement::rs128 && N == 128) launch<128, Placement::rs128>(d_d.ptr, d_c.ptr, d_a.ptr, d_b.ptr, accumulate);
    std::vector<float> out = dev::download(d_d);
    int bad = 0;
    double worst = 0.0;
    for (int m = 0; m < 64; m++) {
        for (int n = 0; n < N; n++) {
            double sum = accumulate ? c[m * N + n] : 0.0, magnitude = std::fabs(sum);
            for (int k = 0; k < 64; k++) {
                sum += (double)a[m * 64 + k] * b[k * N + n];
                magnitude += std::fabs((double)a[m * 64 + k] * b[k * N + n]);
            }
            double err = std::fabs(out[m * N + n] - sum), tol = integers ? 0.0 : magnitude * 0x1p-20;
            if (!(err <= tol)) {  // NaN fails
                if (bad < 3) printf("    D[%d][%d] = %.9g, expected %.9g\n", m, n, out[m * N + n], sum);
                bad++;
            }
            worst = std::max(worst, magnitude > 0 ? err / magnitude : err);
        }
    }
    printf("%-8s N=%-3d %-8s %-10s %s (largest error %.2e of the terms' magnitude)\n", cs.name, N,
           integers ? "integers" : "random", accumulate ? "D += A·B" : "D = A·B", bad == 0 ? "ok" : "FAILED", worst);
    return bad;
}

int main(int argc, char** argv) {
    dev::device_init("wgmma_check", argc, argv);
    if (dev::device().prop.major != 9) {
        printf("wgmma_check: wgmma is sm_90's (this is compute capability %d.%d); nothing to check here.\n",
               dev::device().prop.major, dev::device().prop.minor);
        return 0;
    }
    const Case cases[] = {
        {"ss128", 64, Placement::ss128},  {"ss128", 128, Placement::ss128}, {"ss-none", 64, Placement::ss_none},
        {"rs128", 64, Placement::rs128},  {"rs128", 128, Placement::rs128},
    };
    int failed = 0, total = 0;
    for (const Case& cs : cases)
        for (int integers = 1; integers >= 0; integers--)
            for (int accumulate = 0; accumulate <= 1; accumulate++) {
                failed += run_case(cs, integers != 0, accumulate) != 0;
                total++;
            }
    printf("\nCHECK|wgmma|%s\n", failed == 0 ? ("all " + std::to_string(total) + " ok").c_str()
                                             : (std::to_string(failed) + " of " + std::to_string(total) + " FAILED").c_str());
    return failed == 0 ? 0 : 1;
}
