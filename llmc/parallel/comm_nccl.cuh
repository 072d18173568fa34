// The NCCL backend of llmc/parallel/comm.h: its collectives on device buffers, for the processes that
// llmc/parallel/gpu_start.cuh started (one per GPU) and the groups split from them.
//
// The backend (nccl_group): a collective on device buffers is queued on the communication stream, a
// second, high-priority stream, behind the work queued so far on the compute stream, and returns at
// once; comm_join makes the compute stream wait for the collectives so far. So during a step
// (train_gpt2.cu) the gradients of each layer are reduced as soon as the backward has finished that
// layer (llmc/parallel/grad_buckets.h says which slices, and to whom), overlapping the backward of the layers
// below. -z 0 all-reduces them; -z 1 reduces each piece to the rank whose shard holds it, that rank
// updates its shard of the fp32 master weights and AdamW moments, and the bf16 parameters are
// all-gathered.
#pragma once

#include <nccl.h>

#include <functional>
#include <string>
#include <vector>

#include "../cuda_common.cuh"
#include "comm_mpi.h"
#include "gpu_start.cuh"
#include "grad_buckets.h"

// floatX (llmc/cuda_common.cuh) as llmc/parallel/comm.h names it
#if defined(ENABLE_FP32)
constexpr CommType COMM_FLOATX = COMM_FLOAT32;
#elif defined(ENABLE_FP16)
constexpr CommType COMM_FLOATX = COMM_FLOAT16;
#else
constexpr CommType COMM_FLOATX = COMM_BFLOAT16;
#endif

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

// Block r of send to process r, block r of recv from it: NCCL has no all-to-all, so it is a send and a
// receive per peer in one group (the own block copied on the stream).
inline void nccl_all_to_all(const ProcessGroup& g, const void* send, void* recv, size_t count, CommType type) {
    DataParallel& dp = nccl_state(g);
    const size_t bytes = count * comm_type_bytes(type);
    nccl_group_start(g);
    for (int r = 0; r < dp.size; r++) {
        const char* out = (const char*)send + r * bytes;
        char* in = (char*)recv + r * bytes;
        if (r == dp.rank) {
            cudaCheck(cudaMemcpyAsync(in, out, bytes, cudaMemcpyDeviceToDevice, dp.stream));
            continue;
        }
        ncclQueued(dp, ncclSend(out, count, nccl_type(type), r, dp.comm, dp.stream));
        ncclQueued(dp, ncclRecv(in, count, nccl_type(type), r, dp.comm, dp.stream));
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
        nccl_wait,     nccl_reduce_scatter_v, nccl_broadcast, nccl_gather, nccl_all_to_all, nccl_send, nccl_recv, nccl_finish_sends,
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

// The same into one buffer of the caller's (a collective's few floats, every step): nothing allocated.
inline CommStaging device_staging_in(float* buffer, cudaStream_t stream, std::function<void(const char*)> sync) {
    CommStaging s = device_staging(stream, std::move(sync));
    s.buffer = [buffer](size_t) { return buffer; };
    s.release = [] {};
    return s;
}
