// FP8 training (-fp8 1, issue 48): the block's four linears (qkv, attproj, fc, fcproj) forward and backward
// in 8-bit floats on Hopper's tensor cores, through fp8.cuh's cast and product; everything else as in BF16.
//
// The recipe: per-tensor delayed scaling, with a first step that calibrates. Each operand of each block
// matmul (layer l's input x and weight w in e4m3, its output's gradient dy in e5m2) has one scale
//
//   s = amax / (the format's largest value: e4m3 448, e5m2 57344),   q = fp8(v / s),   v ≈ s·q
//
// where amax is the largest |v| the tensor held over the last FP8_HISTORY steps, every process's
// maximum taken (an all-reduce of maxima over the run's processes at each step's end, so that every
// process, whatever the layout, casts the same tensor with the same scale: the state is the whole
// model's, and a checkpoint resumes it in any layout). The casts record this step's amax as they go (an
// atomicMax on the float's bits in the cast kernel: no extra pass, no host sync), and a step's scales
// come from the steps before it; the product multiplies the two scales back in (cuBLASLt's A and B scale
// pointers) and accumulates in fp32. The first step has no history: its products run in BF16 while the
// same tensors' amax are recorded (the calibration), so step 1 of an FP8 run is step 1 of a BF16 run.
// Delayed rather than current scaling (an amax pass before each cast) saves a read of every operand;
// the price is a tensor that grows faster than the history's maximum saturates (the cast clips to the
// format's largest value) until the next step's scale catches up.
//
// e4m3 (3 mantissa bits, 2^-9 .. 448) for what the forward multiplies, e5m2 (2 mantissa bits, 2^-16 ..
// 57344) for gradients, whose values span more orders of magnitude: the hybrid of Micikevicius et al.,
// "FP8 Formats for Deep Learning" (2022), and Transformer Engine's default. What stays in BF16: attention
// (its two products are small next to the linears', and its softmax wants the range), the layernorms,
// GELU and the bias gradients (column sums of the BF16 dy, in fp32). The LM head logits = lnf · wteᵀ
// (modded-nanogpt runs it in FP8) joins with -fp8 2 for two of its products, the forward and the input
// gradient, whose dy (dlogits) the classifier writes in e5m2 as it writes them in bf16 (classifier.cuh);
// its weight gradient stays BF16, as its FP8 product would need dlogits transposed, a cast of the
// (B·T, Vp) gradient as a pass of its own that costs about what the product saves (doc/mixed_precision.md's
// measurements). An evaluation forward (no targets' gradient) casts with the scales but records nothing,
// so evaluating never changes training.
//
// The three products of a linear y = x·wᵀ + b (x (N, C), w (OC, C), N = B·T rows), each in the one
// layout cuBLASLt's FP8 path takes, both operands contiguous along the summed dimension (fp8.cuh):
//   forward  y  (N, OC)  = x8 (N, C)   · w8 (OC, C)ᵀ        + b   (BIAS epilogue)
//   dx       dx (N, C)   = dy8 (N, OC) · (wᵀ)8 (C, OC)ᵀ
//   dw       dw (OC, C) += (dyᵀ)8 (OC, N) · (xᵀ)8 (C, N)ᵀ          (beta 1: summed over micro-steps)
// so the backward casts dy both ways from one read, and x and w transposed (the BF16 tensors are kept
// anyway; the FP8 copies live in scratch for one product). Where the kernel before a cast can do it,
// the cast is folded in: dy's cast also takes its column sums for dbias (no pass of matmul_dbias); for
// the MLP's fc (linear_gelu_backward) it computes dy itself from the gradient of the GELU's output (no
// pass of gelu_backward, no bf16 dy written); and the forward's GELU writes fcproj's e4m3 x beside its
// bf16 output (gelu_forward_to_linear). The dimensions must be multiples of 16; a product whose shape
// is not (B·T = 120, say) runs in BF16, and the start-up line says which.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "fp8.cuh"
#include "gelu.cuh"
#include "io/model_file.h"  // require_finite
#include "io/state_file.h"
#include "matmul.cuh"
#include "parallel/comm.h"

enum Fp8Gemm { FP8_QKV, FP8_ATTPROJ, FP8_FC, FP8_FCPROJ, FP8_GEMMS };
enum Fp8Operand { FP8_X, FP8_W, FP8_DY, FP8_OPERANDS };
constexpr int FP8_HISTORY = 16;         // steps of amax a scale looks back over
constexpr size_t FP8_SCALE_STRIDE = 64; // floats: each scale on 256 bytes of its own (fp8.cuh: cuBLASLt's scale pointers)
constexpr int32_t FP8_STATE_VERSION = 2;  // 2: the LM head's tensors (-fp8 2); 1: the blocks' only

// The run's FP8 state and scratch, on the device: for each of the whole model's layers, its four linears'
// three operands ("tensors", (layer, gemm, operand) in that order), then with -fp8 2 the LM head's three.
struct Fp8Training {
    bool on = false;
    bool head = false;     // -fp8 2: the LM head's forward and input gradient too
    int layers = 0;        // the whole model's (a pipeline stage records its own, the maxima merge them)
    long steps = 0;        // steps whose amax went into the history; 0: the calibration step
    long head_steps = 0;   // the same for the LM head's tensors (0 after resuming a checkpoint without them)
    bool record = true;    // the casts record amax (false in an evaluation forward)
    float* scales = nullptr;     // (tensors, FP8_SCALE_STRIDE): tensor i's scale at i·FP8_SCALE_STRIDE
    unsigned* amax = nullptr;    // (tensors): this step's maxima as float bits
    float* maxima = nullptr;     // (tensors): the step's maxima as floats, all-reduced
    float* history = nullptr;    // (tensors, FP8_HISTORY)
    const floatX* x8_of = nullptr;   // act_a holds this tensor's e4m3 copy, written by its producer ...
    int x8_first = -1;               // ... for the linear whose tensors start here (gelu_forward_to_linear)
    unsigned char* act_a = nullptr;  // (rows · widest) bytes: an FP8 activation or gradient
    unsigned char* act_b = nullptr;  // the same: dy's transposed copy
    unsigned char* weight = nullptr; // (max(4 Cl, Vl) · C) bytes: an FP8 weight (Vl: the LM head's rows here)
    floatX* product = nullptr;       // (4 Cl · C): a weight gradient, where cuBLASLt cannot add it in place
    int head_first() const { return layers * FP8_GEMMS * FP8_OPERANDS; }
    int tensors() const { return head_first() + (head ? FP8_OPERANDS : 0); }
};

// One linear's handle: the state and its tensors' first index; off (null) for a BF16 linear.
struct Fp8Linear {
    Fp8Training* t = nullptr;
    int first = 0;  // tensor index of its x; w and dy follow
    float* scale(Fp8Operand o) const { return t->scales + (size_t)(first + o) * FP8_SCALE_STRIDE; }
    unsigned* amax(Fp8Operand o) const { return t->record ? t->amax + first + o : nullptr; }
    bool calibrated() const { return (first >= t->head_first() ? t->head_steps : t->steps) > 0; }
};

inline Fp8Linear fp8_linear(Fp8Training* t, int layer, Fp8Gemm gemm) {
    if (!t->on) return Fp8Linear{};
    return Fp8Linear{t, (layer * FP8_GEMMS + gemm) * FP8_OPERANDS};
}

// The LM head's handle: on with -fp8 2.
template <typename Model>
Fp8Linear fp8_lm_head(Model* model) {
    Fp8Training* t = &model->fp8;
    return t->on && t->head ? Fp8Linear{t, t->head_first()} : Fp8Linear{};
}

// A trainer's block b's linear g (Model: GPT2, with fp8 and layout; b: BlockActs, with its layer): a
// pipeline stage's layer l is the whole model's layer_begin + l, whose scales it uses.
template <typename Model, typename Block>
Fp8Linear fp8_of(Model* model, const Block& b, Fp8Gemm g) {
    return fp8_linear(&model->fp8, model->layout.layer_begin + (int)b.layer, g);
}

// Can cuBLASLt's FP8 path take the three products of a linear of N rows, C inputs and OC outputs?
inline bool fp8_shape_fits(long N, long C, long OC) { return N % 16 == 0 && C % 16 == 0 && OC % 16 == 0; }

// ----------------------------------------------------------------------------
// memory: the state, then the scratch, each piece on 256 bytes (with base null, only the bytes)

// (head: -fp8 2's LM head tensors, on every process; Vl: its rows of wte here, 0 on a stage without it).
// Sets t's layers and head, which its tensor count comes from.
inline size_t fp8_training_layout(Fp8Training* t, char* base, int layers, bool head, size_t rows, size_t C, size_t Cl,
                                  size_t Vl) {
    t->layers = layers;
    t->head = head;
    size_t tensors = (size_t)t->tensors(), offset = 0;
    auto take = [&](auto** ptr, size_t bytes) {
        using Elem = std::remove_pointer_t<std::remove_reference_t<decltype(*ptr)>>;
        *ptr = base ? reinterpret_cast<Elem*>(base + offset) : nullptr;
        offset += align_up_256(bytes);
    };
    take(&t->scales, tensors * FP8_SCALE_STRIDE * sizeof(float));
    take(&t->amax, tensors * sizeof(unsigned));
    take(&t->maxima, tensors * sizeof(float));
    take(&t->history, tensors * FP8_HISTORY * sizeof(float));
    size_t widest = std::max({C, 3 * Cl, 4 * Cl});
    take(&t->act_a, rows * widest);
    take(&t->act_b, rows * widest);
    take(&t->weight, std::max(4 * Cl, Vl) * C);
    take(&t->product, 4 * Cl * C * sizeof(floatX));
    return offset;
}

// The bytes of the state and scratch for a pass over `rows` rows (B·T/cp) of a model of `layers` layers,
// C channels, Cl of them this process's (-tp), with the LM head's tensors (head) and Vl of its rows here:
// the memory plan's, counted with the activations (the head's e5m2 dlogits are an activation: logits8).
inline size_t fp8_training_bytes(int layers, bool head, size_t rows, size_t C, size_t Cl, size_t Vl) {
    Fp8Training unused;
    return fp8_training_layout(&unused, nullptr, layers, head, rows, C, Cl, Vl);
}

// Lays the state out at base (fp8_training_bytes of device memory) and starts it: no history, scales of 1.
inline void fp8_training_start(Fp8Training* t, char* base, int layers, bool head, size_t rows, size_t C, size_t Cl,
                               size_t Vl) {
    t->on = true;
    t->steps = t->head_steps = 0;
    fp8_training_layout(t, base, layers, head, rows, C, Cl, Vl);
    size_t n = t->tensors();
    std::vector<float> ones(n * FP8_SCALE_STRIDE, 1.0f);
    cudaCheck(cudaMemcpy(t->scales, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(t->amax, 0, n * sizeof(unsigned)));
    cudaCheck(cudaMemset(t->history, 0, n * FP8_HISTORY * sizeof(float)));
}

// ----------------------------------------------------------------------------
// the linears

// Are linear f's products FP8 now: on, past the calibration step, and a shape cuBLASLt's FP8 path takes?
inline bool fp8_products(const Fp8Linear& f, int N, int C, int OC) {
    return f.t != nullptr && f.calibrated() && fp8_shape_fits(N, C, OC);
}

// out (N, OC) = inp (N, C) · weight (OC, C)ᵀ + bias: FP8 when f is on, its scales known (after the
// calibration step) and the shape fits; otherwise BF16 (matmul_forward), recording the operands' amax
// during the calibration step.
inline void linear_forward(const Fp8Linear& f, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, cudaStream_t stream) {
    if (!fp8_products(f, N, C, OC)) {
        if (f.t != nullptr && fp8_shape_fits(N, C, OC)) {  // calibration: the maxima for the first scales
            fp8_amax(inp, (size_t)N * C, f.amax(FP8_X), stream);
            fp8_amax(weight, (size_t)OC * C, f.amax(FP8_W), stream);
        }
        matmul_forward(out, nullptr, inp, weight, bias, N, C, OC, stream);
        return;
    }
    auto* x8 = reinterpret_cast<__nv_fp8_e4m3*>(f.t->act_a);
    auto* w8 = reinterpret_cast<__nv_fp8_e4m3*>(f.t->weight);
    const bool x8_written = f.t->x8_of == inp && f.t->x8_first == f.first;  // by inp's producer
    f.t->x8_of = nullptr;
    if (!x8_written) fp8_cast(x8, (__nv_fp8_e4m3*)nullptr, inp, N, C, f.scale(FP8_X), f.amax(FP8_X), stream);
    fp8_cast(w8, (__nv_fp8_e4m3*)nullptr, weight, OC, C, f.scale(FP8_W), f.amax(FP8_W), stream);
    if (!fp8_matmul(out, x8, w8, f.scale(FP8_X), f.scale(FP8_W), N, OC, C, stream, bias)) {  // no BIAS epilogue
        fp8_matmul(out, x8, w8, f.scale(FP8_X), f.scale(FP8_W), N, OC, C, stream);
        fp8_add_bias(out, bias, N, OC, stream);
    }
}

// GELU whose output is linear f's input x (the MLP's fcproj: out (N, C) = gelu(inp), f's shape N x C ->
// OC). When f's forward product is FP8 the kernel also writes x's e4m3 copy with f's x scale and records
// its amax, and linear_forward takes that copy instead of casting out itself: the same codes, one pass
// less. Otherwise gelu_forward. The same bits either way.
inline void gelu_forward_to_linear(const Fp8Linear& f, floatX* out, const floatX* inp, int N, int C, int OC,
                                   cudaStream_t stream) {
    if (!fp8_products(f, N, C, OC)) {
        gelu_forward(out, inp, (size_t)N * C, stream);
        return;
    }
    fp8_gelu_forward(out, reinterpret_cast<__nv_fp8_e4m3*>(f.t->act_a), inp, (size_t)N * C, f.scale(FP8_X), f.amax(FP8_X),
                     stream);
    f.t->x8_of = out;
    f.t->x8_first = f.first;
}

// dinp (N, C) = dy8 (N, OC) · weight (OC, C): the FP8 input gradient from dy's e5m2 codes, with the weight
// cast transposed into the scratch (a linear's backward, and the LM head's from the classifier's codes).
inline void fp8_linear_dinp(const Fp8Linear& f, floatX* dinp, const __nv_fp8_e5m2* dy8, const floatX* weight, int N,
                            int C, int OC, cudaStream_t stream) {
    auto* w8_t = reinterpret_cast<__nv_fp8_e4m3*>(f.t->weight);
    fp8_cast((__nv_fp8_e4m3*)nullptr, w8_t, weight, OC, C, f.scale(FP8_W), f.amax(FP8_W), stream);
    fp8_matmul(dinp, dy8, w8_t, f.scale(FP8_DY), f.scale(FP8_W), N, C, OC, stream);
}

// The FP8 backward (fp8_products): dy cast both ways from one read that also takes its column sums for
// dbias (and, with gelu_pre, applies the GELU's backward first: linear_gelu_backward), then the two products.
inline void fp8_linear_backward(const Fp8Linear& f, floatX* dinp, floatX* dweight, floatX* dbias, float* scratch,
                                const floatX* dout, const floatX* gelu_pre, const floatX* inp, const floatX* weight,
                                int N, int C, int OC, cudaStream_t stream) {
    auto* dy8 = reinterpret_cast<__nv_fp8_e5m2*>(f.t->act_a);
    auto* dy8_t = reinterpret_cast<__nv_fp8_e5m2*>(f.t->act_b);
    auto* x8_t = reinterpret_cast<__nv_fp8_e4m3*>(f.t->act_a);  // after dinp's product: dy8 is done with
    f.t->x8_of = nullptr;  // act_a is overwritten
    fp8_cast(dy8, dy8_t, dout, N, OC, f.scale(FP8_DY), f.amax(FP8_DY), stream, gelu_pre, dbias ? scratch : nullptr);
    if (dbias != nullptr) fp8_cast_dbias(dbias, scratch, N, OC, stream);
    fp8_linear_dinp(f, dinp, dy8, weight, N, C, OC, stream);
    fp8_cast((__nv_fp8_e4m3*)nullptr, x8_t, inp, N, C, f.scale(FP8_X), f.amax(FP8_X), stream);
    if (!fp8_matmul(dweight, dy8_t, x8_t, f.scale(FP8_DY), f.scale(FP8_X), OC, C, N, stream, nullptr, true)) {
        fp8_matmul(f.t->product, dy8_t, x8_t, f.scale(FP8_DY), f.scale(FP8_X), OC, C, N, stream);  // no adding in place
        add_into(dweight, f.t->product, (size_t)OC * C, stream);
    }
}

// A BF16 backward of a linear -fp8 runs (not yet calibrated, or a shape FP8 cannot take): dy's amax is
// recorded all the same where FP8 could take the shape, so the next step's scale is ready.
inline void fp8_calibrate_dy(const Fp8Linear& f, const floatX* dout, int N, int C, int OC, cudaStream_t stream) {
    if (f.t != nullptr && fp8_shape_fits(N, C, OC)) fp8_amax(dout, (size_t)N * OC, f.amax(FP8_DY), stream);
}

// The backward of linear_forward: dinp (N, C) = dout · weight (overwritten); dweight (OC, C) and dbias
// (OC, or null) += their gradients; scratch: matmul_backward_scratch_floats(OC).
inline void linear_backward(const Fp8Linear& f, floatX* dinp, floatX* dweight, floatX* dbias, float* scratch,
                            const floatX* dout, const floatX* inp, const floatX* weight, int N, int C, int OC,
                            cudaStream_t stream) {
    if (fp8_products(f, N, C, OC)) {
        fp8_linear_backward(f, dinp, dweight, dbias, scratch, dout, nullptr, inp, weight, N, C, OC, stream);
        return;
    }
    fp8_calibrate_dy(f, dout, N, C, OC, stream);
    matmul_backward(dinp, dweight, dbias, scratch, dout, inp, weight, nullptr, N, C, OC, stream);
}

// The backward of a linear whose output went through a GELU (the MLP's fc): dout_gelu (N, OC) is the
// gradient of gelu(out), pre = out. In BF16 gelu_backward makes it the linear's dout, in place, before
// linear_backward; in FP8 dy's cast computes the same values as it reads them (the same bf16 dy to the
// bit, so the same e5m2 codes and amax) and dout_gelu is left as it was. A null pre: dout_gelu is already
// the linear's dout (-ge 1: the previous matmul's DGELU epilogue took the GELU's backward).
inline void linear_gelu_backward(const Fp8Linear& f, floatX* dinp, floatX* dweight, floatX* dbias, float* scratch,
                                 floatX* dout_gelu, const floatX* pre, const floatX* inp, const floatX* weight, int N,
                                 int C, int OC, cudaStream_t stream) {
    if (fp8_products(f, N, C, OC)) {
        fp8_linear_backward(f, dinp, dweight, dbias, scratch, dout_gelu, pre, inp, weight, N, C, OC, stream);
        return;
    }
    if (pre != nullptr) gelu_backward(dout_gelu, pre, dout_gelu, (size_t)N * OC, stream);
    linear_backward(f, dinp, dweight, dbias, scratch, dout_gelu, inp, weight, N, C, OC, stream);
}

// The LM head (-fp8 2): logits (N, Vl) = lnf (N, C) · wte (Vl, C)ᵀ runs through linear_forward; the
// classifier then writes dlogits' e5m2 copy (these codes, scale and amax) beside the bf16 values when the
// head's backward will be FP8, else (or with codes null: no dlogits) nothing.
inline Fp8Copy<__nv_fp8_e5m2> lm_head_dy_copy(const Fp8Linear& f, __nv_fp8_e5m2* codes, int N, int C, int Vl) {
    if (codes == nullptr || !fp8_products(f, N, C, Vl)) return {};
    return {codes, f.scale(FP8_DY), f.amax(FP8_DY)};
}

// The LM head's backward: dweight += doutᵀ · inp in BF16 (an FP8 product would need dout transposed: a
// pass over (N, Vl) of its own), then dinp (N, C) = dout · weight, from the classifier's e5m2 copy dout8
// and wte cast transposed when FP8 (lm_head_dy_copy). In that order, so dinp may be inp's own memory
// (-lc: d(loss)/d(lnf) written over lnf's rows).
inline void lm_head_backward(const Fp8Linear& f, floatX* dinp, floatX* dweight, float* scratch, const floatX* dout,
                             const __nv_fp8_e5m2* dout8, const floatX* inp, const floatX* weight, int N, int C, int Vl,
                             cudaStream_t stream) {
    matmul_backward(nullptr, dweight, nullptr, scratch, dout, inp, weight, nullptr, N, C, Vl, stream);
    if (fp8_products(f, N, C, Vl)) {
        fp8_linear_dinp(f, dinp, dout8, weight, N, C, Vl, stream);
        return;
    }
    fp8_calibrate_dy(f, dout, N, C, Vl, stream);
    matmul_backward_input(dinp, dout, weight, nullptr, N, C, Vl, stream);
}

// ----------------------------------------------------------------------------
// the step's end: this step's maxima into the history, the next step's scales from it

// maxima[i] = tensor i's amax of the step (0 for a non-finite one: a skipped step's gradient says
// nothing about the next step's range); the recorder restarts.
__global__ void fp8_collect_kernel(float* maxima, unsigned* amax, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = __uint_as_float(amax[i]);
    maxima[i] = isfinite(a) ? a : 0.0f;
    amax[i] = 0;
}

// history[i][slot] = maxima[i]; scale i = the history's maximum / the format's largest value, or
// unchanged where the history holds only zeros (a tensor never recorded, or all zeros).
__global__ void fp8_rescale_kernel(float* scales, float* history, const float* maxima, int n, int slot) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float* h = history + (size_t)i * FP8_HISTORY;
    h[slot] = maxima[i];
    float m = 0.0f;
    for (int k = 0; k < FP8_HISTORY; k++) m = fmaxf(m, h[k]);
    float largest = i % FP8_OPERANDS == FP8_DY ? FP8_E5M2_MAX : FP8_E4M3_MAX;
    if (m > 0.0f) scales[(size_t)i * FP8_SCALE_STRIDE] = m / largest;
}

// At every training step's end, on every process (a collective of `world`): the maxima over the
// processes, then the history and scales on the device; no host sync.
inline void fp8_step_end(Fp8Training* t, const ProcessGroup& world, cudaStream_t stream) {
    if (!t->on) return;
    int n = t->tensors();
    fp8_collect_kernel<<<ceil_div_int(n, 256), 256, 0, stream>>>(t->maxima, t->amax, n);
    cudaCheckLaunch();
    if (comm_active(world)) {
        all_reduce(world, t->maxima, (size_t)n, COMM_FLOAT32, COMM_MAX);
        comm_join(world);
    }
    fp8_rescale_kernel<<<ceil_div_int(n, 256), 256, 0, stream>>>(t->scales, t->history, t->maxima, n,
                                                                   (int)(t->steps % FP8_HISTORY));
    cudaCheckLaunch();
    t->steps++;
    if (t->head) t->head_steps++;
}

// ----------------------------------------------------------------------------
// the start-up line, the checkpoint's section

// (head: -fp8 2; Vl: the LM head's rows of wte here, 0 on a pipeline stage without it)
inline std::string fp8_training_describe(long rows, int C, int Cl, bool head_on, long Vl) {
    const char* names[FP8_GEMMS] = {"qkv", "attproj", "fc", "fcproj"};
    const long shapes[FP8_GEMMS][2] = {{C, 3L * Cl}, {Cl, C}, {C, 4L * Cl}, {4L * Cl, C}};
    std::string fp8, bf16;
    for (int g = 0; g < FP8_GEMMS; g++) {
        std::string& list = fp8_shape_fits(rows, shapes[g][0], shapes[g][1]) ? fp8 : bf16;
        list += (list.empty() ? "" : ", ") + std::string(names[g]);
    }
    const bool head = head_on && Vl > 0 && fp8_shape_fits(rows, C, Vl);
    if (head_on && Vl > 0 && !head) bf16 += (bf16.empty() ? "" : ", ") + std::string("the LM head");
    std::string line = head_on ? "FP8 (-fp8 2): " : "FP8 (-fp8 1): ";
    line += fp8.empty() ? "no block matmul" : "the block's " + fp8 + " matmuls, forward and backward,";
    if (head) line += " and the LM head's forward and input gradient,";
    line += " in FP8 (x, w e4m3; gradients e5m2; a scale per tensor from the last " + std::to_string(FP8_HISTORY) +
            " steps' amax over every process; a run's first step calibrates in BF16)";
    if (!bf16.empty()) {
        line += "; " + bf16 + " in BF16 (B·T = " + std::to_string(rows) + " rows, C " + std::to_string(C) +
                ": cuBLASLt's FP8 path takes multiples of 16)";
    }
    if (head_on && Vl == 0) line += "; the LM head is the last pipeline stage's";
    return line + (head ? "; the LM head's weight gradient, attention, layernorms and GELU in BF16"
                        : head_on ? "; attention, layernorms and GELU in BF16"
                                  : "; the LM head, attention, layernorms and GELU in BF16");
}

// The section (version 2): version, layers, FP8_HISTORY, the LM head's tensors (1) or not (0) (int32 x
// 4), steps, the head's steps (int64 x 2), then the history and the scales (tensors x FP8_HISTORY,
// tensors floats). Version 1 (written before -fp8 2) had the blocks' tensors only, a 0 for the fourth
// int32 and no head's steps. The same on every process.
inline StateSection fp8_training_section(const Fp8Training& t) {
    size_t n = t.tensors();
    std::vector<float> history(n * FP8_HISTORY), strided(n * FP8_SCALE_STRIDE);
    cudaCheck(cudaMemcpy(history.data(), t.history, history.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(strided.data(), t.scales, strided.size() * sizeof(float), cudaMemcpyDeviceToHost));
    StateSection s;
    s.kind = STATE_SECTION_FP8_SCALES;
    int32_t head[4] = {FP8_STATE_VERSION, t.layers, FP8_HISTORY, t.head ? 1 : 0};
    int64_t steps[2] = {t.steps, t.head_steps};
    auto put = [&](const void* p, size_t bytes) { s.bytes.insert(s.bytes.end(), (const uint8_t*)p, (const uint8_t*)p + bytes); };
    put(head, sizeof(head));
    put(steps, sizeof(steps));
    put(history.data(), history.size() * sizeof(float));
    for (size_t i = 0; i < n; i++) put(&strided[i * FP8_SCALE_STRIDE], sizeof(float));
    return s;
}

// The state from a checkpoint's sections: its section if it has one (bit for bit; version 1 or 2), else
// (a checkpoint written without -fp8) a calibration step first, as a new run; a note says which. The LM
// head's tensors: restored where both the checkpoint and the run have them; a run with -fp8 2 from a
// checkpoint without them calibrates the head on its first step (the blocks' products FP8 already); a
// run without -fp8 2 drops them.
inline void fp8_training_restore(Fp8Training* t, const std::vector<StateSection>& sections) {
    const StateSection* found = nullptr;
    for (const StateSection& s : sections) if (s.kind == STATE_SECTION_FP8_SCALES) found = &s;
    if (!t->on) {
        if (found) printf("resume: the checkpoint holds FP8 scaling state; this run has no -fp8 and drops it\n");
        return;
    }
    if (found == nullptr) {
        printf("resume: the checkpoint has no FP8 scaling state (written without -fp8): the first step of this run calibrates in BF16\n");
        return;
    }
    int32_t head[4] = {};
    if (found->bytes.size() >= sizeof(head)) memcpy(head, found->bytes.data(), sizeof(head));
    const int version = head[0];
    const bool saved_head = version == 2 && head[3] == 1;
    const size_t blocks = (size_t)t->head_first(), saved = blocks + (saved_head ? FP8_OPERANDS : 0);
    const size_t counts = version == 2 ? 2 : 1;  // int64: the steps (and the head's)
    size_t want = sizeof(head) + counts * sizeof(int64_t) + saved * (FP8_HISTORY + 1) * sizeof(float);
    if ((version != 1 && version != 2) || head[1] != t->layers || head[2] != FP8_HISTORY || head[3] != (saved_head ? 1 : 0) ||
        found->bytes.size() != want) {
        fatal("the checkpoint's FP8 scaling state (%zu bytes: version %d, %d layers, history %d, LM head %d) is not one "
              "this run reads (version 1 or 2, %d layers, history %d: %zu bytes)", found->bytes.size(), head[0], head[1],
              head[2], head[3], t->layers, FP8_HISTORY, want);
    }
    const uint8_t* p = found->bytes.data() + sizeof(head);
    int64_t steps[2] = {0, 0};
    memcpy(steps, p, counts * sizeof(int64_t));
    p += counts * sizeof(int64_t);
    std::vector<float> history(saved * FP8_HISTORY), scales(saved);
    memcpy(history.data(), p, history.size() * sizeof(float));
    memcpy(scales.data(), p + history.size() * sizeof(float), scales.size() * sizeof(float));
    require_finite(history.data(), history.size(), "reading", "the checkpoint's FP8 amax history");
    for (size_t i = 0; i < saved; i++) {
        if (!(scales[i] > 0.0f) || !std::isfinite(scales[i])) fatal("the checkpoint's FP8 scale %zu is %g: not a positive finite number", i, scales[i]);
    }
    // the run's tensors: the blocks' from the checkpoint; the head's from it too, or a new start
    const size_t n = t->tensors(), kept = std::min(n, saved);
    std::vector<float> run_history(n * FP8_HISTORY, 0.0f), strided(n * FP8_SCALE_STRIDE, 1.0f);
    std::copy(history.begin(), history.begin() + kept * FP8_HISTORY, run_history.begin());
    for (size_t i = 0; i < kept; i++) strided[i * FP8_SCALE_STRIDE] = scales[i];
    cudaCheck(cudaMemcpy(t->history, run_history.data(), run_history.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(t->scales, strided.data(), strided.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(t->amax, 0, n * sizeof(unsigned)));
    t->steps = steps[0];
    t->head_steps = t->head && saved_head ? steps[1] : 0;
    if (t->head && !saved_head) {
        printf("resume: the checkpoint's FP8 scaling state has no LM head (written with -fp8 1): the head calibrates in BF16 on this run's first step\n");
    } else if (!t->head && saved_head) {
        printf("resume: the checkpoint's FP8 scaling state holds the LM head's (-fp8 2); this run has -fp8 1 and drops them\n");
    }
}
