// HellaSwag (Zellers et al. 2019): pick the right ending of a sentence among 4, scored the way
// llm.c and EleutherAI's lm-evaluation-harness score it. For each ending, the model reads
// context + ending and we take the cross-entropy of the ending's tokens only (each given everything
// before it); the context's own tokens are not scored. Then, per example:
//   acc        the ending with the lowest *summed* loss, i.e. the highest log-likelihood. This is the
//              harness's `acc`: `np.argmax(lls)` over the continuations' log-likelihoods.
//   acc_norm   the lowest summed loss divided by the ending's length in *characters*: the harness's
//              `acc_norm`, lm_eval/api/task.py, ConfigurableTask.process_results (multiple_choice):
//                  completion_len = np.array([float(len(i)) for i in choices])
//                  pred_norm = np.argmax(lls / completion_len)
//              len() of a Python str counts Unicode code points, and `choices` are the endings without
//              the " " the harness puts between context and continuation (target_delimiter), so we
//              count the code points of the ending's decoded bytes minus that one leading space.
//              This is the number the GPT-2/GPT-3 papers' HellaSwag tables and the leaderboards use.
//   acc_token  the lowest *mean* loss per token of the ending: what llm.c's dev/data/hellaswag.py
//              calls acc_norm (and what ../shared/FORMATS.md describes), kept so numbers compare with
//              llm.c's logs. Per-token normalization depends on the tokenizer; per-character does not.
// Ties go to the lower-numbered ending, as np.argmax does.
//
// The file (../shared/FORMATS.md, "Evaluation set"; written by dev/data/hellaswag.py): a 256-int32
// header {20240522, 1, examples, longest example in bytes}, then per example a stream of uint16:
// 65535, the example's size in bytes (these two fields included), its index, the label, the number of
// endings N, the context length and tokens, then N times an ending's length and tokens.
//
// Evaluation packs one ending per row into fixed (R, Tr) batches (padded with token 0, whose losses
// are ignored; attention is causal, so padding after a row's end cannot change it) and asks the
// trainer for the per-position losses of each batch: the CPU and CUDA trainers share everything
// here but their forward pass.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../tokenizer/tokenizer_file.h"
#include "../utils.h"

constexpr int32_t HELLASWAG_MAGIC = 20240522;
constexpr int32_t HELLASWAG_VERSION = 1;
constexpr int HELLASWAG_MAX_ENDINGS = 16;

struct HellaSwagExample {
    int index = 0, label = 0;
    std::vector<int> context;
    std::vector<std::vector<int>> endings;
    std::vector<int> ending_chars;  // characters of each ending, without the leading space (acc_norm)
};

struct HellaSwagSet {
    std::vector<HellaSwagExample> examples;
    int longest_row = 0;  // tokens of the longest context + ending, less one (the model's input length)
};

// Reads `path`; every field is checked (sizes, label, token ids < vocab_size) and any problem is a
// fatal error naming the file, the example and what is wrong.
inline void hellaswag_read(const std::string& path, int vocab_size, HellaSwagSet* set) {
    const char* what = "HellaSwag file";
    if (!file_exists(path)) fatal("%s '%s' does not exist (make it with dev/data/hellaswag.py)", what, path.c_str());
    FILE* fp = fopenCheck(path.c_str(), "rb");
    long size = file_size_of(fp);
    int32_t header[HEADER_INTS];
    read_file_header(fp, path.c_str(), what, HELLASWAG_MAGIC, &HELLASWAG_VERSION, 1, header);
    int32_t count = header[2], longest_bytes = header[3];
    if (count <= 0 || longest_bytes <= 0 || (long)count * 14 > size) {
        fatal("%s '%s' claims %d examples, the longest %d bytes, in %ld bytes", what, path.c_str(), count,
              longest_bytes, size);
    }
    std::vector<uint16_t> data((size - HEADER_BYTES) / 2);
    if ((size - HEADER_BYTES) % 2 != 0) fatal("%s '%s' has an odd number of bytes after its header", what, path.c_str());
    freadCheck(data.data(), 2, data.size(), fp);
    fcloseCheck(fp);
    set->examples.assign(count, HellaSwagExample());
    set->longest_row = 0;
    size_t pos = 0;
    for (int32_t e = 0; e < count; e++) {
        auto fail = [&](const char* problem) {
            fatal("%s '%s', example %d of %d (at byte %ld): %s", what, path.c_str(), e, count,
                  (long)(HEADER_BYTES + 2 * pos), problem);
        };
        if (pos + 6 > data.size()) fail("the file ends inside it (truncated)");
        if (data[pos] != 65535) fail("does not start with the marker 65535 (corrupt, or not this format)");
        size_t words = data[pos + 1] / 2;
        if (data[pos + 1] % 2 != 0 || words < 8) fail("its size field is wrong");
        if (pos + words > data.size()) fail("it runs past the end of the file (truncated)");
        if ((long)data[pos + 1] > longest_bytes) fail("it is longer than the header's longest example");
        HellaSwagExample& ex = set->examples[e];
        ex.index = data[pos + 2];
        ex.label = data[pos + 3];
        int num_endings = data[pos + 4];
        if (num_endings < 1 || num_endings > HELLASWAG_MAX_ENDINGS) fail("its number of endings is not 1..16");
        if (ex.label >= num_endings) fail("its label is not one of its endings");
        size_t p = pos + 5, end = pos + words;
        auto read_tokens = [&](std::vector<int>* out) {
            if (p >= end) fail("a length field runs past the example's size");
            size_t n = data[p++];
            if (n == 0) fail("a context or ending has no tokens");
            if (p + n > end) fail("tokens run past the example's size");
            for (size_t i = 0; i < n; i++) {
                if (data[p + i] >= vocab_size) fail("a token id is outside the model's vocabulary");
                out->push_back(data[p + i]);
            }
            p += n;
        };
        read_tokens(&ex.context);
        ex.endings.resize(num_endings);
        for (auto& ending : ex.endings) {
            read_tokens(&ending);
            set->longest_row = std::max(set->longest_row, (int)(ex.context.size() + ending.size() - 1));
        }
        if (p != end) fail("its size field does not match its contents");
        pos = end;
    }
    if (pos != data.size()) {
        fatal("%s '%s' has %ld trailing bytes after its %d examples", what, path.c_str(), (long)(2 * (data.size() - pos)), count);
    }
}

// Unicode code points in UTF-8 bytes (what Python's len() gives for the decoded string): every byte
// that is not a continuation byte 10xxxxxx starts one.
inline int utf8_code_points(const std::string& bytes) {
    int n = 0;
    for (unsigned char c : bytes) n += (c & 0xC0) != 0x80;
    return n;
}

// Fills ending_chars from the tokens' bytes (gpt2_tokenizer.bin).
inline void hellaswag_count_chars(HellaSwagSet* set, const TokenizerFile& tok) {
    for (HellaSwagExample& ex : set->examples) {
        ex.ending_chars.clear();
        for (const auto& ending : ex.endings) {
            std::string text;
            for (int id : ending) text += tokenizer_file_decode(tok, id);
            int chars = utf8_code_points(text) - (!text.empty() && text[0] == ' ' ? 1 : 0);
            ex.ending_chars.push_back(std::max(chars, 1));
        }
    }
}

// Per-example results (for tests and inspection).
struct HellaSwagScore {
    int index = 0, label = 0;
    std::vector<double> sum_loss;  // per ending: the sum of its tokens' cross-entropies (nats)
    int pred = 0, pred_norm = 0, pred_token = 0;
};

struct HellaSwagResult {
    double examples = 0, correct = 0, correct_norm = 0, correct_token = 0;  // sums (all-reduced by the trainer)
    double acc() const { return examples > 0 ? correct / examples : 0.0; }
    double acc_norm() const { return examples > 0 ? correct_norm / examples : 0.0; }
    double acc_token() const { return examples > 0 ? correct_token / examples : 0.0; }
};

inline HellaSwagScore hellaswag_score(const HellaSwagExample& ex, const std::vector<double>& sum_loss) {
    HellaSwagScore s;
    s.index = ex.index;
    s.label = ex.label;
    s.sum_loss = sum_loss;
    for (size_t j = 1; j < sum_loss.size(); j++) {
        if (sum_loss[j] < sum_loss[s.pred]) s.pred = (int)j;
        if (sum_loss[j] / ex.ending_chars[j] < sum_loss[s.pred_norm] / ex.ending_chars[s.pred_norm]) s.pred_norm = (int)j;
        if (sum_loss[j] / ex.endings[j].size() < sum_loss[s.pred_token] / ex.endings[s.pred_token].size()) s.pred_token = (int)j;
    }
    return s;
}

// Scores examples rank, rank + P, ... among the first `max_examples` (0: all), R rows of Tr tokens per
// call of row_losses(inputs (R*Tr), targets (R*Tr), R, Tr, losses out (R*Tr)). Returns this process's
// counts; the caller sums them over processes. Tr must be at least set.longest_row.
template <typename RowLosses>
HellaSwagResult hellaswag_evaluate(const HellaSwagSet& set, int max_examples, int rank, int num_processes, int R,
                                   int Tr, RowLosses row_losses, std::vector<HellaSwagScore>* details = nullptr) {
    if (Tr < set.longest_row) fatal("hellaswag_evaluate: rows of %d tokens, the longest needs %d", Tr, set.longest_row);
    int count = (int)set.examples.size();
    if (max_examples > 0 && max_examples < count) count = max_examples;
    struct Item { int example, ending; };
    std::vector<Item> items;
    for (int e = rank; e < count; e += num_processes) {
        for (int j = 0; j < (int)set.examples[e].endings.size(); j++) items.push_back({e, j});
    }
    std::vector<std::vector<double>> sums(count);
    std::vector<int> inputs((size_t)R * Tr), targets((size_t)R * Tr);
    std::vector<float> losses((size_t)R * Tr);
    for (size_t first = 0; first < items.size(); first += R) {
        std::fill(inputs.begin(), inputs.end(), 0);
        std::fill(targets.begin(), targets.end(), 0);
        for (int r = 0; r < R && first + r < items.size(); r++) {
            const HellaSwagExample& ex = set.examples[items[first + r].example];
            std::vector<int> row = ex.context;
            const std::vector<int>& ending = ex.endings[items[first + r].ending];
            row.insert(row.end(), ending.begin(), ending.end());
            for (size_t t = 0; t + 1 < row.size(); t++) {
                inputs[(size_t)r * Tr + t] = row[t];
                targets[(size_t)r * Tr + t] = row[t + 1];
            }
        }
        row_losses(inputs.data(), targets.data(), R, Tr, losses.data());
        for (int r = 0; r < R && first + r < items.size(); r++) {
            const Item& item = items[first + r];
            const HellaSwagExample& ex = set.examples[item.example];
            size_t start = ex.context.size() - 1, n = ex.endings[item.ending].size();  // ending's first target
            double sum = 0.0;
            for (size_t t = start; t < start + n; t++) sum += losses[(size_t)r * Tr + t];
            sums[item.example].resize(ex.endings.size());
            sums[item.example][item.ending] = sum;
        }
    }
    HellaSwagResult result;
    for (int e = rank; e < count; e += num_processes) {
        HellaSwagScore s = hellaswag_score(set.examples[e], sums[e]);
        result.examples += 1;
        result.correct += s.pred == s.label;
        result.correct_norm += s.pred_norm == s.label;
        result.correct_token += s.pred_token == s.label;
        if (details) details->push_back(s);
    }
    return result;
}

// hellaswag_evaluate on every process, then the counts summed over them with sum(double) (a collective
// each process calls in the same order): the result for the whole set.
template <typename RowLosses, typename Sum>
HellaSwagResult hellaswag_evaluate_all(const HellaSwagSet& set, int max_examples, int rank, int num_processes, int R,
                                       int Tr, RowLosses row_losses, Sum sum,
                                       std::vector<HellaSwagScore>* details = nullptr) {
    HellaSwagResult local = hellaswag_evaluate(set, max_examples, rank, num_processes, R, Tr, row_losses, details);
    HellaSwagResult total;
    total.examples = sum(local.examples);
    total.correct = sum(local.correct);
    total.correct_norm = sum(local.correct_norm);
    total.correct_token = sum(local.correct_token);
    return total;
}

// Loads the file for a run (-hs): the token bytes are needed for acc_norm's character counts.
inline void hellaswag_load_for_run(const std::string& path, int vocab_size, const TokenizerFile* tok, HellaSwagSet* set) {
    if (tok == nullptr) {
        fatal("HellaSwag (-hs %s): acc_norm counts the endings' characters, which needs gpt2_tokenizer.bin (-tk)",
              path.c_str());
    }
    hellaswag_read(path, vocab_size, set);
    hellaswag_count_chars(set, *tok);
    printf("HellaSwag: %zu examples from %s, longest context + ending %d tokens\n", set->examples.size(), path.c_str(),
           set->longest_row + 1);
}
