// One communicator interface for all the parallel code: the ZeRO stages, tensor and pipeline
// parallelism, the process layout and the run loop call these functions and nothing below them.
//
// A ProcessGroup is a set of processes (all of them, or one dimension of a layout: layout.h) together
// with the backend that moves data between them:
//   MPI   on host buffers (comm_mpi.h; the CPU trainer). Every call returns when its work is done.
//   NCCL  on device buffers (comm_nccl.cuh; the CUDA trainer). A collective is queued on the group's
//         communication stream behind the work queued so far on the caller's compute stream, and
//         returns at once; comm_join makes the compute stream wait for the collectives queued so far.
//         The calls on host values (a double's sum, a barrier, the configuration check) wait for their
//         result, through a watchdog that gives up after -pt seconds.
// A group of one process (no backend) makes every collective the identity, so single-process code
// calls the same functions. Every process of a group must make the same calls in the same order.
//
// The element type travels with each call (CommType), so one interface serves fp32 host buffers and
// bf16 device ones. Sums of floats are computed in the element type, in an order that is fixed for a
// given group size: runs are reproducible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../utils.h"
#include "flight_recorder.h"
#include "watchdog.h"

enum CommType { COMM_FLOAT32, COMM_FLOAT64, COMM_BFLOAT16, COMM_FLOAT16, COMM_UINT64 };
enum CommOp { COMM_SUM, COMM_MAX };

inline const char* comm_type_name(CommType t) {
    static const char* names[] = {"f32", "f64", "bf16", "f16", "u64"};
    return names[t];
}

inline size_t comm_type_bytes(CommType t) {
    switch (t) {
        case COMM_FLOAT64: case COMM_UINT64: return 8;
        case COMM_BFLOAT16: case COMM_FLOAT16: return 2;
        default: return 4;
    }
}

struct ProcessGroup;

// An operation a backend has started and the caller waits for later (all_gather_v_start).
struct CommBackend;
struct CommRequest {
    bool pending = false;
    const CommBackend* backend = nullptr;      // who waits for it (null: nothing to wait for)
    alignas(8) unsigned char handle[16] = {};  // the backend's handle (an MPI_Request)
};

// What a backend provides. Buffers are the backend's kind of memory (host for MPI, device for NCCL);
// `count` is elements, in place unless a call names two buffers.
struct CommBackend {
    const char* name;
    // data (n) = the element-wise op over every process's data
    void (*all_reduce)(const ProcessGroup& g, void* data, size_t n, CommType type, CommOp op);
    // recv (n) on process root = the sum over every process's send (n); send == recv: in place (others'
    // data unspecified after); recv is used on the root only
    void (*reduce)(const ProcessGroup& g, const void* send, void* recv, size_t n, CommType type, int root);
    // data holds size blocks of count; afterwards block rank is the sum of every process's block rank
    // (the other blocks are unspecified)
    void (*reduce_scatter)(const ProcessGroup& g, void* data, size_t count, CommType type);
    // data holds size blocks of count, block rank filled by each process; afterwards all are everywhere
    void (*all_gather)(const ProcessGroup& g, void* data, size_t count, CommType type);
    // process r's counts[r] elements at displs[r] of full, to every process; started, then waited for
    void (*all_gather_v_start)(const ProcessGroup& g, void* full, const int* counts, const int* displs,
                               CommType type, CommRequest* request);
    void (*wait)(CommRequest* request);
    // mine (counts[rank]) = the sum over processes of their full's part rank (parts in rank order)
    void (*reduce_scatter_v)(const ProcessGroup& g, const void* full, void* mine, const int* counts, CommType type);
    // data (n) of process root, to every process
    void (*broadcast)(const ProcessGroup& g, void* data, size_t n, CommType type, int root);
    // every process's mine (n) to process 0's all (size * n), in rank order
    void (*gather)(const ProcessGroup& g, const void* mine, size_t n, void* all, CommType type);
    // send holds size blocks of count, block r for process r; afterwards recv's block r is process r's
    // block for this process (send and recv distinct)
    void (*all_to_all)(const ProcessGroup& g, const void* send, void* recv, size_t count, CommType type);
    // point to point: send returns at once (the data is copied or queued), finish_sends waits for this
    // process's sends so far; recv returns when the data is there
    void (*send)(const ProcessGroup& g, const void* data, size_t n, CommType type, int peer, int tag);
    void (*recv)(const ProcessGroup& g, void* data, size_t n, CommType type, int peer, int tag);
    void (*finish_sends)(const ProcessGroup& g);
    // host values: the sum of a double, every process's 64-bit value (all: size of them); both wait
    double (*sum_host)(const ProcessGroup& g, double value, const char* what);
    void (*all_gather_host_u64)(const ProcessGroup& g, uint64_t value, uint64_t* all, const char* what);
    void (*barrier)(const ProcessGroup& g, const char* what);
    // several collectives issued as one (NCCL's group calls); MPI's run one by one
    void (*group_start)(const ProcessGroup& g);
    void (*group_end)(const ProcessGroup& g);
    // the caller's compute stream waits for the collectives queued so far (NCCL; MPI: nothing to do)
    void (*join)(const ProcessGroup& g);
    // ends the whole run with a message, without waiting for the other processes
    void (*abort)(const ProcessGroup& g, const std::string& message);  // does not return
    // the processes of g with the same color, ordered by key (one sub-group per color); collective
    ProcessGroup (*split)(const ProcessGroup& g, int color, int key);
    // a mark after the collectives queued so far, and the compute stream waiting for the collectives
    // before a mark only (NCCL: an event; MPI: 0, nothing to do)
    uint64_t (*fence)(const ProcessGroup& g);
    void (*wait_fence)(const ProcessGroup& g, uint64_t fence);
    // the calls only queue the data movement (NCCL: on a stream), to be ordered by join or fences;
    // false: a collective has finished when it returns, or when its request is waited for (MPI)
    bool queued;
};

// A set of processes and this process's place in it, and how to reach the others.
struct ProcessGroup {
    int rank = 0;
    int size = 1;
    const char* name = "all processes";    // for messages: "data-parallel", "tensor-parallel", "pipeline"
    const CommBackend* backend = nullptr;  // null: this process alone
    void* state = nullptr;                 // the backend's (its MPI communicator, its NCCL communicator)
};

inline bool comm_active(const ProcessGroup& g) { return g.size > 1 && g.backend != nullptr; }

// The flight recorder's entry of a collective of g (llmc/parallel/flight_recorder.h), for the scope of
// the backend's call.
#define COMM_FLIGHT(g, op, n, type) FlightScope comm_flight_((op), (g).name, (uint64_t)(n), comm_type_name(type), (g).backend->queued)

// Bytes this process has sent plus received in the collectives on parameters and gradients (the few
// bytes of scalar sums left out), counted as a ring algorithm moves them: in a gather or a
// reduce-scatter every process sends and receives every block but its own; an all-reduce is a
// reduce-scatter followed by an all-gather. The trainers log the growth per step (metrics.jsonl).
inline uint64_t comm_bytes_moved = 0;

inline void comm_count(const ProcessGroup& g, size_t total_elements, size_t my_elements, size_t element_bytes) {
    if (g.size > 1) comm_bytes_moved += 2 * (uint64_t)(total_elements - my_elements) * element_bytes;
}

template <typename T> constexpr CommType comm_type_of();
template <> constexpr CommType comm_type_of<float>() { return COMM_FLOAT32; }
template <> constexpr CommType comm_type_of<double>() { return COMM_FLOAT64; }
template <> constexpr CommType comm_type_of<uint64_t>() { return COMM_UINT64; }

// ----------------------------------------------------------------------------
// The calls the parallel code makes. T is float or double on the host, or (under NCCL) the device's
// element type, whose CommType the caller passes in the typed forms.

// An all-reduce moves twice a reduce-scatter's bytes (a reduce-scatter, then an all-gather); sums of
// doubles (statistics such as the vocabulary-parallel loss's) are not parameters or gradients and go
// uncounted, as do maxima.
inline void all_reduce(const ProcessGroup& g, void* data, size_t n, CommType type, CommOp op) {
    if (op == COMM_SUM && type != COMM_FLOAT64) comm_count(g, n, n / g.size, 2 * comm_type_bytes(type));
    if (!comm_active(g)) return;
    COMM_FLIGHT(g, op == COMM_SUM ? "all_reduce_sum" : "all_reduce_max", n, type);
    g.backend->all_reduce(g, data, n, type, op);
}

// In-place sum across processes of data[n].
template <typename T>
void all_reduce_sum(const ProcessGroup& g, T* data, size_t n) {
    all_reduce(g, data, n, comm_type_of<T>(), COMM_SUM);
}

// In-place element-wise maximum across processes of data[n].
inline void all_reduce_max(const ProcessGroup& g, float* data, size_t n) { all_reduce(g, data, n, COMM_FLOAT32, COMM_MAX); }

// The sum across processes of a host value (a loss, a count); waits for it. `what` names it if a
// process waits too long for the others.
inline double all_reduce_sum(const ProcessGroup& g, double value, const char* what = "a sum over processes") {
    if (!comm_active(g)) return value;
    COMM_FLIGHT(g, "sum_host", 1, COMM_FLOAT64);
    return g.backend->sum_host(g, value, what);
}

// Every process's host value, in rank order (one 8-byte word each, on any backend; waits for all of
// them). A group of one gets its own value back.
inline std::vector<uint64_t> all_gather_host(const ProcessGroup& g, uint64_t value, const char* what) {
    std::vector<uint64_t> all(g.size, value);
    if (comm_active(g)) {
        COMM_FLIGHT(g, "all_gather_host", 1, COMM_UINT64);
        g.backend->all_gather_host_u64(g, value, all.data(), what);
    }
    return all;
}

// The same for a double (its bits travel as the word): the pipeline's timings.
inline std::vector<double> all_gather_host_f64(const ProcessGroup& g, double value, const char* what) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof(bits));
    std::vector<uint64_t> words = all_gather_host(g, bits, what);
    std::vector<double> all(words.size());
    for (size_t r = 0; r < words.size(); r++) memcpy(&all[r], &words[r], sizeof(double));
    return all;
}

// The greatest (or, with least, the smallest) of every process's host value (a choice all must share:
// a recompute level, a micro-batch); waits for it.
inline uint64_t all_reduce_extreme(const ProcessGroup& g, uint64_t value, bool least, const char* what) {
    std::vector<uint64_t> all = all_gather_host(g, value, what);
    return least ? *std::min_element(all.begin(), all.end()) : *std::max_element(all.begin(), all.end());
}

// data[n] on process root = the sum over processes (the gradients' owner under ZeRO-1).
inline void reduce_sum(const ProcessGroup& g, void* data, size_t n, CommType type, int root) {
    comm_count(g, n, n / g.size, comm_type_bytes(type));
    if (!comm_active(g)) return;
    COMM_FLIGHT(g, "reduce", n, type);
    g.backend->reduce(g, data, data, n, type, root);
}

// recv[n] on process root = the sum over processes of their send[n] (recv is ignored elsewhere): a
// piece of a gradient reduced into its owner's shard (ZeRO-2 on the GPU, llmc/parallel/grad_buckets.h).
inline void reduce_sum(const ProcessGroup& g, const void* send, void* recv, size_t n, CommType type, int root) {
    comm_count(g, n, n / g.size, comm_type_bytes(type));
    if (comm_active(g)) {
        COMM_FLIGHT(g, "reduce", n, type);
        g.backend->reduce(g, send, recv, n, type, root);
    } else if (send != recv) {
        fatal("reduce_sum: out of place needs a group of more than one process");
    }
}

// data holds size * count elements; afterwards data[rank*count .. (rank+1)*count) is the sum across
// processes of that block (the other blocks are left as they were on the host, unspecified on a device).
inline void reduce_scatter_sum(const ProcessGroup& g, void* data, size_t count, CommType type) {
    comm_count(g, count * g.size, count, comm_type_bytes(type));
    if (!comm_active(g)) return;
    COMM_FLIGHT(g, "reduce_scatter", count * g.size, type);
    g.backend->reduce_scatter(g, data, count, type);
}
inline void reduce_scatter_sum(const ProcessGroup& g, float* data, size_t count) {
    reduce_scatter_sum(g, data, count, COMM_FLOAT32);
}

// data holds size * count elements; gathers every process's block rank*count .. into all of them.
inline void all_gather(const ProcessGroup& g, void* data, size_t count, CommType type) {
    comm_count(g, count * g.size, count, comm_type_bytes(type));
    if (!comm_active(g)) return;
    COMM_FLIGHT(g, "all_gather", count * g.size, type);
    g.backend->all_gather(g, data, count, type);
}
inline void all_gather(const ProcessGroup& g, float* data, size_t count) { all_gather(g, data, count, COMM_FLOAT32); }

// Process `root`'s data[n] to every process of the group. Counted as a ring pipelines it (the data passes
// from process to process: each receives it once and sends it on once, but the root receives nothing
// and its predecessor sends nothing): 2n(P-1)/P elements per process on average, an all-gather's count.
inline void broadcast(const ProcessGroup& g, void* data, size_t n, CommType type, int root) {
    comm_count(g, n, n / g.size, comm_type_bytes(type));
    if (!comm_active(g)) return;
    COMM_FLIGHT(g, "broadcast", n, type);
    g.backend->broadcast(g, data, n, type, root);
}
inline void broadcast(const ProcessGroup& g, float* data, size_t n, int root) { broadcast(g, data, n, COMM_FLOAT32, root); }

// Every process's mine[n] to process 0, which receives them in rank order in all[size * n].
inline void gather(const ProcessGroup& g, const float* mine, size_t n, float* all) {
    if (comm_active(g)) {
        COMM_FLIGHT(g, "gather", n * g.size, COMM_FLOAT32);
        g.backend->gather(g, mine, n, all, COMM_FLOAT32);
    } else {
        std::copy(mine, mine + n, all);
    }
}
// the same in the backend's memory and any element type (a group of more than one process)
inline void gather(const ProcessGroup& g, const void* mine, size_t n, void* all, CommType type) {
    if (!comm_active(g)) fatal("gather: the typed form needs a group of more than one process");
    COMM_FLIGHT(g, "gather", n * g.size, type);
    g.backend->gather(g, mine, n, all, type);
}

// gather(), counted in comm_bytes_moved: process 0 receives every process's count elements in rank
// order into full (size * count; ignored elsewhere), the sharded parameters assembled for a model file.
// send (size blocks of count) -> recv (size blocks of count): block r of recv is what process r put in
// its block for this process (context parallelism's Ulysses, llmc/parallel/context_parallel.h). Every
// process sends and receives all blocks but its own; a group of one copies its block.
inline void all_to_all(const ProcessGroup& g, const void* send, void* recv, size_t count, CommType type) {
    comm_count(g, count * g.size, count, comm_type_bytes(type));
    if (!comm_active(g)) {
        if (send != recv && g.backend == nullptr) memcpy(recv, send, count * comm_type_bytes(type));
        return;
    }
    COMM_FLIGHT(g, "all_to_all", count * g.size, type);
    g.backend->all_to_all(g, send, recv, count, type);
}

inline void gather_to_rank0(const ProcessGroup& g, const float* mine, size_t count, float* full) {
    if (g.size > 1) comm_bytes_moved += (uint64_t)(g.rank == 0 ? count * (g.size - 1) : count) * sizeof(float);
    gather(g, mine, count, full);
}

inline void barrier(const ProcessGroup& g, const char* what = "the other processes") {
    if (!comm_active(g)) return;
    COMM_FLIGHT(g, "barrier", 0, COMM_FLOAT32);
    g.backend->barrier(g, what);
}

// ----------------------------------------------------------------------------
// Collectives with a different count per process (ZeRO-2/3, llmc/parallel/zero_sharded.h). counts[r] elements
// belong to process r and sit at displs[r] in the full buffer, in rank order.

// full holds sum(counts); process r's own part is already at displs[r]. Afterwards every part is
// everywhere. Started here and finished by all_gather_v_wait, so the caller can compute meanwhile (MPI
// may make most of the progress only inside the wait).
using GatherRequest = CommRequest;

inline void all_gather_v_start(const ProcessGroup& g, float* full, const std::vector<int>& counts,
                               const std::vector<int>& displs, GatherRequest* req) {
    size_t total = 0;
    for (int c : counts) total += (size_t)c;
    comm_count(g, total, (size_t)counts[g.rank], sizeof(float));
    req->pending = true;
    req->backend = nullptr;
    if (comm_active(g)) {
        req->backend = g.backend;
        COMM_FLIGHT(g, "all_gather_v_start", total, COMM_FLOAT32);
        g.backend->all_gather_v_start(g, full, counts.data(), displs.data(), COMM_FLOAT32, req);
    }
}

// The same for any element type in the backend's memory (ZeRO-3 on the GPU: a block's parameters).
// A queued backend (NCCL) returns at once: the caller orders the gather with comm_fence and
// comm_wait_fence, or comm_join; otherwise it has finished when this returns.
inline void all_gather_v(const ProcessGroup& g, void* full, const std::vector<int>& counts, const std::vector<int>& displs,
                         CommType type) {
    size_t total = 0;
    for (int c : counts) total += (size_t)c;
    comm_count(g, total, (size_t)counts[g.rank], comm_type_bytes(type));
    if (!comm_active(g)) return;
    CommRequest req;
    req.pending = true;
    req.backend = g.backend;
    COMM_FLIGHT(g, "all_gather_v", total, type);
    g.backend->all_gather_v_start(g, full, counts.data(), displs.data(), type, &req);
    if (!g.backend->queued) g.backend->wait(&req);
}

inline void all_gather_v_wait(GatherRequest* req) {
    if (req->backend != nullptr) req->backend->wait(req);
    req->pending = false;
    req->backend = nullptr;
}

// full holds sum(counts) elements on every process; mine receives counts[rank] elements: the sum across
// processes of this process's part.
inline void reduce_scatter_v_sum(const ProcessGroup& g, const float* full, float* mine, const std::vector<int>& counts) {
    size_t total = 0;
    for (int c : counts) total += (size_t)c;
    comm_count(g, total, (size_t)counts[g.rank], sizeof(float));
    if (comm_active(g)) {
        COMM_FLIGHT(g, "reduce_scatter_v", total, COMM_FLOAT32);
        g.backend->reduce_scatter_v(g, full, mine, counts.data(), COMM_FLOAT32);
    } else {
        std::copy(full, full + counts[0], mine);
    }
}

// ----------------------------------------------------------------------------
// Point to point (pipeline stages), issue order between two processes is delivery order per tag.

// Under NCCL a send holds the group's communication stream until the peer receives it (NCCL's
// rule), so two processes that send to each other put their sends and receives in one
// comm_group_start/comm_group_end. Each side counts its bytes in comm_bytes_moved (sent or received).
inline void comm_send(const ProcessGroup& g, const void* data, size_t n, CommType type, int peer, int tag) {
    if (g.backend == nullptr) fatal("send to process %d: this process is alone (pipeline parallelism needs MPI)", peer);
    comm_bytes_moved += (uint64_t)n * comm_type_bytes(type);
    COMM_FLIGHT(g, "send", n, type);
    g.backend->send(g, data, n, type, peer, tag);
}
inline void comm_recv(const ProcessGroup& g, void* data, size_t n, CommType type, int peer, int tag) {
    if (g.backend == nullptr) fatal("receive from process %d: this process is alone (pipeline parallelism needs MPI)", peer);
    comm_bytes_moved += (uint64_t)n * comm_type_bytes(type);
    COMM_FLIGHT(g, "recv", n, type);
    g.backend->recv(g, data, n, type, peer, tag);
}
template <typename T>
void comm_send(const ProcessGroup& g, const T* data, size_t n, int peer, int tag) {
    comm_send(g, data, n, comm_type_of<T>(), peer, tag);
}
template <typename T>
void comm_recv(const ProcessGroup& g, T* data, size_t n, int peer, int tag) {
    comm_recv(g, data, n, comm_type_of<T>(), peer, tag);
}
inline void comm_finish_sends(const ProcessGroup& g) {
    if (g.backend != nullptr) g.backend->finish_sends(g);
}

// ----------------------------------------------------------------------------
// Grouping, stream order, the end of a run

inline void comm_group_start(const ProcessGroup& g) {
    if (comm_active(g)) g.backend->group_start(g);
}
inline void comm_group_end(const ProcessGroup& g) {
    if (comm_active(g)) g.backend->group_end(g);
}
inline void comm_join(const ProcessGroup& g) {
    if (comm_active(g)) g.backend->join(g);
}

// A fence after the collectives queued so far; comm_wait_fence makes the compute stream wait for
// those only, not for what was queued after the fence (to reuse a buffer that an earlier collective
// read while later ones still run). At most COMM_FENCES fences may be outstanding at once.
constexpr uint64_t COMM_FENCES = 16;
inline uint64_t comm_fence(const ProcessGroup& g) { return comm_active(g) ? g.backend->fence(g) : 0; }
inline void comm_wait_fence(const ProcessGroup& g, uint64_t fence) {
    if (comm_active(g)) g.backend->wait_fence(g, fence);
}

// How host vectors reach a backend's collectives (a checkpoint's assembly, llmc/parallel/model_state.h):
// MPI's take host memory as it is (host_staging); NCCL moves device memory, so the CUDA trainer stages
// each vector through device buffers. buffer(n): the backend's memory for n floats, zeroed, kept until
// release(); put/get: host -> buffer, buffer -> host; wait(what): the collectives queued so far have
// finished (NCCL: the compute stream synchronized, after comm_join).
struct CommStaging {
    std::function<float*(size_t n)> buffer;
    std::function<void(float* buf, const float* host, size_t n)> put;
    std::function<void(float* host, const float* buf, size_t n)> get;
    std::function<void(const char* what)> wait;
    std::function<void()> release;
};

inline CommStaging host_staging() {
    auto buffers = std::make_shared<std::vector<std::vector<float> > >();
    CommStaging s;
    s.buffer = [buffers](size_t n) {
        buffers->emplace_back(std::max<size_t>(n, 1), 0.0f);  // a moved vector keeps its data where it was
        return buffers->back().data();
    };
    s.put = [](float* buf, const float* host, size_t n) { std::copy_n(host, n, buf); };
    s.get = [](float* host, const float* buf, size_t n) { std::copy_n(buf, n, host); };
    s.wait = [](const char*) {};
    s.release = [buffers] { buffers->clear(); };
    return s;
}

// The processes of `parent` with the same color, ordered by key: one sub-group per color. Every process
// of parent must call it. A group of one splits into itself.
inline ProcessGroup process_group_split(const ProcessGroup& parent, int color, int key) {
    if (!comm_active(parent)) return ProcessGroup();
    return parent.backend->split(parent, color, key);
}

// Ends the run on every process: this one prints the message and aborts the backend (MPI_Abort,
// ncclCommAbort), which takes the others down with it.
[[noreturn]] inline void comm_abort(const ProcessGroup& g, const std::string& message) {
    if (g.backend != nullptr) g.backend->abort(g, message);
    fatal("%s", message.c_str());
}

// Every process must run the same configuration: one started with other flags, another model or other
// data would silently train something else (or hang at a collective that only some processes reach).
// The description is one "name=value" line per field (flags, model shape, a checksum of the initial
// weights). Each process hashes it and the group all-gathers the hashes; when they differ, the group
// all-gathers each field's hash, and the values of the fields that differ, so that every process
// knows the same table: all stop together, process 0 naming each differing field with its values,
// e.g. "-s is 5 on process 0 and 7 on process 1".
inline uint64_t config_hash(const std::string& text) {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
    return hash;
}

// every process's copy of `text` (collective; eight bytes per all-gather)
inline std::vector<std::string> config_gather_text(const ProcessGroup& g, const std::string& text) {
    std::vector<uint64_t> lengths = all_gather_host(g, text.size(), "the configuration check at start-up");
    size_t longest = *std::max_element(lengths.begin(), lengths.end());
    std::vector<std::string> texts(g.size);
    for (size_t at = 0; at < longest; at += 8) {
        uint64_t word = 0;
        for (size_t i = 0; i < 8 && at + i < text.size(); i++) word |= (uint64_t)(unsigned char)text[at + i] << (8 * i);
        std::vector<uint64_t> words = all_gather_host(g, word, "the configuration check at start-up");
        for (int r = 0; r < g.size; r++)
            for (size_t i = 0; i < 8 && at + i < lengths[r]; i++) texts[r] += (char)(words[r] >> (8 * i));
    }
    return texts;
}

inline void check_same_config(const ProcessGroup& g, const std::string& description) {
    if (!comm_active(g)) return;
    std::vector<uint64_t> hashes = all_gather_host(g, config_hash(description), "the configuration check at start-up");
    bool same = true;
    for (int r = 1; r < g.size; r++) same = same && hashes[r] == hashes[0];
    if (same) return;
    // field by field (every process has the same lines: the same program built them)
    std::vector<std::string> lines;
    for (size_t begin = 0; begin <= description.size();) {
        size_t end = description.find('\n', begin);
        if (end == std::string::npos) end = description.size();
        lines.push_back(description.substr(begin, end - begin));
        begin = end + 1;
    }
    std::vector<uint64_t> counts = all_gather_host(g, lines.size(), "the configuration check at start-up");
    std::string differences;
    for (int r = 1; r < g.size; r++) {
        if (counts[r] != counts[0]) comm_abort(g, "the processes run different builds of the trainer (their start-up "
                                                  "descriptions have different fields); stopping");
    }
    for (const std::string& line : lines) {
        hashes = all_gather_host(g, config_hash(line), "the configuration check at start-up");
        std::vector<int> differing;
        for (int r = 1; r < g.size; r++)
            if (hashes[r] != hashes[0]) differing.push_back(r);
        if (differing.empty()) continue;
        size_t eq = line.find('=');
        std::string name = line.substr(0, eq);
        std::vector<std::string> values = config_gather_text(g, eq == std::string::npos ? line : line.substr(eq + 1));
        std::string text = name + " is " + (values[0].empty() ? "''" : values[0]) + " on process 0";
        for (size_t i = 0; i < differing.size() && i < 3; i++) {
            int r = differing[i];
            text += (i + 1 == differing.size() ? " and " : ", ") + (values[r].empty() ? std::string("''") : values[r]) +
                    " on process " + std::to_string(r);
        }
        if (differing.size() > 3) text += " (and " + std::to_string(differing.size() - 3) + " more processes)";
        differences += (differences.empty() ? "" : "; ") + text;
    }
    if (g.rank == 0) comm_abort(g, "the processes were started with different configurations: " + differences);
    comm_abort(g, "process " + std::to_string(g.rank) + ": stopping, the configurations differ (process 0 says how)");
}

// The start of a run of several processes, the same in both trainers, before any other collective: from
// here on every wait on the others is watched (llmc/parallel/watchdog.h), for -pt seconds until training
// begins (the run loop then sets -wt), so a process that leaves or never arrives during start-up ends the
// run with a message instead of a hang; and the processes check that they run the same program, the
// trainer and its build (e.g. "train_gpt2 (fp32 CPU)", "train_gpt2cu (bf16)"): one launch that starts
// two of them would issue different collectives, or train different things. An empty `program` skips
// that check (a test program).
inline void start_up_check(const ProcessGroup& world, const std::string& program, double timeout_s) {
    watchdog_set_limit(timeout_s, "-pt");
    if (!comm_active(world) || program.empty()) return;
    std::vector<std::string> programs = config_gather_text(world, program);
    std::string others;
    for (int r = 1; r < world.size; r++) {
        if (programs[r] != programs[0]) others += ", process " + std::to_string(r) + " runs " + programs[r];
    }
    if (others.empty()) return;
    comm_abort(world, "the processes run different programs: process 0 runs " + programs[0] + others +
                          " (one launch must start one trainer, built one way); stopping");
}
