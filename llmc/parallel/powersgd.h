// PowerSGD (-gc powersgd -gr R): the data-parallel gradient of each matrix sent as two thin factors, with
// error feedback (issue 49; Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
// Compression for Distributed Optimization", 2019; PyTorch DDP's PowerSGD communication hook).
//
// For each matrix of the optimizer's (each layer's own, as llmc/optimizer.h lists them: wte and wpe
// included) whose factors are smaller than it, (rows + cols) R < rows cols, on each process p with g_p its
// share of the step's gradient (the sum over processes is the gradient) and e_p its residual:
//
//   M_p = g_p + e_p                       (rows x cols)
//   P   = sum_p M_p Q                     (rows x R)  one all-reduce (every matrix's, and the vectors' below)
//   P^  = P's columns made orthonormal     (Gram-Schmidt, in order, in double; the same on every process)
//   Q   = sum_p M_p^T P^                  (cols x R)  a second all-reduce
//   g   = P^ Q^T                          the step's gradient: sum_p M_p projected on P^'s columns
//   e_p = M_p - g / P                     the residual, kept (a checkpoint section, each process's own)
//
// Q stays for the next step (the warm start: one power iteration a step refines the subspace as the
// gradients move; checkpointed), so that the columns follow the gradient's leading directions over steps.
// Its first value is a fixed pseudo-random matrix (xorshift64*, llmc/rand.h, seeded by the matrix's index),
// the same on every process. The vectors (biases, layernorms) and matrices too small to gain are summed
// exactly in the first all-reduce; their residual stays 0. Over steps the processes' compressed sums add
// up to the true ones less the residuals' sum: sum_t g_t = sum_t sum_p g_p,t + sum_p (e_p,0 - e_p,T).
//
// Bytes a step per process: two ring all-reduces, of sum (rows R) + the exact elements and of sum (cols R)
// floats: for wte (50304 x 768) at R = 4, 0.5% of its all-reduce. Runs with -z 0 and data parallelism
// alone, like -gc sign (args.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "../optimizer.h"
#include "../rand.h"
#include "comm.h"

struct PowerSgd {
    int rank = 4;                          // R
    std::vector<OptimizerTensor> tensors;
    std::vector<size_t> matrices, exact;   // indices into tensors: compressed, summed exactly
    std::vector<size_t> p_first, q_first;  // each compressed matrix's place in p (then exact elements) and q
    size_t p_length = 0, q_length = 0;     // the two all-reduces' lengths
    std::vector<float> residual;           // e_p (N); 0 outside the compressed matrices
    std::vector<float> q;                  // the factors Q (q_length): the warm start
    std::vector<float> p_buffer, q_buffer; // the all-reduces' buffers
};

inline bool powersgd_compresses(const OptimizerTensor& t, int rank) {
    return t.is_matrix() && (t.rows + t.cols) * (size_t)rank < t.rows * t.cols;
}

// Matrix k's first Q: entries uniform in [-1, 1) from xorshift64* seeded with (k + 1) times the golden
// ratio's 64 bits, row by row (cols x R).
inline void powersgd_first_q(size_t k, float* q, size_t count) {
    uint64_t state = (uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < count; i++) q[i] = 2.0f * xorshift_uniform(&state) - 1.0f;
}

inline PowerSgd powersgd_init(const std::vector<OptimizerTensor>& tensors, size_t n, int rank) {
    PowerSgd ps;
    ps.rank = rank;
    ps.tensors = tensors;
    for (size_t k = 0; k < tensors.size(); k++) {
        const OptimizerTensor& t = tensors[k];
        if (!powersgd_compresses(t, rank)) {
            ps.exact.push_back(k);
            continue;
        }
        ps.matrices.push_back(k);
        ps.p_first.push_back(ps.p_length);
        ps.q_first.push_back(ps.q_length);
        ps.p_length += t.rows * rank;
        ps.q_length += t.cols * rank;
    }
    for (size_t k : ps.exact) ps.p_length += tensors[k].size();
    ps.residual.assign(n, 0.0f);
    ps.q.assign(ps.q_length, 0.0f);
    for (size_t i = 0; i < ps.matrices.size(); i++) {
        powersgd_first_q(ps.matrices[i], ps.q.data() + ps.q_first[i], tensors[ps.matrices[i]].cols * rank);
    }
    ps.p_buffer.assign(ps.p_length, 0.0f);
    ps.q_buffer.assign(ps.q_length, 0.0f);
    return ps;
}

// The bytes one step moves per process: the two all-reduces (comm.h's count).
inline double powersgd_bytes(const PowerSgd& ps, int processes) {
    auto all_reduce = [&](size_t n) { return 2.0 * 2.0 * (double)(n - n / processes) * sizeof(float); };
    return all_reduce(ps.p_length) + all_reduce(ps.q_length);
}

// The bytes of a process's state (the memory plan): residuals, Q and the two buffers.
inline size_t powersgd_state_bytes(const std::vector<OptimizerTensor>& tensors, size_t n, int rank) {
    PowerSgd shape = powersgd_init(tensors, 0, rank);
    return (n + 2 * shape.q_length + shape.p_length) * sizeof(float);
}

// out (rows x R) = a (rows x cols) b (cols x R), sums in double.
inline void powersgd_times(const float* a, const float* b, float* out, size_t rows, size_t cols, int R) {
    for (size_t i = 0; i < rows; i++) {
        double acc[64] = {};
        for (size_t c = 0; c < cols; c++) {
            double x = a[i * cols + c];
            for (int j = 0; j < R; j++) acc[j] += x * b[c * R + j];
        }
        for (int j = 0; j < R; j++) out[i * R + j] = (float)acc[j];
    }
}

// out (cols x R) = a^T (cols x rows) p (rows x R), sums in double.
inline void powersgd_times_transposed(const float* a, const float* p, float* out, size_t rows, size_t cols, int R) {
    std::vector<double> acc(cols * R, 0.0);
    for (size_t i = 0; i < rows; i++) {
        for (size_t c = 0; c < cols; c++) {
            double x = a[i * cols + c];
            for (int j = 0; j < R; j++) acc[c * R + j] += x * p[i * R + j];
        }
    }
    for (size_t i = 0; i < cols * R; i++) out[i] = (float)acc[i];
}

// p's R columns (rows x R) made orthonormal in place, in order (classical Gram-Schmidt twice over, in
// double: each column less its projections on the ones before, then scaled to length 1; a column with
// nothing left of its own but rounding, under 1e-10 of its length, becomes 0).
inline void powersgd_orthonormalize(float* p, size_t rows, int R) {
    std::vector<double> col((size_t)rows * R);
    for (size_t i = 0; i < rows * R; i++) col[i] = p[i];
    auto at = [&](size_t i, int j) -> double& { return col[i * R + j]; };
    for (int j = 0; j < R; j++) {
        double before = 0.0;
        for (size_t i = 0; i < rows; i++) before += at(i, j) * at(i, j);
        for (int pass = 0; pass < 2; pass++) {
            for (int k = 0; k < j; k++) {
                double dot = 0.0;
                for (size_t i = 0; i < rows; i++) dot += at(i, k) * at(i, j);
                for (size_t i = 0; i < rows; i++) at(i, j) -= dot * at(i, k);
            }
        }
        double norm = 0.0;
        for (size_t i = 0; i < rows; i++) norm += at(i, j) * at(i, j);
        // what is left of a column in the span of the ones before is rounding: 1e-10 of its length, in double
        bool left = norm > 1e-20 * before && norm > 0.0;
        norm = std::sqrt(norm);
        for (size_t i = 0; i < rows; i++) at(i, j) = left ? at(i, j) / norm : 0.0;
    }
    for (size_t i = 0; i < rows * R; i++) p[i] = (float)col[i];
}

// The reduced gradient of the step in grads (N, replaced; times the loss scale S the gradients carry, 1
// but in the FP16 build: M and e hold the gradient itself). A collective of the data-parallel group.
inline void powersgd_reduce(const ProcessGroup& dp, PowerSgd* ps, float* grads, float loss_scale = 1.0f) {
    const int R = ps->rank;
    const size_t matrices = ps->matrices.size();
    float* e = ps->residual.data();
    const float inv_s = 1.0f / loss_scale;  // M and e in the gradient's own units, whatever S the step has
    // M_p = g_p / S + e_p (in the residual's place), P = M_p Q; the exact tensors after the P's
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < matrices; i++) {
        const OptimizerTensor& t = ps->tensors[ps->matrices[i]];
        float* m = e + t.offset;
        for (size_t j = 0; j < t.size(); j++) m[j] += grads[t.offset + j] * inv_s;
        powersgd_times(m, ps->q.data() + ps->q_first[i], ps->p_buffer.data() + ps->p_first[i], t.rows, t.cols, R);
    }
    size_t at = matrices ? ps->p_first.back() + ps->tensors[ps->matrices.back()].rows * R : 0;
    for (size_t k : ps->exact) {
        const OptimizerTensor& t = ps->tensors[k];
        std::copy(grads + t.offset, grads + t.offset + t.size(), ps->p_buffer.data() + at);
        at += t.size();
    }
    all_reduce(dp, ps->p_buffer.data(), ps->p_length, COMM_FLOAT32, COMM_SUM);
    comm_join(dp);
    at = matrices ? ps->p_first.back() + ps->tensors[ps->matrices.back()].rows * R : 0;
    for (size_t k : ps->exact) {
        const OptimizerTensor& t = ps->tensors[k];
        std::copy(ps->p_buffer.data() + at, ps->p_buffer.data() + at + t.size(), grads + t.offset);
        at += t.size();
    }
    // P^, then Q = M_p^T P^ summed
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < matrices; i++) {
        const OptimizerTensor& t = ps->tensors[ps->matrices[i]];
        float* p = ps->p_buffer.data() + ps->p_first[i];
        powersgd_orthonormalize(p, t.rows, R);
        powersgd_times_transposed(e + t.offset, p, ps->q_buffer.data() + ps->q_first[i], t.rows, t.cols, R);
    }
    all_reduce(dp, ps->q_buffer.data(), ps->q_length, COMM_FLOAT32, COMM_SUM);
    comm_join(dp);
    // g = P^ Q^T, e_p = M_p - g / P; Q kept
    const float inv = 1.0f / (float)dp.size;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < matrices; i++) {
        const OptimizerTensor& t = ps->tensors[ps->matrices[i]];
        const float* p = ps->p_buffer.data() + ps->p_first[i];
        const float* q = ps->q_buffer.data() + ps->q_first[i];
        for (size_t r = 0; r < t.rows; r++) {
            for (size_t c = 0; c < t.cols; c++) {
                double sum = 0.0;
                for (int j = 0; j < R; j++) sum += (double)p[r * R + j] * q[c * R + j];
                float g = (float)sum;
                size_t x = t.offset + r * t.cols + c;
                grads[x] = g * loss_scale;
                e[x] -= g * inv;
                if (!std::isfinite(e[x])) e[x] = 0.0f;  // a non-finite gradient (a skipped step) leaves nothing behind
            }
        }
        float* q_new = ps->q_buffer.data() + ps->q_first[i];
        bool finite = true;
        for (size_t j = 0; j < t.cols * R; j++) finite = finite && std::isfinite(q_new[j]);
        if (!finite) powersgd_first_q(ps->matrices[i], q_new, t.cols * R);  // the same on every process
    }
    ps->q.swap(ps->q_buffer);
}
