// Helpers shared by the CPU test suites: paths, running the programs under test, the PyTorch oracle,
// the debug-state file, and array comparison with a stated tolerance.
#pragma once

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../llmc/io/checksum.h"
#include "../llmc/io/dataloader.h"
#include "../llmc/io/debug_state.h"
#include "../llmc/utils.h"

namespace test {

// The repository root (make test sets GPT2_ROOT; falls back to the working directory).
inline std::string root() {
    const char* r = getenv("GPT2_ROOT");
    return r ? r : ".";
}

inline std::string python() {
    const char* p = getenv("GPT2_PYTHON");
    return p ? p : "python3";
}

// A fresh scratch directory under build/test_tmp/NAME, or build/test_tmp/$TEST_SCRATCH_TAG/NAME: test
// binaries that run side by side (test/run_tests.sh runs suites in two lanes) are given different tags.
inline std::string scratch_dir(const std::string& name) {
    const char* tag = getenv("TEST_SCRATCH_TAG");
    std::string dir = root() + "/build/test_tmp/" + (tag && *tag ? std::string(tag) + "/" : std::string()) + name;
    std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
    if (system(cmd.c_str()) != 0) ADD_FAILURE() << "could not create " << dir;
    return dir;
}

struct CommandResult {
    int exit_code;
    std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
    CommandResult result{-1, ""};
    FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
    if (!pipe) return result;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
    int status = pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

// Runs `launch` (an mpirun command line, output to `log`) in the background until `log` holds
// `ready` (a step line), stops MPI rank `rank` (SIGSTOP; found by its OMPI_COMM_WORLD_RANK among the
// processes whose command line holds `marker`), waits up to `limit_s` for the job to end (else kills
// it), and returns the shell's output: "exit STATUS after MS ms" (the watchdog tests).
inline CommandResult run_and_stop_rank(const std::string& launch, const std::string& log, const std::string& ready,
                                       const std::string& marker, int rank, int limit_s) {
    std::string script =
        "{ " + launch + " > " + log + " 2>&1 & launcher=$!; "
        "for i in $(seq 1200); do grep -q '" + ready + "' " + log + " && break; sleep 0.1; done; "
        "for p in $(pgrep -f " + marker + "); do tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | "
        "grep -qx OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + " && victim=$p; done; "
        "start=$(date +%s%N); kill -STOP $victim; "
        "timeout " + std::to_string(limit_s) + " tail --pid=$launcher -f /dev/null || { kill -CONT $victim; kill -9 $launcher; }; "
        "wait $launcher; status=$?; "
        "echo \"exit $status after $(( ($(date +%s%N) - start) / 1000000 )) ms\"; kill -9 $victim 2>/dev/null; true; }";
    return run_command(script);
}

// What both trainers' watchdog tests require of a run_and_stop_rank result `r` whose rank 1 was
// stopped (log: the job's output): the job ended with an error within limit_s seconds of the stop,
// and the watchdog's report names process 1 as not answering.
inline void expect_watchdog_ended_run(const CommandResult& r, const std::string& log, double limit_s) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, std::regex("exit ([0-9]+) after ([0-9]+) ms"))) << r.output << log;
    EXPECT_NE(std::stoi(m[1]), 0) << log;
    EXPECT_LT(std::stod(m[2]) / 1000, limit_s) << "the watchdog took too long\n" << log;
    EXPECT_NE(log.find("process 1: no answer within"), std::string::npos) << log;
}

// `text` with every POSIX extended-regex metacharacter escaped, to match a path literally.
inline std::string re_escape(const std::string& text) {
    std::string out;
    for (char c : text) {
        if (strchr(".[]{}()\\*+?^$|", c)) out += '\\';
        out += c;
    }
    return out;
}

// A TCP port on 127.0.0.1 that nothing listens on right now, taken below Linux's ephemeral range
// (32768-60999), where the kernel picks the ports of other programs' connections and listeners: MPI's
// among them, in the suites running beside this one. A port from that range (what binding to port 0
// gives) could be handed to another process between this function and the test's own bind or connect,
// and a test expecting "refused" would then reach someone else's listener.
inline int free_loopback_port() {
    static std::mt19937 rng(std::random_device{}());
    for (int attempt = 0; attempt < 200; attempt++) {
        int port = 20000 + (int)(rng() % 12000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr;
        memset(&addr, 0, sizeof(addr));
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons((uint16_t)port);
        bool free = bind(fd, (sockaddr*)&addr, sizeof(addr)) == 0;
        close(fd);
        if (free) return port;
    }
    ADD_FAILURE() << "no free TCP port in 20000..31999 after 200 tries";
    return 0;
}

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Runs the oracle into build/oracle/NAME with the given arguments, unless that directory already holds
// the output of the same arguments with the same oracle script (so files are made once per build).
inline std::string oracle(const std::string& name, const std::string& args) {
    std::string dir = root() + "/build/oracle/" + name;
    std::string script = root() + "/test/oracle/gpt2_oracle.py";
    std::string stamp = args + "\n" + read_text(script);
    if (file_exists(dir + "/stamp") && read_text(dir + "/stamp") == stamp) return dir;
    // Made under an exclusive lock (flock(1)), checked again inside it: two test binaries running side by
    // side that both need NAME make it once, and neither reads it half written. The stamp goes last.
    std::string stamp_tmp = dir + ".stamp." + std::to_string(getpid());
    if (system(("mkdir -p '" + root() + "/build/oracle'").c_str()) != 0) ADD_FAILURE() << "could not create build/oracle";
    std::ofstream(stamp_tmp, std::ios::binary) << stamp;
    std::string cmd = "flock '" + root() + "/build/oracle/.lock' sh -c \"cmp -s '" + stamp_tmp + "' '" + dir +
                      "/stamp' || { rm -rf '" + dir + "' && mkdir -p '" + dir + "' && " + python() + " '" + script +
                      "' --out '" + dir + "' " + args + " && cp '" + stamp_tmp + "' '" + dir + "/stamp'; }\"";
    CommandResult r = run_command(cmd);
    std::remove(stamp_tmp.c_str());
    if (r.exit_code != 0) ADD_FAILURE() << "oracle failed (" << cmd << "):\n" << r.output;
    return dir;
}

// The debug state the oracle writes (llmc/io/debug_state.h reads it, for check_gpt2 too).
using ::DebugState;
inline DebugState read_debug_state(const std::string& path, int V, size_t num_params) {
    return debug_state_read(path, V, num_params);
}

// The error measure of every comparison with a reference (llmc/io/debug_state.h): the largest |a - b|
// relative to the largest |b|.
using ::max_rel_error;

// The numbers of a JSON array "key": [..] in text (the oracle's run.json); enough JSON for our files.
inline std::vector<double> json_array(const std::string& text, const std::string& key) {
    std::vector<double> out;
    size_t at = text.find("\"" + key + "\"");
    if (at == std::string::npos) return out;
    at = text.find('[', at);
    size_t end = text.find(']', at);
    std::stringstream ss(text.substr(at + 1, end - at - 1));
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(strtod(item.c_str(), nullptr));
    return out;
}

// Values of "key" in each line of a .jsonl file that has it (metrics.jsonl).
inline std::vector<double> jsonl_values(const std::string& path, const std::string& key) {
    std::vector<double> out;
    std::ifstream in(path);
    std::string line, pattern = "\"" + key + "\": ";
    while (std::getline(in, line)) {
        size_t at = line.find(pattern);
        if (at != std::string::npos) out.push_back(strtod(line.c_str() + at + pattern.size(), nullptr));
    }
    return out;
}

// Every line of metrics.jsonl with the timings ("ms", "tokens_per_s") removed, so runs can be compared.
inline std::vector<std::string> metrics_without_timings(const std::string& path) {
    std::vector<std::string> lines;
    std::istringstream in(read_text(path));
    std::string line;
    while (std::getline(in, line)) {
        size_t at = line.find(", \"ms\":");
        if (at != std::string::npos) line = line.substr(0, at) + "}";
        lines.push_back(line);
    }
    return lines;
}

// Splits the oracle's shard into 3 train shards (so shuffling permutes shards and samples) and a val
// shard in `out`; returns the train glob.
inline std::string make_three_shards(const std::string& oracle_dir, const std::string& out) {
    FILE* fp;
    int64_t n = shard_open(oracle_dir + "/train.bin", &fp);
    std::vector<uint16_t> tokens(n);
    freadCheck(tokens.data(), 2, n, fp);
    fclose(fp);
    int64_t third = n / 3;
    for (int i = 0; i < 3; i++) {
        shard_write(out + "/shard_train_00000" + std::to_string(i) + ".bin", tokens.data() + i * third, third);
    }
    shard_write(out + "/shard_val_000000.bin", tokens.data(), third);
    return out + "/shard_train_*.bin";
}

// ----------------------------------------------------------------------------
// damaging files and disks on purpose (doc/reliability.md)

// The names in a directory (not . and ..), sorted.
inline std::vector<std::string> dir_names(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return names;
    while (struct dirent* entry = readdir(d)) {
        std::string name = entry->d_name;
        if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

// The names in dir that end in `suffix`, as one string (empty if none): for messages.
inline std::string dir_names_ending(const std::string& dir, const std::string& suffix) {
    std::string found;
    for (const std::string& name : dir_names(dir)) {
        if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            found += (found.empty() ? "" : " ") + name;
        }
    }
    return found;
}

// Inverts the bits `mask` of the byte at `offset` of a file, as a disk or a copy might.
inline void flip_byte(const std::string& path, long offset, unsigned char mask = 0x01) {
    FILE* fp = fopenCheck(path.c_str(), "r+b");
    fseekCheck(fp, offset, SEEK_SET);
    int c = fgetc(fp);
    ASSERT_NE(c, EOF) << path << " has no byte " << offset;
    fseekCheck(fp, offset, SEEK_SET);
    fputc(c ^ mask, fp);
    fcloseCheck(fp);
}

// Recomputes the checksums in the header of a model or state file after a test has changed its bytes,
// so that the reader gets past them to the check under test (a file that a buggy writer made).
inline void reseal_checksums(const std::string& path) {
    std::string bytes = read_text(path);
    ASSERT_GE(bytes.size(), (size_t)HEADER_BYTES) << path;
    int32_t* header = (int32_t*)&bytes[0];
    ASSERT_EQ(header[CHECKSUM_SLOT_TAG], CHECKSUM_TAG) << path << " has no checksums to reseal";
    int64_t block = header[CHECKSUM_SLOT_BLOCK_BYTES], payload = (int64_t)bytes.size() - HEADER_BYTES;
    for (int i = 0; i < header[CHECKSUM_SLOT_BLOCKS]; i++) {
        int64_t begin = i * block, len = std::min(block, payload - begin);
        header[CHECKSUM_SLOT_FIRST_BLOCK + i] = (int32_t)crc32_update(0, &bytes[HEADER_BYTES + begin], (size_t)len);
    }
    header[CHECKSUM_SLOT_HEADER] = 0;
    header[CHECKSUM_SLOT_HEADER] = (int32_t)crc32_update(0, header, HEADER_BYTES);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Recomputes only the header's own checksum of a checksummed model or state file (nothing for a file
// without checksums), after a test has set a header field: a header a buggy writer made, so the reader
// gets past the header's checksum to the check of the field under test.
inline void reseal_header_checksum(const std::string& path) {
    std::string bytes = read_text(path);
    if (bytes.size() < (size_t)HEADER_BYTES) return;
    int32_t* header = (int32_t*)&bytes[0];
    if (header[CHECKSUM_SLOT_TAG] != CHECKSUM_TAG) return;
    header[CHECKSUM_SLOT_HEADER] = 0;
    header[CHECKSUM_SLOT_HEADER] = (int32_t)crc32_update(0, header, HEADER_BYTES);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A shell command run with a limit of `limit_bytes` on the size of any file it writes (ulimit -f, in
// KiB for bash), which makes a disk that fills up at a chosen point. With SIGXFSZ ignored (trap '' XFSZ,
// inherited through exec), a write past the limit fails with EFBIG as a write to a full disk fails
// with ENOSPC; with `signal_kills`, SIGXFSZ ends the process there, as a crash would (without a core
// file: ulimit -c 0). Open MPI's PMIx keeps its shared data in files larger than such a limit (MPI_Init
// fails); PMIX_MCA_gds=hash keeps it in memory instead.
inline CommandResult run_with_file_limit(const std::string& command, long limit_bytes, bool signal_kills = false) {
    std::string script = std::string("export PMIX_MCA_gds=hash; ulimit -c 0; ") + (signal_kills ? "" : "trap '' XFSZ; ") +
                         "ulimit -f " + std::to_string(limit_bytes / 1024) + "; exec " + command;
    std::string quoted;  // the script as one single-quoted shell word
    for (char c : script) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return run_command("bash -c '" + quoted + "'");
}

// A 5-step run in `a` with a checkpoint every step, copied to `b` without its checkpoints 4 and 5, resumed
// there with `command` -y 1 (it must say it continues from step 3) must end with a's bits: the model file
// and process 1's state file of step 5.
inline void expect_resume_from_step_3_same_bits(const std::string& command, const std::string& a, const std::string& b) {
    ASSERT_EQ(run_command("cp -r " + a + "/. " + b + " && rm " + b + "/model_0000000[45].bin " + b + "/state_0000000[45]_* " + b +
                          "/DONE_0000000[45]").exit_code, 0);
    CommandResult resumed = run_command(command + " -y 1 -o " + b);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("continuing from step 3"), std::string::npos) << resumed.output;
    EXPECT_EQ(read_text(a + "/model_00000005.bin"), read_text(b + "/model_00000005.bin"));
    EXPECT_EQ(read_text(a + "/state_00000005_00001.bin"), read_text(b + "/state_00000005_00001.bin"));
}

}  // namespace test
