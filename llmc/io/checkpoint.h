// Model files, optimizer state files and checkpoint directories.
//
// Model file (../shared/FORMATS.md): header magic 20240326, version 3 (fp32) or 5 (bf16), then the
// 16 parameter tensors back to back. bf16 is the top half of an fp32, so loading upcasts exactly and
// saving rounds to nearest even. Ours carry checksums in header slots 64.. (llmc/io/checksum.h), which
// llm.c ignores; a file without them (llm.c's, or an older one of ours) is read unverified, with a note.
//
// State file (ours; llm.c's has another layout): everything beyond the weights that a run needs to
// continue bit for bit. Header magic 20261121, version 4, then:
//   h[2] num_processes   h[3] rank    h[4] B    h[5] T    h[6] grad_accum_steps   h[7] has_master (0/1)
//   h[8..23] eight int64: step, data epoch, data unit (the data position, llmc/io/dataloader.h: the next
//            step starts at that entry of that epoch of the sample stream, whatever the process count),
//            units in a data epoch (of the data set that wrote it), sampler rng state, number of
//            parameters, first parameter of this rank's optimizer shard, shard length
//   h[24] loss scale S (fp32 bits; llmc/run/loss_scaler.h)   h[25] clean steps since S last changed
//   h[26] consecutive skipped steps   h[27] data-parallel processes (0 in older files: all of them, h[2])
//   h[28..31] two int64: skipped steps, optimizer updates applied
//   h[32] the optimizer (llmc/optimizer.h: 0 AdamW, 1 Muon, 2 Adafactor)
//   h[64..255] checksums (llmc/io/checksum.h): always there since version 3
// then, fp32, for the shard: the first moments m (AdamW's m; Muon's momentum on its matrices, AdamW's m
// elsewhere; none for Adafactor), the second moments v (AdamW's v, zero on Muon's matrices; Adafactor's
// factors, whose segment indexes its whole state vector, llmc/optimizer.h), and the master weights when
// has_master. Versions 3 (without h[32]: AdamW), 2 (without checksums) and 1 (without h[24..31] either)
// are read too; they hold a data position per process in h[12..15] (data shard index of the epoch,
// sample index of each data-parallel process), which train_state_restore converts where it names a
// place in the stream exactly.
//
// A checkpoint for step S in directory DIR is model_S.bin, one state_S_RANK.bin per process and last
// a DONE_S marker (S as %08d, RANK as %05d). Every file is written to a temporary name and renamed
// into place, and DONE_S is written only after all of them, so a crash at any point leaves either a
// complete checkpoint or one without its marker, which resume ignores and removes
// (checkpoint_remove_incomplete). A checkpoint that fails with an error (a full disk) removes its own
// files before the process exits (checkpoint_begin).
//
// What a reader refuses, beyond the header's own checks: bytes that do not match their checksum (the
// message names the file and the byte range), and states that no run can reach: weights, moments or
// master weights that are inf or NaN (the trainers skip non-finite steps, so a run that diverged never
// writes them), a negative second moment (a running mean of squares), an unknown optimizer, a negative
// data position (or one past the end of its epoch) or step count, or more updates and skipped steps than
// steps. The writers refuse the same.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../gpt2_config.h"
#include "../optimizer.h"
#include "../utils.h"
#include "checksum.h"

constexpr int32_t MODEL_MAGIC = 20240326;
constexpr int32_t MODEL_VERSION_FP32 = 3;
constexpr int32_t MODEL_VERSION_BF16 = 5;
constexpr int32_t STATE_MAGIC = 20261121;
constexpr int32_t STATE_VERSION = 4;  // 3 with a per-process data position and without the optimizer
                                      // (AdamW), 2 without checksums either, 1 without the loss scale either

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
inline FILE* model_file_open(const std::string& path, GPT2Config* cfg, int* version, BlockChecksums* sums) {
    const char* what = "model checkpoint";
    static const int32_t versions[] = {MODEL_VERSION_FP32, MODEL_VERSION_BF16};
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, MODEL_MAGIC, versions, 2, header);
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
    *sums = checksums_from_header(header, path, what, payload, false);
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

// ----------------------------------------------------------------------------
// state file

struct TrainState {
    int version = STATE_VERSION;  // of the file it was read from
    int num_processes = 1;
    int rank = 0;
    int B = 0, T = 0, grad_accum_steps = 1;
    int64_t step = 0;           // number of updates done
    // Where the data stream continues (llmc/io/dataloader.h: DataPosition): the next step starts at
    // entry data_unit of epoch data_epoch, whose stream had data_epoch_units units. A file of version 3
    // or older holds instead, per data-parallel process, sample data_sample of the data_shard-th shard
    // of the epoch (train_state_restore converts it).
    int64_t data_epoch = 0, data_unit = 0, data_epoch_units = 0;
    int64_t data_shard = 0, data_sample = 0;
    uint64_t sampler_rng = 0;
    int64_t num_parameters = 0;
    int64_t shard_offset = 0;   // this rank's optimizer shard: parameters [offset, offset + length)
    int64_t shard_length = 0;
    int32_t optimizer = OPT_ADAMW;  // which optimizer's moments m and v hold (llmc/optimizer.h)
    std::vector<float> m, v;    // (shard_length); m empty for Adafactor (no first moment)
    std::vector<float> master;  // (shard_length) or empty
    // skipped steps and loss scaling (llmc/run/loss_scaler.h): S is 1 in a run without scaling; read from a
    // version-1 file, which has none, it is 0 (the resumed run keeps its initial S)
    float loss_scale = 1.0f;
    int32_t clean_steps = 0, consecutive_skipped = 0;
    int64_t skipped_total = 0, updates = 0;
    // the data-parallel processes among num_processes (fewer with tensor or pipeline parallelism): the
    // data position is per data-parallel rank; 0 means num_processes
    int32_t data_processes = 0;
};

// Adafactor keeps no first moment: its files have v (and master) only.
inline bool state_has_first_moment(int optimizer) { return optimizer != OPT_ADAFACTOR; }

// What m and v hold, for messages: "AdamW m", "Muon and AdamW m", "Adafactor v", ...
inline std::string state_moment_name(int optimizer, char moment) {
    const char* owner = optimizer == OPT_MUON && moment == 'm' ? "Muon and AdamW" : optimizer == OPT_ADAFACTOR ? "Adafactor" : "AdamW";
    return std::string(owner) + " " + moment;
}

inline void state_file_write(const std::string& path, const TrainState& s) {
    bool has_m = state_has_first_moment(s.optimizer);
    if ((int64_t)s.m.size() != (has_m ? s.shard_length : 0) || (int64_t)s.v.size() != s.shard_length ||
        (!s.master.empty() && (int64_t)s.master.size() != s.shard_length)) {
        fatal("state_file_write: optimizer buffers do not match the shard length %ld", (long)s.shard_length);
    }
    int32_t header[HEADER_INTS] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s.num_processes;
    header[3] = s.rank;
    header[4] = s.B;
    header[5] = s.T;
    header[6] = s.grad_accum_steps;
    header[7] = s.master.empty() ? 0 : 1;
    int64_t wide[8] = {s.step, s.data_epoch, s.data_unit, s.data_epoch_units, (int64_t)s.sampler_rng,
                       s.num_parameters, s.shard_offset, s.shard_length};
    memcpy(&header[8], wide, sizeof(wide));
    memcpy(&header[24], &s.loss_scale, sizeof(float));
    header[25] = s.clean_steps;
    header[26] = s.consecutive_skipped;
    header[27] = s.data_processes;
    int64_t counts[2] = {s.skipped_total, s.updates};
    memcpy(&header[28], counts, sizeof(counts));
    header[32] = s.optimizer;
    std::string m_name = state_moment_name(s.optimizer, 'm'), v_name = state_moment_name(s.optimizer, 'v');
    require_finite(s.m.data(), s.m.size(), "writing", m_name + " of '" + path + "'");
    require_finite(s.v.data(), s.v.size(), "writing", v_name + " of '" + path + "'");
    require_non_negative(s.v.data(), s.v.size(), "writing", v_name + " of '" + path + "'");
    require_finite(s.master.data(), s.master.size(), "writing", "master weights of '" + path + "'");
    size_t bytes = sizeof(float) * (size_t)s.shard_length;
    AtomicFile f = atomic_open(path);
    int arrays = (has_m ? 2 : 1) + (s.master.empty() ? 0 : 1);
    BlockChecksums sums = checksummed_write_begin(&f, header, (int64_t)bytes * arrays, "optimizer state file");
    if (has_m) checksummed_write(&f, &sums, s.m.data(), bytes);
    checksummed_write(&f, &sums, s.v.data(), bytes);
    if (!s.master.empty()) checksummed_write(&f, &sums, s.master.data(), bytes);
    checksummed_write_end(&f, &sums, header);
    atomic_commit(&f);
}

inline void state_file_read(const std::string& path, TrainState* s) {
    const char* what = "optimizer state file";
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    static const int32_t versions[] = {1, 2, 3, STATE_VERSION};
    read_file_header(fp, path.c_str(), what, STATE_MAGIC, versions, 4, header);
    s->version = header[1];
    s->num_processes = header[2];
    s->rank = header[3];
    s->B = header[4];
    s->T = header[5];
    s->grad_accum_steps = header[6];
    int has_master = header[7];
    int64_t wide[8];
    memcpy(wide, &header[8], sizeof(wide));
    s->step = wide[0];
    s->data_epoch = wide[1];
    if (header[1] >= 4) {
        s->data_unit = wide[2];
        s->data_epoch_units = wide[3];
        s->data_shard = s->data_sample = 0;
    } else {  // a position per process (see TrainState)
        s->data_unit = s->data_epoch_units = 0;
        s->data_shard = wide[2];
        s->data_sample = wide[3];
    }
    s->sampler_rng = (uint64_t)wide[4];
    s->num_parameters = wide[5];
    s->shard_offset = wide[6];
    s->shard_length = wide[7];
    if (header[1] >= 2) {
        memcpy(&s->loss_scale, &header[24], sizeof(float));
        s->clean_steps = header[25];
        s->consecutive_skipped = header[26];
        s->data_processes = header[27];
        int64_t counts[2];
        memcpy(counts, &header[28], sizeof(counts));
        s->skipped_total = counts[0];
        s->updates = counts[1];
    } else {  // version 1: every step was an update, no loss scale stored
        s->loss_scale = 0.0f;
        s->clean_steps = s->consecutive_skipped = 0;
        s->skipped_total = 0;
        s->updates = wide[0];
        s->data_processes = 0;
    }
    if (s->data_processes == 0) s->data_processes = s->num_processes;
    s->optimizer = header[1] >= 4 ? header[32] : OPT_ADAMW;
    if (s->num_processes < 1 || s->rank < 0 || s->rank >= s->num_processes || s->B < 1 || s->T < 1 ||
        s->grad_accum_steps < 1 || s->data_processes < 1 || s->data_processes > s->num_processes ||
        s->optimizer < OPT_ADAMW || s->optimizer > OPT_ADAFACTOR ||
        (has_master != 0 && has_master != 1) || s->step < 0 || s->data_epoch < 0 || s->data_shard < 0 ||
        s->data_sample < 0 || s->data_unit < 0 || (header[1] >= 4 && s->data_unit >= s->data_epoch_units) ||
        s->num_parameters < 1 ||
        s->num_parameters > ((int64_t)1 << 40) ||  // bounds the sizes below, so no byte count can overflow
        s->shard_offset < 0 || s->shard_length < 0 || s->shard_offset > s->num_parameters + s->num_processes ||
        s->shard_length > s->num_parameters + s->num_processes ||
        s->shard_offset + s->shard_length > s->num_parameters + s->num_processes) {
        fatal("%s '%s' has an inconsistent header (corrupt?)", what, path.c_str());
    }
    if (header[1] >= 2 && (!(s->loss_scale > 0.0f) || !std::isfinite(s->loss_scale) || s->clean_steps < 0 ||
                           s->consecutive_skipped < 0 || s->skipped_total < 0 || s->updates < 0 || s->updates > s->step ||
                           s->skipped_total > s->step - s->updates)) {
        fatal("%s '%s' has an inconsistent loss scale or step counts (corrupt?)", what, path.c_str());
    }
    bool has_m = state_has_first_moment(s->optimizer);
    long expected = HEADER_BYTES + (long)sizeof(float) * s->shard_length * ((has_m ? 2 : 1) + has_master);
    expect_file_size(fp, path.c_str(), what, expected);
    BlockChecksums sums = checksums_from_header(header, path, what, expected - HEADER_BYTES, header[1] >= 3);
    size_t bytes = sizeof(float) * (size_t)s->shard_length;
    s->m.resize(has_m ? s->shard_length : 0);
    s->v.resize(s->shard_length);
    if (has_m) checksummed_read(fp, &sums, s->m.data(), bytes);
    checksummed_read(fp, &sums, s->v.data(), bytes);
    s->master.clear();
    if (has_master) {
        s->master.resize(s->shard_length);
        checksummed_read(fp, &sums, s->master.data(), bytes);
    }
    fcloseCheck(fp);
    std::string of = std::string(" of ") + what + " '" + path + "'";
    std::string m_name = state_moment_name(s->optimizer, 'm'), v_name = state_moment_name(s->optimizer, 'v');
    require_finite(s->m.data(), s->m.size(), "reading", m_name + of);
    require_finite(s->v.data(), s->v.size(), "reading", v_name + of);
    require_non_negative(s->v.data(), s->v.size(), "reading", v_name + of);
    require_finite(s->master.data(), s->master.size(), "reading", "master weights" + of);
}

// ----------------------------------------------------------------------------
// checkpoint directory

inline std::string checkpoint_model_path(const std::string& dir, int64_t step) {
    char name[64];
    snprintf(name, sizeof(name), "/model_%08ld.bin", (long)step);
    return dir + name;
}

inline std::string checkpoint_state_path(const std::string& dir, int64_t step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08ld_%05d.bin", (long)step, rank);
    return dir + name;
}

inline std::string checkpoint_done_path(const std::string& dir, int64_t step) {
    char name[64];
    snprintf(name, sizeof(name), "/DONE_%08ld", (long)step);
    return dir + name;
}

// Marks checkpoint `step` complete; call after every file of it is in place.
inline void checkpoint_mark_done(const std::string& dir, int64_t step) {
    AtomicFile f = atomic_open(checkpoint_done_path(dir, step));
    atomic_commit(&f);
}


// From here until checkpoint_end, an error exit of this process (fatal: a full disk, a failed
// collective) removes the files of checkpoint `step` that it writes: process 0's model file and every
// process's own state file, with their .tmp (AtomicFile's). Process 0 first removes an older run's
// DONE_step, since the files it marked are about to be replaced.
inline void checkpoint_begin(const std::string& dir, int64_t step, int rank) {
    if (rank == 0) {
        unlink(checkpoint_done_path(dir, step).c_str());
        remove_on_error(checkpoint_model_path(dir, step));
    }
    remove_on_error(checkpoint_state_path(dir, step, rank));
}

// This process's files of checkpoint `step` are complete: they stay whatever happens next. Process 0
// calls it once DONE_step is written; the others once every process has written its files (if process 0
// then fails to mark it done, a resume removes them).
inline void checkpoint_end(const std::string& dir, int64_t step, int rank) {
    if (rank == 0) keep_on_error(checkpoint_model_path(dir, step));
    keep_on_error(checkpoint_state_path(dir, step, rank));
}

// If `name` is one of a checkpoint's files (model_S.bin, state_S_R.bin, DONE_S), or one of those with
// .tmp after it, returns true and its step S and whether it is a .tmp.
inline bool checkpoint_file_step(const std::string& name, int64_t* step, bool* is_tmp) {
    std::string base = name;
    *is_tmp = base.size() > 4 && base.compare(base.size() - 4, 4, ".tmp") == 0;
    if (*is_tmp) base.resize(base.size() - 4);
    // prefix, then digits, then (for a state file) "_" and digits, then the suffix, and nothing else
    auto digits = [&](size_t* at) {
        size_t begin = *at;
        while (*at < base.size() && isdigit((unsigned char)base[*at])) ++*at;
        return *at > begin && *at - begin <= 12;
    };
    size_t at;
    const char* suffix;
    if (base.compare(0, 6, "model_") == 0 || base.compare(0, 6, "state_") == 0) {
        at = 6, suffix = ".bin";
    } else if (base.compare(0, 5, "DONE_") == 0) {
        at = 5, suffix = "";
    } else {
        return false;
    }
    size_t step_begin = at;
    if (!digits(&at)) return false;
    *step = atoll(base.substr(step_begin, at - step_begin).c_str());
    if (base[0] == 's') {  // state_S_R: then the rank
        if (at >= base.size() || base[at] != '_') return false;
        at++;
        if (!digits(&at)) return false;
    }
    return base.compare(at, std::string::npos, suffix) == 0;
}

// The steps with a DONE marker in dir, in increasing order (none when dir is empty or missing).
inline std::vector<int64_t> checkpoint_complete_steps(const std::string& dir) {
    std::vector<int64_t> steps;
    if (dir.empty()) return steps;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return steps;
    while (struct dirent* entry = readdir(d)) {
        int64_t step;
        bool is_tmp;
        if (entry->d_name[0] == 'D' && checkpoint_file_step(entry->d_name, &step, &is_tmp) && !is_tmp) steps.push_back(step);
    }
    closedir(d);
    std::sort(steps.begin(), steps.end());
    return steps;
}

// The newest step with a DONE marker in dir, or -1 if there is none.
inline int64_t checkpoint_find_latest(const std::string& dir) {
    std::vector<int64_t> steps = checkpoint_complete_steps(dir);
    return steps.empty() ? -1 : steps.back();
}

// Removes what crashed or failed checkpoints left in dir: every checkpoint file of a step without a
// DONE marker, and every checkpoint .tmp. Complete checkpoints and all other files are left alone.
// Returns the names it removed, sorted.
inline std::vector<std::string> checkpoint_remove_incomplete(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return names;
    while (struct dirent* entry = readdir(d)) names.push_back(entry->d_name);
    closedir(d);
    std::vector<int64_t> done;
    for (const std::string& name : names) {
        int64_t step;
        bool is_tmp;
        if (name[0] == 'D' && checkpoint_file_step(name, &step, &is_tmp) && !is_tmp) done.push_back(step);
    }
    std::vector<std::string> removed;
    for (const std::string& name : names) {
        int64_t step;
        bool is_tmp;
        if (!checkpoint_file_step(name, &step, &is_tmp)) continue;
        if (!is_tmp && std::find(done.begin(), done.end(), step) != done.end()) continue;
        std::string path = dir + "/" + name;
        if (unlink(path.c_str()) != 0) fatal("could not remove the incomplete checkpoint file '%s': %s", path.c_str(), strerror(errno));
        removed.push_back(name);
    }
    std::sort(removed.begin(), removed.end());
    return removed;
}
