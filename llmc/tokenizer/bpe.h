// GPT-2's byte-level BPE tokenizer: text -> token ids and back, built from encoder.json and vocab.bpe
// (facts in ../shared/FORMATS.md, "GPT-2 BPE source files"; the story in doc/tokenizer.md).
//
// Encoding is two steps. (1) Pre-tokenize: GPT-2's regular expression cuts the text into pieces (a
// word with its leading space, a number, a run of punctuation, a run of whitespace, an English
// contraction). (2) Merge: each piece starts as one token per UTF-8 byte, and the merges of vocab.bpe
// are applied, lowest rank first, until none applies. Pieces never interact, so each distinct piece is
// merged once per encoder and its ids cached. Decoding concatenates the tokens' bytes.
//
// Design choices that matter:
//  - The pattern runs in PCRE2 (Debian's libpcre2-8), JIT-compiled, with Unicode's own letter, number
//    and whitespace properties. Chosen over ICU because it matches UTF-8 bytes in place (ICU's regex
//    works on UTF-16, so every document would be converted and offsets mapped back), its JIT is fast,
//    and PCRE2_MATCH_INVALID_UTF lets it walk text that is not valid UTF-8 with no separate pass.
//  - `\s` is written \p{White_Space}: that is what GPT-2's reference encoder (Python's `regex`) means
//    by \s, while PCRE2's \s also takes U+180E. (JavaScript's \s differs too: it takes U+FEFF and not
//    U+0085, so gpt-3-encoder's Encoder.js cuts pieces differently around those two characters.)
//  - Unicode version: PCRE2 10.42 has Unicode 14.0 tables. Letters and numbers assigned since then
//    (CJK extensions H-J, Kawi, ...: all unassigned in 14.0) count as "other" here, while encoders
//    with newer tables (Python's `regex` today, node 20) count them as letters. Nothing assigned by
//    14.0 differs.
//  - Bytes that are not valid UTF-8 match nothing in the pattern; each run of them becomes a piece of
//    its own and is merged like any other bytes, so every byte string round-trips through decode.
//  - Merging uses a linked list of symbols and a min-heap of (rank, position) for the candidate pairs:
//    O(n log n) in the length of a piece, so a megabyte with no space in it is not quadratic. This gives
//    exactly the reference's result ("merge every occurrence of the lowest-ranked pair, left to right,
//    repeat") because a merge never creates a pair ranked below itself: in vocab.bpe every merge that
//    uses a token comes after the merge that makes it. bpe_tokenizer_load checks that.
//  - <|endoftext|> (id 50256) is a special token only in bpe_encode_allow_special; bpe_encode treats
//    those 13 characters as ordinary text, as GPT-2's reference encoder does.
//
// Threads: a BpeTokenizer is read-only once loaded and shared; each thread owns a BpeEncoder (match
// data, merge scratch, cache).
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8  // UTF-8 text
#endif
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../utils.h"
#include "bpe_json.h"
#include "tokenizer_file.h"

constexpr const char* BPE_EOT_STRING = "<|endoftext|>";

// GPT-2's pre-tokenizer pattern (FORMATS.md) in PCRE2 syntax, \s spelled as Unicode's White_Space.
constexpr const char* BPE_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?\\p{L}+| ?\\p{N}+"
    "| ?[^\\p{White_Space}\\p{L}\\p{N}]+"
    "|\\p{White_Space}+(?!\\P{White_Space})"
    "|\\p{White_Space}+";

struct BpeMerge {
    int rank;       // line of vocab.bpe after the #version line, from 0; lower merges first
    int merged_id;  // token id of the two tokens' bytes joined
};

struct BpeTokenizer {
    std::vector<std::string> token_bytes;               // token id -> raw bytes
    std::unordered_map<std::string, int> id_of_bytes;   // raw bytes -> token id
    int byte_token[256];                                 // token id of each single byte
    std::unordered_map<uint64_t, BpeMerge> merges;       // bpe_pair_key(left id, right id) -> merge
    int eot_token = -1;                                  // id of <|endoftext|>, 50256
    pcre2_code* pattern = nullptr;                       // compiled BPE_PATTERN, shared by threads
    bool pattern_jit = false;                            // JIT-compiled: match with pcre2_jit_match
};

inline uint64_t bpe_pair_key(int left, int right) { return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right; }

// ----------------------------------------------------------------------------
// GPT-2's byte <-> character map: the token strings of encoder.json and vocab.bpe are written with one
// printable character per byte. Bytes that print as themselves in Latin-1 ('!'..'~', '¡'..'¬',
// '®'..'ÿ') keep their code point; the other 68 bytes, in increasing order, take U+0100, U+0101, ...

inline void bpe_byte_to_codepoint(uint32_t codepoint_of_byte[256]) {
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; b++) {
        bool prints_as_itself = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        codepoint_of_byte[b] = prints_as_itself ? (uint32_t)b : next_extra++;
    }
}

// Decodes one UTF-8 character at s[*i], advancing *i; returns -1 (advancing one byte) if it is not one.
// (Lenient about overlong forms: it reads token strings, not untrusted text.)
inline int32_t bpe_utf8_next(const std::string& s, size_t* i) {
    unsigned char lead = (unsigned char)s[*i];
    int extra = lead < 0x80 ? 0 : (lead >> 5) == 0x6 ? 1 : (lead >> 4) == 0xE ? 2 : (lead >> 3) == 0x1E ? 3 : -1;
    if (extra < 0 || *i + extra >= s.size()) {
        (*i)++;
        return -1;
    }
    int32_t cp = extra == 0 ? lead : lead & (0x3F >> extra);
    for (int k = 1; k <= extra; k++) {
        unsigned char cont = (unsigned char)s[*i + k];
        if ((cont & 0xC0) != 0x80) {
            (*i)++;
            return -1;
        }
        cp = (cp << 6) | (cont & 0x3F);
    }
    *i += 1 + extra;
    return cp;
}

// A token string of encoder.json / vocab.bpe -> the raw bytes it stands for. Returns false if it holds
// a character outside the byte map.
inline bool bpe_token_string_to_bytes(const std::string& token_string, std::string* bytes) {
    static int byte_of_codepoint[512];
    static bool built = [] {
        uint32_t codepoint_of_byte[256];
        bpe_byte_to_codepoint(codepoint_of_byte);
        std::fill(byte_of_codepoint, byte_of_codepoint + 512, -1);
        for (int b = 0; b < 256; b++) byte_of_codepoint[codepoint_of_byte[b]] = b;
        return true;
    }();
    (void)built;
    bytes->clear();
    for (size_t i = 0; i < token_string.size();) {
        int32_t cp = bpe_utf8_next(token_string, &i);
        if (cp < 0 || cp >= 512 || byte_of_codepoint[cp] < 0) return false;
        bytes->push_back((char)byte_of_codepoint[cp]);
    }
    return true;
}

// ----------------------------------------------------------------------------
// Loading

// Reads a whole regular file; `what` names it in messages.
inline std::string bpe_read_file(const std::string& path, const char* what) {
    if (dir_exists(path)) fatal("%s '%s' is a directory, expected a file", what, path.c_str());
    if (!file_exists(path)) fatal("%s '%s' does not exist (or is not a regular file)", what, path.c_str());
    FILE* fp = fopenCheck(path.c_str(), "rb");
    long size = file_size_of(fp);
    std::string data((size_t)size, '\0');
    if (size > 0) freadCheck(&data[0], 1, (size_t)size, fp);
    fcloseCheck(fp);
    return data;
}

// encoder.json: {"token string": id, ...}, ids 0..N-1 each exactly once.
inline void bpe_load_vocab(BpeTokenizer* tok, const std::string& path) {
    std::string json = bpe_read_file(path, "GPT-2 vocabulary (encoder.json)");
    BpeJsonCursor c = {json.data(), json.data() + json.size()};
    auto fail = [&](const char* what) {
        fatal("'%s' is not a GPT-2 encoder.json: %s at byte %ld", path.c_str(), what, (long)(c.pos - json.data()));
    };
    if (!bpe_json_accept(&c, '{')) fail("expected '{'");
    std::string key, bytes;
    do {
        long id;
        if (!bpe_json_read_string(&c, &key) || !bpe_json_accept(&c, ':') || !bpe_json_read_int(&c, &id)) {
            fail(c.error ? c.error : "expected \"token\": id");
        }
        if (id < 0 || id >= (1 << 20)) fail("token id out of range 0..2^20");
        if (!bpe_token_string_to_bytes(key, &bytes) || bytes.empty()) {
            fail("a token string holds a character outside GPT-2's byte map");
        }
        if ((size_t)id >= tok->token_bytes.size()) tok->token_bytes.resize(id + 1);
        if (!tok->token_bytes[id].empty()) fail("a token id appears twice");
        if (!tok->id_of_bytes.emplace(bytes, (int)id).second) fail("a token string appears twice");
        tok->token_bytes[id] = bytes;
    } while (bpe_json_accept(&c, ','));
    if (!bpe_json_accept(&c, '}')) fail("expected ',' or '}'");
    bpe_json_skip_space(&c);
    if (c.pos != c.end) fail("trailing data after the object");
    for (size_t id = 0; id < tok->token_bytes.size(); id++) {
        if (tok->token_bytes[id].empty()) {
            fatal("'%s': token id %zu is missing (ids must run 0..%zu)", path.c_str(), id, tok->token_bytes.size() - 1);
        }
    }
    for (int b = 0; b < 256; b++) {
        auto it = tok->id_of_bytes.find(std::string(1, (char)b));
        if (it == tok->id_of_bytes.end()) fatal("'%s' has no token for the single byte %d", path.c_str(), b);
        tok->byte_token[b] = it->second;
    }
    auto eot = tok->id_of_bytes.find(BPE_EOT_STRING);
    if (eot == tok->id_of_bytes.end()) fatal("'%s' has no %s token", path.c_str(), BPE_EOT_STRING);
    tok->eot_token = eot->second;
}

// vocab.bpe: a "#version" line, then one merge per line, "left right", in rank order.
inline void bpe_load_merges(BpeTokenizer* tok, const std::string& path) {
    std::string text = bpe_read_file(path, "GPT-2 merges (vocab.bpe)");
    std::vector<int> made_at_rank(tok->token_bytes.size(), -1);  // rank of the merge that makes each token
    std::string left, right;
    int rank = 0;
    size_t line_no = 0;
    for (size_t start = 0; start < text.size();) {
        size_t stop = text.find('\n', start);
        if (stop == std::string::npos) stop = text.size();
        std::string line = text.substr(start, stop - start);
        start = stop + 1;
        line_no++;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line_no == 1) {
            if (line.rfind("#version", 0) != 0) fatal("'%s' does not start with a #version line", path.c_str());
            continue;
        }
        if (line.empty()) {
            if (start >= text.size()) break;  // the file's final newline
            fatal("'%s' line %zu is blank", path.c_str(), line_no);
        }
        size_t space = line.find(' ');
        if (space == 0 || space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
            fatal("'%s' line %zu is not two tokens separated by one space", path.c_str(), line_no);
        }
        if (!bpe_token_string_to_bytes(line.substr(0, space), &left) ||
            !bpe_token_string_to_bytes(line.substr(space + 1), &right)) {
            fatal("'%s' line %zu holds a character outside GPT-2's byte map", path.c_str(), line_no);
        }
        auto left_id = tok->id_of_bytes.find(left);
        auto right_id = tok->id_of_bytes.find(right);
        auto merged_id = tok->id_of_bytes.find(left + right);
        if (left_id == tok->id_of_bytes.end() || right_id == tok->id_of_bytes.end() ||
            merged_id == tok->id_of_bytes.end()) {
            fatal("'%s' line %zu: a token of this merge or its result is not in encoder.json", path.c_str(), line_no);
        }
        for (int part : {left_id->second, right_id->second}) {
            if (tok->token_bytes[part].size() > 1 && (made_at_rank[part] < 0 || made_at_rank[part] >= rank)) {
                fatal("'%s' line %zu uses a token before the merge that makes it; this encoder needs every merge "
                      "after the merges of its parts (GPT-2's vocab.bpe is so)", path.c_str(), line_no);
            }
        }
        BpeMerge merge = {rank, merged_id->second};
        if (!tok->merges.emplace(bpe_pair_key(left_id->second, right_id->second), merge).second) {
            fatal("'%s' line %zu repeats an earlier merge", path.c_str(), line_no);
        }
        if (made_at_rank[merged_id->second] < 0) made_at_rank[merged_id->second] = rank;
        rank++;
    }
    if (rank == 0) fatal("'%s' has no merges", path.c_str());
}

// Loads DIR/encoder.json and DIR/vocab.bpe and compiles the pattern.
inline void bpe_tokenizer_load(BpeTokenizer* tok, const std::string& dir) {
    if (!dir_exists(dir)) fatal("GPT-2 BPE directory '%s' does not exist", dir.c_str());
    bpe_load_vocab(tok, dir + "/encoder.json");
    bpe_load_merges(tok, dir + "/vocab.bpe");
    int error_code;
    PCRE2_SIZE error_offset;
    tok->pattern = pcre2_compile((PCRE2_SPTR)BPE_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF,
                                 &error_code, &error_offset, nullptr);
    if (tok->pattern == nullptr) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error_code, message, sizeof(message));
        fatal("PCRE2 could not compile GPT-2's pattern at offset %zu: %s", (size_t)error_offset, (char*)message);
    }
    // Without JIT (a PCRE2 built without it) matching still works, only slower.
    tok->pattern_jit = pcre2_jit_compile(tok->pattern, PCRE2_JIT_COMPLETE) == 0;
}

inline void bpe_tokenizer_free(BpeTokenizer* tok) {
    pcre2_code_free(tok->pattern);
    tok->pattern = nullptr;
}

inline int bpe_vocab_size(const BpeTokenizer& tok) { return (int)tok.token_bytes.size(); }

// The table gpt2_tokenizer.bin holds (llmc/tokenizer/tokenizer_file.h).
inline TokenizerFile bpe_tokenizer_file(const BpeTokenizer& tok) {
    TokenizerFile file;
    file.token_bytes = tok.token_bytes;
    file.eot_token = tok.eot_token;
    return file;
}

// ----------------------------------------------------------------------------
// Encoding (one BpeEncoder per thread)

// The cache of merged pieces: open addressing with linear probing over a power-of-two table of slots;
// the pieces' bytes and their ids live back to back in two arenas, so a lookup allocates nothing.
// std::unordered_map<std::string, ...> did the same job at half the encoder's speed.
constexpr size_t BPE_CACHE_MAX_PIECE_BYTES = 255;    // longer pieces are rare; merged every time
constexpr size_t BPE_CACHE_MAX_ENTRIES = 1 << 19;    // then the cache is emptied and starts again

struct BpeCacheSlot {
    uint64_t hash;  // 0: empty slot
    uint32_t key_offset, ids_offset;
    uint8_t key_length;
    uint16_t id_count;
};

struct BpeCache {
    std::vector<BpeCacheSlot> slots;  // size a power of two, at most half full
    std::string keys;                 // the cached pieces' bytes
    std::vector<int> ids;             // the cached pieces' ids
    size_t entries = 0;
};

inline uint64_t bpe_hash_bytes(const char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        h = (h ^ word) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    uint64_t tail = 0;
    memcpy(&tail, p, n);
    h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h | 1;  // never 0, the empty mark
}

// The slot holding `piece`, or the empty slot where it would go.
inline BpeCacheSlot* bpe_cache_slot(BpeCache* cache, const char* piece, size_t length, uint64_t hash) {
    size_t mask = cache->slots.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        BpeCacheSlot* slot = &cache->slots[i];
        if (slot->hash == 0) return slot;
        if (slot->hash == hash && slot->key_length == length &&
            memcmp(cache->keys.data() + slot->key_offset, piece, length) == 0) {
            return slot;
        }
    }
}

inline void bpe_cache_clear(BpeCache* cache, size_t slot_count) {
    cache->slots.assign(slot_count, BpeCacheSlot{0, 0, 0, 0, 0});
    cache->keys.clear();
    cache->ids.clear();
    cache->entries = 0;
}

inline void bpe_cache_insert(BpeCache* cache, const char* piece, size_t length, uint64_t hash, const int* ids,
                             size_t count) {
    if (count > 0xFFFF) return;
    if (cache->entries >= BPE_CACHE_MAX_ENTRIES) bpe_cache_clear(cache, cache->slots.size());
    if (2 * (cache->entries + 1) > cache->slots.size()) {
        // grow: re-place every entry in a table twice the size
        std::vector<BpeCacheSlot> old = std::move(cache->slots);
        cache->slots.assign(old.size() * 2, BpeCacheSlot{0, 0, 0, 0, 0});
        size_t mask = cache->slots.size() - 1;
        for (const BpeCacheSlot& slot : old) {
            if (slot.hash == 0) continue;
            size_t i = slot.hash & mask;
            while (cache->slots[i].hash != 0) i = (i + 1) & mask;
            cache->slots[i] = slot;
        }
    }
    BpeCacheSlot* slot = bpe_cache_slot(cache, piece, length, hash);
    slot->hash = hash;
    slot->key_offset = (uint32_t)cache->keys.size();
    slot->key_length = (uint8_t)length;
    slot->ids_offset = (uint32_t)cache->ids.size();
    slot->id_count = (uint16_t)count;
    cache->keys.append(piece, length);
    cache->ids.insert(cache->ids.end(), ids, ids + count);
    cache->entries++;
}

struct BpeEncoder {
    const BpeTokenizer* tok = nullptr;
    pcre2_match_data* match = nullptr;
    BpeCache cache;
    // merge scratch: a doubly linked list of symbols over the piece's bytes, and the candidate pairs
    std::vector<int> symbol_id, prev, next;
    std::vector<uint64_t> heap;  // (rank << 32) | left position, smallest on top
};

inline void bpe_encoder_init(BpeEncoder* enc, const BpeTokenizer* tok) {
    enc->tok = tok;
    enc->match = pcre2_match_data_create_from_pattern(tok->pattern, nullptr);
    if (enc->match == nullptr) fatal("out of memory creating PCRE2 match data");
    bpe_cache_clear(&enc->cache, 1 << 12);
}

inline void bpe_encoder_free(BpeEncoder* enc) {
    pcre2_match_data_free(enc->match);
    enc->match = nullptr;
}

// Calls on_piece(const char* piece, size_t length) for each pre-token of text, in order. The pieces
// tile the text exactly; a run of bytes that are not valid UTF-8 is a piece of its own.
template <typename OnPiece>
inline void bpe_pretokenize(BpeEncoder* enc, const char* text, size_t length, OnPiece on_piece) {
    size_t pos = 0;
    while (pos < length) {
        // pcre2_jit_match skips pcre2_match's option checks, a third of the time per piece
        int rc = enc->tok->pattern_jit
                     ? pcre2_jit_match(enc->tok->pattern, (PCRE2_SPTR)text, length, pos, 0, enc->match, nullptr)
                     : pcre2_match(enc->tok->pattern, (PCRE2_SPTR)text, length, pos, 0, enc->match, nullptr);
        size_t start = length, stop = length;  // no match: the rest is bytes that are not UTF-8
        if (rc >= 0) {
            PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(enc->match);
            start = ovector[0];
            stop = ovector[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof(message));
            fatal("PCRE2 failed while pre-tokenizing at byte %zu: %s", pos, (char*)message);
        }
        if (start > pos) on_piece(text + pos, start - pos);
        if (stop > start) on_piece(text + start, stop - start);
        pos = stop;
    }
}

// Merges one piece and appends its ids to `out` (no cache).
inline void bpe_merge_piece(BpeEncoder* enc, const char* piece, size_t length, std::vector<int>* out) {
    const BpeTokenizer& tok = *enc->tok;
    if (length >= (1ull << 31)) fatal("a single pre-token of %zu bytes is too long to encode", length);
    int n = (int)length;
    std::vector<int>& symbol_id = enc->symbol_id;  // -1 once merged into its left neighbour
    std::vector<int>& prev = enc->prev;
    std::vector<int>& next = enc->next;
    std::vector<uint64_t>& heap = enc->heap;
    symbol_id.resize(n);
    prev.resize(n);
    next.resize(n);
    for (int i = 0; i < n; i++) {
        symbol_id[i] = tok.byte_token[(unsigned char)piece[i]];
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    auto find_merge = [&](int left) -> const BpeMerge* {
        if (left < 0 || next[left] < 0) return nullptr;
        auto it = tok.merges.find(bpe_pair_key(symbol_id[left], symbol_id[next[left]]));
        return it == tok.merges.end() ? nullptr : &it->second;
    };
    auto push_candidate = [&](int left) {
        const BpeMerge* merge = find_merge(left);
        if (merge == nullptr) return;
        heap.push_back(((uint64_t)merge->rank << 32) | (uint32_t)left);
        std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    };
    heap.clear();
    for (int i = 0; i + 1 < n; i++) {
        const BpeMerge* merge = find_merge(i);
        if (merge != nullptr) heap.push_back(((uint64_t)merge->rank << 32) | (uint32_t)i);
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
        uint64_t top = heap.back();
        heap.pop_back();
        int rank = (int)(top >> 32);
        int left = (int)(top & 0xFFFFFFFFu);
        // a candidate goes stale when either symbol has merged since; ranks are unique per pair,
        // so "the pair here still has this rank" means "still the same pair"
        if (symbol_id[left] < 0) continue;
        const BpeMerge* merge = find_merge(left);
        if (merge == nullptr || merge->rank != rank) continue;
        int right = next[left];
        symbol_id[left] = merge->merged_id;
        symbol_id[right] = -1;
        next[left] = next[right];
        if (next[right] >= 0) prev[next[right]] = left;
        push_candidate(prev[left]);
        push_candidate(left);
    }
    for (int i = 0; i >= 0; i = next[i]) out->push_back(symbol_id[i]);
}

// Appends the ids of one piece, through the cache.
inline void bpe_encode_piece(BpeEncoder* enc, const char* piece, size_t length, std::vector<int>* out) {
    if (length == 1) {
        out->push_back(enc->tok->byte_token[(unsigned char)piece[0]]);
        return;
    }
    if (length > BPE_CACHE_MAX_PIECE_BYTES) {
        bpe_merge_piece(enc, piece, length, out);
        return;
    }
    uint64_t hash = bpe_hash_bytes(piece, length);
    const BpeCacheSlot* hit = bpe_cache_slot(&enc->cache, piece, length, hash);
    if (hit->hash != 0) {
        const int* ids = enc->cache.ids.data() + hit->ids_offset;
        out->insert(out->end(), ids, ids + hit->id_count);
        return;
    }
    size_t first = out->size();
    bpe_merge_piece(enc, piece, length, out);
    bpe_cache_insert(&enc->cache, piece, length, hash, out->data() + first, out->size() - first);
}

// Appends the ids of `text` to `out`, as GPT-2's reference encoder gives them: "<|endoftext|>" in the
// text is ordinary text here.
inline void bpe_encode(BpeEncoder* enc, const char* text, size_t length, std::vector<int>* out) {
    bpe_pretokenize(enc, text, length, [&](const char* piece, size_t n) { bpe_encode_piece(enc, piece, n, out); });
}

inline std::vector<int> bpe_encode(BpeEncoder* enc, const std::string& text) {
    std::vector<int> ids;
    bpe_encode(enc, text.data(), text.size(), &ids);
    return ids;
}

// Like bpe_encode, but each "<|endoftext|>" in the text becomes the end-of-text token, and the text
// between them is encoded separately (as tiktoken's allowed_special does).
inline void bpe_encode_allow_special(BpeEncoder* enc, const char* text, size_t length, std::vector<int>* out) {
    std::string_view rest(text, length);
    std::string_view eot(BPE_EOT_STRING);
    for (;;) {
        size_t at = rest.find(eot);
        bpe_encode(enc, rest.data(), at == std::string_view::npos ? rest.size() : at, out);
        if (at == std::string_view::npos) return;
        out->push_back(enc->tok->eot_token);
        rest.remove_prefix(at + eot.size());
    }
}

// ----------------------------------------------------------------------------
// Decoding

// Appends the bytes of `ids` to `out`. An id outside the vocabulary is a fatal error naming its position.
inline void bpe_decode_append(const BpeTokenizer& tok, const int* ids, size_t count, std::string* out) {
    int vocab_size = bpe_vocab_size(tok);
    for (size_t i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= vocab_size) {
            fatal("token id %d (position %zu) is outside GPT-2's vocabulary 0..%d", ids[i], i, vocab_size - 1);
        }
        out->append(tok.token_bytes[ids[i]]);
    }
}

inline std::string bpe_decode(const BpeTokenizer& tok, const std::vector<int>& ids) {
    std::string text;
    bpe_decode_append(tok, ids.data(), ids.size(), &text);
    return text;
}
