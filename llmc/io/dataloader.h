// Data loader over token shards (../shared/FORMATS.md): files of uint16 token ids found by a glob.
//
// The stream. A shard of N tokens holds S = (N - 1) / T samples of T tokens: sample i starts at token
// i*T and spans T+1 tokens (inputs are the first T, targets the last T). The samples of all shards,
// epoch after epoch, make one stream, fixed by the data and the seed alone, whatever B, the process
// count or the card:
//   epoch e reads its shards in one order and each shard's S samples in one order;
//   unshuffled, both orders are the identity: shards in glob order, samples in order;
//   shuffled, one mt19937 seeded with 42 draws each epoch's shard order when the epoch begins and each
//   shard's sample order when the stream reaches the shard (rand.h's Fisher-Yates).
// The batches. With P data-parallel processes and B rows, global micro-step k reads the B*P samples
// k*B*P .. k*B*P + B*P - 1 of the stream, rank r the B samples from k*B*P + r*B, one per row. A step of
// A micro-steps therefore reads samples s*N .. s*N + N - 1 of the stream, N = B*A*P = tokens per step /
// T, however N is split into B, A and P: any layout trains on the same samples at every step as one
// process does (its rows in another order, which changes only the order of the sums). A row's B
// samples may come from two shards, or two epochs. The position in the stream (DataPosition, the same
// on every rank) is what a checkpoint saves, so a run resumes with another B, process count or card and
// continues the same stream (doc/data_parallel.md).
// Deviations from FORMATS.md, so that the order depends on the data alone: FORMATS gives rank r the
// B*T tokens at i*P*B*T + r*B*T of a shard as its i-th batch, which leaves out the S mod (B*P) samples
// at every shard's end, and seeds the shuffle with 42 + rank. Here no sample is left out; unshuffled,
// with one process and a B that divides every shard's S, the two layouts are the same token for token.
//
// API:
//   dataloader_init(&loader, pattern, B, T, rank, num_processes, shuffle, vocab_size)
//   dataloader_next_batch(&loader)        fills loader.inputs / loader.targets (B*T each) and advances
//   dataloader_reset(&loader)             back to the first batch of epoch 0
//   loader.position / dataloader_seek()   where the next global micro-step starts; seek replays the shuffles
//   dataloader_epoch_samples(&loader)     T-token samples in one epoch (all shards)
//   loader.fingerprint                    the data set's lengths and a sample of its bytes, hashed
// Every shard's header and size are checked at init; its tokens are checked against vocab_size when
// it is loaded, before any of them can index an embedding.
#pragma once

#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../rand.h"
#include "../utils.h"
#include "checksum.h"

constexpr int32_t SHARD_MAGIC = 20240520;
constexpr int32_t SHARD_VERSION = 1;

// A place in the stream, the same on every rank: the next global micro-step starts at sample `sample`
// of epoch `epoch` (0 <= sample < the epoch's samples). Saved in the state file, so a resumed run, with
// any B and process count, reads the samples the uninterrupted run would have.
struct DataPosition {
    int64_t epoch = 0;
    int64_t sample = 0;
};

// Where this rank reads next: the sample_index-th sample (in the shard's sample order) of the
// shard_index-th shard (in the epoch's shard order) of epoch `epoch`.
struct StreamCursor {
    int64_t epoch = 0;
    int64_t shard_index = 0;
    int64_t sample_index = 0;
};

struct DataLoader {
    // configuration
    int B = 0, T = 0;
    int process_rank = 0, num_processes = 1;
    bool shuffle = false;
    int vocab_size = 0;
    std::vector<std::string> files;
    std::vector<int64_t> file_tokens;  // token count of each file
    std::vector<uint32_t> file_prints; // shard_fingerprint of each file
    int64_t epoch_samples = 0;         // samples of all files
    uint64_t fingerprint = 0;          // dataloader_fingerprint of the files
    // state
    DataPosition position;
    StreamCursor cursor;
    std::mt19937 rng;                   // draws the orders up to the cursor's shard
    std::vector<int> shard_order;       // permutation of file indices for the cursor's epoch
    std::vector<int64_t> sample_order;  // permutation of the cursor's shard's samples
    int loaded_file = -1;               // file index whose tokens are in `tokens`
    std::vector<uint16_t> tokens;       // the shard read last
    // output of dataloader_next_batch
    std::vector<int> inputs;   // (B, T)
    std::vector<int> targets;  // (B, T)
};

// Paths matching `pattern`, sorted; an error if none does.
inline std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t result;
    int rc = glob(pattern.c_str(), 0, nullptr, &result);
    if (rc == GLOB_NOMATCH) {
        fatal("no file matches '%s' (prepare the data first, e.g. dev/data/tinyshakespeare.sh, or point -i/-j at "
              "your shards)", pattern.c_str());
    }
    if (rc != 0) fatal("could not expand '%s' (glob error %d)", pattern.c_str(), rc);
    std::vector<std::string> paths(result.gl_pathv, result.gl_pathv + result.gl_pathc);
    globfree(&result);
    return paths;  // glob() sorts by default
}

// Opens a shard, checks its header and exact size, and returns its token count; leaves fp after the header.
inline int64_t shard_open(const std::string& path, FILE** fp_out) {
    const char* what = "data shard";
    FILE* fp = fopenCheck(path.c_str(), "rb");
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, SHARD_MAGIC, &SHARD_VERSION, 1, header);
    if (header[2] < 0) fatal("%s '%s' claims %d tokens", what, path.c_str(), header[2]);
    int64_t num_tokens = header[2];
    expect_file_size(fp, path.c_str(), what, HEADER_BYTES + 2 * num_tokens);
    *fp_out = fp;
    return num_tokens;
}

// A cheap fingerprint of one shard's contents: the CRC-32 of its token count and of up to 16 blocks of
// 4 KiB of its tokens, spread evenly over the file (all of a file up to 64 KiB). Two copies of a data set
// that differ in a length, or in tokens that the blocks cover, differ here; reading it costs 64 KiB a shard.
inline uint32_t shard_fingerprint(FILE* fp, int64_t num_tokens) {
    uint32_t crc = crc32_update(0, &num_tokens, sizeof(num_tokens));
    const int64_t block = 2048, blocks = 16;  // tokens
    std::vector<uint16_t> buffer(block);
    for (int64_t i = 0; i < blocks; i++) {
        int64_t begin = num_tokens <= block * blocks ? i * block : (num_tokens - block) * i / (blocks - 1);
        if (begin >= num_tokens) break;
        int64_t count = std::min(block, num_tokens - begin);
        fseekCheck(fp, HEADER_BYTES + 2 * begin, SEEK_SET);
        freadCheck(buffer.data(), sizeof(uint16_t), (size_t)count, fp);
        crc = crc32_update(crc, buffer.data(), sizeof(uint16_t) * (size_t)count);
    }
    return crc;
}

inline int64_t shard_num_tokens(const std::string& path, uint32_t* fingerprint = nullptr) {
    FILE* fp;
    int64_t n = shard_open(path, &fp);
    if (fingerprint) *fingerprint = shard_fingerprint(fp, n);
    fcloseCheck(fp);
    return n;
}

// Writes a shard atomically (used by the tokenizer tool and the tests).
inline void shard_write(const std::string& path, const uint16_t* tokens, int64_t num_tokens) {
    if (num_tokens > INT32_MAX) fatal("shard '%s': %ld tokens do not fit the header", path.c_str(), (long)num_tokens);
    int32_t header[HEADER_INTS] = {0};
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)num_tokens;
    AtomicFile f = atomic_open(path);
    atomic_write(&f, header, HEADER_BYTES);
    atomic_write(&f, tokens, sizeof(uint16_t) * (size_t)num_tokens);
    atomic_commit(&f);
}

// Samples of T tokens in file `file` (each needs one more token for its last target).
inline int64_t dataloader_samples_in_file(const DataLoader* loader, int file) {
    return (loader->file_tokens[file] - 1) / loader->T;
}

// Samples in one epoch of the stream: all shards.
inline int64_t dataloader_epoch_samples(const DataLoader* loader) {
    return loader->epoch_samples;
}

// Reads file `file` into loader->tokens and checks every token id.
inline void dataloader_load_file(DataLoader* loader, int file) {
    if (loader->loaded_file == file) return;
    const std::string& path = loader->files[file];
    FILE* fp;
    int64_t n = shard_open(path, &fp);
    loader->tokens.resize(n);
    freadCheck(loader->tokens.data(), sizeof(uint16_t), n, fp);
    fcloseCheck(fp);
    for (int64_t i = 0; i < n; i++) {
        if (loader->tokens[i] >= loader->vocab_size) {
            fatal("data shard '%s': token %u at offset %ld (token index, counting from 0) is not below the "
                  "model's vocab size %d", path.c_str(), loader->tokens[i], (long)i, loader->vocab_size);
        }
    }
    loader->loaded_file = file;
}

// Draws the sample order of the cursor's shard (consumes the rng when shuffling).
inline void dataloader_begin_shard(DataLoader* loader) {
    int file = loader->shard_order[loader->cursor.shard_index];
    int64_t n = dataloader_samples_in_file(loader, file);
    loader->sample_order.resize(n);
    if (loader->shuffle) {
        random_permutation<int64_t>(loader->sample_order.data(), n, loader->rng);
    } else {
        for (int64_t i = 0; i < n; i++) loader->sample_order[i] = i;
    }
}

// Draws the shard order of the cursor's epoch (consumes the rng when shuffling).
inline void dataloader_begin_epoch(DataLoader* loader) {
    int num_files = (int)loader->files.size();
    loader->shard_order.resize(num_files);
    if (loader->shuffle) {
        random_permutation<int>(loader->shard_order.data(), num_files, loader->rng);
    } else {
        for (int i = 0; i < num_files; i++) loader->shard_order[i] = i;
    }
}

// Moves the cursor n samples down the stream, through as many shards and epochs as that takes. Every
// shard it reaches draws its sample order, even one it steps over, so the rng is where the stream's
// definition has it, on every rank. Only counts are needed, no tokens are read.
inline void dataloader_advance_cursor(DataLoader* loader, int64_t n) {
    StreamCursor* c = &loader->cursor;
    c->sample_index += n;
    while (c->sample_index >= (int64_t)loader->sample_order.size()) {
        c->sample_index -= (int64_t)loader->sample_order.size();
        c->shard_index++;
        if (c->shard_index == (int64_t)loader->files.size()) {
            c->shard_index = 0;
            c->epoch++;
            dataloader_begin_epoch(loader);
        }
        dataloader_begin_shard(loader);
    }
}

// Puts the cursor at sample `index` of the stream, counted from the start of epoch 0 (replays the draws
// from the seed).
inline void dataloader_cursor_to(DataLoader* loader, int64_t index) {
    loader->rng.seed(42);  // the same on every rank: the ranks deal out one stream (see the top)
    loader->cursor = StreamCursor();
    dataloader_begin_epoch(loader);
    dataloader_begin_shard(loader);
    dataloader_advance_cursor(loader, index);
}

// This rank's first sample of the global micro-step that starts at `position`.
inline int64_t dataloader_rank_start(const DataLoader* loader, const DataPosition& position) {
    return position.epoch * loader->epoch_samples + position.sample + (int64_t)loader->process_rank * loader->B;
}

inline void dataloader_reset(DataLoader* loader) {
    loader->position = DataPosition();
    dataloader_cursor_to(loader, dataloader_rank_start(loader, loader->position));
}

inline void dataloader_init(DataLoader* loader, const std::string& pattern, int B, int T, int process_rank,
                            int num_processes, bool shuffle, int vocab_size) {
    loader->B = B;
    loader->T = T;
    loader->process_rank = process_rank;
    loader->num_processes = num_processes;
    loader->shuffle = shuffle;
    loader->vocab_size = vocab_size;
    loader->files = glob_files(pattern);
    loader->file_tokens.clear();
    loader->file_prints.clear();
    loader->epoch_samples = 0;
    uint32_t fingerprint = crc32_update(0, &T, sizeof(T));
    for (const std::string& path : loader->files) {
        uint32_t shard_print = 0;
        int64_t n = shard_num_tokens(path, &shard_print);
        if (n < T + 1) {  // a shard that adds nothing to the stream is a mistake, not a silent no-op
            fatal("data shard '%s' has %ld tokens, fewer than the %d one sample needs (T=%d, plus one)", path.c_str(),
                  (long)n, T + 1, T);
        }
        loader->file_tokens.push_back(n);
        loader->file_prints.push_back(shard_print);
        loader->epoch_samples += (n - 1) / T;
        fingerprint = crc32_update(fingerprint, &shard_print, sizeof(shard_print));
    }
    // 64 bits: the shard count and total length beside the CRC, so a fingerprint is never 0
    loader->fingerprint = ((uint64_t)(loader->files.size() & 0xffff) << 48 |
                           (uint64_t)(loader->epoch_samples & 0xffff) << 32 | fingerprint) | ((uint64_t)1 << 63);
    loader->inputs.assign((size_t)B * T, 0);
    loader->targets.assign((size_t)B * T, 0);
    loader->loaded_file = -1;
    dataloader_reset(loader);
}

// Reads this rank's B samples of the next global micro-step (one per row), then moves on by one
// micro-step: the cursor past the other ranks' samples, the position B*P samples.
inline void dataloader_next_batch(DataLoader* loader) {
    size_t T = (size_t)loader->T;
    for (int b = 0; b < loader->B; b++) {
        dataloader_load_file(loader, loader->shard_order[loader->cursor.shard_index]);
        int64_t sample = loader->sample_order[loader->cursor.sample_index];
        const uint16_t* span = loader->tokens.data() + sample * (int64_t)T;  // T + 1 tokens, inside the shard
        for (size_t i = 0; i < T; i++) {
            loader->inputs[b * T + i] = span[i];
            loader->targets[b * T + i] = span[i + 1];
        }
        dataloader_advance_cursor(loader, 1);
    }
    int64_t step = (int64_t)loader->B * loader->num_processes;
    dataloader_advance_cursor(loader, step - loader->B);
    loader->position.sample += step;
    while (loader->position.sample >= loader->epoch_samples) {
        loader->position.sample -= loader->epoch_samples;
        loader->position.epoch++;
    }
}

// Puts the loader at `target` (for this rank: target plus process_rank*B samples), replaying the
// shuffles from the seed (cheap: only counts are needed, no tokens are read), so the batches that follow
// are those an uninterrupted run would read, whatever its B and process count.
inline void dataloader_seek(DataLoader* loader, const DataPosition& target) {
    if (target.epoch < 0 || target.epoch > INT64_MAX / 4 / loader->epoch_samples || target.sample < 0 ||
        target.sample >= loader->epoch_samples) {
        fatal("data position (epoch %ld, sample %ld) is outside this data set, whose epochs have %ld samples of "
              "T=%d tokens; the data set changed since the checkpoint", (long)target.epoch, (long)target.sample,
              (long)loader->epoch_samples, loader->T);
    }
    dataloader_cursor_to(loader, dataloader_rank_start(loader, target));
    loader->position = target;
}

// The position `samples` samples from the start of the stream (epoch 0, sample 0).
inline DataPosition dataloader_position_at(const DataLoader* loader, int64_t samples) {
    return DataPosition{samples / loader->epoch_samples, samples % loader->epoch_samples};
}
