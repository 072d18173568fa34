// Evaluation and sampling:
//  - HellaSwag (llmc/run/hellaswag.h): a small file in HellaSwag's JSONL format, written here, is
//    tokenized by dev/data/hellaswag.py (our C++ tokenizer) and scored by our CPU model, in process and
//    through train_gpt2 -x 0 -hs; the PyTorch oracle scores the same items from the definition
//    (tiktoken's tokens, float64, len() in characters): per-ending losses, the three predictions and
//    the accuracies must agree. Malformed files are refused with a message.
//  - Sampling (llmc/run/sampler.h, -st -sk -sp -ss): temperature 1 / top-k 0 is the old sampler bit for
//    bit, top-k keeps only the k best, temperature 0 is argmax; runs are deterministic given -ss and
//    a prompt is tokenized and printed first.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../llmc/adamw.h"
#include "../llmc/run/args.h"
#include "../llmc/attention.h"
#include "../llmc/tokenizer/bpe.h"
#include "../llmc/io/checkpoint.h"
#include "../llmc/crossentropy.h"
#include "../llmc/io/dataloader.h"
#include "../llmc/encoder.h"
#include "../llmc/gelu.h"
#include "../llmc/gpt2_config.h"
#include "../llmc/gpt2_init.h"
#include "../llmc/run/hellaswag.h"
#include "../llmc/layernorm.h"
#include "../llmc/run/logger.h"
#include "../llmc/matmul.h"
#include "../llmc/parallel/comm_mpi.h"
#include "../llmc/tokenizer/prompt.h"
#include "../llmc/rand.h"
#include "../llmc/residual.h"
#include "../llmc/run/sampler.h"
#include "../llmc/run/schedulers.h"
#include "../llmc/tokenizer/tokenizer_file.h"
#include "../llmc/run/run_loop.h"
#include "../llmc/run/train_common.h"
#include "../llmc/utils.h"
#include "../llmc/parallel/zero.h"
#include "test_helpers.h"

// Our CPU model, in a namespace of its own (test_model.cpp compiles it into this binary too; see test_hf.cpp).
#define TESTING
namespace eval_ours {
#include "../train_gpt2.cpp"
}

namespace {

std::string bpe_dir_for_tests() {
    const char* env = getenv("GPT2_BPE_DIR");
    for (std::string dir : {std::string(env ? env : ""), test::root() + "/dev/data/gpt2-bpe",
                            test::root() + "/../shared/data/gpt2-bpe"}) {
        if (!dir.empty() && file_exists(dir + "/vocab.bpe") && file_exists(dir + "/encoder.json")) return dir;
    }
    return "";
}

#define REQUIRE_BPE()                                                                              \
    std::string bpe = bpe_dir_for_tests();                                                         \
    if (bpe.empty()) GTEST_SKIP() << "GPT-2's encoder.json/vocab.bpe not found (GPT2_BPE_DIR)"

// Six examples in HellaSwag's format: different lengths, labels, a non-ASCII ending (characters !=
// bytes, for acc_norm), and the extra fields the real file has (ignored).
const char* HELLASWAG_JSONL =
    R"({"ind": 4, "activity_label": "Removing ice from car", "ctx": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. then", "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.", ", the man puts on a christmas coat, knitted with netting.", ", the man continues removing the snow on his car."], "label": 3, "split": "val"})" "\n"
    R"({"ctx": "A woman is outside with a bucket and a dog. The dog is running around trying to avoid a bath. She", "endings": ["rinses the bucket off with soap and blow dry the dog's head.", "uses a hose to keep it from getting soapy.", "gets the dog wet, then it runs away again.", "gets into a bath tub with the dog."], "label": 2})" "\n"
    R"({"ctx": "The chef slices the onions.", "endings": ["He adds them to the pan with butter.", "Café au lait is served in a bowl — très bien.", "The onions sing a song.", "He throws the knife at the moon."], "label": 0})" "\n"
    R"({"ctx": "Two kids are playing soccer in a park. One kid", "endings": ["kicks the ball into the goal.", "eats the ball.", "flies to the moon on the ball.", "reads a book about the ocean floor and its many creatures."], "label": 0})" "\n"
    R"({"ctx": "A man is seen speaking to the camera and pans out to more men.", "endings": ["They all begin playing instruments.", "The men then lift weights over their heads.", "A woman swims.", "The camera zooms in on a cat."], "label": 1})" "\n"
    R"({"ctx": "How to boil an egg. Fill a pot with water.", "endings": ["Bring the water to a boil and add the egg.", "Paint the egg blue.", "Throw the pot away.", "Sing to the egg until it hatches."], "label": 0})" "\n";

std::string tiny_model_dir() {
    // GPT-2's vocabulary (the examples use real GPT-2 ids), otherwise tiny
    return test::oracle("eval_tiny", "--layers 2 --channels 32 --heads 2 --max-seq-len 64 --vocab 50257 --seed 7 "
                                     "-b 1 -t 8 --data-tokens 64");
}

struct HellaSwagFixture {
    std::string dir, jsonl, bin, tokenizer, model;
};

HellaSwagFixture make_hellaswag_fixture(const std::string& bpe) {
    HellaSwagFixture f;
    f.dir = test::scratch_dir("hellaswag");
    f.jsonl = f.dir + "/mini.jsonl";
    f.bin = f.dir + "/mini.bin";
    f.tokenizer = f.dir + "/gpt2_tokenizer.bin";
    f.model = tiny_model_dir() + "/model.bin";
    std::ofstream(f.jsonl, std::ios::binary) << HELLASWAG_JSONL;
    test::CommandResult r = test::run_command(test::python() + " " + test::root() + "/dev/data/hellaswag.py --input " +
                                              f.jsonl + " --output " + f.bin + " --bpe-dir " + bpe);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    BpeTokenizer tok;
    bpe_tokenizer_load(&tok, bpe);
    tokenizer_file_write(f.tokenizer, bpe_tokenizer_file(tok));
    bpe_tokenizer_free(&tok);
    return f;
}

// The oracle's hellaswag.json: per example the label, the 4 summed losses and the 3 predictions.
struct OracleScore {
    int label, pred, pred_norm, pred_token;
    std::vector<double> sum_loss;
};

std::vector<OracleScore> oracle_scores(const std::string& text) {
    std::vector<OracleScore> out;
    size_t at = 0;
    while ((at = text.find("{\"label\"", at)) != std::string::npos) {
        size_t end = text.find('}', at);
        std::string item = text.substr(at, end - at + 1);
        auto number = [&](const char* key) {
            size_t k = item.find(std::string("\"") + key + "\": ");
            return atoi(item.c_str() + k + strlen(key) + 4);
        };
        OracleScore s;
        s.label = number("label");
        s.pred = number("pred");
        s.pred_norm = number("pred_norm");
        s.pred_token = number("pred_token");
        s.sum_loss = test::json_array(item, "sum_loss");
        out.push_back(s);
        at = end;
    }
    return out;
}

// The gap between the best and the second-best score: a prediction closer than fp32 rounding to a
// tie may legitimately differ between our fp32 model and the float64 oracle.
double margin(std::vector<double> scores) {
    std::sort(scores.begin(), scores.end());
    return scores[1] - scores[0];
}

// Our summed losses vs the float64 oracle's: each position's loss is within ~1e-5 of it (fp32
// logits, test_model.cpp), an ending has at most ~30 tokens: 1e-3 absolute leaves a 3x margin.
TEST(HellaSwag, MatchesOracleScoringOfTheSameItems) {
    REQUIRE_BPE();
    HellaSwagFixture f = make_hellaswag_fixture(bpe);
    std::string oracle_out = test::scratch_dir("hellaswag_oracle");
    test::CommandResult r = test::run_command(test::python() + " " + test::root() + "/test/oracle/gpt2_oracle.py --out " +
                                              oracle_out + " --hellaswag " + f.jsonl + " --init-from " + f.model +
                                              " --bpe-dir " + bpe);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string json = test::read_text(oracle_out + "/hellaswag.json");
    std::vector<OracleScore> oracle = oracle_scores(json);
    ASSERT_EQ(oracle.size(), 6u) << json;

    eval_ours::GPT2 model;
    eval_ours::gpt2_load_checkpoint(&model, f.model);
    HellaSwagSet set;
    hellaswag_read(f.bin, model.config.vocab_size, &set);
    TokenizerFile tok;
    ASSERT_TRUE(tokenizer_file_read(f.tokenizer, &tok));
    hellaswag_count_chars(&set, tok);
    EXPECT_EQ(set.examples[2].ending_chars[1], 45);  // "Café au lait is served in a bowl — très bien." (49 bytes)
    TrainArgs args;
    args.B = 1;
    args.T = 8;
    std::vector<HellaSwagScore> ours;
    HellaSwagResult result = eval_ours::hellaswag_eval(&model, set, args, ProcessGroup(), &ours);
    ASSERT_EQ(ours.size(), 6u);
    int correct[3] = {0, 0, 0};
    for (size_t e = 0; e < 6; e++) {
        const OracleScore& o = oracle[e];
        EXPECT_EQ(ours[e].label, o.label);
        ASSERT_EQ(ours[e].sum_loss.size(), o.sum_loss.size());
        std::vector<double> per_char, per_token;
        for (size_t j = 0; j < o.sum_loss.size(); j++) {
            EXPECT_NEAR(ours[e].sum_loss[j], o.sum_loss[j], 1e-3) << "example " << e << " ending " << j;
            per_char.push_back(o.sum_loss[j] / set.examples[e].ending_chars[j]);
            per_token.push_back(o.sum_loss[j] / set.examples[e].endings[j].size());
        }
        if (margin(o.sum_loss) > 1e-3) {
            EXPECT_EQ(ours[e].pred, o.pred) << "example " << e;
        }
        if (margin(per_char) > 1e-4) {
            EXPECT_EQ(ours[e].pred_norm, o.pred_norm) << "example " << e;
        }
        if (margin(per_token) > 1e-4) {
            EXPECT_EQ(ours[e].pred_token, o.pred_token) << "example " << e;
        }
        correct[0] += o.pred == o.label;
        correct[1] += o.pred_norm == o.label;
        correct[2] += o.pred_token == o.label;
    }
    EXPECT_EQ(result.examples, 6);
    EXPECT_NEAR(result.acc(), correct[0] / 6.0, 1e-12);
    EXPECT_NEAR(result.acc_norm(), correct[1] / 6.0, 1e-12);
    EXPECT_NEAR(result.acc_token(), correct[2] / 6.0, 1e-12);
    printf("  tiny random model on the 6 test items: acc %.4f acc_norm %.4f acc_token %.4f (oracle: %s)\n",
           result.acc(), result.acc_norm(), result.acc_token(), r.output.c_str());

    // the same through the trainer: -x 0 evaluates once and logs to metrics.jsonl
    std::string out = f.dir + "/run";
    test::CommandResult run = test::run_command(test::root() + "/train_gpt2 -e " + f.model + " -x 0 -v 0 -s 0 -b 1 -t 8 -hs " +
                                                f.bin + " -he 1 -tk " + f.tokenizer + " -o " + out);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::vector<double> logged = test::jsonl_values(out + "/metrics.jsonl", "hellaswag_acc_norm");
    ASSERT_EQ(logged.size(), 1u);
    EXPECT_NEAR(logged[0], result.acc_norm(), 1e-6);
    EXPECT_NEAR(test::jsonl_values(out + "/metrics.jsonl", "hellaswag_acc")[0], result.acc(), 1e-6);
    EXPECT_NEAR(test::jsonl_values(out + "/metrics.jsonl", "hellaswag_examples")[0], 6, 0);
    // -hm: the first M examples only
    run = test::run_command(test::root() + "/train_gpt2 -e " + f.model + " -x 0 -v 0 -s 0 -b 1 -t 8 -hs " + f.bin +
                            " -he 1 -hm 2 -tk " + f.tokenizer);
    EXPECT_NE(run.output.find("(2 examples)"), std::string::npos) << run.output;
}

TEST(HellaSwag, MalformedFilesAreRefused) {
    REQUIRE_BPE();
    HellaSwagFixture f = make_hellaswag_fixture(bpe);
    std::string good = test::read_text(f.bin);
    auto refused = [&](const std::string& bytes, const std::string& expected) {
        std::string path = f.dir + "/bad.bin";
        std::ofstream(path, std::ios::binary) << bytes;
        test::CommandResult r = test::run_command(test::root() + "/train_gpt2 -e " + f.model + " -x 0 -v 0 -s 0 -b 1 -t 8 -hs " +
                                                  path + " -he 1 -tk " + f.tokenizer);
        EXPECT_NE(r.exit_code, 0) << expected;
        EXPECT_NE(r.output.find(expected), std::string::npos) << "expected '" << expected << "' in:\n" << r.output;
    };
    refused(good.substr(0, good.size() - 6), "truncated");
    std::string bad = good;
    bad[0] = 1;
    refused(bad, "has magic");
    bad = good;
    bad[HEADER_BYTES] = 7;  // the first example's marker
    refused(bad, "does not start with the marker 65535");
    bad = good;
    bad[HEADER_BYTES + 6] = 9;  // the first example's label (index 3 of its uint16 stream)
    refused(bad, "its label is not one of its endings");
    refused(good + "xy", "trailing bytes");
    // without gpt2_tokenizer.bin there are no characters to count for acc_norm
    test::CommandResult r = test::run_command(test::root() + "/train_gpt2 -e " + f.model + " -x 0 -v 0 -s 0 -b 1 -t 8 -hs " +
                                              f.bin + " -he 1 -tk " + f.dir + "/missing.bin");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("needs gpt2_tokenizer.bin"), std::string::npos) << r.output;
    // the data script refuses a malformed JSONL line, naming it
    std::ofstream(f.dir + "/bad.jsonl") << "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"], \"label\": 5}\n";
    r = test::run_command(test::python() + " " + test::root() + "/dev/data/hellaswag.py --input " + f.dir +
                          "/bad.jsonl --output " + f.dir + "/x.bin --bpe-dir " + bpe);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("line 1: \"label\" must be the index of one of the endings"), std::string::npos) << r.output;
}

// ----------------------------------------------------------------------------
// sampling

TEST(Sampler, DefaultsAreTheOldSamplerTopKAndGreedy) {
    std::mt19937 rng(3);
    std::vector<float> logits(300);
    for (int trial = 0; trial < 50; trial++) {
        for (float& x : logits) x = (float)(rand_uniform(rng) * 8.0 - 4.0);
        std::vector<int> order(logits.size());
        for (size_t i = 0; i < order.size(); i++) order[i] = (int)i;
        std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
        for (int draw = 0; draw < 20; draw++) {
            float coin = (float)rand_uniform(rng);
            EXPECT_EQ(sample_token(logits.data(), 250, 1.0f, 0, coin), sample_softmax(logits.data(), 250, coin));
            EXPECT_EQ(sample_token(logits.data(), 300, 0.0f, 0, coin), order[0]);
            EXPECT_EQ(sample_token(logits.data(), 300, 0.7f, 1, coin), order[0]);
            int k3 = sample_token(logits.data(), 300, 1.3f, 3, coin);
            EXPECT_TRUE(k3 == order[0] || k3 == order[1] || k3 == order[2]);
        }
    }
    // top-k's mass: k = 2 of logits {0, ln 3, -inf-ish}: p = 1/4, 3/4 regardless of the rest
    float two[4] = {0.0f, std::log(3.0f), -30.0f, -30.0f};
    EXPECT_EQ(sample_token(two, 4, 1.0f, 2, 0.24f), 0);
    EXPECT_EQ(sample_token(two, 4, 1.0f, 2, 0.26f), 1);
    // temperature 2 halves the logits: p = 1/(1+sqrt 3) = 0.366 for token 0
    EXPECT_EQ(sample_token(two, 2, 2.0f, 0, 0.36f), 0);
    EXPECT_EQ(sample_token(two, 2, 2.0f, 0, 0.37f), 1);
}

std::string sample_text(const std::string& output) {
    size_t a = output.find("--- sample ---\n");
    size_t b = output.find("\n--------------", a);
    return a == std::string::npos || b == std::string::npos ? "" : output.substr(a + 15, b - a - 15);
}

TEST(Sampler, CheckpointSamplingIsDeterministicAndStartsWithThePrompt) {
    REQUIRE_BPE();
    std::string dir = test::scratch_dir("sampling");
    BpeTokenizer tok;
    bpe_tokenizer_load(&tok, bpe);
    tokenizer_file_write(dir + "/gpt2_tokenizer.bin", bpe_tokenizer_file(tok));
    bpe_tokenizer_free(&tok);
    std::string base = test::root() + "/train_gpt2 -e " + tiny_model_dir() + "/model.bin -x 0 -v 0 -t 16 -g 12 -bp " +
                       bpe + " -tk " + dir + "/gpt2_tokenizer.bin -sp 'To be, or not'";
    auto sample = [&](const std::string& flags) {
        test::CommandResult r = test::run_command(base + " " + flags);
        EXPECT_EQ(r.exit_code, 0) << r.output;
        return sample_text(r.output);
    };
    std::string a = sample("-ss 1 -st 0.9 -sk 50");
    EXPECT_EQ(a.rfind("To be, or not", 0), 0u) << a;
    EXPECT_GT(a.size(), strlen("To be, or not"));
    EXPECT_EQ(sample("-ss 1 -st 0.9 -sk 50"), a);
    EXPECT_NE(sample("-ss 2 -st 0.9 -sk 50"), a);
    EXPECT_EQ(sample("-ss 1 -st 0"), sample("-ss 2 -st 0"));  // greedy draws on no coin
    test::CommandResult r = test::run_command(base + " -bp " + dir + "/nowhere");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("nowhere"), std::string::npos) << r.output;
}

}  // namespace

// ----------------------------------------------------------------------------
// plots (dev/plot_metrics.py)

namespace {

// PNG width and height from the IHDR chunk (bytes 16..23, big-endian).
std::pair<int, int> png_size(const std::string& bytes) {
    if (bytes.size() < 24 || bytes.compare(1, 3, "PNG") != 0) return {0, 0};
    auto be32 = [&](size_t at) {
        return (int)((unsigned char)bytes[at] << 24 | (unsigned char)bytes[at + 1] << 16 |
                     (unsigned char)bytes[at + 2] << 8 | (unsigned char)bytes[at + 3]);
    };
    return {be32(16), be32(20)};
}

TEST(Plot, TwoRunsToPngOfTheRequestedSizeAndMalformedFilesRefused) {
    test::CommandResult has = test::run_command(test::python() + " -c 'import matplotlib'");
    if (has.exit_code != 0) GTEST_SKIP() << "matplotlib is not installed for " << test::python();
    std::string dir = test::scratch_dir("plot");
    for (int run = 0; run < 2; run++) {  // the lines train_gpt2 writes (llmc/run/logger.h)
        Logger logger;
        make_dir_check(dir + "/run" + std::to_string(run));
        logger_open(&logger, dir + "/run" + std::to_string(run), -1);
        for (int step = 0; step <= 40; step++) {
            if (step % 10 == 0) logger_log_val(&logger, step, 10.0f - step * 0.05f * (run + 1));
            if (step % 20 == 0) logger_log_hellaswag(&logger, step, 0.25, 0.26 + step * 0.001, 0.25, 10);
            // step 7 was skipped (a non-finite norm, written as null: the plot leaves it out)
            float norm = step == 7 ? INFINITY : 2.0f / (step + 1);
            if (step < 40) logger_log_train(&logger, step, 10.5f - step * 0.1f, 1e-3f, norm, 50.0, 5000.0 + run, step == 7, step >= 7);
        }
        logger_close(&logger);
    }
    std::string plot = test::python() + " " + test::root() + "/dev/plot_metrics.py ";
    test::CommandResult r = test::run_command(plot + dir + "/run0/metrics.jsonl " + dir + "/run1/metrics.jsonl --labels a b -o " +
                                              dir + "/both.png --width 900 --height 600");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(png_size(test::read_text(dir + "/both.png")), std::make_pair(900, 600));
    r = test::run_command(plot + dir + "/run0/metrics.jsonl");  // default: metrics.png next to it, 1600 x 1000
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(png_size(test::read_text(dir + "/run0/metrics.png")), std::make_pair(1600, 1000));
    // against training time (the steps' "ms"), which a file without timings cannot give
    r = test::run_command(plot + dir + "/run0/metrics.jsonl " + dir + "/run1/metrics.jsonl --x seconds -o " + dir +
                          "/seconds.png --width 900 --height 600");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(png_size(test::read_text(dir + "/seconds.png")), std::make_pair(900, 600));
    std::ofstream(dir + "/untimed.jsonl", std::ios::binary) << "{\"step\": 0, \"val_loss\": 1.5}\n";
    r = test::run_command(plot + dir + "/untimed.jsonl --x seconds -o " + dir + "/untimed.png");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("no \"ms\" of the steps, which --x seconds needs"), std::string::npos) << r.output;
    // against bytes communicated (the steps' "comm_bytes"), likewise
    r = test::run_command(plot + dir + "/untimed.jsonl --x mib -o " + dir + "/untimed.png");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("no \"comm_bytes\" of the steps, which --x mib needs"), std::string::npos) << r.output;

    struct Bad { const char* content; const char* message; };
    for (const Bad& bad : std::vector<Bad>{
             {"{\"step\": 0, \"train_loss\": 1.5}\nnot json\n", "line 2: not JSON"},
             {"{\"train_loss\": 1.5}\n", "line 1: no integer \"step\""},
             {"{\"step\": 3, \"val_loss\": \"high\"}\n", "\"val_loss\" is 'high', not a finite number"},
             {"{\"step\": 3, \"skipped\": 1}\n", "\"skipped\" is 1, not true or false"},
             {"", "no metrics in it"},
         }) {
        std::ofstream(dir + "/bad.jsonl", std::ios::binary) << bad.content;
        r = test::run_command(plot + dir + "/bad.jsonl -o " + dir + "/bad.png");
        EXPECT_EQ(r.exit_code, 1) << bad.message;
        EXPECT_NE(r.output.find(bad.message), std::string::npos) << "expected '" << bad.message << "' in " << r.output;
        EXPECT_FALSE(file_exists(dir + "/bad.png"));
    }
}

}  // namespace
