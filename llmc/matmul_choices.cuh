// The algorithms -at 1 chose (llmc/matmul.cuh), kept in each process's state file so that a resumed run
// computes every product with the kernel the interrupted run used, and so continues with its bits.
//
// cublasLt.h on cublasLtMatmulAlgo_t: "This structure can be trivially serialized and later restored for use
// with the same version of cuBLAS library to save on selecting the right configuration again."
//
// A section of kind STATE_SECTION_MATMUL_CHOICES (llmc/io/state_file.h), each process's own (its shapes
// are its layout's): a count, then for each problem its key (m, n, k, the transposes, the epilogue, six
// alignments: 12 int32) and the cublasLtMatmulAlgo_t the run took (64 opaque bytes, compared whole). A
// resumed run with -at 1 takes a recorded algorithm, untimed, where cuBLASLt offers that same one among
// its candidates for the problem; elsewhere (another library or device, a problem first met after the
// checkpoint) it times as a fresh run does and says so.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "io/state_file.h"
#include "matmul.cuh"

static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "the section stores cuBLASLt's algorithm as its 64 bytes");
constexpr size_t MATMUL_CHOICE_BYTES = 12 * sizeof(int32_t) + sizeof(cublasLtMatmulAlgo_t);

inline StateSection matmul_choices_section() {
    StateSection s;
    s.kind = STATE_SECTION_MATMUL_CHOICES;
    uint32_t count = 0;
    for (const auto& [key, c] : matmul_algorithms.chosen) count += c.candidates > 0;
    s.bytes.resize(sizeof(count) + count * MATMUL_CHOICE_BYTES);
    uint8_t* at = s.bytes.data();
    memcpy(at, &count, sizeof(count));
    at += sizeof(count);
    for (const auto& [key, c] : matmul_algorithms.chosen) {
        if (c.candidates == 0) continue;  // a BGRADB product cuBLASLt has no algorithm for
        int32_t fields[12] = {key.m, key.n, key.k, key.trans_a, key.trans_b, key.epilogue};
        for (int i = 0; i < 6; i++) fields[6 + i] = (int32_t)key.align[i];
        memcpy(at, fields, sizeof(fields));
        memcpy(at + sizeof(fields), &c.algo, sizeof(c.algo));
        at += MATMUL_CHOICE_BYTES;
    }
    return s;
}

// The recorded algorithms of this process's checkpoint section, if it has one (none: -at 1 times afresh).
inline void matmul_choices_restore(const std::vector<StateSection>& sections) {
    for (const StateSection& s : sections) {
        if (s.kind != STATE_SECTION_MATMUL_CHOICES) continue;
        uint32_t count = 0;
        if (s.bytes.size() >= sizeof(count)) memcpy(&count, s.bytes.data(), sizeof(count));
        if (s.bytes.size() < sizeof(count) || s.bytes.size() != sizeof(count) + count * MATMUL_CHOICE_BYTES) {
            fatal("the checkpoint's matmul algorithms (-at 1) hold %zu bytes, which is no whole list of choices of %zu "
                  "bytes each: a damaged or foreign state file", s.bytes.size(), MATMUL_CHOICE_BYTES);
        }
        const uint8_t* at = s.bytes.data() + sizeof(count);
        for (uint32_t i = 0; i < count; i++, at += MATMUL_CHOICE_BYTES) {
            int32_t f[12];
            memcpy(f, at, sizeof(f));
            MatmulKey key{f[0], f[1], f[2], f[3], f[4], f[5], {}};
            for (int j = 0; j < 6; j++) key.align[j] = (uint32_t)f[6 + j];
            memcpy(&matmul_algorithms.recorded[key], at + sizeof(f), sizeof(cublasLtMatmulAlgo_t));
        }
        printf("resume: the matmul algorithms -at 1 chose for %u problems, from the checkpoint\n", count);
    }
}
