// Context parallelism (-cp N, -cpm ring|ulysses) over the context-parallel group of llmc/parallel/layout.h:
// each sequence's T positions are split over N processes for the whole model, so every activation of a
// process, the attention's included, shrinks about N-fold, and a sequence longer than one process's
// memory can train.
//
// Everything in a block but attention acts on each position alone (the embedding, the layernorms, the
// matmuls, GELU, the residuals, the loss), so a process runs it on its own B·T/N rows unchanged. The
// embedding adds wpe's rows of the *global* positions the process holds (context_parallel_enter gathers
// them into a (T/N, C) table, and the backward adds that table's gradient back into dwpe's rows). The
// parameters' gradients are each process's partial sums over the batch's tokens, summed over the
// data-parallel group, which holds the N processes as neighbours (layout.h). Attention needs every key
// and value at or before each query, and the two schemes bring them:
//
// Ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers"). The processes form a ring. Each
// holds its positions' K and V as a chunk; in N steps every chunk visits every process: at step s a
// process attends its queries to the chunk of process (rank - s) mod N, while it already passes that
// chunk on to rank + 1 (a send that returns at once; the receive of the next chunk comes after the
// step's compute, so the transfer overlaps it). Each step's partial result, softmax-normalized over
// its chunk alone, is merged into the running one by their log-sum-exps:
//     lse = log(e^lse_a + e^lse_b),   out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse)
// which is the softmax over both chunks' keys (the flash-attention identity). The backward passes the
// ring again: each chunk travels with its dK and dV, which every process adds its queries' part to,
// and after N steps and one more hop they are home. With the causal mask a contiguous split idles the
// early ranks (their queries see few keys), so the ring's split is load-balanced: the sequence is cut
// into 2N chunks and rank r holds chunk r and chunk 2N-1-r (front and mirrored back), the same work
// for every rank. T must divide into 2N chunks.
//
// Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses"). An all-to-all turns the sequence split of q, k, v
// into a head split: afterwards a process holds all T positions of NH/N heads and runs the ordinary
// attention on them; a second all-to-all turns its output back into its rows. The backward does the
// same with q, k, v again (not kept: memory), dout and dqkv. N must divide the heads (of a tensor-
// parallel rank), and T must divide into N contiguous chunks.
//
// The CPU reference stores its attention weights (llmc/attention.h), and so does each scheme: the ring
// its queries' rows against all T keys, (B, NH, T/N, T); Ulysses its heads' (B, NH/N, T, T): the same
// size, 1/N of one process's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../attention.h"
#include "../expf.h"
#include "../gemm.h"
#include "../utils.h"
#include "comm.h"
#include "context_split.h"

// ----------------------------------------------------------------------------
// The ring

// Copies columns [from, from + width) of each of n rows (row stride `stride`) to `to` (row stride `to_stride`).
inline void copy_columns(float* to, size_t to_stride, const float* from, size_t stride, size_t n, size_t width) {
    for (size_t i = 0; i < n; i++) memcpy(to + i * to_stride, from + i * stride, width * sizeof(float));
}

// The first position of half kh of process r's positions (each half one of the 2N chunks of Tc).
inline int ring_half_start(int N, int r, int kh, int Tc) { return (kh ? 2 * N - 1 - r : r) * Tc; }

// Forward: out (B, Tl, C) and att (B, NH, Tl, T), the weights of this process's queries over all T key
// positions (zero where masked), from its qkv (B, Tl, 3C). C and NH are this tensor-parallel rank's.
inline void ring_attention_forward(ContextParallel* cp, float* out, float* att, const float* qkv, int B, int C, int NH) {
    const ProcessGroup& g = cp->group;
    const int N = g.size, Tl = cp->Tl, T = cp->T, hs = C / NH, me = g.rank;
    const size_t C3 = 3 * (size_t)C, W = 2 * (size_t)C, rows = (size_t)B * Tl;  // a chunk's row: k, v
    const int Tc = Tl / 2;  // a half-chunk: one of the 2N chunks
    const float scale = (float)(1.0 / std::sqrt((double)hs));
    float* lse = cp->buffer[2].data();  // (B, NH, Tl)
    std::fill(lse, lse + rows * NH, -INFINITY);
    memset(out, 0, rows * C * sizeof(float));
    float* chunk = cp->buffer[0].data();
    float* next = cp->buffer[1].data();
    copy_columns(chunk, W, qkv + C, C3, rows, W);  // this process's k and v
    for (int s = 0; s < N; s++) {
        const int src = (me - s + N) % N;  // whose positions the chunk holds
        if (s + 1 < N) comm_send(g, chunk, rows * W, COMM_FLOAT32, (me + 1) % N, 0);  // on while we compute
#pragma omp parallel
        {
            std::vector<float> S((size_t)Tl * Tl), O((size_t)Tl * hs);
#pragma omp for collapse(2)
            for (int b = 0; b < B; b++) {
                for (int h = 0; h < NH; h++) {
                    const float* q = qkv + (size_t)b * Tl * C3 + h * hs;  // (Tl, hs), row stride 3C
                    const float* k = chunk + (size_t)b * Tl * W + h * hs;  // (Tl, hs), row stride 2C
                    const float* v = k + C;
                    // S = Q Kᵀ / sqrt(hs), masked by the global positions; its softmax P over the chunk's keys.
                    // By half-chunks, the masked ones skipped (their entries are set below, unread)
                    for (int qh = 0; qh < 2; qh++) {
                        for (int kh = 0; kh < 2; kh++) {
                            int visible = ring_visibility(N, me, qh, src, kh);
                            if (visible == 0) continue;
                            gemm_accumulate(S.data() + (size_t)qh * Tc * Tl + kh * Tc, Tl, MatrixView<float>{q + qh * Tc * C3, C3, 1},
                                            MatrixView<float>{k + kh * Tc * W, 1, W}, Tc, Tc, hs, true,
                                            visible == 1 ? GemmTriangle::lower_c : GemmTriangle::none);
                        }
                    }
                    std::vector<float> chunk_lse(Tl, -INFINITY);
                    for (int i = 0; i < Tl; i++) {
                        float* row = S.data() + (size_t)i * Tl;
                        float* att_row = att + (((size_t)b * NH + h) * Tl + i) * T;
                        for (int kh = 0; kh < 2; kh++) {  // scaled where visible (the diagonal's up to i), -inf elsewhere
                            int visible = ring_visibility(N, me, i / Tc, src, kh);
                            int seen = visible == 2 ? Tc : visible == 1 ? i % Tc + 1 : 0;
                            float* r = row + kh * Tc;
                            for (int j = 0; j < seen; j++) r[j] *= scale;
                            for (int j = seen; j < Tc; j++) r[j] = -INFINITY;
                            memcpy(att_row + ring_half_start(N, src, kh, Tc), r, Tc * sizeof(float));  // normalized below
                        }
                        float m = -INFINITY;
                        for (int j = 0; j < Tl; j++) m = std::max(m, row[j]);
                        if (m == -INFINITY) continue;  // no key of this chunk is visible to query i
                        double sum = exp_and_sum(row, row, m, Tl);  // masked: exp(-inf) = 0
                        float inv = (float)(1.0 / sum);
                        for (int j = 0; j < Tl; j++) row[j] *= inv;
                        chunk_lse[i] = m + (float)std::log(sum);
                    }
                    // the chunk's output P V (a half with no visible key is not merged), merged into the running
                    // one by log-sum-exp
                    for (int qh = 0; qh < 2; qh++) {
                        bool first = true;
                        for (int kh = 0; kh < 2; kh++) {
                            if (ring_visibility(N, me, qh, src, kh) == 0) continue;
                            gemm_accumulate(O.data() + (size_t)qh * Tc * hs, hs, MatrixView<float>{S.data() + (size_t)qh * Tc * Tl + kh * Tc, (size_t)Tl, 1},
                                            MatrixView<float>{v + kh * Tc * W, W, 1}, Tc, hs, Tc, first);
                            first = false;
                        }
                    }
                    float* lse_bh = lse + ((size_t)b * NH + h) * Tl;
                    for (int i = 0; i < Tl; i++) {
                        if (chunk_lse[i] == -INFINITY) continue;
                        float before = lse_bh[i], after = chunk_lse[i];
                        if (before != -INFINITY) after = std::max(before, after) + std::log1p(std::exp(-std::fabs(before - after)));
                        float keep = before == -INFINITY ? 0.0f : std::exp(before - after), add = std::exp(chunk_lse[i] - after);
                        float* o = out + ((size_t)b * Tl + i) * C + h * hs;
                        for (int d = 0; d < hs; d++) o[d] = o[d] * keep + O[(size_t)i * hs + d] * add;
                        lse_bh[i] = after;
                    }
                }
            }
        }
        if (s + 1 < N) {
            comm_recv(g, next, rows * W, COMM_FLOAT32, (me - 1 + N) % N, 0);
            comm_finish_sends(g);
            std::swap(chunk, next);
        }
    }
    // the stored weights: each score against its row's final log-sum-exp
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < Tl; i++) {
                int pi = cp->position(me, i);
                float* att_row = att + (((size_t)b * NH + h) * Tl + i) * T;
                exp_and_sum(att_row, att_row, lse[((size_t)b * NH + h) * Tl + i], pi + 1);
                for (int j = pi + 1; j < T; j++) att_row[j] = 0.0f;
            }
        }
    }
}

// Backward: accumulates (+=) into dqkv (B, Tl, 3C) from dout (B, Tl, C), with the forward's out, att, qkv.
//   D_i = dout_i · out_i,  dS_ij = P_ij (dout_i · v_j - D_i) / sqrt(hs)
//   dq_i += Σ_j dS_ij k_j,  dk_j += Σ_i dS_ij q_i,  dv_j += Σ_i P_ij dout_i
// the key side summed by every process into the chunk's travelling dk, dv.
inline void ring_attention_backward(ContextParallel* cp, float* dqkv, const float* dout, const float* out,
                                    const float* att, const float* qkv, int B, int C, int NH) {
    const ProcessGroup& g = cp->group;
    const int N = g.size, Tl = cp->Tl, T = cp->T, hs = C / NH, me = g.rank;
    // a chunk: its k, v (rows, 2C), then the dk, dv it collects (rows, 2C)
    const size_t C3 = 3 * (size_t)C, W = 2 * (size_t)C, rows = (size_t)B * Tl, half = rows * W;
    const int Tc = Tl / 2;
    const float scale = (float)(1.0 / std::sqrt((double)hs));
    float* chunk = cp->buffer[0].data();
    float* next = cp->buffer[1].data();
    copy_columns(chunk, W, qkv + C, C3, rows, W);
    memset(chunk + half, 0, half * sizeof(float));
    for (int s = 0; s < N; s++) {
        const int src = (me - s + N) % N;
        // k, v go on at once (tag 0); dk, dv once this process has added its part (tag 1)
        if (s + 1 < N) comm_send(g, chunk, half, COMM_FLOAT32, (me + 1) % N, 0);
#pragma omp parallel
        {
            std::vector<float> P((size_t)Tl * Tl), dS((size_t)Tl * Tl), D(Tl);
#pragma omp for collapse(2)
            for (int b = 0; b < B; b++) {
                for (int h = 0; h < NH; h++) {
                    const float* q = qkv + (size_t)b * Tl * C3 + h * hs;
                    const float* k = chunk + (size_t)b * Tl * W + h * hs;
                    const float* v = k + C;
                    float* dk = chunk + half + (size_t)b * Tl * W + h * hs;
                    float* dv = dk + C;
                    float* dq = dqkv + (size_t)b * Tl * C3 + h * hs;
                    const float* dout_bh = dout + (size_t)b * Tl * C + h * hs;  // (Tl, hs), row stride C
                    for (int i = 0; i < Tl; i++) {
                        const float* att_row = att + (((size_t)b * NH + h) * Tl + i) * T;
                        for (int kh = 0; kh < 2; kh++) {
                            memcpy(&P[(size_t)i * Tl + kh * Tc], att_row + ring_half_start(N, src, kh, Tc), Tc * sizeof(float));
                        }
                        const float* o = out + ((size_t)b * Tl + i) * C + h * hs;
                        double d = 0.0;
                        for (int c = 0; c < hs; c++) d += (double)o[c] * dout_bh[(size_t)i * C + c];
                        D[i] = (float)d;
                    }
                    // dP = dout Vᵀ, then dS; then the three products, each by the visible half-chunk pairs
                    // (elsewhere P = 0 and dS is set to 0 whatever dP's unwritten entries hold)
                    for (int qh = 0; qh < 2; qh++) {
                        for (int kh = 0; kh < 2; kh++) {
                            int visible = ring_visibility(N, me, qh, src, kh);
                            if (visible == 0) continue;
                            gemm_accumulate(dS.data() + (size_t)qh * Tc * Tl + kh * Tc, Tl,
                                            MatrixView<float>{dout_bh + qh * Tc * C, (size_t)C, 1}, MatrixView<float>{v + kh * Tc * W, 1, W},
                                            Tc, Tc, hs, true, visible == 1 ? GemmTriangle::lower_c : GemmTriangle::none);
                        }
                    }
                    for (size_t i = 0; i < (size_t)Tl; i++) {
                        for (size_t j = 0; j < (size_t)Tl; j++) {
                            float p = P[i * Tl + j];
                            dS[i * Tl + j] = p == 0.0f ? 0.0f : p * (dS[i * Tl + j] - D[i]) * scale;
                        }
                    }
                    for (int qh = 0; qh < 2; qh++) {
                        for (int kh = 0; kh < 2; kh++) {
                            if (ring_visibility(N, me, qh, src, kh) == 0) continue;
                            const float* ds = dS.data() + (size_t)qh * Tc * Tl + kh * Tc;  // (Tc, Tc), row stride Tl
                            const float* p = P.data() + (size_t)qh * Tc * Tl + kh * Tc;
                            gemm_accumulate(dq + qh * Tc * C3, C3, MatrixView<float>{ds, (size_t)Tl, 1},
                                            MatrixView<float>{k + kh * Tc * W, W, 1}, Tc, hs, Tc);
                            gemm_accumulate(dk + kh * Tc * W, W, MatrixView<float>{ds, 1, (size_t)Tl},
                                            MatrixView<float>{q + qh * Tc * C3, C3, 1}, Tc, hs, Tc);
                            gemm_accumulate(dv + kh * Tc * W, W, MatrixView<float>{p, 1, (size_t)Tl},
                                            MatrixView<float>{dout_bh + qh * Tc * C, (size_t)C, 1}, Tc, hs, Tc);
                        }
                    }
                }
            }
        }
        // the chunk's dk, dv to the next process (after the last step: home, to its owner)
        comm_send(g, chunk + half, half, COMM_FLOAT32, (me + 1) % N, 1);
        if (s + 1 < N) comm_recv(g, next, half, COMM_FLOAT32, (me - 1 + N) % N, 0);
        comm_recv(g, next + half, half, COMM_FLOAT32, (me - 1 + N) % N, 1);
        comm_finish_sends(g);
        std::swap(chunk, next);
    }
    // chunk is this process's own again, with every process's dk, dv
    for (size_t r = 0; r < rows; r++) {
        float* d = dqkv + r * C3 + C;
        const float* from = chunk + half + r * W;
        for (size_t c = 0; c < W; c++) d[c] += from[c];
    }
}

// ----------------------------------------------------------------------------
// Ulysses

// Rows to heads: x (B, Tl, k·C), k sections of C columns (q, k, v: 3; an output: 1), this process's rows
// -> x_heads (B, T, k·C/N), all positions of process r's NH/N heads for r = this process. Through
// `send` and `recv` (each B·Tl·k·C floats): the block for process j holds its columns of each section.
inline void ulysses_to_heads(ContextParallel* cp, float* x_heads, const float* x, int k, int B, int C, float* send, float* recv) {
    const ProcessGroup& g = cp->group;
    const int N = g.size, Tl = cp->Tl, T = cp->T, Cn = C / N;
    const size_t rows = (size_t)B * Tl, width = (size_t)k * Cn, block = rows * width;
    for (int j = 0; j < N; j++) {
        for (size_t r = 0; r < rows; r++) {
            for (int s = 0; s < k; s++) {
                memcpy(send + j * block + r * width + s * Cn, x + r * k * C + s * C + j * Cn, Cn * sizeof(float));
            }
        }
    }
    all_to_all(g, send, recv, block, COMM_FLOAT32);
    for (int src = 0; src < N; src++) {  // process src's rows, at their positions
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < Tl; t++) {
                memcpy(x_heads + ((size_t)b * T + cp->position(src, t)) * width, recv + src * block + ((size_t)b * Tl + t) * width,
                       width * sizeof(float));
            }
        }
    }
}

// Heads to rows, the inverse: x_heads (B, T, k·C/N) -> x (B, Tl, k·C), this process's rows of every
// process's heads; set (=), or with accumulate added (+=).
inline void ulysses_to_rows(ContextParallel* cp, float* x, const float* x_heads, int k, int B, int C, float* send, float* recv,
                            bool accumulate) {
    const ProcessGroup& g = cp->group;
    const int N = g.size, Tl = cp->Tl, T = cp->T, Cn = C / N;
    const size_t rows = (size_t)B * Tl, width = (size_t)k * Cn, block = rows * width;
    for (int j = 0; j < N; j++) {  // process j's rows
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < Tl; t++) {
                memcpy(send + j * block + ((size_t)b * Tl + t) * width, x_heads + ((size_t)b * T + cp->position(j, t)) * width,
                       width * sizeof(float));
            }
        }
    }
    all_to_all(g, send, recv, block, COMM_FLOAT32);
    for (int src = 0; src < N; src++) {  // process src's heads, this process's rows
        for (size_t r = 0; r < rows; r++) {
            for (int s = 0; s < k; s++) {
                float* to = x + r * k * C + s * C + src * Cn;
                const float* from = recv + src * block + r * width + s * Cn;
                for (int c = 0; c < Cn; c++) to[c] = accumulate ? to[c] + from[c] : from[c];
            }
        }
    }
}

// Forward: out (B, Tl, C) from qkv (B, Tl, 3C); att (B, NH/N, T, T) of this process's heads.
inline void ulysses_attention_forward(ContextParallel* cp, float* out, float* att, const float* qkv, int B, int C, int NH) {
    const int N = cp->group.size;
    float* u[4] = {cp->buffer[0].data(), cp->buffer[1].data(), cp->buffer[2].data(), cp->buffer[3].data()};
    ulysses_to_heads(cp, u[2], qkv, 3, B, C, u[0], u[1]);  // u2: q, k, v of NH/N heads, (B, T, 3C/N)
    memset(u[3], 0, (size_t)B * cp->T * (C / N) * sizeof(float));
    attention_forward(u[3], att, u[2], B, cp->T, C / N, NH / N);
    ulysses_to_rows(cp, out, u[3], 1, B, C, u[0], u[1], false);
}

// Backward: accumulates (+=) into dqkv (B, Tl, 3C) from dout (B, Tl, C), with the forward's att and qkv
// (q, k, v go through the all-to-all again rather than being kept).
inline void ulysses_attention_backward(ContextParallel* cp, float* dqkv, const float* dout, const float* att, const float* qkv,
                                       int B, int C, int NH) {
    const int N = cp->group.size;
    const size_t heads_floats = (size_t)B * cp->T * 3 * (C / N);
    float* u[4] = {cp->buffer[0].data(), cp->buffer[1].data(), cp->buffer[2].data(), cp->buffer[3].data()};
    ulysses_to_heads(cp, u[2], qkv, 3, B, C, u[0], u[1]);  // u2: q, k, v
    ulysses_to_heads(cp, u[3], dout, 1, B, C, u[0], u[1]);  // u3: dout of the heads, (B, T, C/N)
    memset(u[0], 0, heads_floats * sizeof(float));
    attention_backward(u[0], u[3], u[2], att, B, cp->T, C / N, NH / N);  // u0: dq, dk, dv
    ulysses_to_rows(cp, dqkv, u[0], 3, B, C, u[1], u[2], true);
}

// ----------------------------------------------------------------------------
// What a block calls: plain attention (llmc/attention.h) on one process, the scheme's with -cp. T is
// this process's positions per row (T/N with -cp), C and NH this tensor-parallel rank's.

inline void cp_attention_forward(ContextParallel* cp, float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    if (cp == nullptr || !cp->on()) return attention_forward(out, att, qkv, B, T, C, NH);
    if (cp->mode == ContextMode::ring) return ring_attention_forward(cp, out, att, qkv, B, C, NH);
    ulysses_attention_forward(cp, out, att, qkv, B, C, NH);
}

inline void cp_attention_backward(ContextParallel* cp, float* dqkv, const float* dout, const float* out, const float* qkv,
                                  const float* att, int B, int T, int C, int NH) {
    if (cp == nullptr || !cp->on()) return attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
    if (cp->mode == ContextMode::ring) return ring_attention_backward(cp, dqkv, dout, out, att, qkv, B, C, NH);
    ulysses_attention_backward(cp, dqkv, dout, att, qkv, B, C, NH);
}
