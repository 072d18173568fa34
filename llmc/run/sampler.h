// Sampling the next token from the logits of the last position.
//
// sample_softmax: softmax over the first V logits (the padded columns are not tokens), then the token
// whose cumulative probability first exceeds a uniform coin in [0, 1).
// sample_token adds the two usual knobs, applied to the logits before the softmax:
//   temperature t: p_i ∝ exp(z_i / t). t < 1 sharpens, t > 1 flattens; t = 0 means greedy (argmax,
//                  the lowest id among equal maxima), and draws no coin.
//   top-k k:       only the k largest logits keep their mass (ties broken towards the lower id, so
//                  exactly k survive); k = 0 or k >= V keeps all.
// With t = 1 and k = 0 it is sample_softmax, bit for bit, so runs without the flags sample as before.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

template <typename Real>
int sample_softmax(const Real* logits, int V, float coin) {  // logits: (V) or longer
    double maxval = logits[0];
    for (int i = 1; i < V; i++) maxval = logits[i] > maxval ? logits[i] : maxval;
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += std::exp(logits[i] - maxval);
    double target = coin * sum, cumulative = 0.0;
    for (int i = 0; i < V; i++) {
        cumulative += std::exp(logits[i] - maxval);
        if (target < cumulative) return i;
    }
    return V - 1;  // only reached by rounding when coin is within an ulp of 1
}

template <typename Real>
int sample_argmax(const Real* logits, int V) {
    int best = 0;
    for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
    return best;
}

// `coin` is only read when temperature > 0 (the caller draws it either way, so the random stream
// does not depend on the settings).
template <typename Real>
int sample_token(const Real* logits, int V, float temperature, int top_k, float coin) {
    if (temperature <= 0.0f) return sample_argmax(logits, V);
    if (temperature == 1.0f && (top_k <= 0 || top_k >= V)) return sample_softmax(logits, V, coin);
    // the ids that keep their mass, in increasing order (the walk below goes by id, as sample_softmax does)
    std::vector<int> kept(V);
    for (int i = 0; i < V; i++) kept[i] = i;
    if (top_k > 0 && top_k < V) {
        auto larger = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
        std::nth_element(kept.begin(), kept.begin() + (top_k - 1), kept.end(), larger);
        kept.resize(top_k);
        std::sort(kept.begin(), kept.end());
    }
    double maxval = logits[kept[0]];
    for (int i : kept) maxval = logits[i] > maxval ? logits[i] : maxval;
    double sum = 0.0;
    for (int i : kept) sum += std::exp((logits[i] - maxval) / temperature);
    double target = coin * sum, cumulative = 0.0;
    for (int i : kept) {
        cumulative += std::exp((logits[i] - maxval) / temperature);
        if (target < cumulative) return i;
    }
    return kept.back();
}
