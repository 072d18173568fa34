// Sampling the next token: softmax over the first V logits (the padded columns are not tokens), then
// the token whose cumulative probability first exceeds a uniform coin in [0, 1).
#pragma once

#include <cmath>

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
