// Data preparation: text documents -> GPT-2 token shards (../shared/FORMATS.md, "Data shard").
//
// The stream of tokens is every document in order, each preceded by end-of-text (50256). Its first
// val_tokens tokens are the val shard NAME_val_000000.bin, and the rest is cut into train shards
// NAME_train_000000.bin, NAME_train_000001.bin, ... of shard_tokens each (the last one shorter). Cuts
// fall at exact token counts, not at document boundaries, as llm.c's scripts cut them, so a shard can
// start mid-document; no token is lost or repeated.
//
// Design choices:
//  - Documents are read in batches of about PREPRO_BATCH_BYTES and a batch is encoded by a few threads,
//    each with its own BpeEncoder, taking documents from a shared counter; results are appended in
//    document order, so the shards do not depend on the thread count. Memory stays bounded by one
//    batch plus one shard, whatever the dataset size.
//  - Files stream in chunks, so a many-gigabyte JSON-lines file or blank-line-separated file never
//    has to fit in memory (one document still does).
//  - A shard is written whole by dataloader.h's shard_write (PATH.tmp, fsync, rename). If the program
//    dies on an error (a full disk, say), fatal() removes the .tmp (llmc/utils.h, AtomicFile), so
//    nothing half-written is left, let alone one that looks complete.
//  - All names carry a prepro_/PREPRO_ prefix: these headers are compiled into one test binary with
//    everyone else's.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>

#include "../io/dataloader.h"
#include "../utils.h"
#include "bpe.h"

constexpr size_t PREPRO_BATCH_BYTES = 32 << 20;
constexpr size_t PREPRO_READ_CHUNK = 8 << 20;

// ----------------------------------------------------------------------------
// Writing files (an error exit leaves no .tmp behind: AtomicFile, llmc/utils.h)

// Writes one data shard (dataloader.h's shard_write), removing its .tmp if the write fails.
inline void prepro_write_shard(const std::string& path, const uint16_t* tokens, size_t count) {
    shard_write(path, tokens, (int64_t)count);
}

// Writes gpt2_tokenizer.bin the same way.
inline void prepro_write_tokenizer_file(const std::string& path, const BpeTokenizer& tok) {
    tokenizer_file_write(path, bpe_tokenizer_file(tok));
}

// All the tokens of one shard, its header and size checked (dataloader.h's shard_open).
inline std::vector<uint16_t> prepro_read_shard(const std::string& path) {
    FILE* fp;
    int64_t count = shard_open(path, &fp);
    std::vector<uint16_t> tokens(count);
    if (count > 0) freadCheck(tokens.data(), sizeof(uint16_t), count, fp);
    fcloseCheck(fp);
    return tokens;
}

inline std::string prepro_shard_path(const std::string& dir, const std::string& name, const char* split, int index) {
    char suffix[32];
    snprintf(suffix, sizeof(suffix), "_%s_%06d.bin", split, index);
    return dir + "/" + name + suffix;
}

// ----------------------------------------------------------------------------
// Cutting the token stream into shards

struct PreproShardWriter {
    std::string dir, name;
    long val_tokens = 0;    // size of the val shard; 0 for none
    long shard_tokens = 0;  // size of each train shard
    std::vector<uint16_t> val;    // the val shard, kept until we know train tokens follow
    std::vector<uint16_t> train;  // the train shard being filled
    int train_shards = 0;         // train shards written
    long total_tokens = 0;
    std::vector<std::string> written;  // paths, in the order written
};

inline void prepro_shard_writer_init(PreproShardWriter* w, const std::string& dir, const std::string& name,
                                     long val_tokens, long shard_tokens) {
    w->dir = dir;
    w->name = name;
    w->val_tokens = val_tokens;
    w->shard_tokens = shard_tokens;
}

inline void prepro_flush_train(PreproShardWriter* w) {
    std::string path = prepro_shard_path(w->dir, w->name, "train", w->train_shards);
    prepro_write_shard(path, w->train.data(), w->train.size());
    w->written.push_back(path);
    w->train_shards++;
    w->train.clear();
}

// Appends tokens to the stream, writing each shard as it fills.
inline void prepro_shard_writer_add(PreproShardWriter* w, const int* ids, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] > 0xFFFF) fatal("token id %d does not fit a uint16 shard", ids[i]);
        uint16_t token = (uint16_t)ids[i];
        if ((long)w->val.size() < w->val_tokens) {
            w->val.push_back(token);
        } else {
            if (w->written.empty() && w->train.empty() && w->val_tokens > 0) {
                // first train token: the val shard is complete
                std::string path = prepro_shard_path(w->dir, w->name, "val", 0);
                prepro_write_shard(path, w->val.data(), w->val.size());
                w->written.push_back(path);
            }
            w->train.push_back(token);
            if ((long)w->train.size() == w->shard_tokens) prepro_flush_train(w);
        }
    }
    w->total_tokens += (long)count;
}

// Writes the last, partial train shard. An input too small to leave any train tokens is an error
// (and then nothing has been written).
inline void prepro_shard_writer_finish(PreproShardWriter* w) {
    if (w->train_shards == 0 && w->train.empty()) {
        fatal("the input gave %ld tokens, all of them taken by the val split (%ld tokens): nothing left to train "
              "on; lower --val-tokens", w->total_tokens, w->val_tokens);
    }
    if (!w->train.empty()) prepro_flush_train(w);
}

// ----------------------------------------------------------------------------
// Reading documents

enum PreproSplit {
    PREPRO_ONE_DOC_PER_FILE,  // each file is one document
    PREPRO_BLANK_LINES,       // a document ends after each "\n\n" (the blank line stays with it)
    PREPRO_JSONL,             // each line is a JSON object; its string field `jsonl_field` is a document
};

struct PreproSource {
    std::vector<std::string> files;  // in reading order
    PreproSplit split = PREPRO_ONE_DOC_PER_FILE;
    std::string jsonl_field;
    // reading state
    size_t file_index = 0;
    FILE* fp = nullptr;
    std::string pending;    // bytes read from the current file; pending[start..] not yet handed out
    size_t start = 0;
    size_t scan_from = 0;   // where to resume looking for the next separator in `pending`
    long line_number = 0;   // JSONL: lines of the current file handed out so far
    long documents = 0;     // documents handed out so far
    long bytes = 0;         // bytes of text handed out so far
};

// Lists the regular files under `dir`, recursively, sorted by path; names starting with '.' are skipped.
inline void prepro_list_files(const std::string& dir, std::vector<std::string>* files) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) fatal("could not open directory '%s': %s", dir.c_str(), strerror(errno));
    std::vector<std::string> names;
    while (struct dirent* entry = readdir(d)) {
        if (entry->d_name[0] != '.') names.push_back(entry->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
        std::string path = dir + "/" + name;
        if (dir_exists(path)) {
            prepro_list_files(path, files);
        } else if (file_exists(path)) {
            files->push_back(path);
        }
    }
}

// Sets up reading from a file or a directory (every file under it, in sorted order).
inline void prepro_source_init(PreproSource* src, const std::string& input, PreproSplit split,
                               const std::string& jsonl_field) {
    src->split = split;
    src->jsonl_field = jsonl_field;
    if (dir_exists(input)) {
        prepro_list_files(input, &src->files);
        if (src->files.empty()) fatal("input directory '%s' has no files", input.c_str());
    } else if (file_exists(input)) {
        src->files.push_back(input);
    } else {
        fatal("input '%s' does not exist (expected a text file or a directory of them)", input.c_str());
    }
}

// Reads the next chunk of the current file into `pending` (dropping what was handed out); returns
// false at the end of the file.
inline bool prepro_read_chunk(PreproSource* src) {
    src->pending.erase(0, src->start);
    src->scan_from -= std::min(src->scan_from, src->start);
    src->start = 0;
    size_t old_size = src->pending.size();
    src->pending.resize(old_size + PREPRO_READ_CHUNK);
    size_t got = fread(&src->pending[old_size], 1, PREPRO_READ_CHUNK, src->fp);
    src->pending.resize(old_size + got);
    if (got == 0 && ferror(src->fp)) {
        fatal("error reading '%s': %s", src->files[src->file_index].c_str(), strerror(errno));
    }
    return got > 0;
}

// Turns the record pending[start, start + length) into a document (JSONL: parses it) and adds it to
// `docs`; empty documents are skipped.
inline void prepro_emit(PreproSource* src, size_t length, std::vector<std::string>* docs) {
    const char* record = src->pending.data() + src->start;
    if (src->split != PREPRO_JSONL) {
        if (length > 0) docs->emplace_back(record, length);
        return;
    }
    src->line_number++;
    BpeJsonCursor cursor = {record, record + length};
    bpe_json_skip_space(&cursor);
    if (cursor.pos == cursor.end) return;  // blank line
    std::string text;
    if (!bpe_json_read_object_field(&cursor, src->jsonl_field, &text)) {
        fatal("'%s' line %ld: %s (reading the JSON field \"%s\")", src->files[src->file_index].c_str(),
              src->line_number, cursor.error, src->jsonl_field.c_str());
    }
    bpe_json_skip_space(&cursor);
    if (cursor.pos != cursor.end) {
        fatal("'%s' line %ld: trailing data after the JSON object", src->files[src->file_index].c_str(),
              src->line_number);
    }
    if (!text.empty()) docs->push_back(std::move(text));
}

// Length of the next complete record at pending[start..], separator included, or 0 if none is
// complete yet.
inline size_t prepro_next_record(PreproSource* src) {
    if (src->split == PREPRO_ONE_DOC_PER_FILE) return 0;
    const char* separator = src->split == PREPRO_JSONL ? "\n" : "\n\n";
    size_t at = src->pending.find(separator, std::max(src->scan_from, src->start));
    if (at == std::string::npos) {
        // a separator may straddle the next chunk: look again from its possible first byte
        src->scan_from = std::max(src->start, src->pending.empty() ? 0 : src->pending.size() - 1);
        return 0;
    }
    return at + strlen(separator) - src->start;
}

// Fills `docs` with the next documents, about PREPRO_BATCH_BYTES of text; returns false when the input
// is exhausted.
inline bool prepro_next_batch(PreproSource* src, std::vector<std::string>* docs) {
    docs->clear();
    size_t batch_bytes = 0;
    while (batch_bytes < PREPRO_BATCH_BYTES && src->file_index < src->files.size()) {
        if (src->fp == nullptr) {
            src->fp = fopenCheck(src->files[src->file_index].c_str(), "rb");
            src->pending.clear();
            src->start = src->scan_from = 0;
            src->line_number = 0;
        }
        size_t before = docs->size();
        size_t record = prepro_next_record(src);
        if (record > 0) {
            // JSONL hands over the line without its newline; blank-line documents keep their "\n\n"
            prepro_emit(src, src->split == PREPRO_JSONL ? record - 1 : record, docs);
            src->start += record;
        } else if (!prepro_read_chunk(src)) {
            // end of this file: what is left is its last record
            prepro_emit(src, src->pending.size() - src->start, docs);
            fcloseCheck(src->fp);
            src->fp = nullptr;
            src->pending.clear();
            src->file_index++;
        }
        if (docs->size() > before) batch_bytes += docs->back().size();
    }
    src->documents += (long)docs->size();
    for (const std::string& doc : *docs) src->bytes += (long)doc.size();
    return !docs->empty() || src->file_index < src->files.size();
}

// ----------------------------------------------------------------------------
// Encoding a batch of documents on several threads

// ids[i] = end-of-text followed by the tokens of docs[i]. One thread per encoder.
inline void prepro_encode_batch(std::vector<BpeEncoder>* encoders, const std::vector<std::string>& docs,
                                std::vector<std::vector<int>>* ids) {
    ids->resize(docs.size());
    std::atomic<size_t> next_doc(0);
    auto work = [&](BpeEncoder* enc) {
        for (size_t i = next_doc++; i < docs.size(); i = next_doc++) {
            std::vector<int>& out = (*ids)[i];
            out.clear();
            out.reserve(docs[i].size() / 3 + 16);  // GPT-2 averages ~4 bytes per token on English
            out.push_back(enc->tok->eot_token);
            bpe_encode(enc, docs[i].data(), docs[i].size(), &out);
        }
    };
    std::vector<std::thread> threads;
    for (size_t t = 1; t < encoders->size(); t++) threads.emplace_back(work, &(*encoders)[t]);
    work(&(*encoders)[0]);
    for (std::thread& thread : threads) thread.join();
}
