// The AdamW update, version by version, over all 124,475,904 parameters of GPT-2 124M at once:
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  g = grad * grad_scale
//   p -= lr * ((m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p)
// with bf16 parameters and gradients, fp32 m and v, and either fp32 master weights (the trainer's
// default) or none (-w 0); the bf16 parameters are rounded stochastically. Checked against
// adamw_update() of llmc/adamw.h and timed, in both modes.
//
// Everything is updated in place, so every run starts from the same saved state.
// Tolerances: m, v and the master weights are fp32 computed by the same formula as the CPU, so they
// must agree to fp32 rounding (TOL_FP32 1e-5). A stochastically rounded bf16 parameter may land a full
// bf16 step away from the exact value, up to 2^-7 of it at the bottom of a binade (TOL_REDUCTION 1e-2).
//
// The two numbers: per parameter, with master weights, read grad (2 B), m, v, master (4 B each), write
// m, v, master (4 B each) and the bf16 parameter (2 B): 28 B, 3.5 GB in all, ~1.2 ms at 3 TB/s; without
// master weights 22 B (the bf16 parameter is read instead). A few dozen flops per parameter.
//
//   make -C dev/cuda bin/adamw && dev/cuda/bin/adamw
#include "harness.cuh"

#include "../../llmc/adamw.cuh"
#include "../../llmc/adamw.h"

constexpr double TOL_FP32 = 1e-5;

// ----------------------------------------------------------------------------
// v1 is llmc's adamw_update (llmc/adamw.cuh), one tensor per launch: one thread per parameter. Each access is coalesced, but
// narrow: 2 bytes for the bf16 tensors, 4 for the fp32 ones, one element per thread.

// ----------------------------------------------------------------------------
// v2: 8 parameters per thread, every tensor moved in 16-byte accesses (one for the 8 bf16 values, two
// for each fp32 tensor's 8 values), all loads issued before the arithmetic. The same element body
// (adamw_element) and the same random bits per element (hash of the element index and the seed), so
// the results are identical to v1's; the memory instructions are 4 to 8 times fewer and more bytes
// are in flight per thread.

__global__ void adamw_v2_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                float lr, float beta1, float beta2, float bias_correction1, float bias_correction2,
                                float eps, float weight_decay, float grad_scale, uint32_t seed) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i0 >= n) return;
    constexpr int F = f128::size;  // 4 fp32 per 16 bytes
    x128 g = load128cs(grads + i0);
    f128 m_in[2] = {load128cs(m + i0), load128cs(m + i0 + F)};
    f128 v_in[2] = {load128cs(v + i0), load128cs(v + i0 + F)};
    f128 p_in[2];
    if (master != nullptr) {
        p_in[0] = load128cs(master + i0);
        p_in[1] = load128cs(master + i0 + F);
    } else {
        x128 p_bf16 = load128cs(params + i0);
#pragma unroll
        for (int k = 0; k < x128::size; k++) p_in[k / F][k % F] = (float)p_bf16[k];
    }
    x128 p_out;
#pragma unroll
    for (int k = 0; k < x128::size; k++) {
        float p = adamw_element(p_in[k / F][k % F], (float)g[k], &m_in[k / F][k % F], &v_in[k / F][k % F], lr, beta1,
                                beta2, bias_correction1, bias_correction2, eps, weight_decay, grad_scale);
        p_in[k / F][k % F] = p;
        stochastic_round(p, &p_out[k], hash_u32((uint32_t)(i0 + k), seed));
    }
    store128cs(m + i0, m_in[0]);
    store128cs(m + i0 + F, m_in[1]);
    store128cs(v + i0, v_in[0]);
    store128cs(v + i0 + F, v_in[1]);
    if (master != nullptr) {
        store128cs(master + i0, p_in[0]);
        store128cs(master + i0 + F, p_in[1]);
    }
    store128(params + i0, p_out);
}

void adamw_v2(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n, const AdamWSettings& s,
              int block_size) {
    if (n % x128::size != 0) fatal("adamw_v2 needs a size divisible by %d, got %zu", x128::size, n);
    float bias_correction1 = (float)(1.0 - pow((double)s.beta1, s.t));
    float bias_correction2 = (float)(1.0 - pow((double)s.beta2, s.t));
    adamw_v2_kernel<<<ceil_div_int(n / x128::size, block_size), block_size>>>(
        params, master, grads, m, v, n, s.lr, s.beta1, s.beta2, bias_correction1, bias_correction2, s.eps,
        s.weight_decay, s.grad_scale, s.seed);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------
// v3: all of a model's tensors in one launch instead of one launch per tensor (GPT-2 has 16 parameter
// tensors, some of them small: the biases and layernorms, C or 4C elements per layer, whose launches
// would each leave the GPU mostly idle). Each block finds its tensor in a table passed as the kernel's
// parameter (llmc's AdamWBatch), then does v2's 8 parameters per thread. This was llmc's kernel until
// an H200 measured it (2026-11-27): 1072 us against v1's 899 and v2's 955, at 76% of a device copy.
// Its fp32 loads are the reason v2 lags too: a thread's 8 fp32 values of m are two 16-byte loads, so
// each warp-wide load covers every other 16 bytes of a 1 KB span and the next one the rest.
//
// v4 is llmc's adamw_update_many (llmc/adamw.cuh), what the trainer runs: v3's table, 4 parameters per
// thread, so that every warp-wide access is one contiguous run (512 bytes of each fp32 array, 256 of
// each bf16 one).
//
// Both are checked on the n parameters cut into 16 parts of unequal size, one the tail path (a size
// not a multiple of 8) takes, one starting misaligned (the one-tensor adamw_update's path), a seed each.

__global__ void adamw_v3_kernel(const AdamWBatch batch, float lr, float beta1, float beta2, float bias_correction1,
                                float bias_correction2, float eps, float grad_scale) {
    unsigned first;
    AdamWTensor t = adamw_block_tensor(batch, &first);
    constexpr int X = x128::size, F = f128::size, NF = X / F;
    size_t i0 = ((size_t)(blockIdx.x - first) * blockDim.x + threadIdx.x) * X;
    if (i0 >= t.n) return;
    if (i0 + X > t.n) {
        adamw_tensor_tail(t, i0, lr, beta1, beta2, bias_correction1, bias_correction2, eps, grad_scale);
        return;
    }
    x128 g = load128cs(t.grads + i0);
    f128 m_in[NF], v_in[NF], p_in[NF];
#pragma unroll
    for (int q = 0; q < NF; q++) {
        m_in[q] = load128cs(t.m + i0 + q * F);
        v_in[q] = load128cs(t.v + i0 + q * F);
        if (t.master != nullptr) p_in[q] = load128cs(t.master + i0 + q * F);
    }
    if (t.master == nullptr) {
        x128 p_old = load128cs(t.params + i0);
#pragma unroll
        for (int j = 0; j < X; j++) p_in[j / F][j % F] = (float)p_old[j];
    }
    x128 p_out;
#pragma unroll
    for (int j = 0; j < X; j++) {
        float p = adamw_element(p_in[j / F][j % F], (float)g[j], &m_in[j / F][j % F], &v_in[j / F][j % F], lr, beta1,
                                beta2, bias_correction1, bias_correction2, eps, t.weight_decay, grad_scale);
        p_in[j / F][j % F] = p;
        stochastic_round(p, &p_out[j], hash_u32((uint32_t)(i0 + j), t.seed));
    }
#pragma unroll
    for (int q = 0; q < NF; q++) {
        store128cs(t.m + i0 + q * F, m_in[q]);
        store128cs(t.v + i0 + q * F, v_in[q]);
        if (t.master != nullptr) store128cs(t.master + i0 + q * F, p_in[q]);
    }
    store128(t.params + i0, p_out);
}

// the 16 parts (see above)
std::vector<AdamWTensor> adamw_parts(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                     const AdamWSettings& s) {
    std::vector<AdamWTensor> tensors;
    size_t begin = 0;
    for (int k = 0; k < 16 && begin < n; k++) {
        size_t size = k == 15 ? n - begin : std::min(n - begin, (n / 64) * (1 + k % 3) / 8 * 8);
        if (k == 14 && size > 8) size -= 3;  // the next part then starts 16-byte misaligned: adamw_update's path
        tensors.push_back({params + begin, master ? master + begin : nullptr, grads + begin, m + begin, v + begin, size,
                           s.weight_decay, s.seed + (uint32_t)k});
        begin += size;
    }
    return tensors;
}

void adamw_v3(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n, const AdamWSettings& s,
              int block_size) {
    float bias_correction1, bias_correction2;
    adamw_bias_corrections(s, &bias_correction1, &bias_correction2);
    AdamWBatch batch;
    batch.count = 0;
    batch.first_block[0] = 0;
    for (const AdamWTensor& t : adamw_parts(params, master, grads, m, v, n, s)) {
        if ((uintptr_t)t.params % 16 != 0) {  // misaligned: one launch of its own, as llmc does
            AdamWSettings one = s;
            one.weight_decay = t.weight_decay;
            one.seed = t.seed;
            adamw_update(t.params, t.master, t.grads, t.m, t.v, t.n, one, 0);
            continue;
        }
        batch.tensor[batch.count] = t;
        batch.first_block[batch.count + 1] =
            batch.first_block[batch.count] + ceil_div_int(ceil_div(t.n, (size_t)x128::size), block_size);
        batch.count++;
    }
    adamw_v3_kernel<<<batch.first_block[batch.count], block_size>>>(batch, s.lr, s.beta1, s.beta2, bias_correction1,
                                                                    bias_correction2, s.eps, s.grad_scale);
    cudaCheckLaunch();
}

void adamw_v4(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n, const AdamWSettings& s) {
    adamw_update_many(adamw_parts(params, master, grads, m, v, n, s), s, 0);
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    dev::device_init("adamw", argc, argv);
    const size_t n = dev::NUM_PARAMETERS;

    AdamWHyper hyper;  // the trainer's betas and eps
    AdamWSettings settings;
    settings.lr = 1e-3f;
    settings.beta1 = hyper.beta1;
    settings.beta2 = hyper.beta2;
    settings.eps = hyper.eps;
    settings.weight_decay = 0.1f;
    settings.grad_scale = 0.8f;  // as if clipped
    settings.t = 5;
    settings.seed = (uint32_t)dev::next_seed();

    std::vector<float> params = dev::random_floatX(n, -1.0f, 1.0f);  // bf16 values; the master starts equal
    std::vector<float> grads = dev::random_floatX(n, -0.1f, 0.1f);
    std::vector<float> m = dev::random_float(n, -0.01f, 0.01f);
    std::vector<float> v = dev::random_float(n, 0.0f, 1e-4f);

    dev::DeviceBuffer<floatX> d_params0(n), d_params(n), d_grads(n);
    dev::DeviceBuffer<float> d_master0(n), d_master(n), d_m0(n), d_m(n), d_v0(n), d_v(n);
    dev::upload(d_params0, params);
    dev::upload(d_master0, params);
    dev::upload(d_grads, grads);
    dev::upload(d_m0, m);
    dev::upload(d_v0, v);

    // the CPU reference, in fp32 on the same starting values
    std::vector<float> ref_params = params, ref_m = m, ref_v = v;
    adamw_update(ref_params.data(), grads.data(), ref_m.data(), ref_v.data(), n, hyper, settings.lr,
                 settings.weight_decay, settings.grad_scale, settings.t);
    params.clear();
    grads.clear();
    m.clear();
    v.clear();

    auto prepare = [&] {
        dev::copy(d_params, d_params0);
        dev::copy(d_master, d_master0);
        dev::copy(d_m, d_m0);
        dev::copy(d_v, d_v0);
    };
    int status = 0;
    for (bool use_master : {true, false}) {
        printf("\n== %s\n", use_master ? "fp32 master weights (the trainer's default)" : "no master weights (-w 0)");
        double bytes_per_param = use_master ? 28.0 : 22.0;
        dev::Report report =
            dev::make_report(use_master ? "adamw" : "adamw -w 0 (no master weights)", bytes_per_param * n, 0.0);
        float* master = use_master ? d_master.ptr : nullptr;
        std::vector<dev::Version> versions = {
            {"v1 llmc adamw_update: a thread per parameter", {0},
             [&](int) { adamw_update(d_params.ptr, master, d_grads.ptr, d_m.ptr, d_v.ptr, n, settings, 0); }},
            {"v2 8 parameters per thread, 16-byte accesses", {128, 256, 512, 1024},
             [&](int bs) { adamw_v2(d_params.ptr, master, d_grads.ptr, d_m.ptr, d_v.ptr, n, settings, bs); }},
            {"v3 v2 for all tensors in one launch", {256},
             [&](int bs) { adamw_v3(d_params.ptr, master, d_grads.ptr, d_m.ptr, d_v.ptr, n, settings, bs); }},
            {"v4 llmc: v3, 4 per thread, contiguous warps", {0},
             [&](int) { adamw_v4(d_params.ptr, master, d_grads.ptr, d_m.ptr, d_v.ptr, n, settings); }},
        };
        dev::run_versions(&report, versions, prepare, [&] {
            dev::CheckResult result;
            dev::check_tensor(&result, "m", dev::download(d_m), ref_m, TOL_FP32);
            dev::check_tensor(&result, "v", dev::download(d_v), ref_v, TOL_FP32);
            if (use_master) dev::check_tensor(&result, "master", dev::download(d_master), ref_params, TOL_FP32);
            dev::check_tensor(&result, "params", dev::download(d_params), ref_params, dev::TOL_REDUCTION);
            return result;
        });
        status |= dev::finish(report);
    }
    return status;
}
