// Tests of GPT-2's tokenizer (llmc/tokenizer/bpe.h), the tokenizer_gpt2 tool and data preparation
// (llmc/tokenizer/bpe_prepro.h).
//
// The reference ids come from OpenAI's tiktoken, an independent GPT-2 encoder (Rust), run by
// $GPT2_PYTHON through test/tokenizer_oracle.py on the same local encoder.json / vocab.bpe (nothing is
// downloaded). Without a Python that imports tiktoken those tests skip and say why. tiktoken encodes
// Python strings, so it is compared on valid UTF-8 only; bytes that are not UTF-8 are tested by round
// trip. Text is drawn from Unicode 14 (PCRE2's tables), which tiktoken's newer tables agree with.
//
// Files: GPT2_BPE_DIR, else dev/data/gpt2-bpe, else ../shared/data/gpt2-bpe (relative to GPT2_ROOT);
// tinyshakespeare from TINYSHAKESPEARE_TXT, else dev/data/tinyshakespeare/input.txt, else
// ../shared/data/tinyshakespeare/input.txt.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../llmc/tokenizer/bpe.h"
#include "../llmc/tokenizer/bpe_prepro.h"
#include "../llmc/io/dataloader.h"
#include "../llmc/tokenizer/tokenizer_file.h"
#include "test_helpers.h"

namespace {

// ----------------------------------------------------------------------------
// finding files

std::string quote(const std::string& s) { return "'" + s + "'"; }  // for sh; our paths hold no '

std::string first_existing(const std::vector<std::string>& candidates, const std::string& must_contain) {
    for (const std::string& dir : candidates) {
        if (!dir.empty() && file_exists(dir + must_contain)) return dir;
    }
    return "";
}

// GPT2_BPE_DIR, dev/data/gpt2-bpe or ../shared/data/gpt2-bpe; "" if none holds the files.
std::string bpe_dir() {
    const char* env = getenv("GPT2_BPE_DIR");
    return first_existing(
        {env ? env : "", test::root() + "/dev/data/gpt2-bpe", test::root() + "/../shared/data/gpt2-bpe"}, "/vocab.bpe");
}

std::string tinyshakespeare_path() {
    const char* env = getenv("TINYSHAKESPEARE_TXT");
    for (std::string path : {std::string(env ? env : ""), test::root() + "/dev/data/tinyshakespeare/input.txt",
                             test::root() + "/../shared/data/tinyshakespeare/input.txt"}) {
        if (!path.empty() && file_exists(path)) return path;
    }
    return "";
}

std::string tool_path() { return test::root() + "/tokenizer_gpt2"; }

// The tokenizer, loaded once for the whole binary (never freed: it lives as long as the tests).
const BpeTokenizer* tokenizer() {
    static BpeTokenizer* tok = nullptr;
    static bool tried = false;
    if (!tried) {
        tried = true;
        if (!bpe_dir().empty()) {
            tok = new BpeTokenizer();
            bpe_tokenizer_load(tok, bpe_dir());
        }
    }
    return tok;
}

#define REQUIRE_TOKENIZER()                                                                                 \
    do {                                                                                                    \
        if (tokenizer() == nullptr) {                                                                       \
            GTEST_SKIP() << "GPT-2's encoder.json/vocab.bpe not found: set GPT2_BPE_DIR (or run "           \
                            "dev/data/tinyshakespeare.sh once)";                                            \
        }                                                                                                   \
    } while (0)

#define REQUIRE_TOOL()                                                                              \
    do {                                                                                            \
        if (!file_exists(tool_path())) GTEST_SKIP() << tool_path() << " is not built (make tokenizer_gpt2)"; \
    } while (0)

// A BpeEncoder that frees itself.
struct Encoder {
    BpeEncoder enc;
    Encoder() { bpe_encoder_init(&enc, tokenizer()); }
    ~Encoder() { bpe_encoder_free(&enc); }
    std::vector<int> encode(const std::string& text) { return bpe_encode(&enc, text); }
};

// ----------------------------------------------------------------------------
// small helpers

std::string utf8(uint32_t cp) {
    std::string s;
    bpe_utf8_append(&s, cp);
    return s;
}

std::string join_ids(const std::vector<int>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); i++) s += (i ? " " : "") + std::to_string(ids[i]);
    return s;
}

std::vector<int> parse_ids(const std::string& text) {
    std::vector<int> ids;
    std::istringstream in(text);
    int id;
    while (in >> id) ids.push_back(id);
    return ids;
}

// A printable rendering of bytes for failure messages.
std::string escaped(const std::string& s, size_t max_length = 300) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max_length; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += (char)c;
        } else {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
        }
    }
    if (s.size() > max_length) out += "...";
    return out;
}

void write_file(const std::string& path, const std::string& data) {
    std::ofstream out(path, std::ios::binary);
    out << data;
    ASSERT_TRUE(out.good()) << "could not write " << path;
}

// Blank-line documents as prepro --split-blank-lines cuts them: each ends after a "\n\n".
std::vector<std::string> split_blank_lines(const std::string& text) {
    std::vector<std::string> docs;
    size_t start = 0;
    while (start < text.size()) {
        size_t at = text.find("\n\n", start);
        size_t stop = at == std::string::npos ? text.size() : at + 2;
        docs.push_back(text.substr(start, stop - start));
        start = stop;
    }
    return docs;
}

// Random text over everything the encoder must handle: ASCII words, contractions, accented and
// non-Latin scripts, digits of several scripts, emoji sequences, all kinds of whitespace and long runs
// of it, including the characters regex engines disagree about as \s (U+0085, U+FEFF, U+180E; see
// WhitespaceIsUnicodeWhiteSpace). Code points are drawn from blocks fully assigned by Unicode 14
// (PCRE2's tables); later letters are not letters here (doc/tokenizer.md, "Unicode version").
std::string random_text(std::mt19937* rng, int units) {
    static const char* pieces[] = {
        " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n ", "\x0b", "\x0c", "'", "'s", "'t", "'re", "'ve", "'m",
        "'ll", "'d", "'S", "'T", "''", "'''", "don't", "I'm", "we've", "y'all", " it's", "hello", " world",
        "The", " the", "Hello", "HELLO", " x", "123", "3.14", "1,000", "2024", " 42", "#", "!", "?!", "...",
        "--", "\"", "(", ")", "[]", "{}", "<|endoftext|>", "<|", "|>", "$", "%", "&", "*", "@", "\\", "/", "_",
        "caf\xc3\xa9", "na\xc3\xafve", "e\xcc\x81", "\xe2\x80\x94", "\xe2\x80\x9c", "\xe2\x80\x9d", "\xc2\xa0",
        "\xe3\x80\x80", "\xe2\x80\xa8", "\xc2\x85", "\xef\xbb\xbf", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7", "\xf0\x9f\x87\xba\xf0\x9f\x87\xb8",
        "\xe2\x9d\xa4\xef\xb8\x8f", "\xe2\x85\xab", "\xc2\xb2", "\xc2\xbd", "\xd9\xa1\xd9\xa2", "\xef\xbc\x91",
    };
    static const uint32_t blocks[][2] = {
        {0x20, 0x7E},     {0x00, 0x1F},     {0xA0, 0xFF},     {0x100, 0x17F},   {0x300, 0x36F},
        {0x391, 0x3A1},   {0x3B1, 0x3C9},   {0x400, 0x4FF},   {0x5D0, 0x5EA},   {0x621, 0x64A},
        {0x660, 0x669},   {0x905, 0x939},   {0x966, 0x96F},   {0xE01, 0xE3A},   {0x1680, 0x1680},
        {0x2000, 0x200D}, {0x2010, 0x2027}, {0x202F, 0x205F}, {0x2160, 0x2188}, {0x2200, 0x22FF},
        {0x3000, 0x3000}, {0x3041, 0x3096}, {0x30A1, 0x30FA}, {0x4E00, 0x9FA5}, {0xAC00, 0xD7A3},
        {0xFF01, 0xFF5E}, {0x1F300, 0x1F5FF}, {0x1F600, 0x1F64F}, {0x1F3FB, 0x1F3FF}, {0x20000, 0x2A6D6},
    };
    const int num_pieces = sizeof(pieces) / sizeof(pieces[0]);
    const int num_blocks = sizeof(blocks) / sizeof(blocks[0]);
    std::string text;
    for (int u = 0; u < units; u++) {
        int kind = (*rng)() % 20;
        if (kind < 10) {
            text += pieces[(*rng)() % num_pieces];
        } else if (kind < 19) {
            const uint32_t* block = blocks[(*rng)() % num_blocks];
            text += utf8(block[0] + (*rng)() % (block[1] - block[0] + 1));
        } else {
            text += std::string(1 + (*rng)() % 40, " \n\t"[(*rng)() % 3]);  // a run of whitespace
        }
    }
    return text;
}

// ----------------------------------------------------------------------------
// tiktoken through $GPT2_PYTHON

// "" if $GPT2_PYTHON imports tiktoken, else why not (asked once).
std::string tiktoken_missing() {
    static std::string reason;
    static bool tried = false;
    if (!tried) {
        tried = true;
        test::CommandResult r = test::run_command(test::python() + " -c 'import tiktoken'");
        if (r.exit_code != 0) {
            std::string tail = r.output.size() > 400 ? "..." + r.output.substr(r.output.size() - 400) : r.output;
            reason = "`" + test::python() + " -c 'import tiktoken'` failed (install tiktoken, or set GPT2_PYTHON to a "
                     "Python that has it):\n" + tail;
        }
    }
    return reason;
}

#define REQUIRE_TIKTOKEN()                                                                 \
    do {                                                                                   \
        if (!tiktoken_missing().empty()) {                                                 \
            GTEST_SKIP() << "tiktoken comparison not run: " << tiktoken_missing();         \
        }                                                                                  \
    } while (0)

// Records as test/tokenizer_oracle.py reads and writes them: uint32 little-endian length, then bytes.
std::string to_records(const std::vector<std::string>& texts) {
    std::string records;
    for (const std::string& text : texts) {
        uint32_t length = (uint32_t)text.size();
        records.append((const char*)&length, 4);
        records += text;
    }
    return records;
}

std::vector<std::string> from_records(const std::string& records) {
    std::vector<std::string> texts;
    for (size_t pos = 0; pos + 4 <= records.size();) {
        uint32_t length;
        memcpy(&length, records.data() + pos, 4);
        pos += 4;
        if (length > records.size() - pos) break;  // truncated: the caller sees the count is short
        texts.push_back(records.substr(pos, length));
        pos += length;
    }
    return texts;
}

// Runs test/tokenizer_oracle.py COMMAND with the given arguments; false (and a failure) if it fails.
bool run_oracle(const std::string& command, const std::string& args) {
    std::string cmd = test::python() + " " + quote(test::root() + "/test/tokenizer_oracle.py") + " " + command + " " + args;
    test::CommandResult r = test::run_command(cmd);
    if (r.exit_code != 0) ADD_FAILURE() << "tokenizer_oracle.py failed (" << cmd << "):\n" << r.output;
    return r.exit_code == 0;
}

// tiktoken's ids for each text (valid UTF-8), from the BPE files in bpe_dir().
std::vector<std::vector<int>> tiktoken_ids(const std::vector<std::string>& texts, const std::string& name) {
    std::string scratch = test::scratch_dir("tokenizer_oracle_" + name);
    write_file(scratch + "/records.bin", to_records(texts));
    std::vector<std::vector<int>> ids;
    if (!run_oracle("encode", quote(bpe_dir()) + " " + quote(scratch + "/records.bin") + " " + quote(scratch + "/ids.txt"))) {
        return ids;
    }
    std::istringstream lines(test::read_text(scratch + "/ids.txt"));
    std::string line;
    while (std::getline(lines, line)) ids.push_back(parse_ids(line));
    EXPECT_EQ(ids.size(), texts.size()) << "the oracle answered a different number of texts";
    return ids;
}

// Compares our ids with tiktoken's for every text, reporting the first few differences.
void expect_same_as_tiktoken(const std::vector<std::string>& texts, const std::string& name) {
    std::vector<std::vector<int>> expected = tiktoken_ids(texts, name);
    if (expected.size() != texts.size()) return;
    Encoder enc;
    int failures = 0;
    for (size_t i = 0; i < texts.size() && failures < 5; i++) {
        std::vector<int> ours = enc.encode(texts[i]);
        if (ours != expected[i]) {
            failures++;
            ADD_FAILURE() << name << " text " << i << " \"" << escaped(texts[i]) << "\"\n  ours:     "
                          << join_ids(ours).substr(0, 400) << "\n  tiktoken: " << join_ids(expected[i]).substr(0, 400);
        }
    }
}

// ----------------------------------------------------------------------------
// the library

TEST(TokenizerBpe, ByteMapIsGpt2s) {
    uint32_t cp[256];
    bpe_byte_to_codepoint(cp);
    std::vector<bool> seen(512, false);
    for (int b = 0; b < 256; b++) {
        ASSERT_LT(cp[b], 512u);
        EXPECT_FALSE(seen[cp[b]]) << "two bytes share code point " << cp[b];
        seen[cp[b]] = true;
    }
    EXPECT_EQ(cp['!'], (uint32_t)'!');
    EXPECT_EQ(cp['~'], (uint32_t)'~');
    EXPECT_EQ(cp[0xE9], 0xE9u);   // é stands for itself
    EXPECT_EQ(cp[0x00], 0x100u);  // the unprintable bytes take U+0100.. in order
    EXPECT_EQ(cp['\n'], 0x10Au);  // "Ċ"
    EXPECT_EQ(cp[' '], 0x120u);   // "Ġ"
    EXPECT_EQ(cp[0x7F], 0x121u);
    EXPECT_EQ(cp[0xAD], 0x143u);  // the last of the 68
}

TEST(TokenizerBpe, LoadsGpt2Vocabulary) {
    REQUIRE_TOKENIZER();
    const BpeTokenizer& tok = *tokenizer();
    EXPECT_EQ(bpe_vocab_size(tok), 50257);
    EXPECT_EQ(tok.eot_token, 50256);
    EXPECT_EQ(tok.merges.size(), 50000u);
    EXPECT_EQ(tok.token_bytes[50256], "<|endoftext|>");
    EXPECT_EQ(tok.token_bytes[262], " the");
    EXPECT_EQ(tok.token_bytes[198], "\n");
    for (int b = 0; b < 256; b++) EXPECT_EQ(tok.token_bytes[tok.byte_token[b]], std::string(1, (char)b));
}

TEST(TokenizerBpe, KnownEncodings) {
    REQUIRE_TOKENIZER();
    Encoder enc;
    EXPECT_EQ(enc.encode("Hello world"), (std::vector<int>{15496, 995}));
    EXPECT_EQ(enc.encode(""), std::vector<int>());
    // contractions are pieces of their own; an uppercase one is not a contraction
    EXPECT_EQ(enc.encode("I'm can't we'll they've 'S"), (std::vector<int>{40, 1101, 460, 470, 356, 1183, 484, 1053, 705, 50}));
    // the space before a word joins it; the last of a run of spaces does too; "\n\n" is one token
    EXPECT_EQ(enc.encode("  hello  \n\n world"), (std::vector<int>{220, 23748, 220, 220, 628, 995}));
    // numbers of other scripts and kinds (Roman numeral, superscript, fraction) are \p{N}
    EXPECT_EQ(enc.encode("1234567 \xc2\xbd \xe2\x85\xab \xc2\xb2"),
              (std::vector<int>{10163, 2231, 3134, 25208, 2343, 227, 104, 1587, 110}));
}

TEST(TokenizerBpe, EndOfTextIsSpecialOnlyWhenAsked) {
    REQUIRE_TOKENIZER();
    Encoder enc;
    std::vector<int> as_text = {27, 91, 437, 1659, 5239, 91, 29};  // "<", "|", "end", "of", "text", "|", ">"
    EXPECT_EQ(enc.encode("<|endoftext|>"), as_text);
    std::vector<int> ids;
    bpe_encode_allow_special(&enc.enc, "<|endoftext|>", 13, &ids);
    EXPECT_EQ(ids, std::vector<int>{50256});
    ids.clear();
    std::string text = "Hi<|endoftext|> the<|endoftext|>";
    bpe_encode_allow_special(&enc.enc, text.data(), text.size(), &ids);
    EXPECT_EQ(ids, (std::vector<int>{17250, 50256, 262, 50256}));
    EXPECT_EQ(bpe_decode(*tokenizer(), ids), text);
}

std::vector<std::string> pieces_of(const std::string& text) {
    Encoder enc;
    std::vector<std::string> pieces;
    bpe_pretokenize(&enc.enc, text.data(), text.size(),
                    [&](const char* piece, size_t n) { pieces.emplace_back(piece, n); });
    return pieces;
}

// GPT-2's reference encoder (Python's `regex`) means Unicode's White_Space by \s, and so does
// tiktoken's Rust regex. These expectations are what they cut; PCRE2's own \s (U+180E yes) and
// JavaScript's (U+FEFF yes, U+0085 no) differ. The comparisons with tiktoken cover them too.
TEST(TokenizerBpe, WhitespaceIsUnicodeWhiteSpace) {
    REQUIRE_TOKENIZER();
    using V = std::vector<std::string>;
    EXPECT_EQ(pieces_of("!\xc2\x85"), (V{"!", "\xc2\x85"}));                 // NEL is whitespace
    EXPECT_EQ(pieces_of("\xef\xbb\xbf!"), (V{"\xef\xbb\xbf!"}));            // BOM is not
    EXPECT_EQ(pieces_of("a\xe1\xa0\x8e b"), (V{"a", "\xe1\xa0\x8e", " b"}));  // U+180E is not
    EXPECT_EQ(pieces_of("Hello  world\n\n  x"), (V{"Hello", " ", " world", "\n\n ", " x"}));
    EXPECT_EQ(pieces_of("it's 'tis"), (V{"it", "'s", " '", "tis"}));
    // NBSP is whitespace, but only ' ' joins the word after it
    EXPECT_EQ(pieces_of("a\xc2\xa0\xc2\xa0" "b"), (V{"a", "\xc2\xa0", "\xc2\xa0", "b"}));
}

TEST(TokenizerBpe, InvalidUtf8BytesArePiecesOfTheirOwn) {
    REQUIRE_TOKENIZER();
    using V = std::vector<std::string>;
    EXPECT_EQ(pieces_of("ab\xff\xfe" "cd"), (V{"ab", "\xff\xfe", "cd"}));
    EXPECT_EQ(pieces_of("caf\xe9 ok"), (V{"caf", "\xe9", " ok"}));       // Latin-1, not UTF-8
    EXPECT_EQ(pieces_of("x \xc3"), (V{"x", " ", "\xc3"}));               // truncated sequence at the end
    EXPECT_EQ(pieces_of("\xed\xa0\x80!"), (V{"\xed\xa0\x80", "!"}));     // an encoded surrogate
    Encoder enc;
    std::string text = "na\xefve \x80\x81 \xf0\x9f\x98 end";
    EXPECT_EQ(bpe_decode(*tokenizer(), enc.encode(text)), text);
}

// The reference merge loop (GPT-2's encoder.py): find the lowest-ranked adjacent pair, merge all its
// occurrences left to right, repeat. Quadratic; the library's heap must give the same ids.
std::vector<int> reference_merge(const std::string& piece) {
    const BpeTokenizer& tok = *tokenizer();
    std::vector<int> word;
    for (unsigned char c : piece) word.push_back(tok.byte_token[c]);
    while (word.size() > 1) {
        int best_rank = INT32_MAX;
        uint64_t best_pair = 0;
        for (size_t i = 0; i + 1 < word.size(); i++) {
            auto it = tok.merges.find(bpe_pair_key(word[i], word[i + 1]));
            if (it != tok.merges.end() && it->second.rank < best_rank) {
                best_rank = it->second.rank;
                best_pair = it->first;
            }
        }
        if (best_rank == INT32_MAX) break;
        int merged = tok.merges.at(best_pair).merged_id;
        std::vector<int> next;
        for (size_t i = 0; i < word.size(); i++) {
            if (i + 1 < word.size() && bpe_pair_key(word[i], word[i + 1]) == best_pair) {
                next.push_back(merged);
                i++;
            } else {
                next.push_back(word[i]);
            }
        }
        word = next;
    }
    return word;
}

TEST(TokenizerBpe, HeapMergeEqualsReferenceLoop) {
    REQUIRE_TOKENIZER();
    Encoder enc;
    std::mt19937 rng(1234);
    const std::string alphabets[] = {"aeinrst", "ab", "a", "etaoinshrdlu", " .,!", "0123456789", "\xc3\xa9\xc3"};
    for (int trial = 0; trial < 3000; trial++) {
        const std::string& alphabet = alphabets[trial % 7];
        std::string piece;
        int length = 2 + rng() % (trial < 2900 ? 30 : 400);
        for (int i = 0; i < length; i++) piece += alphabet[rng() % alphabet.size()];
        std::vector<int> ours;
        bpe_merge_piece(&enc.enc, piece.data(), piece.size(), &ours);
        ASSERT_EQ(ours, reference_merge(piece)) << "piece \"" << escaped(piece) << "\"";
    }
}

TEST(TokenizerBpe, RandomBytesRoundTrip) {
    REQUIRE_TOKENIZER();
    Encoder enc;
    std::mt19937 rng(42);
    for (int trial = 0; trial < 3000; trial++) {
        std::string text;
        int length = rng() % (trial % 100 == 0 ? 5000 : 200);
        if (trial % 3 == 0) {
            for (int i = 0; i < length; i++) text += (char)(rng() % 256);  // mostly not UTF-8
        } else if (trial % 3 == 1) {
            text = random_text(&rng, length / 4);
        } else {
            text = random_text(&rng, length / 8);  // UTF-8 with stray bytes spliced in
            for (int i = 0; i < 1 + length / 20; i++) text.insert(rng() % (text.size() + 1), 1, (char)(0x80 + rng() % 128));
        }
        std::vector<int> ids = enc.encode(text);
        for (int id : ids) ASSERT_TRUE(id >= 0 && id < 50256) << "id " << id;
        ASSERT_EQ(bpe_decode(*tokenizer(), ids), text) << "text \"" << escaped(text) << "\"";
    }
}

// Long words and long whitespace runs must stay linear: quadratic behaviour on a megabyte would take
// minutes, far past these bounds.
TEST(TokenizerBpe, LongRunsAreNotQuadratic) {
    REQUIRE_TOKENIZER();
    Encoder enc;
    const size_t n = 1 << 20;
    struct Case {
        const char* name;
        std::string text;
    };
    std::vector<Case> cases = {
        {"spaces then a word", std::string(n, ' ') + "x"},
        {"newlines then a word", std::string(n, '\n') + "x"},
        {"one long word", std::string(n, 'a')},
        {"one long number", std::string(n, '7')},
        {"punctuation", std::string(n, '!')},
        {"bytes that are not UTF-8", std::string(n, '\xff')},
    };
    std::string mixed;
    while (mixed.size() < n) mixed += " \t\n\xc2\xa0";
    cases.push_back({"mixed whitespace", mixed + "x"});
    for (const Case& c : cases) {
        auto start = std::chrono::steady_clock::now();
        std::vector<int> ids = enc.encode(c.text);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_LT(seconds, 10.0) << c.name;
        EXPECT_EQ(bpe_decode(*tokenizer(), ids), c.text) << c.name;
    }
}

TEST(TokenizerBpe, CacheDoesNotChangeIds) {
    REQUIRE_TOKENIZER();
    std::mt19937 rng(7);
    std::string text = random_text(&rng, 20000);
    Encoder warm;
    std::vector<int> first = warm.encode(text);
    EXPECT_EQ(warm.encode(text), first);  // now from the cache
    // piece by piece, uncached, through the merge alone
    Encoder bare;
    std::vector<int> uncached;
    bpe_pretokenize(&bare.enc, text.data(), text.size(),
                    [&](const char* piece, size_t n) { bpe_merge_piece(&bare.enc, piece, n, &uncached); });
    EXPECT_EQ(uncached, first);
}

TEST(TokenizerBpe, TokenizerFileRoundTrip) {
    REQUIRE_TOKENIZER();
    std::string dir = test::scratch_dir("tokenizer_file");
    std::string path = dir + "/gpt2_tokenizer.bin";
    prepro_write_tokenizer_file(path, *tokenizer());
    TokenizerFile file;
    ASSERT_TRUE(tokenizer_file_read(path, &file));
    EXPECT_EQ(file.eot_token, 50256);
    EXPECT_EQ(file.token_bytes, tokenizer()->token_bytes);
    long expected_size = HEADER_BYTES;
    for (const std::string& bytes : file.token_bytes) expected_size += 1 + (long)bytes.size();
    FILE* fp = fopenCheck(path.c_str(), "rb");
    EXPECT_EQ(file_size_of(fp), expected_size);
    fclose(fp);
    EXPECT_FALSE(file_exists(path + ".tmp"));
}

TEST(TokenizerBpe, ReadsJsonLinesFields) {
    std::string line = R"({"id": 7, "meta": {"a": [1, 2.5e3, null, true, {"b": "}"}]}, "text": "caf\u00e9 \"q\"\n\ud83d\ude00 \ud800", "x": []})";
    BpeJsonCursor cursor = {line.data(), line.data() + line.size()};
    std::string value;
    ASSERT_TRUE(bpe_json_read_object_field(&cursor, "text", &value)) << cursor.error;
    EXPECT_EQ(value, "caf\xc3\xa9 \"q\"\n\xf0\x9f\x98\x80 \xed\xa0\x80");  // a lone surrogate stays, as WTF-8
    std::string bad = R"({"text": 5})";
    BpeJsonCursor bad_cursor = {bad.data(), bad.data() + bad.size()};
    EXPECT_FALSE(bpe_json_read_object_field(&bad_cursor, "text", &value));
    std::string missing = R"({"story": "x"})";
    BpeJsonCursor missing_cursor = {missing.data(), missing.data() + missing.size()};
    EXPECT_FALSE(bpe_json_read_object_field(&missing_cursor, "text", &value));
}

// ----------------------------------------------------------------------------
// against tiktoken

// The BPE files we load, and ../shared's copy, are OpenAI's (the oracle checks their SHA-256 against
// the sums tiktoken pins), and tiktoken's loader makes of them the same 50,257 tokens we do.
TEST(TokenizerTiktoken, SameVocabularyFromOpenAIsFiles) {
    REQUIRE_TOKENIZER();
    REQUIRE_TIKTOKEN();
    std::vector<std::string> dirs = {bpe_dir()};
    std::string shared = test::root() + "/../shared/data/gpt2-bpe";
    if (file_exists(shared + "/vocab.bpe")) dirs.push_back(shared);
    std::string scratch = test::scratch_dir("tokenizer_oracle_vocab");
    for (const std::string& dir : dirs) {
        if (!run_oracle("vocab", quote(dir) + " " + quote(scratch + "/vocab.bin"))) continue;
        std::vector<std::string> token_bytes = from_records(test::read_text(scratch + "/vocab.bin"));
        ASSERT_EQ(token_bytes.size(), 50257u) << dir;
        for (int id = 0; id < 50257; id++) {
            ASSERT_EQ(token_bytes[id], tokenizer()->token_bytes[id]) << dir << ": id " << id;
        }
    }
}

TEST(TokenizerTiktoken, SameIdsOnVariedText) {
    REQUIRE_TOKENIZER();
    REQUIRE_TIKTOKEN();
    std::vector<std::string> texts = {
        "", "Hello world", "Hello, world! How's it going? I'm fine; we'll see, they've gone, you'd know.",
        "DON'T SHOUT'S 'quoted' ''double'' it''s", "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m",
        "\xce\x94\xce\xb5\xce\xbb\xcf\x84\xce\xb1 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d",
        "\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa7\xe3\x81\x99 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
        "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9 \xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80 \xe0\xb9\x84\xe0\xb8\x97\xe0\xb8\xa2",
        "0 1 12 123 1234 12345 3.14159 1,000,000 2024-01-01 0x1F \xd9\xa1\xd9\xa2\xd9\xa3 \xef\xbc\x91\xef\xbc\x92 \xe2\x85\xab \xc2\xb2\xc2\xbd",
        "\xf0\x9f\x98\x80\xf0\x9f\x98\x81 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xba\xf0\x9f\x87\xb8 \xe2\x9d\xa4\xef\xb8\x8f",
        std::string(1000, ' '), std::string(1000, '\n'), std::string(500, ' ') + "x" + std::string(500, '\t') + "y",
        "a \n b \n\n c \r\n d\t\te\x0b\x0c f  \n  \n  g   ", "trailing spaces   ", "   leading", "\n\n\n\nx\n\n\n",
        "\xc2\xa0\xc2\xa0nbsp\xe3\x80\x80ideographic\xe2\x80\x83" "em\xe2\x80\xa8line\xe2\x80\xa9para",
        "if (x != 0) { return y->z[i] * 2; } // comment\n\tint main() {}\n",
        R"({"key": "value", "n": [1, 2, 3], "nested": {"a": null}})", "https://example.com/path?q=1&r=2#frag",
        "<|endoftext|>", "a<|endoftext|>b", "!!!???...,,,;;;::", "e\xcc\x81 o\xcc\x88 \xcc\x81\xcc\x81",
        "x" + std::string(5000, 'y'), std::string(3000, '7'), "\x01\x02\x1b[0m\x7f", "\xe1\xa0\x8e \xe1\xa0\x8e\xe1\xa0\x8e x",
        "!\xc2\x85 a\xc2\x85\xc2\x85" "b \xc2\x85\n", "\xef\xbb\xbfHello \xef\xbb\xbf world\xef\xbb\xbf!",
        "x" + std::string(100000, ' ') + "y" + std::string(100000, 'z'),
    };
    std::mt19937 rng(2024);
    for (int i = 0; i < 2000; i++) texts.push_back(random_text(&rng, rng() % 40));
    for (int i = 0; i < 20; i++) texts.push_back(random_text(&rng, 3000));
    expect_same_as_tiktoken(texts, "varied");
}

TEST(TokenizerTiktoken, SameIdsOnTinyShakespeare) {
    REQUIRE_TOKENIZER();
    REQUIRE_TIKTOKEN();
    std::string path = tinyshakespeare_path();
    if (path.empty()) GTEST_SKIP() << "tinyshakespeare input.txt not found (set TINYSHAKESPEARE_TXT)";
    std::string text = bpe_read_file(path, "tinyshakespeare");
    // the whole text as one document, and the blank-line documents that prepro makes of it
    std::vector<std::string> texts = split_blank_lines(text);
    texts.push_back(text);
    expect_same_as_tiktoken(texts, "tinyshakespeare");
}

// ----------------------------------------------------------------------------
// the tokenizer_gpt2 tool

std::string tool(const std::string& args) { return quote(tool_path()) + " " + args; }
std::string tool_bpe() { return " --bpe-dir " + quote(bpe_dir()); }

TEST(TokenizerTool, EncodeAndDecodeRoundTrip) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_tool");
    std::mt19937 rng(5);
    std::string text = random_text(&rng, 3000) + "\xff\xfe bytes \xc3 that are not UTF-8";
    write_file(dir + "/in.txt", text);
    test::CommandResult r = test::run_command(tool("encode" + tool_bpe() + " " + quote(dir + "/in.txt")) + " > " + quote(dir + "/ids.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    Encoder enc;
    std::vector<int> ids = enc.encode(text);
    EXPECT_EQ(parse_ids(test::read_text(dir + "/ids.txt")), ids);
    // stdin, and decode back to the same bytes
    r = test::run_command("cat " + quote(dir + "/in.txt") + " | " + tool("encode" + tool_bpe() + " -") + " | " +
                          tool("decode" + tool_bpe()) + " > " + quote(dir + "/out.txt"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(test::read_text(dir + "/out.txt") == text) << "decode(encode(x)) != x through the tool";
    // --special, and decoding with gpt2_tokenizer.bin instead of the BPE files
    write_file(dir + "/eot.txt", "a<|endoftext|>b");
    r = test::run_command(tool("encode --special" + tool_bpe() + " " + quote(dir + "/eot.txt")) + " 2>&1");
    EXPECT_EQ(parse_ids(r.output), (std::vector<int>{64, 50256, 65}));
    prepro_write_tokenizer_file(dir + "/gpt2_tokenizer.bin", *tokenizer());
    r = test::run_command("echo 15496 995 | " + tool("decode --tokenizer " + quote(dir + "/gpt2_tokenizer.bin")));
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.output, "Hello world");
}

TEST(TokenizerTool, BadInputsFailWithAClearMessage) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_tool_errors");
    struct Case {
        std::string command, message;
    };
    std::vector<Case> cases = {
        {tool("encode" + tool_bpe() + " " + quote(dir + "/missing.txt")), "does not exist"},
        {tool("encode" + tool_bpe() + " " + quote(dir)), "is a directory"},
        {"echo 15496 50257 | " + tool("decode" + tool_bpe()), "50257"},
        {"echo 15496 -1 | " + tool("decode" + tool_bpe()), "outside GPT-2's vocabulary"},
        {"echo 15496 hello | " + tool("decode" + tool_bpe()), "is not a token id"},
        {tool("encode --bpe-dir " + quote(dir + "/nowhere") + " -") + " < /dev/null", "does not exist"},
        {tool("frobnicate"), "unknown command"},
        {tool("encode --bogus x"), "unknown option"},
        {tool("prepro --input x --output-dir " + quote(dir)), "--name"},
        {tool("prepro" + tool_bpe() + " --input " + quote(dir + "/missing") + " --output-dir " + quote(dir) + " --name x"),
         "does not exist"},
        {tool("prepro --val-tokens -5 --input x --output-dir y --name z"), "--val-tokens"},
        {tool("prepro --shard-tokens 0 --input x --output-dir y --name z"), "--shard-tokens"},
    };
    for (const Case& c : cases) {
        test::CommandResult r = test::run_command(c.command);
        EXPECT_NE(r.exit_code, 0) << c.command;
        EXPECT_NE(r.output.find("Error"), std::string::npos) << c.command << "\n" << r.output;
        EXPECT_NE(r.output.find(c.message), std::string::npos) << c.command << "\n" << r.output;
    }
}

// ----------------------------------------------------------------------------
// data preparation

std::vector<std::string> list_dir(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return names;
    while (struct dirent* entry = readdir(d)) {
        if (entry->d_name[0] != '.') names.push_back(entry->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

// The token stream prepro should write: end-of-text, then each document's ids.
std::vector<uint16_t> expected_stream(const std::vector<std::string>& docs) {
    Encoder enc;
    std::vector<uint16_t> stream;
    for (const std::string& doc : docs) {
        stream.push_back(50256);
        for (int id : enc.encode(doc)) stream.push_back((uint16_t)id);
    }
    return stream;
}

// Documents of plain ASCII-ish text, a few kilobytes each, generated (so no download is needed).
std::vector<std::string> generated_documents(int count, int words_per_doc, unsigned seed) {
    static const char* words[] = {"the", "king", "shall", "speak", "and", "we", "will", "hear", "him", "now",
                                  "O", "my", "lord", "what", "news", "from", "Rome", "?", "!", ",", ".", "'tis", "I'll"};
    std::mt19937 rng(seed);
    std::vector<std::string> docs;
    for (int d = 0; d < count; d++) {
        std::string doc;
        for (int w = 0; w < words_per_doc; w++) {
            doc += words[rng() % (sizeof(words) / sizeof(words[0]))];
            doc += (rng() % 12 == 0) ? "\n" : " ";
        }
        docs.push_back(doc);
    }
    return docs;
}

TEST(TokenizerPrepro, TinyShakespeareGivesLlmcSplit) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string path = tinyshakespeare_path();
    if (path.empty()) GTEST_SKIP() << "tinyshakespeare input.txt not found (set TINYSHAKESPEARE_TXT)";
    std::string dir = test::scratch_dir("tokenizer_prepro_ts");
    test::CommandResult r = test::run_command(tool("prepro" + tool_bpe() + " --input " + quote(path) + " --output-dir " +
                                                   quote(dir) + " --name tinyshakespeare --split-blank-lines"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"gpt2_tokenizer.bin", "tinyshakespeare_train_000000.bin",
                                                       "tinyshakespeare_val_000000.bin"}));
    std::vector<uint16_t> val = prepro_read_shard(dir + "/tinyshakespeare_val_000000.bin");
    std::vector<uint16_t> train = prepro_read_shard(dir + "/tinyshakespeare_train_000000.bin");
    // llm.c's dev/data/tinyshakespeare.py writes 32,768 val and 305,260 train tokens
    EXPECT_EQ(val.size(), 32768u);
    EXPECT_EQ(train.size(), 305260u);
    std::vector<uint16_t> stream = expected_stream(split_blank_lines(bpe_read_file(path, "tinyshakespeare")));
    ASSERT_EQ(stream.size(), val.size() + train.size());
    EXPECT_TRUE(std::equal(val.begin(), val.end(), stream.begin()));
    EXPECT_TRUE(std::equal(train.begin(), train.end(), stream.begin() + val.size()));
    TokenizerFile file;
    ASSERT_TRUE(tokenizer_file_read(dir + "/gpt2_tokenizer.bin", &file));
    EXPECT_EQ(file.token_bytes, tokenizer()->token_bytes);
}

// A directory of files (one document each, sorted by path, subdirectories too), cut into small shards
// with several threads: every shard has its exact size and the stream is the documents in order; one
// thread writes the same bytes.
TEST(TokenizerPrepro, DirectoryShardsAndThreads) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_prepro_dir");
    std::vector<std::string> docs = generated_documents(12, 400, 11);
    docs.push_back("caf\xc3\xa9 \xf0\x9f\x98\x80 and bytes \xff\xfe that are not UTF-8\n");
    make_dir_check(dir + "/in");
    make_dir_check(dir + "/in/sub");
    std::vector<std::string> names;
    for (size_t i = 0; i < docs.size(); i++) {
        char name[64];
        snprintf(name, sizeof(name), i % 3 == 0 ? "sub/doc%02zu.txt" : "doc%02zu.txt", i);
        names.push_back(name);
        write_file(dir + "/in/" + name, docs[i]);
    }
    write_file(dir + "/in/.hidden", "skipped");
    // the order prepro reads: sorted names per directory, a subdirectory where its name sorts
    std::vector<size_t> order(docs.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return names[a] < names[b]; });
    std::vector<std::string> ordered;
    for (size_t i : order) ordered.push_back(docs[i]);
    std::vector<uint16_t> stream = expected_stream(ordered);

    for (int threads : {1, 2}) {
        std::string out = dir + "/out" + std::to_string(threads);
        test::CommandResult r = test::run_command(
            tool("prepro" + tool_bpe() + " --input " + quote(dir + "/in") + " --output-dir " + quote(out) +
                 " --name gen --val-tokens 500 --shard-tokens 1000 --threads " + std::to_string(threads)));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        std::vector<uint16_t> val = prepro_read_shard(out + "/gen_val_000000.bin");
        EXPECT_EQ(val.size(), 500u);
        std::vector<uint16_t> all = val;
        int shards = 0;
        for (; file_exists(prepro_shard_path(out, "gen", "train", shards)); shards++) {
            std::vector<uint16_t> shard = prepro_read_shard(prepro_shard_path(out, "gen", "train", shards));
            all.insert(all.end(), shard.begin(), shard.end());
            bool last = !file_exists(prepro_shard_path(out, "gen", "train", shards + 1));
            if (!last) {
                EXPECT_EQ(shard.size(), 1000u);
            }
        }
        EXPECT_EQ(shards, (int)ceil_div((long)stream.size() - 500, 1000));
        EXPECT_TRUE(all == stream) << "threads " << threads;
    }
    EXPECT_TRUE(test::read_text(dir + "/out1/gen_train_000003.bin") == test::read_text(dir + "/out2/gen_train_000003.bin"));
}

TEST(TokenizerPrepro, JsonLinesAndBlankLines) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_prepro_jsonl");
    write_file(dir + "/data.jsonl",
               "{\"text\": \"First document.\\nIt has two lines.\", \"id\": 1}\n"
               "\n"
               "{\"meta\": {\"tags\": [\"a\", \"b\"]}, \"text\": \"Second: caf\\u00e9 \\ud83d\\ude00\"}\r\n"
               "{\"text\": \"Third, with no newline at the end of the file\"}");
    test::CommandResult r = test::run_command(tool("prepro" + tool_bpe() + " --input " + quote(dir + "/data.jsonl") +
                                                   " --output-dir " + quote(dir + "/out") + " --name j --val-tokens 3 --jsonl text"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<uint16_t> all = prepro_read_shard(dir + "/out/j_val_000000.bin");
    std::vector<uint16_t> train = prepro_read_shard(dir + "/out/j_train_000000.bin");
    all.insert(all.end(), train.begin(), train.end());
    EXPECT_TRUE(all == expected_stream({"First document.\nIt has two lines.", "Second: caf\xc3\xa9 \xf0\x9f\x98\x80",
                                        "Third, with no newline at the end of the file"}));
    // a bad line is reported with its file and line number
    write_file(dir + "/bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 12}\n");
    r = test::run_command(tool("prepro" + tool_bpe() + " --input " + quote(dir + "/bad.jsonl") + " --output-dir " +
                               quote(dir + "/bad") + " --name j --val-tokens 0 --jsonl text"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("bad.jsonl' line 2"), std::string::npos) << r.output;
    // blank lines: each document keeps its "\n\n", as llm.c's tinyshakespeare script cuts them
    std::string text = "one\n\ntwo\nstill two\n\n\n\nthree\n";
    write_file(dir + "/blank.txt", text);
    r = test::run_command(tool("prepro" + tool_bpe() + " --input " + quote(dir + "/blank.txt") + " --output-dir " +
                               quote(dir + "/blank") + " --name b --val-tokens 0 --split-blank-lines"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(prepro_read_shard(dir + "/blank/b_train_000000.bin") ==
                expected_stream({"one\n\n", "two\nstill two\n\n", "\n\n", "three\n"}));
}

// A disk that fills up (simulated with a file size limit) fails with a message, and leaves neither a
// shard for the data that did not fit nor its .tmp.
TEST(TokenizerPrepro, FullDiskLeavesNoHalfWrittenShard) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_prepro_full");
    std::string text;
    for (const std::string& doc : generated_documents(40, 20000, 3)) text += doc;  // ~2 MB of tokens: past either limit
    write_file(dir + "/in.txt", text);
    make_dir_check(dir + "/out");
    // SIGXFSZ ignored: a write past the limit fails with EFBIG, as one on a full disk fails with ENOSPC
    test::CommandResult r = test::run_command(
        "sh -c \"trap '' XFSZ; ulimit -f 1000; exec " + tool_path() + " prepro --bpe-dir '" + bpe_dir() + "' --input '" +
        dir + "/in.txt' --output-dir '" + dir + "/out' --name full --val-tokens 1000\"");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Error"), std::string::npos) << r.output;
    std::vector<std::string> left = list_dir(dir + "/out");
    EXPECT_EQ(left, (std::vector<std::string>{"full_val_000000.bin", "gpt2_tokenizer.bin"})) << r.output;
    EXPECT_EQ(prepro_read_shard(dir + "/out/full_val_000000.bin").size(), 1000u);
}

TEST(TokenizerPrepro, TooFewTokensForTheValSplitWritesNoShard) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_prepro_small");
    write_file(dir + "/in.txt", "Just a few tokens.");
    test::CommandResult r = test::run_command(tool("prepro" + tool_bpe() + " --input " + quote(dir + "/in.txt") +
                                                   " --output-dir " + quote(dir + "/out") + " --name s"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("--val-tokens"), std::string::npos) << r.output;
    EXPECT_FALSE(file_exists(dir + "/out/s_val_000000.bin"));
    EXPECT_FALSE(file_exists(dir + "/out/s_train_000000.bin"));
}

// Shards written by prepro, read back through the trainers' data loader (llmc/io/dataloader.h): every
// batch holds the stream's tokens where FORMATS.md's layout puts them.
TEST(TokenizerPrepro, ShardsRoundTripThroughTheDataLoader) {
    REQUIRE_TOKENIZER();
    REQUIRE_TOOL();
    std::string dir = test::scratch_dir("tokenizer_prepro_loader");
    std::vector<std::string> docs = generated_documents(30, 300, 99);
    std::string text;
    for (const std::string& doc : docs) text += doc + "\n\n";
    write_file(dir + "/in.txt", text);
    const int shard_tokens = 3000, val_tokens = 700;
    test::CommandResult r = test::run_command(
        tool("prepro" + tool_bpe() + " --input " + quote(dir + "/in.txt") + " --output-dir " + quote(dir + "/out") +
             " --name rt --split-blank-lines --val-tokens " + std::to_string(val_tokens) + " --shard-tokens " +
             std::to_string(shard_tokens)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<uint16_t> stream = expected_stream(split_blank_lines(text));
    const int B = 1, T = 64;  // one sample a batch: sample i of a shard is its T+1 tokens from i*T
    // val: one shard, the first val_tokens tokens
    DataLoader val;
    dataloader_init(&val, dir + "/out/rt_val_*.bin", B, T, 0, 1, false, 50257);
    ASSERT_EQ(dataloader_epoch_samples(&val), (val_tokens - 1) / T);
    for (int64_t b = 0; b < dataloader_epoch_samples(&val); b++) {
        dataloader_next_batch(&val);
        for (int i = 0; i < T; i++) {
            ASSERT_EQ(val.inputs[i], stream[b * T + i]);
            ASSERT_EQ(val.targets[i], stream[b * T + i + 1]);
        }
    }
    // train: shards in order, each read from its own start
    DataLoader train;
    dataloader_init(&train, dir + "/out/rt_train_*.bin", B, T, 0, 1, false, 50257);
    ASSERT_EQ(train.files.size(), (size_t)ceil_div((long)stream.size() - val_tokens, shard_tokens));
    int64_t batches = 0;
    for (size_t shard = 0; shard < train.files.size(); shard++) {
        size_t shard_start = val_tokens + shard * shard_tokens;
        size_t shard_size = std::min((size_t)shard_tokens, stream.size() - shard_start);
        EXPECT_EQ(train.file_tokens[shard], (int64_t)shard_size);
        for (size_t sample = 0; sample < (shard_size - 1) / T; sample++, batches++) {
            dataloader_next_batch(&train);
            for (int i = 0; i < T; i++) {
                ASSERT_EQ(train.inputs[i], stream[shard_start + sample * T + i]);
                ASSERT_EQ(train.targets[i], stream[shard_start + sample * T + i + 1]);
            }
        }
    }
    EXPECT_EQ(batches, dataloader_epoch_samples(&train));
}

}  // namespace
