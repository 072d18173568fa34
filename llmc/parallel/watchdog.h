// The collective watchdog: a wait on other processes that lasts longer than -wt seconds ends the run
// with a message, on every process, instead of a hang. The chapters we build from list the classic
// causes: a process died or was stopped, or the processes issued different collectives (one of them
// waits in an all-reduce that the others never call).
//
// Each process says what it waits for: watchdog_begin/watchdog_end around every blocking call of
// llmc/parallel/comm_mpi.h (WatchdogWait), and around the GPU trainer's waits on its streams
// (llmc/parallel/gpu_start.cuh's dp_wait). Every such wait has a name ("an all-reduce"), a group
// ("data-parallel") and a serial number: the count of waits this process has begun in that group, so
// the processes of a group that wait in the same collective wait with the same serial.
//
// Under MPI a thread of the watchdog's own (watchdog_start) looks at the wait every WATCHDOG_TICK_MS and
// answers the others' question "what are you waiting for?" over a communicator of its own. When this
// process's wait runs out, it asks every process, gives them WATCHDOG_ANSWER_S seconds to answer, and
// prints one line per process that had not arrived: waiting in something else (its name, group, serial
// and step) or no answer at all (stopped, dead, or busy outside any wait). Then it removes this
// process's half-written files and ends the run (MPI_Abort: mpirun ends the others, stopped ones
// included, with a non-zero status). Finished checkpoints are untouched (llmc/io/checkpoint.h marks a
// checkpoint complete only after every process has written its files).
//
// Without MPI (the GPU trainer started with -pi tcp or file) there is no one to ask: the GPU trainer's
// dp_wait reports the timeout itself, without the list of processes.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../utils.h"
#include "flight_recorder.h"

#ifdef USE_MPI
#include <mpi.h>
#endif

constexpr int WATCHDOG_TICK_MS = 20;
constexpr double WATCHDOG_ANSWER_S = 3.0;

// The step the run is at (the run loop sets it; -1 before training).
inline std::atomic<long> watchdog_step{-1};

// What one process waits for, as sent to another (fixed size: one MPI message).
struct WatchdogAnswer {
    int32_t waiting = 0;  // 0: not waiting on other processes
    int32_t rank = 0;
    int64_t step = -1;
    uint64_t serial = 0;
    double seconds = 0;  // waited so far
    char what[96] = {};
    char group[32] = {};
};

struct Watchdog {
    std::mutex mutex;
    double limit_s = 0;  // 0: not watching (before watchdog_set_limit)
    const char* limit_flag = "-wt";  // the flag the limit came from: -pt during start-up, -wt in training
    bool waiting = false;
    std::string what, group;
    const std::vector<int>* members = nullptr;  // the group's processes (world ranks); null: all
    uint64_t serial = 0;
    long step = -1;
    std::chrono::steady_clock::time_point since;
    std::map<std::string, uint64_t> serials;  // per group: waits begun so far
    std::atomic<bool> reported{false};        // one report per process
    int rank = 0, size = 1;
#ifdef USE_MPI
    MPI_Comm comm = MPI_COMM_NULL;
    std::thread thread;
    std::atomic<bool> stop{false};
#endif
};

inline Watchdog& watchdog() {
    static Watchdog* w = new Watchdog;  // never destroyed: its thread may outlive main's statics
    return *w;
}

// The limit on any wait from now on, and the flag it came from (for the report): each trainer sets -pt
// (the start-up limit, as the launch's rendezvous has) right after its processes find each other, so
// that the first collective is watched too, and the run loop sets -wt when training begins.
inline void watchdog_set_limit(double seconds, const char* flag = "-wt") {
    std::lock_guard<std::mutex> lock(watchdog().mutex);
    watchdog().limit_s = seconds;
    watchdog().limit_flag = flag;
}

// The limit now (0: not watching)
inline double watchdog_limit() {
    std::lock_guard<std::mutex> lock(watchdog().mutex);
    return watchdog().limit_s;
}

inline void watchdog_begin(const char* what, const char* group, const std::vector<int>* members) {
    Watchdog& w = watchdog();
    std::lock_guard<std::mutex> lock(w.mutex);
    w.waiting = true;
    w.what = what;
    w.group = group;
    w.members = members;
    w.serial = ++w.serials[w.group];
    w.step = watchdog_step.load();
    w.since = std::chrono::steady_clock::now();
}

inline void watchdog_end() {
    std::lock_guard<std::mutex> lock(watchdog().mutex);
    watchdog().waiting = false;
}

// A scope that waits on other processes.
struct WatchdogWait {
    WatchdogWait(const char* what, const char* group, const std::vector<int>* members = nullptr) {
        watchdog_begin(what, group, members);
    }
    ~WatchdogWait() { watchdog_end(); }
    WatchdogWait(const WatchdogWait&) = delete;
    WatchdogWait& operator=(const WatchdogWait&) = delete;
};

// This process's answer: what it waits for now (caller holds the mutex).
inline WatchdogAnswer watchdog_answer_locked(const Watchdog& w) {
    WatchdogAnswer a;
    a.rank = w.rank;
    a.waiting = w.waiting ? 1 : 0;
    a.step = w.waiting ? w.step : watchdog_step.load();
    a.serial = w.serial;
    a.seconds = w.waiting ? std::chrono::duration<double>(std::chrono::steady_clock::now() - w.since).count() : 0.0;
    snprintf(a.what, sizeof(a.what), "%s", w.what.c_str());
    snprintf(a.group, sizeof(a.group), "%s", w.group.c_str());
    return a;
}

// Where a process is, for the report: "at start-up" before the first step, else "at step N".
inline std::string watchdog_when(int64_t step) {
    return step < 0 ? std::string("at start-up") : "at step " + std::to_string((long long)step);
}

// The report, given the other processes' answers (answered[r] false: none came): which of the group's
// processes had not arrived at this wait.
inline std::string watchdog_report(const WatchdogAnswer& me, const std::vector<int>* members,
                                   const std::vector<WatchdogAnswer>& answers, const std::vector<bool>& answered,
                                   double limit_s, const char* limit_flag, bool asked) {
    char line[512];
    snprintf(line, sizeof(line), "watchdog: %s (group %s, its wait #%llu) %s has waited %.0f s (%s %g)", me.what,
             me.group, (unsigned long long)me.serial, watchdog_when(me.step).c_str(), me.seconds, limit_flag, limit_s);
    std::string text = line;
    if (!asked) return text + "; the other processes cannot be asked (no MPI: started with -pi tcp or file)";
    std::string missing;
    int count = 0;
    for (size_t r = 0; r < answers.size(); r++) {
        if ((int)r == me.rank) continue;
        if (members != nullptr && std::find(members->begin(), members->end(), (int)r) == members->end()) continue;
        const WatchdogAnswer& a = answers[r];
        bool arrived = answered[r] && a.waiting && strcmp(a.group, me.group) == 0 && a.serial == me.serial;
        if (arrived) continue;
        count++;
        if (!answered[r]) {
            snprintf(line, sizeof(line), "\n  process %zu: no answer within %.0f s (stopped, dead, or busy outside any "
                     "wait)", r, WATCHDOG_ANSWER_S);
        } else if (!a.waiting) {
            snprintf(line, sizeof(line), "\n  process %zu: not waiting on the others (%s)", r,
                     a.step < 0 ? "starting up" : watchdog_when(a.step).c_str());
        } else {
            snprintf(line, sizeof(line), "\n  process %zu: waiting in %s (group %s, its wait #%llu) %s for %.0f s", r,
                     a.what, a.group, (unsigned long long)a.serial, watchdog_when(a.step).c_str(), a.seconds);
        }
        missing += line;
    }
    if (count == 0) return text + "; every process of the group has arrived (the wait itself is stuck)";
    snprintf(line, sizeof(line), "; %d process(es) had not arrived:", count);
    return text + line + missing;
}

// The report's last line: this process's newest collective by the flight recorder's numbers (the same
// on every process of its group), and where the recorder was written (flight_<rank>.json, read by
// dev/flight_report.py).
inline std::string watchdog_flight_note(const std::string& report) {
    FlightEntry last = flight_last();
    std::string path = flight_dump(report);
    if (last.seq == 0) return "";
    char line[512];
    snprintf(line, sizeof(line), "\n  flight recorder: this process's last collective is %s #%llu of group %s (%s)%s%s",
             last.op, (unsigned long long)last.group_seq, last.group,
             last.end_s < 0 ? "not returned" : last.queued ? "queued" : "returned", path.empty() ? "" : ", written to ",
             path.c_str());
    return line;
}

#ifdef USE_MPI
constexpr int WATCHDOG_TAG_ASK = 1, WATCHDOG_TAG_ANSWER = 2;

// Answers the questions that have arrived (the watchdog thread).
inline void watchdog_serve(Watchdog& w, std::vector<MPI_Request>* sends, std::vector<WatchdogAnswer*>* buffers) {
    for (;;) {
        int flag = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, WATCHDOG_TAG_ASK, w.comm, &flag, &status);
        if (!flag) break;
        int32_t asker = 0;
        MPI_Recv(&asker, 1, MPI_INT32_T, status.MPI_SOURCE, WATCHDOG_TAG_ASK, w.comm, MPI_STATUS_IGNORE);
        WatchdogAnswer* answer = new WatchdogAnswer;
        {
            std::lock_guard<std::mutex> lock(w.mutex);
            *answer = watchdog_answer_locked(w);
        }
        sends->emplace_back();
        buffers->push_back(answer);
        MPI_Isend(answer, sizeof(WatchdogAnswer), MPI_BYTE, status.MPI_SOURCE, WATCHDOG_TAG_ANSWER, w.comm, &sends->back());
    }
    for (size_t i = 0; i < sends->size();) {  // free the answers that have gone
        int done = 0;
        MPI_Test(&(*sends)[i], &done, MPI_STATUS_IGNORE);
        if (done) {
            delete (*buffers)[i];
            (*sends)[i] = sends->back();
            sends->pop_back();
            (*buffers)[i] = buffers->back();
            buffers->pop_back();
        } else {
            i++;
        }
    }
}

// This process's wait ran out: ask everyone, report, end the run.
[[noreturn]] inline void watchdog_fire(Watchdog& w, std::vector<MPI_Request>* sends, std::vector<WatchdogAnswer*>* buffers) {
    flight_freeze();  // the wait that ran out stays open in the recorder, whatever ends it while we ask
    WatchdogAnswer me;
    const std::vector<int>* members;
    double limit;
    const char* flag;
    {
        std::lock_guard<std::mutex> lock(w.mutex);
        me = watchdog_answer_locked(w);
        members = w.members;
        limit = w.limit_s;
        flag = w.limit_flag;
    }
    std::vector<WatchdogAnswer> answers(w.size);
    std::vector<bool> answered(w.size, false);
    std::vector<MPI_Request> asks(w.size, MPI_REQUEST_NULL), replies(w.size, MPI_REQUEST_NULL);
    int32_t my_rank = w.rank;
    for (int r = 0; r < w.size; r++) {
        if (r == w.rank) continue;
        MPI_Irecv(&answers[r], sizeof(WatchdogAnswer), MPI_BYTE, r, WATCHDOG_TAG_ANSWER, w.comm, &replies[r]);
        MPI_Isend(&my_rank, 1, MPI_INT32_T, r, WATCHDOG_TAG_ASK, w.comm, &asks[r]);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(WATCHDOG_ANSWER_S);
    int pending = w.size - 1;
    while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
        watchdog_serve(w, sends, buffers);  // the others may be asking at the same time
        for (int r = 0; r < w.size; r++) {
            if (r == w.rank || answered[r]) continue;
            int done = 0;
            MPI_Test(&replies[r], &done, MPI_STATUS_IGNORE);
            if (done) {
                answered[r] = true;
                pending--;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(WATCHDOG_TICK_MS));
    }
    std::string report = watchdog_report(me, members, answers, answered, limit, flag, true);
    report += watchdog_flight_note(report);
    fflush(stdout);
    error_print("%s", report.c_str());
    remove_files_on_error();  // this process's half-written files (llmc/utils.h)
    MPI_Abort(MPI_COMM_WORLD, 1);  // mpirun ends every process
    _exit(EXIT_FAILURE);
}

inline void watchdog_loop() {
    Watchdog& w = watchdog();
    std::vector<MPI_Request> sends;
    std::vector<WatchdogAnswer*> buffers;
    while (!w.stop) {
        watchdog_serve(w, &sends, &buffers);
        bool expired = false;
        {
            std::lock_guard<std::mutex> lock(w.mutex);
            double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - w.since).count();
            expired = w.waiting && w.limit_s > 0 && waited > w.limit_s;
        }
        if (expired && !w.reported.exchange(true)) watchdog_fire(w, &sends, &buffers);
        std::this_thread::sleep_for(std::chrono::milliseconds(WATCHDOG_TICK_MS));
    }
    for (MPI_Request& r : sends) MPI_Cancel(&r);
}

// Starts the watchdog's thread over a duplicate of MPI_COMM_WORLD (collective: every process calls it,
// after MPI_Init_thread with MPI_THREAD_MULTIPLE). It watches nothing until watchdog_set_limit.
inline void watchdog_start() {
    Watchdog& w = watchdog();
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
    MPI_Comm_dup(MPI_COMM_WORLD, &w.comm);
    w.thread = std::thread(watchdog_loop);
}

// Stops the thread (before MPI_Finalize).
inline void watchdog_stop() {
    Watchdog& w = watchdog();
    if (!w.thread.joinable()) return;
    w.stop = true;
    w.thread.join();
    MPI_Comm_free(&w.comm);
}
#endif  // USE_MPI

// For a wait that polls (the GPU trainer's dp_wait): the report when it has run out, once per process,
// asking the others when MPI is there (false: another thread already reported). Without MPI it only
// describes this process's wait.
inline bool watchdog_expired_report(std::string* report) {
    Watchdog& w = watchdog();
    if (w.reported.exchange(true)) return false;
    WatchdogAnswer me;
    {
        std::lock_guard<std::mutex> lock(w.mutex);
        me = watchdog_answer_locked(w);
    }
#ifdef USE_MPI
    if (w.thread.joinable()) {
        std::vector<MPI_Request> sends;
        std::vector<WatchdogAnswer*> buffers;
        watchdog_fire(w, &sends, &buffers);  // does not return
    }
#endif
    *report = watchdog_report(me, nullptr, {}, {}, w.limit_s, w.limit_flag, false);
    *report += watchdog_flight_note(*report);
    return true;
}
