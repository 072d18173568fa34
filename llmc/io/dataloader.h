// Data loader over token shards (../shared/FORMATS.md): files of uint16 token ids found by a glob.
//
// A shard of N tokens is cut into U = (N - 1) / (B*T) units of B*T tokens: unit u starts at token u*B*T
// and spans B*T+1 tokens (inputs are the first B*T, targets the last B*T). The units of all shards,
// epoch after epoch, make one stream, the same on every rank and for every process count:
//   epoch e reads its shards in one order and each shard's U units in one order;
//   unshuffled, both orders are the identity: shards in glob order, units in order (with one process,
//   FORMATS's layout);
//   shuffled, one mt19937 seeded with 42 draws each epoch's shard order when the epoch begins and each
//   shard's unit order when the stream reaches the shard (rand.h's Fisher-Yates).
// With P data-parallel processes, global micro-step k reads stream entries k*P .. k*P + P - 1, rank r
// entry k*P + r. A micro-step's entries may straddle two shards or two epochs: one rank reads the next
// shard (or epoch) while another still reads the last unit of the previous. So P processes with A
// accumulation steps read the same B*T-token samples per step as 1 process with P*A steps, at every
// step of the run, and a checkpoint, which saves the stream position (DataPosition, the same on every
// rank), resumes with any P (doc/model_parallel.md).
// Deviations from FORMATS.md, both so that the order does not depend on P: FORMATS gives rank r sample
// i of a shard at token i*P*B*T + r*B*T, which leaves out the last U mod P units of every shard, and
// seeds the shuffle with 42 + rank to permute each rank's own samples. Here no unit is left out and one
// order is dealt to the ranks; with P = 1, or a P that divides every shard's U, unshuffled, the two
// layouts are the same.
//
// API:
//   dataloader_init(&loader, pattern, B, T, rank, num_processes, shuffle, vocab_size)
//   dataloader_next_batch(&loader)        fills loader.inputs / loader.targets (B*T each) and advances
//   dataloader_reset(&loader)             back to the first batch of epoch 0
//   loader.position / dataloader_seek()   where the next global micro-step starts; seek replays the shuffles
//   dataloader_epoch_units(&loader)       B*T-token units in one epoch (all shards, all processes together)
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

// A place in the stream, the same on every rank: the next global micro-step starts at the unit-th
// entry of epoch `epoch` (0 <= unit < the epoch's units). Saved in the state file, so a resumed run, with
// any process count, reads the batches the uninterrupted run would have.
struct DataPosition {
    int64_t epoch = 0;
    int64_t unit = 0;
};

// This rank's next entry of the stream (position + process_rank): the unit_index-th unit (in the shard's
// unit order) of the shard_index-th shard (in the epoch's shard order) of epoch `epoch`.
struct StreamCursor {
    int64_t epoch = 0;
    int64_t shard_index = 0;
    int64_t unit_index = 0;
};

struct DataLoader {
    // configuration
    int B = 0, T = 0;
    int process_rank = 0, num_processes = 1;
    bool shuffle = false;
    int vocab_size = 0;
    std::vector<std::string> files;
    std::vector<int64_t> file_tokens;  // token count of each file
    int64_t epoch_units = 0;           // units of all files
    // state
    DataPosition position;
    StreamCursor cursor;
    std::mt19937 rng;                   // draws the orders up to the cursor's shard
    std::vector<int> shard_order;       // permutation of file indices for the cursor's epoch
    std::vector<int64_t> unit_order;    // permutation of the cursor's shard's B*T-token units
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

// Units in one epoch of the stream: all shards, read by all processes together.
inline int64_t dataloader_epoch_units(const DataLoader* loader) {
    return loader->epoch_units;
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

// Draws the unit order of the cursor's shard (consumes the rng when shuffling).
inline void dataloader_begin_shard(DataLoader* loader) {
    int file = loader->shard_order[loader->cursor.shard_index];
    int64_t n = dataloader_units_in_file(loader, file);
    loader->unit_order.resize(n);
    if (loader->shuffle) {
        random_permutation<int64_t>(loader->unit_order.data(), n, loader->rng);
    } else {
        for (int64_t i = 0; i < n; i++) loader->unit_order[i] = i;
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

// Moves the cursor n entries down the stream, through as many shards and epochs as that takes. Every
// shard it reaches draws its unit order, even one it steps over, so the rng is where the stream's
// definition has it, on every rank. Only counts are needed, no tokens are read.
inline void dataloader_advance_cursor(DataLoader* loader, int64_t n) {
    StreamCursor* c = &loader->cursor;
    c->unit_index += n;
    while (c->unit_index >= (int64_t)loader->unit_order.size()) {
        c->unit_index -= (int64_t)loader->unit_order.size();
        c->shard_index++;
        if (c->shard_index == (int64_t)loader->files.size()) {
            c->shard_index = 0;
            c->epoch++;
            dataloader_begin_epoch(loader);
        }
        dataloader_begin_shard(loader);
    }
}

// Puts the cursor at entry `index` of the stream, counted from the start of epoch 0 (replays the draws
// from the seed).
inline void dataloader_cursor_to(DataLoader* loader, int64_t index) {
    loader->rng.seed(42);  // the same on every rank: the ranks deal out one stream (see the top)
    loader->cursor = StreamCursor();
    dataloader_begin_epoch(loader);
    dataloader_begin_shard(loader);
    dataloader_advance_cursor(loader, index);
}

inline void dataloader_reset(DataLoader* loader) {
    loader->position = DataPosition();
    dataloader_cursor_to(loader, loader->process_rank);
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
    loader->epoch_units = 0;
    int64_t BT = (int64_t)B * T;
    for (const std::string& path : loader->files) {
        int64_t n = shard_num_tokens(path);
        if (n < BT + 1) {  // a shard that adds nothing to the stream is a mistake, not a silent no-op
            fatal("data shard '%s' has %ld tokens, fewer than the %ld one sample needs (B=%d x T=%d, plus one)",
                  path.c_str(), (long)n, (long)(BT + 1), B, T);
        }
        loader->file_tokens.push_back(n);
        loader->epoch_units += (n - 1) / BT;
    }
    loader->inputs.assign((size_t)BT, 0);
    loader->targets.assign((size_t)BT, 0);
    loader->loaded_file = -1;
    dataloader_reset(loader);
}

// Reads this rank's entry of the next global micro-step, then moves on by one micro-step: the cursor and
// the position P entries each.
inline void dataloader_next_batch(DataLoader* loader) {
    int file = loader->shard_order[loader->cursor.shard_index];
    dataloader_load_file(loader, file);
    int64_t unit = loader->unit_order[loader->cursor.unit_index];
    size_t BT = (size_t)loader->B * loader->T;
    const uint16_t* span = loader->tokens.data() + unit * (int64_t)BT;  // B*T + 1 tokens, inside the shard (unit < U)
    for (size_t i = 0; i < BT; i++) {
        loader->inputs[i] = span[i];
        loader->targets[i] = span[i + 1];
    }
    dataloader_advance_cursor(loader, loader->num_processes);
    loader->position.unit += loader->num_processes;
    while (loader->position.unit >= loader->epoch_units) {
        loader->position.unit -= loader->epoch_units;
        loader->position.epoch++;
    }
}

// Puts the loader at `target` (for this rank: target's entry plus process_rank), replaying the shuffles
// from the seed (cheap: only counts are needed, no tokens are read), so the batches that follow are
// those an uninterrupted run would read, whatever its process count.
inline void dataloader_seek(DataLoader* loader, const DataPosition& target) {
    if (target.epoch < 0 || target.epoch > INT64_MAX / 2 / loader->epoch_units || target.unit < 0 ||
        target.unit >= loader->epoch_units) {
        fatal("data position (epoch %ld, unit %ld) is outside this data set, whose epochs have %ld units of B=%d x "
              "T=%d tokens; the data set changed since the checkpoint", (long)target.epoch, (long)target.unit,
              (long)loader->epoch_units, loader->B, loader->T);
    }
    dataloader_cursor_to(loader, target.epoch * loader->epoch_units + target.unit + loader->process_rank);
    loader->position = target;
}

// The stream position of the unit_index-th unit (in the shard's unit order) of the shard_index-th shard
// (in the epoch's shard order) of epoch `epoch`: how an older state file, which counted by shard, names
// a place in the stream. Leaves the loader where it was.
inline DataPosition dataloader_position_in_shard(DataLoader* loader, int64_t epoch, int64_t shard_index,
                                                 int64_t unit_index) {
    DataPosition here = loader->position;
    if (epoch < 0 || epoch > INT64_MAX / 2 / loader->epoch_units || shard_index < 0 ||
        shard_index >= (int64_t)loader->files.size() || unit_index < 0) {
        fatal("data position (epoch %ld, shard %ld, unit %ld) does not fit the %zu shard(s) of this data set",
              (long)epoch, (long)shard_index, (long)unit_index, loader->files.size());
    }
    dataloader_cursor_to(loader, epoch * loader->epoch_units);  // at the epoch's start: shard_order is its order
    DataPosition p{epoch, unit_index};
    for (int64_t i = 0; i < shard_index; i++) p.unit += dataloader_units_in_file(loader, loader->shard_order[i]);
    int64_t units = dataloader_units_in_file(loader, loader->shard_order[shard_index]);
    if (unit_index >= units) {
        fatal("data position (epoch %ld, shard %ld, unit %ld) is past the end of that shard (%ld units); the data set "
              "changed since the checkpoint", (long)epoch, (long)shard_index, (long)unit_index, (long)units);
    }
    dataloader_seek(loader, here);
    return p;
}
