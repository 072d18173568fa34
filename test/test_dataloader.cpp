// The data loader (llmc/io/dataloader.h) and the random draws it shuffles with (llmc/rand.h).
//
// Shards are written with shard_write into build/test_tmp. Every token of a test data set is unique
// (shard s holds s * 10000 + j at offset j), so a batch's first input names the shard and the offset
// it was read from, and the layout can be checked against ../shared/FORMATS.md token by token:
// sample i of a shard starts at token i*P*B*T + r*B*T; inputs are B*T tokens, targets the next B*T.
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

// Samples in a shard of n tokens: (n - 1) / (P*B*T), written as a count of whole spans that fit.
int64_t expected_samples(int64_t n, int P, int B, int T) {
    int64_t count = 0;
    while ((count + 1) * P * B * T + 1 <= n) count++;
    return count;
}

}  // namespace

// ----------------------------------------------------------------------------
// unshuffled

TEST(DataLoaderLayout, UnshuffledFollowsFormats) {
    std::string dir = test::scratch_dir("dataloader_layout");
    // 3 shards; 97 = 4*24 + 1 fits exactly 4 spans of P*B*T = 24, 96 one fewer
    const std::vector<int64_t> sizes = {200, 97, 96};
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4;
    for (int P : {1, 2, 3}) {
        for (int r = 0; r < P; r++) {
            SCOPED_TRACE("P=" + std::to_string(P) + " rank " + std::to_string(r));
            DataLoader loader;
            dataloader_init(&loader, pattern, B, T, r, P, false, VOCAB);
            int64_t total = 0;
            std::vector<Sample> expected;
            for (int s = 0; s < 3; s++) {
                int64_t n = expected_samples(sizes[s], P, B, T);
                EXPECT_EQ(dataloader_samples_in_file(&loader, s), n);
                for (int64_t i = 0; i < n; i++) expected.push_back({s, i * P + r});  // starts at i*P*B*T + r*B*T
                total += n;
            }
            EXPECT_EQ(dataloader_num_batches(&loader), total);
            // one epoch: shards in glob order, samples in order, each at i*P*B*T + r*B*T
            std::vector<Sample> got = read_batches(&loader, total);
            EXPECT_EQ(got, expected);
            EXPECT_EQ(loader.position.epoch, 1);
            // the epoch wraps to the first batch, same order again
            std::vector<Sample> again = read_batches(&loader, total);
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
    EXPECT_EQ(dataloader_num_batches(&loader), 3);  // (40 - 1) / 12
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
    const std::vector<int64_t> sizes = {300, 170, 250, 97};
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 4, P = 2;
    std::vector<std::vector<Sample>> first_epoch(P);  // rank -> order
    int64_t per_epoch = 0;
    for (int r = 0; r < P; r++) {
        SCOPED_TRACE("rank " + std::to_string(r));
        DataLoader loader, twin, plain;
        dataloader_init(&loader, pattern, B, T, r, P, true, VOCAB);
        dataloader_init(&twin, pattern, B, T, r, P, true, VOCAB);
        dataloader_init(&plain, pattern, B, T, r, P, false, VOCAB);
        per_epoch = dataloader_num_batches(&loader);
        int64_t expected_per_epoch = 0;
        for (int64_t n : sizes) expected_per_epoch += expected_samples(n, P, B, T);
        ASSERT_EQ(per_epoch, expected_per_epoch);
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
        // 4 shards of 37, 21, 31 and 12 units: two shuffles (or a shuffle and file order) agree with
        // probability far below 1e-30
        EXPECT_NE(epochs[0], epochs[1]);
        EXPECT_NE(epochs[1], epochs[2]);
        EXPECT_NE(epochs[0], read_batches(&plain, per_epoch));
        // the same rank reads the same sequence
        EXPECT_EQ(read_batches(&twin, 3 * per_epoch),
                  [&] { std::vector<Sample> v; for (auto& e : epochs) v.insert(v.end(), e.begin(), e.end()); return v; }());
        first_epoch[r] = epochs[0];
    }
    // the ranks deal out one order: at every micro-step they read different units of the same shard
    std::set<Sample> together;
    for (int64_t k = 0; k < per_epoch; k++) {
        EXPECT_EQ(first_epoch[0][k].shard, first_epoch[1][k].shard) << "micro-step " << k;
        for (int r = 0; r < P; r++) together.insert(first_epoch[r][k]);
    }
    EXPECT_EQ((int64_t)together.size(), P * per_epoch) << "two ranks read the same unit";
}

TEST(DataLoaderShuffle, OrderIsOneMt19937SeededWith42DealtToTheRanks) {
    // one mt19937 seeded with 42 (on every rank) permutes the shard order, then each shard's (N-1)/(B*T)
    // units as the shard is reached; the permutation is rand.h's Fisher-Yates; rank r's k-th sample
    // of the shard is unit order[k*P + r]. Replaying that here pins the order, so runs on other machines,
    // with other process counts, and resumed runs read the same batches.
    std::string dir = test::scratch_dir("dataloader_seeded");
    const std::vector<int64_t> sizes = {90, 60, 120};
    std::string pattern = write_shards(dir, sizes);
    const int B = 1, T = 4, P = 3;
    for (int r = 0; r < P; r++) {
        DataLoader loader;
        dataloader_init(&loader, pattern, B, T, r, P, true, VOCAB);
        std::mt19937 rng(42);
        std::vector<Sample> expected;
        for (int e = 0; e < 2; e++) {
            std::vector<int> shard_order(sizes.size());
            random_permutation<int>(shard_order.data(), (int)sizes.size(), rng);
            for (int s : shard_order) {
                int64_t units = (sizes[s] - 1) / (B * T);
                std::vector<int64_t> order(units);
                random_permutation<int64_t>(order.data(), units, rng);
                for (int64_t k = 0; k < units / P; k++) expected.push_back({s, order[k * P + r]});
            }
        }
        EXPECT_EQ(read_batches(&loader, (int64_t)expected.size()), expected) << "rank " << r;
    }
}

// The batch of a global step does not depend on the process count: P processes with A accumulation
// steps read, together, the units that one process reads in P*A steps (shuffled and not).
TEST(DataLoaderShuffle, GlobalBatchIsTheSameForEveryProcessCount) {
    std::string dir = test::scratch_dir("dataloader_layout_free");
    std::string pattern = write_shards(dir, {6 * 8 * 5 + 1});  // 40 units of 6 tokens, shared by 1, 2, 4 or 8
    const int B = 2, T = 3, global_micro = 8;
    for (bool shuffle : {false, true}) {
        SCOPED_TRACE(shuffle ? "shuffled" : "unshuffled");
        std::vector<std::set<Sample>> reference;  // per step, 1 process
        for (int P : {1, 2, 4, 8}) {
            int A = global_micro / P;
            std::vector<DataLoader> loaders(P);
            for (int r = 0; r < P; r++) dataloader_init(&loaders[r], pattern, B, T, r, P, shuffle, VOCAB);
            for (int step = 0; step < 5; step++) {
                std::set<Sample> batch;
                for (int r = 0; r < P; r++) {
                    for (Sample x : read_batches(&loaders[r], A)) batch.insert(x);
                }
                EXPECT_EQ((int)batch.size(), global_micro);
                if (P == 1) reference.push_back(batch);
                else EXPECT_EQ(batch, reference[step]) << "P=" << P << " step " << step;
            }
        }
    }
}

TEST(DataLoaderShuffle, SeekReproducesTheNextBatches) {
    std::string dir = test::scratch_dir("dataloader_seek");
    const std::vector<int64_t> sizes = {100, 49, 75};
    std::string pattern = write_shards(dir, sizes);
    const int B = 2, T = 3, P = 2;
    for (int r = 0; r < P; r++) {
        SCOPED_TRACE("rank " + std::to_string(r));
        DataLoader reference;
        dataloader_init(&reference, pattern, B, T, r, P, true, VOCAB);
        int64_t per_epoch = dataloader_num_batches(&reference);  // 8 + 4 + 6 = 18
        ASSERT_EQ(per_epoch, 18);
        // positions after k batches, over three epochs
        std::vector<DataPosition> positions;
        std::vector<Sample> batches;
        for (int64_t k = 0; k < 3 * per_epoch; k++) {
            positions.push_back(reference.position);
            dataloader_next_batch(&reference);
            batches.push_back(identify_batch(reference));
        }
        // from every saved position (shard starts, epoch boundaries and mid-shard), a fresh loader that
        // seeks there reads what the uninterrupted loader read next, into the following epoch
        for (int64_t k = 0; k < 2 * per_epoch; k++) {
            DataLoader resumed;
            dataloader_init(&resumed, pattern, B, T, r, P, true, VOCAB);
            read_batches(&resumed, per_epoch + 3);  // past many targets first: seeking goes back too
            dataloader_seek(&resumed, positions[k]);
            EXPECT_EQ(resumed.position.epoch, positions[k].epoch);
            EXPECT_EQ(resumed.position.shard_index, positions[k].shard_index);
            EXPECT_EQ(resumed.position.sample_index, positions[k].sample_index);
            std::vector<Sample> next = read_batches(&resumed, per_epoch);
            std::vector<Sample> want(batches.begin() + k, batches.begin() + k + per_epoch);
            EXPECT_EQ(next, want) << "after seeking to the position of batch " << k;
        }
        // the positions did cross epochs
        EXPECT_EQ(positions[per_epoch].epoch, 1);
        EXPECT_EQ(positions[per_epoch].shard_index, 0);
        EXPECT_EQ(positions[per_epoch].sample_index, 0);
    }
}

TEST(DataLoaderShuffle, SeekRefusesPositionsOutsideTheData) {
    std::string dir = test::scratch_dir("dataloader_seek_bad");
    std::string pattern = write_shards(dir, {100, 49});
    DataLoader loader;
    dataloader_init(&loader, pattern, 2, 3, 0, 1, true, VOCAB);
    DataPosition beyond_shards{0, 2, 0};
    EXPECT_EXIT(dataloader_seek(&loader, beyond_shards), testing::ExitedWithCode(1),
                "data position \\(epoch 0, shard 2, sample 0\\) does not fit the 2 shard\\(s\\)");
    DataPosition negative{-1, 0, 0};
    EXPECT_EXIT(dataloader_seek(&loader, negative), testing::ExitedWithCode(1), "does not fit the 2 shard");
    DataPosition past_end{1, 0, 16};  // shards have 16 and 8 samples: 16 is past either
    EXPECT_EXIT(dataloader_seek(&loader, past_end), testing::ExitedWithCode(1),
                "sample 16\\) is past the end of that shard \\([0-9]+ samples\\)");
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
    int64_t first_shard = dataloader_samples_in_file(&loader, 0);
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

TEST(DataLoaderErrors, ShardTooSmallForOneBatch) {
    std::string dir = test::scratch_dir("dataloader_small");
    std::vector<uint16_t> tokens(100, 1);
    shard_write(dir + "/s_000000.bin", tokens.data(), 100);
    shard_write(dir + "/s_000001.bin", tokens.data(), 24);  // P*B*T = 24 needs 25 tokens
    DataLoader loader;
    dataloader_init(&loader, dir + "/s_000000.bin", 2, 4, 0, 3, false, VOCAB);  // 100 tokens are enough
    EXPECT_EQ(dataloader_num_batches(&loader), 4);
    EXPECT_EXIT(dataloader_init(&loader, dir + "/s_*.bin", 2, 4, 0, 3, false, VOCAB), testing::ExitedWithCode(1),
                "data shard '" + test::re_escape(dir + "/s_000001.bin") +
                    "' has 24 tokens, fewer than the 25 one batch needs \\(3 processes x B=2 x T=4, plus one\\)");
    shard_write(dir + "/s_000001.bin", tokens.data(), 25);  // exactly one sample
    dataloader_init(&loader, dir + "/s_*.bin", 2, 4, 0, 3, false, VOCAB);
    EXPECT_EQ(dataloader_num_batches(&loader), 5);
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
