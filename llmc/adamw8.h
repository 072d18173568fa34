// 8-bit AdamW (-opt adamw8): AdamW (llmc/adamw.h) whose moments m and v are stored in 8 bits, in blocks
// of ADAMW8_BLOCK = 256 elements counted from each tensor's start (each layer's slice of a stacked tensor
// is a tensor: llmc/optimizer.h), with one fp32 number per block for each. A block never mixes tensors,
// and its place does not depend on how processes share the work, so the state, and the run, are the
// same bits in every layout (-z 0..3, any process count).
//
//   m, signed linear:  a = max |m| over the block;   m = q (a / 127),   q = round(m (127 / a)) in [-127, 127]
//   v, logarithmic:    b = max v over the block;     v = b 2^((q - 255) / 8) for q in 1..255,  v = 0 for q = 0
//                      q: the level nearest v / b on a log scale (thresholds at the geometric midpoints
//                      2^((k - 254.5) / 8); below half the smallest level, 0)
// (round: to nearest, ties to even; a = 0 or b = 0: every code 0.)
//
// Why these two. m enters the step linearly: a linear code errs by at most half a step (a / 254), and
// elements far below the block's largest round to 0, a smaller step. v divides the step, so what matters
// is its relative error: a linear code would turn every v below b / 510 into 0 and that element's step
// into m / eps. The log code keeps v within 2^(1/16) - 1 = 4.4% (sqrt(v), the divisor, within 2.2%) from b
// down to 2^-31.75 b = 3e-10 b. Below that v is stored as 0, and so is that element's m: with beta1^2 <
// beta2, |m| <= sqrt((1 - b1)^2 / ((1 - b2)(1 - b1^2 / b2))) sqrt(v) = 1.17 sqrt(v) (Cauchy-Schwarz on the
// two running sums), so such an m is below 2e-5 of sqrt(b): a negligible step that m / eps would make
// arbitrary. bitsandbytes' 8-bit Adam uses a "dynamic" code (a sign, a decimal exponent, a linear
// fraction) for both; these are simpler to state and check and keep the same 256-element blocks.
//
// One update of an element, as AdamW's, on the decoded moments; the step uses the new moments in fp32,
// before they are encoded again (so the encoding's error reaches only the next steps):
//   m' = b1 m + (1 - b1) g,   v' = b2 v + (1 - b2) g^2,   p -= lr ((m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps) + wd p)
// then each block's new maxima, and m', v' encoded with them. A block that a ZeRO shard boundary cuts
// (its elements updated by two processes) needs both parts' maxima: the processes exchange them
// (llmc/parallel/zero_blocks.h, zero_complete_block_maxima) before encoding it.
//
// Memory: 2 bytes per parameter and 8 per 256 (against AdamW's 8): 25.4%. Every tensor is encoded,
// biases and LayerNorm parameters included (a block of 256 never mixes them with a matrix's elements,
// and together they are 0.3% of GPT-2 small's parameters).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "adamw.h"
#include "optimizer.h"

constexpr size_t ADAMW8_BLOCK = 256;

// The levels of v's code relative to the block's largest v, and the thresholds between them:
// level[q] = 2^((q - 255) / 8) (level[0] = 0); threshold[k] = 2^((k - 254.5) / 8) between levels k and k + 1
// (threshold[0] = level[1] / 2). Computed in double, rounded to float once: the same table everywhere.
struct Adamw8Tables {
    float level[256];
    float threshold[255];
};

inline const Adamw8Tables& adamw8_tables() {
    static const Adamw8Tables tables = [] {
        Adamw8Tables t;
        t.level[0] = 0.0f;
        for (int q = 1; q < 256; q++) t.level[q] = (float)std::exp2((q - 255) / 8.0);
        t.threshold[0] = t.level[1] * 0.5f;
        for (int k = 1; k < 255; k++) t.threshold[k] = (float)std::exp2((k - 254.5) / 8.0);
        return t;
    }();
    return tables;
}

// The element-wise pieces, one body for the CPU and the GPU (llmc/adamw8.cuh), and the step itself
// AdamW's adamw_element (llmc/adamw.h) on the decoded moments: every multiply-add is an explicit fmaf and
// nothing else can be contracted; division, sqrtf and rintf are IEEE on both (no --use_fast_math), so
// the two give the same bits.

// v's code of x = v / b in [0, 1]: how many thresholds are at or below x. The count is 254.5 + 8 log2(x)
// rounded down (and clamped) for the real thresholds; log2(x) is estimated from x's exponent and
// mantissa (E + f - 1, within 0.09 of it: within one threshold), and the table's own (float) thresholds
// then settle it, so the result is the table's count exactly, as a search of it would give.
HOST_DEVICE inline uint8_t adamw8_code_v(float x, const float* threshold) {
    if (!(x >= threshold[0])) return 0;
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    float f;  // x's mantissa as a number in [1, 2)
    uint32_t mantissa = (bits & 0x007fffffu) | 0x3f800000u;
    memcpy(&f, &mantissa, sizeof(f));
    float log2x = (float)((int)(bits >> 23) - 127) + (f - 1.0f);
    int k = (int)floorf(254.5f + 8.0f * log2x);  // thresholds 1..k at or below x, nearly
    k = k < 0 ? 0 : k > 254 ? 254 : k;
    while (k < 254 && threshold[k + 1] <= x) k++;
    while (k > 0 && threshold[k] > x) k--;
    return (uint8_t)(k + 1);  // and threshold[0]
}

// m's code of m with the block's factor r = 127 / a.
HOST_DEVICE inline int8_t adamw8_code_m(float m, float r) {
    return (int8_t)fminf(127.0f, fmaxf(-127.0f, rintf(m * r)));
}

HOST_DEVICE inline float adamw8_decode_m(int8_t q, float a) { return (float)q * (a / 127.0f); }
HOST_DEVICE inline float adamw8_decode_v(uint8_t q, float b, const float* level) { return b * level[q]; }

// One element's codes, with the block's maxima a = max |m| (as r = 127 / a, 0 when a = 0) and b = max v.
HOST_DEVICE inline void adamw8_encode_element(float m, float v, float r, float b, const float* threshold,
                                                     int8_t* qm, uint8_t* qv) {
    uint8_t cv = b > 0.0f ? adamw8_code_v(v / b, threshold) : 0;
    *qv = cv;
    *qm = cv == 0 ? 0 : adamw8_code_m(m, r);
}

HOST_DEVICE inline float adamw8_ratio(float a) { return a > 0.0f ? 127.0f / a : 0.0f; }

// Encodes a block's new moments (n elements) with its maxima a = max |m|, b = max v.
inline void adamw8_encode(const float* m, const float* v, size_t n, float a, float b, int8_t* qm, uint8_t* qv) {
    const Adamw8Tables& tab = adamw8_tables();
    const float r = adamw8_ratio(a);
    for (size_t i = 0; i < n; i++) adamw8_encode_element(m[i], v[i], r, b, tab.threshold, &qm[i], &qv[i]);
}

// The blocks of a flat parameter vector: each tensor's elements cut into blocks of ADAMW8_BLOCK from its
// first (its last block may be shorter), numbered in the vector's order.
struct Adamw8Blocks {
    std::vector<size_t> tensor_begin;  // each tensor's first element, ascending; then the vector's end
    std::vector<size_t> first_block;   // each tensor's first block; then the number of blocks
    std::vector<bool> decayed;         // each tensor: does -c's weight decay reach it
    size_t num_blocks() const { return first_block.back(); }
    // the tensor holding block b
    size_t tensor_of_block(size_t b) const {
        return (size_t)(std::upper_bound(first_block.begin(), first_block.end(), b) - first_block.begin()) - 1;
    }
    size_t block_of(size_t e) const {  // the block holding element e
        size_t t = (size_t)(std::upper_bound(tensor_begin.begin(), tensor_begin.end(), e) - tensor_begin.begin()) - 1;
        return first_block[t] + (e - tensor_begin[t]) / ADAMW8_BLOCK;
    }
    size_t block_begin(size_t b) const {
        size_t t = tensor_of_block(b);
        return tensor_begin[t] + (b - first_block[t]) * ADAMW8_BLOCK;
    }
    size_t block_end(size_t b) const {
        size_t t = tensor_of_block(b);
        return std::min(tensor_begin[t + 1], block_begin(b) + ADAMW8_BLOCK);
    }
    // the blocks that hold some element of [begin, end)
    void blocks_of(size_t begin, size_t end, size_t* first, size_t* last) const {
        *first = begin < end ? block_of(begin) : 0;
        *last = begin < end ? block_of(end - 1) + 1 : 0;
    }
};

// The blocks of a model's flat vector (its optimizer tensors, llmc/optimizer.h, which tile it in order).
inline Adamw8Blocks adamw8_blocks(const std::vector<OptimizerTensor>& tensors) {
    Adamw8Blocks map;
    size_t blocks = 0;
    for (const OptimizerTensor& t : tensors) {
        map.tensor_begin.push_back(t.offset);
        map.first_block.push_back(blocks);
        map.decayed.push_back(param_tensor_is_decayed(t.param));
        blocks += (t.size() + ADAMW8_BLOCK - 1) / ADAMW8_BLOCK;
    }
    map.tensor_begin.push_back(tensors.empty() ? 0 : tensors.back().offset + tensors.back().size());
    map.first_block.push_back(blocks);
    return map;
}

// How many of the model's blocks hold some element of [begin, end) (the memory plans' count).
inline size_t adamw8_blocks_in(const std::vector<OptimizerTensor>& tensors, size_t begin, size_t end) {
    size_t first, last;
    adamw8_blocks(tensors).blocks_of(begin, end, &first, &last);
    return last - first;
}

// The 8-bit state of elements [begin, end) of the flat vector (all of them, or a ZeRO shard): each
// element's codes, and the maxima of blocks [block_begin, block_end), those holding some of its elements
// (a block cut by the shard's edge is held, with the same maxima, by both processes).
struct Adamw8State {
    size_t begin = 0, end = 0;
    size_t block_begin = 0, block_end = 0;
    std::vector<int8_t> m;       // (end - begin)
    std::vector<uint8_t> v;      // (end - begin)
    std::vector<float> m_max, v_max;  // (block_end - block_begin): a and b of each block
    size_t bytes() const { return m.size() + v.size() + sizeof(float) * (m_max.size() + v_max.size()); }
};

inline Adamw8State adamw8_state(const Adamw8Blocks& map, size_t begin, size_t end) {
    Adamw8State s;
    s.begin = begin;
    s.end = end;
    map.blocks_of(begin, end, &s.block_begin, &s.block_end);
    s.m.assign(end - begin, 0);
    s.v.assign(end - begin, 0);
    s.m_max.assign(s.block_end - s.block_begin, 0.0f);
    s.v_max.assign(s.block_end - s.block_begin, 0.0f);
    return s;
}

// The bytes of a state over n parameters in `blocks` blocks (the memory plan's count), and per parameter
// at large n (the ZeRO formula's K, llmc/parallel/zero_sharded.h).
inline size_t adamw8_state_bytes(size_t n, size_t blocks) { return 2 * n + 2 * sizeof(float) * blocks; }
constexpr double ADAMW8_BYTES_PER_PARAMETER = 2.0 + 2.0 * sizeof(float) / ADAMW8_BLOCK;

// A block of the state cut by its range's edge: its new moments over this process's part, kept until the
// other part's maxima are known, and this part's maxima.
struct Adamw8Edge {
    size_t block = 0;
    std::vector<float> m, v;
    float m_max = 0.0f, v_max = 0.0f;
};

// One update (t from 1) of parameters [s->begin, s->end): params and grads point at element s->begin.
// Blocks wholly inside the range are encoded at once; the cut ones (at most two) go to
// `complete_edges(std::vector<Adamw8Edge>&)`, which turns each edge's maxima into the whole block's (the
// exchange with the neighbours; identity when the range holds every block whole) before they are encoded.
template <typename CompleteEdges>
void adamw8_update(float* params, const float* grads, Adamw8State* s, const Adamw8Blocks& map, const AdamWHyper& hyper,
                   float lr, float weight_decay, float grad_scale, int t, CompleteEdges complete_edges) {
    const Adamw8Tables& tab = adamw8_tables();
    const float bias_correction1 = (float)(1.0 - std::pow((double)hyper.beta1, t));
    const float bias_correction2 = (float)(1.0 - std::pow((double)hyper.beta2, t));
    const size_t blocks = s->block_end - s->block_begin;
    std::vector<Adamw8Edge> edges;
    for (size_t k = 0; k < blocks; k++) {
        size_t b = s->block_begin + k;
        if (map.block_begin(b) < s->begin || map.block_end(b) > s->end) edges.push_back(Adamw8Edge{b, {}, {}, 0.0f, 0.0f});
    }
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < blocks; k++) {
        size_t b = s->block_begin + k;
        size_t begin = std::max(map.block_begin(b), s->begin), end = std::min(map.block_end(b), s->end), n = end - begin;
        const float decay = map.decayed[map.tensor_of_block(b)] ? weight_decay : 0.0f;
        float m[ADAMW8_BLOCK], v[ADAMW8_BLOCK], m_max = 0.0f, v_max = 0.0f;
        const float a_old = s->m_max[k], b_old = s->v_max[k];
        for (size_t j = 0; j < n; j++) {
            size_t i = begin - s->begin + j;
            m[j] = adamw8_decode_m(s->m[i], a_old);
            v[j] = adamw8_decode_v(s->v[i], b_old, tab.level);
            params[i] = adamw_element(params[i], grads[i], &m[j], &v[j], lr, hyper.beta1, hyper.beta2, bias_correction1,
                                      bias_correction2, hyper.eps, decay, grad_scale);
            m_max = fmaxf(m_max, fabsf(m[j]));
            v_max = fmaxf(v_max, v[j]);
        }
        size_t first = begin - s->begin;
        bool whole = begin == map.block_begin(b) && end == map.block_end(b);
        if (whole) {
            s->m_max[k] = m_max;
            s->v_max[k] = v_max;
            adamw8_encode(m, v, n, m_max, v_max, &s->m[first], &s->v[first]);
        } else {
            Adamw8Edge& e = edges[b == edges.front().block ? 0 : 1];
            e.m.assign(m, m + n);
            e.v.assign(v, v + n);
            e.m_max = m_max;
            e.v_max = v_max;
        }
    }
    complete_edges(edges);
    for (Adamw8Edge& e : edges) {
        size_t k = e.block - s->block_begin, first = std::max(map.block_begin(e.block), s->begin) - s->begin;
        s->m_max[k] = e.m_max;
        s->v_max[k] = e.v_max;
        adamw8_encode(e.m.data(), e.v.data(), e.m.size(), e.m_max, e.v_max, &s->m[first], &s->v[first]);
    }
}
