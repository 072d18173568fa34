// The start-up of a multi-GPU run, one process per GPU on one node or many, and the state every
// communicator of the process keeps (DataParallel: the world's from dp_init, or a group's split from it
// by llmc/parallel/comm_nccl.cuh's nccl_split), with the watchdog that ends a run whose collectives
// cannot finish. llmc/parallel/comm_nccl.cuh is the backend of llmc/parallel/comm.h on top of it.
//
// Start-up (dp_init): the process learns its rank, the process count and its GPU, from MPI under
// mpirun or from flags (-pn -pr -pg) otherwise; rank 0 makes the NCCL id and the others receive it
// by MPI broadcast, over TCP or through a shared file (llmc/parallel/bootstrap.h); then all form one NCCL
// communicator. Every rank checks that all of them run the same configuration (check_same_config,
// llmc/parallel/comm.h).
//
// Faults. A collective waits for every rank; if one has died or hangs, the others would wait forever.
// So the communicator is non-blocking (NCCL returns ncclInProgress instead of waiting inside a call)
// and every host wait that can depend on a collective goes through dp_wait: it polls the stream and
// ncclCommGetAsyncError, and after -pt seconds, or on an NCCL error, it prints which rank gave up
// waiting for what, aborts the communicator (ncclCommAbort makes NCCL's kernels and threads quit) and
// exits non-zero. ncclCommAbort has been seen to hang on its own, so an alarm ends the process if it
// has not returned within DP_ABORT_GRACE_S.
#pragma once

#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <string>
#include <thread>
#include <vector>

#include "../cuda_common.cuh"
#include "bootstrap.h"
#include "comm_mpi.h"
#include "watchdog.h"

constexpr unsigned DP_ABORT_GRACE_S = 20;

struct DataParallel {
    LaunchMethod method = LaunchMethod::Single;
    int rank = 0, size = 1;
    int device = 0;
    bool nccl = false;           // a communicator exists (every method but Single, even with one process)
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;  // the collectives run here
    cudaEvent_t compute_ready = nullptr, comm_done = nullptr;
    double timeout_s = 300;
    uint64_t* device_scratch = nullptr;  // (size + 1) words for small collectives
    uint64_t* host_scratch = nullptr;    // pinned mirror: its copies never block the host
    std::string id_file;                 // rank 0, -pi file: the id's file, until the communicator is formed
    cudaStream_t compute = nullptr;      // the stream the collectives are ordered after (the model's)
    int group_depth = 0;                 // inside comm_group_start/end: NCCL calls are only recorded
    std::vector<DataParallel*> subgroups;  // the world's: the communicators split from it (nccl_split)
    DataParallel* world = nullptr;         // a sub-group's: the world's state, which keeps it
    std::vector<cudaEvent_t> fences;       // comm_fence's events (made at the first)
    uint64_t fences_recorded = 0;
    const char* group_name = "all processes";  // for the watchdog's messages
};

// Every communicator of this process: an abort ends them all, so no other process waits on one.
inline std::vector<ncclComm_t> dp_every_comm;

// ----------------------------------------------------------------------------
// errors and the watchdog

// Prints the reason, aborts the communicator and exits non-zero, without waiting for anything.
[[noreturn]] __attribute__((format(printf, 2, 3))) inline void dp_abort(const DataParallel& dp, const char* fmt, ...) {
    fflush(stdout);
    char reason[2048];
    va_list args;
    va_start(args, fmt);
    vsnprintf(reason, sizeof(reason), fmt, args);
    va_end(args);
    error_print("rank %d of %d: %s", dp.rank, dp.size, reason);
    remove_files_on_error();  // this process's half-written files (llmc/utils.h)
    if (!dp.id_file.empty()) bootstrap_file_remove(dp.id_file);  // the run is over: the id is stale
    alarm(DP_ABORT_GRACE_S);  // SIGALRM ends the process if ncclCommAbort does not return
    for (ncclComm_t comm : dp_every_comm) ncclCommAbort(comm);
    _exit(EXIT_FAILURE);
}

inline std::string nccl_reason(const DataParallel& dp, ncclResult_t result) {
    std::string reason = ncclGetErrorString(result);
    const char* last = ncclGetLastError(dp.comm);
    if (last != nullptr && last[0] != '\0') reason += std::string(" (") + last + ")";
    return reason;
}

// For an NCCL call outside a group: ncclInProgress means a non-blocking communicator is still
// working on it (connecting, enqueuing); poll until it is done, an error, or -pt seconds have passed.
inline void dp_settle(const DataParallel& dp, ncclResult_t result, const char* what, const char* file, int line) {
    BootstrapClock::time_point deadline = deadline_after(dp.timeout_s);
    while (result == ncclInProgress) {
        if (ms_until(deadline) == 0) {
            dp_abort(dp, "%s did not finish within %g s (-pt): another process has died, hangs or never started "
                     "[%s:%d]", what, dp.timeout_s, file, line);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ncclCommGetAsyncError(dp.comm, &result);
    }
    if (result != ncclSuccess) dp_abort(dp, "NCCL: %s failed: %s  [%s:%d]", what, nccl_reason(dp, result).c_str(), file, line);
}
#define ncclSettle(dp, call) dp_settle((dp), (call), #call, __FILE__, __LINE__)

// For an NCCL call inside ncclGroupStart/End, which only records the operation.
inline void dp_check_queued(const DataParallel& dp, ncclResult_t result, const char* what, const char* file, int line) {
    if (result != ncclSuccess && result != ncclInProgress) {
        dp_abort(dp, "NCCL: %s failed: %s  [%s:%d]", what, nccl_reason(dp, result).c_str(), file, line);
    }
}
#define ncclQueued(dp, call) dp_check_queued((dp), (call), #call, __FILE__, __LINE__)

// Waits for `stream` to finish, like cudaStreamSynchronize, but gives up after -pt seconds or at an
// NCCL error: use it for every wait that can depend on a collective.
inline void dp_wait(const DataParallel& dp, cudaStream_t stream, const char* what) {
    if (!dp.nccl) {
        cudaCheck(cudaStreamSynchronize(stream));
        return;
    }
    // the watchdog's limit (-pt during start-up, -wt once training runs) and its report
    // (llmc/parallel/watchdog.h): under MPI its thread asks the other processes what they wait for
    WatchdogWait watched(what, dp.group_name);
    const double limit = watchdog_limit();
    BootstrapClock::time_point deadline = deadline_after(limit > 0 ? limit : dp.timeout_s);
    while (true) {
        cudaError_t status = cudaStreamQuery(stream);
        if (status == cudaSuccess) return;
        if (status != cudaErrorNotReady) cudaCheck(status);
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(dp.comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            dp_abort(dp, "NCCL failed while waiting for %s: %s (another process may have died)", what,
                     nccl_reason(dp, async).c_str());
        }
        if (ms_until(deadline) == 0 && limit > 0) {
            std::string report;
            if (watchdog_expired_report(&report)) {  // without MPI; under MPI it ends the run itself
                dp_abort(dp, "%s (another process has died or hangs, or is slower than the limit allows: raise -wt if "
                         "a checkpoint or a sample takes longer, -pt if start-up does)", report.c_str());
            }
            std::this_thread::sleep_for(std::chrono::seconds(DP_ABORT_GRACE_S));  // the watchdog's thread is ending it
            dp_abort(dp, "the watchdog did not end the run");
        }
        if (ms_until(deadline) == 0) {
            dp_abort(dp, "waited %g s (-pt) for %s: another process has died or hangs (or is slower than -pt allows)",
                     dp.timeout_s, what);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

// ----------------------------------------------------------------------------
// start-up

// The communication stream (high priority), its events and the scratch words of the host-value calls.
inline void dp_make_stream(DataParallel* dp) {
    int lowest, highest;  // numerically lowest is the highest priority
    cudaCheck(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    cudaCheck(cudaStreamCreateWithPriority(&dp->stream, cudaStreamNonBlocking, highest));
    cudaCheck(cudaEventCreateWithFlags(&dp->compute_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&dp->comm_done, cudaEventDisableTiming));
    cudaCheck(cudaMalloc(&dp->device_scratch, (dp->size + 1) * sizeof(uint64_t)));
    cudaCheck(cudaMallocHost(&dp->host_scratch, (dp->size + 1) * sizeof(uint64_t)));
}

#ifdef USE_MPI
// This process's index among the MPI processes on its node.
inline void mpi_local_rank(int world_rank, int* local_rank, int* local_size) {
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, local_rank));
    mpiCheck(MPI_Comm_size(node, local_size));
    mpiCheck(MPI_Comm_free(&node));
}
#endif

// Rank, process count and GPU; then the NCCL communicator (all methods but Single). Selects the GPU
// (cudaSetDevice) in every case.
inline DataParallel dp_init(const LaunchSettings& args, int* argc, char*** argv, const std::string& program = "") {
    DataParallel dp;
    dp.timeout_s = args.timeout_s;
    std::string error;
#ifdef USE_MPI
    const bool with_mpi = true;
#else
    const bool with_mpi = false;
#endif
    if (!choose_launch_method(args, with_mpi, &dp.method, &error)) fatal("%s", error.c_str());
    int visible = 0;
    cudaError_t err = cudaGetDeviceCount(&visible);
    if (err != cudaSuccess || visible == 0) {
        fatal("no CUDA GPU is visible (%s); train_gpt2cu needs one (train_gpt2 is the CPU trainer)",
              err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    if (dp.method == LaunchMethod::Mpi) {
#ifdef USE_MPI
        ProcessGroup pg = process_group_init(argc, argv);
        dp.rank = pg.rank;
        dp.size = pg.size;
        start_up_check(pg, program, args.timeout_s);  // watched from here on; the same program everywhere
        int local_rank, local_size;
        mpi_local_rank(dp.rank, &local_rank, &local_size);
        if (args.num_processes != 1 && args.num_processes != dp.size) {
            fatal("flag -pn %d disagrees with the %d processes mpirun started (leave -pn out under mpirun)",
                  args.num_processes, dp.size);
        }
        if (local_size > visible) {
            fatal("rank %d: %d processes share this node but only %d GPU(s) are visible to each", dp.rank, local_size,
                  visible);
        }
        dp.device = local_rank;
#endif
    } else if (dp.method == LaunchMethod::Tcp || dp.method == LaunchMethod::File) {
        dp.rank = args.process_rank;
        dp.size = args.num_processes;
        if (!choose_device(dp.rank, args.gpus_per_node, visible, &dp.device, &error)) fatal("%s", error.c_str());
    }
    fatal_set_process(dp.rank, dp.size);  // each error says which process it comes from
    cudaCheck(cudaSetDevice(dp.device));
    if (dp.method == LaunchMethod::Single) return dp;
    watchdog_set_limit(args.timeout_s, "-pt");  // (-pi tcp or file: no MPI to compare the programs over)

    // the NCCL id: made by rank 0, carried to the others by the chosen method
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (dp.rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) fatal("ncclGetUniqueId failed: %s (check NCCL_SOCKET_IFNAME)", ncclGetErrorString(r));
    }
    bool ok = true;
    if (dp.method == LaunchMethod::Mpi) {
#ifdef USE_MPI
        mpiCheck(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
#endif
    } else if (dp.method == LaunchMethod::Tcp) {
        ok = bootstrap_tcp(args.server_address, dp.rank, dp.size, dp.timeout_s, (uint8_t*)&id, sizeof(id), &error);
    } else {
        ok = bootstrap_file(args.bootstrap_file, dp.rank, dp.size, dp.timeout_s, (uint8_t*)&id, sizeof(id), &error);
    }
    if (!ok) fatal("bootstrap (-pi %s), rank %d of %d: %s", launch_method_name(dp.method), dp.rank, dp.size, error.c_str());
    if (dp.method == LaunchMethod::File && dp.rank == 0) dp.id_file = args.bootstrap_file;

    // a non-blocking communicator: its calls return ncclInProgress instead of waiting for the others
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&dp.comm, dp.size, id, dp.rank, &config);
    dp.nccl = true;
    dp_every_comm.push_back(dp.comm);
    dp_settle(dp, r, "forming the NCCL communicator (every rank must join)", __FILE__, __LINE__);
    if (!dp.id_file.empty()) {  // every rank has read it: the next run may use the path again
        bootstrap_file_remove(dp.id_file);
        dp.id_file.clear();
    }

    dp_make_stream(&dp);
    return dp;
}

// Waits for the communicator's last operations, closes it and frees its stream.
inline void dp_close(DataParallel* dp) {
    // the last collectives may wait for a peer that has died: the watchdog's wait, not a plain sync
    dp_wait(*dp, dp->stream, "the last collectives before shutdown");
    ncclSettle(*dp, ncclCommFinalize(dp->comm));  // flushes; waits for the peers' last operations
    ncclCommDestroy(dp->comm);
    dp_every_comm.erase(std::find(dp_every_comm.begin(), dp_every_comm.end(), dp->comm));
    dp->comm = nullptr;
    cudaCheck(cudaFree(dp->device_scratch));
    cudaCheck(cudaFreeHost(dp->host_scratch));
    cudaCheck(cudaEventDestroy(dp->compute_ready));
    cudaCheck(cudaEventDestroy(dp->comm_done));
    cudaCheck(cudaStreamDestroy(dp->stream));
    for (cudaEvent_t e : dp->fences) cudaCheck(cudaEventDestroy(e));
    dp->fences.clear();
    dp->nccl = false;
}

inline void dp_finalize(DataParallel* dp) {
    if (dp->nccl) {
        for (DataParallel* sub : dp->subgroups) {  // split from this one: closed first, in order
            dp_close(sub);
            delete sub;
        }
        dp->subgroups.clear();
        dp_close(dp);
    }
#ifdef USE_MPI
    if (dp->method == LaunchMethod::Mpi) process_group_finalize(ProcessGroup());
#endif
}
