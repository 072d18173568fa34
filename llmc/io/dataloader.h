// Data loader over token shards (../shared/FORMATS.md): files of uint16 token ids found by a glob.
//
// A shard of N tokens is cut into U = (N - 1) / (B*T) units of B*T tokens: unit u starts at token u*B*T
// and spans B*T+1 tokens (inputs are the first B*T, targets the last B*T). With P data-parallel
// processes, rank r's k-th sample of a shard is unit order[k*P + r], where `order` is a permutation of
// the shard's U units; a shard gives each rank U / P samples (= (N - 1) / (P*B*T)).
//   Unshuffled, order is the identity: sample k of rank r starts at token k*P*B*T + r*B*T, FORMATS's
//   layout, and shards go in glob order.
//   Shuffled, each epoch permutes the shard order and each shard visit permutes its U units, all from
//   one mt19937 seeded with 42, the same on every rank.
// Either way the units read at global micro-step k (one per rank) are order[k*P .. k*P + P), so P
// processes with A accumulation steps read the same B*T-token samples as 1 process with P*A steps:
// the batch of a step does not depend on the process layout (doc/model_parallel.md). (FORMATS.md seeds
// the shuffle with 42 + rank and permutes each rank's own samples; this deviation makes the shuffled
// order layout-independent, so a checkpoint can resume with another process count.)
//
// API:
//   dataloader_init(&loader, pattern, B, T, rank, num_processes, shuffle, vocab_size)
//   dataloader_next_batch(&loader)        fills loader.inputs / loader.targets (B*T each) and advances
//   dataloader_reset(&loader)             back to the first batch of epoch 0
//   loader.position / dataloader_seek()   where the next batch comes from; seek replays the shuffles
//   dataloader_num_batches(&loader)       batches in one epoch (all shards, this rank)
// Every shard's header and size are checked at init; its tokens are checked against vocab_size when
// it is loaded, before any of them can index an embedding.
#pragma once

#include <glob.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../rand.h"
#include "../utils.h"

constexpr int32_t SHARD_MAGIC = 20240520;
constexpr int32_t SHARD_VERSION = 1;

// Where the next batch comes from: shard_index-th shard of this epoch's order, this rank's
// sample_index-th sample of that shard (unit order[sample_index * P + rank]). Saved in the state file so a resumed run reads the batches it would have.
struct DataPosition {
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
    // state
    DataPosition position;
    std::mt19937 rng;
    std::vector<int> shard_order;       // permutation of file indices for this epoch
    std::vector<int64_t> sample_order;  // permutation of the current shard's B*T-token units
    int loaded_file = -1;               // file index whose tokens are in `tokens`
    std::vector<uint16_t> tokens;       // the current shard
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

inline int64_t shard_num_tokens(const std::string& path) {
    FILE* fp;
    int64_t n = shard_open(path, &fp);
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

// Units of B*T tokens in file `file` (each needs one more token for its last target).
inline int64_t dataloader_units_in_file(const DataLoader* loader, int file) {
    return (loader->file_tokens[file] - 1) / ((int64_t)loader->B * loader->T);
}

// Samples of one rank in file `file`: every rank gets the same count, U / P.
inline int64_t dataloader_samples_in_file(const DataLoader* loader, int file) {
    return dataloader_units_in_file(loader, file) / loader->num_processes;
}

// Batches in one epoch over all shards, for this rank.
inline int64_t dataloader_num_batches(const DataLoader* loader) {
    int64_t total = 0;
    for (size_t f = 0; f < loader->files.size(); f++) total += dataloader_samples_in_file(loader, (int)f);
    return total;
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

// Sets up the sample order for the shard at position.shard_index (consumes the rng when shuffling).
inline void dataloader_begin_shard(DataLoader* loader) {
    int file = loader->shard_order[loader->position.shard_index];
    int64_t n = dataloader_units_in_file(loader, file);
    loader->sample_order.resize(n);
    if (loader->shuffle) {
        random_permutation<int64_t>(loader->sample_order.data(), n, loader->rng);
    } else {
        for (int64_t i = 0; i < n; i++) loader->sample_order[i] = i;
    }
}

inline void dataloader_begin_epoch(DataLoader* loader) {
    int num_files = (int)loader->files.size();
    loader->shard_order.resize(num_files);
    if (loader->shuffle) {
        random_permutation<int>(loader->shard_order.data(), num_files, loader->rng);
    } else {
        for (int i = 0; i < num_files; i++) loader->shard_order[i] = i;
    }
}

inline void dataloader_reset(DataLoader* loader) {
    loader->rng.seed(42);  // the same on every rank: the ranks deal out one order (see the top)
    loader->position = DataPosition();
    dataloader_begin_epoch(loader);
    dataloader_begin_shard(loader);
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
    int64_t span = (int64_t)num_processes * B * T;
    for (const std::string& path : loader->files) {
        int64_t n = shard_num_tokens(path);
        if (n < span + 1) {
            fatal("data shard '%s' has %ld tokens, fewer than the %ld one batch needs (%d processes x B=%d x "
                  "T=%d, plus one)", path.c_str(), (long)n, (long)(span + 1), num_processes, B, T);
        }
        loader->file_tokens.push_back(n);
    }
    loader->inputs.assign((size_t)B * T, 0);
    loader->targets.assign((size_t)B * T, 0);
    loader->loaded_file = -1;
    dataloader_reset(loader);
}

// Moves to the next shard, and to the next epoch after the last shard.
inline void dataloader_advance_shard(DataLoader* loader) {
    loader->position.sample_index = 0;
    loader->position.shard_index++;
    if (loader->position.shard_index == (int64_t)loader->files.size()) {
        loader->position.shard_index = 0;
        loader->position.epoch++;
        dataloader_begin_epoch(loader);
    }
    dataloader_begin_shard(loader);
}

inline void dataloader_next_batch(DataLoader* loader) {
    int file = loader->shard_order[loader->position.shard_index];
    dataloader_load_file(loader, file);
    int64_t unit = loader->sample_order[loader->position.sample_index * loader->num_processes + loader->process_rank];
    size_t BT = (size_t)loader->B * loader->T;
    const uint16_t* span = loader->tokens.data() + unit * (int64_t)BT;  // B*T + 1 tokens, inside the shard (unit < U)
    for (size_t i = 0; i < BT; i++) {
        loader->inputs[i] = span[i];
        loader->targets[i] = span[i + 1];
    }
    loader->position.sample_index++;
    if (loader->position.sample_index == dataloader_samples_in_file(loader, file)) dataloader_advance_shard(loader);
}

// Puts the loader where `target` says, replaying the shuffles from the seed (cheap: only counts are
// needed, no tokens are read), so the batches that follow are those an uninterrupted run would read.
inline void dataloader_seek(DataLoader* loader, const DataPosition& target) {
    if (target.shard_index < 0 || target.shard_index >= (int64_t)loader->files.size() || target.epoch < 0 ||
        target.sample_index < 0) {
        fatal("data position (epoch %ld, shard %ld, sample %ld) does not fit the %zu shard(s) of this data set",
              (long)target.epoch, (long)target.shard_index, (long)target.sample_index, loader->files.size());
    }
    dataloader_reset(loader);
    while (loader->position.epoch < target.epoch || loader->position.shard_index < target.shard_index) {
        dataloader_advance_shard(loader);
    }
    int64_t samples = dataloader_samples_in_file(loader, loader->shard_order[loader->position.shard_index]);
    if (target.sample_index >= samples) {
        fatal("data position (epoch %ld, shard %ld, sample %ld) is past the end of that shard (%ld samples); "
              "the data set changed since the checkpoint", (long)target.epoch, (long)target.shard_index,
              (long)target.sample_index, (long)samples);
    }
    loader->position.sample_index = target.sample_index;
}
