// Matmul forward (a Linear layer), version by version: out (N, OC) = inp (N, C) · weight (OC, C)ᵀ + bias,
// bf16 operands, fp32 accumulation, at the trainer's five shapes (N = B·T = 8192):
//   qkv 768 -> 2304,  attproj 768 -> 768,  fc 768 -> 3072,  fcproj 3072 -> 768,  lm_head 768 -> 50304 (no bias)
// Every version runs at the fc shape; the fast ones (v3-v5) at all five. Checked against
// matmul_forward() of llmc/matmul.h (on every row, except lm_head: 64 rows spread over all tile
// positions, as the full CPU product would take minutes; every element is still checked for being
// written) and timed.
//
// The two numbers at fc: 2·N·C·OC = 38.7 GFLOP, ~50 us at 790 TFLOP/s; the bytes (inp, weight, out:
// 67 MB) take ~22 us at 3 TB/s. Matrix bound: the reported fraction is of a cuBLAS 8192^3 GEMM
// measured in the same run, and at the end our tensor-core kernel (v3) is set against cuBLAS and
// cuBLASLt at each shape.
//
// v6 is the trainer's cuBLASLt call with autotuning (-at 1, llmc/matmul.cuh): the first call of a shape
// times the heuristic's first 8 candidates on these buffers and keeps the fastest, where v5 keeps the
// heuristic's first. Why it can be faster: the heuristic ranks kernels by a model of the GPU, not by
// running them, and its first is not always the fastest at a given shape. The AUTOTUNE lines at the
// end set v6 against v5, measured in the same run (on a GPU; under the emulator every candidate is the
// same CPU product, so the times only show the harness works).
//
//   make -C dev/cuda bin/matmul_forward && dev/cuda/bin/matmul_forward
#include "harness.cuh"
#include "../../llmc/mma.cuh"

#include "../../llmc/matmul.cuh"
#include "../../llmc/matmul.h"

// ----------------------------------------------------------------------------
// v1: one thread per output element, the dot product straight from global memory. A warp's 32
// threads take 32 neighbouring outputs o of one row n: they all read the same inp element (a
// broadcast) and 32 weight elements C apart (32 separate sectors). Every operand is fetched from
// L1/L2 once per multiply: 2 loads per 2 flops, on the fp32 units.

__global__ void matmul_forward_v1_kernel(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                                         int N, int C, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    int n = blockIdx.y;
    if (o >= OC) return;
    const floatX* x = inp + (size_t)n * C;
    const floatX* w = weight + (size_t)o * C;
    float sum = bias != nullptr ? (float)bias[o] : 0.0f;
    for (int c = 0; c < C; c++) sum += (float)x[c] * (float)w[c];
    out[(size_t)n * OC + o] = (floatX)sum;
}

void matmul_forward_v1(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC,
                       int block_size) {
    dim3 grid(ceil_div_int(OC, block_size), N);
    matmul_forward_v1_kernel<<<grid, block_size>>>(out, inp, weight, bias, N, C, OC);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v2: shared-memory tiles and register blocking, still on the fp32 units. A block of 256 threads
// computes a 64x64 tile of out: it stages a 64x16 slab of inp and of weight in shared memory (as
// fp32, transposed so a thread's reads are contiguous), and each thread accumulates a 4x4 grid of
// outputs in registers. Per slab, each loaded element serves 64 multiply-adds instead of 1, and per
// multiply-add a thread reads 0.5 shared values instead of 2 global ones. A thread's 4x4 outputs
// are 16 rows/columns apart (not adjacent), so a warp's shared reads are broadcasts or consecutive
// words: no bank conflicts.

constexpr int TILED_SIZE = 64;   // rows and columns of out per block
constexpr int TILED_K = 16;      // depth of a slab
constexpr int TILED_THREADS = 256;

__global__ void __launch_bounds__(TILED_THREADS) matmul_forward_v2_kernel(floatX* out, const floatX* inp,
                                                                           const floatX* weight, const floatX* bias,
                                                                           int N, int C, int OC) {
    __shared__ float inp_tile[TILED_K][TILED_SIZE + 4];     // [k][n]
    __shared__ float weight_tile[TILED_K][TILED_SIZE + 4];  // [k][o]
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int n0 = blockIdx.y * TILED_SIZE, o0 = blockIdx.x * TILED_SIZE;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < C; k0 += TILED_K) {
#pragma unroll
        for (int i = 0; i < TILED_SIZE * TILED_K / TILED_THREADS; i++) {
            int idx = threadIdx.x + i * TILED_THREADS;
            int r = idx / TILED_K, kk = idx % TILED_K;
            inp_tile[kk][r] = (float)inp[(size_t)(n0 + r) * C + k0 + kk];
            weight_tile[kk][r] = (float)weight[(size_t)(o0 + r) * C + k0 + kk];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILED_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = inp_tile[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = weight_tile[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int o = o0 + tx + 16 * j;
        float b = bias != nullptr ? (float)bias[o] : 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) out[(size_t)(n0 + ty + 16 * i) * OC + o] = (floatX)(acc[i][j] + b);
    }
}

void matmul_forward_v2(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC) {
    if (N % TILED_SIZE != 0 || OC % TILED_SIZE != 0 || C % TILED_K != 0) {
        fatal("matmul_forward_v2 needs N, OC divisible by %d and C by %d (got %d, %d, %d)", TILED_SIZE, TILED_K, N, OC,
              C);
    }
    dim3 grid(OC / TILED_SIZE, N / TILED_SIZE);
    matmul_forward_v2_kernel<<<grid, TILED_THREADS>>>(out, inp, weight, bias, N, C, OC);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v3: tensor cores through mma.sync (see llmc/mma.cuh). A block of 8 warps computes a 128x128 tile of out;
// each warp a 64x32 piece of it, as 4x4 mma tiles of 16x8 with fp32 accumulators in registers (64
// floats per lane). Both operands are K-contiguous (a row of inp, a row of weight), which is what
// mma's row.col form wants, so ldmatrix loads the fragments without transposes. Slabs of 32 k are
// copied global -> shared with cp.async, 3 stages deep: while the warps multiply slab k, slabs k+1
// and k+2 are in flight. Shared rows are padded from 64 to 80 bytes so the 8 rows an ldmatrix reads
// fall in 8 different bank groups. The bias is added in the epilogue, on the way out of registers.
// What it lacks next to cuBLAS on Hopper: wgmma (sm_90a's warpgroup MMA, with operands read straight
// from shared memory) and the TMA copy engine; mma.sync is Ampere's instruction, and on an H100 it
// reaches well under Hopper's peak.

constexpr int MMA_BM = 128;  // rows of out per block (N)
constexpr int MMA_BN = 128;  // columns of out per block (OC)
constexpr int MMA_BK = 32;   // k per slab
constexpr int MMA_STAGES = 3;
constexpr int MMA_THREADS = 256;
constexpr int MMA_LDS = MMA_BK + 8;  // shared row stride in bf16: 80 bytes
constexpr size_t MMA_SHARED_BYTES = (size_t)MMA_STAGES * (MMA_BM + MMA_BN) * MMA_LDS * sizeof(floatX);

__global__ void __launch_bounds__(MMA_THREADS) matmul_forward_v3_kernel(floatX* out, const floatX* inp,
                                                                         const floatX* weight, const floatX* bias,
                                                                         int N, int C, int OC) {
    extern __shared__ __align__(16) unsigned char mma_shared[];
    floatX* a_shared = reinterpret_cast<floatX*>(mma_shared);  // [STAGES][BM][LDS]: rows of inp
    floatX* b_shared = a_shared + MMA_STAGES * MMA_BM * MMA_LDS;  // [STAGES][BN][LDS]: rows of weight
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int warp_m = warp / 4;  // which 64 rows of the block's 128
    int warp_n = warp % 4;  // which 32 columns of the block's 128
    int block_row = blockIdx.y * MMA_BM, block_col = blockIdx.x * MMA_BN;
    const floatX* a_global = inp + (size_t)block_row * C;
    const floatX* b_global = weight + (size_t)block_col * C;

    // a slab is 128 rows x 32 k of each operand: 512 chunks of 16 bytes each, 2 per thread
    auto load_slab = [&](int stage, int k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int chunk = threadIdx.x + i * MMA_THREADS;
            int row = chunk / 4, col = (chunk % 4) * 8;
            cp_async16(a_shared + (stage * MMA_BM + row) * MMA_LDS + col, a_global + (size_t)row * C + k0 + col);
            cp_async16(b_shared + (stage * MMA_BN + row) * MMA_LDS + col, b_global + (size_t)row * C + k0 + col);
        }
    };

    float acc[4][4][4] = {};  // [16-row tile][8-column tile][fragment]
    int num_slabs = C / MMA_BK;
#pragma unroll
    for (int s = 0; s < MMA_STAGES - 1; s++) {
        if (s < num_slabs) load_slab(s, s * MMA_BK);
        cp_async_commit();
    }
    for (int slab = 0; slab < num_slabs; slab++) {
        cp_async_wait<MMA_STAGES - 2>();  // this thread's copies of `slab` have landed...
        __syncthreads();                  // ...and everyone's; also, all warps are done with slab - 1
        int next = slab + MMA_STAGES - 1;
        if (next < num_slabs) load_slab(next % MMA_STAGES, next * MMA_BK);  // into slab - 1's stage
        cp_async_commit();

        const floatX* a_tile = a_shared + (slab % MMA_STAGES) * MMA_BM * MMA_LDS;
        const floatX* b_tile = b_shared + (slab % MMA_STAGES) * MMA_BN * MMA_LDS;
#pragma unroll
        for (int kk = 0; kk < MMA_BK; kk += 16) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                int row = warp_m * 64 + mi * 16 + lane % 16;
                int col = kk + (lane / 16) * 8;
                ldmatrix_x4(a[mi], a_tile + row * MMA_LDS + col);
            }
#pragma unroll
            for (int pair = 0; pair < 2; pair++) {
                // matrices: (cols 0-7, k 0-7), (cols 0-7, k 8-15), (cols 8-15, k 0-7), (cols 8-15, k 8-15)
                int row = warp_n * 32 + pair * 16 + lane % 8 + (lane / 16) * 8;
                int col = kk + ((lane / 8) % 2) * 8;
                uint32_t r[4];
                ldmatrix_x4(r, b_tile + row * MMA_LDS + col);
                b[2 * pair][0] = r[0];
                b[2 * pair][1] = r[1];
                b[2 * pair + 1][0] = r[2];
                b[2 * pair + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
            }
        }
    }
    cp_async_wait<0>();  // no copies left in flight at exit (the last groups are empty)

#pragma unroll
    for (int ni = 0; ni < 4; ni++) {
        int col = block_col + warp_n * 32 + ni * 8 + (lane % 4) * 2;
        float bias0 = bias != nullptr ? (float)bias[col] : 0.0f;
        float bias1 = bias != nullptr ? (float)bias[col + 1] : 0.0f;
#pragma unroll
        for (int mi = 0; mi < 4; mi++) {
            int row = block_row + warp_m * 64 + mi * 16 + lane / 4;
            *reinterpret_cast<__nv_bfloat162*>(out + (size_t)row * OC + col) =
                __floats2bfloat162_rn(acc[mi][ni][0] + bias0, acc[mi][ni][1] + bias1);
            *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(row + 8) * OC + col) =
                __floats2bfloat162_rn(acc[mi][ni][2] + bias0, acc[mi][ni][3] + bias1);
        }
    }
}

void matmul_forward_v3(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC) {
    if (N % MMA_BM != 0 || OC % MMA_BN != 0 || C % MMA_BK != 0) {
        fatal("matmul_forward_v3 needs N divisible by %d, OC by %d and C by %d (got %d, %d, %d)", MMA_BM, MMA_BN,
              MMA_BK, N, OC, C);
    }
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(matmul_forward_v3_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)MMA_SHARED_BYTES));
        configured = true;
    }
    dim3 grid(OC / MMA_BN, N / MMA_BM);
    matmul_forward_v3_kernel<<<grid, MMA_THREADS, MMA_SHARED_BYTES>>>(out, inp, weight, bias, N, C, OC);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v4: cuBLAS (cublasGemmEx, bf16 in and out, fp32 compute), then the bias in a separate kernel. The
// library picks a Hopper kernel (wgmma, TMA) from its heuristics; the bias costs one more pass over out.

__global__ void add_bias_kernel(floatX* out, const floatX* bias, int N, int OC) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= (size_t)N * OC) return;
    int o = idx % OC;
    x128 y = load128(out + idx);
    x128 b = load128(bias + o);
#pragma unroll
    for (int k = 0; k < x128::size; k++) y[k] = (floatX)((float)y[k] + (float)b[k]);
    store128(out + idx, y);
}

void matmul_forward_v4(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C, int OC) {
    // column-major view: outᵀ (OC, N) = weight (OC, C) · inpᵀ (C, N); weight is stored (C, OC) column-major
    const float alpha = 1.0f, beta = 0.0f;
    cublasCheck(cublasGemmEx(cublas_context.blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, weight, CUDA_R_16BF, C,
                             inp, CUDA_R_16BF, C, &beta, out, CUDA_R_16BF, OC, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
    if (bias != nullptr) {
        add_bias_kernel<<<ceil_div_int((long)N * OC / x128::size, 256), 256>>>(out, bias, N, OC);
        cudaCheckLaunch();
    }
}

// ----------------------------------------------------------------------------
// v5 is llmc's matmul_forward (llmc/matmul.cuh): cuBLASLt with the bias fused into the GEMM's epilogue,
// so the bias rides on the output write.

// ----------------------------------------------------------------------------

struct Shape {
    const char* name;
    int N, C, OC;
    bool has_bias;
    bool all_versions;  // the slow lessons (v1, v2) run at one shape only
    bool full_check;    // false: check a sample of rows against the CPU (lm_head)
};

struct ShapeTimes {
    std::string name;
    double mma_ms = 0.0, cublas_ms = 0.0, cublaslt_ms = 0.0, autotuned_ms = 0.0;
};

int run_shape(const Shape& shape, std::vector<ShapeTimes>* times) {
    const int N = shape.N, C = shape.C, OC = shape.OC;
    printf("\n== %s: (%d, %d) x (%d, %d)ᵀ%s\n", shape.name, N, C, OC, C, shape.has_bias ? " + bias" : "");
    std::vector<float> inp = dev::random_floatX((size_t)N * C, -1.0f, 1.0f);
    std::vector<float> weight = dev::random_floatX((size_t)OC * C, -1.0f, 1.0f);
    std::vector<float> bias = dev::random_floatX(OC, -1.0f, 1.0f);
    const float* bias_host = shape.has_bias ? bias.data() : nullptr;

    // the reference: every row, or a sample of 64 rows spread over all positions in a 128-row tile
    std::vector<int> check_rows;
    for (int i = 0; i < (shape.full_check ? N : 64); i++) {
        check_rows.push_back(shape.full_check ? i : (i * (N / 64) + (i * 37) % (N / 64)) % N);
    }
    int R = (int)check_rows.size();
    std::vector<float> inp_rows((size_t)R * C), ref((size_t)R * OC);
    for (int i = 0; i < R; i++) {
        std::copy(inp.begin() + (size_t)check_rows[i] * C, inp.begin() + (size_t)(check_rows[i] + 1) * C,
                  inp_rows.begin() + (size_t)i * C);
    }
    matmul_forward(ref.data(), inp_rows.data(), weight.data(), bias_host, R, C, OC);

    dev::DeviceBuffer<floatX> d_inp((size_t)N * C), d_weight((size_t)OC * C), d_bias(OC), d_out((size_t)N * OC);
    dev::upload(d_inp, inp);
    dev::upload(d_weight, weight);
    dev::upload(d_bias, bias);
    const floatX* b = shape.has_bias ? d_bias.ptr : nullptr;

    double flops = 2.0 * N * C * (double)OC;
    double bytes = ((double)N * C + (double)OC * C + (double)N * OC) * sizeof(floatX);
    char op[96];
    snprintf(op, sizeof(op), "matmul_forward %s %dx%d->%d", shape.name, N, C, OC);
    dev::Report report = dev::make_report(op, bytes, flops);
    std::vector<dev::Version> versions;
    if (shape.all_versions) {
        versions.push_back({"v1 one thread per output", {64, 128, 256},
                            [&](int bs) { matmul_forward_v1(d_out.ptr, d_inp.ptr, d_weight.ptr, b, N, C, OC, bs); }});
        versions.push_back({"v2 shared-memory tiles, 4x4 per thread", {0},
                            [&](int) { matmul_forward_v2(d_out.ptr, d_inp.ptr, d_weight.ptr, b, N, C, OC); }});
    }
    versions.push_back({"v3 tensor cores: mma.sync, cp.async", {0},
                        [&](int) { matmul_forward_v3(d_out.ptr, d_inp.ptr, d_weight.ptr, b, N, C, OC); }});
    versions.push_back({"v4 cuBLAS + bias kernel", {0},
                        [&](int) { matmul_forward_v4(d_out.ptr, d_inp.ptr, d_weight.ptr, b, N, C, OC); }});
    versions.push_back({"v5 llmc: cuBLASLt, bias epilogue", {0},
                        [&](int) { matmul_forward(d_out.ptr, nullptr, d_inp.ptr, d_weight.ptr, b, N, C, OC, 0); }});
    // its own choices, apart from v5's (which the trainer without -at 1 keeps)
    static MatmulAlgorithms autotuned = [] {
        MatmulAlgorithms m;
        m.autotune = true;
        return m;
    }();
    versions.push_back({"v6 llmc: cuBLASLt, autotuned (-at 1)", {0}, [&](int) {
                            std::swap(matmul_algorithms, autotuned);
                            matmul_forward(d_out.ptr, nullptr, d_inp.ptr, d_weight.ptr, b, N, C, OC, 0);
                            std::swap(matmul_algorithms, autotuned);
                        }});

    dev::run_versions(&report, versions, [&] { dev::poison(d_out); },
                      [&] {
                          dev::CheckResult result;
                          std::vector<float> out = dev::download(d_out);
                          dev::check_all_finite(&result, "out", out);
                          std::vector<float> out_rows((size_t)R * OC);
                          for (int i = 0; i < R; i++) {
                              std::copy(out.begin() + (size_t)check_rows[i] * OC,
                                        out.begin() + (size_t)(check_rows[i] + 1) * OC,
                                        out_rows.begin() + (size_t)i * OC);
                          }
                          dev::check_tensor(&result, "out", out_rows, ref, dev::TOL_REDUCTION);
                          return result;
                      });
    ShapeTimes t;
    t.name = op;
    for (const dev::Row& row : report.rows) {
        if (row.version.rfind("v3", 0) == 0) t.mma_ms = row.timing.median_ms;
        if (row.version.rfind("v4", 0) == 0) t.cublas_ms = row.timing.median_ms;
        if (row.version.rfind("v5", 0) == 0) t.cublaslt_ms = row.timing.median_ms;
        if (row.version.rfind("v6", 0) == 0) t.autotuned_ms = row.timing.median_ms;
    }
    times->push_back(t);
    return dev::finish(report);
}

int main(int argc, char** argv) {
    dev::device_init("matmul_forward", argc, argv);
    cublas_setup();
    const int N = dev::B * dev::T, C = dev::C;
    std::vector<Shape> shapes = {
        {"fc", N, C, 4 * C, true, true, true},
        {"qkv", N, C, 3 * C, true, false, true},
        {"attproj", N, C, C, true, false, true},
        {"fcproj", N, 4 * C, C, true, false, true},
        {"lm_head", N, C, dev::Vp, false, false, false},
    };
    std::vector<ShapeTimes> times;
    int status = 0;
    for (const Shape& shape : shapes) status |= run_shape(shape, &times);

    cublas_teardown();
    if (dev::check_only) return status;
    // our tensor-core kernel against the libraries, shape by shape (times include v4's bias kernel)
    printf("\nv3 (mma.sync) against cuBLAS (v4) and cuBLASLt (v5), median us:\n");
    for (const ShapeTimes& t : times) {
        printf("RATIO|%s|%.1f|%.1f|%.1f|%.1f\n", t.name.c_str(), t.mma_ms * 1e3, t.cublas_ms * 1e3,
               t.cublaslt_ms * 1e3, 100.0 * t.cublaslt_ms / t.mma_ms);
    }
    printf("\ncuBLASLt autotuned (v6) against the heuristic's first (v5), median us, ratio v6/v5:\n");
    for (const ShapeTimes& t : times) {
        printf("AUTOTUNE|%s|%.1f|%.1f|%.3f\n", t.name.c_str(), t.cublaslt_ms * 1e3, t.autotuned_ms * 1e3,
               t.autotuned_ms / t.cublaslt_ms);
    }
    return status;
}
