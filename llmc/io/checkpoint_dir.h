// Checkpoint directories: the files of a checkpoint, its DONE marker, and what resume finds and clears.
//
// A checkpoint for step S in directory DIR is model_S.bin, one state_S_RANK.bin per process and last
// a DONE_S marker (S as %08d, RANK as %05d). Every file is written to a temporary name and renamed
// into place, and DONE_S is written only after all of them, so a crash at any point leaves either a
// complete checkpoint or one without its marker, which resume ignores and removes
// (checkpoint_remove_incomplete). A checkpoint that fails with an error (a full disk) removes its own
// files before the process exits (checkpoint_begin).
//
#pragma once

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../utils.h"

// ----------------------------------------------------------------------------
// checkpoint directory

inline std::string checkpoint_model_path(const std::string& dir, int64_t step) {
    char name[64];
    snprintf(name, sizeof(name), "/model_%08ld.bin", (long)step);
    return dir + name;
}

inline std::string checkpoint_state_path(const std::string& dir, int64_t step, int rank) {
    char name[64];
    snprintf(name, sizeof(name), "/state_%08ld_%05d.bin", (long)step, rank);
    return dir + name;
}

inline std::string checkpoint_done_path(const std::string& dir, int64_t step) {
    char name[64];
    snprintf(name, sizeof(name), "/DONE_%08ld", (long)step);
    return dir + name;
}

// Marks checkpoint `step` complete; call after every file of it is in place.
inline void checkpoint_mark_done(const std::string& dir, int64_t step) {
    AtomicFile f = atomic_open(checkpoint_done_path(dir, step));
    atomic_commit(&f);
}


// From here until checkpoint_end, an error exit of this process (fatal: a full disk, a failed
// collective) removes the files of checkpoint `step` that it writes: process 0's model file and every
// process's own state file, with their .tmp (AtomicFile's). Process 0 first removes an older run's
// DONE_step, since the files it marked are about to be replaced.
inline void checkpoint_begin(const std::string& dir, int64_t step, int rank) {
    if (rank == 0) {
        unlink(checkpoint_done_path(dir, step).c_str());
        remove_on_error(checkpoint_model_path(dir, step));
    }
    remove_on_error(checkpoint_state_path(dir, step, rank));
}

// This process's files of checkpoint `step` are complete: they stay whatever happens next. Process 0
// calls it once DONE_step is written; the others once every process has written its files (if process 0
// then fails to mark it done, a resume removes them).
inline void checkpoint_end(const std::string& dir, int64_t step, int rank) {
    if (rank == 0) keep_on_error(checkpoint_model_path(dir, step));
    keep_on_error(checkpoint_state_path(dir, step, rank));
}

// If `name` is one of a checkpoint's files (model_S.bin, state_S_R.bin, DONE_S), or one of those with
// .tmp after it, returns true and its step S and whether it is a .tmp.
inline bool checkpoint_file_step(const std::string& name, int64_t* step, bool* is_tmp) {
    std::string base = name;
    *is_tmp = base.size() > 4 && base.compare(base.size() - 4, 4, ".tmp") == 0;
    if (*is_tmp) base.resize(base.size() - 4);
    // prefix, then digits, then (for a state file) "_" and digits, then the suffix, and nothing else
    auto digits = [&](size_t* at) {
        size_t begin = *at;
        while (*at < base.size() && isdigit((unsigned char)base[*at])) ++*at;
        return *at > begin && *at - begin <= 12;
    };
    size_t at;
    const char* suffix;
    if (base.compare(0, 6, "model_") == 0 || base.compare(0, 6, "state_") == 0) {
        at = 6, suffix = ".bin";
    } else if (base.compare(0, 5, "DONE_") == 0) {
        at = 5, suffix = "";
    } else {
        return false;
    }
    size_t step_begin = at;
    if (!digits(&at)) return false;
    *step = atoll(base.substr(step_begin, at - step_begin).c_str());
    if (base[0] == 's') {  // state_S_R: then the rank
        if (at >= base.size() || base[at] != '_') return false;
        at++;
        if (!digits(&at)) return false;
    }
    return base.compare(at, std::string::npos, suffix) == 0;
}

// The steps with a DONE marker in dir, in increasing order (none when dir is empty or missing).
inline std::vector<int64_t> checkpoint_complete_steps(const std::string& dir) {
    std::vector<int64_t> steps;
    if (dir.empty()) return steps;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return steps;
    while (struct dirent* entry = readdir(d)) {
        int64_t step;
        bool is_tmp;
        if (entry->d_name[0] == 'D' && checkpoint_file_step(entry->d_name, &step, &is_tmp) && !is_tmp) steps.push_back(step);
    }
    closedir(d);
    std::sort(steps.begin(), steps.end());
    return steps;
}

// The newest step with a DONE marker in dir, or -1 if there is none.
inline int64_t checkpoint_find_latest(const std::string& dir) {
    std::vector<int64_t> steps = checkpoint_complete_steps(dir);
    return steps.empty() ? -1 : steps.back();
}

// Removes what crashed or failed checkpoints left in dir: every checkpoint file of a step without a
// DONE marker, and every checkpoint .tmp. Complete checkpoints and all other files are left alone.
// Returns the names it removed, sorted.
inline std::vector<std::string> checkpoint_remove_incomplete(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return names;
    while (struct dirent* entry = readdir(d)) names.push_back(entry->d_name);
    closedir(d);
    std::vector<int64_t> done;
    for (const std::string& name : names) {
        int64_t step;
        bool is_tmp;
        if (name[0] == 'D' && checkpoint_file_step(name, &step, &is_tmp) && !is_tmp) done.push_back(step);
    }
    std::vector<std::string> removed;
    for (const std::string& name : names) {
        int64_t step;
        bool is_tmp;
        if (!checkpoint_file_step(name, &step, &is_tmp)) continue;
        if (!is_tmp && std::find(done.begin(), done.end(), step) != done.end()) continue;
        std::string path = dir + "/" + name;
        if (unlink(path.c_str()) != 0) fatal("could not remove the incomplete checkpoint file '%s': %s", path.c_str(), strerror(errno));
        removed.push_back(name);
    }
    std::sort(removed.begin(), removed.end());
    return removed;
}
