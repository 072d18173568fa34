// Model files, and the checks every file of a checkpoint makes of what it holds.
//
// Model file (../shared/FORMATS.md): header magic 20240326, version 3 (fp32) or 5 (bf16), then the
// 16 parameter tensors back to back. bf16 is the top half of an fp32, so loading upcasts exactly and
// saving rounds to nearest even. Ours carry checksums in header slots 64.. (llmc/io/checksum.h), which
// llm.c ignores; a file without them (llm.c's, or an older one of ours) is read unverified, with a note.
//
// What a reader refuses, beyond the header's own checks: bytes that do not match their checksum (the
// message names the file and the byte range), and states that no run can reach: weights, moments or
// master weights that are inf or NaN (the trainers skip non-finite steps, so a run that diverged never
// writes them), a negative second moment (a running mean of squares), an unknown optimizer, a negative
// data position (or one past the end of its epoch) or step count, or more updates and skipped steps than
// steps. The writers refuse the same.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../utils.h"
#include "checksum.h"

constexpr int32_t MODEL_MAGIC = 20240326;
constexpr int32_t MODEL_VERSION_FP32 = 3;
constexpr int32_t MODEL_VERSION_BF16 = 5;

// ----------------------------------------------------------------------------
// bf16 <-> fp32

inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

// ----------------------------------------------------------------------------
// finiteness

// Index of the first inf or NaN in x[n], or n if there is none.
inline size_t first_non_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(x[i])) return i;
    }
    return n;
}

// Refuses (fatal) a buffer holding inf or NaN; `action` and `what` name it: "reading", "model file 'x'".
inline void require_finite(const float* x, size_t n, const char* action, const std::string& what) {
    size_t i = first_non_finite(x, n);
    if (i < n) {
        fatal("%s %s: element %zu of %zu is %g; weights and optimizer state must be finite (a run that diverged? "
              "resume from an earlier checkpoint)", action, what.c_str(), i, n, x[i]);
    }
}

// Refuses (fatal) a negative AdamW second moment: v is a running mean of g^2, so a negative one is
// corrupt, and loaded it would turn sqrt(v), then the weights, into NaN. (-0 is zero, and harmless.)
inline void require_non_negative(const float* v, size_t n, const char* action, const std::string& what) {
    for (size_t i = 0; i < n; i++) {
        if (v[i] < 0.0f) {
            fatal("%s %s: element %zu of %zu is %g; a second moment cannot be negative (corrupt, or written by a "
                  "bug)", action, what.c_str(), i, n, v[i]);
        }
    }
}

// ----------------------------------------------------------------------------
// model file

inline void model_file_write(const std::string& path, const GPT2Config& cfg, const float* params, int version) {
    const char* what = "model checkpoint";
    if (version != MODEL_VERSION_FP32 && version != MODEL_VERSION_BF16) fatal("model_file_write: unknown version %d", version);
    int32_t header[HEADER_INTS] = {0};
    header[0] = MODEL_MAGIC;
    header[1] = version;
    header[2] = cfg.max_seq_len;
    header[3] = cfg.vocab_size;
    header[4] = cfg.num_layers;
    header[5] = cfg.num_heads;
    header[6] = cfg.channels;
    header[7] = cfg.padded_vocab_size;
    size_t n = num_parameters(cfg);
    require_finite(params, n, "writing", "model checkpoint '" + path + "'");
    size_t bytes_per_param = version == MODEL_VERSION_FP32 ? 4 : 2;
    AtomicFile f = atomic_open(path);
    BlockChecksums sums = checksummed_write_begin(&f, header, (int64_t)(n * bytes_per_param), what);
    if (version == MODEL_VERSION_FP32) {
        checksummed_write(&f, &sums, params, n * sizeof(float));
    } else {
        std::vector<uint16_t> chunk(1 << 20);
        for (size_t i = 0; i < n; i += chunk.size()) {
            size_t len = std::min(chunk.size(), n - i);
            for (size_t j = 0; j < len; j++) chunk[j] = float_to_bf16(params[i + j]);
            checksummed_write(&f, &sums, chunk.data(), len * sizeof(uint16_t));
        }
    }
    checksummed_write_end(&f, &sums, header);
    atomic_commit(&f);
}

// Reads the header of a model file, checks it (its checksum last), and returns its config and version
// and the payload's block checksums. Leaves fp at the first parameter.
// (quiet: the header for its shape alone, without the note on a file that has no checksums, which the
// read of its parameters prints)
inline FILE* model_file_open(const std::string& path, GPT2Config* cfg, int* version, BlockChecksums* sums,
                             bool quiet = false) {
    const char* what = "model checkpoint";
    static const int32_t versions[] = {MODEL_VERSION_FP32, MODEL_VERSION_BF16};
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, MODEL_MAGIC, versions, 2, header);
    verify_header_checksum(header, path, what);
    cfg->max_seq_len = header[2];
    cfg->vocab_size = header[3];
    cfg->num_layers = header[4];
    cfg->num_heads = header[5];
    cfg->channels = header[6];
    cfg->padded_vocab_size = header[7];
    validate_config(*cfg, path.c_str());
    *version = header[1];
    size_t bytes_per_param = *version == MODEL_VERSION_FP32 ? 4 : 2;
    int64_t payload = (int64_t)(num_parameters(*cfg) * bytes_per_param);
    expect_file_size(fp, path.c_str(), what, HEADER_BYTES + (long)payload);
    *sums = checksums_from_header(header, path, what, payload, false, quiet);
    return fp;
}

// Reads a version-3 or version-5 model file into fp32 parameters (bf16 is upcast exactly).
inline void model_file_read(const std::string& path, GPT2Config* cfg, std::vector<float>* params, int* version = nullptr) {
    int file_version;
    BlockChecksums sums;
    FILE* fp = model_file_open(path, cfg, &file_version, &sums);
    size_t n = num_parameters(*cfg);
    params->resize(n);
    if (file_version == MODEL_VERSION_FP32) {
        checksummed_read(fp, &sums, params->data(), n * sizeof(float));
    } else {
        std::vector<uint16_t> chunk(1 << 20);
        for (size_t i = 0; i < n; i += chunk.size()) {
            size_t len = std::min(chunk.size(), n - i);
            checksummed_read(fp, &sums, chunk.data(), len * sizeof(uint16_t));
            for (size_t j = 0; j < len; j++) (*params)[i + j] = bf16_to_float(chunk[j]);
        }
    }
    fcloseCheck(fp);
    require_finite(params->data(), n, "reading", "model checkpoint '" + path + "'");
    if (version) *version = file_version;
}
