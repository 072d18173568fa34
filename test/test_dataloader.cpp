// The data loader (llmc/io/dataloader.h) and the random draws it shuffles with (llmc/rand.h).
//
// Shards are written with shard_write into build/test_tmp. Every token of a test data set is unique
// (shard s holds s * 10000 + j at offset j), so a batch's first input names the shard and the offset
// it was read from: its shard and its B*T-token unit there. The loader reads one stream of units over
// all shards and epochs, rank r of P taking entry k*P + r at micro-step k; where P divides every
// shard's units, unshuffled, that is ../shared/FORMATS.md's layout token by token (sample i of a shard
// starts at token i*P*B*T + r*B*T; inputs are B*T tokens, targets the next B*T).
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

// A batch identified by where it was read from: its shard and its B*T-token unit there (unit u starts
// at token u*B*T; FORMATS's sample i of rank r is unit i*P + r).
struct Sample {
    int shard;
    int64_t index;  // unit index inside the shard
    bool operator<(const Sample& o) const { return shard != o.shard ? shard < o.shard : index < o.index; }
    bool operator==(const Sample& o) const { return shard == o.shard && index == o.index; }
};

// Identifies the loader's current batch and checks that it is one whole unit, inputs and targets.
Sample identify_batch(const DataLoader& loader) {
    int64_t BT = (int64_t)loader.B * loader.T;
    int first = loader.inputs[0];
    Sample s{first / SHARD_STRIDE, 0};
    int64_t offset = first % SHARD_STRIDE;
    EXPECT_EQ(offset % BT, 0) << "batch starts at offset " << offset << ", not a unit start";
    s.index = offset / BT;
    int64_t start = s.shard * SHARD_STRIDE + s.index * BT;
    int wrong = 0;
    for (int64_t i = 0; i < BT; i++) {
        wrong += loader.inputs[i] != start + i;
        wrong += loader.targets[i] != start + i + 1;
    }
    EXPECT_EQ(wrong, 0) << "batch from shard " << s.shard << " unit " << s.index << " is not contiguous";
    return s;
}

std::vector<Sample> read_batches(DataLoader* loader, int64_t count) {
    std::vector<Sample> out;
    for (int64_t k = 0; k < count; k++) {
        dataloader_next_batch(loader);
        out.push_back(identify_batch(*loader));
    }
    return out;
}

// The global stream of B*T-token units by its definition (llmc/io/dataloader.h), written out here
// independently: epoch after epoch, the shards in glob order, or shuffled in an order drawn from one
// mt19937 seeded with 42 at the epoch's start; each shard's (N-1)/(B*T) units in order, or shuffled in
// an order drawn from the same generator when the stream reaches the shard.
std::vector<Sample> stream(const std::vector<int64_t>& sizes, int B, int T, bool shuffle, int epochs) {
    std::mt19937 rng(42);
    std::vector<Sample> out;
    for (int e = 0; e < epochs; e++) {
        std::vector<int> shard_order(sizes.size());
        for (size_t s = 0; s < sizes.size(); s++) shard_order[s] = (int)s;
        if (shuffle) random_permutation<int>(shard_order.data(), (int)sizes.size(), rng);
        for (int s : shard_order) {
            int64_t units = (sizes[s] - 1) / (B * T);
            std::vector<int64_t> order(units);
            for (int64_t u = 0; u < units; u++) order[u] = u;
            if (shuffle) random_permutation<int64_t>(order.data(), units, rng);
            for (int64_t u : order) out.push_back({s, u});
        }
    }
    return out;
}

}  // namespace

// ----------------------------------------------------------------------------
// unshuffled

TEST(DataLoaderLayout, UnshuffledFollowsFormats) {
    // 3 shards of 24, 12 and 6 units of B*T = 8 (103 tokens hold 12 units and 6 tokens to spare): P = 1,
    // 2 and 3 divide every shard's units, so rank r's sample i of a shard starts at token i*P*B*T + r*B*T
    std::string dir = test::scratch_dir("dataloader_layout");
    const std::vector<int64_t> sizes = {193, 103, 49};
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4;
    for (int P : {1, 2, 3}) {
        for (int r = 0; r < P; r++) {
            SCOPED_TRACE("P=" + std::to_string(P) + " rank " + std::to_string(r));
            DataLoader loader;
            dataloader_init(&loader, pattern, B, T, r, P, false, VOCAB);
            EXPECT_EQ(dataloader_epoch_units(&loader), 42);
            std::vector<Sample> expected;
            for (int s = 0; s < 3; s++) {
                EXPECT_EQ(dataloader_units_in_file(&loader, s), (sizes[s] - 1) / (B * T));
                for (int64_t i = 0; i < (sizes[s] - 1) / (B * T) / P; i++) expected.push_back({s, i * P + r});
            }
            ASSERT_EQ((int)expected.size(), 42 / P);
            // one epoch: shards in glob order, samples in order, each at i*P*B*T + r*B*T
            std::vector<Sample> got = read_batches(&loader, 42 / P);
            EXPECT_EQ(got, expected);
            EXPECT_EQ(loader.position.epoch, 1);
            EXPECT_EQ(loader.position.unit, 0);
            // the epoch wraps to the first batch, same order again
            std::vector<Sample> again = read_batches(&loader, 42 / P);
            EXPECT_EQ(again, expected);
            EXPECT_EQ(loader.position.epoch, 2);
            // reset returns to the start
            dataloader_reset(&loader);
            dataloader_next_batch(&loader);
            EXPECT_EQ(identify_batch(loader), expected[0]);
        }
    }
}

TEST(DataLoaderLayout, FirstBatchTokensExactly) {
    // one explicit case written out: P = 2, rank 1, B = 2, T = 3: sample i starts at 12 i + 6
    std::string dir = test::scratch_dir("dataloader_explicit");
    std::string pattern = write_shards(dir, {40});
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 3, 1, 2, false, VOCAB);
    EXPECT_EQ(dataloader_epoch_units(&loader), 6);  // (40 - 1) / 6
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.inputs, (std::vector<int>{6, 7, 8, 9, 10, 11}));
    EXPECT_EQ(loader.targets, (std::vector<int>{7, 8, 9, 10, 11, 12}));
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.inputs, (std::vector<int>{18, 19, 20, 21, 22, 23}));
    EXPECT_EQ(loader.targets, (std::vector<int>{19, 20, 21, 22, 23, 24}));
    dataloader_next_batch(&loader);
    EXPECT_EQ(loader.targets.back(), 36);  // the last sample ends inside the 40 tokens
    dataloader_next_batch(&loader);        // wraps
    EXPECT_EQ(loader.inputs[0], 6);
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
    const std::vector<int64_t> sizes = {300, 170, 250, 97};  // 37, 21, 31 and 12 units of B*T = 8: 101
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4;
    DataLoader loader, twin, plain;
    dataloader_init(&loader, pattern, B, T, 0, 1, true, VOCAB);
    dataloader_init(&twin, pattern, B, T, 0, 1, true, VOCAB);
    dataloader_init(&plain, pattern, B, T, 0, 1, false, VOCAB);
    int64_t per_epoch = dataloader_epoch_units(&loader);
    ASSERT_EQ(per_epoch, 101);
    std::vector<std::vector<Sample>> epochs;
    for (int e = 0; e < 3; e++) {
        std::vector<Sample> order = read_batches(&loader, per_epoch);
        std::set<Sample> seen(order.begin(), order.end());
        EXPECT_EQ(seen.size(), order.size()) << "epoch " << e << " repeats a sample";
        for (const Sample& x : order) {
            EXPECT_LT((x.index + 1) * B * T, sizes[x.shard]) << "unit " << x.index << " of shard " << x.shard;
        }
        // a shard's samples are read together: the shard changes exactly (shards - 1) times
        int changes = 0;
        for (size_t k = 1; k < order.size(); k++) changes += order[k].shard != order[k - 1].shard;
        EXPECT_EQ(changes, (int)sizes.size() - 1) << "epoch " << e;
        EXPECT_EQ(loader.position.epoch, e + 1);
        epochs.push_back(order);
    }
    // two shuffles (or a shuffle and file order) of 101 units agree with probability far below 1e-30
    EXPECT_NE(epochs[0], epochs[1]);
    EXPECT_NE(epochs[1], epochs[2]);
    EXPECT_NE(epochs[0], read_batches(&plain, per_epoch));
    // the same loader settings read the same sequence
    std::vector<Sample> all;
    for (auto& e : epochs) all.insert(all.end(), e.begin(), e.end());
    EXPECT_EQ(read_batches(&twin, 3 * per_epoch), all);
    // the stream's definition (the helper `stream` above): one mt19937 seeded with 42
    EXPECT_EQ(all, stream(sizes, B, T, true, 3));
}

// The batch of a global step does not depend on the process count: P processes with A accumulation
// steps read, together, the units that one process reads in P*A steps (shuffled and not), also where a
// step's units come from two shards or two epochs: shards of 17, 13 and 17 units, 47 a epoch, 6 units a
// step, 20 steps (past two epochs' ends).
TEST(DataLoaderShuffle, GlobalBatchIsTheSameForEveryProcessCount) {
    std::string dir = test::scratch_dir("dataloader_layout_free");
    std::string pattern = write_shards(dir, {17 * 6 + 1, 13 * 6 + 1, 17 * 6 + 1});  // units of B*T = 6
    const int B = 2, T = 3, global_micro = 6;
    for (bool shuffle : {false, true}) {
        SCOPED_TRACE(shuffle ? "shuffled" : "unshuffled");
        std::vector<std::multiset<Sample>> reference;  // per step, 1 process
        for (int P : {1, 2, 3, 6}) {
            int A = global_micro / P;
            std::vector<DataLoader> loaders(P);
            for (int r = 0; r < P; r++) dataloader_init(&loaders[r], pattern, B, T, r, P, shuffle, VOCAB);
            for (int step = 0; step < 20; step++) {
                std::multiset<Sample> batch;
                for (int r = 0; r < P; r++) {
                    for (Sample x : read_batches(&loaders[r], A)) batch.insert(x);
                }
                EXPECT_EQ((int)batch.size(), global_micro);
                if (P == 1) reference.push_back(batch);
                else EXPECT_EQ(batch, reference[step]) << "P=" << P << " step " << step;
                for (int r = 1; r < P; r++) {  // the position is the run's, the same on every rank
                    EXPECT_EQ(loaders[r].position.epoch, loaders[0].position.epoch);
                    EXPECT_EQ(loaders[r].position.unit, loaders[0].position.unit);
                }
            }
            EXPECT_EQ(loaders[0].position.epoch, 2);  // 120 units: epoch 2, unit 120 - 94
            EXPECT_EQ(loaders[0].position.unit, 26);
        }
    }
}

// A position saved at any step resumes the stream: a fresh loader that seeks there (from anywhere:
// seeking goes back too) reads what the uninterrupted loader read next, with the same process count,
// and with another one (a run saved by 1 process continued by 3, by 3 continued by 2, ...).
TEST(DataLoaderShuffle, SeekContinuesTheStreamWithAnyProcessCount) {
    std::string dir = test::scratch_dir("dataloader_seek");
    const std::vector<int64_t> sizes = {100, 49, 80};  // 16, 8 and 13 units of B*T = 6: 37 a epoch
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 3;
    for (bool shuffle : {true, false}) {
        std::vector<Sample> expected = stream(sizes, B, T, shuffle, 5);
        for (int P : {1, 2, 3}) {
            // the positions a P-process run passes at each micro-step over two epochs
            DataLoader writer;
            dataloader_init(&writer, pattern, B, T, 0, P, shuffle, VOCAB);
            ASSERT_EQ(dataloader_epoch_units(&writer), 37);
            std::vector<DataPosition> positions;
            for (int64_t k = 0; k <= 2 * 37 / P; k++) {
                positions.push_back(writer.position);
                EXPECT_EQ(writer.position.epoch * 37 + writer.position.unit, k * P);
                dataloader_next_batch(&writer);
            }
            for (int P2 : {1, 2, 3}) {
                for (int r = 0; r < P2; r++) {
                    SCOPED_TRACE(std::string(shuffle ? "shuffled" : "unshuffled") + ", saved by P=" + std::to_string(P) +
                                 ", resumed by rank " + std::to_string(r) + " of " + std::to_string(P2));
                    DataLoader resumed;
                    dataloader_init(&resumed, pattern, B, T, r, P2, shuffle, VOCAB);
                    read_batches(&resumed, 37 + 3);
                    for (const DataPosition& at : positions) {
                        dataloader_seek(&resumed, at);
                        EXPECT_EQ(resumed.position.epoch, at.epoch);
                        EXPECT_EQ(resumed.position.unit, at.unit);
                        int64_t start = at.epoch * 37 + at.unit;
                        std::vector<Sample> next = read_batches(&resumed, 37), want;
                        for (int64_t j = 0; j < 37; j++) want.push_back(expected[start + j * P2 + r]);
                        ASSERT_EQ(next, want) << "after seeking to epoch " << at.epoch << " unit " << at.unit;
                    }
                }
            }
        }
    }
}

TEST(DataLoaderShuffle, SeekRefusesPositionsOutsideTheData) {
    std::string dir = test::scratch_dir("dataloader_seek_bad");
    std::string pattern = write_shards(dir, {100, 49});  // 16 and 8 units of 6 tokens
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 3, 0, 1, true, VOCAB);
    DataPosition past_end{0, 24};
    EXPECT_EXIT(dataloader_seek(&loader, past_end), testing::ExitedWithCode(1),
                "data position \\(epoch 0, unit 24\\) is outside this data set, whose epochs have 24 units of B=2 x "
                "T=3 tokens; the data set changed since the checkpoint");
    DataPosition negative{-1, 0};
    EXPECT_EXIT(dataloader_seek(&loader, negative), testing::ExitedWithCode(1), "\\(epoch -1, unit 0\\) is outside");
    DataPosition negative_unit{1, -1};
    EXPECT_EXIT(dataloader_seek(&loader, negative_unit), testing::ExitedWithCode(1), "\\(epoch 1, unit -1\\) is outside");
    DataPosition huge{INT64_MAX / 4, 0};
    EXPECT_EXIT(dataloader_seek(&loader, huge), testing::ExitedWithCode(1), "is outside this data set");
}

// How an older state file named a place (the s-th shard of the epoch's order, unit u of that shard's
// order) is the stream position that counts the units of the epoch's earlier shards; the loader stays
// where it was.
TEST(DataLoaderShuffle, PositionInShardCountsTheEpochsEarlierShards) {
    std::string dir = test::scratch_dir("dataloader_in_shard");
    const std::vector<int64_t> sizes = {100, 49, 80, 31};  // 16, 8, 13 and 5 units of 6 tokens: 42
    std::string pattern = write_shards(dir, sizes);
    std::vector<Sample> expected = stream(sizes, 2, 3, true, 3);
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 3, 1, 2, true, VOCAB);
    read_batches(&loader, 5);
    for (int64_t epoch : {0, 1, 2}) {
        // where each shard of the epoch's order starts in the stream, from the definition
        std::vector<int64_t> starts;
        for (int64_t i = epoch * 42; i < (epoch + 1) * 42; i++) {
            if (i == epoch * 42 || expected[i].shard != expected[i - 1].shard) starts.push_back(i - epoch * 42);
        }
        ASSERT_EQ(starts.size(), 4u);
        for (int64_t s = 0; s < 4; s++) {
            DataPosition p = dataloader_position_in_shard(&loader, epoch, s, 3);
            EXPECT_EQ(p.epoch, epoch);
            EXPECT_EQ(p.unit, starts[s] + 3) << "epoch " << epoch << " shard " << s;
        }
    }
    EXPECT_EQ(loader.position.unit, 10);  // 5 micro-steps of 2 entries
    std::vector<Sample> next = read_batches(&loader, 3);
    EXPECT_EQ(next, (std::vector<Sample>{expected[11], expected[13], expected[15]}));
    EXPECT_EXIT(dataloader_position_in_shard(&loader, 0, 4, 0), testing::ExitedWithCode(1),
                "data position \\(epoch 0, shard 4, unit 0\\) does not fit the 4 shard\\(s\\)");
    int shard_of_first = expected[0].shard;
    int64_t units_of_first = (sizes[shard_of_first] - 1) / 6;
    EXPECT_EXIT(dataloader_position_in_shard(&loader, 0, 0, units_of_first), testing::ExitedWithCode(1),
                "is past the end of that shard \\(" + std::to_string(units_of_first) + " units\\)");
}

// ----------------------------------------------------------------------------
// the global stream across shard and epoch boundaries

// Shards whose unit counts no process count here divides (17, 13 and 17 units of B*T = 8 tokens; 47
// a epoch, prime): at global micro-step k, rank r of P reads stream entry k*P + r, also where the P
// entries of a micro-step straddle two shards or two epochs (a rank already in the next shard or epoch
// while another is still in the previous one). Three epochs, shuffled and not, P = 1 to 4.
TEST(DataLoaderStream, RankReadsItsEntryOfTheGlobalStream) {
    std::string dir = test::scratch_dir("dataloader_stream");
    const std::vector<int64_t> sizes = {17 * 8 + 1, 13 * 8 + 1, 17 * 8 + 6};
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4;
    for (bool shuffle : {false, true}) {
        std::vector<Sample> expected = stream(sizes, B, T, shuffle, 4);
        ASSERT_EQ(expected.size(), 4u * 47);
        for (int P : {1, 2, 3, 4}) {
            for (int r = 0; r < P; r++) {
                SCOPED_TRACE(std::string(shuffle ? "shuffled" : "unshuffled") + ", P=" + std::to_string(P) + " rank " +
                             std::to_string(r));
                DataLoader loader;
                dataloader_init(&loader, pattern, B, T, r, P, shuffle, VOCAB);
                int64_t steps = 3 * 47 / P + 1;  // past the third epoch's end
                std::vector<Sample> got = read_batches(&loader, steps), want;
                for (int64_t k = 0; k < steps; k++) want.push_back(expected[k * P + r]);
                ASSERT_EQ(got, want);
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
    int64_t first_shard = dataloader_units_in_file(&loader, 0);
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
    // a shard must hold one unit of B*T = 8 tokens and its last target: 9 tokens; the process count
    // does not matter (a micro-step's units may come from several shards)
    std::string dir = test::scratch_dir("dataloader_small");
    std::vector<uint16_t> tokens(100, 1);
    shard_write(dir + "/s_000000.bin", tokens.data(), 100);
    shard_write(dir + "/s_000001.bin", tokens.data(), 8);
    DataLoader loader;
    dataloader_init(&loader, dir + "/s_000000.bin", 2, 4, 0, 3, false, VOCAB);  // 100 tokens: 12 units
    EXPECT_EQ(dataloader_epoch_units(&loader), 12);
    EXPECT_EXIT(dataloader_init(&loader, dir + "/s_*.bin", 2, 4, 0, 3, false, VOCAB), testing::ExitedWithCode(1),
                "data shard '" + test::re_escape(dir + "/s_000001.bin") +
                    "' has 8 tokens, fewer than the 9 one sample needs \\(B=2 x T=4, plus one\\)");
    shard_write(dir + "/s_000001.bin", tokens.data(), 9);  // exactly one unit
    for (int r = 0; r < 3; r++) {
        dataloader_init(&loader, dir + "/s_*.bin", 2, 4, r, 3, false, VOCAB);
        EXPECT_EQ(dataloader_epoch_units(&loader), 13);
        for (int k = 0; k < 20; k++) dataloader_next_batch(&loader);  // rank 0 reads the 1-unit shard at step 4
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
