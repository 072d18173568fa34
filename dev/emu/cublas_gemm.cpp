// The CPU kernel behind cublasGemmEx, cublasGemmStridedBatchedEx and cublasLtMatmul.
//
// Blocking (GotoBLAS-style, simplified): the output is cut into tiles of TILE_M x TILE_N; for each
// tile, k is walked in panels of PANEL_K, and each panel of op(A) (TILE_M x PANEL_K) and op(B)
// (PANEL_K x TILE_N) is converted once to fp32 and packed so the micro-kernel reads both sequentially.
// The micro-kernel keeps a MICRO_M x MICRO_N block of fp32 accumulators in registers.
//
// Determinism: every output element is one fp32 accumulator summed over p = 0, 1, ..., k-1 in that
// order (panels are visited in order and the accumulator is carried between them), so the bits do not
// depend on the tiling or on how tiles are shared between threads. Whether a·b + acc is fused (FMA)
// is the compiler's choice under the build flags; it is fixed for a given binary.
#include "cublas_gemm.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <unistd.h>

#include <cuda_fp8.h>  // the emulated one: fp8 decoding

namespace emu_blas {

namespace {

constexpr int MICRO_M = 16;  // two 8-float vectors
constexpr int MICRO_N = 6;
constexpr int TILE_M = 128;  // multiple of MICRO_M
constexpr int TILE_N = 96;   // multiple of MICRO_N
constexpr int PANEL_K = 256;

// ----------------------------------------------------------------------------
// element conversions (bf16 is the top half of an fp32; rounding to nearest even)

inline float bf16_bits_to_float(uint16_t bits) {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t float_to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // NaN stays a quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// fp16 (CUDA_R_16F, issue 13): GCC's _Float16 converts with IEEE round-to-nearest-even, as the GPU does
struct HalfBits {
    _Float16 value;
};

inline float load_element(const void* base, cudaDataType type, int64_t index) {
    if (type == CUDA_R_16BF) return bf16_bits_to_float(((const uint16_t*)base)[index]);
    if (type == CUDA_R_16F) return (float)((const _Float16*)base)[index];
    return ((const float*)base)[index];
}

inline void store_element(void* base, cudaDataType type, int64_t index, float value) {
    if (type == CUDA_R_16BF) {
        ((uint16_t*)base)[index] = float_to_bf16_bits(value);
    } else if (type == CUDA_R_16F) {
        ((_Float16*)base)[index] = (_Float16)value;
    } else {
        ((float*)base)[index] = value;
    }
}

// ----------------------------------------------------------------------------
// packing: op(X) element (row, col) of a column-major operand

struct View {
    const char* base;
    cudaDataType type;
    int64_t ld;
    bool trans;
    bool tf32;
};

// Stored element index of op(X)(row, col).
inline int64_t view_index(const View& v, int64_t row, int64_t col) {
    return v.trans ? col + row * v.ld : row + col * v.ld;
}

template <typename T>
inline float load_typed(const T* p, int64_t i);
template <>
inline float load_typed<float>(const float* p, int64_t i) { return p[i]; }
template <>
inline float load_typed<uint16_t>(const uint16_t* p, int64_t i) { return bf16_bits_to_float(p[i]); }
template <>
inline float load_typed<HalfBits>(const HalfBits* p, int64_t i) { return (float)p[i].value; }
// fp8 (cuBLASLt only): exact in fp32
template <>
inline float load_typed<__nv_fp8_e4m3>(const __nv_fp8_e4m3* p, int64_t i) { return (float)p[i]; }
template <>
inline float load_typed<__nv_fp8_e5m2>(const __nv_fp8_e5m2* p, int64_t i) { return (float)p[i]; }

// Packs op(A)(i0 .. i0+rows, p0 .. p0+depth) as slivers of MICRO_M rows: packed[s][p][r], zero-padded.
template <typename T>
void pack_a(float* packed, const View& a, int64_t i0, int rows, int64_t p0, int depth) {
    const T* base = (const T*)a.base;
    int slivers = (rows + MICRO_M - 1) / MICRO_M;
    for (int s = 0; s < slivers; s++) {
        float* out = packed + (size_t)s * depth * MICRO_M;
        int live = std::min(MICRO_M, rows - s * MICRO_M);
        if (live < MICRO_M) std::fill(out, out + (size_t)depth * MICRO_M, 0.0f);
        // loop order follows memory: along p for a transposed A (rows are contiguous), else along r
        if (a.trans) {
            for (int r = 0; r < live; r++) {
                const T* src = base + view_index(a, i0 + s * MICRO_M + r, p0);
                for (int p = 0; p < depth; p++) out[p * MICRO_M + r] = load_typed<T>(src, p);
            }
        } else {
            for (int p = 0; p < depth; p++) {
                const T* src = base + view_index(a, i0 + s * MICRO_M, p0 + p);
                for (int r = 0; r < live; r++) out[p * MICRO_M + r] = load_typed<T>(src, r);
            }
        }
        if (a.tf32) {
            for (int e = 0; e < depth * MICRO_M; e++) out[e] = round_to_tf32(out[e]);
        }
    }
}

// Packs op(B)(p0 .. p0+depth, j0 .. j0+cols) as slivers of MICRO_N columns: packed[s][p][c], zero-padded.
template <typename T>
void pack_b(float* packed, const View& b, int64_t p0, int depth, int64_t j0, int cols) {
    const T* base = (const T*)b.base;
    int slivers = (cols + MICRO_N - 1) / MICRO_N;
    for (int s = 0; s < slivers; s++) {
        float* out = packed + (size_t)s * depth * MICRO_N;
        int live = std::min(MICRO_N, cols - s * MICRO_N);
        if (live < MICRO_N) std::fill(out, out + (size_t)depth * MICRO_N, 0.0f);
        if (b.trans) {
            for (int p = 0; p < depth; p++) {
                const T* src = base + view_index(b, p0 + p, j0 + s * MICRO_N);
                for (int c = 0; c < live; c++) out[p * MICRO_N + c] = load_typed<T>(src, c);
            }
        } else {
            for (int c = 0; c < live; c++) {
                const T* src = base + view_index(b, p0, j0 + s * MICRO_N + c);
                for (int p = 0; p < depth; p++) out[p * MICRO_N + c] = load_typed<T>(src, p);
            }
        }
        if (b.tf32) {
            for (int e = 0; e < depth * MICRO_N; e++) out[e] = round_to_tf32(out[e]);
        }
    }
}

void pack_a_any(float* packed, const View& a, int64_t i0, int rows, int64_t p0, int depth) {
    if (a.type == CUDA_R_16BF) {
        pack_a<uint16_t>(packed, a, i0, rows, p0, depth);
    } else if (a.type == CUDA_R_16F) {
        pack_a<HalfBits>(packed, a, i0, rows, p0, depth);
    } else if (a.type == CUDA_R_8F_E4M3) {
        pack_a<__nv_fp8_e4m3>(packed, a, i0, rows, p0, depth);
    } else if (a.type == CUDA_R_8F_E5M2) {
        pack_a<__nv_fp8_e5m2>(packed, a, i0, rows, p0, depth);
    } else {
        pack_a<float>(packed, a, i0, rows, p0, depth);
    }
}

void pack_b_any(float* packed, const View& b, int64_t p0, int depth, int64_t j0, int cols) {
    if (b.type == CUDA_R_16BF) {
        pack_b<uint16_t>(packed, b, p0, depth, j0, cols);
    } else if (b.type == CUDA_R_16F) {
        pack_b<HalfBits>(packed, b, p0, depth, j0, cols);
    } else if (b.type == CUDA_R_8F_E4M3) {
        pack_b<__nv_fp8_e4m3>(packed, b, p0, depth, j0, cols);
    } else if (b.type == CUDA_R_8F_E5M2) {
        pack_b<__nv_fp8_e5m2>(packed, b, p0, depth, j0, cols);
    } else {
        pack_b<float>(packed, b, p0, depth, j0, cols);
    }
}

// ----------------------------------------------------------------------------
// micro-kernel: acc (MICRO_M x MICRO_N, column-major with leading dimension ld_acc) += a_sliver·b_sliver
//
// Written once over a vector type V and compiled twice: with AVX2 (8 floats per vector) for CPUs that
// have it, chosen at run time since the emulator is built without -march, and with the baseline
// SSE2 (4 floats). Neither may use FMA, so both paths give the same bits: a·b is rounded, then added.

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

template <typename V>
inline __attribute__((always_inline)) void micro_kernel_body(float* acc, int ld_acc, const float* a, const float* b,
                                                             int depth) {
    constexpr int lanes = sizeof(V) / sizeof(float), vectors = MICRO_M / lanes;
    V c[MICRO_N][vectors];
#pragma GCC unroll 8
    for (int j = 0; j < MICRO_N; j++) {
#pragma GCC unroll 8
        for (int v = 0; v < vectors; v++) std::memcpy(&c[j][v], acc + j * ld_acc + v * lanes, sizeof(V));
    }
    for (int p = 0; p < depth; p++) {
        V av[vectors];
#pragma GCC unroll 8
        for (int v = 0; v < vectors; v++) std::memcpy(&av[v], a + p * MICRO_M + v * lanes, sizeof(V));
        const float* bp = b + p * MICRO_N;
#pragma GCC unroll 8
        for (int j = 0; j < MICRO_N; j++) {
            V bj;
#pragma GCC unroll 8
            for (int l = 0; l < lanes; l++) bj[l] = bp[j];
#pragma GCC unroll 8
            for (int v = 0; v < vectors; v++) c[j][v] += av[v] * bj;
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < MICRO_N; j++) {
#pragma GCC unroll 8
        for (int v = 0; v < vectors; v++) std::memcpy(acc + j * ld_acc + v * lanes, &c[j][v], sizeof(V));
    }
}

__attribute__((target("avx2"))) void micro_kernel_avx2(float* acc, int ld_acc, const float* a, const float* b,
                                                       int depth) {
    micro_kernel_body<v8>(acc, ld_acc, a, b, depth);
}

void micro_kernel_sse2(float* acc, int ld_acc, const float* a, const float* b, int depth) {
    micro_kernel_body<v4>(acc, ld_acc, a, b, depth);
}

typedef void (*MicroKernel)(float*, int, const float*, const float*, int);
const MicroKernel micro_kernel = __builtin_cpu_supports("avx2") ? micro_kernel_avx2 : micro_kernel_sse2;

// ----------------------------------------------------------------------------
// one output tile

struct Workspace {
    std::vector<float> a_panel, b_panel, acc;
    Workspace()
        : a_panel((size_t)TILE_M * PANEL_K), b_panel((size_t)PANEL_K * TILE_N), acc((size_t)TILE_M * TILE_N) {}
};

struct Tile {
    int64_t batch, i0, j0;
};

void run_tile(const Gemm& g, const Tile& t, Workspace& ws) {
    int rows = (int)std::min<int64_t>(TILE_M, g.m - t.i0);
    int cols = (int)std::min<int64_t>(TILE_N, g.n - t.j0);
    View a{(const char*)g.a.ptr + t.batch * g.stride_a * (int64_t)type_bytes(g.a.type), g.a.type, g.a.ld,
           g.a.trans, g.tf32 && g.a.type == CUDA_R_32F};
    View b{(const char*)g.b.ptr + t.batch * g.stride_b * (int64_t)type_bytes(g.b.type), g.b.type, g.b.ld,
           g.b.trans, g.tf32 && g.b.type == CUDA_R_32F};
    float* acc = ws.acc.data();
    std::fill(ws.acc.begin(), ws.acc.end(), 0.0f);
    int slivers_m = (rows + MICRO_M - 1) / MICRO_M, slivers_n = (cols + MICRO_N - 1) / MICRO_N;
    for (int64_t p0 = 0; p0 < g.k; p0 += PANEL_K) {
        int depth = (int)std::min<int64_t>(PANEL_K, g.k - p0);
        pack_a_any(ws.a_panel.data(), a, t.i0, rows, p0, depth);
        pack_b_any(ws.b_panel.data(), b, p0, depth, t.j0, cols);
        for (int sn = 0; sn < slivers_n; sn++) {
            for (int sm = 0; sm < slivers_m; sm++) {
                micro_kernel(acc + (size_t)sn * MICRO_N * TILE_M + sm * MICRO_M, TILE_M,
                             ws.a_panel.data() + (size_t)sm * depth * MICRO_M,
                             ws.b_panel.data() + (size_t)sn * depth * MICRO_N, depth);
            }
        }
    }

    // epilogue: one rounding per output (and per aux) element; FP8's scales multiply alpha
    const Epilogue& e = g.epilogue;
    const float alpha = g.alpha * (g.a_scale ? *g.a_scale : 1.0f) * (g.b_scale ? *g.b_scale : 1.0f);
    const char* c_base =
        g.c == nullptr ? nullptr : (const char*)g.c + t.batch * g.stride_c * (int64_t)type_bytes(g.c_type);
    char* d_base = (char*)g.d + t.batch * g.stride_d * (int64_t)type_bytes(g.d_type);
    for (int r = 0; r < rows; r++) {
        int64_t i = t.i0 + r;
        float bias = e.add_bias ? load_element(e.bias, e.bias_type, i) : 0.0f;
        for (int cidx = 0; cidx < cols; cidx++) {
            int64_t j = t.j0 + cidx;
            float v = alpha * acc[(size_t)cidx * TILE_M + r];
            if (g.beta != 0.0f) v += g.beta * load_element(c_base, g.c_type, i + j * g.ldc);
            if (e.add_bias) v += bias;
            if (e.dgelu) v *= gelu_grad(load_element(e.aux, e.aux_type, i + j * e.aux_ld));
            if (e.write_aux) store_element(e.aux, e.aux_type, i + j * e.aux_ld, v);
            if (e.gelu) v = gelu(v);
            store_element(d_base, g.d_type, i + j * g.ldd, v);
        }
    }
}

}  // namespace

// ----------------------------------------------------------------------------
// public helpers

float round_to_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;  // Inf and NaN unchanged
    u += 0xfffu + ((u >> 13) & 1u);                   // 23 - 10 = 13 mantissa bits dropped, ties to even
    u &= ~0x1fffu;
    std::memcpy(&x, &u, 4);
    return x;
}

float gelu(float x) {
    const float s = 0.7978845608028654f;  // sqrt(2/pi)
    float u = s * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + std::tanh(u));
}

float gelu_grad(float x) {
    const float s = 0.7978845608028654f;
    float u = s * (x + 0.044715f * x * x * x);
    float th = std::tanh(u);
    float du_dx = s * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

size_t type_bytes(cudaDataType type) {
    switch (type) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16BF: return 2;
        case CUDA_R_16F: return 2;
        case CUDA_R_8F_E4M3: return 1;
        case CUDA_R_8F_E5M2: return 1;
        default: return 0;
    }
}

const char* type_name(cudaDataType type) {
    switch (type) {
        case CUDA_R_32F: return "CUDA_R_32F";
        case CUDA_R_16BF: return "CUDA_R_16BF";
        case CUDA_R_16F: return "CUDA_R_16F";
        case CUDA_R_64F: return "CUDA_R_64F";
        case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
        case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
        default: return "an unsupported cudaDataType";
    }
}

bool supported_types(cudaDataType a, cudaDataType b, cudaDataType c) {
    if (a != b) return false;
    if (a == CUDA_R_16BF) return c == CUDA_R_16BF || c == CUDA_R_32F;
    if (a == CUDA_R_16F) return c == CUDA_R_16F || c == CUDA_R_32F;
    if (a == CUDA_R_32F) return c == CUDA_R_32F;
    return false;
}

bool is_fp8(cudaDataType type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

bool supported_fp8_types(cudaDataType a, cudaDataType b, cudaDataType d) {
    if (!is_fp8(a) || !is_fp8(b) || (a == CUDA_R_8F_E5M2 && b == CUDA_R_8F_E5M2)) return false;
    return d == CUDA_R_16BF || d == CUDA_R_16F || d == CUDA_R_32F;
}

size_t matrix_extent_bytes(int64_t rows, int64_t cols, int64_t ld, cudaDataType type) {
    if (rows <= 0 || cols <= 0) return 0;
    return (size_t)((cols - 1) * ld + rows) * type_bytes(type);
}

cublasStatus_t refuse(cublasStatus_t status, const char* fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    fprintf(stderr, "cuda-emu: cuBLAS: %s (returning %s)\n", message, cublasGetStatusName(status));
    return status;
}

namespace {

// initcheck (EMU_ASAN builds, dev/emu/device_memory.cpp): each stored column of a rows x cols
// column-major matrix, read or written
void initcheck_matrix(const void* p, cudaDataType type, int64_t rows, int64_t cols, int64_t ld, const char* reader) {
    size_t bytes = type_bytes(type);
    for (int64_t j = 0; j < cols; j++) {
        const char* column = (const char*)p + (size_t)(j * ld) * bytes;
        if (reader) emu::initcheck_read(column, (size_t)rows * bytes, reader);
        else emu::initcheck_mark_written(column, (size_t)rows * bytes);
    }
}

// what the product reads (A, B; C when beta != 0; the epilogue's bias and GELU input), before it runs
void initcheck_inputs(const Gemm& g) {
    if (!emu::initchecking()) return;
    for (int64_t batch = 0; batch < g.batch_count; batch++) {
        auto at = [&](const void* p, int64_t stride, cudaDataType type) {
            return (const char*)p + (size_t)(batch * stride) * type_bytes(type);
        };
        if (g.k > 0) {
            initcheck_matrix(at(g.a.ptr, g.stride_a, g.a.type), g.a.type, g.a.trans ? g.k : g.m, g.a.trans ? g.m : g.k,
                             g.a.ld, "cuBLAS GEMM (emulated) operand A");
            initcheck_matrix(at(g.b.ptr, g.stride_b, g.b.type), g.b.type, g.b.trans ? g.n : g.k, g.b.trans ? g.k : g.n,
                             g.b.ld, "cuBLAS GEMM (emulated) operand B");
        }
        if (g.beta != 0.0f)
            initcheck_matrix(at(g.c, g.stride_c, g.c_type), g.c_type, g.m, g.n, g.ldc, "cuBLAS GEMM (emulated) operand C (beta != 0)");
    }
    if (g.epilogue.add_bias) emu::initcheck_read(g.epilogue.bias, (size_t)g.m * type_bytes(g.epilogue.bias_type), "cuBLASLt epilogue bias");
    if (g.epilogue.dgelu)
        initcheck_matrix(g.epilogue.aux, g.epilogue.aux_type, g.m, g.n, g.epilogue.aux_ld, "cuBLASLt DGELU epilogue input");
}

// what it wrote: D, and the GELU input it keeps
void initcheck_outputs(const Gemm& g) {
    if (!emu::initchecking()) return;
    for (int64_t batch = 0; batch < g.batch_count; batch++)
        initcheck_matrix((const char*)g.d + (size_t)(batch * g.stride_d) * type_bytes(g.d_type), g.d_type, g.m, g.n, g.ldd, nullptr);
    if (g.epilogue.write_aux) initcheck_matrix(g.epilogue.aux, g.epilogue.aux_type, g.m, g.n, g.epilogue.aux_ld, nullptr);
    if (g.epilogue.bias_grad_b != nullptr)
        emu::initcheck_mark_written(g.epilogue.bias_grad_b, (size_t)g.n * type_bytes(g.epilogue.bias_grad_type));
}

// BGRADB: the column sums of op(B) (k, n), one fp32 sum per column in k order, rounded once
void bias_gradient_of_b(const Gemm& g) {
    const Operand& b = g.b;
    for (int64_t j = 0; j < g.n; j++) {
        float sum = 0.0f;
        for (int64_t p = 0; p < g.k; p++) sum += load_element(b.ptr, b.type, b.trans ? j + p * b.ld : p + j * b.ld);
        store_element(g.epilogue.bias_grad_b, g.epilogue.bias_grad_type, j, sum);
    }
}

}  // namespace

void no_cublas_check(const char* fn) {
    static const bool no_cublas = getenv("EMU_NO_CUBLAS") != nullptr && strcmp(getenv("EMU_NO_CUBLAS"), "0") != 0;
    if (no_cublas) {
        fprintf(stderr, "cuda-emu: cuBLAS: %s called under EMU_NO_CUBLAS=1: on a GPU this launches a cuBLAS kernel\n", fn);
        fflush(stderr);
        _exit(70);
    }
}

void run_gemm(const Gemm& g) {
    if (g.m <= 0 || g.n <= 0 || g.batch_count <= 0) return;
    initcheck_inputs(g);
    int64_t tiles_m = (g.m + TILE_M - 1) / TILE_M, tiles_n = (g.n + TILE_N - 1) / TILE_N;
    std::vector<Tile> tiles;
    tiles.reserve((size_t)(g.batch_count * tiles_m * tiles_n));
    for (int64_t batch = 0; batch < g.batch_count; batch++) {
        for (int64_t tn = 0; tn < tiles_n; tn++) {
            for (int64_t tm = 0; tm < tiles_m; tm++) tiles.push_back({batch, tm * TILE_M, tn * TILE_N});
        }
    }
    // the two halves of the tile list run on two threads; results do not depend on the split
    double flops = 2.0 * (double)g.m * g.n * std::max<int64_t>(g.k, 1) * g.batch_count;
    bool two_threads = tiles.size() > 1 && flops > 4e6 && std::thread::hardware_concurrency() > 1;
    size_t split = two_threads ? tiles.size() / 2 : tiles.size();
    auto run_range = [&](size_t begin, size_t end) {
        Workspace ws;
        for (size_t t = begin; t < end; t++) run_tile(g, tiles[t], ws);
    };
    if (two_threads) {
        std::thread helper(run_range, split, tiles.size());
        run_range(0, split);
        helper.join();
    } else {
        run_range(0, tiles.size());
    }
    if (g.epilogue.bias_grad_b != nullptr) bias_gradient_of_b(g);
    initcheck_outputs(g);
}

}  // namespace emu_blas
