// Emulated NCCL: communicators (forming, finalizing, destroying, aborting), ids, versions, errors.
//
// A communicator of one rank is local: its collectives copy within the process and no MPI is needed
// (a process started alone, or with the trainer's -pi tcp / -pi file bootstraps and -pn 1). A
// communicator of N > 1 ranks is MPI_COMM_WORLD duplicated (MPI_Comm_idup), so it needs the N
// processes of one mpirun, with NCCL rank r = MPI rank r. Forming it also checks that every rank got
// the same ncclUniqueId (an all-gather of a digest of it): a rank given another id is refused, as
// NCCL would never connect it.
//
// ncclCommSplit forms a communicator of some ranks of another (MPI_Comm_split); it waits for them.
//
// Non-blocking communicators (config.blocking = 0): ncclCommInitRankConfig and ncclCommFinalize only
// start the MPI operations and return ncclInProgress; ncclCommGetAsyncError advances them (MPI_Test)
// and reports ncclInProgress, ncclSuccess, or the error. Blocking ones wait (MPI_Wait) inside the call.
#include <emu/device.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <unistd.h>

#include "nccl_comm.h"

namespace nccl_emu {

namespace {
thread_local std::string last_error;  // ncclGetLastError of this thread

std::string vformat(const char* fmt, va_list args) {
    char buffer[1024];
    vsnprintf(buffer, sizeof(buffer), fmt, args);
    return buffer;
}
}  // namespace

ncclResult_t error(ncclResult_t result, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    last_error = vformat(fmt, args);
    va_end(args);
    return result;
}

void set_comm_error(ncclComm* comm, ncclResult_t result, const std::string& message) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->state == ncclSuccess || comm->state == ncclInProgress) {
        comm->state = result;
        comm->error = message;
    }
}

ncclResult_t check_usable(ncclComm* comm, const char* call) {
    if (comm == nullptr) return error(ncclInvalidArgument, "%s: comm is NULL", call);
    if (comm->aborted) return error(ncclInvalidUsage, "%s: the communicator was aborted (ncclCommAbort)", call);
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->finalize_requested) {
        return error(ncclInvalidUsage, "%s: the communicator is finalized (ncclCommFinalize)", call);
    }
    if (comm->state == ncclInProgress) {
        return error(ncclInvalidUsage, "%s: the non-blocking communicator is still forming; wait until "
                     "ncclCommGetAsyncError gives ncclSuccess", call);
    }
    if (comm->state != ncclSuccess) return error(comm->state, "%s", comm->error.c_str());
    return ncclSuccess;
}

}  // namespace nccl_emu

using nccl_emu::error;

namespace {

#ifdef USE_MPI
std::string mpi_error_text(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
    return std::string(text, length);
}

// Advances the forming of an MPI communicator: the MPI_Comm_idup, then the all-gather of the id
// digests. With `wait` it blocks until done. Called with comm->mutex held; returns the new state.
ncclResult_t progress_forming(ncclComm* comm, bool wait) {
    while (comm->state == ncclInProgress && comm->forming_stage < 2) {
        int done = 0;
        int rc = wait ? MPI_Wait(&comm->forming, MPI_STATUS_IGNORE) : MPI_Test(&comm->forming, &done, MPI_STATUS_IGNORE);
        if (wait) done = 1;
        const char* stage = comm->forming_stage == 0 ? "MPI_Comm_idup of MPI_COMM_WORLD" : "the exchange of the ids";
        if (rc != MPI_SUCCESS) {
            comm->state = ncclRemoteError;
            comm->error = std::string("forming the communicator: ") + stage + " failed: " + mpi_error_text(rc);
            break;
        }
        if (!done) break;
        if (comm->forming_stage == 0) {
            // a failing collective returns its error to us (the task records it) instead of ending MPI
            MPI_Comm_set_errhandler(comm->mpi, MPI_ERRORS_RETURN);
            comm->digests.assign(comm->nranks, 0);
            rc = MPI_Iallgather(&comm->id_digest, 1, MPI_UINT64_T, comm->digests.data(), 1, MPI_UINT64_T, comm->mpi,
                                &comm->forming);
            if (rc != MPI_SUCCESS) {
                comm->state = ncclRemoteError;
                comm->error = "forming the communicator: MPI_Iallgather failed: " + mpi_error_text(rc);
                break;
            }
            comm->forming_stage = 1;
        } else {
            comm->forming_stage = 2;
            comm->state = ncclSuccess;
            for (int r = 1; r < comm->nranks; r++) {
                if (comm->digests[r] != comm->digests[0]) {
                    comm->state = ncclInvalidUsage;
                    comm->error = "forming the communicator: rank " + std::to_string(r) +
                                  " was given another ncclUniqueId than rank 0 (every rank must get the id rank 0 made)";
                    break;
                }
            }
        }
    }
    return comm->state;
}
#endif

uint64_t digest(const ncclUniqueId& id) {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) hash = (hash ^ (unsigned char)id.internal[i]) * 1099511628211ull;
    return hash;
}

// Runs the streams that hold collectives of `comm` (streams are lazy: they run when queried or
// synchronized), then, once none is left, finishes with a barrier so that every rank's last
// collective is done. With `wait` it blocks. Returns the state.
ncclResult_t progress_finalize(ncclComm* comm, bool wait) {
    if (comm->pending > 0) {
        std::vector<cudaStream_t> streams;
        {
            std::lock_guard<std::mutex> lock(comm->mutex);
            streams = comm->streams;
        }
        // without the lock: a stream may run a collective of this communicator on this thread
        for (cudaStream_t stream : streams) wait ? (void)cudaStreamSynchronize(stream) : (void)cudaStreamQuery(stream);
        if (comm->pending > 0) {
            if (wait) {
                nccl_emu::set_comm_error(comm, ncclInternalError, "ncclCommFinalize: " + std::to_string(comm->pending) +
                                         " queued collective(s) never ran (was their stream destroyed?)");
            } else {
                return ncclInProgress;
            }
        }
    }
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->state != ncclInProgress || comm->finalized) return comm->state;
#ifdef USE_MPI
    if (!comm->local) {
        int rc = MPI_SUCCESS, done = 0;
        if (comm->finalizing == MPI_REQUEST_NULL) rc = MPI_Ibarrier(comm->mpi, &comm->finalizing);
        if (rc == MPI_SUCCESS) {
            rc = wait ? MPI_Wait(&comm->finalizing, MPI_STATUS_IGNORE) : MPI_Test(&comm->finalizing, &done, MPI_STATUS_IGNORE);
            if (wait) done = 1;
        }
        if (rc != MPI_SUCCESS) {
            comm->state = ncclRemoteError;
            comm->error = "ncclCommFinalize: the closing barrier failed: " + mpi_error_text(rc);
            return comm->state;
        }
        if (!done) return ncclInProgress;
    }
#endif
    comm->finalized = true;
    comm->state = ncclSuccess;
    return comm->state;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
    const char* call = "ncclCommInitRank";
    if (out == nullptr) return error(ncclInvalidArgument, "%s: comm is NULL", call);
    *out = nullptr;
    if (nccl_emu::group_depth() > 0) {
        emu::fail("%s inside ncclGroupStart/ncclGroupEnd is not emulated (form communicators outside groups)", call);
    }
    if (nranks < 1) return error(ncclInvalidArgument, "%s: nranks = %d, must be at least 1", call, nranks);
    if (rank < 0 || rank >= nranks) {
        return error(ncclInvalidArgument, "%s: rank = %d, must be in [0, %d)", call, rank, nranks);
    }
    if (nranks == 1) {
        ncclComm* comm = new ncclComm;
        comm->blocking = blocking;
        comm->state = ncclSuccess;
        *out = comm;
        return ncclSuccess;
    }
#ifndef USE_MPI
    return error(ncclInvalidUsage, "%s with %d ranks: the NCCL emulation runs over MPI, and this build has no MPI "
                 "(build with mpicxx and USE_MPI, then start the processes with mpirun)", call, nranks);
#else
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) {
        return error(ncclInvalidUsage, "%s with %d ranks: the NCCL emulation runs over MPI: start the processes with "
                     "mpirun (MPI is not initialized in this process)", call, nranks);
    }
    int level = MPI_THREAD_SINGLE, world_size = 0, world_rank = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        return error(ncclInvalidUsage, "%s: MPI was initialized with thread level %d, below MPI_THREAD_MULTIPLE (%d): "
                     "the NCCL emulation calls MPI from the emulated device thread while the host thread may call "
                     "it too (call MPI_Init_thread with MPI_THREAD_MULTIPLE)", call, level, MPI_THREAD_MULTIPLE);
    }
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (nranks != world_size) {
        return error(ncclInvalidUsage, "%s: nranks = %d but mpirun started %d process(es); the NCCL emulation forms "
                     "communicators over all of MPI_COMM_WORLD", call, nranks, world_size);
    }
    if (rank != world_rank) {
        return error(ncclInvalidUsage, "%s: rank = %d but this is MPI rank %d; the NCCL emulation needs NCCL rank = "
                     "MPI rank", call, rank, world_rank);
    }
    ncclComm* comm = new ncclComm;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->blocking = blocking;
    comm->local = false;
    comm->id_digest = digest(id);
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm->mpi, &comm->forming);
    if (rc != MPI_SUCCESS) {
        delete comm;
        return error(ncclRemoteError, "%s: MPI_Comm_idup failed: %s", call, mpi_error_text(rc).c_str());
    }
    *out = comm;
    std::lock_guard<std::mutex> lock(comm->mutex);
    ncclResult_t state = progress_forming(comm, blocking);
    if (state != ncclSuccess && state != ncclInProgress) return error(state, "%s", comm->error.c_str());
    return state;
#endif
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (version == nullptr) return error(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

// The id only has to be the same on every rank of one communicator and differ between
// communicators: a tag, then random bytes.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (id == nullptr) return error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, "emu-nccl", 8);
    std::random_device device;
    std::seed_seq seed{device(), device(), (unsigned)getpid(),
                       (unsigned)std::chrono::steady_clock::now().time_since_epoch().count()};
    std::mt19937_64 rng(seed);
    for (int i = 8; i + 8 <= NCCL_UNIQUE_ID_BYTES; i += 8) {
        uint64_t word = rng();
        memcpy(id->internal + i, &word, 8);
    }
    return ncclSuccess;
}

// The texts of NCCL's own ncclGetErrorString.
const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

// The communicator's asynchronous error when it has one (a collective failed on the device thread),
// else the last error of the calling thread.
const char* ncclGetLastError(ncclComm_t comm) {
    thread_local std::string copy;
    if (comm != nullptr) {
        std::lock_guard<std::mutex> lock(comm->mutex);
        if (comm->state != ncclSuccess && comm->state != ncclInProgress && !comm->error.empty()) {
            copy = comm->error;
            return copy.c_str();
        }
    }
    return nccl_emu::last_error.c_str();
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
    bool blocking = true;
    if (config != nullptr) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
            return error(ncclInvalidArgument, "ncclCommInitRankConfig: config was not set from NCCL_CONFIG_INITIALIZER");
        }
        blocking = config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT: the default, blocking
    }
    return init_rank(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    return init_rank(comm, nranks, id, rank, true);
}

// One process, `ndev` devices: the emulator has one, so one local communicator.
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
    if (comms == nullptr) return error(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
    if (ndev < 1) return error(ncclInvalidArgument, "ncclCommInitAll: ndev = %d, must be at least 1", ndev);
    if (ndev > 1) {
        emu::fail("ncclCommInitAll over %d devices: the emulator has one device per process (run one process per "
                  "rank under mpirun with ncclCommInitRank)", ndev);
    }
    if (devlist != nullptr && devlist[0] != 0) {
        return error(ncclInvalidArgument, "ncclCommInitAll: device %d does not exist (the emulator has device 0)",
                     devlist[0]);
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    return init_rank(&comms[0], 1, id, 0, true);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
    if (comm == nullptr || async_error == nullptr) {
        return error(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    }
    bool finalizing = false;
    {
        std::lock_guard<std::mutex> lock(comm->mutex);
#ifdef USE_MPI
        if (comm->state == ncclInProgress && !comm->local && comm->forming_stage < 2) progress_forming(comm, false);
#endif
        finalizing = comm->state == ncclInProgress && comm->finalize_requested;
        *async_error = comm->state;
    }
    if (finalizing && !comm->aborted) *async_error = progress_finalize(comm, false);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    ncclResult_t usable = nccl_emu::check_usable(comm, "ncclCommFinalize");
    if (usable != ncclSuccess) return usable;
    {
        std::lock_guard<std::mutex> lock(comm->mutex);
        comm->finalize_requested = true;
        comm->state = ncclInProgress;
    }
    ncclResult_t state = progress_finalize(comm, comm->blocking);
    if (state != ncclSuccess && state != ncclInProgress) return error(state, "%s", comm->error.c_str());
    return state;
}

// Waits for the collectives still queued (they use the communicator), then frees it. The MPI
// communicator is freed only when nothing of it is outstanding; otherwise it is left to MPI_Finalize.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == nullptr) return error(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    if (comm->aborted) return ncclSuccess;  // ncclCommAbort has given it up already
    if (comm->pending > 0) {
        std::vector<cudaStream_t> streams;
        {
            std::lock_guard<std::mutex> lock(comm->mutex);
            streams = comm->streams;
        }
        for (cudaStream_t stream : streams) (void)cudaStreamSynchronize(stream);
        if (comm->pending > 0) return ncclSuccess;  // a task still refers to it: leave it allocated
    }
#ifdef USE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    bool idle = comm->forming == MPI_REQUEST_NULL && comm->finalizing == MPI_REQUEST_NULL;
    if (comm->mpi != MPI_COMM_NULL && !finalized && idle) MPI_Comm_free(&comm->mpi);
    if (!idle) return ncclSuccess;  // MPI still owns memory of it (the request's buffers)
#endif
    delete comm;
    return ncclSuccess;
}

// Returns at once, whatever the communicator is doing: a collective stuck in MPI on the device
// thread cannot be interrupted, so the communicator is only marked aborted (queued collectives are
// skipped, calls refused) and left allocated; the caller is expected to exit (real NCCL makes its
// kernels quit; here the process's exit ends MPI, and mpirun ends the other ranks).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == nullptr) return ncclSuccess;
    comm->aborted = true;
    return ncclSuccess;
}

// The ranks of comm with the same color form a new communicator, ordered by key (ties by their rank in
// comm), over an MPI_Comm_split of comm's MPI communicator. The host calls MPI here, so the
// operations already queued on comm run first (the device's MPI calls on that communicator must not
// overlap the host's); then every rank of comm must call it, and it waits for them.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    const char* call = "ncclCommSplit";
    if (newcomm == nullptr) return error(ncclInvalidArgument, "%s: newcomm is NULL", call);
    *newcomm = nullptr;
    ncclResult_t usable = nccl_emu::check_usable(comm, call);
    if (usable != ncclSuccess) return usable;
    if (nccl_emu::group_depth() > 0) {
        emu::fail("%s inside ncclGroupStart/ncclGroupEnd is not emulated (split communicators outside groups)", call);
    }
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
        return error(ncclInvalidArgument, "%s: color = %d, must be at least 0 or NCCL_SPLIT_NOCOLOR", call, color);
    }
    bool blocking = comm->blocking;
    if (config != nullptr) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)) {
            return error(ncclInvalidArgument, "%s: config was not set from NCCL_CONFIG_INITIALIZER", call);
        }
        blocking = config->blocking != 0;
    }
    if (comm->pending > 0) {
        std::vector<cudaStream_t> streams;
        {
            std::lock_guard<std::mutex> lock(comm->mutex);
            streams = comm->streams;
        }
        for (cudaStream_t stream : streams) (void)cudaStreamSynchronize(stream);
        if (comm->pending > 0) {
            return error(ncclInternalError, "%s: %d operation(s) queued on the communicator never ran (was their "
                         "stream destroyed?)", call, comm->pending.load());
        }
    }
    int rank = 0, nranks = 1;
#ifdef USE_MPI
    MPI_Comm mpi = MPI_COMM_NULL;
    if (!comm->local) {
        int rc = MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &mpi);
        if (rc != MPI_SUCCESS) return error(ncclRemoteError, "%s: MPI_Comm_split failed: %s", call, mpi_error_text(rc).c_str());
        if (mpi != MPI_COMM_NULL) {
            MPI_Comm_rank(mpi, &rank);
            MPI_Comm_size(mpi, &nranks);
        }
    }
#endif
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    ncclComm* child = new ncclComm;
    child->rank = rank;
    child->nranks = nranks;
    child->blocking = blocking;
    child->state = ncclSuccess;
#ifdef USE_MPI
    child->forming_stage = 2;
    if (nranks > 1) {
        child->local = false;
        child->mpi = mpi;
        MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);  // a failing MPI call is the communicator's error
    } else if (mpi != MPI_COMM_NULL) {
        MPI_Comm_free(&mpi);  // a communicator of one rank copies locally
    }
#endif
    *newcomm = child;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (comm == nullptr || count == nullptr) return error(ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (comm == nullptr || rank == nullptr) return error(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->rank;
    return ncclSuccess;
}

}  // extern "C"
