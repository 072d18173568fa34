// Optimizer state files (a checkpoint's state_S_RANK.bin; the model file and the checks on what a file
// holds are llmc/io/model_file.h).
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
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../optimizer.h"
#include "../utils.h"
#include "checksum.h"
#include "model_file.h"

constexpr int32_t STATE_MAGIC = 20261121;
constexpr int32_t STATE_VERSION = 4;  // 3 with a per-process data position and without the optimizer
                                      // (AdamW), 2 without checksums either, 1 without the loss scale either

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
    verify_header_checksum(header, path, what);  // before any field is believed
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
