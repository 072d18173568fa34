// cuBLASLt on the CPU: descriptors, layouts, preferences, a heuristic and cublasLtMatmul with the
// epilogues this project uses. The product is the kernel in cublas_gemm.cpp.
//
// The heuristic returns up to EMU_LT_ALGORITHMS candidates, as a GPU returns several kernels for one
// problem; they differ only in their index (algo slot SLOT_INDEX) and all compute the same arithmetic,
// so an autotuner (llmc/matmul.cuh, -at 1) can time and choose among them here, and what it chooses
// cannot change a result under emulation (on a GPU it can: other kernels, other summation orders).
//
// cublasLtMatmul computes, per NVIDIA's cuBLASLt documentation (column-major, fp32 compute and scale):
//   D = epilogue(alpha·op(A)·op(B) + beta·C), one rounding to D's type
//   BIAS: + bias[row] (bias has D's type and D's row count)
//   GELU, GELU_BIAS: gelu(...) of the value above (bias first)
//   GELU_AUX, GELU_AUX_BIAS: as GELU, and the GELU input is also stored in aux (D's type, leading
//       dimension EPILOGUE_AUX_LD, which must be a multiple of 8 and at least D's rows)
//   DGELU: (alpha·op(A)·op(B) + beta·C) · gelu'(aux), aux read with EPILOGUE_AUX_LD
//   BGRADB: D as DEFAULT, and apart from it the bias gradient of B: for each of D's n columns j, the sum
//       over the GEMM's k dimension of op(B)(p, j), written (not added) to BIAS_POINTER in the bias type
//       (D's). The documentation: "Bias gradient based on the input matrix B. The bias size corresponds
//       to the number of columns of the matrix D. The reduction happens over the GEMM's "k" dimension.
//       Stores Bias gradient in the auxiliary output (see CUBLASLT_MATMUL_DESC_BIAS_POINTER)." The
//       emulator sums in fp32 in k order and rounds once; a GPU kernel's order is its own, and whether
//       it rounds partial sums to the bias type on the way is not documented (a GPU check: test/gpu's
//       kernel test compares its result with a double sum at the fp32 reduction's tolerance).
//   FP8 (A and B CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2, not both E5M2; C = D bf16, fp16 or fp32): D =
//       alpha·scale_A·scale_B·op(A)·op(B) + beta·C, the scales read from A_SCALE_POINTER and
//       B_SCALE_POINTER (device floats, 1 when not set) when the product runs; only the "TN" form that
//       Hopper's FP8 kernels take (A transposed, B not: the documentation's requirement) and the DEFAULT
//       or BIAS epilogue (the bias in D's type, bf16 or fp16, added to the scaled product before the one
//       rounding, as for the other types; the trainer's -fp8 1 uses it, and a GPU call checks it:
//       test/gpu's Kernels.Fp8Matmul*). FAST_ACCUM is accepted and changes nothing here: the emulator accumulates in fp32 either
//       way (a GPU's fast accumulation keeps fewer bits, so its results differ within a tolerance). A
//       scale pointer must be 16-byte aligned: an H100 refused one 4 bytes into an allocation
//       (CUBLAS_STATUS_NOT_SUPPORTED, doc/gpu_results.md call 15) and took 256-byte aligned ones; the
//       documentation gives no limit, 16 is this emulator's assumption. EMU_FP8_EPILOGUES=default refuses
//       the BIAS epilogue and beta != 0 with FP8 operands, as a GPU that lacked them would.
// The documentation does not say which GELU: it only says "apply GELU point-wise transform". We use
// the tanh approximation 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))) (what GPT-2 uses and what
// cuBLASLt is generally understood to compute); this is an assumption, not a documented fact.
// Not emulated (refused with CUBLAS_STATUS_NOT_SUPPORTED and a printed reason): RELU epilogues,
// DGELU_BGRAD (the documentation, "apply independently GELU and Bias gradient to matmul output", does
// not settle whether the bias gradient sums the values before or after gelu'; test/gpu's
// Kernels.CublasLtDgeluBgradIsOneOfItsTwoReadings asks a GPU), BGRADA, batched layouts with an epilogue
// or unequal batch counts (strided batches with the DEFAULT epilogue are, as llm.c's attention uses them), orders other
// than column-major, device pointer modes, FP8 outputs and their D scale and amax, C scales.
//
// Alignment: cublasLtMatmulAlgoGetHeuristic returns algorithms valid for pointers aligned as the
// preference's MIN_ALIGNMENT_{A,B,C,D}_BYTES promise (256 bytes each by default), and for the bias and
// aux pointers as aligned as the ones in the descriptor at that time. A real GPU may then run a kernel
// that needs that alignment; given a less aligned pointer it fails or misbehaves. The emulator's algo
// remembers the promise and cublasLtMatmul refuses a pointer that breaks it (CUBLAS_STATUS_NOT_SUPPORTED,
// with the pointer, its alignment and the promised one printed).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "cublas_gemm.h"
#include "emu/device.h"

using emu_blas::refuse;

struct cublasLtContext {
    int unused = 0;
};

struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType type = CUDA_R_32F;
    uint64_t rows = 0, cols = 0;
    int64_t ld = 0;
    int32_t order = CUBLASLT_ORDER_COL;
    int32_t batch_count = 1;
    int64_t batch_stride = 0;
};

struct cublasLtMatmulDescOpaque_t {
    int32_t compute_type = CUBLAS_COMPUTE_32F;
    int32_t scale_type = CUDA_R_32F;
    int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    int32_t bias_type = -1;  // -1: D's type
    void* aux = nullptr;
    int64_t aux_ld = 0;
    int32_t aux_type = -1;  // -1: D's type
    const float* a_scale = nullptr;  // FP8: A_SCALE_POINTER, B_SCALE_POINTER (device)
    const float* b_scale = nullptr;
    int8_t fast_accum = 0;
};

struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t max_workspace_bytes = 0;
    uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

constexpr uint64_t ALGO_MAGIC = 0x656d752d616c676full;  // "emu-algo"
constexpr uint32_t DEFAULT_ALIGNMENT = 256;             // MIN_ALIGNMENT_*_BYTES default

// The algo records the alignments it was chosen for.
enum AlgoSlot { SLOT_MAGIC = 0, SLOT_A, SLOT_B, SLOT_C, SLOT_D, SLOT_BIAS, SLOT_AUX, SLOT_INDEX };
constexpr int EMU_LT_ALGORITHMS = 4;

// Largest power of two (up to 256) dividing the address; 256 for nullptr.
uint64_t pointer_alignment(const void* p) {
    uintptr_t address = (uintptr_t)p;
    if (address == 0) return DEFAULT_ALIGNMENT;
    uint64_t alignment = address & (~address + 1);
    return std::min<uint64_t>(alignment, DEFAULT_ALIGNMENT);
}

bool epilogue_has_bias(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool epilogue_has_bias_grad(uint32_t e) { return e == CUBLASLT_EPILOGUE_BGRADB; }
bool epilogue_has_aux(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

const char* epilogue_name(uint32_t e) {
    switch (e) {
        case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
        case CUBLASLT_EPILOGUE_RELU: return "RELU";
        case CUBLASLT_EPILOGUE_RELU_AUX: return "RELU_AUX";
        case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
        case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
        case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: return "RELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DRELU: return "DRELU";
        case CUBLASLT_EPILOGUE_DRELU_BGRAD: return "DRELU_BGRAD";
        case CUBLASLT_EPILOGUE_GELU: return "GELU";
        case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
        case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
        case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
        case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
        case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
        case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    }
    return "unknown";
}

template <typename T>
cublasStatus_t read_attribute(const char* fn, int attr, const void* buf, size_t size, T* out) {
    if (buf == nullptr || size != sizeof(T)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: attribute %d takes %zu bytes, got %zu%s", fn, attr, sizeof(T),
                      size, buf == nullptr ? " (buffer NULL)" : "");
    }
    std::memcpy(out, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

// The product a descriptor and four layouts describe, checked; everything but the pointers.
struct Problem {
    int64_t m = 0, n = 0, k = 0;
    int64_t batch = 1;  // strided batched: batch_count products, each layout's STRIDED_BATCH_OFFSET apart
    bool trans_a = false, trans_b = false, tf32 = false;
    cudaDataType bias_type = CUDA_R_32F, aux_type = CUDA_R_32F;
};

cublasStatus_t check_layout(const char* fn, const char* name, cublasLtMatrixLayout_t layout) {
    if (layout == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: layout %s is NULL", fn, name);
    if (layout->order != CUBLASLT_ORDER_COL) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: %s has order %d; only CUBLASLT_ORDER_COL is emulated", fn, name,
                      (int)layout->order);
    }
    if (layout->batch_count < 1 || layout->batch_stride < 0) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: %s has batch count %d and stride %lld", fn, name,
                      (int)layout->batch_count, (long long)layout->batch_stride);
    }
    if (layout->ld < (int64_t)std::max<uint64_t>(1, layout->rows)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: %s has ld %lld < rows %llu", fn, name, (long long)layout->ld,
                      (unsigned long long)layout->rows);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_problem(const char* fn, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                             cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                             Problem* problem) {
    if (desc == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: matmul descriptor is NULL", fn);
    cublasStatus_t status;
    if ((status = check_layout(fn, "Adesc", a)) || (status = check_layout(fn, "Bdesc", b)) ||
        (status = check_layout(fn, "Cdesc", c)) || (status = check_layout(fn, "Ddesc", d))) {
        return status;
    }
    switch (desc->compute_type) {
        case CUBLAS_COMPUTE_32F:
        case CUBLAS_COMPUTE_32F_PEDANTIC: problem->tf32 = false; break;
        case CUBLAS_COMPUTE_32F_FAST_TF32: problem->tf32 = true; break;
        default:
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: compute type %d is not emulated", fn, (int)desc->compute_type);
    }
    if (desc->scale_type != CUDA_R_32F) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: scale type %s is not emulated (CUDA_R_32F is)", fn,
                      emu_blas::type_name((cudaDataType)desc->scale_type));
    }
    if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: pointer mode %d is not emulated (HOST is)", fn,
                      (int)desc->pointer_mode);
    }
    auto op_ok = [](int32_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
    if (!op_ok(desc->transa) || !op_ok(desc->transb) || desc->transc != CUBLAS_OP_N) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: TRANSA %d / TRANSB %d / TRANSC %d not allowed", fn,
                      (int)desc->transa, (int)desc->transb, (int)desc->transc);
    }
    if (a->batch_count != d->batch_count || b->batch_count != d->batch_count || c->batch_count != d->batch_count) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: batch counts A %d, B %d, C %d, D %d; only equal ones are emulated",
                      fn, (int)a->batch_count, (int)b->batch_count, (int)c->batch_count, (int)d->batch_count);
    }
    problem->batch = d->batch_count;
    problem->trans_a = desc->transa != CUBLAS_OP_N;
    problem->trans_b = desc->transb != CUBLAS_OP_N;
    problem->m = (int64_t)d->rows;
    problem->n = (int64_t)d->cols;
    problem->k = (int64_t)(problem->trans_a ? a->rows : a->cols);
    int64_t a_m = (int64_t)(problem->trans_a ? a->cols : a->rows);
    int64_t b_k = (int64_t)(problem->trans_b ? b->cols : b->rows);
    int64_t b_n = (int64_t)(problem->trans_b ? b->rows : b->cols);
    if (a_m != problem->m || b_k != problem->k || b_n != problem->n || c->rows != d->rows || c->cols != d->cols) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "%s: shapes do not agree: D %llux%llu, op(A) %lldx%lld, op(B) %lldx%lld, C %llux%llu", fn,
                      (unsigned long long)d->rows, (unsigned long long)d->cols, (long long)a_m, (long long)problem->k,
                      (long long)b_k, (long long)b_n, (unsigned long long)c->rows, (unsigned long long)c->cols);
    }
    bool fp8 = emu_blas::is_fp8(a->type) || emu_blas::is_fp8(b->type);
    if (fp8) {
        if (c->type != d->type || !emu_blas::supported_fp8_types(a->type, b->type, d->type)) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                          "%s: FP8 with A %s, B %s, C %s, D %s is not emulated (A, B e4m3 or e5m2, not both e5m2; C = D "
                          "bf16, fp16 or fp32)", fn, emu_blas::type_name(a->type), emu_blas::type_name(b->type),
                          emu_blas::type_name(c->type), emu_blas::type_name(d->type));
        }
        if (desc->transa != CUBLAS_OP_T || desc->transb != CUBLAS_OP_N) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 needs A transposed and B not (\"TN\"); got TRANSA %d, "
                          "TRANSB %d", fn, (int)desc->transa, (int)desc->transb);
        }
        if (problem->tf32 || (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc->epilogue != CUBLASLT_EPILOGUE_BIAS)) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 with %s is not emulated (CUBLAS_COMPUTE_32F and the "
                          "DEFAULT and BIAS epilogues are)", fn, problem->tf32 ? "TF32 compute" : epilogue_name(desc->epilogue));
        }
    } else if (desc->a_scale != nullptr || desc->b_scale != nullptr) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: A/B scale pointers without FP8 operands are not emulated", fn);
    }
    if (!fp8 && (c->type != d->type || !emu_blas::supported_types(a->type, b->type, d->type))) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: A %s, B %s, C %s, D %s with fp32 compute is not emulated", fn,
                      emu_blas::type_name(a->type), emu_blas::type_name(b->type), emu_blas::type_name(c->type),
                      emu_blas::type_name(d->type));
    }
    uint32_t e = desc->epilogue;
    if (e != CUBLASLT_EPILOGUE_DEFAULT && !epilogue_has_bias(e) && !epilogue_has_aux(e) &&
        e != CUBLASLT_EPILOGUE_GELU && !epilogue_has_bias_grad(e)) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "%s: epilogue %s (%u) is not emulated (DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, "
                      "DGELU, BGRADB are)",
                      fn, epilogue_name(e), e);
    }
    problem->bias_type = desc->bias_type == -1 ? d->type : (cudaDataType)desc->bias_type;
    problem->aux_type = desc->aux_type == -1 ? d->type : (cudaDataType)desc->aux_type;
    if (epilogue_has_bias(e) || epilogue_has_bias_grad(e)) {
        if (desc->bias == nullptr) {
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %s without BIAS_POINTER", fn, epilogue_name(e));
        }
        // documented: bias elements have D's type (the exceptions are IMMA and fp8 kernels)
        if (problem->bias_type != d->type) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bias type %s with D %s is not emulated", fn,
                          emu_blas::type_name(problem->bias_type), emu_blas::type_name(d->type));
        }
    }
    if (epilogue_has_aux(e)) {
        if (desc->aux == nullptr) {
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %s without EPILOGUE_AUX_POINTER", fn,
                          epilogue_name(e));
        }
        // documented for GELU aux: "must be divisible by 8 and be no less than the number of rows"
        if (desc->aux_ld < problem->m || desc->aux_ld % 8 != 0) {
            return refuse(CUBLAS_STATUS_INVALID_VALUE,
                          "%s: EPILOGUE_AUX_LD %lld must be a multiple of 8 and at least D's %lld rows", fn,
                          (long long)desc->aux_ld, (long long)problem->m);
        }
        if (problem->aux_type != d->type) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: aux type %s with D %s is not emulated", fn,
                          emu_blas::type_name(problem->aux_type), emu_blas::type_name(d->type));
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_pointer(const char* name, const void* p, size_t bytes, uint64_t promised) {
    if (bytes == 0) return CUBLAS_STATUS_SUCCESS;
    if (p == nullptr || !emu::is_device_pointer(p, bytes)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul: %s = %p is not %zu bytes of device memory", name, p,
                      bytes);
    }
    if ((uintptr_t)p % promised != 0) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "cublasLtMatmul: %s = %p is only %llu-byte aligned, but the algorithm was chosen for %llu-byte "
                      "alignment (the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, 256 by default, or "
                      "the descriptor's pointer at cublasLtMatmulAlgoGetHeuristic)",
                      name, p, (unsigned long long)pointer_alignment(p), (unsigned long long)promised);
    }
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// ----------------------------------------------------------------------------
// handles, layouts, descriptors, preferences

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (handle == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: handle is NULL");
    *handle = new cublasLtContext();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (handle == nullptr) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: handle is NULL");
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (layout == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: layout is NULL");
    *layout = new cublasLtMatrixLayoutOpaque_t();
    (*layout)->type = type;
    (*layout)->rows = rows;
    (*layout)->cols = cols;
    (*layout)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
    const char* fn = "cublasLtMatrixLayoutSetAttribute";
    if (layout == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: layout is NULL", fn);
    int32_t value32 = 0;
    switch (attr) {
        case CUBLASLT_MATRIX_LAYOUT_TYPE: {
            uint32_t type = 0;
            cublasStatus_t status = read_attribute(fn, attr, buf, size, &type);
            if (status == CUBLAS_STATUS_SUCCESS) layout->type = (cudaDataType)type;
            return status;
        }
        case CUBLASLT_MATRIX_LAYOUT_ORDER: return read_attribute(fn, attr, buf, size, &layout->order);
        case CUBLASLT_MATRIX_LAYOUT_ROWS: return read_attribute(fn, attr, buf, size, &layout->rows);
        case CUBLASLT_MATRIX_LAYOUT_COLS: return read_attribute(fn, attr, buf, size, &layout->cols);
        case CUBLASLT_MATRIX_LAYOUT_LD: return read_attribute(fn, attr, buf, size, &layout->ld);
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
            cublasStatus_t status = read_attribute(fn, attr, buf, size, &value32);
            if (status == CUBLAS_STATUS_SUCCESS) layout->batch_count = value32;
            return status;
        }
        case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
            return read_attribute(fn, attr, buf, size, &layout->batch_stride);
        default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, (int)attr);
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute_type,
                                        cudaDataType_t scale_type) {
    if (desc == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: desc is NULL");
    *desc = new cublasLtMatmulDescOpaque_t();
    (*desc)->compute_type = compute_type;
    (*desc)->scale_type = scale_type;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    const char* fn = "cublasLtMatmulDescSetAttribute";
    if (desc == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: desc is NULL", fn);
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return read_attribute(fn, attr, buf, size, &desc->compute_type);
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return read_attribute(fn, attr, buf, size, &desc->scale_type);
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: return read_attribute(fn, attr, buf, size, &desc->pointer_mode);
        case CUBLASLT_MATMUL_DESC_TRANSA: return read_attribute(fn, attr, buf, size, &desc->transa);
        case CUBLASLT_MATMUL_DESC_TRANSB: return read_attribute(fn, attr, buf, size, &desc->transb);
        case CUBLASLT_MATMUL_DESC_TRANSC: return read_attribute(fn, attr, buf, size, &desc->transc);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return read_attribute(fn, attr, buf, size, &desc->epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_attribute(fn, attr, buf, size, &desc->bias);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return read_attribute(fn, attr, buf, size, &desc->bias_type);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return read_attribute(fn, attr, buf, size, &desc->aux);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return read_attribute(fn, attr, buf, size, &desc->aux_ld);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return read_attribute(fn, attr, buf, size, &desc->aux_type);
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return read_attribute(fn, attr, buf, size, &desc->a_scale);
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return read_attribute(fn, attr, buf, size, &desc->b_scale);
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return read_attribute(fn, attr, buf, size, &desc->fast_accum);
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: {  // a scheduling hint: no effect on the result
            int32_t ignored;
            return read_attribute(fn, attr, buf, size, &ignored);
        }
        default:
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, (int)attr);
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (pref == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: pref is NULL");
    *pref = new cublasLtMatmulPreferenceOpaque_t();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
    const char* fn = "cublasLtMatmulPreferenceSetAttribute";
    if (pref == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: pref is NULL", fn);
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
            return read_attribute(fn, attr, buf, size, &pref->max_workspace_bytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
            uint32_t alignment = 0;
            cublasStatus_t status = read_attribute(fn, attr, buf, size, &alignment);
            if (status != CUBLAS_STATUS_SUCCESS) return status;
            if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
                return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: alignment %u is not a power of two", fn, alignment);
            }
            pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = alignment;
            return CUBLAS_STATUS_SUCCESS;
        }
        default:
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, (int)attr);
    }
}

// ----------------------------------------------------------------------------
// heuristic and matmul

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested_algo_count,
                                              cublasLtMatmulHeuristicResult_t heuristic_results[],
                                              int* return_algo_count) {
    const char* fn = "cublasLtMatmulAlgoGetHeuristic";
    if (handle == nullptr) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "%s: handle is NULL", fn);
    if (pref == nullptr || requested_algo_count < 1 || heuristic_results == nullptr || return_algo_count == nullptr) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: NULL preference/results or requested count %d < 1", fn,
                      requested_algo_count);
    }
    *return_algo_count = 0;
    Problem problem;
    cublasStatus_t status = check_problem(fn, desc, Adesc, Bdesc, Cdesc, Ddesc, &problem);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    int count = std::min(requested_algo_count, EMU_LT_ALGORITHMS);
    for (int r = 0; r < count; r++) {
        cublasLtMatmulHeuristicResult_t& result = heuristic_results[r];
        std::memset(&result, 0, sizeof(result));
        result.algo.data[SLOT_MAGIC] = ALGO_MAGIC;
        for (int i = 0; i < 4; i++) result.algo.data[SLOT_A + i] = pref->min_alignment[i];
        result.algo.data[SLOT_BIAS] = pointer_alignment(desc->bias);
        result.algo.data[SLOT_AUX] = pointer_alignment(desc->aux);
        result.algo.data[SLOT_INDEX] = (uint64_t)r;
        result.workspaceSize = 0;  // the CPU kernel needs none, so any MAX_WORKSPACE_BYTES fits
        result.state = CUBLAS_STATUS_SUCCESS;
        result.wavesCount = 1.0f;
    }
    *return_algo_count = count;
    return CUBLAS_STATUS_SUCCESS;
}

// EMU_LT_TIMING: unset or "plain" (the candidates take the time their arithmetic takes), or "shuffle"
static bool lt_timing_shuffled() {
    static const bool shuffled = emu::env_choice("EMU_LT_TIMING", "plain", "shuffle");
    return shuffled;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    const char* fn = "cublasLtMatmul";
    emu_blas::no_cublas_check(fn);
    if (handle == nullptr) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "%s: handle is NULL", fn);
    Problem problem;
    cublasStatus_t status = check_problem(fn, desc, Adesc, Bdesc, Cdesc, Ddesc, &problem);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    // without an algo cuBLASLt runs the heuristic with default preferences: 256-byte alignment
    uint64_t promised[7] = {0, DEFAULT_ALIGNMENT, DEFAULT_ALIGNMENT, DEFAULT_ALIGNMENT, DEFAULT_ALIGNMENT,
                            pointer_alignment(desc->bias), pointer_alignment(desc->aux)};
    if (algo != nullptr) {
        if (algo->data[SLOT_MAGIC] != ALGO_MAGIC) {
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: algo was not filled by cublasLtMatmulAlgoGetHeuristic", fn);
        }
        for (int i = SLOT_A; i <= SLOT_AUX; i++) promised[i] = algo->data[i];
    }
    if (alpha == nullptr || beta == nullptr) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta is NULL", fn);
    if (emu::is_device_pointer(alpha, 4) || emu::is_device_pointer(beta, 4)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "%s: alpha/beta point to device memory but the pointer mode is CUBLASLT_POINTER_MODE_HOST", fn);
    }
    float alpha_value = *(const float*)alpha, beta_value = *(const float*)beta;
    if (C == D && Cdesc->ld != Ddesc->ld) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: in place (C == D) needs the same ld for C and D", fn);
    }
    if (workspace_bytes > 0 && workspace != nullptr && !emu::is_device_pointer(workspace, workspace_bytes)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: workspace %p is not %zu bytes of device memory", fn, workspace,
                      workspace_bytes);
    }

    int64_t m = problem.m, n = problem.n, k = problem.k;
    uint32_t e = desc->epilogue;
    size_t a_bytes = emu_blas::matrix_extent_bytes((int64_t)Adesc->rows, (int64_t)Adesc->cols, Adesc->ld, Adesc->type);
    size_t b_bytes = emu_blas::matrix_extent_bytes((int64_t)Bdesc->rows, (int64_t)Bdesc->cols, Bdesc->ld, Bdesc->type);
    size_t c_bytes = emu_blas::matrix_extent_bytes(m, n, Cdesc->ld, Cdesc->type);
    size_t d_bytes = emu_blas::matrix_extent_bytes(m, n, Ddesc->ld, Ddesc->type);
    if (problem.batch > 1) {  // the batches' extents: the last matrix starts (batch - 1) strides in
        if (e != CUBLASLT_EPILOGUE_DEFAULT || desc->a_scale || desc->b_scale) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: a batched product (batch count %lld) with epilogue %u or FP8 "
                          "scales is not emulated (the DEFAULT epilogue is)", fn, (long long)problem.batch, (unsigned)e);
        }
        auto batched = [&](size_t bytes, const cublasLtMatrixLayout_t layout) {
            return bytes + (size_t)(problem.batch - 1) * (size_t)layout->batch_stride * emu_blas::type_bytes(layout->type);
        };
        a_bytes = batched(a_bytes, Adesc);
        b_bytes = batched(b_bytes, Bdesc);
        c_bytes = batched(c_bytes, Cdesc);
        d_bytes = batched(d_bytes, Ddesc);
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if ((status = check_pointer("A", A, k > 0 ? a_bytes : 0, promised[SLOT_A])) ||
        (status = check_pointer("B", B, k > 0 ? b_bytes : 0, promised[SLOT_B])) ||
        (status = check_pointer("C", C, beta_value != 0.0f ? c_bytes : 0, promised[SLOT_C])) ||
        (status = check_pointer("D", D, d_bytes, promised[SLOT_D]))) {
        return status;
    }
    emu_blas::Gemm g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha_value;
    g.beta = beta_value;
    g.a = {A, Adesc->type, Adesc->ld, problem.trans_a};
    g.b = {B, Bdesc->type, Bdesc->ld, problem.trans_b};
    g.c = C;
    g.c_type = Cdesc->type;
    g.ldc = Cdesc->ld;
    g.d = D;
    g.d_type = Ddesc->type;
    g.ldd = Ddesc->ld;
    g.tf32 = problem.tf32;
    g.batch_count = problem.batch;
    g.stride_a = Adesc->batch_stride;
    g.stride_b = Bdesc->batch_stride;
    g.stride_c = Cdesc->batch_stride;
    g.stride_d = Ddesc->batch_stride;
    for (const float* scale : {desc->a_scale, desc->b_scale}) {
        if (scale == nullptr) continue;
        if (!emu::is_device_pointer(scale, sizeof(float))) {
            return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: FP8 scale pointer %p is not a device float", fn, scale);
        }
        if ((uintptr_t)scale % 16 != 0) {
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 scale pointer %p is only %llu-byte aligned (16 assumed: "
                          "an H100 refused a 4-byte aligned one)", fn, scale, (unsigned long long)pointer_alignment(scale));
        }
    }
    g.a_scale = desc->a_scale;
    g.b_scale = desc->b_scale;
    // EMU_FP8_EPILOGUES=default: a GPU whose FP8 kernels take neither the BIAS epilogue nor beta != 0 (for a
    // program's way around that: llmc/fp8_linear.cuh's)
    const char* fp8_epilogues = getenv("EMU_FP8_EPILOGUES");
    if (fp8_epilogues && strcmp(fp8_epilogues, "default") == 0 && emu_blas::is_fp8(Adesc->type) &&
        (e != CUBLASLT_EPILOGUE_DEFAULT || beta_value != 0.0f)) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 with %s (EMU_FP8_EPILOGUES=default)", fn,
                      beta_value != 0.0f ? "beta != 0" : epilogue_name(e));
    }
    emu_blas::Epilogue& epi = g.epilogue;
    if (epilogue_has_bias(e)) {
        size_t bias_bytes = (size_t)m * emu_blas::type_bytes(problem.bias_type);
        if ((status = check_pointer("bias", desc->bias, bias_bytes, promised[SLOT_BIAS]))) return status;
        epi.add_bias = true;
        epi.bias = desc->bias;
        epi.bias_type = problem.bias_type;
    }
    if (epilogue_has_bias_grad(e)) {
        size_t bias_bytes = (size_t)n * emu_blas::type_bytes(problem.bias_type);
        if ((status = check_pointer("bias gradient", desc->bias, bias_bytes, promised[SLOT_BIAS]))) return status;
        epi.bias_grad_b = const_cast<void*>(desc->bias);
        epi.bias_grad_type = problem.bias_type;
    }
    if (epilogue_has_aux(e)) {
        size_t aux_bytes = emu_blas::matrix_extent_bytes(m, n, desc->aux_ld, problem.aux_type);
        if ((status = check_pointer("aux", desc->aux, aux_bytes, promised[SLOT_AUX]))) return status;
        epi.aux = desc->aux;
        epi.aux_type = problem.aux_type;
        epi.aux_ld = desc->aux_ld;
        epi.dgelu = e == CUBLASLT_EPILOGUE_DGELU;
        epi.write_aux = !epi.dgelu;
    }
    epi.gelu = e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
               e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    // EMU_LT_TIMING=shuffle (a test's setting): a candidate takes some extra time, 0.1 to 0.8 ms by a hash of
    // the candidate, the problem and the process, so an autotuner's choices differ from process to process
    // as a GPU's timings can make them (-at 1's resume test: llmc/matmul_choices.cuh)
    double extra_ms = 0.0;
    if (lt_timing_shuffled() && algo != nullptr) {
        uint64_t h = (algo->data[SLOT_INDEX] + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(m * 31 + n * 7 + k) ^
                     (uint64_t)getpid() * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        h *= 0x94D049BB133111EBull;
        extra_ms = 0.1 * (double)(1 + (h >> 33) % 8);
    }
    emu::enqueue(stream, fn, [g, extra_ms] {
        emu_blas::run_gemm(g);
        if (extra_ms > 0) {
            auto until = std::chrono::steady_clock::now() + std::chrono::microseconds((long)(extra_ms * 1000));
            while (std::chrono::steady_clock::now() < until) {
            }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}
