// The flight recorder: each process keeps its last FLIGHT_ENTRIES collectives (as PyTorch's NCCL flight
// recorder does), so that a run that hangs or fails says which collective each process was in. Every
// collective of llmc/parallel/comm.h is recorded when it begins and when its call returns: a sequence
// number of this process, the operation, the group and the group's own sequence number (the processes
// of a group call its collectives in the same order, so entry #57 of "data-parallel" is the same
// collective on each of them), the element count and type, the step, and the times. With NCCL a call
// returns once the collective is queued on the stream: "returned" then means queued, not finished
// (the entry says so).
//
// On a watchdog timeout, a fatal error or a stop signal, the process writes flight_<rank>.json into the
// run's -o (flight_dump); dev/flight_report.py reads the files of all processes and prints where they
// diverged (doc/reliability.md, "The flight recorder").
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../utils.h"

constexpr size_t FLIGHT_ENTRIES = 256;

struct FlightEntry {
    uint64_t seq = 0;        // this process's collectives, from 1
    uint64_t group_seq = 0;  // this group's collectives on this process, from 1
    char op[24] = {};
    char group[32] = {};
    uint64_t count = 0;      // elements
    char type[8] = {};
    long step = -1;
    double begin_s = 0, end_s = -1;  // since the recorder started; end -1: the call has not returned
    bool queued = false;     // the backend queues (NCCL): end is when it was queued
};

struct FlightRecorder {
    std::mutex mutex;
    std::vector<FlightEntry> ring = std::vector<FlightEntry>(FLIGHT_ENTRIES);
    uint64_t next = 1;
    std::map<std::string, uint64_t> group_seqs;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::string dir;  // where flight_<rank>.json goes (-o); empty: nowhere
    int rank = 0;
    long step = -1;
    bool dumped = false;
    bool frozen = false;  // flight_freeze: no entry ends from here on
};

inline FlightRecorder& flight_recorder() {
    static FlightRecorder* r = new FlightRecorder;  // never destroyed: an error exit may dump it late
    return *r;
}

inline double flight_now(const FlightRecorder& r) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
}

// Records the beginning of a collective; returns its sequence number (for flight_end).
inline uint64_t flight_begin(const char* op, const char* group, uint64_t count, const char* type, bool queued) {
    FlightRecorder& r = flight_recorder();
    std::lock_guard<std::mutex> lock(r.mutex);
    FlightEntry& e = r.ring[r.next % FLIGHT_ENTRIES];
    e = FlightEntry();
    e.seq = r.next++;
    e.group_seq = ++r.group_seqs[group];
    snprintf(e.op, sizeof(e.op), "%s", op);
    snprintf(e.group, sizeof(e.group), "%s", group);
    e.count = count;
    snprintf(e.type, sizeof(e.type), "%s", type);
    e.step = r.step;
    e.begin_s = flight_now(r);
    e.queued = queued;
    return e.seq;
}

inline void flight_end(uint64_t seq) {
    FlightRecorder& r = flight_recorder();
    std::lock_guard<std::mutex> lock(r.mutex);
    FlightEntry& e = r.ring[seq % FLIGHT_ENTRIES];
    if (e.seq == seq && !r.frozen) e.end_s = flight_now(r);
}

// The recorder as it is when a watchdog fires: a collective it waits in that returns later (with an
// error, once another process has ended the run) stays "not returned" in the file written after the
// watchdog has asked the others, so the file shows where this process was waiting.
inline void flight_freeze() {
    std::lock_guard<std::mutex> lock(flight_recorder().mutex);
    flight_recorder().frozen = true;
}

// The newest entry (seq 0 when there is none).
inline FlightEntry flight_last() {
    FlightRecorder& r = flight_recorder();
    std::lock_guard<std::mutex> lock(r.mutex);
    return r.next > 1 ? r.ring[(r.next - 1) % FLIGHT_ENTRIES] : FlightEntry();
}

inline void flight_set_step(long step) {
    std::lock_guard<std::mutex> lock(flight_recorder().mutex);
    flight_recorder().step = step;
}


inline std::string flight_path(const std::string& dir, int rank) {
    return dir + "/flight_" + std::to_string(rank) + ".json";
}

// The recorder as JSON: {"rank": R, "reason": "...", "now_s": T, "step": S, "entries": [{...}, ...]},
// oldest entry first.
inline std::string flight_json(const std::string& reason) {
    FlightRecorder& r = flight_recorder();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::string escaped;
    for (char c : reason) {
        if (c == '"' || c == '\\') escaped += '\\';
        escaped += (c == '\n' || c == '\t') ? ' ' : c;
    }
    char line[512];
    snprintf(line, sizeof(line), "{\"rank\": %d, \"reason\": \"", r.rank);
    std::string json = line + escaped;
    snprintf(line, sizeof(line), "\", \"now_s\": %.6f, \"step\": %ld, \"entries\": [", flight_now(r), r.step);
    json += line;
    uint64_t first = r.next > FLIGHT_ENTRIES ? r.next - FLIGHT_ENTRIES : 1;
    for (uint64_t seq = first; seq < r.next; seq++) {
        const FlightEntry& e = r.ring[seq % FLIGHT_ENTRIES];
        snprintf(line, sizeof(line),
                 "%s\n  {\"seq\": %llu, \"group\": \"%s\", \"group_seq\": %llu, \"op\": \"%s\", \"count\": %llu, "
                 "\"type\": \"%s\", \"step\": %ld, \"begin_s\": %.6f, \"end_s\": %s, \"queued\": %s}",
                 seq == first ? "" : ",", (unsigned long long)e.seq, e.group, (unsigned long long)e.group_seq, e.op,
                 (unsigned long long)e.count, e.type, e.step, e.begin_s,
                 e.end_s < 0 ? "null" : std::to_string(e.end_s).c_str(), e.queued ? "true" : "false");
        json += line;
    }
    return json + "\n]}\n";
}

// Writes flight_<rank>.json into the output directory, once per process (the first reason wins: the
// watchdog's, then the error it causes); not for a process that recorded nothing (alone). Plain writes, no fatal(): it runs on the way out of errors.
// Returns the path, or "" when nothing was written.
inline std::string flight_dump(const std::string& reason) {
    FlightRecorder& r = flight_recorder();
    std::string dir;
    int rank;
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        if (r.dumped || r.dir.empty() || r.next == 1) return "";  // nothing recorded: one process alone
        r.dumped = true;
        dir = r.dir;
        rank = r.rank;
    }
    std::string json = flight_json(reason), path = flight_path(dir, rank), tmp = path + ".tmp";
    FILE* fp = fopen(tmp.c_str(), "w");
    if (fp == nullptr) return "";
    bool ok = fwrite(json.data(), 1, json.size(), fp) == json.size();
    ok = fclose(fp) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
        remove(tmp.c_str());
        return "";
    }
    return path;
}

// Where flight_dump writes (the run's -o; empty: nowhere) and as which process; from then on an error
// exit dumps the recorder too (utils.h's error_exit_hook).
inline void flight_set_output(const std::string& dir, int rank) {
    {
        std::lock_guard<std::mutex> lock(flight_recorder().mutex);
        flight_recorder().dir = dir;
        flight_recorder().rank = rank;
    }
    if (!dir.empty()) error_exit_hook = [](const char* reason) { flight_dump(reason); };
}

// A collective's entry, from its beginning to the return of its call.
struct FlightScope {
    uint64_t seq;
    FlightScope(const char* op, const char* group, uint64_t count, const char* type, bool queued)
        : seq(flight_begin(op, group, count, type, queued)) {}
    ~FlightScope() { flight_end(seq); }
    FlightScope(const FlightScope&) = delete;
    FlightScope& operator=(const FlightScope&) = delete;
};
