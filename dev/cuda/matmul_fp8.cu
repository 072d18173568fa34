// FP8 against BF16 at the trainer's matmuls (issue 48, item 4): is 8 bits worth it at GPT-2 small's
// shapes? Every GEMM of one d12 step at B·T = 65536 tokens (the block's four Linear layers and the
// lm_head; forward, input gradient and weight gradient), each timed three ways through cuBLASLt:
//   bf16      bf16 operands, fp32 accumulation, bf16 out (what the trainer runs today)
//   fp8       e4m3 operands (the backward's gradient operand e5m2), per-tensor scales read from device
//             pointers, fp32 accumulation, bf16 out
//   fp8 fast  the same with CUBLASLT_MATMUL_DESC_FAST_ACCUM (Hopper's faster, less precise accumulation)
// and the cast an FP8 step adds: each operand from bf16 to 8 bits by llmc/fp8.cuh (a separate kernel
// here; a trainer would fuse it into the kernel that produces the operand where it can), with the
// transpose on its way where the operand is another layout's (the backward's).
//
// Every GEMM is written "TN" (both operands K-contiguous), the one layout Hopper's FP8 path takes:
//   out (M, N) = X (M, K) · W (N, K)ᵀ        forward: X = inp, W = weight       (M, N, K) = (B·T, OC, C)
//                                            dinp:    X = dout, W = weightᵀ     (B·T, C, OC)
//                                            dweight: X = doutᵀ, W = inpᵀ       (OC, C, B·T)
// The transposed copies the backward needs come from the cast, which writes them on its way (dinp:
// the weight; dweight: dout and inp); the cast's time below is that of the casts each GEMM needs, its
// amax recorded for the next step's scale as a trainer with delayed scaling would.
// The bf16 rows use the same TN layout (the trainer's own backward uses others, at about the same speed).
//
// Checks: the FP8 product against the fp32 product of the same 8-bit values times their scales, on 64
// rows spread over the output (exact up to the order of the sums, then bf16's rounding of the output:
// TOL_REDUCTION); the fast-accumulation product at 5x that (its accumulator keeps fewer bits, by design).
// Under the emulator (dev/emu: its cuda_fp8.h and cuBLASLt's FP8 product, each tested against its
// definition) it runs in the check-only mode at the harness's small shapes.
//
//   make -C dev/cuda bin/matmul_fp8 && dev/cuda/bin/matmul_fp8        FP8_TOKENS=8192 for a smaller B·T
#include "harness.cuh"

#include <cuda_fp8.h>

#include "../../llmc/fp8.cuh"

// ----------------------------------------------------------------------------
// one TN GEMM through cuBLASLt: out (M, N) row-major = X (M, K) · W (N, K)ᵀ. In cuBLASLt's column-major
// terms: outᵀ (N, M) = op(W) · X with W transposed (A, lda = K) and X not (B, ldb = K). The scales
// multiply the product: out = scale_w · scale_x · (W8 · X8).

struct Gemm {
    cudaDataType_t type_w, type_x;
    bool fast_accum = false;
    const float* scale_w = nullptr;  // device pointers: dequantization scales (nullptr: bf16)
    const float* scale_x = nullptr;
};

// The descriptors and the heuristic's first algorithm, made once, so a timed call is the matmul alone.
struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout_w = nullptr, layout_x = nullptr, layout_out = nullptr;
    static constexpr int MAX_CANDIDATES = 8;
    cublasLtMatmulHeuristicResult_t candidates[MAX_CANDIDATES];
    int found = 0, chosen = -1;
    cublasLtMatmulAlgo_t algo;

    GemmPlan(int M, int N, int K, const Gemm& g) {
        cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
        if (g.scale_w != nullptr) {
            cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.scale_w,
                                                       sizeof(g.scale_w)));
            cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.scale_x,
                                                       sizeof(g.scale_x)));
            int8_t fast = g.fast_accum ? 1 : 0;
            cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
        }
        cublasCheck(cublasLtMatrixLayoutCreate(&layout_w, g.type_w, K, N, K));
        cublasCheck(cublasLtMatrixLayoutCreate(&layout_x, g.type_x, K, M, K));
        cublasCheck(cublasLtMatrixLayoutCreate(&layout_out, CUDA_R_16BF, N, M, N));
        cublasLtMatmulPreference_t preference;
        cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
        size_t workspace = CUBLAS_WORKSPACE_BYTES;
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace, sizeof(workspace)));
        found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublas_context.lt, desc, layout_w, layout_x, layout_out,
                                                   layout_out, preference, MAX_CANDIDATES, candidates, &found));
        cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    }
    // The heuristic's first candidate that runs on these buffers, D in place over C (a candidate can
    // still refuse them); the last refusal's status if none does.
    cublasStatus_t choose(floatX* out, const void* x, const void* w) {
        cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
        for (int i = 0; i < found; i++) {
            algo = candidates[i].algo;
            status = launch(out, x, w);
            if (status == CUBLAS_STATUS_SUCCESS) {
                chosen = i;
                return status;
            }
        }
        return status;
    }
    ~GemmPlan() {
        cublasLtMatrixLayoutDestroy(layout_w);
        cublasLtMatrixLayoutDestroy(layout_x);
        cublasLtMatrixLayoutDestroy(layout_out);
        cublasLtMatmulDescDestroy(desc);
    }
    cublasStatus_t launch(floatX* out, const void* x, const void* w) const {
        const float alpha = 1.0f, beta = 0.0f;
        return cublasLtMatmul(cublas_context.lt, desc, &alpha, w, layout_w, x, layout_x, &beta, out, layout_out, out,
                              layout_out, &algo, cublas_context.workspace, CUBLAS_WORKSPACE_BYTES, 0);
    }
    void run(floatX* out, const void* x, const void* w) const { cublasCheck(launch(out, x, w)); }
};

__global__ void count_nonfinite_kernel(const floatX* x, size_t n, unsigned long long* count) {
    unsigned long long mine = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (!isfinite((float)x[i])) mine++;
    }
    if (mine > 0) atomicAdd(count, mine);
}

// ----------------------------------------------------------------------------
// host decoding of the 8-bit values, for the reference

template <typename Fp8>
std::vector<float> download_fp8(const dev::DeviceBuffer<Fp8>& buffer, size_t offset, size_t n) {
    std::vector<Fp8> raw(n);
    cudaCheck(cudaMemcpy(raw.data(), buffer.ptr + offset, n * sizeof(Fp8), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = (float)raw[i];
    return out;
}

struct Case {
    std::string name;
    int M, N, K;
    bool backward;  // the X operand is a gradient: e5m2
    bool transpose_x = false, transpose_w = false;  // the operand is cast from its transpose (K rows)
};

struct CaseTimes {
    double bf16_us, fp8_us, fast_us, cast_us, tflops_fp8;
};

int run_case(const Case& c, double fp8_peak, std::vector<CaseTimes>* all) {
    const int M = c.M, N = c.N, K = c.K;
    printf("\n== %s: (%d, %d) x (%d, %d)ᵀ%s\n", c.name.c_str(), M, K, N, K, c.backward ? ", X is a gradient (e5m2)" : "");
    dev::DeviceBuffer<floatX> x((size_t)M * K), w((size_t)N * K), out((size_t)M * N);
    dev::fill_uniform_device(x, -1.0f, 1.0f);
    dev::fill_uniform_device(w, -1.0f, 1.0f);
    // per-tensor scales: |values| <= 1 land within [-256, 256] in 8 bits (e4m3's largest is 448)
    const float scale_x = 1.0f / 256, scale_w = 1.0f / 256;
    dev::DeviceBuffer<float> scale_w_device(1), scale_x_device(1);  // each its own (aligned) allocation
    dev::upload(scale_w_device, std::vector<float>{scale_w});
    dev::upload(scale_x_device, std::vector<float>{scale_x});
    dev::DeviceBuffer<__nv_fp8_e4m3> w8((size_t)N * K), x8_e4m3(c.backward ? 0 : (size_t)M * K);
    dev::DeviceBuffer<__nv_fp8_e5m2> x8_e5m2(c.backward ? (size_t)M * K : 0);
    dev::DeviceBuffer<unsigned> amax(2);  // the casts' amax words
    cudaCheck(cudaMemset(amax.ptr, 0, 2 * sizeof(unsigned)));
    // each operand in its (rows, K) layout, from x (M, K) and w (N, K) as they are or, transposed,
    // from the same buffers read as (K, M) and (K, N)
    auto cast = [&](auto* q, const floatX* from, int rows, bool transposed, const float* scale, unsigned* word) {
        if (transposed) fp8_cast(static_cast<decltype(q)>(nullptr), q, from, K, rows, scale, word, 0);
        else fp8_cast(q, static_cast<decltype(q)>(nullptr), from, rows, K, scale, word, 0);
    };
    auto cast_operands = [&] {
        cast(w8.ptr, w.ptr, N, c.transpose_w, scale_w_device.ptr, amax.ptr);
        if (c.backward) cast(x8_e5m2.ptr, x.ptr, M, c.transpose_x, scale_x_device.ptr, amax.ptr + 1);
        else cast(x8_e4m3.ptr, x.ptr, M, c.transpose_x, scale_x_device.ptr, amax.ptr + 1);
    };
    cast_operands();
    const void* x8 = c.backward ? (const void*)x8_e5m2.ptr : (const void*)x8_e4m3.ptr;
    Gemm bf16{CUDA_R_16BF, CUDA_R_16BF};
    Gemm fp8{CUDA_R_8F_E4M3, c.backward ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, false, scale_w_device.ptr, scale_x_device.ptr};
    Gemm fast = fp8;
    fast.fast_accum = true;
    GemmPlan plan_bf16(M, N, K, bf16), plan_fp8(M, N, K, fp8), plan_fast(M, N, K, fast);
    struct Named {
        const char* name;
        GemmPlan* plan;
        const void* x;
        const void* w;
    };
    for (const Named& p : {Named{"bf16", &plan_bf16, x.ptr, w.ptr}, Named{"fp8", &plan_fp8, x8, w8.ptr},
                           Named{"fp8 fast", &plan_fast, x8, w8.ptr}}) {
        cublasStatus_t status = p.plan->choose(out.ptr, p.x, p.w);
        cudaCheck(cudaDeviceSynchronize());
        printf("%-10s cuBLASLt: %d candidates, %s\n", p.name, p.plan->found,
               status == CUBLAS_STATUS_SUCCESS
                   ? ("candidate " + std::to_string(p.plan->chosen) + " runs").c_str()
                   : cublasGetStatusString(status));
        if (status != CUBLAS_STATUS_SUCCESS) {
            printf("FP8|%s|%d|%d|%d|%s refused: %s\n", c.name.c_str(), M, N, K, p.name, cublasGetStatusString(status));
            return 1;
        }
    }

    // the reference: 64 rows of out from the 8-bit values times their scales, in fp32 (double sums)
    std::vector<float> w_host = download_fp8(w8, 0, w8.n);
    std::vector<int> rows;
    for (int i = 0; i < 64; i++) rows.push_back((int)(((long)i * M) / 64 + (i * 37) % std::max(1, M / 64)) % M);
    std::vector<float> ref((size_t)rows.size() * N);
    std::vector<std::vector<float>> x_rows(rows.size());
    for (size_t r = 0; r < rows.size(); r++) {
        x_rows[r] = c.backward ? download_fp8(x8_e5m2, (size_t)rows[r] * K, K) : download_fp8(x8_e4m3, (size_t)rows[r] * K, K);
    }
#pragma omp parallel for collapse(2)
    for (size_t r = 0; r < rows.size(); r++) {
        for (int n = 0; n < N; n++) {
            const float* xr = x_rows[r].data();
            const float* wr = w_host.data() + (size_t)n * K;
            double sum = 0.0;
            for (int k = 0; k < K; k++) sum += (double)xr[k] * wr[k];
            ref[r * N + n] = (float)(sum * scale_x * scale_w);
        }
    }
    // the sampled rows only (the lm_head's out is 3.3 billion values); every element's having been
    // written (none left at the poison, NaN) is counted on the device
    dev::DeviceBuffer<unsigned long long> nonfinite(1);
    auto check = [&](const char* name, double tolerance) {
        dev::CheckResult result;
        cudaCheck(cudaMemset(nonfinite.ptr, 0, sizeof(unsigned long long)));
        count_nonfinite_kernel<<<1024, 256>>>(out.ptr, out.n, nonfinite.ptr);
        cudaCheckLaunch();
        unsigned long long bad = 0;
        cudaCheck(cudaMemcpy(&bad, nonfinite.ptr, sizeof(bad), cudaMemcpyDeviceToHost));
        if (bad > 0) {
            result.ok = false;
            result.failures += " " + std::to_string(bad) + " non-finite outputs (unwritten or overflow);";
        }
        std::vector<floatX> row_bits((size_t)N);
        std::vector<float> got_rows(ref.size());
        for (size_t r = 0; r < rows.size(); r++) {
            cudaCheck(cudaMemcpy(row_bits.data(), out.ptr + (size_t)rows[r] * N, N * sizeof(floatX),
                                 cudaMemcpyDeviceToHost));
            for (int n = 0; n < N; n++) got_rows[r * N + n] = host_from_floatX(row_bits[n]);
        }
        dev::check_tensor(&result, name, got_rows, ref, tolerance);
        printf("%-10s check against the fp32 product of the 8-bit values: worst %.2e (tolerance %.0e) %s\n", name,
               result.worst, tolerance, result.ok ? "ok" : "FAIL");
        if (!result.ok) printf("    FAIL:%s\n", result.failures.c_str());
        return result.ok;
    };
    bool ok = true;
    dev::poison(out);
    plan_fp8.run(out.ptr, x8, w8.ptr);
    cudaCheck(cudaDeviceSynchronize());
    ok &= check("fp8", dev::TOL_REDUCTION);
    dev::poison(out);
    plan_fast.run(out.ptr, x8, w8.ptr);
    cudaCheck(cudaDeviceSynchronize());
    ok &= check("fp8 fast", 5 * dev::TOL_REDUCTION);
    if (dev::check_only) return ok ? 0 : 1;

    double flops = 2.0 * M * (double)N * K;
    auto time_gemm = [&](const void* xp, const void* wp, const GemmPlan& plan) {
        return dev::time_ms([] {}, [&] { plan.run(out.ptr, xp, wp); }).median_ms * 1e3;
    };
    CaseTimes t;
    t.bf16_us = time_gemm(x.ptr, w.ptr, plan_bf16);
    t.fp8_us = time_gemm(x8, w8.ptr, plan_fp8);
    t.fast_us = time_gemm(x8, w8.ptr, plan_fast);
    t.cast_us = dev::time_ms([] {}, cast_operands).median_ms * 1e3;
    t.tflops_fp8 = flops / (t.fp8_us * 1e6);
    printf("bf16 %.1f us (%.0f TFLOP/s), fp8 %.1f us (%.0f TFLOP/s, %.0f%% of the FP8 peak %.0f), fp8 fast %.1f us "
           "(%.0f TFLOP/s); the casts %.1f us\n",
           t.bf16_us, flops / (t.bf16_us * 1e6), t.fp8_us, t.tflops_fp8, 100.0 * t.tflops_fp8 / fp8_peak, fp8_peak,
           t.fast_us, flops / (t.fast_us * 1e6), t.cast_us);
    printf("FP8|%s|%d|%d|%d|%.1f|%.1f|%.1f|%.1f|%.3f|%.3f|%.3f\n", c.name.c_str(), M, N, K, t.bf16_us, t.fp8_us,
           t.fast_us, t.cast_us, t.bf16_us / t.fp8_us, t.bf16_us / t.fast_us, t.bf16_us / (t.fast_us + t.cast_us));
    all->push_back(t);
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    dev::device_init("matmul_fp8", argc, argv);
    const dev::Device& d = dev::device();
    if (d.prop.major * 10 + d.prop.minor < 89) {
        printf("matmul_fp8: %s (compute capability %d.%d) has no FP8 tensor cores (sm_89 and later). Skipping.\n",
               d.prop.name, d.prop.major, d.prop.minor);
        return 0;
    }
    cublas_setup();
    const char* tokens_env = getenv("FP8_TOKENS");
    const int BT = tokens_env != nullptr ? atoi(tokens_env) : dev::check_only ? dev::B * dev::T : 65536;
    const int C = dev::C, Vp = dev::Vp;
    // the FP8 dense peak: twice the measured bf16 GEMM ceiling (the tensor cores' published ratio on Hopper)
    double fp8_peak = 0.0;
    if (!dev::check_only) {
        double bf16 = dev::measure_gemm_tflops(cublas_context.blas);
        fp8_peak = 2.0 * bf16;
        printf("ceiling: cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s; FP8 counted at twice that, %.0f TFLOP/s\n", bf16,
               fp8_peak);
    }
    struct Layer {
        const char* name;
        int C, OC;
    };
    const Layer layers[] = {{"qkv", C, 3 * C}, {"attproj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C},
                            {"lm_head", C, Vp}};
    std::vector<Case> cases;
    for (const Layer& l : layers) {
        cases.push_back({std::string(l.name) + " forward", BT, l.OC, l.C, false});
        cases.push_back({std::string(l.name) + " dinp", BT, l.C, l.OC, true, false, true});       // weightᵀ
        cases.push_back({std::string(l.name) + " dweight", l.OC, l.C, BT, true, true, true});     // doutᵀ, inpᵀ
    }
    std::vector<CaseTimes> times;
    int status = 0;
    for (const Case& c : cases) status |= run_case(c, fp8_peak, &times);
    cublas_teardown();
    if (dev::check_only) return status;
    // one step's GEMMs: the block's layers 12 times, the lm_head once
    double bf16 = 0, fp8 = 0, fast = 0, cast = 0;
    for (size_t i = 0; i < cases.size(); i++) {
        double times_per_step = cases[i].name.rfind("lm_head", 0) == 0 ? 1 : 12;
        bf16 += times_per_step * times[i].bf16_us;
        fp8 += times_per_step * times[i].fp8_us;
        fast += times_per_step * times[i].fast_us;
        cast += times_per_step * times[i].cast_us;
    }
    printf("\none d12 step's GEMMs at B·T = %d (each GEMM alone, L2 flushed): bf16 %.2f ms, fp8 %.2f ms (%.3fx), "
           "fp8 fast %.2f ms (%.3fx), fp8 fast + casts %.2f ms (%.3fx)\n",
           BT, bf16 / 1e3, fp8 / 1e3, bf16 / fp8, fast / 1e3, bf16 / fast, (fast + cast) / 1e3, bf16 / (fast + cast));
    printf("FP8STEP|%d|%.1f|%.1f|%.1f|%.1f\n", BT, bf16, fp8, fast, cast);
    return status;
}
