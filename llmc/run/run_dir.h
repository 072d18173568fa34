// A run's process output and directory: who prints, the lock on -o (and the flight recorder's place), and
// (-y 1) the checkpoint a run resumes from.
#pragma once

#include <cstdio>
#include <string>

#include "../io/checkpoint.h"
#include "../io/output_lock.h"
#include "../parallel/flight_recorder.h"
#include "args.h"

// Process 0 speaks for the run, a line at a time (a log redirected to a file keeps every line a kill
// -9 would otherwise lose in a full buffer); the others print only errors (stderr).
inline void stdout_for_process(int rank) {
    if (rank != 0 && freopen("/dev/null", "w", stdout) == nullptr) fatal("could not silence process %d", rank);
    setvbuf(stdout, nullptr, _IOLBF, 0);
}

// One run per output directory (llmc/io/output_lock.h): process 0 makes -o and locks it until it ends;
// every process's flight recorder writes there on an error (llmc/parallel/flight_recorder.h).
inline void output_dir_lock_for_run(const TrainArgs& args, int rank) {
    if (!args.output_dir.empty() && rank == 0) {
        make_dir_check(args.output_dir);
        output_dir_lock(args.output_dir);
    }
    flight_set_output(args.output_dir, rank);  // where this process's flight_<rank>.json goes on an error
}

// -y 1: the newest complete checkpoint in -o, whose model file the run starts from; -1 (from -e) when
// not resuming or when there is none. A fresh run refuses a directory that holds another run's
// checkpoints. Resuming, process 0 first removes what crashed or failed checkpoints left (files of a
// step without its DONE marker, .tmp files), which could otherwise keep a disk full.
inline int resume_step_from_args(const TrainArgs& args, int rank) {
    if (!args.resume) {
        // a fresh run does not mix with the checkpoints of another: a later -y 1 would resume those
        std::vector<int64_t> steps = checkpoint_complete_steps(args.output_dir);
        if (!steps.empty()) {
            std::string list;
            for (int64_t s : steps) list += (list.empty() ? "" : ", ") + std::to_string(s);
            fatal("-o %s holds the checkpoints of an earlier run (steps %s): continue that run with -y 1, or give this "
                  "one another -o (or remove them)", args.output_dir.c_str(), list.c_str());
        }
        return -1;
    }
    if (rank == 0) {
        std::vector<std::string> removed = checkpoint_remove_incomplete(args.output_dir);
        if (!removed.empty()) {
            std::string names;
            for (const std::string& name : removed) names += " " + name;
            printf("resume: removed %zu incomplete checkpoint file%s from %s (no DONE marker, or half written):%s\n",
                   removed.size(), removed.size() == 1 ? "" : "s", args.output_dir.c_str(), names.c_str());
        }
    }
    int step = (int)checkpoint_find_latest(args.output_dir);
    if (step < 0) {
        printf("resume: no complete checkpoint in %s, starting from scratch\n", args.output_dir.c_str());
    } else {
        printf("resume: continuing from step %d in %s\n", step, args.output_dir.c_str());
    }
    return step;
}
