// Emulated NCCL, internal: the communicator and the error bookkeeping shared by
// nccl_comm.cpp (forming, finalizing, destroying communicators) and nccl_collectives.cpp (the
// collectives and groups). Not part of the emulated API; only dev/emu/nccl*.cpp include it.
//
// Threads. The host thread calls the API; the collectives run later on the emulator's device thread
// (emu::enqueue). Both call MPI, at the same time: MPI must be initialized with MPI_THREAD_MULTIPLE
// (llmc/parallel/comm_mpi.h asks for it; ncclCommInitRank refuses a lower level). On one communicator the
// two threads never run MPI collectives at the same time: the host's (forming, finalizing) happen
// before the first and after the last queued collective, which is what the MPI standard asks
// (collectives on one MPI communicator start in the same order on every rank).
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <nccl.h>

#ifdef USE_MPI
#include <mpi.h>
#endif

struct ncclComm {
    int rank = 0;
    int nranks = 1;
    bool blocking = true;   // config.blocking != 0: calls wait for the other ranks
    bool local = true;      // one rank: no transport, collectives are local copies
#ifdef USE_MPI
    MPI_Comm mpi = MPI_COMM_NULL;        // duplicated from MPI_COMM_WORLD; rank r here is NCCL rank r
    MPI_Request forming = MPI_REQUEST_NULL;  // MPI_Comm_idup, then the exchange of the ids' digests
    MPI_Request finalizing = MPI_REQUEST_NULL;  // MPI_Ibarrier of ncclCommFinalize
    uint64_t id_digest = 0;
    std::vector<uint64_t> digests;       // every rank's id digest (the check that all got one id)
    int forming_stage = 0;               // 0: idup running, 1: digest exchange running, 2: formed
#endif
    std::mutex mutex;  // guards state, error and streams against the device thread
    // ncclInProgress while forming or finalizing; ncclSuccess when usable; otherwise the error that
    // broke it (set by the device thread when a collective fails)
    ncclResult_t state = ncclInProgress;
    std::string error;                   // why state is an error
    bool finalize_requested = false;
    bool finalized = false;
    std::atomic<bool> aborted{false};
    std::atomic<int> pending{0};         // collectives queued and not yet finished
    // The order of operations on the communicator, which must be the same on every rank (NCCL's rule;
    // MPI matches collectives and messages by order too): each operation gets the next number when
    // the host calls it, and the device starts its MPI calls only after those of every lower number
    // (its streams may run the operations in another order than they were called).
    uint64_t issued = 0;                 // host thread: operations numbered so far
    uint64_t started = 0;                // device thread: operations whose MPI calls are all posted
    std::vector<cudaStream_t> streams;   // every stream that got a collective, to drive them
};

namespace nccl_emu {

// Records `message` as the calling thread's last error (ncclGetLastError) and returns `result`.
ncclResult_t error(ncclResult_t result, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Marks `comm` broken by `result` (an asynchronous error, from any thread); the first error stays.
void set_comm_error(ncclComm* comm, ncclResult_t result, const std::string& message);

// How deep the calling thread is inside ncclGroupStart/ncclGroupEnd (0: outside).
int group_depth();

// The state a call on `comm` sees: ncclSuccess when collectives may be queued, else the reason
// (recorded as the last error).
ncclResult_t check_usable(ncclComm* comm, const char* call);

}  // namespace nccl_emu
