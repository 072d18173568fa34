// Stopping on request: SIGTERM (Slurm's preemption and scancel, Kubernetes, a plain `kill`) and SIGUSR1
// (what Slurm sends ahead of the end of a job with `--signal=USR1@120`). The handler only records the
// signal; at every step boundary the run loop asks whether any process has one (a collective: the
// processes may have received it during different steps, and must all stop after the same one), and
// if so finishes there: a checkpoint of that step on every process (with -o), then exit status 75
// (EX_TEMPFAIL, "try again": the job can be requeued and continue with -y 1). doc/reliability.md.
#pragma once

#include <csignal>
#include <cstring>

// the exit status of a run stopped by SIGTERM or SIGUSR1 (after its checkpoint)
constexpr int EXIT_STOPPED_BY_SIGNAL = 75;

// the signal received, 0 for none (written by the handler only)
inline volatile sig_atomic_t stop_signal_received = 0;

inline void stop_signal_record(int signal) { stop_signal_received = signal; }

// From here on, SIGTERM and SIGUSR1 ask the run to stop at the next step boundary instead of ending
// the process. SA_RESTART: a file read or write interrupted by the signal goes on.
inline void stop_signals_install() {
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = stop_signal_record;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGUSR1, &action, nullptr);
}

inline const char* stop_signal_name(int signal) {
    return signal == SIGTERM ? "SIGTERM" : signal == SIGUSR1 ? "SIGUSR1" : "a signal";
}
