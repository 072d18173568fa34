// The MPI backend of llmc/parallel/comm.h: the processes of a CPU run and the collectives between them, on host
// buffers.
//
// Built with USE_MPI (the Makefile defines it when mpicxx is found) and launched with
// `mpirun -np N ./train_gpt2 ...`, the processes form one world group; the layout splits it into its
// sub-groups (llmc/parallel/layout.h). Built without MPI, or run without mpirun, there is one process
// and every collective is the identity. MPI's reduction order is fixed for a given process count, so
// runs are reproducible.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../utils.h"
#include "comm.h"
#include "watchdog.h"

// The number of processes a parallel launcher says it started, from the environment it gives each of
// them: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), MPICH/Intel MPI's Hydra and Slurm's PMI (PMI_SIZE),
// Slurm's srun (SLURM_STEP_NUM_TASKS, set for job steps, not for the batch script itself); 1 if none.
inline int launcher_process_count() {
    const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    int count = 1;
    for (const char* var : vars) {
        const char* value = getenv(var);
        if (value != nullptr && atoi(value) > count) count = atoi(value);
    }
    return count;
}

#ifdef USE_MPI
#include <mpi.h>

inline void mpi_check(int rc, const char* file, int line) {
    if (rc != MPI_SUCCESS) {
        char message[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(rc, message, &length);
        fprintf(stderr, "Error: MPI call failed: %s  [%s:%d]\n", message, file, line);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}
#define mpiCheck(call) mpi_check((call), __FILE__, __LINE__)

// A group's MPI side: its communicator, and the copies of the point-to-point sends not yet finished.
struct MpiGroup {
    MPI_Comm comm = MPI_COMM_WORLD;
    std::vector<int> world_ranks;  // its processes' ranks in MPI_COMM_WORLD (the watchdog's report)
    std::vector<std::vector<char>> send_buffers;
    std::vector<MPI_Request> send_requests;
};

inline MpiGroup* mpi_group(const ProcessGroup& g) { return static_cast<MpiGroup*>(g.state); }
inline MPI_Comm mpi_comm(const ProcessGroup& g) { return mpi_group(g)->comm; }

// Every call below that waits for other processes is watched (llmc/parallel/watchdog.h) under `what`.
struct MpiWait : WatchdogWait {
    MpiWait(const ProcessGroup& g, const char* what) : WatchdogWait(what, g.name, &mpi_group(g)->world_ranks) {}
};

inline MPI_Datatype mpi_type(CommType t) {
    switch (t) {
        case COMM_FLOAT32: return MPI_FLOAT;
        case COMM_FLOAT64: return MPI_DOUBLE;
        case COMM_UINT64: return MPI_UINT64_T;
        default: return MPI_UINT16_T;  // bf16, fp16: moved as bits, never summed here
    }
}

inline MPI_Datatype mpi_sum_type(CommType t, const char* what) {
    if (t == COMM_BFLOAT16 || t == COMM_FLOAT16) fatal("MPI backend: %s of 16-bit floats is not supported", what);
    return mpi_type(t);
}

// Collectives on parameters and gradients go in pieces of at most COLLECTIVE_PIECE elements per
// process: MPI libraries allocate temporaries the size of a message, which would otherwise add up to
// another copy of the model in each process's memory (the ZeRO stages are about that memory).
constexpr size_t COLLECTIVE_PIECE = (size_t)1 << 20;

inline void mpi_all_reduce(const ProcessGroup& g, void* data, size_t n, CommType type, CommOp op) {
    MpiWait wait(g, "an all-reduce");
    MPI_Datatype t = mpi_sum_type(type, "an all-reduce");
    size_t bytes = comm_type_bytes(type);
    for (size_t off = 0; off < n; off += COLLECTIVE_PIECE) {
        int c = (int)std::min(COLLECTIVE_PIECE, n - off);
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, (char*)data + off * bytes, c, t, op == COMM_SUM ? MPI_SUM : MPI_MAX,
                               mpi_comm(g)));
    }
}

inline void mpi_reduce(const ProcessGroup& g, const void* send, void* recv, size_t n, CommType type, int root) {
    MpiWait wait(g, "a reduce");
    MPI_Datatype t = mpi_sum_type(type, "a reduce");
    const void* from = g.rank == root && send == recv ? MPI_IN_PLACE : send;
    mpiCheck(MPI_Reduce(from, g.rank == root ? recv : nullptr, (int)n, t, MPI_SUM, root, mpi_comm(g)));
}

// piece by piece: the piece of every block packed together, reduce-scattered
inline void mpi_reduce_scatter(const ProcessGroup& g, void* data, size_t count, CommType type) {
    MpiWait wait(g, "a reduce-scatter");
    MPI_Datatype t = mpi_sum_type(type, "a reduce-scatter");
    size_t bytes = comm_type_bytes(type);
    char* d = (char*)data;
    size_t piece = std::min(COLLECTIVE_PIECE, count);
    std::vector<char> send(piece * g.size * bytes), mine(piece * bytes);
    for (size_t off = 0; off < count; off += piece) {
        size_t c = std::min(piece, count - off);
        for (int r = 0; r < g.size; r++) memcpy(send.data() + r * c * bytes, d + (r * count + off) * bytes, c * bytes);
        mpiCheck(MPI_Reduce_scatter_block(send.data(), mine.data(), (int)c, t, MPI_SUM, mpi_comm(g)));
        memcpy(d + ((size_t)g.rank * count + off) * bytes, mine.data(), c * bytes);
    }
}

// piece by piece, each process's piece gathered into one buffer and spread out
inline void mpi_all_gather(const ProcessGroup& g, void* data, size_t count, CommType type) {
    MpiWait wait(g, "an all-gather");
    size_t bytes = comm_type_bytes(type);
    char* d = (char*)data;
    size_t piece = std::min(COLLECTIVE_PIECE, count);
    std::vector<char> all(piece * g.size * bytes);
    for (size_t off = 0; off < count; off += piece) {
        size_t c = std::min(piece, count - off);
        mpiCheck(MPI_Allgather(d + ((size_t)g.rank * count + off) * bytes, (int)c, mpi_type(type), all.data(), (int)c,
                               mpi_type(type), mpi_comm(g)));
        for (int r = 0; r < g.size; r++) memcpy(d + (r * count + off) * bytes, all.data() + r * c * bytes, c * bytes);
    }
}

inline void mpi_all_gather_v_start(const ProcessGroup& g, void* full, const int* counts, const int* displs,
                                   CommType type, CommRequest* req) {
    static_assert(sizeof(MPI_Request) <= sizeof(req->handle), "CommRequest::handle holds an MPI_Request");
    MPI_Request request;
    mpiCheck(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full, counts, displs, mpi_type(type), mpi_comm(g),
                             &request));
    memcpy(req->handle, &request, sizeof(request));
}

inline void mpi_wait(CommRequest* req) {
    WatchdogWait wait("the end of an all-gather (started earlier)", "its group");
    MPI_Request request;
    memcpy(&request, req->handle, sizeof(request));
    if (request != MPI_REQUEST_NULL) mpiCheck(MPI_Wait(&request, MPI_STATUS_IGNORE));
}

inline void mpi_reduce_scatter_v(const ProcessGroup& g, const void* full, void* mine, const int* counts, CommType type) {
    MpiWait wait(g, "a reduce-scatter");
    mpiCheck(MPI_Reduce_scatter(full, mine, counts, mpi_sum_type(type, "a reduce-scatter"), MPI_SUM, mpi_comm(g)));
}

inline void mpi_broadcast(const ProcessGroup& g, void* data, size_t n, CommType type, int root) {
    MpiWait wait(g, "a broadcast");
    mpiCheck(MPI_Bcast(data, (int)n, mpi_type(type), root, mpi_comm(g)));
}

inline void mpi_gather(const ProcessGroup& g, const void* mine, size_t n, void* all, CommType type) {
    MpiWait wait(g, "a gather");
    mpiCheck(MPI_Gather(mine, (int)n, mpi_type(type), all, (int)n, mpi_type(type), 0, mpi_comm(g)));
}

inline void mpi_all_to_all(const ProcessGroup& g, const void* send, void* recv, size_t count, CommType type) {
    MpiWait wait(g, "an all-to-all");
    if (count > (size_t)INT_MAX) fatal("all-to-all of %zu elements a block: more than MPI's int count", count);
    mpiCheck(MPI_Alltoall(send, (int)count, mpi_type(type), recv, (int)count, mpi_type(type), mpi_comm(g)));
}

// Sends are nonblocking from a copy, so no schedule can deadlock on two processes sending to each other.
inline void mpi_send(const ProcessGroup& g, const void* data, size_t n, CommType type, int peer, int tag) {
    MpiGroup* m = mpi_group(g);
    const char* bytes = (const char*)data;
    m->send_buffers.emplace_back(bytes, bytes + n * comm_type_bytes(type));
    m->send_requests.emplace_back();
    mpiCheck(MPI_Isend(m->send_buffers.back().data(), (int)n, mpi_type(type), peer, tag, m->comm,
                       &m->send_requests.back()));
}

inline void mpi_recv(const ProcessGroup& g, void* data, size_t n, CommType type, int peer, int tag) {
    MpiWait wait(g, "a receive");
    mpiCheck(MPI_Recv(data, (int)n, mpi_type(type), peer, tag, mpi_comm(g), MPI_STATUS_IGNORE));
}

inline void mpi_finish_sends(const ProcessGroup& g) {
    MpiGroup* m = mpi_group(g);
    MpiWait wait(g, "the end of this process's sends");
    if (!m->send_requests.empty()) {
        mpiCheck(MPI_Waitall((int)m->send_requests.size(), m->send_requests.data(), MPI_STATUSES_IGNORE));
    }
    m->send_requests.clear();
    m->send_buffers.clear();
}

inline double mpi_sum_host(const ProcessGroup& g, double value, const char* what) {
    MpiWait wait(g, what);
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, mpi_comm(g)));
    return value;
}

inline void mpi_all_gather_host_u64(const ProcessGroup& g, uint64_t value, uint64_t* all, const char* what) {
    MpiWait wait(g, what);
    mpiCheck(MPI_Allgather(&value, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, mpi_comm(g)));
}

inline void mpi_barrier(const ProcessGroup& g, const char* what) {
    MpiWait wait(g, what);
    mpiCheck(MPI_Barrier(mpi_comm(g)));
}

inline void mpi_nothing(const ProcessGroup&) {}

[[noreturn]] inline void mpi_abort(const ProcessGroup&, const std::string& message) {
    fflush(stdout);
    error_print("%s", message.c_str());
    remove_files_on_error();  // this process's half-written files (llmc/utils.h)
    MPI_Abort(MPI_COMM_WORLD, 1);  // the whole run, not only this group
    exit(EXIT_FAILURE);
}

inline ProcessGroup mpi_split(const ProcessGroup& parent, int color, int key);

// every call has finished when it returns: no fence to wait for
inline uint64_t mpi_fence(const ProcessGroup&) { return 0; }
inline void mpi_wait_fence(const ProcessGroup&, uint64_t) {}

inline const CommBackend* mpi_backend() {
    static const CommBackend backend = {
        "MPI",           mpi_all_reduce, mpi_reduce,       mpi_reduce_scatter, mpi_all_gather, mpi_all_gather_v_start,
        mpi_wait,        mpi_reduce_scatter_v, mpi_broadcast, mpi_gather, mpi_all_to_all, mpi_send, mpi_recv, mpi_finish_sends,
        mpi_sum_host,    mpi_all_gather_host_u64, mpi_barrier, mpi_nothing, mpi_nothing, mpi_nothing, mpi_abort,
        mpi_split,       mpi_fence, mpi_wait_fence, false};
    return &backend;
}

// A group over `comm` (its state lives as long as the run: groups are few and made at start-up).
inline ProcessGroup mpi_process_group(MPI_Comm comm) {
    ProcessGroup g;
    mpiCheck(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    mpiCheck(MPI_Comm_rank(comm, &g.rank));
    mpiCheck(MPI_Comm_size(comm, &g.size));
    MpiGroup* state = new MpiGroup;
    state->comm = comm;
    MPI_Group group, world;
    mpiCheck(MPI_Comm_group(comm, &group));
    mpiCheck(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> ranks(g.size);
    for (int r = 0; r < g.size; r++) ranks[r] = r;
    state->world_ranks.resize(g.size);
    mpiCheck(MPI_Group_translate_ranks(group, g.size, ranks.data(), world, state->world_ranks.data()));
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    g.state = state;
    g.backend = mpi_backend();
    return g;
}

inline ProcessGroup mpi_split(const ProcessGroup& parent, int color, int key) {
    MPI_Comm sub;
    mpiCheck(MPI_Comm_split(mpi_comm(parent), color, key, &sub));
    return mpi_process_group(sub);
}
#endif  // USE_MPI

// The world: every process of the run (one without MPI).
inline ProcessGroup process_group_init(int* argc, char*** argv) {
#ifndef USE_MPI
    (void)argc, (void)argv;
    // Built without MPI, each of N launched copies would think it is alone: N full runs writing the
    // same files. Refuse instead of training N times.
    int launched = launcher_process_count();
    if (launched > 1) {
        fatal("started as one of %d processes by mpirun/srun, but this binary was built without MPI, so each "
              "process would train alone and all would write the same files. Rebuild with MPI: install Open MPI "
              "(scripts/install_deps.sh, or apt-get install libopenmpi-dev openmpi-bin) so that mpicxx is on PATH, "
              "then `make train_gpt2` (the Makefile notices the change and rebuilds); or run one process", launched);
    }
    return ProcessGroup();
#else
    // The trainers call MPI from the main thread only (FUNNELED would do), but the CUDA emulator
    // (dev/emu) runs NCCL over MPI on its device thread while the main thread may call MPI too, so
    // ask for MPI_THREAD_MULTIPLE; the emulation refuses a lower level when it forms a communicator.
    int provided;
    mpiCheck(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    // errors are returned to us (and reported by mpiCheck) instead of aborting inside MPI silently
    ProcessGroup world = mpi_process_group(MPI_COMM_WORLD);
    fatal_set_process(world.rank, world.size);  // each error says which process it comes from
    watchdog_start();  // its thread, idle until the run loop sets -wt (llmc/parallel/watchdog.h)
    return world;
#endif
}

inline void process_group_finalize(const ProcessGroup& world) {
    (void)world;
#ifdef USE_MPI
    watchdog_stop();
    mpiCheck(MPI_Finalize());
#endif
}
