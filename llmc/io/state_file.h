// Optimizer state files (a checkpoint's state_S_RANK.bin; the model file and the checks on what a file
// holds are llmc/io/model_file.h).
//
// State file (ours; llm.c's has another layout): everything beyond the weights that a run needs to
// continue bit for bit. Header magic 20261121, version 5, then:
//   h[2] num_processes   h[3] rank    h[4] B    h[5] T    h[6] grad_accum_steps   h[7] has_master (0/1)
//   h[8..23] eight int64: step, data epoch, data sample (the data position, llmc/io/dataloader.h: the next
//            step starts at that sample of that epoch of the stream of T-token samples, whatever B and
//            the process count), samples in a data epoch (of the data set that wrote it), sampler rng
//            state, number of parameters, first parameter of this rank's optimizer shard, shard length
//   h[24] loss scale S (fp32 bits; llmc/run/loss_scaler.h)   h[25] clean steps since S last changed
//   h[26] consecutive skipped steps   h[27] data-parallel processes
//   h[28..31] two int64: skipped steps, optimizer updates applied
//   h[32] the optimizer (llmc/optimizer.h: 0 AdamW, 1 Muon, 2 Adafactor, 3 8-bit AdamW)
//   h[33] 1 when S is a dynamic loss scale (the FP16 build), 0 when the run did not scale (S = 1)
//   h[34..35] int64: the training data's fingerprint (dataloader.h; 0: not known)
//   h[36] how m and v are stored: 0 fp32; 1 8-bit codes in blocks (-opt adamw8, llmc/adamw8.h), with
//         h[37] the number of blocks that hold the shard's elements and h[38..39] (int64) the first of them
//   h[40] number of extra sections (at most STATE_MAX_SECTIONS), then for section i, h[41 + 4i..44 + 4i]:
//         its kind, its flags (bit 0: a reader that does not know the kind must refuse the file), and its
//         length in bytes (int64)
//   h[64..255] checksums (llmc/io/checksum.h), over everything after the header
// then, fp32, for the shard: the first moments m (AdamW's m; Muon's momentum on its matrices, AdamW's m
// elsewhere; none for Adafactor), the second moments v (AdamW's v, zero on Muon's matrices; Adafactor's
// factors, whose segment indexes its whole state vector, llmc/optimizer.h), and the master weights when
// has_master; then the extra sections' bytes, in order. Encoding 1 holds instead of m and v: m's codes
// (int8, one per element of the shard), its blocks' max |m| (fp32, one per block), v's codes (uint8), its
// blocks' max v (fp32); a block cut by the shard's edge is in both neighbours' files, the same maxima.
//
// The version plan. Version 5 is the one change of layout that the coming state needs: the position in
// the sample stream (issue 51), whether S was dynamic (so an FP16 run resuming a bf16 checkpoint keeps
// its -ls), the data fingerprint, and room for what later work adds without another version: FP8
// scaling state (issue 48), error-feedback residuals (issue 49) as extra sections, 8-bit moments
// (issue 49) as an encoding in h[36]. The kinds are reserved below; a file holding a kind this
// program does not know is read (its bytes checksummed and skipped) unless the section says it must
// be understood. Older files are read too: version 4 (a data position in units of B*T tokens, no h[33]
// and up), 3 (a position per process, no optimizer: AdamW), 2 (no checksums either), 1 (no loss scale
// either). Their data positions name an order this version does not have: train_state_restore
// continues the stream where this version's run would be at their step, with a note.
//
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../adamw8.h"
#include "../optimizer.h"
#include "../utils.h"
#include "checksum.h"
#include "model_file.h"

constexpr int32_t STATE_MAGIC = 20261121;
constexpr int32_t STATE_VERSION = 5;  // 4 with a position in B*T-token units, 3 with a per-process one and
                                      // without the optimizer (AdamW), 2 without checksums, 1 without the loss scale

// The kinds of extra sections (h[40..]); reserved for the work that adds them.
enum StateSectionKind : int32_t {
    STATE_SECTION_FP8_SCALES = 1,      // FP8 training's per-tensor scaling state (issue 48)
    STATE_SECTION_ERROR_FEEDBACK = 2,  // compressed communication's residuals (issue 49)
    STATE_SECTION_POWERSGD = 3,        // PowerSGD's factors Q, its warm start (issue 49)
    STATE_SECTION_LOCAL_STEPS = 4,     // local steps' parameters, anchor and outer momentum (issue 49)
    STATE_SECTION_MATMUL_CHOICES = 5,  // the cuBLASLt algorithms -at 1 chose (llmc/matmul_choices.cuh; issue 52)
    STATE_SECTION_SIGN_ESTIMATES = 6,  // -gc sign's h_p and H (llmc/parallel/grad_compression.h; issue 49)
    STATE_SECTION_TEST = 999,          // written by the tests only
};
constexpr int STATE_MAX_SECTIONS = 5;
constexpr int32_t STATE_SECTION_REQUIRED = 1;  // flag: refuse the file if the kind is unknown

struct StateSection {
    int32_t kind = 0;
    int32_t flags = 0;
    std::vector<uint8_t> bytes;
};

inline const char* state_section_name(int32_t kind) {
    switch (kind) {
        case STATE_SECTION_FP8_SCALES: return "FP8 scaling state";
        case STATE_SECTION_ERROR_FEEDBACK: return "error-feedback residuals";
        case STATE_SECTION_POWERSGD: return "PowerSGD's factors";
        case STATE_SECTION_LOCAL_STEPS: return "local steps' state";
        case STATE_SECTION_MATMUL_CHOICES: return "matmul algorithms";
        case STATE_SECTION_SIGN_ESTIMATES: return "sign-compression estimates";
        case STATE_SECTION_TEST: return "test section";
        default: return nullptr;
    }
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
    // sample data_sample of epoch data_epoch, whose stream had data_epoch_samples samples. From a file
    // of version 4 or older these are 0: train_state_restore places such a run by its step.
    int64_t data_epoch = 0, data_sample = 0, data_epoch_samples = 0;
    uint64_t data_fingerprint = 0;  // of the training data (dataloader.h); 0: not known
    uint64_t sampler_rng = 0;
    int64_t num_parameters = 0;
    int64_t shard_offset = 0;   // this rank's optimizer shard: parameters [offset, offset + length)
    int64_t shard_length = 0;
    int32_t optimizer = OPT_ADAMW;  // which optimizer's moments m and v hold (llmc/optimizer.h)
    std::vector<float> m, v;    // (shard_length); m empty for Adafactor (no first moment), both for adamw8
    Adamw8State moments8;       // -opt adamw8: the shard's codes and its blocks' maxima (encoding 1)
    std::vector<float> master;  // (shard_length) or empty
    // skipped steps and loss scaling (llmc/run/loss_scaler.h): S is 1 in a run without scaling; read from a
    // version-1 file, which has none, it is 0 (the resumed run keeps its initial S)
    float loss_scale = 1.0f;
    int32_t clean_steps = 0, consecutive_skipped = 0;
    int64_t skipped_total = 0, updates = 0;
    // the data-parallel processes among num_processes (fewer with tensor or pipeline parallelism): the
    // data position is per data-parallel rank; 0 means num_processes
    int32_t data_processes = 0;
    bool loss_scale_dynamic = false;  // S above is a dynamic loss scale (the FP16 build)
    std::vector<StateSection> sections;  // extra sections (see the top), in file order
};

// Adafactor keeps no first moment: its files have v (and master) only. 8-bit AdamW's are encoded.
inline bool state_has_first_moment(int optimizer) { return optimizer != OPT_ADAFACTOR && optimizer != OPT_ADAMW8; }
inline bool state_has_fp32_v(int optimizer) { return optimizer != OPT_ADAMW8; }

// Encoding 1's payload: the codes of `length` elements and the maxima of `blocks` blocks.
inline int64_t state_moments8_bytes(int64_t length, int64_t blocks) { return 2 * length + 2 * (int64_t)sizeof(float) * blocks; }

// What m and v hold, for messages: "AdamW m", "Muon and AdamW m", "Adafactor v", ...
inline std::string state_moment_name(int optimizer, char moment) {
    const char* owner = optimizer == OPT_MUON && moment == 'm' ? "Muon and AdamW" : optimizer == OPT_ADAFACTOR ? "Adafactor" : "AdamW";
    return std::string(owner) + " " + moment;
}

// The states no run reaches, refused in any state file (ours, llm.c's) read or written: non-finite
// moments or master weights, a negative second moment. `of` ends each vector's name in the message
// (" of optimizer state file 'PATH'").
inline void require_valid_optimizer_state(const std::vector<float>& m, const std::vector<float>& v,
                                          const std::vector<float>& master, const char* action, const std::string& m_name,
                                          const std::string& v_name, const std::string& of) {
    require_finite(m.data(), m.size(), action, m_name + of);
    require_finite(v.data(), v.size(), action, v_name + of);
    require_non_negative(v.data(), v.size(), action, v_name + of);
    require_finite(master.data(), master.size(), action, "master weights" + of);
}

// The same for 8-bit AdamW's state: finite, non-negative block maxima (the codes are any bytes but -128,
// which no encoding writes).
inline void require_valid_moments8(const Adamw8State& q, const char* action, const std::string& of) {
    require_finite(q.m_max.data(), q.m_max.size(), action, "8-bit AdamW's max |m| of blocks" + of);
    require_non_negative(q.m_max.data(), q.m_max.size(), action, "8-bit AdamW's max |m| of blocks" + of);
    require_finite(q.v_max.data(), q.v_max.size(), action, "8-bit AdamW's max v of blocks" + of);
    require_non_negative(q.v_max.data(), q.v_max.size(), action, "8-bit AdamW's max v of blocks" + of);
    for (int8_t c : q.m) {
        if (c == -128) fatal("%s 8-bit AdamW's m codes%s: code -128, which the encoding never writes (corrupt?)", action, of.c_str());
    }
}

// Bytes of the extra sections together.
inline int64_t state_sections_bytes(const std::vector<StateSection>& sections) {
    int64_t total = 0;
    for (const StateSection& section : sections) total += (int64_t)section.bytes.size();
    return total;
}

inline void state_file_write(const std::string& path, const TrainState& s) {
    bool has_m = state_has_first_moment(s.optimizer), has_v = state_has_fp32_v(s.optimizer);
    const Adamw8State& q = s.moments8;
    const size_t blocks = q.block_end - q.block_begin;
    if ((int64_t)s.m.size() != (has_m ? s.shard_length : 0) || (int64_t)s.v.size() != (has_v ? s.shard_length : 0) ||
        (!has_v && ((int64_t)q.m.size() != s.shard_length || (int64_t)q.v.size() != s.shard_length ||
                    q.m_max.size() != blocks || q.v_max.size() != blocks || (int64_t)q.begin != s.shard_offset)) ||
        (!s.master.empty() && (int64_t)s.master.size() != s.shard_length)) {
        fatal("state_file_write: optimizer buffers do not match the shard length %ld", (long)s.shard_length);
    }
    if ((int)s.sections.size() > STATE_MAX_SECTIONS) {
        fatal("state_file_write: %zu extra sections, more than the %d a state file holds", s.sections.size(),
              STATE_MAX_SECTIONS);
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
    int64_t wide[8] = {s.step, s.data_epoch, s.data_sample, s.data_epoch_samples, (int64_t)s.sampler_rng,
                       s.num_parameters, s.shard_offset, s.shard_length};
    memcpy(&header[8], wide, sizeof(wide));
    memcpy(&header[24], &s.loss_scale, sizeof(float));
    header[25] = s.clean_steps;
    header[26] = s.consecutive_skipped;
    header[27] = s.data_processes;
    int64_t counts[2] = {s.skipped_total, s.updates};
    memcpy(&header[28], counts, sizeof(counts));
    header[32] = s.optimizer;
    header[33] = s.loss_scale_dynamic ? 1 : 0;
    memcpy(&header[34], &s.data_fingerprint, sizeof(uint64_t));
    header[36] = has_v ? 0 : 1;  // m and v in fp32, or 8-bit codes in blocks
    if (!has_v) {
        header[37] = (int32_t)blocks;
        int64_t first_block = (int64_t)q.block_begin;
        memcpy(&header[38], &first_block, sizeof(first_block));
    }
    header[40] = (int32_t)s.sections.size();
    for (size_t i = 0; i < s.sections.size(); i++) {
        header[41 + 4 * i] = s.sections[i].kind;
        header[42 + 4 * i] = s.sections[i].flags;
        int64_t length = (int64_t)s.sections[i].bytes.size();
        memcpy(&header[43 + 4 * i], &length, sizeof(length));
    }
    require_valid_optimizer_state(s.m, s.v, s.master, "writing", state_moment_name(s.optimizer, 'm'),
                                  state_moment_name(s.optimizer, 'v'), " of '" + path + "'");
    require_valid_moments8(q, "writing", " of '" + path + "'");
    size_t bytes = sizeof(float) * (size_t)s.shard_length;
    AtomicFile f = atomic_open(path);
    int arrays = (has_m ? 1 : 0) + (has_v ? 1 : 0) + (s.master.empty() ? 0 : 1);
    int64_t moments8 = has_v ? 0 : state_moments8_bytes(s.shard_length, (int64_t)blocks);
    BlockChecksums sums = checksummed_write_begin(&f, header, (int64_t)bytes * arrays + moments8 + state_sections_bytes(s.sections),
                                                  "optimizer state file");
    if (has_m) checksummed_write(&f, &sums, s.m.data(), bytes);
    if (has_v) {
        checksummed_write(&f, &sums, s.v.data(), bytes);
    } else {
        checksummed_write(&f, &sums, q.m.data(), q.m.size());
        checksummed_write(&f, &sums, q.m_max.data(), blocks * sizeof(float));
        checksummed_write(&f, &sums, q.v.data(), q.v.size());
        checksummed_write(&f, &sums, q.v_max.data(), blocks * sizeof(float));
    }
    if (!s.master.empty()) checksummed_write(&f, &sums, s.master.data(), bytes);
    for (const StateSection& section : s.sections) {
        checksummed_write(&f, &sums, section.bytes.data(), section.bytes.size());
    }
    checksummed_write_end(&f, &sums, header);
    atomic_commit(&f);
}

inline void state_file_read(const std::string& path, TrainState* s) {
    const char* what = "optimizer state file";
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    static const int32_t versions[] = {1, 2, 3, 4, STATE_VERSION};
    read_file_header(fp, path.c_str(), what, STATE_MAGIC, versions, 5, header);
    verify_header_checksum(header, path, what);  // before any field is believed
    int version = header[1];
    s->version = version;
    s->num_processes = header[2];
    s->rank = header[3];
    s->B = header[4];
    s->T = header[5];
    s->grad_accum_steps = header[6];
    int has_master = header[7];
    int64_t wide[8];
    memcpy(wide, &header[8], sizeof(wide));
    s->step = wide[0];
    s->data_epoch = s->data_sample = s->data_epoch_samples = 0;  // older positions: see train_state_restore
    s->data_fingerprint = 0;
    if (version >= 5) {
        s->data_epoch = wide[1];
        s->data_sample = wide[2];
        s->data_epoch_samples = wide[3];
        memcpy(&s->data_fingerprint, &header[34], sizeof(uint64_t));
    }
    s->sampler_rng = (uint64_t)wide[4];
    s->num_parameters = wide[5];
    s->shard_offset = wide[6];
    s->shard_length = wide[7];
    if (version >= 2) {
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
    s->optimizer = version >= 4 ? header[32] : OPT_ADAMW;
    // Before version 5 a file did not say whether S was dynamic: a run without scaling wrote S = 1, so any
    // other S was (a dynamic S reaches exactly 1 only after 16 halvings from 65536).
    s->loss_scale_dynamic = version >= 5 ? header[33] == 1 : (version >= 2 && s->loss_scale != 1.0f);
    int sections = version >= 5 ? header[40] : 0;
    if (s->num_processes < 1 || s->rank < 0 || s->rank >= s->num_processes || s->B < 1 || s->T < 1 ||
        s->grad_accum_steps < 1 || s->data_processes < 1 || s->data_processes > s->num_processes ||
        s->optimizer < OPT_ADAMW || s->optimizer > OPT_ADAMW8 ||
        (has_master != 0 && has_master != 1) || s->step < 0 || s->data_epoch < 0 || s->data_sample < 0 ||
        (version >= 5 && (s->data_sample >= s->data_epoch_samples || (header[33] != 0 && header[33] != 1))) ||
        sections < 0 || sections > STATE_MAX_SECTIONS || s->num_parameters < 1 ||
        s->num_parameters > ((int64_t)1 << 40) ||  // bounds the sizes below, so no byte count can overflow
        s->shard_offset < 0 || s->shard_length < 0 || s->shard_offset > s->num_parameters + s->num_processes ||
        s->shard_length > s->num_parameters + s->num_processes ||
        s->shard_offset + s->shard_length > s->num_parameters + s->num_processes) {
        fatal("%s '%s' has an inconsistent header (corrupt?)", what, path.c_str());
    }
    const int encoding = version >= 5 ? header[36] : 0;
    if (encoding != 0 && encoding != 1) {
        fatal("%s '%s' stores its moments in encoding %d, which this program does not read (written by a newer "
              "version?)", what, path.c_str(), header[36]);
    }
    int64_t first_block = 0, blocks = 0;
    if (encoding == 1) {
        memcpy(&first_block, &header[38], sizeof(first_block));
        blocks = header[37];
    }
    // 8-bit AdamW's moments are encoding 1's, and only its; at most one block per element, plus the two cut ones
    if ((encoding == 1) != (s->optimizer == OPT_ADAMW8) || blocks < 0 || first_block < 0 ||
        first_block > s->num_parameters || blocks > s->shard_length + 2) {
        fatal("%s '%s' has an inconsistent header (corrupt?): optimizer %d with moments in encoding %d", what,
              path.c_str(), s->optimizer, encoding);
    }
    if (version >= 2 && (!(s->loss_scale > 0.0f) || !std::isfinite(s->loss_scale) || s->clean_steps < 0 ||
                         s->consecutive_skipped < 0 || s->skipped_total < 0 || s->updates < 0 || s->updates > s->step ||
                         s->skipped_total > s->step - s->updates)) {
        fatal("%s '%s' has an inconsistent loss scale or step counts (corrupt?)", what, path.c_str());
    }
    s->sections.assign(sections, StateSection());
    int64_t section_bytes = 0, sections_length[STATE_MAX_SECTIONS] = {};
    for (int i = 0; i < sections; i++) {
        StateSection& section = s->sections[i];
        section.kind = header[41 + 4 * i];
        section.flags = header[42 + 4 * i];
        int64_t length;
        memcpy(&length, &header[43 + 4 * i], sizeof(length));
        if (length < 0 || length > ((int64_t)1 << 40)) {
            fatal("%s '%s' has an inconsistent header (corrupt?): section %d claims %ld bytes", what, path.c_str(),
                  i, (long)length);
        }
        if (!state_section_name(section.kind) && (section.flags & STATE_SECTION_REQUIRED)) {
            fatal("%s '%s' holds state of kind %d, which this program does not know and the file says it must "
                  "(written by a newer version: resume with it)", what, path.c_str(), section.kind);
        }
        section_bytes += length;
        sections_length[i] = length;
    }
    bool has_m = state_has_first_moment(s->optimizer), has_v = state_has_fp32_v(s->optimizer);
    long expected = HEADER_BYTES + (long)sizeof(float) * s->shard_length * ((has_m ? 1 : 0) + (has_v ? 1 : 0) + has_master) +
                    (long)state_moments8_bytes(encoding == 1 ? s->shard_length : 0, blocks) + (long)section_bytes;
    expect_file_size(fp, path.c_str(), what, expected);  // before anything is allocated for the payload
    for (int i = 0; i < sections; i++) s->sections[i].bytes.resize((size_t)sections_length[i]);
    BlockChecksums sums = checksums_from_header(header, path, what, expected - HEADER_BYTES, version >= 3);
    size_t bytes = sizeof(float) * (size_t)s->shard_length;
    s->m.resize(has_m ? s->shard_length : 0);
    s->v.resize(has_v ? s->shard_length : 0);
    if (has_m) checksummed_read(fp, &sums, s->m.data(), bytes);
    Adamw8State& q = s->moments8;
    q = Adamw8State();
    if (has_v) {
        checksummed_read(fp, &sums, s->v.data(), bytes);
    } else {
        q.begin = (size_t)s->shard_offset;
        q.end = (size_t)(s->shard_offset + s->shard_length);
        q.block_begin = (size_t)first_block;
        q.block_end = (size_t)(first_block + blocks);
        q.m.resize((size_t)s->shard_length);
        q.v.resize((size_t)s->shard_length);
        q.m_max.resize((size_t)blocks);
        q.v_max.resize((size_t)blocks);
        checksummed_read(fp, &sums, q.m.data(), q.m.size());
        checksummed_read(fp, &sums, q.m_max.data(), q.m_max.size() * sizeof(float));
        checksummed_read(fp, &sums, q.v.data(), q.v.size());
        checksummed_read(fp, &sums, q.v_max.data(), q.v_max.size() * sizeof(float));
    }
    s->master.clear();
    if (has_master) {
        s->master.resize(s->shard_length);
        checksummed_read(fp, &sums, s->master.data(), bytes);
    }
    for (StateSection& section : s->sections) checksummed_read(fp, &sums, section.bytes.data(), section.bytes.size());
    fcloseCheck(fp);
    require_valid_optimizer_state(s->m, s->v, s->master, "reading", state_moment_name(s->optimizer, 'm'),
                                  state_moment_name(s->optimizer, 'v'), std::string(" of ") + what + " '" + path + "'");
    require_valid_moments8(q, "reading", std::string(" of ") + what + " '" + path + "'");
}
