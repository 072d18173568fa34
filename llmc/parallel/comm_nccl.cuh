// The NCCL backend of llmc/parallel/comm.h, and the start-up of a multi-GPU run: one process per GPU, on one
// node or many.
//
// Start-up (dp_init): the process learns its rank, the process count and its GPU, from MPI under
// mpirun or from flags (-pn -pr -pg) otherwise; rank 0 makes the NCCL id and the others receive it
// by MPI broadcast, over TCP or through a shared file (llmc/parallel/bootstrap.h); then all form one NCCL
// communicator. Every rank checks that all of them run the same configuration (check_same_config,
// llmc/parallel/comm.h).
//
// The backend (nccl_group): a collective on device buffers is queued on the communication stream, a
// second, high-priority stream, behind the work queued so far on the compute stream, and returns at
// once; comm_join makes the compute stream wait for the collectives so far. So during a step
// (train_gpt2.cu) the gradients of each layer are reduced as soon as the backward has finished that
// layer (llmc/parallel/grad_buckets.h says which slices, and to whom), overlapping the backward of the layers
// below. -z 0 all-reduces them; -z 1 reduces each piece to the rank whose shard holds it, that rank
// updates its shard of the fp32 master weights and AdamW moments, and the bf16 parameters are
// all-gathered.
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
#include "grad_buckets.h"
#include "watchdog.h"

// floatX (llmc/cuda_common.cuh) as llmc/parallel/comm.h names it
#if defined(ENABLE_FP32)
constexpr CommType COMM_FLOATX = COMM_FLOAT32;
#elif defined(ENABLE_FP16)
constexpr CommType COMM_FLOATX = COMM_FLOAT16;
#else
constexpr CommType COMM_FLOATX = COMM_BFLOAT16;
#endif

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
    // once training runs, the watchdog's limit (-wt) and its report (llmc/parallel/watchdog.h): under
    // MPI its thread asks the other processes what they wait for
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
                dp_abort(dp, "%s (another process has died or hangs, or is slower than -wt allows: raise -wt if a "
                         "checkpoint or a sample takes longer)", report.c_str());
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
inline DataParallel dp_init(const LaunchSettings& args, int* argc, char*** argv) {
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

// ----------------------------------------------------------------------------
// stream order: the communication stream starts after the compute stream's work so far, and the
// compute stream continues after every collective queued so far

inline void dp_after_compute(const DataParallel& dp, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(dp.compute_ready, compute));
    cudaCheck(cudaStreamWaitEvent(dp.stream, dp.compute_ready, 0));
}

inline void dp_join(const DataParallel& dp, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(dp.comm_done, dp.stream));
    cudaCheck(cudaStreamWaitEvent(compute, dp.comm_done, 0));
}

// ----------------------------------------------------------------------------
// The backend: llmc/parallel/comm.h's calls on device buffers

inline DataParallel& nccl_state(const ProcessGroup& g) { return *static_cast<DataParallel*>(g.state); }

inline ncclDataType_t nccl_type(CommType t) {
    switch (t) {
        case COMM_FLOAT64: return ncclFloat64;
        case COMM_BFLOAT16: return ncclBfloat16;
        case COMM_FLOAT16: return ncclFloat16;
        case COMM_UINT64: return ncclUint64;
        default: return ncclFloat32;
    }
}

// An NCCL call: inside a group it is only recorded (checked for errors); outside, it is settled.
#define ncclIssue(dp, call) ((dp).group_depth > 0 ? ncclQueued(dp, call) : ncclSettle(dp, call))

// Outside a group, each collective starts after the compute stream's work so far; a group starts once.
inline DataParallel& nccl_begin(const ProcessGroup& g) {
    DataParallel& dp = nccl_state(g);
    if (dp.group_depth == 0) dp_after_compute(dp, dp.compute);
    return dp;
}

// several calls recorded as one NCCL group, started after the compute stream's work so far
inline void nccl_group_start(const ProcessGroup& g) {
    DataParallel& dp = nccl_begin(g);
    dp.group_depth++;
    ncclQueued(dp, ncclGroupStart());
}

inline void nccl_group_end(const ProcessGroup& g) {
    DataParallel& dp = nccl_state(g);
    dp.group_depth--;
    ncclSettle(dp, ncclGroupEnd());
}

inline void nccl_all_reduce(const ProcessGroup& g, void* data, size_t n, CommType type, CommOp op) {
    DataParallel& dp = nccl_begin(g);
    ncclIssue(dp, ncclAllReduce(data, data, n, nccl_type(type), op == COMM_SUM ? ncclSum : ncclMax, dp.comm, dp.stream));
}

inline void nccl_reduce(const ProcessGroup& g, const void* send, void* recv, size_t n, CommType type, int root) {
    DataParallel& dp = nccl_begin(g);
    ncclIssue(dp, ncclReduce(send, recv, n, nccl_type(type), ncclSum, root, dp.comm, dp.stream));
}

inline void nccl_reduce_scatter(const ProcessGroup& g, void* data, size_t count, CommType type) {
    DataParallel& dp = nccl_begin(g);
    char* block = (char*)data + (size_t)dp.rank * count * comm_type_bytes(type);  // in place: NCCL's rule
    ncclIssue(dp, ncclReduceScatter(data, block, count, nccl_type(type), ncclSum, dp.comm, dp.stream));
}

inline void nccl_all_gather(const ProcessGroup& g, void* data, size_t count, CommType type) {
    DataParallel& dp = nccl_begin(g);
    char* block = (char*)data + (size_t)dp.rank * count * comm_type_bytes(type);
    ncclIssue(dp, ncclAllGather(block, data, count, nccl_type(type), dp.comm, dp.stream));
}

inline void nccl_broadcast(const ProcessGroup& g, void* data, size_t n, CommType type, int root) {
    DataParallel& dp = nccl_begin(g);
    ncclIssue(dp, ncclBroadcast(data, data, n, nccl_type(type), root, dp.comm, dp.stream));
}

// every part broadcast by its owner, as one group; stream-ordered, so the wait is a join
inline void nccl_all_gather_v_start(const ProcessGroup& g, void* full, const int* counts, const int* displs,
                                    CommType type, CommRequest* req) {
    DataParallel& dp = nccl_state(g);
    nccl_group_start(g);
    for (int r = 0; r < dp.size; r++) {
        char* part = (char*)full + (size_t)displs[r] * comm_type_bytes(type);
        ncclQueued(dp, ncclBroadcast(part, part, counts[r], nccl_type(type), r, dp.comm, dp.stream));
    }
    nccl_group_end(g);
    DataParallel* state = &dp;
    memcpy(req->handle, &state, sizeof(state));
}

inline void nccl_wait(CommRequest* req) {
    DataParallel* dp;
    memcpy(&dp, req->handle, sizeof(dp));
    dp_join(*dp, dp->compute);
}

// every part reduced to its owner, as one group (a root's recvbuff alone is written)
inline void nccl_reduce_scatter_v(const ProcessGroup& g, const void* full, void* mine, const int* counts, CommType type) {
    DataParallel& dp = nccl_state(g);
    nccl_group_start(g);
    size_t offset = 0;
    for (int r = 0; r < dp.size; r++) {
        const char* part = (const char*)full + offset * comm_type_bytes(type);
        void* out = r == dp.rank ? mine : (void*)part;
        ncclQueued(dp, ncclReduce(part, out, counts[r], nccl_type(type), ncclSum, r, dp.comm, dp.stream));
        offset += counts[r];
    }
    nccl_group_end(g);
}

// Every process's mine (n) to process 0's all (size * n), in rank order: NCCL has no gather, so it is
// its sends to process 0 and process 0's receives, in one group.
inline void nccl_gather(const ProcessGroup& g, const void* mine, size_t n, void* all, CommType type) {
    DataParallel& dp = nccl_state(g);
    const size_t bytes = n * comm_type_bytes(type);
    nccl_group_start(g);
    if (dp.rank == 0) {
        cudaCheck(cudaMemcpyAsync(all, mine, bytes, cudaMemcpyDeviceToDevice, dp.stream));
        for (int r = 1; r < dp.size; r++) {
            ncclQueued(dp, ncclRecv((char*)all + r * bytes, n, nccl_type(type), r, dp.comm, dp.stream));
        }
    } else {
        ncclQueued(dp, ncclSend(mine, n, nccl_type(type), 0, dp.comm, dp.stream));
    }
    nccl_group_end(g);
}

// Point to point, on the group's communication stream. NCCL matches a process's sends to a peer with
// that peer's receives in the order they were called, so the tag only documents the caller's intent.
// The host returns at once; the send holds the stream until the peer receives (so sends that cross
// go in one group with their receives), and the compute stream waits for a receive's data.
inline void nccl_send(const ProcessGroup& g, const void* data, size_t n, CommType type, int peer, int) {
    DataParallel& dp = nccl_begin(g);
    ncclIssue(dp, ncclSend(data, n, nccl_type(type), peer, dp.comm, dp.stream));
}

inline void nccl_recv(const ProcessGroup& g, void* data, size_t n, CommType type, int peer, int) {
    DataParallel& dp = nccl_begin(g);
    ncclIssue(dp, ncclRecv(data, n, nccl_type(type), peer, dp.comm, dp.stream));
    if (dp.group_depth == 0) dp_join(dp, dp.compute);
}

// the compute stream continues after the sends so far (their buffers may then be reused)
inline void nccl_finish_sends(const ProcessGroup& g) { dp_join(nccl_state(g), nccl_state(g).compute); }

// The processes of g with the same color, ordered by key: a communicator split from g's
// (ncclCommSplit, collective over g), with its own communication stream. Its collectives are ordered
// after the same compute stream. It lives until dp_finalize of the world.
inline ProcessGroup nccl_split(const ProcessGroup& g, int color, int key) {
    DataParallel& dp = nccl_state(g);
    DataParallel* sub = new DataParallel;
    sub->world = dp.world != nullptr ? dp.world : &dp;  // which keeps it (a split of a split too)
    sub->method = dp.method;
    sub->device = dp.device;
    sub->timeout_s = dp.timeout_s;
    sub->compute = dp.compute;
    sub->rank = dp.rank;
    sub->nccl = true;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommSplit(dp.comm, color, key, &sub->comm, &config);
    if (sub->comm != nullptr) dp_every_comm.push_back(sub->comm);
    dp_settle(*sub, r, "splitting the communicator (ncclCommSplit: every process of the group must call it)",
              __FILE__, __LINE__);
    ncclSettle(*sub, ncclCommCount(sub->comm, &sub->size));
    ncclSettle(*sub, ncclCommUserRank(sub->comm, &sub->rank));
    dp_make_stream(sub);
    sub->world->subgroups.push_back(sub);
    ProcessGroup part;
    part.rank = sub->rank;
    part.size = sub->size;
    part.backend = g.backend;
    part.state = sub;
    return part;
}

// A host value's sum: staged through pinned memory, waited for by the watchdog.
inline double nccl_sum_host(const ProcessGroup& g, double value, const char* what) {
    DataParallel& dp = nccl_state(g);
    memcpy(dp.host_scratch, &value, sizeof(double));
    cudaCheck(cudaMemcpyAsync(dp.device_scratch, dp.host_scratch, sizeof(double), cudaMemcpyHostToDevice, dp.stream));
    ncclSettle(dp, ncclAllReduce(dp.device_scratch, dp.device_scratch, 1, ncclFloat64, ncclSum, dp.comm, dp.stream));
    cudaCheck(cudaMemcpyAsync(dp.host_scratch, dp.device_scratch, sizeof(double), cudaMemcpyDeviceToHost, dp.stream));
    dp_wait(dp, dp.stream, what);
    memcpy(&value, dp.host_scratch, sizeof(double));
    return value;
}

inline void nccl_all_gather_host_u64(const ProcessGroup& g, uint64_t value, uint64_t* all, const char* what) {
    DataParallel& dp = nccl_state(g);
    dp.host_scratch[dp.rank] = value;
    cudaCheck(cudaMemcpyAsync(dp.device_scratch + dp.rank, dp.host_scratch + dp.rank, sizeof(uint64_t),
                              cudaMemcpyHostToDevice, dp.stream));
    ncclSettle(dp, ncclAllGather(dp.device_scratch + dp.rank, dp.device_scratch, 1, ncclUint64, dp.comm, dp.stream));
    cudaCheck(cudaMemcpyAsync(dp.host_scratch, dp.device_scratch, dp.size * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                              dp.stream));
    dp_wait(dp, dp.stream, what);
    memcpy(all, dp.host_scratch, dp.size * sizeof(uint64_t));
}

inline void nccl_barrier(const ProcessGroup& g, const char* what) { nccl_sum_host(g, 0.0, what); }

inline void nccl_join(const ProcessGroup& g) { dp_join(nccl_state(g), nccl_state(g).compute); }

// fence k is event k % COMM_FENCES of the group, recorded on its communication stream
inline uint64_t nccl_fence(const ProcessGroup& g) {
    DataParallel& dp = nccl_state(g);
    if (dp.fences.empty()) {
        dp.fences.resize(COMM_FENCES);
        for (cudaEvent_t& e : dp.fences) cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    uint64_t fence = dp.fences_recorded++;
    cudaCheck(cudaEventRecord(dp.fences[fence % COMM_FENCES], dp.stream));
    return fence;
}

inline void nccl_wait_fence(const ProcessGroup& g, uint64_t fence) {
    DataParallel& dp = nccl_state(g);
    if (fence + COMM_FENCES < dp.fences_recorded) {
        fatal("comm_wait_fence: fence %llu was overwritten (%llu recorded since; at most %llu may be outstanding)",
              (unsigned long long)fence, (unsigned long long)(dp.fences_recorded - fence), (unsigned long long)COMM_FENCES);
    }
    cudaCheck(cudaStreamWaitEvent(dp.compute, dp.fences[fence % COMM_FENCES], 0));
}

[[noreturn]] inline void nccl_abort(const ProcessGroup& g, const std::string& message) {
    dp_abort(nccl_state(g), "%s", message.c_str());
}

inline const CommBackend* nccl_backend() {
    static const CommBackend backend = {
        "NCCL",        nccl_all_reduce, nccl_reduce,    nccl_reduce_scatter, nccl_all_gather, nccl_all_gather_v_start,
        nccl_wait,     nccl_reduce_scatter_v, nccl_broadcast, nccl_gather, nccl_send, nccl_recv, nccl_finish_sends,
        nccl_sum_host, nccl_all_gather_host_u64, nccl_barrier, nccl_group_start, nccl_group_end, nccl_join, nccl_abort,
        nccl_split,    nccl_fence, nccl_wait_fence, true};
    return &backend;
}

// The run's processes as a group of llmc/parallel/comm.h (a group of one without a communicator), its
// collectives ordered after `compute`. dp must outlive the group.
inline ProcessGroup nccl_group(DataParallel* dp, cudaStream_t compute) {
    ProcessGroup g;
    g.rank = dp->rank;
    g.size = dp->size;
    dp->compute = compute;
    if (dp->nccl) {
        g.backend = nccl_backend();
        g.state = dp;
    }
    return g;
}

// Host vectors through device buffers, for the collectives that put a checkpoint together (NCCL moves
// device memory): copies on the compute stream, waited for before the host memory is reused; sync waits
// for the compute stream (after comm_join, for the collectives too).
inline CommStaging device_staging(cudaStream_t stream, std::function<void(const char*)> sync) {
    auto buffers = std::make_shared<std::vector<float*>>();
    CommStaging s;
    s.buffer = [stream, buffers](size_t n) {
        float* p = nullptr;
        cudaCheck(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)));
        cudaCheck(cudaMemsetAsync(p, 0, std::max<size_t>(n, 1) * sizeof(float), stream));
        buffers->push_back(p);
        return p;
    };
    s.put = [stream](float* buf, const float* host, size_t n) {
        cudaCheck(cudaMemcpyAsync(buf, host, n * sizeof(float), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaStreamSynchronize(stream));
    };
    s.get = [](float* host, const float* buf, size_t n) {
        cudaCheck(cudaMemcpy(host, buf, n * sizeof(float), cudaMemcpyDeviceToHost));
    };
    s.wait = sync;
    s.release = [buffers] {
        for (float* p : *buffers) cudaCheck(cudaFree(p));
        buffers->clear();
    };
    return s;
}
