// Compressed data-parallel gradient reduction (-gc sign|powersgd), with error feedback (issue 49): -gc sign
// here, PowerSGD in powersgd.h, and GradCompression, the one face both trainers' code sees.
//
// Plain data parallelism all-reduces every gradient element in fp32: 16 N (P-1)/P bytes a step per
// process (ring counts, sent plus received; llmc/parallel/comm.h). -gc sign sends one bit an element
// instead: the sign of how far the gradient has moved from what the other processes already hold for it,
// with one scale a block. This is EF21's error feedback (Richtarik, Sokolov, Fatkhullin, "EF21: A New,
// Simpler, Theoretically Better, and Practically Faster Error Feedback", 2021) with the scaled sign as its
// compressor. For each block of SIGN_BLOCK = 64 elements of each tensor of the optimizer's (each layer's
// own, as the matrix optimizers see them: llmc/optimizer.h; blocks counted from the tensor's start), on
// each process p, with g_p its gradient (already the global batch's share: the sum over processes is the
// step's gradient):
//
//   d   = g_p - h_p            how far the gradient is from h_p, what the others hold for it
//   s_p = |d|_1 / 64           the block's scale: the mean magnitude
//   q_p = s_p sign(d)          (sign(0) = +1: one bit an element)
//   h_p = h_p + q_p            every process's bits and scales all-gathered, then each adds
//   H   = H + sum_p q_p        the sum in rank order (H, the same on every process, is sum_p h_p)
//   g   = H                    the step's gradient
//
// h_p = g_p - (d - q_p): H is the true gradient less this step's residuals d - q_p, nothing older. h_p
// and H start at 0 and are the run's state (checkpointed: a state section).
//
// Why EF21 and not EF-signSGD (Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
// Compression Schemes", 2019), this flag's first form: c = g_p + e_p, q_p = s_p sign(c), e_p = c - q_p,
// g = sum_p q_p. Both send the same bits, but EF-signSGD hands the optimizer q itself, every element of a
// block at the block's scale. AdamW divides each element by its own running magnitude, so an element
// whose gradient is small in its block (its sign flipping from step to step as the residual returns it)
// moves by a fraction of its true step. Measured (doc/data_parallel.md: 2 processes, 30 steps of a
// 3.3 M-parameter GPT-2 whose wte is 97% of it): val loss 5.4% above plain data parallelism's, 0.5% with
// wte alone reduced exactly; with EF21 0.7%. H follows the gradient element by element instead. (Over
// 400 steps of the main job's 30 M-parameter model the two end even: +3.8% and +3.7%.) The cost: h_p and
// H are 2N floats a process where EF-signSGD kept N.
//
// A block with a non-finite scale on any process (a non-finite gradient: a skipped step) adds nothing to
// h_p or H and gives a non-finite gradient, so the step is seen as skipped on every process alike. One
// all-gather of every process's bits and scales (1.5 bits an element) moves 2 (P-1) 1.5 N / 8 bytes a
// process: 3P/128 of the fp32 all-reduce's 16 N (P-1)/P (4.7% with 2 processes, 11.7% with 5, over an eighth from 6; the
// gather grows with P).
//
// The scheme runs with -z 0 (ZeRO's shards would need each process's h_p of every shard; refused) and
// data parallelism alone; every process computes the same sum in the same order, so the replicas stay
// identical.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../host_device.h"
#include "../io/state_file.h"
#include "../optimizer.h"
#include "comm.h"
#include "powersgd.h"

// Elements sharing a scale, counted from each tensor's start: one word of bits. A scale per tensor (the
// paper's) lets a tensor's large elements set the step of its small ones, which under AdamW's per-element
// normalization slows them (measured, 30 steps of a 3.3 M-parameter model on 2 processes: val loss 11%
// above plain data parallelism's, against 5% with a scale per 64); it costs half a bit an element more.
constexpr size_t SIGN_BLOCK = 64;
static_assert(SIGN_BLOCK == 64, "a block is a word of bits: block w's scale is scale w (sign_decode_element)");

// One process's side of -gc sign over a flat gradient vector that the tensors tile.
struct SignCompression {
    std::vector<OptimizerTensor> tensors;
    std::vector<size_t> first_word;  // each tensor's first word of bits; then the number of bit words
    std::vector<size_t> first_scale; // each tensor's first scale; then the number of scales
    size_t block_words = 0;          // a process's part of the gather: every tensor's bits, then the scales (2 a word)
    std::vector<float> estimates;    // (2N): h_p, this process's gradient as the others hold it, then H = sum_p h_p
    std::vector<uint64_t> gathered;  // (P * block_words): every process's block after the all-gather
};

inline SignCompression sign_compression_init(const std::vector<OptimizerTensor>& tensors, size_t n, int processes) {
    SignCompression sc;
    sc.tensors = tensors;
    size_t words = 0, scales = 0;
    for (const OptimizerTensor& t : tensors) {
        sc.first_word.push_back(words);
        sc.first_scale.push_back(scales);
        words += (t.size() + 63) / 64;
        scales += (t.size() + SIGN_BLOCK - 1) / SIGN_BLOCK;
    }
    sc.first_word.push_back(words);
    sc.first_scale.push_back(scales);
    sc.block_words = words + (scales + 1) / 2;
    sc.estimates.assign(2 * n, 0.0f);
    sc.gathered.assign((size_t)processes * sc.block_words, 0);
    return sc;
}

// The bytes of a process's -gc state (the memory plan): h_p and H, and every process's gathered block.
inline size_t sign_compression_state_bytes(const std::vector<OptimizerTensor>& tensors, size_t n, int processes) {
    SignCompression shape = sign_compression_init(tensors, 0, 0);
    return 2 * n * sizeof(float) + (size_t)processes * shape.block_words * sizeof(uint64_t);
}

// The bytes one step moves per process (comm.h's count of the all-gather).
inline double sign_compression_bytes(const SignCompression& sc, int processes) {
    return 2.0 * (processes - 1) * (double)sc.block_words * sizeof(uint64_t);
}

HOST_DEVICE inline bool gc_finite(float x) {
#ifdef __CUDA_ARCH__
    return isfinite(x);
#else
    return std::isfinite(x);
#endif
}

// One block of n <= 64 elements (a word of bits) on this process: d = g / S - h, the block's scale and
// its bits; h is not changed yet (sign_decode_element adds q once every process's scale is known). S is
// the loss scale the gradients carry (1 but in the FP16 build): h and H hold the gradient itself, so a
// change of S leaves them right. The sum in double in index order: the same bits on every machine, host
// or GPU (T: the gradient's type, fp32 or the CUDA build's floatX).
template <typename T>
HOST_DEVICE inline void sign_encode_block(const T* g, const float* h, size_t n, float inv_s, uint64_t* word, float* scale) {
    double l1 = 0.0;
    for (size_t i = 0; i < n; i++) l1 += fabs((double)((float)g[i] * inv_s - h[i]));
    *scale = (float)(l1 / (double)n);
    uint64_t bits = 0;
    for (size_t i = 0; i < n; i++) {
        if ((float)g[i] * inv_s - h[i] < 0.0f) bits |= (uint64_t)1 << i;
    }
    *word = bits;
}

// Element j of block `block` (= its word: SIGN_BLOCK is 64) from every process's word and scale in
// `gathered` (P parts of W words: `words` words of bits, then the scales, two a word): sum_p q_p in rank
// order from 0, added to this process's (`rank`) h and to H; returns the new H. A non-finite sum (some
// process's scale is not finite) changes neither and is returned itself.
HOST_DEVICE inline float sign_decode_element(const uint64_t* gathered, size_t W, size_t words, size_t block, int P, int rank,
                                             int j, float* h, float* H) {
    float sum = 0.0f, mine = 0.0f;
    for (int p = 0; p < P; p++) {
        const uint64_t* part = gathered + (size_t)p * W;
        float scale = ((const float*)(part + words))[block];
        float q = (part[block] >> j) & 1 ? -scale : scale;
        sum += q;
        if (p == rank) mine = q;
    }
    if (!gc_finite(sum)) return sum;
    *h += mine;
    return *H += sum;
}

// One tensor's compression on this process (its blocks, sign_encode_block), into `bits` and `scales`.
inline void sign_encode(const float* g, const float* h, size_t n, float inv_s, uint64_t* bits, float* scales) {
    for (size_t b = 0; b * SIGN_BLOCK < n; b++) {
        size_t begin = b * SIGN_BLOCK;
        sign_encode_block(g + begin, h + begin, std::min(n - begin, SIGN_BLOCK), inv_s, bits + b, scales + b);
    }
}

// The reduced gradient of the step in grads (N, replaced): every process's bits and scales gathered, h_p
// and H advanced by them, g = H S (S: the loss scale the gradients carry). A collective of the
// data-parallel group.
inline void sign_compressed_reduce(const ProcessGroup& dp, SignCompression* sc, float* grads, float loss_scale = 1.0f) {
    const size_t W = sc->block_words, T = sc->tensors.size(), N = sc->estimates.size() / 2;
    uint64_t* mine = sc->gathered.data() + (size_t)dp.rank * W;
    mine[W - 1] = 0;  // an odd count of scales leaves half a word
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < T; k++) {
        const OptimizerTensor& t = sc->tensors[k];
        float* scales = (float*)(mine + sc->first_word[T]) + sc->first_scale[k];
        sign_encode(grads + t.offset, sc->estimates.data() + t.offset, t.size(), 1.0f / loss_scale, mine + sc->first_word[k],
                    scales);
    }
    all_gather(dp, sc->gathered.data(), W, COMM_UINT64);
    comm_join(dp);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < T; k++) {
        const OptimizerTensor& t = sc->tensors[k];
        for (size_t i = 0; i < t.size(); i++) {
            size_t x = t.offset + i;
            grads[x] = loss_scale * sign_decode_element(sc->gathered.data(), W, sc->first_word[T], sc->first_word[k] + i / 64,
                                                        dp.size, dp.rank, (int)(i % 64), &sc->estimates[x], &sc->estimates[N + x]);
        }
    }
}

// -gc's scheme on this process: none, sign or powersgd, with its state.
struct GradCompression {
    std::string kind = "none";
    SignCompression sign;
    PowerSgd power;
    bool on() const { return kind != "none"; }
    // the error feedback's state of this process's own, and its checkpoint section: -gc sign's h_p and H,
    // -gc powersgd's residuals
    const std::vector<float>& feedback() const { return kind == "sign" ? sign.estimates : power.residual; }
    std::vector<float>& feedback() { return kind == "sign" ? sign.estimates : power.residual; }
    int32_t feedback_kind() const { return kind == "sign" ? STATE_SECTION_SIGN_ESTIMATES : STATE_SECTION_ERROR_FEEDBACK; }
    size_t state_bytes() const {
        return (sign.estimates.size() + power.residual.size() + power.q.size() + power.q_buffer.size() +
                power.p_buffer.size()) * sizeof(float) + sign.gathered.size() * sizeof(uint64_t);
    }
};

// The bytes of a process's -gc state (the memory plan).
inline size_t grad_compression_state_bytes(const std::string& flag, int rank, const std::vector<OptimizerTensor>& tensors,
                                           size_t n, int processes) {
    if (processes == 1 || flag == "none") return 0;
    return flag == "sign" ? sign_compression_state_bytes(tensors, n, processes) : powersgd_state_bytes(tensors, n, rank);
}

// The bytes one step moves per process (the start-up's prediction: comm_bytes must agree).
inline double grad_compression_step_bytes(const std::string& flag, int rank, const std::vector<OptimizerTensor>& tensors,
                                          int processes) {
    if (flag == "sign") return sign_compression_bytes(sign_compression_init(tensors, 0, 0), processes);
    return powersgd_bytes(powersgd_init(tensors, 0, rank), processes);
}

// -gc at start-up: true when the run compresses (gc set up); with one data-parallel process there is
// nothing to send, and the run reduces nothing, as without -gc (a note says so).
inline bool grad_compression_start(const std::string& flag, int rank, const ProcessGroup& dp,
                                   const std::vector<OptimizerTensor>& tensors, size_t n, GradCompression* gc) {
    if (flag == "none") return false;  // else "sign" or "powersgd": parse_args took no other
    if (dp.size == 1) {
        printf("gradient compression: one data-parallel process, nothing to send: -gc %s runs as -gc none\n", flag.c_str());
        return false;
    }
    gc->kind = flag;
    double all_reduce = 16.0 * (double)(n - n / dp.size), bytes;
    if (flag == "sign") {
        gc->sign = sign_compression_init(tensors, n, dp.size);
        bytes = sign_compression_bytes(gc->sign, dp.size);
        printf("gradient compression: -gc sign, 1 bit an element and a scale a block of %zu (%zu tensors), EF21's error "
               "feedback; ", SIGN_BLOCK, tensors.size());
    } else {
        gc->power = powersgd_init(tensors, n, rank);
        bytes = powersgd_bytes(gc->power, dp.size);
        printf("gradient compression: -gc powersgd -gr %d, %zu matrices as rank-%d factors, %zu tensors summed exactly, "
               "error feedback; ", rank, gc->power.matrices.size(), rank, gc->power.exact.size());
    }
    printf("%.0f bytes a step per process against the fp32 all-reduce's %.0f (%.1f%%)\n", bytes, all_reduce,
           100.0 * bytes / all_reduce);
    return true;
}

// The step's gradients (N, times the loss scale S) reduced over the data-parallel group as -gc says. A
// collective.
inline void grad_compression_reduce(const ProcessGroup& dp, GradCompression* gc, float* grads, float loss_scale = 1.0f) {
    if (gc->kind == "sign") sign_compressed_reduce(dp, &gc->sign, grads, loss_scale);
    else powersgd_reduce(dp, &gc->power, grads, loss_scale);
}

// The checkpoint's sections of this process's own (llmc/io/state_file.h): -gc sign's h_p and H, or
// PowerSGD's residuals (what the sent gradients still owe) and its Q. Optional: a reader that drops them
// loses a few steps' worth of gradient or the warm start, nothing else.
inline std::vector<int32_t> grad_compression_own_kinds(const GradCompression& gc) {
    if (!gc.on()) return {};
    if (gc.kind == "sign") return {STATE_SECTION_SIGN_ESTIMATES};
    return {STATE_SECTION_ERROR_FEEDBACK, STATE_SECTION_POWERSGD};
}

inline std::vector<StateSection> grad_compression_sections(const GradCompression& gc) {
    std::vector<StateSection> out;
    auto section = [&](int32_t kind, const std::vector<float>& v) {
        StateSection s;
        s.kind = kind;
        s.bytes.resize(v.size() * sizeof(float));
        memcpy(s.bytes.data(), v.data(), s.bytes.size());
        out.push_back(std::move(s));
    };
    if (gc.on()) section(gc.feedback_kind(), gc.feedback());
    if (gc.kind == "powersgd") section(STATE_SECTION_POWERSGD, gc.power.q);
    return out;
}

// The error feedback's state (and Q) from this process's sections; what a checkpoint lacks starts afresh
// (a note says so): h_p, H or the residuals at 0, Q at its first value (also when written with another -gr).
inline void grad_compression_restore(GradCompression* gc, const std::vector<StateSection>& sections) {
    bool feedback = false, factors = gc->kind != "powersgd";
    const char* what = state_section_name(gc->feedback_kind());
    for (const StateSection& s : sections) {
        if (s.kind == gc->feedback_kind()) {
            std::vector<float>& e = gc->feedback();
            if (s.bytes.size() != e.size() * sizeof(float)) {
                fatal("the checkpoint's %s hold %zu bytes; this model's are %zu", what, s.bytes.size(), e.size() * sizeof(float));
            }
            memcpy(e.data(), s.bytes.data(), s.bytes.size());
            require_finite(e.data(), e.size(), "reading", std::string("the checkpoint's ") + what);
            feedback = true;
        } else if (s.kind == STATE_SECTION_POWERSGD && gc->kind == "powersgd") {
            std::vector<float>& q = gc->power.q;
            if (s.bytes.size() != q.size() * sizeof(float)) {
                printf("resume: the checkpoint's PowerSGD factors are of another -gr (%zu bytes, this run's %zu): Q starts "
                       "afresh\n", s.bytes.size(), q.size() * sizeof(float));
                continue;
            }
            memcpy(q.data(), s.bytes.data(), s.bytes.size());
            require_finite(q.data(), q.size(), "reading", "the checkpoint's PowerSGD factors");
            factors = true;
        }
    }
    if (!feedback) printf("resume: the checkpoint has no %s (written without -gc %s): they start at 0\n", what, gc->kind.c_str());
    if (!factors) printf("resume: the checkpoint has no PowerSGD factors (written without -gc powersgd): Q starts afresh\n");
}
