// llm.c's optimizer state files, read and written, so that a run moves between llm.c's CUDA trainer and
// this project both ways: `-y 1` continues an llm.c run from its output directory, and `-cf llmc` writes
// checkpoints that llm.c's `-y 1` continues (doc/reliability.md, "Runs that move to and from llm.c").
// The model files and the checkpoint directory's names (model_S.bin, state_S_RANK.bin, DONE_S) are
// already the same in both; only the state file differs.
//
// The format (llm.c's train_gpt2.cu, save_state and load_state), little-endian:
//   256 int32: h[0] magic 20240527   h[1] version 1   h[2] processes   h[3] rank
//              h[4] 1 when fp32 master weights follow   h[5] 1 when its loader shuffled
//              h[10] step (updates done)   h[20..21], h[22..23] two uint64: its stochastic-rounding
//              generator, now and before the last update   h[30..31], h[32..33] two uint64: the loader's
//              shard and the batch in that shard, a batch being B*T*processes tokens (one global micro-batch)
//   fp32, for the process's shard of the parameters: m, v, and with h[4] the master weights. The shard is
//              all N parameters, or with llm.c's ZeRO-1 the N/processes from rank*N/processes; the header
//              does not say which: the file's size does.
//   with h[5]: uint64 shard count, int32 shard order, uint64 batches in the shard, int32 batch order, then
//              its mt19937's state (2520 bytes).
// It has no checksums, and does not record B, T, the tokens per step, a loss scale or which data it read.
//
// The data position. llm.c's loader reads, unshuffled, the same samples as this project's stream (sample
// i of a shard = its T+1 tokens from i*T; rank r of P reads B of them from k*B*P + r*B) as long as every
// shard holds a multiple of B*P samples: llm.c leaves out the S mod (B*P) samples at a shard's end, our
// stream does not (llmc/io/dataloader.h). Where the two agree the position moves across as it is; where
// they do not (a shuffled run on either side, shards of other lengths) the run continues from the step:
// ours where our stream would be after that many steps, llm.c where llm.c's own loader would be, with a
// note. llm.c's file does not record B: reading one, this run's B (and llm.c's process count) is taken.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../utils.h"
#include "dataloader.h"
#include "model_file.h"
#include "state_file.h"

constexpr int32_t LLMC_STATE_MAGIC = 20240527;
constexpr int32_t LLMC_STATE_VERSION = 1;
constexpr long LLMC_SHUFFLE_RNG_BYTES = 2520;  // llm.c's mt19937_state: uint64 seed, int, uint32, 624 + 2 uint32

struct LlmcState {
    int num_processes = 1, rank = 0;
    bool shuffled = false;
    int64_t step = 0;
    uint64_t rng = 0, rng_last_update = 0;
    int64_t shard = 0, batch = 0;          // the loader's shard, and the global micro-batch in it
    int64_t shard_offset = 0, shard_length = 0;  // this process's parameters [offset, offset + length)
    std::vector<float> m, v, master;       // (shard_length); master empty without h[4]
};

// True when `path` starts with llm.c's state magic (and is long enough to have a header).
inline bool llmc_state_file(const std::string& path) {
    FILE* fp = fopen(path.c_str(), "rb");
    if (!fp) return false;
    int32_t magic = 0;
    bool yes = fread(&magic, sizeof(magic), 1, fp) == 1 && magic == LLMC_STATE_MAGIC;
    fclose(fp);
    return yes;
}

// Reads llm.c's state file of a model with num_parameters parameters (its padded count, as in the model
// file). The shard's length is the one of N or N/processes that the file's size matches.
inline void llmc_state_read(const std::string& path, int64_t num_parameters, LlmcState* s) {
    const char* what = "llm.c state file";
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, LLMC_STATE_MAGIC, &LLMC_STATE_VERSION, 1, header);
    s->num_processes = header[2];
    s->rank = header[3];
    int has_master = header[4], shuffled = header[5];
    s->shuffled = shuffled == 1;
    s->step = header[10];
    memcpy(&s->rng, &header[20], sizeof(uint64_t));
    memcpy(&s->rng_last_update, &header[22], sizeof(uint64_t));
    uint64_t shard, batch;
    memcpy(&shard, &header[30], sizeof(uint64_t));
    memcpy(&batch, &header[32], sizeof(uint64_t));
    if (s->num_processes < 1 || s->rank < 0 || s->rank >= s->num_processes || (has_master != 0 && has_master != 1) ||
        (shuffled != 0 && shuffled != 1) || s->step < 0 || shard > ((uint64_t)1 << 40) || batch > ((uint64_t)1 << 40)) {
        fatal("%s '%s' has an inconsistent header (corrupt?)", what, path.c_str());
    }
    s->shard = (int64_t)shard;
    s->batch = (int64_t)batch;
    long size = file_size_of(fp);
    int arrays = 2 + has_master;
    // the candidate shard lengths: all parameters, or llm.c's ZeRO-1 share (when the processes divide them)
    std::vector<int64_t> lengths = {num_parameters};
    if (s->num_processes > 1 && num_parameters % s->num_processes == 0) lengths.push_back(num_parameters / s->num_processes);
    int64_t length = -1;
    for (int64_t L : lengths) {
        long end = HEADER_BYTES + 4L * L * arrays;
        if (!shuffled) {
            if (size == end) length = L;
            continue;
        }
        // the loader's orders follow: both counts must put the file's end exactly where it is
        uint64_t count = 0;
        if (end + 8 > size) continue;
        fseekCheck(fp, end, SEEK_SET);
        freadCheck(&count, sizeof(count), 1, fp);
        if (count > ((uint64_t)1 << 32) || end + 8 + 4 * (long)count + 8 > size) continue;
        long at = end + 8 + 4 * (long)count;
        fseekCheck(fp, at, SEEK_SET);
        uint64_t batches = 0;
        freadCheck(&batches, sizeof(batches), 1, fp);
        if (batches <= ((uint64_t)1 << 40) && at + 8 + 4 * (long)batches + LLMC_SHUFFLE_RNG_BYTES == size) length = L;
    }
    if (length < 0) {
        std::string expected;
        for (int64_t L : lengths) {
            expected += (expected.empty() ? "" : " or ") + std::to_string(HEADER_BYTES + 4L * L * arrays);
        }
        fatal("%s '%s' is %ld bytes: not the state of a model of %ld parameters (%d processes; expected %s bytes%s)", what,
              path.c_str(), size, (long)num_parameters, s->num_processes, expected.c_str(),
              shuffled ? " and the loader's orders" : "");
    }
    s->shard_length = length;
    s->shard_offset = length == num_parameters ? 0 : (int64_t)s->rank * length;
    size_t bytes = sizeof(float) * (size_t)length;
    fseekCheck(fp, HEADER_BYTES, SEEK_SET);
    s->m.resize(length);
    s->v.resize(length);
    freadCheck(s->m.data(), 1, bytes, fp);
    freadCheck(s->v.data(), 1, bytes, fp);
    s->master.clear();
    if (has_master) {
        s->master.resize(length);
        freadCheck(s->master.data(), 1, bytes, fp);
    }
    fcloseCheck(fp);
    require_valid_optimizer_state(s->m, s->v, s->master, "reading", "AdamW m", "AdamW v",
                                  std::string(" of ") + what + " '" + path + "'");
}

// Writes llm.c's state file: unshuffled (llm.c's loader continues in file order from shard, batch).
inline void llmc_state_write(const std::string& path, const LlmcState& s) {
    if ((int64_t)s.m.size() != s.shard_length || (int64_t)s.v.size() != s.shard_length ||
        (!s.master.empty() && (int64_t)s.master.size() != s.shard_length)) {
        fatal("llmc_state_write: optimizer buffers do not match the shard length %ld", (long)s.shard_length);
    }
    require_valid_optimizer_state(s.m, s.v, s.master, "writing", "AdamW m", "AdamW v", " of '" + path + "'");
    int32_t header[HEADER_INTS] = {0};
    header[0] = LLMC_STATE_MAGIC;
    header[1] = LLMC_STATE_VERSION;
    header[2] = s.num_processes;
    header[3] = s.rank;
    header[4] = s.master.empty() ? 0 : 1;
    header[5] = 0;
    header[10] = (int32_t)s.step;
    memcpy(&header[20], &s.rng, sizeof(uint64_t));
    memcpy(&header[22], &s.rng_last_update, sizeof(uint64_t));
    uint64_t shard = (uint64_t)s.shard, batch = (uint64_t)s.batch;
    memcpy(&header[30], &shard, sizeof(uint64_t));
    memcpy(&header[32], &batch, sizeof(uint64_t));
    size_t bytes = sizeof(float) * (size_t)s.shard_length;
    AtomicFile f = atomic_open(path);
    atomic_write(&f, header, sizeof(header));
    atomic_write(&f, s.m.data(), bytes);
    atomic_write(&f, s.v.data(), bytes);
    if (!s.master.empty()) atomic_write(&f, s.master.data(), bytes);
    atomic_commit(&f);
}

// ----------------------------------------------------------------------------
// the data position, between llm.c's (shard, batch) and this project's stream

// Samples of T tokens in one of llm.c's batches (a global micro-batch): B x processes.
inline int64_t llmc_batch_samples(const DataLoader& loader) { return (int64_t)loader.B * loader.num_processes; }

// Why llm.c's unshuffled loader with `processes` processes and this loader's B would not read this
// loader's stream sample for sample; empty when it would.
inline std::string llmc_stream_mismatch(const DataLoader& loader, int processes) {
    if (loader.shuffle) return "this run shuffles its samples (-sh 1), in an order llm.c does not have";
    if (processes != loader.num_processes) {
        return "llm.c's run had " + std::to_string(processes) + " processes, this one " +
               std::to_string(loader.num_processes) + " data-parallel processes";
    }
    int64_t per_batch = llmc_batch_samples(loader);
    for (size_t f = 0; f < loader.files.size(); f++) {
        int64_t samples = dataloader_samples_in_file(&loader, (int)f);
        if (samples % per_batch != 0) {
            return "shard '" + loader.files[f] + "' holds " + std::to_string(samples) + " samples of T=" +
                   std::to_string(loader.T) + " tokens, not a multiple of B*processes = " + std::to_string(per_batch) +
                   " (llm.c leaves the last " + std::to_string(samples % per_batch) + " out)";
        }
    }
    return "";
}

// True when llm.c's (shard, batch) is a place in this data: an existing shard, and a batch of it or its end
// (llm.c moves to the next shard only when it reads again).
inline bool llmc_position_in_data(const DataLoader& loader, int64_t shard, int64_t batch) {
    if (shard < 0 || shard >= (int64_t)loader.files.size() || batch < 0) return false;
    return batch <= dataloader_samples_in_file(&loader, (int)shard) / llmc_batch_samples(loader);
}

// The sample of an epoch of this stream where llm.c's (shard, batch) starts (llmc_stream_mismatch empty).
inline int64_t llmc_position_in_stream(const DataLoader& loader, int64_t shard, int64_t batch) {
    int64_t sample = 0;
    for (int64_t f = 0; f < shard && f < (int64_t)loader.files.size(); f++) sample += dataloader_samples_in_file(&loader, (int)f);
    sample += batch * llmc_batch_samples(loader);
    return sample % dataloader_epoch_samples(&loader);  // llm.c may stand at a shard's end: the next one's start
}

// llm.c's (shard, batch) for a sample of an epoch of this stream (llmc_stream_mismatch empty).
inline void llmc_position_of_sample(const DataLoader& loader, int64_t sample, int64_t* shard, int64_t* batch) {
    int64_t f = 0;
    while (f + 1 < (int64_t)loader.files.size() && sample >= dataloader_samples_in_file(&loader, (int)f)) {
        sample -= dataloader_samples_in_file(&loader, (int)f);
        f++;
    }
    *shard = f;
    *batch = sample / llmc_batch_samples(loader);
}

// Where llm.c's own unshuffled loader (this loader's B, T and processes) stands after `micro_steps` global
// micro-batches from the start: its shards hold floor(S / (B*P)) batches each.
inline void llmc_position_after(const DataLoader& loader, int64_t micro_steps, int64_t* shard, int64_t* batch) {
    int64_t per_batch = llmc_batch_samples(loader), epoch = 0;
    for (size_t f = 0; f < loader.files.size(); f++) epoch += dataloader_samples_in_file(&loader, (int)f) / per_batch;
    *shard = 0;
    *batch = 0;
    if (epoch == 0) return;  // llm.c refuses shards shorter than one batch
    int64_t left = micro_steps % epoch;
    for (size_t f = 0; f < loader.files.size(); f++) {
        int64_t batches = dataloader_samples_in_file(&loader, (int)f) / per_batch;
        if (left < batches) {
            *shard = (int64_t)f;
            *batch = left;
            return;
        }
        left -= batches;
    }
}

// ----------------------------------------------------------------------------
// this project's state as llm.c's

// One process's state file as llm.c's (-cf llmc): AdamW's m and v, the master weights (the caller gives the
// fp32 parameters where the run keeps none: llm.c's default -w 1 needs them, and with them llm.c continues
// from them whatever precision the model file has), the step, and the loader's place: the same samples where
// llm.c's loader reads this stream, else where llm.c's own loader would be after the same steps (a note
// from process 0, once).
inline LlmcState llmc_state_of(TrainState s, const DataLoader& loader, int grad_accum_steps) {
    LlmcState l;
    l.num_processes = s.num_processes;
    l.rank = s.rank;
    l.step = s.step;
    l.rng = l.rng_last_update = 13371337ull + (uint64_t)s.rank;  // llm.c's own start for its rounding generator
    l.shard_offset = s.shard_offset;
    l.shard_length = s.shard_length;
    l.m = std::move(s.m);
    l.v = std::move(s.v);
    l.master = std::move(s.master);
    std::string why = llmc_stream_mismatch(loader, loader.num_processes);
    if (why.empty()) {
        llmc_position_of_sample(loader, s.data_sample, &l.shard, &l.batch);
    } else {
        llmc_position_after(loader, s.step * (int64_t)grad_accum_steps, &l.shard, &l.batch);
        static bool noted = false;
        if (s.rank == 0 && !noted) {
            printf("checkpoint: -cf llmc: llm.c's loader does not read this stream (%s): its state files place it where "
                   "llm.c's own run would be after the same steps (at step %ld: shard %ld, batch %ld)\n", why.c_str(),
                   (long)s.step, (long)l.shard, (long)l.batch);
            noted = true;
        }
    }
    return l;
}
