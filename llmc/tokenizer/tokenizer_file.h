// gpt2_tokenizer.bin: the byte string of every token id, so a trainer can print samples as text.
// (../shared/FORMATS.md: header magic 20240328, version 2, token count, end-of-text id; then for each
// id a uint8 length 1..255 and that many raw bytes.) The BPE encoder itself lives in llmc/tokenizer/bpe.h;
// decoding needs only this table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../utils.h"

constexpr int32_t TOKENIZER_MAGIC = 20240328;
constexpr int32_t TOKENIZER_VERSION = 2;

struct TokenizerFile {
    std::vector<std::string> token_bytes;  // token id -> its raw bytes
    int eot_token = -1;                    // end-of-text id, 50256 for GPT-2
};

inline void tokenizer_file_write(const std::string& path, const TokenizerFile& tok) {
    int32_t header[HEADER_INTS] = {0};
    header[0] = TOKENIZER_MAGIC;
    header[1] = TOKENIZER_VERSION;
    header[2] = (int32_t)tok.token_bytes.size();
    header[3] = tok.eot_token;
    AtomicFile f = atomic_open(path);
    atomic_write(&f, header, HEADER_BYTES);
    for (size_t i = 0; i < tok.token_bytes.size(); i++) {
        const std::string& bytes = tok.token_bytes[i];
        if (bytes.empty() || bytes.size() > 255) {
            fatal("token %zu has %zu bytes; the tokenizer file stores 1..255 bytes per token", i, bytes.size());
        }
        uint8_t len = (uint8_t)bytes.size();
        atomic_write(&f, &len, 1);
        atomic_write(&f, bytes.data(), bytes.size());
    }
    atomic_commit(&f);
}

// Reads `path`. Returns false, printing nothing, if the file does not exist (samples then print as
// ids); any malformed file is a fatal error naming what is wrong.
inline bool tokenizer_file_read(const std::string& path, TokenizerFile* tok) {
    if (!file_exists(path)) return false;
    const char* what = "tokenizer file";
    FILE* fp = fopenCheck(path.c_str(), "rb");
    long size = file_size_of(fp);
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, TOKENIZER_MAGIC, &TOKENIZER_VERSION, 1, header);
    int32_t count = header[2];
    if (count <= 0 || count > (1 << 24)) fatal("%s '%s' claims %d tokens", what, path.c_str(), count);
    if (header[3] < 0 || header[3] >= count) {
        fatal("%s '%s': end-of-text id %d is outside 0..%d", what, path.c_str(), header[3], count - 1);
    }
    tok->eot_token = header[3];
    tok->token_bytes.assign(count, std::string());
    long pos = HEADER_BYTES;
    for (int32_t i = 0; i < count; i++) {
        uint8_t len;
        if (pos + 1 > size) fatal("%s '%s' is truncated at token %d of %d", what, path.c_str(), i, count);
        freadCheck(&len, 1, 1, fp);
        if (len == 0) fatal("%s '%s': token %d has length 0", what, path.c_str(), i);
        if (pos + 1 + len > size) fatal("%s '%s' is truncated at token %d of %d", what, path.c_str(), i, count);
        tok->token_bytes[i].resize(len);
        freadCheck(&tok->token_bytes[i][0], 1, len, fp);
        pos += 1 + len;
    }
    if (pos != size) {
        fatal("%s '%s' has %ld trailing bytes after its %d tokens", what, path.c_str(), size - pos, count);
    }
    fcloseCheck(fp);
    return true;
}

// Bytes of one token, or "" for an id the table does not have.
inline const std::string& tokenizer_file_decode(const TokenizerFile& tok, int id) {
    static const std::string empty;
    if (id < 0 || id >= (int)tok.token_bytes.size()) return empty;
    return tok.token_bytes[id];
}
