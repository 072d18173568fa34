// The processes of a data-parallel CPU run, and the collectives the trainer needs, over MPI.
//
// Built with USE_MPI (the Makefile defines it when mpicxx is found) and launched with
// `mpirun -np N ./train_gpt2 ...`, every process trains on its own samples and the gradients are
// combined with these calls. Built without MPI, or run without mpirun, there is one process and every
// collective is the identity. Sums are done by MPI in float32 (like NCCL on the GPU path); MPI's
// reduction order is fixed for a given process count, so runs are reproducible.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "utils.h"

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
#endif

// A set of processes and this process's place in it: all of them (the world), or one dimension of a
// parallel layout (llmc/parallel_layout.h: the processes sharing a tensor-, pipeline- or data-parallel
// group). Every collective below runs over pg's communicator, never over MPI_COMM_WORLD directly.
struct ProcessGroup {
    int rank = 0;
    int size = 1;
#ifdef USE_MPI
    MPI_Comm comm = MPI_COMM_WORLD;
#endif
};

// Bytes this process has sent plus received in the collectives on parameters and gradients (the few
// bytes of scalar sums left out), counted as a ring algorithm moves them: in a gather or a
// reduce-scatter every process sends and receives every block but its own; an all-reduce is a
// reduce-scatter followed by an all-gather. The trainer logs the growth per step (metrics.jsonl).
inline uint64_t comm_bytes_moved = 0;

inline void comm_count(const ProcessGroup& pg, size_t total_elements, size_t my_elements, size_t element_bytes) {
    if (pg.size > 1) comm_bytes_moved += 2 * (uint64_t)(total_elements - my_elements) * element_bytes;
}

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

inline ProcessGroup process_group_init(int* argc, char*** argv) {
    ProcessGroup pg;
#ifndef USE_MPI
    // Built without MPI, each of N launched copies would think it is alone: N full runs writing the
    // same files. Refuse instead of training N times.
    int launched = launcher_process_count();
    if (launched > 1) {
        fatal("started as one of %d processes by mpirun/srun, but this binary was built without MPI, so each "
              "process would train alone and all would write the same files. Rebuild with MPI: install Open MPI "
              "(scripts/install_deps.sh, or apt-get install libopenmpi-dev openmpi-bin) so that mpicxx is on PATH, "
              "then `make train_gpt2` (the Makefile notices the change and rebuilds); or run one process", launched);
    }
#else
    // The trainers call MPI from the main thread only (FUNNELED would do), but the CUDA emulator
    // (dev/emu) runs NCCL over MPI on its device thread while the main thread may call MPI too, so
    // ask for MPI_THREAD_MULTIPLE; the emulation refuses a lower level when it forms a communicator.
    int provided;
    mpiCheck(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    // errors are returned to us (and reported by mpiCheck) instead of aborting inside MPI silently
    mpiCheck(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &pg.rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &pg.size));
#endif
    return pg;
}

// The processes of `parent` with the same color, ordered by key: one sub-group per color (MPI_Comm_split).
// Every process of parent must call it. Without MPI (one process) the sub-group is that process alone.
inline ProcessGroup process_group_split(const ProcessGroup& parent, int color, int key) {
    ProcessGroup sub;
#ifdef USE_MPI
    if (parent.size > 1) {
        mpiCheck(MPI_Comm_split(parent.comm, color, key, &sub.comm));
        mpiCheck(MPI_Comm_set_errhandler(sub.comm, MPI_ERRORS_RETURN));
        mpiCheck(MPI_Comm_rank(sub.comm, &sub.rank));
        mpiCheck(MPI_Comm_size(sub.comm, &sub.size));
    }
#else
    (void)parent, (void)color, (void)key;
#endif
    return sub;
}

inline void process_group_finalize(const ProcessGroup& pg) {
#ifdef USE_MPI
    mpiCheck(MPI_Finalize());
#endif
}

// Collectives on parameters and gradients go in pieces of at most COLLECTIVE_PIECE elements per
// process: MPI libraries allocate temporaries the size of a message, which would otherwise add up to
// another copy of the model in each process's memory (the ZeRO stages are about that memory).
constexpr size_t COLLECTIVE_PIECE = (size_t)1 << 20;

// In-place sum across processes of data[n].
inline void all_reduce_sum(const ProcessGroup& pg, float* data, size_t n) {
    comm_count(pg, n, n / pg.size, 2 * sizeof(float));
#ifdef USE_MPI
    for (size_t off = 0; pg.size > 1 && off < n; off += COLLECTIVE_PIECE) {
        int c = (int)std::min(COLLECTIVE_PIECE, n - off);
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, data + off, c, MPI_FLOAT, MPI_SUM, pg.comm));
    }
#endif
}

inline double all_reduce_sum(const ProcessGroup& pg, double value) {
#ifdef USE_MPI
    if (pg.size > 1) mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, pg.comm));
#endif
    return value;
}

inline void all_reduce_sum(const ProcessGroup& pg, double* data, size_t n) {
#ifdef USE_MPI
    if (pg.size > 1) mpiCheck(MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_DOUBLE, MPI_SUM, pg.comm));
#endif
}

// In-place element-wise maximum across processes of data[n].
inline void all_reduce_max(const ProcessGroup& pg, float* data, size_t n) {
#ifdef USE_MPI
    if (pg.size > 1) mpiCheck(MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_MAX, pg.comm));
#endif
}

// Process `root`'s data[n] to every process of the group.
inline void broadcast(const ProcessGroup& pg, float* data, size_t n, int root) {
#ifdef USE_MPI
    if (pg.size > 1) mpiCheck(MPI_Bcast(data, (int)n, MPI_FLOAT, root, pg.comm));
#endif
}

// Every process's mine[n] to process 0, which receives them in rank order in all[size * n].
inline void gather(const ProcessGroup& pg, const float* mine, size_t n, float* all) {
#ifdef USE_MPI
    if (pg.size > 1) {
        mpiCheck(MPI_Gather(mine, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, pg.comm));
        return;
    }
#endif
    std::copy(mine, mine + n, all);
}

// data holds size * count elements; afterwards data[rank*count .. (rank+1)*count) is the sum across
// processes of that block (the other blocks are left as they were).
inline void reduce_scatter_sum(const ProcessGroup& pg, float* data, size_t count) {
    comm_count(pg, count * pg.size, count, sizeof(float));
#ifdef USE_MPI
    if (pg.size > 1) {  // piece by piece: the piece of every block packed together, reduce-scattered
        size_t piece = std::min(COLLECTIVE_PIECE, count);
        std::vector<float> send(piece * pg.size), mine(piece);
        for (size_t off = 0; off < count; off += piece) {
            size_t c = std::min(piece, count - off);
            for (int r = 0; r < pg.size; r++) std::copy(data + r * count + off, data + r * count + off + c, send.data() + r * c);
            mpiCheck(MPI_Reduce_scatter_block(send.data(), mine.data(), (int)c, MPI_FLOAT, MPI_SUM, pg.comm));
            std::copy(mine.begin(), mine.begin() + c, data + (size_t)pg.rank * count + off);
        }
    }
#endif
}

// data holds size * count elements; gathers every process's block rank*count .. into all of them.
inline void all_gather(const ProcessGroup& pg, float* data, size_t count) {
    comm_count(pg, count * pg.size, count, sizeof(float));
#ifdef USE_MPI
    if (pg.size > 1) {  // piece by piece, each process's piece gathered into one buffer and spread out
        size_t piece = std::min(COLLECTIVE_PIECE, count);
        std::vector<float> all(piece * pg.size);
        for (size_t off = 0; off < count; off += piece) {
            size_t c = std::min(piece, count - off);
            mpiCheck(MPI_Allgather(data + (size_t)pg.rank * count + off, (int)c, MPI_FLOAT, all.data(), (int)c, MPI_FLOAT,
                                   pg.comm));
            for (int r = 0; r < pg.size; r++) std::copy(all.data() + r * c, all.data() + (r + 1) * c, data + r * count + off);
        }
    }
#endif
}

inline void barrier(const ProcessGroup& pg) {
#ifdef USE_MPI
    if (pg.size > 1) mpiCheck(MPI_Barrier(pg.comm));
#endif
}

// Every process must run the same configuration; a process started with other flags or another model
// would silently train something else. Each process hashes its description; rank 0 names the first
// process that differs, and all stop.
inline void check_same_config(const ProcessGroup& pg, const std::string& description) {
#ifdef USE_MPI
    if (pg.size == 1) return;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : description) hash = (hash ^ c) * 1099511628211ull;
    std::vector<uint64_t> hashes(pg.size);
    mpiCheck(MPI_Allgather(&hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, pg.comm));
    for (int r = 1; r < pg.size; r++) {
        if (hashes[r] != hashes[0]) {
            if (pg.rank == 0 || pg.rank == r) {
                fprintf(stderr, "Error: process %d runs a different configuration than process 0 (flags, model or "
                        "data differ); this process has: %s\n", r, description.c_str());
            }
            MPI_Abort(MPI_COMM_WORLD, 1);  // the whole run, not only this group
        }
    }
#endif
}

// ----------------------------------------------------------------------------
// Collectives with a different count per process (ZeRO-2/3, llmc/zero_sharded.h). counts[r] elements
// belong to process r and sit at displs[r] in the full buffer, in rank order.

// full holds sum(counts); process r's own part is already at displs[r]. Afterwards every part is
// everywhere. The non-blocking form returns a request to wait on (all_gather_wait) so the caller can
// compute meanwhile; MPI may make most of the progress only inside the wait.
struct GatherRequest {
#ifdef USE_MPI
    MPI_Request request = MPI_REQUEST_NULL;
#endif
    bool pending = false;
};

inline void all_gather_v_start(const ProcessGroup& pg, float* full, const std::vector<int>& counts,
                               const std::vector<int>& displs, GatherRequest* req) {
    size_t total = 0;
    for (int c : counts) total += (size_t)c;
    comm_count(pg, total, (size_t)counts[pg.rank], sizeof(float));
    req->pending = true;
#ifdef USE_MPI
    if (pg.size > 1) {
        mpiCheck(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full, counts.data(), displs.data(), MPI_FLOAT,
                                 pg.comm, &req->request));
    }
#endif
}

inline void all_gather_v_wait(GatherRequest* req) {
#ifdef USE_MPI
    if (req->request != MPI_REQUEST_NULL) mpiCheck(MPI_Wait(&req->request, MPI_STATUS_IGNORE));
#endif
    req->pending = false;
}

// full holds sum(counts) elements on every process; mine receives counts[rank] elements: the sum across
// processes of this process's part.
inline void reduce_scatter_v_sum(const ProcessGroup& pg, const float* full, float* mine, const std::vector<int>& counts) {
    size_t total = 0;
    for (int c : counts) total += (size_t)c;
    comm_count(pg, total, (size_t)counts[pg.rank], sizeof(float));
#ifdef USE_MPI
    if (pg.size > 1) {
        mpiCheck(MPI_Reduce_scatter(full, mine, counts.data(), MPI_FLOAT, MPI_SUM, pg.comm));
        return;
    }
#endif
    std::copy(full, full + counts[0], mine);
}

// gather(), counted in comm_bytes_moved: process 0 receives every process's count elements in rank
// order into full (size * count; ignored elsewhere), the sharded parameters assembled for a model file.
inline void gather_to_rank0(const ProcessGroup& pg, const float* mine, size_t count, float* full) {
    if (pg.size > 1) comm_bytes_moved += (uint64_t)(pg.rank == 0 ? count * (pg.size - 1) : count) * sizeof(float);
    gather(pg, mine, count, full);
}
