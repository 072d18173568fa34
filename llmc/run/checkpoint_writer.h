// Asynchronous checkpoints (-ca 1): the step that checkpoints only puts its state together in host
// memory (the collectives that gather it, the copies from the device); a thread of this process writes
// the files (model file on process 0, this process's state file: the bytes, their checksums, the rename
// into place) while training goes on. The checkpoint is complete once every process's thread is done:
// the run loop asks at each step boundary (one all-reduce while a checkpoint is in flight, none
// otherwise), and then process 0 writes DONE_S. Until then DONE_S does not exist, so a crash mid-write
// leaves the previous checkpoint as the newest complete one, exactly as a synchronous checkpoint does.
//
// Waiting: a second checkpoint, a stop signal and the end of the run first wait for the one in flight.
// A write that fails (a full disk) ends the run from the writer thread, naming the file, after removing
// this process's files of that checkpoint (checkpoint_begin registered them), as it would synchronously.
//
//   checkpoint_writer()                   this process's writer
//   checkpoint_writer_start(job)          hands a checkpoint's files to the thread (none may be in flight)
//   checkpoint_writer_in_flight()         a checkpoint was handed over and not yet completed
//   checkpoint_writer_done()              this process's files of it are written
//   checkpoint_writer_complete(barrier)   once the processes agree that all files are written: DONE_S, the message
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../gpt2_config.h"
#include "../io/checkpoint.h"
#include "../io/llmc_state.h"

// The files of one process's part of checkpoint `step`, in host memory.
struct CheckpointJob {
    std::string dir;
    int step = -1, rank = 0;
    bool write_model = false;  // process 0: the model file
    GPT2Config model_config;
    std::vector<float> params;
    int model_version = 0;
    TrainState state;  // this process's state file, with the loss scaler's fields set
    bool llmc = false;  // -cf llmc: the state file is llm.c's instead (llmc/io/llmc_state.h)
    LlmcState llmc_state;
};

struct CheckpointWriter {
    std::thread thread;
    std::atomic<bool> done{true};
    bool in_flight = false;
    std::string dir;
    int step = -1, rank = 0;
    double write_seconds = 0.0;  // the thread's time for the last checkpoint
};

inline CheckpointWriter& checkpoint_writer() {
    static CheckpointWriter* w = new CheckpointWriter;  // never destroyed: its thread may outlive main's statics
    return *w;
}

// Writes the job's files (the thread's work; also the synchronous path's).
inline void checkpoint_job_write(const CheckpointJob& job) {
    if (job.write_model) {
        model_file_write(checkpoint_model_path(job.dir, job.step), job.model_config, job.params.data(), job.model_version);
    }
    if (job.llmc) {
        llmc_state_write(checkpoint_state_path(job.dir, job.step, job.rank), job.llmc_state);
    } else {
        state_file_write(checkpoint_state_path(job.dir, job.step, job.rank), job.state);
    }
}

inline bool checkpoint_writer_in_flight() { return checkpoint_writer().in_flight; }
inline bool checkpoint_writer_done() { return checkpoint_writer().done.load(); }

inline void checkpoint_writer_start(CheckpointJob job) {
    CheckpointWriter& w = checkpoint_writer();
    if (w.in_flight) fatal("checkpoint_writer_start: checkpoint %d is still in flight", w.step);
    if (w.thread.joinable()) w.thread.join();
    w.in_flight = true;
    w.done = false;
    w.dir = job.dir;
    w.step = job.step;
    w.rank = job.rank;
    w.thread = std::thread([job = std::move(job)] {
        auto start = std::chrono::steady_clock::now();
        checkpoint_job_write(job);  // an error ends the process here (fatal), removing the files
        checkpoint_writer().write_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        checkpoint_writer().done = true;
    });
}

// Blocks until this process's thread has written its files.
inline void checkpoint_writer_wait() {
    CheckpointWriter& w = checkpoint_writer();
    if (w.thread.joinable()) w.thread.join();
}

// The end of every checkpoint, once the processes know that every process's files are written (a
// barrier after the synchronous writes; the run loop's sum over the writer threads' "done"): process 0
// writes the DONE marker that makes the checkpoint complete, every process keeps its files whatever
// happens next, and the run says so (`how`: "" or a note). barrier(what) waits for every process.
template <typename Barrier>
void checkpoint_mark_complete(const std::string& dir, int step, int rank, Barrier barrier, const std::string& how = "") {
    {
        // not while an error exit removes this process's files (the watchdog's thread may be at it)
        std::lock_guard<std::recursive_mutex> commit(files_commit_mutex());
        if (rank == 0) checkpoint_mark_done(dir, step);
        checkpoint_end(dir, step, rank);
    }
    barrier("rank 0's checkpoint marker");
    printf("checkpoint: wrote step %d to %s%s\n", step, dir.c_str(), how.c_str());
}

// The in-flight checkpoint, once every process's thread has written its files (the caller has agreed
// on that with the others): the thread reaped, DONE_S, the message.
template <typename Barrier>
void checkpoint_writer_complete(Barrier barrier) {
    CheckpointWriter& w = checkpoint_writer();
    if (!w.in_flight) return;
    checkpoint_writer_wait();  // done already: this only reaps the thread
    char how[64];
    snprintf(how, sizeof(how), " (in the background: %.2f s)", w.write_seconds);
    checkpoint_mark_complete(w.dir, w.step, w.rank, barrier, how);
    w.in_flight = false;
}
