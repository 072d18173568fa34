// Linear layer on the GPU through cuBLASLt: out = inp · Wᵀ + bias (optionally GELU), and its backward.
//
// cuBLASLt is column-major; our tensors are row-major, and a row-major (R, S) matrix is the same
// memory as a column-major (S, R) one. So every product is written for the transposes:
//   forward  outᵀ (OC, N) = W (OC, C)·inpᵀ (C, N)        -> A = W transposed, B = inp
//   dinp     dinpᵀ (C, N) = Wᵀ (C, OC)·doutᵀ (OC, N)     -> A = W, B = dout
//   dweight  dWᵀ (C, OC) += inpᵀ (C, N)·dout (N, OC)     -> A = inp, B = dout transposed
// with N = B·T. The products run in fp32 accumulation (tensor cores for bf16; plain fp32, no TF32,
// in fp32 builds).
//
// Epilogues: the bias is added by cuBLASLt's BIAS epilogue (free: it rides on the output write).
// GELU can also be fused (GELU_AUX_BIAS forward, which writes the pre-GELU values as the aux output;
// DGELU backward, which multiplies dinp by gelu'(pre-GELU)); whether that is faster than our own GELU
// kernel depends on the cuBLASLt version, so the trainer makes it a choice (-ge). The epilogue applies
// GELU to the fp32 accumulator, our kernel to the rounded bf16 value, so the two differ in the last bit:
// with -ge 1 a recomputation (-r 1, 2) re-runs the fused matmul rather than our GELU kernel.
// The heuristic is told each matrix's real alignment (pointer_alignment); it would otherwise assume 256
// bytes. Same shapes, epilogue and alignments give the same algorithm, so the same bits, every call:
// the choice is made once per problem and kept (matmul_algorithms). It is the heuristic's first
// candidate, or with autotuning (-at 1) the fastest of its first few, each timed on the problem's own
// buffers the first time the problem comes (the auto-tuning of a kernel's variants, done by cuBLASLt's
// kernels). Autotuning gives up one thing: two runs may time differently and choose different kernels,
// whose sums can differ in the last bits, so it is off by default. A resumed run takes the choices its
// checkpoint recorded (llmc/matmul_choices.cuh) instead of timing again, so it continues with the bits
// of the run that wrote it.
// The bias gradient is our own two-stage column sum (fixed order, no atomics), like LayerNorm's, or
// with -bg 1 cuBLASLt's BGRADB epilogue on the weight-gradient product, which reads dout anyway: its
// B operand is dout, and BGRADB writes the sums of op(B)'s columns over k = N, dbias itself. That
// saves reading dout (N, OC) once more, ~2% of a d12 step's memory traffic, if the epilogue costs
// the product nothing; whether it does is for a GPU to say (dev/cuda/matmul_backward.cu times both), so
// it is off by default. BGRADB writes rather than adds and in D's type, so the sum lands in floatX
// scratch and add_into (cuda_common.cuh) adds it into dbias: a rounding to floatX before the add, where
// our kernel rounds only the sum. Should cuBLASLt offer no BGRADB algorithm for a shape, that shape falls
// back to our kernel (said once).
#pragma once

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_common.cuh"

constexpr int MATMUL_DBIAS_ROW_BLOCKS = 128;  // partial sums for dbias; fixed so the order is too
constexpr int MATMUL_DBIAS_ROWS_PER_BLOCK = 8;

// ----------------------------------------------------------------------------
// kernels

// Stage 1 of dbias: block (32, 8) covers 32 x 8 columns of dout; row block blockIdx.y of
// MATMUL_DBIAS_ROW_BLOCKS sums rows blockIdx.y*8 + threadIdx.y, stepping 8*MATMUL_DBIAS_ROW_BLOCKS.
__global__ void matmul_dbias_partials_kernel(float* partials,      // (MATMUL_DBIAS_ROW_BLOCKS, OC)
                                             const floatX* dout,   // (N, OC)
                                             int N, int OC) {
    __shared__ float shared[MATMUL_DBIAS_ROWS_PER_BLOCK][WARP_SIZE][x128::size];
    int o = (blockIdx.x * WARP_SIZE + threadIdx.x) * x128::size;
    bool active = o < OC;
    float sum[x128::size] = {};
    if (active) {
        for (int n = blockIdx.y * blockDim.y + threadIdx.y; n < N; n += gridDim.y * blockDim.y) {
            x128 d = load128(dout + (size_t)n * OC + o);
#pragma unroll
            for (int k = 0; k < x128::size; k++) sum[k] += (float)d[k];
        }
    }
#pragma unroll
    for (int k = 0; k < x128::size; k++) shared[threadIdx.y][threadIdx.x][k] = sum[k];
    __syncthreads();
    if (threadIdx.y != 0 || !active) return;
    for (int y = 1; y < blockDim.y; y++) {
#pragma unroll
        for (int k = 0; k < x128::size; k++) sum[k] += shared[y][threadIdx.x][k];
    }
#pragma unroll
    for (int k = 0; k < x128::size; k++) partials[(size_t)blockIdx.y * OC + o + k] = sum[k];
}

// Stage 2: dbias[o] += the partials summed in row-block order.
__global__ void matmul_dbias_sum_partials_kernel(floatX* dbias, const float* partials, int num_row_blocks, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float sum = 0.0f;
    for (int r = 0; r < num_row_blocks; r++) sum += partials[(size_t)r * OC + o];
    dbias[o] = (floatX)((float)dbias[o] + sum);
}

// ----------------------------------------------------------------------------
// the one cuBLASLt call

// The largest power of two dividing the address, capped at 256 (cuBLASLt's own default assumption):
// what the heuristic is told about each matrix. The trainer lays every per-layer activation slice out
// on 256 bytes (train_gpt2.cu, layer_strides), so a recomputed matmul sees the alignment the forward saw
// and gets the same algorithm, hence the same bits.
inline uint32_t pointer_alignment(const void* pointer) {
    uintptr_t address = (uintptr_t)pointer;
    uintptr_t lowest_bit = address & (~address + 1);  // 0 for a null pointer
    return lowest_bit == 0 || lowest_bit > 256 ? 256u : (uint32_t)lowest_bit;
}

// ----------------------------------------------------------------------------
// which algorithm: the heuristic's first or (-at 1) the fastest of its first few, once per problem

// What the heuristic is asked about a product. Equal keys get the same algorithm for the whole run.
struct MatmulKey {
    int m, n, k, trans_a, trans_b, epilogue;
    uint32_t align[6];  // A, B, C, D, bias, aux
    bool operator<(const MatmulKey& o) const {
        return std::tie(m, n, k, trans_a, trans_b, epilogue, align[0], align[1], align[2], align[3], align[4], align[5]) <
               std::tie(o.m, o.n, o.k, o.trans_a, o.trans_b, o.epilogue, o.align[0], o.align[1], o.align[2], o.align[3],
                        o.align[4], o.align[5]);
    }
};

struct MatmulChoice {
    cublasLtMatmulAlgo_t algo;
    int chosen = 0, candidates = 1;      // the heuristic's candidate taken, of how many it offered
    float ms_first = 0, ms_chosen = 0;   // -at 1: one call's time with its first and with the chosen
    long calls = 0;
    bool from_checkpoint = false;        // -at 1: the recorded choice of the checkpoint resumed from
};

struct MatmulAlgorithms {
    bool bias_grad_epilogue = false;  // -bg 1: dbias from the weight-gradient product's BGRADB epilogue
    bool autotune = false;     // -at 1
    int max_candidates = 8;    // of the heuristic's, in its order
    int timed_rounds = 5;      // each candidate timed once per round, after an untimed round
    std::map<MatmulKey, MatmulChoice> chosen;
    // -at 1 resumed: the algorithms the checkpoint recorded, taken (untimed) where this cuBLASLt offers the
    // same one among its candidates for the problem (llmc/matmul_choices.cuh)
    std::map<MatmulKey, cublasLtMatmulAlgo_t> recorded;
    std::function<float(int)> test_timer;  // testing: one call of candidate i, its time instead of the GPU's
};
inline MatmulAlgorithms matmul_algorithms;

// The run's choices: -at 1 (autotune) and -bg 1 (the bias gradient from cuBLASLt's BGRADB epilogue).
inline void matmul_configure(bool autotune, bool bias_grad_epilogue) {
    matmul_algorithms.autotune = autotune;
    matmul_algorithms.bias_grad_epilogue = bias_grad_epilogue;
}

// One line on what autotuning chose, weighting each problem by its calls so far ("" without -at 1).
inline std::string matmul_autotune_report() {
    if (!matmul_algorithms.autotune) return "";
    size_t problems = 0, changed = 0, recorded = 0;
    double first = 0, chosen = 0;
    for (const auto& [key, c] : matmul_algorithms.chosen) {
        problems++;
        changed += c.chosen != 0;
        recorded += c.from_checkpoint;
        first += (double)c.calls * c.ms_first;
        chosen += (double)c.calls * c.ms_chosen;
    }
    char text[400];
    snprintf(text, sizeof(text), "matmul autotune (-at 1): %zu problems, %zu took another than the heuristic's first "
             "candidate; their calls so far timed %.3f ms with the first, %.3f ms with the chosen (%+.1f%%); %zu of the "
             "choices from the checkpoint resumed", problems, changed, first, chosen,
             first > 0 ? 100.0 * (chosen - first) / first : 0.0, recorded);
    return text;
}

// D (m, n) = op(A)·op(B) [+ D if accumulate] with an epilogue, all column-major:
//   A is (m, k), stored (k, m) when trans_a;  B is (k, n), stored (n, k) when trans_b.
//   bias (m) or nullptr; gelu_aux (m, n) or nullptr: with backward_gelu false the pre-GELU output is
//   written there and D gets gelu(...); with backward_gelu true it is read and D gets
//   op(A)·op(B) * gelu'(gelu_aux).
// The general form under it: D = alpha op(A)·op(B) + beta C, where C (m, n) may be D itself (c == d) or
// another matrix (matmul_scaled); alpha and beta are fp32, and the sum is rounded to floatX once.
// bias_grad (n) or nullptr (then bias and gelu_aux must be nullptr): BGRADB, bias_grad[j] = the sum of
// op(B)'s column j over k, written. Returns false, having computed nothing, only when bias_grad is
// given and cuBLASLt has no algorithm for it.
inline bool matmul_cublaslt_general(floatX* d, const floatX* a, const floatX* b, const floatX* c, float alpha, float beta,
                                    const floatX* bias, int m, int n, int k, bool trans_a, bool trans_b,
                                    floatX* gelu_aux, bool backward_gelu, cudaStream_t stream,
                                    floatX* bias_grad = nullptr) {
    if (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)bias | (uintptr_t)gelu_aux |
         (uintptr_t)bias_grad) % 16 != 0) {
        fatal("matmul_cublaslt needs 16-byte aligned pointers");
    }
    if (bias_grad != nullptr && (bias != nullptr || gelu_aux != nullptr)) {
        fatal("matmul_cublaslt: the bias-gradient epilogue takes no bias or GELU");
    }
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));

    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    cublasCheck(trans_a ? cublasLtMatrixLayoutCreate(&layout_a, CUBLAS_FLOATX, k, m, k)
                        : cublasLtMatrixLayoutCreate(&layout_a, CUBLAS_FLOATX, m, k, m));
    cublasCheck(trans_b ? cublasLtMatrixLayoutCreate(&layout_b, CUBLAS_FLOATX, n, k, n)
                        : cublasLtMatrixLayoutCreate(&layout_b, CUBLAS_FLOATX, k, n, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, CUBLAS_FLOATX, m, n, m));

    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (gelu_aux != nullptr && backward_gelu) {
        if (bias != nullptr) {
            fatal("matmul_cublaslt: a bias with the GELU-backward epilogue is not supported");
        }
        epilogue = CUBLASLT_EPILOGUE_DGELU;
    } else if (gelu_aux != nullptr) {
        epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    } else if (bias != nullptr) {
        epilogue = CUBLASLT_EPILOGUE_BIAS;
    } else if (bias_grad != nullptr) {
        epilogue = CUBLASLT_EPILOGUE_BGRADB;
        bias = bias_grad;  // the same pointer attribute, read or written as the epilogue says
    }
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias != nullptr) {
        cudaDataType_t bias_type = CUBLAS_FLOATX;  // documented: the bias and the bias gradient have D's type
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (gelu_aux != nullptr) {
        int64_t aux_ld = m;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &gelu_aux,
                                                   sizeof(gelu_aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                   sizeof(aux_ld)));
    }

    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    size_t workspace_bytes = CUBLAS_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    // Unless told, the heuristic assumes every matrix is 256-byte aligned and may pick a kernel that
    // faults or refuses on a pointer that is not (a parameter tensor after an odd-sized one, a layer of
    // a short sampling forward). Tell it the real alignment.
    uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_c = pointer_alignment(c),
             align_d = pointer_alignment(d);
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                     &align_a, sizeof(align_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                     &align_b, sizeof(align_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                     &align_c, sizeof(align_c)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                     &align_d, sizeof(align_d)));
    MatmulKey key{m, n, k, (int)trans_a, (int)trans_b, (int)epilogue,
                  {align_a, align_b, align_c, align_d, pointer_alignment(bias), pointer_alignment(gelu_aux)}};
    auto run = [&](const cublasLtMatmulAlgo_t& algo, floatX* d_out) {
        return cublasLtMatmul(cublas_context.lt, desc, &alpha, a, layout_a, b, layout_b, &beta, c, layout_d, d_out,
                              layout_d, &algo, cublas_context.workspace, CUBLAS_WORKSPACE_BYTES, stream);
    };
    auto known = matmul_algorithms.chosen.find(key);
    if (known == matmul_algorithms.chosen.end()) {
        int want = matmul_algorithms.autotune ? matmul_algorithms.max_candidates : 1, found = 0;
        std::vector<cublasLtMatmulHeuristicResult_t> results(want);
        cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublas_context.lt, desc, layout_a, layout_b, layout_d,
                                                               layout_d, preference, want, results.data(), &found);
        if (bias_grad == nullptr) cublasCheck(status);
        if (status != CUBLAS_STATUS_SUCCESS) found = 0;
        if (found == 0 && bias_grad == nullptr) {
            fatal("cuBLASLt has no algorithm for m=%d n=%d k=%d trans_a=%d trans_b=%d epilogue=%d (%s); "
                  "check the shapes are multiples of 8",
                  m, n, k, (int)trans_a, (int)trans_b, (int)epilogue, PRECISION_NAME);
        }
        if (found == 0) {
            printf("matmul: cuBLASLt has no BGRADB algorithm for m=%d n=%d k=%d; that bias gradient uses our kernel "
                   "(-bg 1)\n", m, n, k);
        }
        MatmulChoice choice;
        choice.algo = results[0].algo;
        choice.candidates = found;  // 0: none (BGRADB only), nothing is computed
        auto recorded = matmul_algorithms.recorded.find(key);
        if (matmul_algorithms.autotune && recorded != matmul_algorithms.recorded.end()) {
            for (int i = 0; i < found && !choice.from_checkpoint; i++) {
                if (memcmp(&results[i].algo, &recorded->second, sizeof(cublasLtMatmulAlgo_t)) != 0) continue;
                choice.chosen = i;
                choice.algo = results[i].algo;
                choice.from_checkpoint = true;
            }
            if (!choice.from_checkpoint) {
                printf("matmul autotune: the checkpoint's algorithm for m=%d n=%d k=%d is not among this cuBLASLt's "
                       "candidates (another library or device): timed afresh, so the run may differ in the last bits "
                       "from the one that wrote the checkpoint\n", m, n, k);
            }
        }
        if (matmul_algorithms.autotune && found > 1 && !choice.from_checkpoint) {
            // One untimed round over the candidates, then timed_rounds rounds, each candidate once per
            // round between two events, the order reversed every other round; a candidate's time is its
            // fastest round. Rounds rather than each candidate's calls back to back: a device whose
            // clocks are still rising (the first step of a run) would otherwise make the first
            // candidates look slow and the later ones fast, and a wrong choice (seen on an H200,
            // 2026-11-27: -at 1 chose another kernel for 10 of 15 problems, its trials said 9.6% faster,
            // the steps were not). A product that adds into D (C = D, beta != 0) writes a scratch D
            // instead, so the trials never add into the real one; any other product is computed again
            // below, after the trials, by the chosen candidate, which overwrites what they wrote (in D
            // and the GELU aux output).
            floatX* trial_d = d;
            if (c == d && beta != 0.0f) cudaCheck(cudaMalloc(&trial_d, (size_t)m * n * sizeof(floatX)));
            cudaEvent_t start, stop;
            cudaCheck(cudaEventCreate(&start));
            cudaCheck(cudaEventCreate(&stop));
            std::vector<float> ms(found, INFINITY);
            std::vector<bool> runs(found, false);
            for (int i = 0; i < found; i++) runs[i] = run(results[i].algo, trial_d) == CUBLAS_STATUS_SUCCESS;  // some refuse
            for (int round = 0; round < matmul_algorithms.timed_rounds; round++) {
                for (int j = 0; j < found; j++) {
                    int i = round % 2 == 0 ? j : found - 1 - j;
                    if (!runs[i]) continue;
                    cudaCheck(cudaEventRecord(start, stream));
                    cublasCheck(run(results[i].algo, trial_d));
                    cudaCheck(cudaEventRecord(stop, stream));
                    cudaCheck(cudaEventSynchronize(stop));
                    float elapsed = 0;
                    cudaCheck(cudaEventElapsedTime(&elapsed, start, stop));
                    if (matmul_algorithms.test_timer) elapsed = matmul_algorithms.test_timer(i);
                    ms[i] = std::min(ms[i], elapsed);
                }
            }
            for (int i = 1; i < found; i++) {
                if (ms[i] < ms[choice.chosen]) choice.chosen = i;  // ties keep the heuristic's order
            }
            if (std::isinf(ms[choice.chosen])) fatal("cuBLASLt: none of %d candidate algorithms ran for m=%d n=%d k=%d", found, m, n, k);
            choice.algo = results[choice.chosen].algo;
            choice.ms_first = std::isinf(ms[0]) ? ms[choice.chosen] : ms[0];
            choice.ms_chosen = ms[choice.chosen];
            cudaCheck(cudaEventDestroy(start));
            cudaCheck(cudaEventDestroy(stop));
            if (trial_d != d) cudaCheck(cudaFree(trial_d));
        }
        known = matmul_algorithms.chosen.emplace(key, choice).first;
    }
    bool computed = known->second.candidates > 0;
    if (computed) {
        known->second.calls++;
        cublasCheck(run(known->second.algo, d));
    }

    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return computed;
}

inline void matmul_cublaslt(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                            bool trans_a, bool trans_b, bool accumulate, floatX* gelu_aux, bool backward_gelu,
                            cudaStream_t stream) {
    matmul_cublaslt_general(d, a, b, d, 1.0f, accumulate ? 1.0f : 0.0f, bias, m, n, k, trans_a, trans_b, gelu_aux,
                            backward_gelu, stream);
}

// D = alpha op(A)·op(B) + beta C (column-major, as above), C another matrix than D: torch.addmm's form.
inline void matmul_scaled(floatX* d, const floatX* a, const floatX* b, const floatX* c, float alpha, float beta, int m,
                          int n, int k, bool trans_a, bool trans_b, cudaStream_t stream) {
    matmul_cublaslt_general(d, a, b, c, alpha, beta, nullptr, m, n, k, trans_a, trans_b, nullptr, false, stream);
}

// ----------------------------------------------------------------------------
// launchers

// out = inp · weightᵀ + bias, overwriting out. With pre_gelu non-null: pre_gelu = inp · weightᵀ + bias
// and out = gelu(pre_gelu), both from one fused call.
inline void matmul_forward(floatX* out,          // (N, OC)
                           floatX* pre_gelu,     // (N, OC) or nullptr
                           const floatX* inp,    // (N, C)
                           const floatX* weight, // (OC, C)
                           const floatX* bias,   // (OC) or nullptr
                           int N, int C, int OC, cudaStream_t stream) {
    matmul_cublaslt(out, weight, inp, bias, OC, N, C, true, false, false, pre_gelu, false, stream);
}

// fp32 scratch the bias gradient needs
inline size_t matmul_backward_scratch_floats(int OC) { return (size_t)MATMUL_DBIAS_ROW_BLOCKS * OC; }

// dbias (OC) += the column sums of dout (N, OC), our two stages in a fixed order (no atomics); OC a
// multiple of x128::size.
inline void matmul_dbias(floatX* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream) {
    if (OC % x128::size != 0) fatal("matmul_backward: bias size %d must be divisible by %d", OC, x128::size);
    dim3 grid(ceil_div_int(OC / x128::size, WARP_SIZE), MATMUL_DBIAS_ROW_BLOCKS);
    dim3 block(WARP_SIZE, MATMUL_DBIAS_ROWS_PER_BLOCK);
    matmul_dbias_partials_kernel<<<grid, block, 0, stream>>>(scratch, dout, N, OC);
    cudaCheckLaunch();
    matmul_dbias_sum_partials_kernel<<<ceil_div_int(OC, 256), 256, 0, stream>>>(dbias, scratch, MATMUL_DBIAS_ROW_BLOCKS, OC);
    cudaCheckLaunch();
}

// dinp (N, C) = dout (N, OC) · weight (OC, C), overwritten; with pre_gelu, cuBLASLt's DGELU epilogue
// multiplies it by GELU'(pre_gelu), the gradient of the GELU that made this matmul's input.
inline void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* weight, const floatX* pre_gelu, int N,
                                  int C, int OC, cudaStream_t stream) {
    matmul_cublaslt(dinp, weight, dout, nullptr, C, N, OC, false, false, false, const_cast<floatX*>(pre_gelu), true,
                    stream);
}

// dinp = dout · weight (overwritten; with pre_gelu non-null, multiplied by gelu'(pre_gelu), i.e. the
// gradient flows on through the GELU whose output was this layer's input). Accumulates (+=) into
// dweight and dbias (dbias may be nullptr).
inline void matmul_backward(floatX* dinp,           // (N, C)
                            floatX* dweight,        // (OC, C)
                            floatX* dbias,          // (OC) or nullptr
                            float* scratch,         // matmul_backward_scratch_floats(OC), if dbias
                            const floatX* dout,     // (N, OC)
                            const floatX* inp,      // (N, C)
                            const floatX* weight,   // (OC, C)
                            const floatX* pre_gelu, // (N, C) or nullptr
                            int N, int C, int OC, cudaStream_t stream) {
    if (dbias != nullptr && OC % x128::size != 0) {
        fatal("matmul_backward: bias size %d must be divisible by %d", OC, x128::size);
    }
    // null: the weight's gradient only (the LM head's, llmc/fp8_linear.cuh)
    if (dinp != nullptr) matmul_backward_input(dinp, dout, weight, pre_gelu, N, C, OC, stream);
    // dweightᵀ (C, OC) += inpᵀ·dout; with -bg 1 its BGRADB epilogue sums op(B) = dout (N, OC) over N
    // into scratch (OC floatX at its start), then added into dbias
    floatX* bias_grad = dbias != nullptr && matmul_algorithms.bias_grad_epilogue ? (floatX*)scratch : nullptr;
    if (matmul_cublaslt_general(dweight, inp, dout, dweight, 1.0f, 1.0f, nullptr, C, OC, N, false, true, nullptr,
                                false, stream, bias_grad)) {
        if (bias_grad != nullptr) {
            add_into(dbias, bias_grad, OC, stream);
            return;
        }
    } else {  // no BGRADB algorithm for this shape
        matmul_cublaslt(dweight, inp, dout, nullptr, C, OC, N, false, true, true, nullptr, false, stream);
    }
    if (dbias != nullptr) matmul_dbias(dbias, scratch, dout, N, OC, stream);
}
