// Random numbers that are the same on every machine and compiler.
//
// std::mt19937's output sequence is fixed by the C++ standard, but the distributions in <random>
// (normal_distribution, uniform_int_distribution, shuffle) are each library's own. So we take raw
// 32-bit words from mt19937 and build uniform, normal and permutation draws here: a seed then means
// the same model initialization and the same data order everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

// uniform double in [0, 1) with 53 random bits
inline double rand_uniform(std::mt19937& rng) {
    uint64_t hi = rng() >> 5, lo = rng() >> 6;  // 27 + 26 bits
    return (double)(hi * 67108864ull + lo) * (1.0 / 9007199254740992.0);
}

// uniform integer in [0, n), without modulo bias (rejection sampling)
inline uint32_t rand_below(std::mt19937& rng, uint32_t n) {
    uint32_t limit = UINT32_MAX - UINT32_MAX % n;
    uint32_t x;
    do {
        x = rng();
    } while (x >= limit);
    return x % n;
}

// fills out[n] with N(mean, std) draws, by the Box-Muller transform
inline void rand_normal_fill(float* out, size_t n, double mean, double std, std::mt19937& rng) {
    for (size_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - rand_uniform(rng);  // (0, 1], so the log is finite
        double u2 = rand_uniform(rng);
        double radius = std::sqrt(-2.0 * std::log(u1));
        out[i] = (float)(mean + std * radius * std::cos(2.0 * M_PI * u2));
        if (i + 1 < n) out[i + 1] = (float)(mean + std * radius * std::sin(2.0 * M_PI * u2));
    }
}

// order[n] = a uniformly random permutation of 0..n-1 (Fisher-Yates)
template <typename Int>
void random_permutation(Int* order, Int n, std::mt19937& rng) {
    for (Int i = 0; i < n; i++) order[i] = i;
    for (Int i = n - 1; i > 0; i--) {
        Int j = (Int)rand_below(rng, (uint32_t)(i + 1));
        std::swap(order[i], order[j]);
    }
}

// The sampler's coin: xorshift64*, a tiny generator whose whole state is one integer, so the state
// file can save it and a resumed run samples the same text.
inline uint32_t xorshift_next(uint64_t* state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

// uniform float in [0, 1) with 24 random bits
inline float xorshift_uniform(uint64_t* state) { return (xorshift_next(state) >> 8) / 16777216.0f; }
