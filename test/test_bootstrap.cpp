// The host side of multi-GPU start-up and sharding, which needs no GPU (llmc/parallel/bootstrap.h,
// llmc/parallel/grad_buckets.h):
//  - the TCP and shared-file exchanges of rank 0's NCCL id, every rank a thread of this process, on
//    127.0.0.1 only and in a scratch directory: every rank gets rank 0's bytes, in whatever order the
//    ranks start;
//  - every wait is bounded: no rank 0, a missing rank, a silent server each end in an error within
//    about the timeout; a wrong magic, a wrong payload size, another process count, a duplicate rank,
//    an old bootstrap file are reported clearly; a stray connection does not disturb the run;
//  - the choice of method and GPU from the flags and the environment;
//  - the gradient buckets that overlap the reduction with the backward pass tile the parameters
//    exactly once, and with -z 1 every piece lies in the shard of the rank it is sent to.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "../llmc/parallel/bootstrap.h"
#include "../llmc/parallel/grad_buckets.h"
#include "../llmc/parallel/zero_sharded.h"
#include "test_helpers.h"

namespace {

constexpr size_t ID_BYTES = 128;  // sizeof(ncclUniqueId)

int free_port() { return test::free_loopback_port(); }  // test_helpers.h: below the ephemeral range

std::string loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

std::vector<uint8_t> random_blob(unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> blob(ID_BYTES);
    for (uint8_t& b : blob) b = (uint8_t)rng();
    return blob;
}

struct RankResult {
    bool ok = false;
    std::string error;
    std::vector<uint8_t> blob;
    double seconds = 0;
};

using Exchange = bool (*)(const std::string&, int, int, double, uint8_t*, size_t, std::string*);

// Runs `ranks` (rank numbers, may repeat or skip) as threads; rank 0 holds `blob`, the others zeros.
// Rank 0 starts `server_delay_s` after the others, so they must retry or poll.
std::vector<RankResult> run_ranks(Exchange exchange, const std::string& where, const std::vector<int>& ranks,
                                  const std::vector<int>& counts, double timeout_s, const std::vector<uint8_t>& blob,
                                  double server_delay_s = 0.0) {
    std::vector<RankResult> results(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); i++) {
        threads.emplace_back([&, i]() {
            RankResult& r = results[i];
            r.blob = ranks[i] == 0 ? blob : std::vector<uint8_t>(ID_BYTES, 0);
            if (ranks[i] == 0 && server_delay_s > 0) {
                std::this_thread::sleep_for(std::chrono::milliseconds((int)(server_delay_s * 1000)));
            }
            auto start = std::chrono::steady_clock::now();
            r.ok = exchange(where, ranks[i], counts[i], timeout_s, r.blob.data(), r.blob.size(), &r.error);
            r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        });
    }
    for (std::thread& t : threads) t.join();
    return results;
}

std::vector<int> same_count(size_t n, int count) { return std::vector<int>(n, count); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ----------------------------------------------------------------------------
// TCP

TEST(BootstrapTcp, EveryRankReceivesRank0sId) {
    std::vector<uint8_t> blob = random_blob(1);
    std::vector<int> ranks = {3, 1, 0, 2};
    // rank 0 comes up 0.5 s after the others: they are refused and retry
    std::vector<RankResult> results = run_ranks(bootstrap_tcp, loopback(free_port()), ranks, same_count(4, 4), 10.0, blob, 0.5);
    for (size_t i = 0; i < ranks.size(); i++) {
        SCOPED_TRACE("rank " + std::to_string(ranks[i]));
        EXPECT_TRUE(results[i].ok) << results[i].error;
        EXPECT_EQ(results[i].blob, blob);
        EXPECT_LT(results[i].seconds, 5.0);
    }
}

TEST(BootstrapTcp, OneProcessNeedsNoServer) {
    std::vector<uint8_t> blob = random_blob(2);
    std::string error;
    EXPECT_TRUE(bootstrap_tcp(loopback(free_port()), 0, 1, 1.0, blob.data(), blob.size(), &error)) << error;
    EXPECT_EQ(blob, random_blob(2));
}

TEST(BootstrapTcp, NoRank0EndsWithinTheTimeout) {
    int port = free_port();
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(port), {1}, {2}, 1.0, {});
    EXPECT_FALSE(r[0].ok);
    EXPECT_GE(r[0].seconds, 0.9);
    EXPECT_LT(r[0].seconds, 3.5) << "bounded wait";
    EXPECT_TRUE(contains(r[0].error, "could not reach rank 0 at 127.0.0.1:" + std::to_string(port))) << r[0].error;
    EXPECT_TRUE(contains(r[0].error, "refused")) << r[0].error;
}

// Rank 2 never starts: rank 0 gives up at its deadline and tells rank 1 why.
TEST(BootstrapTcp, MissingRankStopsEveryoneWithinTheTimeout) {
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(free_port()), {0, 1}, {3, 3}, 1.0, random_blob(3));
    for (const RankResult& result : r) {
        EXPECT_FALSE(result.ok);
        EXPECT_LT(result.seconds, 3.0) << "rank 0's deadline, and its message to rank 1 right after";
        EXPECT_TRUE(contains(result.error, "missing rank(s): 2")) << result.error;
    }
    EXPECT_TRUE(contains(r[1].error, "rank 0 ended the bootstrap")) << r[1].error;
}

TEST(BootstrapTcp, DifferentProcessCountsAreRefused) {
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(free_port()), {0, 1}, {2, 3}, 5.0, random_blob(4));
    for (const RankResult& result : r) {
        EXPECT_FALSE(result.ok);
        EXPECT_LT(result.seconds, 3.0) << "refused at once, not at the deadline";
        EXPECT_TRUE(contains(result.error, "started with 3 processes (-pn), rank 0 with 2")) << result.error;
    }
}

TEST(BootstrapTcp, TwoProcessesWithOneRankAreRefused) {
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(free_port()), {0, 1, 1}, same_count(3, 3), 5.0,
                                          random_blob(5));
    EXPECT_FALSE(r[0].ok);
    EXPECT_TRUE(contains(r[0].error, "two processes claim rank 1")) << r[0].error;
}

// A client that is not one of ours (wrong magic), and one that connects and says nothing, must not
// stop or stall the run.
TEST(BootstrapTcp, StrayConnectionsAreIgnored) {
    int port = free_port();
    std::vector<uint8_t> blob = random_blob(6);
    std::thread strays([port]() {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 listens by now
        sockaddr_in addr;
        memset(&addr, 0, sizeof(addr));
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(port);
        int silent = socket(AF_INET, SOCK_STREAM, 0), noisy = socket(AF_INET, SOCK_STREAM, 0);
        connect(silent, (sockaddr*)&addr, sizeof(addr));
        if (connect(noisy, (sockaddr*)&addr, sizeof(addr)) == 0) {
            char garbage[24];
            memset(garbage, 0x5a, sizeof(garbage));
            send(noisy, garbage, sizeof(garbage), MSG_NOSIGNAL);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        close(silent);
        close(noisy);
    });
    std::vector<int> ranks = {0, 1, 2};
    // the real ranks arrive after the strays
    std::vector<RankResult> r(3);
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; i++) {
        threads.emplace_back([&, i]() {
            std::this_thread::sleep_for(std::chrono::milliseconds(i == 0 ? 0 : 600));
            r[i].blob = i == 0 ? blob : std::vector<uint8_t>(ID_BYTES, 0);
            r[i].ok = bootstrap_tcp(loopback(port), i, 3, 10.0, r[i].blob.data(), ID_BYTES, &r[i].error);
        });
    }
    for (std::thread& t : threads) t.join();
    strays.join();
    for (int i = 0; i < 3; i++) {
        EXPECT_TRUE(r[i].ok) << "rank " << i << ": " << r[i].error;
        EXPECT_EQ(r[i].blob, blob);
    }
}

// A fake rank 0 that accepts one connection, reads the hello and answers with `reply` (nothing if
// empty), then holds the connection until the client closes it.
std::thread fake_server(int port, std::vector<uint8_t> reply, bool* saw_hello) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    EXPECT_EQ(bind(fd, (sockaddr*)&addr, sizeof(addr)), 0);
    listen(fd, 4);
    return std::thread([fd, reply, saw_hello]() {
        pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 5000) == 1) {
            int client = accept(fd, nullptr, nullptr);
            BootstrapHello hello;
            std::string error;
            *saw_hello = recv_all(client, &hello, sizeof(hello), deadline_after(3.0), &error) &&
                         hello.magic == BOOTSTRAP_TCP_MAGIC && hello.rank == 1 && hello.blob_size == ID_BYTES;
            if (!reply.empty()) send(client, reply.data(), reply.size(), MSG_NOSIGNAL);
            // hold the connection until the client gives up and closes it (at most 8 s)
            pollfd wait = {client, POLLIN, 0};
            char byte;
            while (poll(&wait, 1, 8000) == 1 && recv(client, &byte, 1, 0) > 0) {}
            close(client);
        }
        close(fd);
    });
}

std::vector<uint8_t> reply_bytes(uint32_t magic, uint32_t status, uint32_t length, size_t payload) {
    BootstrapReply reply = {magic, status, length, 0};
    std::vector<uint8_t> bytes((uint8_t*)&reply, (uint8_t*)&reply + sizeof(reply));
    bytes.resize(bytes.size() + payload, 7);
    return bytes;
}

TEST(BootstrapTcp, AnswerWithWrongMagicIsRefused) {
    int port = free_port();
    bool saw_hello = false;
    std::thread server = fake_server(port, reply_bytes(12345, 0, ID_BYTES, ID_BYTES), &saw_hello);
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(port), {1}, {2}, 5.0, {});
    server.join();
    EXPECT_TRUE(saw_hello);
    EXPECT_FALSE(r[0].ok);
    EXPECT_TRUE(contains(r[0].error, "magic 12345")) << r[0].error;
    EXPECT_TRUE(contains(r[0].error, "another program")) << r[0].error;
}

TEST(BootstrapTcp, IdOfWrongSizeIsRefused) {
    int port = free_port();
    bool saw_hello = false;
    std::thread server = fake_server(port, reply_bytes(BOOTSTRAP_TCP_MAGIC, 0, 64, 64), &saw_hello);
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(port), {1}, {2}, 5.0, {});
    server.join();
    EXPECT_FALSE(r[0].ok);
    EXPECT_TRUE(contains(r[0].error, "sent a 64-byte id, expected 128")) << r[0].error;
}

// A rank 0 that accepts but never answers (hung): the wait for the answer is bounded too.
TEST(BootstrapTcp, SilentRank0EndsWithinTheTimeout) {
    int port = free_port();
    bool saw_hello = false;
    std::thread server = fake_server(port, {}, &saw_hello);
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(port), {1}, {2}, 1.0, {});
    server.join();
    EXPECT_FALSE(r[0].ok);
    EXPECT_LT(r[0].seconds, 1.0 + BOOTSTRAP_REPLY_GRACE_S + 1.0);
    EXPECT_TRUE(contains(r[0].error, "no answer from rank 0")) << r[0].error;
}

TEST(BootstrapTcp, PortInUseIsReported) {
    int port = free_port();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    ASSERT_EQ(bind(fd, (sockaddr*)&addr, sizeof(addr)), 0);
    listen(fd, 1);
    std::vector<RankResult> r = run_ranks(bootstrap_tcp, loopback(port), {0}, {2}, 5.0, random_blob(7));
    close(fd);
    EXPECT_FALSE(r[0].ok);
    EXPECT_LT(r[0].seconds, 1.0);
    EXPECT_TRUE(contains(r[0].error, "cannot listen on 127.0.0.1:" + std::to_string(port))) << r[0].error;
}

TEST(BootstrapTcp, HostPortParsing) {
    std::string host, error;
    int port = 0;
    EXPECT_TRUE(parse_host_port("node001:29500", &host, &port, &error));
    EXPECT_EQ(host, "node001");
    EXPECT_EQ(port, 29500);
    EXPECT_TRUE(parse_host_port("[::1]:80", &host, &port, &error));
    EXPECT_EQ(host, "::1");
    for (const char* bad : {"node001", "node001:", ":29500", "node001:0", "node001:65536", "node001:29x", "[::1:80"}) {
        EXPECT_FALSE(parse_host_port(bad, &host, &port, &error)) << bad;
        EXPECT_FALSE(error.empty());
    }
}

// ----------------------------------------------------------------------------
// shared file

std::string id_file(const std::string& name) { return test::scratch_dir("bootstrap_" + name) + "/nccl_id"; }

TEST(BootstrapFile, EveryRankReceivesRank0sId) {
    std::string path = id_file("ok");
    std::vector<uint8_t> blob = random_blob(8);
    std::vector<int> ranks = {2, 0, 3, 1};
    std::vector<RankResult> results = run_ranks(bootstrap_file, path, ranks, same_count(4, 4), 10.0, blob, 0.3);
    for (size_t i = 0; i < ranks.size(); i++) {
        EXPECT_TRUE(results[i].ok) << "rank " << ranks[i] << ": " << results[i].error;
        EXPECT_EQ(results[i].blob, blob) << "rank " << ranks[i];
    }
    EXPECT_TRUE(file_exists(path));
    EXPECT_FALSE(file_exists(path + ".tmp"));
    bootstrap_file_remove(path);  // what rank 0 does once the communicator is formed
    EXPECT_FALSE(file_exists(path));
}

TEST(BootstrapFile, NoRank0EndsWithinTheTimeout) {
    std::string path = id_file("none");
    std::vector<RankResult> r = run_ranks(bootstrap_file, path, {1}, {2}, 1.0, {});
    EXPECT_FALSE(r[0].ok);
    EXPECT_GE(r[0].seconds, 0.9);
    EXPECT_LT(r[0].seconds, 3.0);
    EXPECT_TRUE(contains(r[0].error, "no bootstrap file from rank 0 at '" + path + "'")) << r[0].error;
}

TEST(BootstrapFile, Rank0RefusesAFileLeftByAnEarlierRun) {
    std::string path = id_file("stale");
    { std::ofstream(path) << "old"; }
    std::vector<RankResult> r = run_ranks(bootstrap_file, path, {0}, {2}, 1.0, random_blob(9));
    EXPECT_FALSE(r[0].ok);
    EXPECT_TRUE(contains(r[0].error, "already exists")) << r[0].error;
}

void write_id_file(const std::string& path, uint32_t magic, uint32_t processes, uint32_t size, size_t payload) {
    uint32_t header[4] = {magic, BOOTSTRAP_VERSION, processes, size};
    std::ofstream out(path, std::ios::binary);
    out.write((const char*)header, sizeof(header));
    out << std::string(payload, 'x');
}

TEST(BootstrapFile, FilesThatAreNotOursAreRefused) {
    struct Case { uint32_t magic, processes, size; size_t payload; const char* message; };
    const Case cases[] = {
        {12345, 2, ID_BYTES, ID_BYTES, "not a bootstrap file of this program (magic 12345"},
        {BOOTSTRAP_FILE_MAGIC, 3, ID_BYTES, ID_BYTES, "for 3 processes, this process was started with 2"},
        {BOOTSTRAP_FILE_MAGIC, 2, 64, ID_BYTES, "holds a 64-byte id, expected 128"},
        {BOOTSTRAP_FILE_MAGIC, 2, ID_BYTES, ID_BYTES + 10, "is 154 bytes, expected 144"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.message);
        std::string path = id_file("bad");
        write_id_file(path, c.magic, c.processes, c.size, c.payload);
        std::vector<RankResult> r = run_ranks(bootstrap_file, path, {1}, {2}, 5.0, {});
        EXPECT_FALSE(r[0].ok);
        EXPECT_LT(r[0].seconds, 1.0) << "refused at once, not at the deadline";
        EXPECT_TRUE(contains(r[0].error, c.message)) << r[0].error;
    }
}

// ----------------------------------------------------------------------------
// method and GPU

// Sets an environment variable for one scope and restores it.
struct ScopedEnv {
    std::string name, old;
    bool had;
    ScopedEnv(const char* n, const char* value) : name(n) {
        const char* o = getenv(n);
        had = o != nullptr;
        if (had) old = o;
        if (value) setenv(n, value, 1); else unsetenv(n);
    }
    ~ScopedEnv() { if (had) setenv(name.c_str(), old.c_str(), 1); else unsetenv(name.c_str()); }
};

TEST(BootstrapLaunch, MethodFromFlagsAndEnvironment) {
    ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", nullptr), pmi("PMI_SIZE", nullptr), pmix("PMIX_RANK", nullptr);
    LaunchMethod m;
    std::string error;
    LaunchSettings args;
    EXPECT_TRUE(choose_launch_method(args, true, &m, &error)) << error;
    EXPECT_EQ(m, LaunchMethod::Single) << "auto, no MPI launcher: one GPU, no NCCL";
    {
        ScopedEnv launched("OMPI_COMM_WORLD_SIZE", "4");
        EXPECT_TRUE(choose_launch_method(args, true, &m, &error)) << error;
        EXPECT_EQ(m, LaunchMethod::Mpi);
        EXPECT_FALSE(choose_launch_method(args, false, &m, &error));
        EXPECT_TRUE(contains(error, "built without MPI")) << error;
    }
    args.num_processes = 2;
    EXPECT_FALSE(choose_launch_method(args, true, &m, &error));
    EXPECT_TRUE(contains(error, "-pn 2 needs -pi tcp or -pi file")) << error;

    args.init_method = "tcp";
    EXPECT_FALSE(choose_launch_method(args, true, &m, &error));
    EXPECT_TRUE(contains(error, "needs -ps")) << error;
    args.server_address = "node001";
    EXPECT_FALSE(choose_launch_method(args, true, &m, &error));
    EXPECT_TRUE(contains(error, "flag -ps")) << error;
    args.server_address = "node001:29500";
    EXPECT_TRUE(choose_launch_method(args, true, &m, &error)) << error;
    EXPECT_EQ(m, LaunchMethod::Tcp);
    args.process_rank = 2;
    EXPECT_FALSE(choose_launch_method(args, true, &m, &error));
    EXPECT_TRUE(contains(error, "rank 2 is not below the process count -pn 2")) << error;

    args.process_rank = 1;
    args.init_method = "file";
    EXPECT_FALSE(choose_launch_method(args, true, &m, &error));
    EXPECT_TRUE(contains(error, "needs -pf")) << error;
    args.bootstrap_file = "/shared/id";
    EXPECT_TRUE(choose_launch_method(args, false, &m, &error)) << error;
    EXPECT_EQ(m, LaunchMethod::File);

    args.init_method = "mpi";
    EXPECT_FALSE(choose_launch_method(args, false, &m, &error));
    args.init_method = "gloo";
    EXPECT_FALSE(choose_launch_method(args, true, &m, &error));
    EXPECT_TRUE(contains(error, "unknown method 'gloo'")) << error;
}

TEST(BootstrapLaunch, DeviceOfEachRank) {
    int device;
    std::string error;
    // 2 nodes x 4 GPUs, every process sees all 4: rank 5 is the second GPU of node 1
    EXPECT_TRUE(choose_device(5, 4, 4, &device, &error));
    EXPECT_EQ(device, 1);
    EXPECT_TRUE(choose_device(5, 0, 4, &device, &error));
    EXPECT_EQ(device, 1);
    // one GPU visible per process (srun --gpus-per-task=1): always device 0
    EXPECT_TRUE(choose_device(7, 0, 1, &device, &error));
    EXPECT_EQ(device, 0);
    // -pg 8 on a node where this process sees 4
    EXPECT_FALSE(choose_device(6, 8, 4, &device, &error));
    EXPECT_TRUE(contains(error, "sees only 4")) << error;
    EXPECT_FALSE(choose_device(0, 0, 0, &device, &error));
}

// ----------------------------------------------------------------------------
// shards and gradient buckets

GPT2Config shape(int L, int C, int NH, int maxT, int V) {
    GPT2Config cfg;
    cfg.num_layers = L;
    cfg.channels = C;
    cfg.num_heads = NH;
    cfg.max_seq_len = maxT;
    cfg.vocab_size = V;
    cfg.padded_vocab_size = pad_vocab(V);
    return cfg;
}

TEST(BootstrapShards, AlignedShardsTileTheParameters) {
    for (size_t n : {8ul, 14336ul, 124475904ul, 1000003ul}) {
        for (int p : {1, 2, 3, 7, 8, 64}) {
            size_t covered = 0;
            for (int r = 0; r < p; r++) {
                ShardLayout s = aligned_shard_layout(n, p, r, 8);
                EXPECT_EQ(s.shard_size % 8, 0u);
                EXPECT_GE(s.shard_size * p, n);
                EXPECT_LT(s.shard_size, (n + p - 1) / p + 8) << "at most align-1 elements of padding per shard";
                EXPECT_EQ(s.padded_size, s.shard_size * p);
                EXPECT_EQ(s.num_parameters, n);
                EXPECT_EQ(s.begin, std::min(n, r * s.shard_size));
                EXPECT_EQ(s.begin, covered);
                covered = s.end;
            }
            EXPECT_EQ(covered, n);
        }
    }
    // one process: the shard is exactly the parameters when N is a multiple of 8 (it is: of C)
    ShardLayout one = aligned_shard_layout(124475904, 1, 0, 8);
    EXPECT_EQ(one.shard_size, 124475904u);
    EXPECT_EQ(one.padded_size, 124475904u);
}

TEST(BootstrapShards, BucketsCoverEveryGradientOnceInBackwardOrder) {
    for (GPT2Config cfg : {shape(2, 64, 4, 32, 300), shape(1, 24, 3, 32, 300), shape(12, 768, 12, 1024, 50257)}) {
        size_t n = num_parameters(cfg);
        size_t sizes[NUM_PARAMETER_TENSORS], offsets[NUM_PARAMETER_TENSORS];
        param_tensor_sizes(cfg, sizes);
        param_tensor_offsets(cfg, offsets);
        for (int zero : {0, 1, 2}) {
            for (int p : {1, 2, 3, 8}) {
                SCOPED_TRACE("L=" + std::to_string(cfg.num_layers) + " -z " + std::to_string(zero) + " P=" + std::to_string(p));
                ShardLayout s = aligned_shard_layout(n, p, 0, 8);
                std::vector<std::vector<GradSlice>> buckets = gradient_buckets(cfg, zero, s.shard_size);
                ASSERT_EQ(buckets.size(), (size_t)cfg.num_layers + 1);
                std::vector<GradSlice> all;
                for (const std::vector<GradSlice>& b : buckets) all.insert(all.end(), b.begin(), b.end());
                std::sort(all.begin(), all.end(), [](const GradSlice& a, const GradSlice& b) { return a.offset < b.offset; });
                size_t next = 0;
                for (const GradSlice& g : all) {
                    EXPECT_EQ(g.offset, next) << "no gap, no overlap";
                    EXPECT_GT(g.count, 0u);
                    next = g.offset + g.count;
                    if (zero == 0) {
                        EXPECT_EQ(g.owner, -1);
                    } else {
                        ASSERT_GE(g.owner, 0);
                        ASSERT_LT(g.owner, p);
                        EXPECT_GE(g.offset, g.owner * s.shard_size);
                        EXPECT_LE(g.offset + g.count, (g.owner + 1) * s.shard_size) << "a piece lies in its owner's shard";
                    }
                }
                EXPECT_EQ(next, n);
                // bucket l holds layer l's slice of each per-layer tensor, e.g. qkvw's (3C, C) block
                int l = cfg.num_layers - 1;
                size_t qkv_layer = sizes[P_QKVW] / cfg.num_layers, begin = offsets[P_QKVW] + l * qkv_layer;
                size_t in_bucket = 0;
                for (const GradSlice& g : buckets[l]) {
                    if (g.offset >= begin && g.offset < begin + qkv_layer) in_bucket += g.count;
                }
                EXPECT_EQ(in_bucket, qkv_layer);
                // packed (-z 2): a bucket's pieces lie one after another in its buffer, in flat order,
                // and the buffer's layout is the unit's (llmc/parallel/zero_sharded.h): block l's 12
                // slices, or wte, wpe, lnfw, lnfb
                std::vector<ZeroUnit> units = zero_units(cfg);
                for (int u = 0; u <= cfg.num_layers; u++) {
                    const std::vector<GradSlice>& b = buckets[u == 0 ? cfg.num_layers : u - 1];
                    size_t at = 0, prev = 0;
                    for (const GradSlice& g : b) {
                        EXPECT_EQ(g.unit_offset, at) << "bucket of unit " << u;
                        EXPECT_GE(g.offset, prev) << "flat order";
                        prev = g.offset + g.count;
                        at += g.count;
                        // where the unit's own layout puts this flat element
                        bool found = false;
                        for (const ZeroSlice& z : units[u].slices) {
                            if (g.offset >= z.flat && g.offset < z.flat + z.length) {
                                EXPECT_EQ(g.unit_offset, z.unit_offset + (g.offset - z.flat));
                                found = true;
                            }
                        }
                        EXPECT_TRUE(found);
                    }
                    EXPECT_EQ(at, units[u].size) << "bucket of unit " << u;
                }
            }
        }
    }
}

}  // namespace
