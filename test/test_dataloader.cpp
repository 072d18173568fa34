// The data loader (llmc/io/dataloader.h) and the random draws it shuffles with (llmc/rand.h).
//
// Shards are written with shard_write into build/test_tmp. Every token of a test data set is unique
// (shard s holds s * 10000 + j at offset j), so each row of a batch names the shard and the offset it
// was read from: its shard and its T-token sample there. The loader reads one stream of samples over
// all shards and epochs, rank r of P taking the B samples from (k*P + r)*B at micro-step k; unshuffled,
// with a B*P that divides every shard's samples, that is ../shared/FORMATS.md's layout token by token
// (rank r's batch i of a shard is the B*T tokens at i*P*B*T + r*B*T; targets the next B*T).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../llmc/io/dataloader.h"
#include "../llmc/rand.h"
#include "test_helpers.h"

namespace {

constexpr int VOCAB = 65536;       // every uint16 is a valid token in these tests
constexpr int SHARD_STRIDE = 10000;  // token value = shard * SHARD_STRIDE + offset

// Writes shards DIR/NAME_000000.bin, ... with the given token counts; returns the glob pattern.
// Shards are written in reverse order, so glob order is not creation order.
std::string write_shards(const std::string& dir, const std::vector<int64_t>& sizes, const std::string& name = "d") {
    for (int s = (int)sizes.size() - 1; s >= 0; s--) {
        std::vector<uint16_t> tokens(sizes[s]);
        for (int64_t j = 0; j < sizes[s]; j++) tokens[j] = (uint16_t)(s * SHARD_STRIDE + j);
        char file[64];
        snprintf(file, sizeof(file), "/%s_%06d.bin", name.c_str(), s);
        shard_write(dir + file, tokens.data(), sizes[s]);
    }
    return dir + "/" + name + "_*.bin";
}

// A sample identified by where it was read from: its shard and its index there (sample i starts at
// token i*T).
struct Sample {
    int shard;
    int64_t index;
    bool operator<(const Sample& o) const { return shard != o.shard ? shard < o.shard : index < o.index; }
    bool operator==(const Sample& o) const { return shard == o.shard && index == o.index; }
};

// Identifies the rows of the loader's current batch and checks that each is one whole sample, inputs
// and targets.
std::vector<Sample> identify_batch(const DataLoader& loader) {
    std::vector<Sample> rows;
    for (int b = 0; b < loader.B; b++) {
        const int* in = loader.inputs.data() + (size_t)b * loader.T;
        const int* out = loader.targets.data() + (size_t)b * loader.T;
        Sample s{in[0] / SHARD_STRIDE, 0};
        int64_t offset = in[0] % SHARD_STRIDE;
        EXPECT_EQ(offset % loader.T, 0) << "row " << b << " starts at offset " << offset << ", not a sample start";
        s.index = offset / loader.T;
        int wrong = 0;
        for (int i = 0; i < loader.T; i++) wrong += (in[i] != in[0] + i) + (out[i] != in[0] + i + 1);
        EXPECT_EQ(wrong, 0) << "row " << b << " (shard " << s.shard << " sample " << s.index << ") is not contiguous";
        rows.push_back(s);
    }
    return rows;
}

// The rows of `count` batches, one after another.
std::vector<Sample> read_batches(DataLoader* loader, int64_t count) {
    std::vector<Sample> out;
    for (int64_t k = 0; k < count; k++) {
        dataloader_next_batch(loader);
        for (const Sample& s : identify_batch(*loader)) out.push_back(s);
    }
    return out;
}

// The stream of T-token samples by its definition (llmc/io/dataloader.h), written out here
// independently: epoch after epoch, the shards in glob order, or shuffled in an order drawn from one
// mt19937 seeded with 42 at the epoch's start; each shard's (N-1)/T samples in order, or shuffled in an
// order drawn from the same generator when the stream reaches the shard.
std::vector<Sample> stream(const std::vector<int64_t>& sizes, int T, bool shuffle, int epochs) {
    std::mt19937 rng(42);
    std::vector<Sample> out;
    for (int e = 0; e < epochs; e++) {
        std::vector<int> shard_order(sizes.size());
        for (size_t s = 0; s < sizes.size(); s++) shard_order[s] = (int)s;
        if (shuffle) random_permutation<int>(shard_order.data(), (int)sizes.size(), rng);
        for (int s : shard_order) {
            int64_t samples = (sizes[s] - 1) / T;
            std::vector<int64_t> order(samples);
            for (int64_t u = 0; u < samples; u++) order[u] = u;
            if (shuffle) random_permutation<int64_t>(order.data(), samples, rng);
            for (int64_t u : order) out.push_back({s, u});
        }
    }
    return out;
}

// What rank r of P with B rows reads in its next `count` micro-steps from stream sample `start` (the
// micro-step's first): the B samples from start + r*B, then on by B*P.
std::vector<Sample> rank_share(const std::vector<Sample>& stream, int64_t start, int B, int P, int r, int64_t count) {
    std::vector<Sample> out;
    for (int64_t k = 0; k < count; k++) {
        for (int b = 0; b < B; b++) out.push_back(stream.at(start + k * B * P + r * B + b));
    }
    return out;
}

}  // namespace

// ----------------------------------------------------------------------------
// unshuffled

TEST(DataLoaderLayout, UnshuffledFollowsFormatsWhereItCan) {
    // 3 shards of 24, 12 and 12 samples of T = 4 (52 tokens hold 12 samples and 3 tokens to spare); B = 2
    // and P = 1, 2 and 3: B*P divides every shard's samples, so rank r's batch i of a shard is the B*T
    // tokens from i*P*B*T + r*B*T, FORMATS's layout
    std::string dir = test::scratch_dir("dataloader_layout");
    const std::vector<int64_t> sizes = {97, 52, 49};
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4;
    for (int P : {1, 2, 3}) {
        for (int r = 0; r < P; r++) {
            SCOPED_TRACE("P=" + std::to_string(P) + " rank " + std::to_string(r));
            DataLoader loader;
            dataloader_init(&loader, pattern, B, T, r, P, false, VOCAB);
            EXPECT_EQ(dataloader_epoch_samples(&loader), 48);
            std::vector<int> expected_starts;  // token offsets (with the shard's stride) of each batch
            for (int s = 0; s < 3; s++) {
                EXPECT_EQ(dataloader_samples_in_file(&loader, s), (sizes[s] - 1) / T);
                for (int64_t i = 0; i < (sizes[s] - 1) / T / (B * P); i++) {
                    expected_starts.push_back(s * SHARD_STRIDE + (int)(i * P * B * T + r * B * T));
                }
            }
            ASSERT_EQ((int)expected_starts.size(), 48 / (B * P));
            for (int k = 0; k < 2 * 48 / (B * P); k++) {  // two epochs: the second wraps to the first batch
                dataloader_next_batch(&loader);
                int start = expected_starts[k % expected_starts.size()];
                for (int i = 0; i < B * T; i++) {  // one contiguous span of B*T tokens
                    ASSERT_EQ(loader.inputs[i], start + i) << "batch " << k;
                    ASSERT_EQ(loader.targets[i], start + i + 1) << "batch " << k;
                }
            }
            EXPECT_EQ(loader.position.epoch, 2);
            EXPECT_EQ(loader.position.sample, 0);
            dataloader_reset(&loader);  // back to the start
            dataloader_next_batch(&loader);
            EXPECT_EQ(loader.inputs[0], expected_starts[0]);
        }
    }
}

TEST(DataLoaderLayout, FirstBatchTokensExactly) {
    // one explicit case written out: P = 2, rank 1, B = 2, T = 3, 40 tokens: 13 samples, sample i at 3i;
    // micro-step k reads samples 4k .. 4k+3, rank 1 the last two
    std::string dir = test::scratch_dir("dataloader_explicit");
    std::string pattern = write_shards(dir, {40});
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 3, 1, 2, false, VOCAB);
    EXPECT_EQ(dataloader_epoch_samples(&loader), 13);  // (40 - 1) / 3
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.inputs, (std::vector<int>{6, 7, 8, 9, 10, 11}));
    EXPECT_EQ(loader.targets, (std::vector<int>{7, 8, 9, 10, 11, 12}));
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.inputs, (std::vector<int>{18, 19, 20, 21, 22, 23}));
    EXPECT_EQ(loader.targets, (std::vector<int>{19, 20, 21, 22, 23, 24}));
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.targets.back(), 36);
    // micro-step 3 reads sample 12 (tokens 36..39, the last) and samples 0..2 of the next epoch: rank 1
    // gets samples 1 and 2 of epoch 1
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.inputs, (std::vector<int>{3, 4, 5, 6, 7, 8}));
    EXPECT_EQ(loader.position.epoch, 1);
    EXPECT_EQ(loader.position.sample, 3);
}

TEST(DataLoaderLayout, ShardsInGlobOrder) {
    std::string dir = test::scratch_dir("dataloader_glob");
    // names sort as b < c < d regardless of the order they are written in
    std::vector<uint16_t> tokens(9);
    for (int f = 0; f < 3; f++) {
        const char* name = f == 0 ? "/x_d.bin" : f == 1 ? "/x_b.bin" : "/x_c.bin";
        for (int j = 0; j < 9; j++) tokens[j] = (uint16_t)(100 * f + j);
        shard_write(dir + name, tokens.data(), 9);
    }
    DataLoader loader;
    dataloader_init(&loader, dir + "/x_*.bin", 1, 8, 0, 1, false, VOCAB);
    ASSERT_EQ(loader.files.size(), 3u);
    EXPECT_EQ(loader.files[0], dir + "/x_b.bin");
    std::vector<int> firsts;
    for (int k = 0; k < 3; k++) {
        dataloader_next_batch(&loader);
        firsts.push_back(loader.inputs[0]);
    }
    EXPECT_EQ(firsts, (std::vector<int>{100, 200, 0}));  // x_b, x_c, x_d
}

// ----------------------------------------------------------------------------
// shuffled

TEST(DataLoaderShuffle, EveryEpochVisitsEverySampleOnce) {
    std::string dir = test::scratch_dir("dataloader_shuffle");
    const std::vector<int64_t> sizes = {300, 170, 250, 97};  // 74, 42, 62 and 24 samples of T = 4: 202
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4;
    DataLoader loader, twin, plain;
    dataloader_init(&loader, pattern, B, T, 0, 1, true, VOCAB);
    dataloader_init(&twin, pattern, B, T, 0, 1, true, VOCAB);
    dataloader_init(&plain, pattern, B, T, 0, 1, false, VOCAB);
    int64_t per_epoch = dataloader_epoch_samples(&loader);
    ASSERT_EQ(per_epoch, 202);
    std::vector<std::vector<Sample>> epochs;
    for (int e = 0; e < 3; e++) {
        std::vector<Sample> order = read_batches(&loader, per_epoch / B);
        std::set<Sample> seen(order.begin(), order.end());
        EXPECT_EQ(seen.size(), order.size()) << "epoch " << e << " repeats a sample";
        for (const Sample& x : order) {
            EXPECT_LT((x.index + 1) * T, sizes[x.shard]) << "sample " << x.index << " of shard " << x.shard;
        }
        // a shard's samples are read together: the shard changes exactly (shards - 1) times
        int changes = 0;
        for (size_t k = 1; k < order.size(); k++) changes += order[k].shard != order[k - 1].shard;
        EXPECT_EQ(changes, (int)sizes.size() - 1) << "epoch " << e;
        EXPECT_EQ(loader.position.epoch, e + 1);
        epochs.push_back(order);
    }
    // two shuffles (or a shuffle and file order) of 202 samples agree with probability far below 1e-30
    EXPECT_NE(epochs[0], epochs[1]);
    EXPECT_NE(epochs[1], epochs[2]);
    EXPECT_NE(epochs[0], read_batches(&plain, per_epoch / B));
    // the same loader settings read the same sequence
    std::vector<Sample> all;
    for (auto& e : epochs) all.insert(all.end(), e.begin(), e.end());
    EXPECT_EQ(read_batches(&twin, 3 * per_epoch / B), all);
    // the stream's definition (the helper `stream` above): one mt19937 seeded with 42
    EXPECT_EQ(all, stream(sizes, T, true, 3));
}

// The samples of a step depend on neither B nor the process count: however the N = 12 samples of a
// step are split into B rows x A accumulation steps x P processes, the step reads the same 12 samples
// of the stream (shuffled and not), also where a step's samples come from two shards or two epochs:
// shards of 37, 29 and 31 samples, 97 an epoch (prime), 20 steps (past two epochs' ends).
TEST(DataLoaderShuffle, StepReadsTheSameSamplesForEveryBAndProcessCount) {
    std::string dir = test::scratch_dir("dataloader_layout_free");
    const int T = 3, N = 12;
    const std::vector<int64_t> sizes = {37 * T + 1, 29 * T + 1, 31 * T + 2};
    std::string pattern = write_shards(dir, sizes);
    for (bool shuffle : {false, true}) {
        SCOPED_TRACE(shuffle ? "shuffled" : "unshuffled");
        std::vector<Sample> expected = stream(sizes, T, shuffle, 3);
        for (auto [B, P] : std::vector<std::pair<int, int>>{{12, 1}, {2, 1}, {3, 2}, {2, 3}, {1, 6}, {4, 3}, {6, 2}, {1, 4}}) {
            int A = N / (B * P);
            SCOPED_TRACE("B=" + std::to_string(B) + " P=" + std::to_string(P) + " A=" + std::to_string(A));
            std::vector<DataLoader> loaders(P);
            for (int r = 0; r < P; r++) dataloader_init(&loaders[r], pattern, B, T, r, P, shuffle, VOCAB);
            for (int step = 0; step < 20; step++) {
                std::multiset<Sample> batch;
                for (int r = 0; r < P; r++) {
                    for (Sample x : read_batches(&loaders[r], A)) batch.insert(x);
                }
                std::multiset<Sample> want(expected.begin() + step * N, expected.begin() + (step + 1) * N);
                EXPECT_EQ(batch, want) << "step " << step;
                for (int r = 1; r < P; r++) {  // the position is the run's, the same on every rank
                    EXPECT_EQ(loaders[r].position.epoch, loaders[0].position.epoch);
                    EXPECT_EQ(loaders[r].position.sample, loaders[0].position.sample);
                }
            }
            EXPECT_EQ(loaders[0].position.epoch, 2);  // 240 samples: epoch 2, sample 240 - 194
            EXPECT_EQ(loaders[0].position.sample, 46);
        }
    }
}

// A position saved at any micro-step resumes the stream: a fresh loader that seeks there (from anywhere:
// seeking goes back too) reads what the uninterrupted run reads next, with the same B and process count,
// and with others (a run saved by 1 process with B = 6 continued by 3 with B = 2, ...).
TEST(DataLoaderShuffle, SeekContinuesTheStreamWithAnyBAndProcessCount) {
    std::string dir = test::scratch_dir("dataloader_seek");
    const int T = 3;
    const std::vector<int64_t> sizes = {100, 49, 80};  // 33, 16 and 26 samples of T = 3: 75 an epoch
    std::string pattern = write_shards(dir, sizes);
    const std::vector<std::pair<int, int>> layouts = {{6, 1}, {2, 3}, {3, 2}, {1, 1}};  // (B, P)
    for (bool shuffle : {true, false}) {
        std::vector<Sample> expected = stream(sizes, T, shuffle, 6);
        for (auto [B, P] : layouts) {
            // the positions a run passes at each micro-step over two epochs
            DataLoader writer;
            dataloader_init(&writer, pattern, B, T, 0, P, shuffle, VOCAB);
            ASSERT_EQ(dataloader_epoch_samples(&writer), 75);
            std::vector<DataPosition> positions;
            for (int64_t k = 0; k <= 2 * 75 / (B * P); k++) {
                positions.push_back(writer.position);
                EXPECT_EQ(writer.position.epoch * 75 + writer.position.sample, k * B * P);
                dataloader_next_batch(&writer);
            }
            for (auto [B2, P2] : layouts) {
                for (int r = 0; r < P2; r++) {
                    SCOPED_TRACE(std::string(shuffle ? "shuffled" : "unshuffled") + ", saved with B=" + std::to_string(B) +
                                 " P=" + std::to_string(P) + ", resumed by rank " + std::to_string(r) + " of " +
                                 std::to_string(P2) + " with B=" + std::to_string(B2));
                    DataLoader resumed;
                    dataloader_init(&resumed, pattern, B2, T, r, P2, shuffle, VOCAB);
                    read_batches(&resumed, 40);
                    for (const DataPosition& at : positions) {
                        dataloader_seek(&resumed, at);
                        EXPECT_EQ(resumed.position.epoch, at.epoch);
                        EXPECT_EQ(resumed.position.sample, at.sample);
                        int64_t start = at.epoch * 75 + at.sample, count = 75 / (B2 * P2) + 1;
                        ASSERT_EQ(read_batches(&resumed, count), rank_share(expected, start, B2, P2, r, count))
                            << "after seeking to epoch " << at.epoch << " sample " << at.sample;
                    }
                }
            }
        }
    }
}

TEST(DataLoaderShuffle, SeekRefusesPositionsOutsideTheData) {
    std::string dir = test::scratch_dir("dataloader_seek_bad");
    std::string pattern = write_shards(dir, {100, 49});  // 33 and 16 samples of 3 tokens
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 3, 0, 1, true, VOCAB);
    DataPosition past_end{0, 49};
    EXPECT_EXIT(dataloader_seek(&loader, past_end), testing::ExitedWithCode(1),
                "data position \\(epoch 0, sample 49\\) is outside this data set, whose epochs have 49 samples of "
                "T=3 tokens; the data set changed since the checkpoint");
    DataPosition negative{-1, 0};
    EXPECT_EXIT(dataloader_seek(&loader, negative), testing::ExitedWithCode(1), "\\(epoch -1, sample 0\\) is outside");
    DataPosition negative_sample{1, -1};
    EXPECT_EXIT(dataloader_seek(&loader, negative_sample), testing::ExitedWithCode(1),
                "\\(epoch 1, sample -1\\) is outside");
    DataPosition huge{INT64_MAX / 4, 0};
    EXPECT_EXIT(dataloader_seek(&loader, huge), testing::ExitedWithCode(1), "is outside this data set");
}

// The fingerprint names the data, not the loader: the same for any B, process count and order; another
// for another T (other samples), another length, or a token changed in a block it reads (all of a
// small shard).
TEST(DataLoaderStream, FingerprintChangesWithTheData) {
    std::string dir = test::scratch_dir("dataloader_fingerprint");
    std::string pattern = write_shards(dir, {100, 49});
    auto print = [&](int B, int T, int r, int P, bool shuffle) {
        DataLoader loader;
        dataloader_init(&loader, pattern, B, T, r, P, shuffle, VOCAB);
        return loader.fingerprint;
    };
    uint64_t base = print(2, 3, 0, 1, true);
    EXPECT_NE(base, 0u);
    EXPECT_EQ(print(4, 3, 1, 2, false), base);
    EXPECT_NE(print(2, 4, 0, 1, true), base);
    write_shards(dir, {100, 50});
    EXPECT_NE(print(2, 3, 0, 1, true), base);
    write_shards(dir, {100, 49});
    EXPECT_EQ(print(2, 3, 0, 1, true), base);
    std::vector<uint16_t> tokens(49);
    for (int j = 0; j < 49; j++) tokens[j] = (uint16_t)(SHARD_STRIDE + j);
    tokens[30] ^= 1;
    shard_write(dir + "/d_000001.bin", tokens.data(), 49);
    EXPECT_NE(print(2, 3, 0, 1, true), base);
}

// ----------------------------------------------------------------------------
// the global stream across shard and epoch boundaries

// Shards whose sample counts no B*P here divides (37, 29 and 31 samples of T = 4; 97 an epoch, prime):
// at global micro-step k, rank r of P reads the B samples from (k*P + r)*B, also where they straddle
// two shards or two epochs (a row of one rank already in the next shard or epoch while the row before
// it is still in the previous one). Three epochs, shuffled and not, B = 1 to 3, P = 1 to 4.
TEST(DataLoaderStream, RankReadsItsShareOfTheGlobalStream) {
    std::string dir = test::scratch_dir("dataloader_stream");
    const int T = 4;
    const std::vector<int64_t> sizes = {37 * T + 1, 29 * T + 3, 31 * T + 1};
    std::string pattern = write_shards(dir, sizes);
    for (bool shuffle : {false, true}) {
        std::vector<Sample> expected = stream(sizes, T, shuffle, 4);
        ASSERT_EQ(expected.size(), 4u * 97);
        for (int B : {1, 2, 3}) {
            for (int P : {1, 2, 3, 4}) {
                for (int r = 0; r < P; r++) {
                    SCOPED_TRACE(std::string(shuffle ? "shuffled" : "unshuffled") + ", B=" + std::to_string(B) +
                                 " P=" + std::to_string(P) + " rank " + std::to_string(r));
                    DataLoader loader;
                    dataloader_init(&loader, pattern, B, T, r, P, shuffle, VOCAB);
                    int64_t steps = 3 * 97 / (B * P) + 1;  // past the third epoch's end
                    ASSERT_EQ(read_batches(&loader, steps), rank_share(expected, 0, B, P, r, steps));
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// bad data

TEST(DataLoaderErrors, TokenOutsideVocabNamesShardAndOffset) {
    std::string dir = test::scratch_dir("dataloader_vocab");
    std::vector<uint16_t> tokens(100, 5);
    shard_write(dir + "/v_000000.bin", tokens.data(), 100);
    tokens[37] = 50257;  // one past GPT-2's last id
    shard_write(dir + "/v_000001.bin", tokens.data(), 100);
    DataLoader loader;
    dataloader_init(&loader, dir + "/v_*.bin", 2, 4, 0, 1, false, 50257);  // init does not read tokens
    int64_t first_shard = dataloader_samples_in_file(&loader, 0) / 2;  // 24 samples: 12 batches
    for (int64_t k = 0; k < first_shard; k++) dataloader_next_batch(&loader);  // the good shard reads fine
    EXPECT_EQ(loader.inputs[0], 5);
    EXPECT_EXIT(dataloader_next_batch(&loader), testing::ExitedWithCode(1),
                "data shard '" + test::re_escape(dir + "/v_000001.bin") +
                    "': token 50257 at offset 37 .* is not below the model's vocab size 50257");
    // the first token of a shard, and the largest uint16
    tokens.assign(100, 5);
    tokens[0] = 65535;
    shard_write(dir + "/v_000000.bin", tokens.data(), 100);
    DataLoader again;
    dataloader_init(&again, dir + "/v_*.bin", 2, 4, 0, 1, true, 50257);
    EXPECT_EXIT(read_batches(&again, 30), testing::ExitedWithCode(1),
                "data shard '.*v_00000[01]\\.bin': token (65535 at offset 0|50257 at offset 37)");
}

TEST(DataLoaderErrors, ShardTooSmallForOneSample) {
    // a shard must hold one sample of T = 4 tokens and its last target: 5 tokens; B and the process count
    // do not matter (a micro-step's samples may come from several shards)
    std::string dir = test::scratch_dir("dataloader_small");
    std::vector<uint16_t> tokens(100, 1);
    shard_write(dir + "/s_000000.bin", tokens.data(), 100);
    shard_write(dir + "/s_000001.bin", tokens.data(), 4);
    DataLoader loader;
    dataloader_init(&loader, dir + "/s_000000.bin", 2, 4, 0, 3, false, VOCAB);  // 100 tokens: 24 samples
    EXPECT_EQ(dataloader_epoch_samples(&loader), 24);
    EXPECT_EXIT(dataloader_init(&loader, dir + "/s_*.bin", 2, 4, 0, 3, false, VOCAB), testing::ExitedWithCode(1),
                "data shard '" + test::re_escape(dir + "/s_000001.bin") +
                    "' has 4 tokens, fewer than the 5 one sample needs \\(T=4, plus one\\)");
    shard_write(dir + "/s_000001.bin", tokens.data(), 5);  // exactly one sample
    for (int r = 0; r < 3; r++) {
        dataloader_init(&loader, dir + "/s_*.bin", 2, 4, r, 3, false, VOCAB);
        EXPECT_EQ(dataloader_epoch_samples(&loader), 25);
        for (int k = 0; k < 20; k++) dataloader_next_batch(&loader);  // the 1-sample shard at micro-step 4
    }
}

TEST(DataLoaderErrors, NoShardMatches) {
    std::string dir = test::scratch_dir("dataloader_nomatch");
    DataLoader loader;
    EXPECT_EXIT(dataloader_init(&loader, dir + "/absent_train_*.bin", 2, 4, 0, 1, false, VOCAB),
                testing::ExitedWithCode(1), "no file matches '" + test::re_escape(dir + "/absent_train_*.bin") + "'");
}

// ----------------------------------------------------------------------------
// rand.h

TEST(DataLoaderRand, PermutationsArePermutations) {
    std::mt19937 rng(1);
    for (int n : {0, 1, 2, 3, 10, 1000}) {
        std::vector<int> order(n, -1);
        random_permutation<int>(order.data(), n, rng);
        std::vector<int> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        for (int i = 0; i < n; i++) EXPECT_EQ(sorted[i], i) << "n " << n;
    }
    std::vector<int64_t> big(100000);
    random_permutation<int64_t>(big.data(), (int64_t)big.size(), rng);
    std::vector<int64_t> sorted = big;
    std::sort(sorted.begin(), sorted.end());
    int64_t misplaced = 0;
    for (int64_t i = 0; i < (int64_t)sorted.size(); i++) misplaced += sorted[i] != i;
    EXPECT_EQ(misplaced, 0);
    int64_t fixed = 0;  // a uniform permutation has 1 fixed point on average (Poisson(1)): never thousands
    for (int64_t i = 0; i < (int64_t)big.size(); i++) fixed += big[i] == i;
    EXPECT_LT(fixed, 20);
}

TEST(DataLoaderRand, PermutationsAreUniform) {
    // all 24 orders of 4 elements, 240000 draws: each count is Binomial(240000, 1/24), mean 10000,
    // sd = sqrt(240000 * (1/24) * (23/24)) = 98. A 6-sd bound (+-600) fails by chance with probability
    // about 24 * 2e-9, while a biased shuffle (e.g. swapping with any j in 0..n-1, which gives some
    // orders from 8/256 to 15/256 instead of 1/24 for n = 4, i.e. 7500 to 14000 here) misses it by thousands.
    std::mt19937 rng(2);
    std::map<std::vector<int>, int> counts;
    for (int k = 0; k < 240000; k++) {
        std::vector<int> order(4);
        random_permutation<int>(order.data(), 4, rng);
        counts[order]++;
    }
    EXPECT_EQ(counts.size(), 24u);
    for (const auto& [order, count] : counts) EXPECT_NEAR(count, 10000, 600);
}

TEST(DataLoaderRand, RandBelowIsInRangeAndUniform) {
    std::mt19937 rng(3);
    for (int k = 0; k < 1000; k++) EXPECT_EQ(rand_below(rng, 1), 0u);
    // 7 values, 700000 draws: each count is Binomial(700000, 1/7), mean 100000, sd 293; a 6-sd bound
    // (+-1760) fails by chance with probability about 7 * 2e-9
    std::vector<int> counts(7, 0);
    int out_of_range = 0;
    for (int k = 0; k < 700000; k++) {
        uint32_t x = rand_below(rng, 7);
        if (x >= 7) out_of_range++;
        else counts[x]++;
    }
    EXPECT_EQ(out_of_range, 0);
    for (int c : counts) EXPECT_NEAR(c, 100000, 1760);
    // no modulo bias: for n = 3 * 2^30, a plain rng() % n would return values below 2^30 with
    // probability 1/2 instead of 1/3. With 300000 draws the fraction's sd is sqrt((1/3)(2/3)/300000)
    // = 0.00086, so +-0.01 is 11 sd from chance yet 16x smaller than the bias it guards against.
    const uint32_t n = 3u << 30;
    int low = 0, too_big = 0;
    for (int k = 0; k < 300000; k++) {
        uint32_t x = rand_below(rng, n);
        low += x < (1u << 30);
        too_big += x >= n;
    }
    EXPECT_EQ(too_big, 0);
    EXPECT_NEAR(low / 300000.0, 1.0 / 3.0, 0.01);
}

TEST(DataLoaderRand, SameSeedSameDraws) {
    // mt19937's output is fixed by the C++ standard: its 10000th output from the default seed is 4123659995
    std::mt19937 standard;
    for (int k = 0; k < 9999; k++) standard();
    EXPECT_EQ(standard(), 4123659995u);
    std::mt19937 a(42), b(42), c(43);
    std::vector<int> pa(50), pb(50), pc(50);
    random_permutation<int>(pa.data(), 50, a);
    random_permutation<int>(pb.data(), 50, b);
    random_permutation<int>(pc.data(), 50, c);
    EXPECT_EQ(pa, pb);
    EXPECT_NE(pa, pc);  // 1/50! chance of a coincidence
}
