// Tests of the emulated cuBLAS and cuBLASLt (dev/emu/cublas*.cpp) against values worked out from the
// definitions in NVIDIA's documentation: column-major storage, op(X), alpha/beta, the epilogues, bf16
// rounding to nearest even, TF32 inputs, the heuristic's alignment promise, the legacy cublasSgemm. Expected values are written
// out by hand or computed here in double from the formulas, never by the emulator or by our callers;
// the randomized test compares with a plain triple loop written below.
//
//   make -j2 -f dev/emu/emu.mk -f dev/emu/cublas.mk emu-test-cublas
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

// ----------------------------------------------------------------------------
// helpers: device buffers and bf16 bits written by definition (bf16 = the top 16 bits of an fp32)

uint16_t bf16_exact(float f) {  // only for values bf16 holds exactly (checked)
    uint32_t u;
    memcpy(&u, &f, 4);
    EXPECT_EQ(u & 0xffffu, 0u) << f << " is not exact in bf16";
    return (uint16_t)(u >> 16);
}
float bf16_value(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

template <typename T>
struct Device {
    T* ptr = nullptr;
    size_t count = 0;
    explicit Device(const std::vector<T>& host) : count(host.size()) {
        EXPECT_EQ(cudaMalloc(&ptr, count * sizeof(T)), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    ~Device() { cudaFree(ptr); }
    std::vector<T> download() const {
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<T> host(count);
        EXPECT_EQ(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return host;
    }
};

constexpr float PAD = -999.0f;  // fills the rows beyond each matrix's extent inside its leading dimension

// The worked example: A (2x3) = [1 2 3; 4 5 6], B (3x2) = [7 8; 9 10; 11 12],
// A·B = [1·7+2·9+3·11, 1·8+2·10+3·12; 4·7+5·9+6·11, 4·8+5·10+6·12] = [58 64; 139 154].
const float A23[2][3] = {{1, 2, 3}, {4, 5, 6}};
const float B32[3][2] = {{7, 8}, {9, 10}, {11, 12}};
const float AB22[2][2] = {{58, 64}, {139, 154}};

// Column-major storage of a rows x cols matrix (or of its transpose when `transposed`) with leading
// dimension ld, padding rows filled with PAD.
template <size_t R, size_t C>
std::vector<float> store(const float (&m)[R][C], bool transposed, int ld) {
    int rows = transposed ? C : R, cols = transposed ? R : C;
    std::vector<float> out((size_t)ld * cols, PAD);
    for (int j = 0; j < cols; j++) {
        for (int i = 0; i < rows; i++) out[i + (size_t)j * ld] = transposed ? m[j][i] : m[i][j];
    }
    return out;
}

struct Blas {
    cublasHandle_t handle = nullptr;
    Blas() { EXPECT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS); }
    ~Blas() { cublasDestroy(handle); }
};

// ----------------------------------------------------------------------------
// cublasGemmEx / cublasGemmStridedBatchedEx

TEST(CublasGemmEx, EveryTransposeWithPaddedLeadingDimensions) {
    Blas blas;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? 5 : 4, ldb = tb ? 3 : 6, ldc = 3;  // all larger than the stored rows
            Device<float> a(store(A23, ta, lda)), b(store(B32, tb, ldb));
            Device<float> c(std::vector<float>((size_t)ldc * 2, PAD));
            float alpha = 1.0f, beta = 0.0f;
            ASSERT_EQ(cublasGemmEx(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, 2, 2, 3,
                                   &alpha, a.ptr, CUDA_R_32F, lda, b.ptr, CUDA_R_32F, ldb, &beta, c.ptr, CUDA_R_32F,
                                   ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      CUBLAS_STATUS_SUCCESS);
            std::vector<float> out = c.download();
            for (int j = 0; j < 2; j++) {
                for (int i = 0; i < 2; i++) EXPECT_EQ(out[i + j * ldc], AB22[i][j]) << "ta " << ta << " tb " << tb;
                EXPECT_EQ(out[2 + j * ldc], PAD) << "padding row written";
            }
        }
    }
}

TEST(CublasGemmEx, AlphaBetaAccumulate) {
    Blas blas;
    Device<float> a(store(A23, false, 2)), b(store(B32, false, 3));
    Device<float> c(std::vector<float>{1, 3, 2, 4});  // C = [1 2; 3 4]
    float alpha = 2.0f, beta = -1.0f;
    ASSERT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &alpha, a.ptr, CUDA_R_32F, 2, b.ptr,
                           CUDA_R_32F, 3, &beta, c.ptr, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    // 2·[58 64; 139 154] - [1 2; 3 4] = [115 126; 275 304]
    EXPECT_EQ(c.download(), (std::vector<float>{115, 275, 126, 304}));
}

TEST(CublasGemmEx, BetaZeroDoesNotReadC) {
    Blas blas;
    Device<float> a(store(A23, false, 2)), b(store(B32, false, 3));
    Device<float> c(std::vector<float>(4, NAN));
    float alpha = 1.0f, beta = 0.0f;
    ASSERT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &alpha, a.ptr, CUDA_R_32F, 2, b.ptr,
                           CUDA_R_32F, 3, &beta, c.ptr, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(c.download(), (std::vector<float>{58, 139, 64, 154}));
}

TEST(CublasGemmEx, Bf16InputsAndOutput) {
    Blas blas;
    std::vector<uint16_t> a_bits, b_bits;
    for (float v : store(A23, true, 3)) a_bits.push_back(bf16_exact(v));  // stored transposed, (3, 2)
    for (float v : store(B32, false, 3)) b_bits.push_back(bf16_exact(v));
    Device<uint16_t> a(a_bits), b(b_bits), c(std::vector<uint16_t>(4, 0));
    float alpha = 1.0f, beta = 0.0f;
    ASSERT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 3, &alpha, a.ptr, CUDA_R_16BF, 3, b.ptr,
                           CUDA_R_16BF, 3, &beta, c.ptr, CUDA_R_16BF, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    // 58, 139, 64, 154 all fit in bf16's 8 significant bits
    std::vector<uint16_t> out = c.download();
    EXPECT_EQ(out, (std::vector<uint16_t>{bf16_exact(58), bf16_exact(139), bf16_exact(64), bf16_exact(154)}));
}

TEST(CublasGemmEx, Bf16OutputRoundsTiesToEven) {
    // D (1x2) = [1 1]·[1 1; 2^-8 3·2^-8]: column 0 is 1 + 2^-8, exactly halfway between the bf16
    // neighbours 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): rounds to 0x3F80. Column 1 is 1 + 3·2^-8,
    // halfway between 1 + 2^-7 (0x3F81) and 1 + 2^-6 (0x3F82, even): rounds to 0x3F82.
    Blas blas;
    Device<uint16_t> a(std::vector<uint16_t>{0x3F80, 0x3F80});          // (1, 2): [1 1]
    Device<uint16_t> b(std::vector<uint16_t>{0x3F80, 0x3B80, 0x3F80, 0x3C40});  // (2, 2): 2^-8 = 0x3B80, 3·2^-8 = 0x3C40
    ASSERT_EQ(bf16_value(0x3B80), std::ldexp(1.0f, -8));
    ASSERT_EQ(bf16_value(0x3C40), 3.0f * std::ldexp(1.0f, -8));
    Device<uint16_t> c(std::vector<uint16_t>{0, 0});
    float alpha = 1.0f, beta = 0.0f;
    ASSERT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 2, 2, &alpha, a.ptr, CUDA_R_16BF, 1, b.ptr,
                           CUDA_R_16BF, 2, &beta, c.ptr, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(c.download(), (std::vector<uint16_t>{0x3F80, 0x3F82}));
}

TEST(CublasGemmEx, Tf32RoundsFp32InputsOnlyWhenAllowed) {
    // 1 + 2^-12 needs 12 mantissa bits; TF32 keeps 10, so it becomes 1 (the nearest TF32 value), and
    // 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even gives 1 + 2^-9.
    Blas blas;
    float x = 1.0f + std::ldexp(1.0f, -12), y = 1.0f + 3.0f * std::ldexp(1.0f, -11);
    Device<float> a(std::vector<float>{x, y}), one(std::vector<float>{1.0f}), c(std::vector<float>{0, 0});
    float alpha = 1.0f, beta = 0.0f;
    auto run = [&](cublasComputeType_t compute) {
        EXPECT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, &alpha, a.ptr, CUDA_R_32F, 2, one.ptr,
                               CUDA_R_32F, 1, &beta, c.ptr, CUDA_R_32F, 2, compute, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
        return c.download();
    };
    EXPECT_EQ(run(CUBLAS_COMPUTE_32F), (std::vector<float>{x, y}));
    std::vector<float> tf32 = {1.0f, 1.0f + std::ldexp(1.0f, -9)};
    EXPECT_EQ(run(CUBLAS_COMPUTE_32F_FAST_TF32), tf32);
    ASSERT_EQ(cublasSetMathMode(blas.handle, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(run(CUBLAS_COMPUTE_32F), tf32);
    EXPECT_EQ(run(CUBLAS_COMPUTE_32F_PEDANTIC), (std::vector<float>{x, y}));
}

TEST(CublasGemmStridedBatchedEx, TwoBatchesWithGaps) {
    // batch 0: [1 2; 3 4]·[5 6; 7 8] = [19 22; 43 50]; batch 1: I·[2 3; 4 5] = [2 3; 4 5]
    Blas blas;
    Device<float> a(std::vector<float>{1, 3, 2, 4, PAD, 1, 0, 0, 1});  // stride 5
    Device<float> b(std::vector<float>{5, 7, 6, 8, PAD, PAD, 2, 4, 3, 5});  // stride 6
    Device<float> c(std::vector<float>(14, PAD));                       // stride 7, ld 3
    float alpha = 1.0f, beta = 0.0f;
    ASSERT_EQ(cublasGemmStridedBatchedEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, a.ptr, CUDA_R_32F, 2,
                                         5, b.ptr, CUDA_R_32F, 2, 6, &beta, c.ptr, CUDA_R_32F, 3, 7, 2,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(c.download(), (std::vector<float>{19, 43, PAD, 22, 50, PAD, PAD, 2, 4, PAD, 3, 5, PAD, PAD}));
}

TEST(CublasGemmEx, RefusesWhatItCannotDo) {
    Blas blas;
    Device<float> a(std::vector<float>(16, 1.0f));
    std::vector<float> host(16, 1.0f);
    float alpha = 1.0f, beta = 0.0f;
    // fp64 is not emulated (fp16 is, for the FP16 build)
    EXPECT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, a.ptr, CUDA_R_64F, 2, a.ptr,
                           CUDA_R_64F, 2, &beta, a.ptr, CUDA_R_64F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_NOT_SUPPORTED);
    // lda smaller than the rows of A
    EXPECT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 2, &alpha, a.ptr, CUDA_R_32F, 2, a.ptr,
                           CUDA_R_32F, 2, &beta, a.ptr, CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    // host memory as B
    EXPECT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, a.ptr, CUDA_R_32F, 2, host.data(),
                           CUDA_R_32F, 2, &beta, a.ptr, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
    // C extends past the allocation: 4 x 4 with ld 4 needs 16 floats; 5 x 4 with ld 5 needs 20
    EXPECT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 5, 4, 1, &alpha, a.ptr, CUDA_R_32F, 5, a.ptr,
                           CUDA_R_32F, 1, &beta, a.ptr, CUDA_R_32F, 5, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasHandle, SetStreamResetsTheUserWorkspace) {
    Blas blas;
    Device<uint8_t> workspace(std::vector<uint8_t>(4096));
    void* ptr = nullptr;
    size_t bytes = 1;
    emu::cublas_user_workspace(blas.handle, &ptr, &bytes);
    EXPECT_EQ(ptr, nullptr);
    EXPECT_EQ(bytes, 0u);
    ASSERT_EQ(cublasSetWorkspace(blas.handle, workspace.ptr, 4096), CUBLAS_STATUS_SUCCESS);
    emu::cublas_user_workspace(blas.handle, &ptr, &bytes);
    EXPECT_EQ(ptr, workspace.ptr);
    EXPECT_EQ(bytes, 4096u);
    ASSERT_EQ(cublasSetStream(blas.handle, nullptr), CUBLAS_STATUS_SUCCESS);
    emu::cublas_user_workspace(blas.handle, &ptr, &bytes);
    EXPECT_EQ(ptr, nullptr) << "cublasSetStream must reset the workspace to the default pool";
    EXPECT_EQ(bytes, 0u);
    // documented: a workspace not aligned to 256 bytes is refused
    EXPECT_EQ(cublasSetWorkspace(blas.handle, workspace.ptr + 128, 1024), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasHandle, StatusStrings) {
    EXPECT_STRNE(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "");
    EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
}

// ----------------------------------------------------------------------------
// cublasSgemm / cublasSgemmStridedBatched (the legacy fp32 API)

// The definition, for one column-major matrix of a batch: for i < m, j < n,
//   C(i, j) <- alpha·sum_p op(A)(i, p)·op(B)(p, j) + beta·C(i, j),
// with X(r, c) stored at x[r + c·ld] and op(X)(r, c) = X(c, r) when transposed; nothing else of C is
// written. Computed in double; with the small integers below every value is exact in fp32 too.
void sgemm_by_definition(bool ta, bool tb, int m, int n, int k, double alpha, const float* a, int lda, const float* b,
                         int ldb, double beta, float* c, int ldc) {
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            double sum = 0.0;
            for (int p = 0; p < k; p++) {
                double a_ip = ta ? a[p + (size_t)i * lda] : a[i + (size_t)p * lda];
                double b_pj = tb ? b[j + (size_t)p * ldb] : b[p + (size_t)j * ldb];
                sum += a_ip * b_pj;
            }
            c[i + (size_t)j * ldc] = (float)(alpha * sum + beta * c[i + (size_t)j * ldc]);
        }
    }
}

// integers in [-4, 4]: products and sums of up to 2^24 / 16 terms are exact in fp32 and in TF32's inputs
std::vector<float> small_integers(size_t count, std::mt19937& rng) {
    std::uniform_int_distribution<int> value(-4, 4);
    std::vector<float> out(count);
    for (float& v : out) v = (float)value(rng);
    return out;
}

TEST(CublasSgemm, WorkedExampleEveryTranspose) {
    Blas blas;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? 4 : 3, ldb = tb ? 5 : 4, ldc = 4;  // all larger than the stored rows
            Device<float> a(store(A23, ta, lda)), b(store(B32, tb, ldb)), c(std::vector<float>((size_t)ldc * 2, PAD));
            float alpha = 1.0f, beta = 0.0f;
            ASSERT_EQ(cublasSgemm(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, 2, 2, 3,
                                  &alpha, a.ptr, lda, b.ptr, ldb, &beta, c.ptr, ldc),
                      CUBLAS_STATUS_SUCCESS);
            std::vector<float> out = c.download();
            for (int j = 0; j < 2; j++) {
                for (int i = 0; i < 2; i++) EXPECT_EQ(out[i + j * ldc], AB22[i][j]) << "ta " << ta << " tb " << tb;
                EXPECT_EQ(out[2 + j * ldc], PAD) << "padding row written";
                EXPECT_EQ(out[3 + j * ldc], PAD) << "padding row written";
            }
        }
    }
}

TEST(CublasSgemm, MatchesTheDefinitionWithPaddingAndBeta) {
    std::mt19937 rng(34);
    Blas blas;
    const int shapes[][3] = {{1, 1, 1}, {5, 3, 7}, {33, 17, 64}, {70, 129, 40}};
    for (auto& shape : shapes) {
        for (int combo = 0; combo < 4; combo++) {
            int m = shape[0], n = shape[1], k = shape[2];
            bool ta = combo & 1, tb = combo & 2;
            int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 5, ldc = m + 3;
            std::vector<float> a_host = small_integers((size_t)lda * (ta ? m : k), rng);
            std::vector<float> b_host = small_integers((size_t)ldb * (tb ? k : n), rng);
            std::vector<float> c_host = small_integers((size_t)ldc * n, rng);
            float alpha = 2.0f, beta = -3.0f;
            std::vector<float> expected = c_host;
            sgemm_by_definition(ta, tb, m, n, k, alpha, a_host.data(), lda, b_host.data(), ldb, beta, expected.data(), ldc);
            Device<float> a(a_host), b(b_host), c(c_host);
            ASSERT_EQ(cublasSgemm(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                  &alpha, a.ptr, lda, b.ptr, ldb, &beta, c.ptr, ldc),
                      CUBLAS_STATUS_SUCCESS);
            // exact: every value is an integer below 2^24; the rows past m keep their old values
            EXPECT_EQ(c.download(), expected) << "m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb;
        }
    }
}

TEST(CublasSgemmStridedBatched, MatchesTheDefinitionPerBatchWithGaps) {
    std::mt19937 rng(35);
    Blas blas;
    const int m = 6, n = 5, k = 9, batches = 3;
    for (int combo = 0; combo < 4; combo++) {
        bool ta = combo & 1, tb = combo & 2;
        int lda = (ta ? k : m) + 1, ldb = (tb ? n : k) + 2, ldc = m + 1;
        // strides larger than one matrix: the gaps between matrices must stay as they were
        long long stride_a = (long long)lda * (ta ? m : k) + 7, stride_b = (long long)ldb * (tb ? k : n) + 3;
        long long stride_c = (long long)ldc * n + 11;
        std::vector<float> a_host = small_integers((size_t)stride_a * batches, rng);
        std::vector<float> b_host = small_integers((size_t)stride_b * batches, rng);
        std::vector<float> c_host = small_integers((size_t)stride_c * batches, rng);
        float alpha = -1.0f, beta = 0.5f;  // beta·C: integers times 0.5 are exact
        std::vector<float> expected = c_host;
        for (int batch = 0; batch < batches; batch++) {
            sgemm_by_definition(ta, tb, m, n, k, alpha, a_host.data() + batch * stride_a, lda,
                                b_host.data() + batch * stride_b, ldb, beta, expected.data() + batch * stride_c, ldc);
        }
        Device<float> a(a_host), b(b_host), c(c_host);
        ASSERT_EQ(cublasSgemmStridedBatched(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            m, n, k, &alpha, a.ptr, lda, stride_a, b.ptr, ldb, stride_b, &beta, c.ptr,
                                            ldc, stride_c, batches),
                  CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(c.download(), expected) << "ta " << ta << " tb " << tb;
    }
}

TEST(CublasSgemm, Tf32MathModeRoundsTheInputs) {
    // as for cublasGemmEx with CUBLAS_COMPUTE_32F: 1 + 2^-12 reads as 1 in TF32, and 1 + 3·2^-11 as
    // 1 + 2^-9 (a tie, to even), only after cublasSetMathMode(CUBLAS_TF32_TENSOR_OP_MATH)
    Blas blas;
    float x = 1.0f + std::ldexp(1.0f, -12), y = 1.0f + 3.0f * std::ldexp(1.0f, -11);
    Device<float> a(std::vector<float>{x, y}), one(std::vector<float>{1.0f}), c(std::vector<float>{0, 0});
    float alpha = 1.0f, beta = 0.0f;
    auto run = [&] {
        EXPECT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, &alpha, a.ptr, 2, one.ptr, 1, &beta, c.ptr, 2),
                  CUBLAS_STATUS_SUCCESS);
        return c.download();
    };
    EXPECT_EQ(run(), (std::vector<float>{x, y}));
    ASSERT_EQ(cublasSetMathMode(blas.handle, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(run(), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -9)}));
}

TEST(CublasSgemm, RefusesDevicePointerModeAndBadArguments) {
    Blas blas;
    Device<float> a(std::vector<float>(16, 1.0f)), scalars(std::vector<float>{1.0f, 0.0f});
    float alpha = 1.0f, beta = 0.0f;
    // alpha and beta on the device are not emulated: the mode is refused, and stays HOST
    EXPECT_EQ(cublasSetPointerMode(blas.handle, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_NOT_SUPPORTED);
    cublasPointerMode_t mode;
    ASSERT_EQ(cublasGetPointerMode(blas.handle, &mode), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(mode, CUBLAS_POINTER_MODE_HOST);
    // a device alpha in host pointer mode
    EXPECT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, scalars.ptr, a.ptr, 2, a.ptr, 2, scalars.ptr + 1,
                          a.ptr, 2),
              CUBLAS_STATUS_INVALID_VALUE);
    // lda smaller than the stored rows of A (3 rows)
    EXPECT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 2, &alpha, a.ptr, 2, a.ptr, 2, &beta, a.ptr, 3),
              CUBLAS_STATUS_INVALID_VALUE);
    // transposed A is stored k x m = 4 x 2: lda 2 is too small
    EXPECT_EQ(cublasSgemm(blas.handle, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 4, &alpha, a.ptr, 2, a.ptr, 4, &beta, a.ptr, 2),
              CUBLAS_STATUS_INVALID_VALUE);
    // the last batch of C runs past the allocation: 3 batches of 2 x 2 with stride 8 need 20 floats
    EXPECT_EQ(cublasSgemmStridedBatched(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, a.ptr, 2, 0, a.ptr, 2, 0,
                                        &beta, a.ptr, 2, 8, 3),
              CUBLAS_STATUS_INVALID_VALUE);
    // an operation that is not N, T or C
    EXPECT_EQ(cublasSgemm(blas.handle, (cublasOperation_t)7, CUBLAS_OP_N, 2, 2, 2, &alpha, a.ptr, 2, a.ptr, 2, &beta,
                          a.ptr, 2),
              CUBLAS_STATUS_INVALID_VALUE);
}

// ----------------------------------------------------------------------------
// cublasLtMatmul

// GELU (tanh approximation) and its derivative, in double, from the formula.
double gelu_ref(double x) {
    double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad_ref(double x) {
    double s = std::sqrt(2.0 / M_PI);
    double t = std::tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// One cuBLASLt product, set up the way the documentation describes; the fields are the knobs.
struct LtCall {
    cudaDataType type = CUDA_R_32F;
    int m = 0, n = 0, k = 0;
    bool trans_a = false, trans_b = false;
    int64_t lda = 0, ldb = 0, ldd = 0;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0;
    int64_t alignment_a = 0;  // 0: leave the preference's default
    float alpha = 1.0f, beta = 0.0f;
    int type_a = -1, type_b = -1;  // FP8: A's and B's types (-1: `type`, which C and D keep)
    const float* a_scale = nullptr;  // FP8: A_SCALE_POINTER, B_SCALE_POINTER (set when not null)
    const float* b_scale = nullptr;
    int8_t fast_accum = -1;  // FP8: FAST_ACCUM (set when 0 or 1)
    int32_t batch = 1;        // strided batched: BATCH_COUNT and each layout's STRIDED_BATCH_OFFSET (set when > 1)
    int64_t stride_a = 0, stride_b = 0, stride_d = 0;
    int found = -1;
    cublasStatus_t heuristic_status = CUBLAS_STATUS_SUCCESS;

    cublasStatus_t run(const void* a, const void* b, const void* c, void* d) {
        cublasLtHandle_t lt;
        EXPECT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
        cublasLtMatmulDesc_t desc;
        EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
        cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), 0);
        EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), 0);
        EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), 0);
        if (bias != nullptr) {
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)), 0);
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), 0);
        }
        if (aux != nullptr) {
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
                      0);
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
                      0);
        }
        if (a_scale != nullptr) {
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)), 0);
        }
        if (b_scale != nullptr) {
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)), 0);
        }
        if (fast_accum >= 0) {
            EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)),
                      0);
        }
        cudaDataType ta = type_a < 0 ? type : (cudaDataType)type_a, tb = type_b < 0 ? type : (cudaDataType)type_b;
        cublasLtMatrixLayout_t la, lb, ld;
        EXPECT_EQ(cublasLtMatrixLayoutCreate(&la, ta, trans_a ? k : m, trans_a ? m : k, lda), 0);
        EXPECT_EQ(cublasLtMatrixLayoutCreate(&lb, tb, trans_b ? n : k, trans_b ? k : n, ldb), 0);
        EXPECT_EQ(cublasLtMatrixLayoutCreate(&ld, type, m, n, ldd), 0);
        if (batch > 1) {
            for (auto [layout, stride] : {std::pair{la, stride_a}, std::pair{lb, stride_b}, std::pair{ld, stride_d}}) {
                EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)), 0);
                EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof(stride)),
                          0);
            }
        }
        cublasLtMatmulPreference_t pref;
        EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), 0);
        uint64_t workspace_bytes = 0;
        EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof(workspace_bytes)),
                  0);
        if (alignment_a != 0) {
            uint32_t alignment = (uint32_t)alignment_a;
            EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignment,
                                                           sizeof(alignment)),
                      0);
        }
        cublasLtMatmulHeuristicResult_t heuristic;
        found = 0;
        heuristic_status = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found);
        cublasStatus_t status = heuristic_status;
        if (status == CUBLAS_STATUS_SUCCESS) {
            status = cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, c, ld, d, ld, &heuristic.algo, nullptr, 0,
                                    nullptr);
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        cublasLtDestroy(lt);
        return status;
    }
};

TEST(CublasLtMatmul, DefaultAndBiasWithTransposedA) {
    // the project's forward shape: A stored (k, m) and transposed, B (k, n)
    Device<float> a(store(A23, true, 4)), b(store(B32, false, 3)), bias(std::vector<float>{10, 20});
    Device<float> d(std::vector<float>(4, PAD));
    LtCall call;
    call.m = 2, call.n = 2, call.k = 3, call.trans_a = true, call.lda = 4, call.ldb = 3, call.ldd = 2;
    ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(call.found, 1);
    EXPECT_EQ(d.download(), (std::vector<float>{58, 139, 64, 154}));
    call.epilogue = CUBLASLT_EPILOGUE_BIAS;
    call.bias = bias.ptr;
    ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    // bias[i] is added to row i: [58+10 64+10; 139+20 154+20]
    EXPECT_EQ(d.download(), (std::vector<float>{68, 159, 74, 174}));
}

// Strided batches (llm.c's attention runs its products this way): the worked example of
// CublasGemmStridedBatchedEx.TwoBatchesWithGaps through cuBLASLt; with an epilogue, refused; a last batch
// past the allocation, refused.
TEST(CublasLtMatmul, StridedBatchesWithTheDefaultEpilogue) {
    Device<float> a(std::vector<float>{1, 3, 2, 4, PAD, 1, 0, 0, 1});        // stride 5
    Device<float> b(std::vector<float>{5, 7, 6, 8, PAD, PAD, 2, 4, 3, 5});   // stride 6
    Device<float> d(std::vector<float>(14, PAD));                            // stride 7, ld 3
    LtCall call;
    call.m = 2, call.n = 2, call.k = 2, call.lda = 2, call.ldb = 2, call.ldd = 3;
    call.batch = 2, call.stride_a = 5, call.stride_b = 6, call.stride_d = 7;
    ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(d.download(), (std::vector<float>{19, 43, PAD, 22, 50, PAD, PAD, 2, 4, PAD, 3, 5, PAD, PAD}));
    Device<float> bias(std::vector<float>{1, 2});
    call.epilogue = CUBLASLT_EPILOGUE_BIAS;
    call.bias = bias.ptr;
    EXPECT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    call.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    call.bias = nullptr;
    call.stride_d = 8;  // the second D would end at 8 + 3 + 2 = 13 < 14: fits; at stride 12 it would not
    EXPECT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    call.stride_d = 12;
    EXPECT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtMatmul, AccumulateWithTransposedB) {
    // D = 1·A·B + 1·D (the project's dweight call): B stored (n, k) and transposed
    Device<float> a(store(A23, false, 2)), b(store(B32, true, 2)), d(std::vector<float>{1, 3, 2, 4});
    LtCall call;
    call.m = 2, call.n = 2, call.k = 3, call.trans_b = true, call.lda = 2, call.ldb = 2, call.ldd = 2;
    call.beta = 1.0f;
    ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(d.download(), (std::vector<float>{59, 142, 66, 158}));
}

// D (8 x 1) = epilogue(x·1): k = 1 turns the product into the identity on a column x.
const std::vector<float> GELU_POINTS = {-3.0f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, 4.0f};

TEST(CublasLtMatmul, GeluAtHandPickedPoints) {
    Device<float> x(GELU_POINTS), one(std::vector<float>{1.0f}), d(std::vector<float>(8, PAD));
    LtCall call;
    call.m = 8, call.n = 1, call.k = 1, call.lda = 8, call.ldb = 1, call.ldd = 8;
    call.epilogue = CUBLASLT_EPILOGUE_GELU;
    ASSERT_EQ(call.run(x.ptr, one.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    std::vector<float> out = d.download();
    for (int i = 0; i < 8; i++) EXPECT_NEAR(out[i], gelu_ref(GELU_POINTS[i]), 2e-6) << "x = " << GELU_POINTS[i];
    // two values worked out by hand: gelu(0) = 0; gelu(1) = 0.5·(1 + tanh(0.7978846·1.044715)) = 0.841192
    EXPECT_EQ(out[3], 0.0f);
    EXPECT_NEAR(out[5], 0.841192, 1e-6);
}

TEST(CublasLtMatmul, GeluAuxBiasStoresTheGeluInput) {
    // pre = x + bias, D = gelu(pre), aux = pre (aux ld 16 > 8 rows, padding left alone)
    std::vector<float> bias_values = {0.5f, 0.25f, -0.5f, 1.0f, 0.0f, -1.0f, 0.5f, -2.0f};
    Device<float> x(GELU_POINTS), one(std::vector<float>{1.0f}), bias(bias_values);
    Device<float> d(std::vector<float>(8, PAD)), aux(std::vector<float>(16, PAD));
    LtCall call;
    call.m = 8, call.n = 1, call.k = 1, call.lda = 8, call.ldb = 1, call.ldd = 8;
    call.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    call.bias = bias.ptr;
    call.aux = aux.ptr;
    call.aux_ld = 16;
    ASSERT_EQ(call.run(x.ptr, one.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    std::vector<float> out = d.download(), pre = aux.download();
    for (int i = 0; i < 8; i++) {
        float expected_pre = GELU_POINTS[i] + bias_values[i];  // exact in fp32 for these values
        EXPECT_EQ(pre[i], expected_pre);
        EXPECT_EQ(pre[8 + i], PAD);
        EXPECT_NEAR(out[i], gelu_ref(expected_pre), 2e-6);
    }
}

TEST(CublasLtMatmul, DgeluMultipliesByTheGeluDerivative) {
    // D = (g·1)·gelu'(aux) with g = 2 everywhere and aux = the GELU points
    Device<float> g(std::vector<float>(8, 2.0f)), one(std::vector<float>{1.0f}), aux(GELU_POINTS);
    Device<float> d(std::vector<float>(8, PAD));
    LtCall call;
    call.m = 8, call.n = 1, call.k = 1, call.lda = 8, call.ldb = 1, call.ldd = 8;
    call.epilogue = CUBLASLT_EPILOGUE_DGELU;
    call.aux = aux.ptr;
    call.aux_ld = 8;
    ASSERT_EQ(call.run(g.ptr, one.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    std::vector<float> out = d.download();
    for (int i = 0; i < 8; i++) EXPECT_NEAR(out[i], 2.0 * gelu_grad_ref(GELU_POINTS[i]), 4e-6);
    // by hand: gelu'(0) = 0.5, so D = 1
    EXPECT_EQ(out[3], 1.0f);
}

TEST(CublasLtMatmul, Bf16GeluAuxRoundsBothOutputs) {
    // x = 1 + 2^-8 comes from 1·1 + 2^-8·1 (k = 2); aux holds it rounded to bf16: a tie, to even 1.0.
    // D = gelu(1 + 2^-8) rounded from fp32 (not gelu of the rounded aux).
    std::vector<uint16_t> a_bits(16), b_bits = {0x3F80, 0x3F80};
    for (int i = 0; i < 8; i++) a_bits[i] = 0x3F80, a_bits[8 + i] = 0x3B80;  // columns: 1, 2^-8
    Device<uint16_t> a(a_bits), b(b_bits), d(std::vector<uint16_t>(8)), aux(std::vector<uint16_t>(8));
    LtCall call;
    call.type = CUDA_R_16BF;
    call.m = 8, call.n = 1, call.k = 2, call.lda = 8, call.ldb = 2, call.ldd = 8;
    call.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
    call.aux = aux.ptr;
    call.aux_ld = 8;
    ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    std::vector<uint16_t> out = d.download(), pre = aux.download();
    double expected = gelu_ref(1.0 + std::ldexp(1.0, -8));  // 0.84539..., bf16 spacing there is 2^-8
    for (int i = 0; i < 8; i++) {
        EXPECT_EQ(pre[i], 0x3F80);
        EXPECT_NEAR(bf16_value(out[i]), expected, std::ldexp(1.0, -9));
    }
}

TEST(CublasLtMatmul, BgradbWritesTheColumnSumsOfOpB) {
    // The project's dweight call with the bias gradient fused: D = A·op(B) + D, op(B) (k, n) = B32, and
    // bias[j] = sum over k of op(B)(p, j): 7 + 9 + 11 = 27 and 8 + 10 + 12 = 30, written over what the
    // buffer held (not added to it); the buffer's third element is past n and stays.
    for (bool trans_b : {true, false}) {
        SCOPED_TRACE(trans_b ? "B stored (n, k), transposed" : "B stored (k, n)");
        int64_t ldb = trans_b ? 2 : 4;  // 4 > k: the padding rows must not be summed
        Device<float> a(store(A23, false, 2)), b(store(B32, trans_b, ldb)), d(std::vector<float>{1, 3, 2, 4});
        Device<float> bias(std::vector<float>{PAD, PAD, PAD});
        LtCall call;
        call.m = 2, call.n = 2, call.k = 3, call.trans_b = trans_b, call.lda = 2, call.ldb = ldb, call.ldd = 2;
        call.beta = 1.0f;
        call.epilogue = CUBLASLT_EPILOGUE_BGRADB;
        call.bias = bias.ptr;
        ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(d.download(), (std::vector<float>{59, 142, 66, 158})) << "D as without the epilogue";
        EXPECT_EQ(bias.download(), (std::vector<float>{27, 30, PAD}));
    }
}

TEST(CublasLtMatmul, BgradbInBf16AndItsRefusals) {
    // bf16: the gradient has D's type. op(B) (k = 3, n = 4) with column j holding j + 1, 0.5, 0.25:
    // sums j + 1.75, exact in bf16. The bias gradient has n = 4 entries, not m = 2.
    std::vector<uint16_t> b_bits;
    for (int j = 0; j < 4; j++) {
        for (float v : {(float)(j + 1), 0.5f, 0.25f}) b_bits.push_back(bf16_exact(v));
    }
    std::vector<uint16_t> a_bits(6, bf16_exact(1.0f));
    Device<uint16_t> a(a_bits), b(b_bits), d(std::vector<uint16_t>(8)), bias(std::vector<uint16_t>(4, 0xFFFF));
    LtCall call;
    call.type = CUDA_R_16BF;
    call.m = 2, call.n = 4, call.k = 3, call.lda = 2, call.ldb = 3, call.ldd = 2;
    call.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    call.bias = bias.ptr;
    ASSERT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    std::vector<uint16_t> grad = bias.download();
    for (int j = 0; j < 4; j++) EXPECT_EQ(bf16_value(grad[j]), j + 1.75f) << "column " << j;
    // a bias buffer of m = 2 elements is too short for n = 4; no bias pointer at all is refused too
    Device<uint16_t> short_bias(std::vector<uint16_t>(2, 0));
    call.bias = short_bias.ptr;
    EXPECT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
    call.bias = nullptr;
    EXPECT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtMatmul, RefusesPointersLessAlignedThanPromised) {
    // A starts 128 bytes into an allocation: with the default preference (256-byte alignment promised)
    // the product must be refused; a preference promising 128 (or less) lets it run.
    std::vector<float> storage(64 + 6, 0.0f);
    std::vector<float> a_values = store(A23, false, 2);
    std::copy(a_values.begin(), a_values.end(), storage.begin() + 32);
    Device<float> a(storage), b(store(B32, false, 3)), d(std::vector<float>(4, PAD));
    const float* a_128 = a.ptr + 32;
    ASSERT_EQ((uintptr_t)a.ptr % 256, 0u) << "cudaMalloc returns 256-byte aligned memory";
    LtCall call;
    call.m = 2, call.n = 2, call.k = 3, call.lda = 2, call.ldb = 3, call.ldd = 2;
    EXPECT_EQ(call.run(a_128, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(d.download(), std::vector<float>(4, PAD)) << "nothing may be written";
    call.alignment_a = 128;
    ASSERT_EQ(call.run(a_128, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(d.download(), (std::vector<float>{58, 139, 64, 154}));
    call.alignment_a = 256;
    EXPECT_EQ(call.run(a_128, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST(CublasLtMatmul, RefusesUnsupportedEpiloguesAndBadAuxLd) {
    Device<float> a(std::vector<float>(64, 1.0f)), d(std::vector<float>(64, PAD));
    LtCall call;
    call.m = 8, call.n = 1, call.k = 1, call.lda = 8, call.ldb = 1, call.ldd = 8;
    call.aux = d.ptr;
    for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA}) {
        call.epilogue = e;
        call.aux_ld = 8;
        call.bias = a.ptr;
        EXPECT_EQ(call.run(a.ptr, a.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED) << "epilogue " << (int)e;
        EXPECT_EQ(call.found, 0);
    }
    // documented: the GELU aux leading dimension must be a multiple of 8 and at least the rows
    call.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
    call.bias = nullptr;
    call.aux_ld = 12;
    EXPECT_EQ(call.run(a.ptr, a.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(d.download(), std::vector<float>(64, PAD));
}

TEST(CublasLtMatmul, RefusesHostMemoryAndShortBuffers) {
    Device<float> a(store(A23, false, 2)), b(store(B32, false, 3)), d(std::vector<float>(4, PAD));
    std::vector<float> host(6, 1.0f);
    LtCall call;
    call.m = 2, call.n = 2, call.k = 3, call.lda = 2, call.ldb = 3, call.ldd = 2;
    call.alignment_a = 4;
    EXPECT_EQ(call.run(host.data(), b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
    Device<float> short_b(std::vector<float>(5, 1.0f));  // B needs 6
    EXPECT_EQ(call.run(a.ptr, short_b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
    Device<float> bias(std::vector<float>{1.0f});  // bias needs m = 2
    call.epilogue = CUBLASLT_EPILOGUE_BIAS;
    call.bias = bias.ptr;
    EXPECT_EQ(call.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_INVALID_VALUE);
}

// ----------------------------------------------------------------------------
// randomized: against a plain triple loop in double, every transpose, across the kernel's tile edges

// op(X)(i, j) of a column-major matrix stored with leading dimension ld
// ----------------------------------------------------------------------------
// FP8 (issue 48): operands drawn from codes whose values the formats' definitions give by hand
// (e4m3: bias 7, 3 mantissa bits; e5m2: bias 15, 2 mantissa bits), so nothing here decodes as the
// emulator does: e4m3 0x38 = 1, 0x40 = 2, 0x44 = 3, 0x30 = 0.5, 0x3C = 1.5, 0xB8 = -1, 0xC4 = -3, 0x00 = 0;
// e5m2 0x3C = 1, 0x40 = 2, 0x42 = 3, 0x38 = 0.5, 0x3E = 1.5, 0xBC = -1, 0xC2 = -3, 0x00 = 0.

struct Fp8Code {
    uint8_t code;
    double value;
};
const Fp8Code E4M3_CODES[] = {{0x38, 1}, {0x40, 2}, {0x44, 3}, {0x30, 0.5}, {0x3C, 1.5}, {0xB8, -1}, {0xC4, -3}, {0x00, 0}};
const Fp8Code E5M2_CODES[] = {{0x3C, 1}, {0x40, 2}, {0x42, 3}, {0x38, 0.5}, {0x3E, 1.5}, {0xBC, -1}, {0xC2, -3}, {0x00, 0}};

// D (m, n) bf16 = alpha·scale_a·scale_b·op(A)·op(B) with A stored (k, m) and transposed, B (k, n): every
// product and sum of these values is exact in double and in fp32 (halves and small integers, k <= 64),
// so D is the bf16 rounding of the exact value. With bias_and_c: + bias[i] (BIAS epilogue, bf16) + D's
// earlier value (beta 1, C = D), both small halves, exact too.
void expect_fp8_product(cudaDataType type_b, bool fast_accum, bool bias_and_c = false) {
    const int m = 24, n = 16, k = 64;
    std::mt19937 rng(48);
    const Fp8Code* b_codes = type_b == CUDA_R_8F_E5M2 ? E5M2_CODES : E4M3_CODES;
    std::vector<uint8_t> a(k * m), b(k * n);
    std::vector<double> av(k * m), bv(k * n);
    for (size_t i = 0; i < a.size(); i++) {
        const Fp8Code& c = E4M3_CODES[rng() % 8];
        a[i] = c.code;
        av[i] = c.value;
    }
    for (size_t i = 0; i < b.size(); i++) {
        const Fp8Code& c = b_codes[rng() % 8];
        b[i] = c.code;
        bv[i] = c.value;
    }
    Device<uint8_t> da(a), db(b);
    Device<float> scales(std::vector<float>(8, 0.0f));  // scale_a at [0], scale_b at [4]: 16-byte aligned
    std::vector<float> s = {0.5f, 0, 0, 0, 4.0f, 0, 0, 0};
    ASSERT_EQ(cudaMemcpy(scales.ptr, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<double> c0(m * n, 0.0), bias0(m, 0.0);
    std::vector<uint16_t> c_bits(m * n, 0), bias_bits(m, 0);
    if (bias_and_c) {
        for (int i = 0; i < m; i++) bias0[i] = 0.5 * i - 4, bias_bits[i] = bf16_exact((float)bias0[i]);
        for (int i = 0; i < m * n; i++) c0[i] = 0.5 * (i % 13) - 3, c_bits[i] = bf16_exact((float)c0[i]);
    }
    Device<uint16_t> dd(c_bits), dbias(bias_bits);
    LtCall call;
    call.type = CUDA_R_16BF;
    call.type_a = CUDA_R_8F_E4M3;
    call.type_b = type_b;
    call.m = m, call.n = n, call.k = k;
    call.trans_a = true;
    call.lda = k, call.ldb = k, call.ldd = m;
    call.alpha = 0.25f;
    call.a_scale = scales.ptr;
    call.b_scale = scales.ptr + 4;
    call.fast_accum = fast_accum ? 1 : 0;
    if (bias_and_c) {
        call.epilogue = CUBLASLT_EPILOGUE_BIAS;
        call.bias = dbias.ptr;
        call.beta = 1.0f;
    }
    ASSERT_EQ(call.run(da.ptr, db.ptr, dd.ptr, dd.ptr), CUBLAS_STATUS_SUCCESS);
    std::vector<uint16_t> d = dd.download();
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int p = 0; p < k; p++) sum += av[p + i * k] * bv[p + j * k];
            double want = 0.25 * 0.5 * 4.0 * sum + bias0[i] + c0[i + j * m];
            float got = bf16_value(d[i + j * m]);
            // bf16 keeps 8 significant bits: within half a step of the exact value
            EXPECT_NEAR(got, want, std::ldexp(std::fabs(want), -8) + 1e-30) << "D(" << i << ", " << j << ")";
        }
    }
}

TEST(CublasLtFp8, E4m3TimesE4m3WithScales) { expect_fp8_product(CUDA_R_8F_E4M3, false); }
TEST(CublasLtFp8, E4m3TimesE5m2WithFastAccumulation) { expect_fp8_product(CUDA_R_8F_E5M2, true); }
TEST(CublasLtFp8, BiasEpilogueAndAddingIntoD) { expect_fp8_product(CUDA_R_8F_E5M2, false, true); }

TEST(CublasLtFp8, RefusesWhatHopperOrTheEmulatorDoesNot) {
    const int m = 16, n = 16, k = 32;
    Device<uint8_t> a(std::vector<uint8_t>(k * m, 0x38)), b(std::vector<uint8_t>(k * n, 0x38));
    Device<uint16_t> d(std::vector<uint16_t>(m * n, 0)), bias(std::vector<uint16_t>(m, 0));
    Device<float> scales(std::vector<float>(8, 1.0f));
    auto call = [&] {
        LtCall c;
        c.type = CUDA_R_16BF;
        c.type_a = c.type_b = CUDA_R_8F_E4M3;
        c.m = m, c.n = n, c.k = k;
        c.trans_a = true;
        c.lda = k, c.ldb = k, c.ldd = m;
        return c;
    };
    LtCall ok = call();
    EXPECT_EQ(ok.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_SUCCESS);  // no scale pointers: scales of 1
    LtCall nn = call();  // only "TN"
    nn.trans_a = false;
    nn.lda = m;
    EXPECT_EQ(nn.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    LtCall both_e5m2 = call();
    both_e5m2.type_a = both_e5m2.type_b = CUDA_R_8F_E5M2;
    EXPECT_EQ(both_e5m2.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    LtCall with_gelu = call();  // of the epilogues, DEFAULT and BIAS only
    with_gelu.epilogue = CUBLASLT_EPILOGUE_GELU_BIAS;
    with_gelu.bias = bias.ptr;
    EXPECT_EQ(with_gelu.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    LtCall fp8_out = call();  // an FP8 D needs its scale and amax, not emulated
    fp8_out.type = CUDA_R_8F_E4M3;
    EXPECT_EQ(fp8_out.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    LtCall misaligned = call();  // a scale 4 bytes into its allocation, as an H100 refused (call 15)
    misaligned.a_scale = scales.ptr;
    misaligned.b_scale = scales.ptr + 1;
    EXPECT_EQ(misaligned.run(a.ptr, b.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
    LtCall bf16_scaled = call();  // scales belong to FP8 operands
    bf16_scaled.type_a = bf16_scaled.type_b = -1;
    bf16_scaled.a_scale = scales.ptr;
    EXPECT_EQ(bf16_scaled.run(d.ptr, d.ptr, d.ptr, d.ptr), CUBLAS_STATUS_NOT_SUPPORTED);
}

double element(const std::vector<float>& x, int64_t ld, bool trans, int64_t i, int64_t j) {
    return trans ? x[j + i * ld] : x[i + j * ld];
}

TEST(CublasRandomized, MatchesATripleLoop) {
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    Blas blas;
    const int shapes[][3] = {{1, 1, 1}, {17, 5, 3}, {130, 97, 300}, {7, 200, 513}, {128, 96, 256}};
    for (auto& shape : shapes) {
        for (int combo = 0; combo < 4; combo++) {
            int m = shape[0], n = shape[1], k = shape[2];
            bool ta = combo & 1, tb = combo & 2;
            int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 1, ldc = m + 2;
            std::vector<float> a_host((size_t)lda * (ta ? m : k)), b_host((size_t)ldb * (tb ? k : n));
            std::vector<float> c_host((size_t)ldc * n);
            // inputs rounded to bf16 (truncating the low bits), so the fp32 and bf16 runs share them
            auto draw = [&] {
                float f = uniform(rng);
                uint32_t u;
                memcpy(&u, &f, 4);
                u &= 0xffff0000u;
                memcpy(&f, &u, 4);
                return f;
            };
            for (float& v : a_host) v = draw();
            for (float& v : b_host) v = draw();
            for (float& v : c_host) v = draw();
            float alpha = 0.75f, beta = -0.5f;
            std::vector<double> expected((size_t)m * n);
            double worst_scale = 0.0;
            for (int i = 0; i < m; i++) {
                for (int j = 0; j < n; j++) {
                    double sum = 0.0, scale = 0.0;
                    for (int p = 0; p < k; p++) {
                        double t = element(a_host, lda, ta, i, p) * element(b_host, ldb, tb, p, j);
                        sum += t;
                        scale += std::fabs(t);
                    }
                    expected[i + (size_t)j * m] = alpha * sum + beta * c_host[i + (size_t)j * ldc];
                    worst_scale = std::max(worst_scale, scale);
                }
            }
            // fp32 in, fp32 out: error of k fp32 additions
            Device<float> a(a_host), b(b_host), c(c_host);
            ASSERT_EQ(cublasGemmEx(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                   &alpha, a.ptr, CUDA_R_32F, lda, b.ptr, CUDA_R_32F, ldb, &beta, c.ptr, CUDA_R_32F,
                                   ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      CUBLAS_STATUS_SUCCESS);
            std::vector<float> out = c.download();
            double tolerance = (k + 2) * std::ldexp(1.0, -23) * (worst_scale + 1.0);
            for (int i = 0; i < m; i++) {
                for (int j = 0; j < n; j++) {
                    ASSERT_NEAR(out[i + (size_t)j * ldc], expected[i + (size_t)j * m], tolerance)
                        << "fp32 m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb << " at " << i
                        << "," << j;
                }
            }
            // bf16 in, bf16 out: the same plus one bf16 rounding (relative 2^-9)
            std::vector<uint16_t> a16, b16, c16;
            for (float v : a_host) a16.push_back(bf16_exact(v));
            for (float v : b_host) b16.push_back(bf16_exact(v));
            for (float v : c_host) c16.push_back(bf16_exact(v));
            Device<uint16_t> a2(a16), b2(b16), c2(c16);
            ASSERT_EQ(cublasGemmEx(blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                   &alpha, a2.ptr, CUDA_R_16BF, lda, b2.ptr, CUDA_R_16BF, ldb, &beta, c2.ptr,
                                   CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      CUBLAS_STATUS_SUCCESS);
            std::vector<uint16_t> out16 = c2.download();
            for (int i = 0; i < m; i++) {
                for (int j = 0; j < n; j++) {
                    double e = expected[i + (size_t)j * m];
                    ASSERT_NEAR(bf16_value(out16[i + (size_t)j * ldc]), e, tolerance + std::fabs(e) * std::ldexp(1.0, -8))
                        << "bf16 m " << m << " n " << n << " k " << k << " ta " << ta << " tb " << tb;
                }
            }
        }
    }
}

TEST(CublasRandomized, SameBitsEveryRun) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    int m = 300, n = 200, k = 700;
    std::vector<float> a_host((size_t)m * k), b_host((size_t)k * n);
    for (float& v : a_host) v = uniform(rng);
    for (float& v : b_host) v = uniform(rng);
    Device<float> a(a_host), b(b_host), c1(std::vector<float>((size_t)m * n)), c2(std::vector<float>((size_t)m * n));
    Blas blas;
    float alpha = 1.0f, beta = 0.0f;
    for (float* c : {c1.ptr, c2.ptr}) {
        ASSERT_EQ(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.ptr, CUDA_R_32F, m, b.ptr,
                               CUDA_R_32F, k, &beta, c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  CUBLAS_STATUS_SUCCESS);
    }
    std::vector<float> x = c1.download(), y = c2.download();
    EXPECT_EQ(memcmp(x.data(), y.data(), x.size() * 4), 0);
}

// ----------------------------------------------------------------------------
// throughput (printed, not checked): the trainer tests' largest shape and a d12 layer

TEST(CublasThroughput, PrintGflops) {
    struct Shape {
        const char* name;
        int m, n, k;
        bool ta;
    };
    const Shape shapes[] = {{"lm head fwd (50304x768)·(768x32)", 50304, 32, 768, true},
                            {"d12 fc fwd (3072x768)·(768x256)", 3072, 256, 768, true},
                            {"d12 fc dweight (768x256)·(256x3072)", 768, 3072, 256, false}};
    Blas blas;
    for (const Shape& s : shapes) {
        std::vector<uint16_t> a_host((size_t)s.m * s.k, 0x3F80), b_host((size_t)s.k * s.n, 0x3C00);
        Device<uint16_t> a(a_host), b(b_host), c(std::vector<uint16_t>((size_t)s.m * s.n));
        float alpha = 1.0f, beta = 0.0f;
        auto start = std::chrono::steady_clock::now();
        int reps = 3;
        for (int r = 0; r < reps; r++) {
            ASSERT_EQ(cublasGemmEx(blas.handle, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &alpha,
                                   a.ptr, CUDA_R_16BF, s.ta ? s.k : s.m, b.ptr, CUDA_R_16BF, s.k, &beta, c.ptr,
                                   CUDA_R_16BF, s.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      CUBLAS_STATUS_SUCCESS);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
        printf("  %-40s %7.1f ms  %6.1f GFLOP/s\n", s.name, seconds * 1e3, 2.0 * s.m * s.n * s.k / seconds / 1e9);
    }
}

}  // namespace
