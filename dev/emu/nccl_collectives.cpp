// Emulated NCCL: the collectives and groups.
//
// A call checks its arguments at once (communicator usable, type, operator, root, and that every
// buffer it will touch is device memory large enough for the layout NVIDIA's nccl.h defines) and
// queues the operation on its stream (emu::enqueue). The operation runs when the stream runs it, on
// the emulated device thread, on the buffers as they are then: a caller that forgets to order the
// communication stream after the kernels that write the buffers reads stale data, as on a GPU.
// Inside ncclGroupStart/ncclGroupEnd the operations are recorded and queued at the outermost
// ncclGroupEnd, one task per stream holding that stream's operations in call order.
//
// Data movement over MPI, in chunks of at most CHUNK_BYTES per rank (MPI counts are ints, and the
// scratch memory stays small): every reduction first brings every rank's contribution to the rank
// that needs it (all-gather, gather to the root, or all-to-all of the blocks), then combines them
// there in rank order 0, 1, ..., N-1, accumulating 16-bit floats in fp32 and rounding once. The
// result is therefore the same on every rank and in every run. Real NCCL differs: a ring (or tree)
// visits the ranks in another order per chunk and rounds bf16/fp16 partial sums at each step, so its
// sums of 16-bit floats can differ from these in the last bits.
#include <emu/device.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "nccl_comm.h"

using nccl_emu::error;

namespace {

constexpr size_t CHUNK_BYTES = size_t(4) << 20;

enum class Kind { AllReduce, Reduce, ReduceScatter, AllGather, Broadcast };

struct Op {
    Kind kind;
    const char* name;  // the API call, for messages
    const void* send;
    void* recv;
    size_t count;  // AllReduce, Reduce, Broadcast: elements; ReduceScatter: recvcount; AllGather: sendcount
    ncclDataType_t type;
    ncclRedOp_t red;
    int root;
    ncclComm* comm;
    cudaStream_t stream;
};

thread_local int group_depth_now = 0;
thread_local std::vector<Op> group_ops;
thread_local ncclResult_t group_result = ncclSuccess;  // the first error inside the group

// ----------------------------------------------------------------------------
// element types: storage, widening to the accumulator and rounding back

struct Bf16 { uint16_t bits; };

float widen(Bf16 x) {
    uint32_t bits = uint32_t(x.bits) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN
void narrow(float f, Bf16* out) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        out->bits = uint16_t((bits >> 16) | 0x0040u);
        return;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);
    out->bits = uint16_t(bits >> 16);
}

float widen(_Float16 x) { return float(x); }
void narrow(float f, _Float16* out) { *out = _Float16(f); }  // round to nearest even
template <typename T> T widen(T x) { return x; }
template <typename T> void narrow(T x, T* out) { *out = x; }

// The accumulator of T: fp32 for 16-bit floats, T otherwise.
template <typename T> struct Accumulator { using type = T; };
template <> struct Accumulator<Bf16> { using type = float; };
template <> struct Accumulator<_Float16> { using type = float; };

// a op b; integer sums and products wrap around, as NCCL's do
template <typename A> A combine(ncclRedOp_t op, A a, A b) {
    if constexpr (std::is_integral<A>::value) {
        using U = std::make_unsigned_t<A>;
        if (op == ncclSum || op == ncclAvg) return A(U(a) + U(b));
        if (op == ncclProd) return A(U(a) * U(b));
    } else {
        if (op == ncclSum || op == ncclAvg) return a + b;
        if (op == ncclProd) return a * b;
    }
    return op == ncclMax ? (b > a ? b : a) : (b < a ? b : a);
}

// out[i] = op over r = 0..nranks-1, in that order, of in[r * n + i]; ncclAvg divides the sum by nranks
template <typename T>
void reduce_ranks(void* out_raw, const void* in_raw, size_t n, int nranks, ncclRedOp_t op) {
    using A = typename Accumulator<T>::type;
    const T* in = (const T*)in_raw;
    T* out = (T*)out_raw;
    for (size_t i = 0; i < n; i++) {
        A acc = widen(in[i]);
        for (int r = 1; r < nranks; r++) acc = combine<A>(op, acc, widen(in[(size_t)r * n + i]));
        if (op == ncclAvg) acc = A(acc / A(nranks));
        narrow(acc, &out[i]);
    }
}

void reduce_ranks(ncclDataType_t type, void* out, const void* in, size_t n, int nranks, ncclRedOp_t op) {
    switch (type) {
        case ncclInt8: return reduce_ranks<int8_t>(out, in, n, nranks, op);
        case ncclUint8: return reduce_ranks<uint8_t>(out, in, n, nranks, op);
        case ncclInt32: return reduce_ranks<int32_t>(out, in, n, nranks, op);
        case ncclUint32: return reduce_ranks<uint32_t>(out, in, n, nranks, op);
        case ncclInt64: return reduce_ranks<int64_t>(out, in, n, nranks, op);
        case ncclUint64: return reduce_ranks<uint64_t>(out, in, n, nranks, op);
        case ncclFloat16: return reduce_ranks<_Float16>(out, in, n, nranks, op);
        case ncclFloat32: return reduce_ranks<float>(out, in, n, nranks, op);
        case ncclFloat64: return reduce_ranks<double>(out, in, n, nranks, op);
        case ncclBfloat16: return reduce_ranks<Bf16>(out, in, n, nranks, op);
        default: emu::fail("NCCL emulation: reduction of data type %d", (int)type);
    }
}

size_t type_size(ncclDataType_t type) {
    switch (type) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

const char* type_name(ncclDataType_t type) {
    static const char* names[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                                  "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                  "ncclFloat8e5m2"};
    return type >= 0 && type < ncclNumTypes ? names[type] : "an unknown type";
}

// ----------------------------------------------------------------------------
// transport: each returns false after recording the failure as the communicator's async error

#ifdef USE_MPI
bool mpi_ok(const Op& op, int rc, const char* mpi_call) {
    if (rc == MPI_SUCCESS) return true;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    nccl_emu::set_comm_error(op.comm, ncclRemoteError, std::string(op.name) + " on rank " + std::to_string(op.comm->rank) +
                             ": " + mpi_call + " failed: " + std::string(text, length));
    return false;
}
#endif

// all[r * bytes ..] = rank r's `mine`, on every rank
bool all_gather_bytes(const Op& op, const void* mine, void* all, size_t bytes) {
    if (op.comm->local) {
        memcpy(all, mine, bytes);
        return true;
    }
#ifdef USE_MPI
    return mpi_ok(op, MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, op.comm->mpi), "MPI_Allgather");
#else
    return false;
#endif
}

// the same, on the root only
bool gather_bytes(const Op& op, const void* mine, void* all, size_t bytes) {
    if (op.comm->local) {
        memcpy(all, mine, bytes);
        return true;
    }
#ifdef USE_MPI
    return mpi_ok(op, MPI_Gather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, op.root, op.comm->mpi), "MPI_Gather");
#else
    return false;
#endif
}

// blocks[j * bytes ..] goes to rank j; received[i * bytes ..] came from rank i
bool all_to_all_bytes(const Op& op, const void* blocks, void* received, size_t bytes) {
    if (op.comm->local) {
        memcpy(received, blocks, bytes);
        return true;
    }
#ifdef USE_MPI
    return mpi_ok(op, MPI_Alltoall(blocks, (int)bytes, MPI_BYTE, received, (int)bytes, MPI_BYTE, op.comm->mpi),
                  "MPI_Alltoall");
#else
    return false;
#endif
}

bool broadcast_bytes(const Op& op, void* data, size_t bytes) {
    if (op.comm->local) return true;
#ifdef USE_MPI
    return mpi_ok(op, MPI_Bcast(data, (int)bytes, MPI_BYTE, op.root, op.comm->mpi), "MPI_Bcast");
#else
    return false;
#endif
}

// ----------------------------------------------------------------------------
// the collectives, as they run on the device thread

void run(const Op& op) {
    ncclComm* comm = op.comm;
    {
        std::lock_guard<std::mutex> lock(comm->mutex);
        // aborted, or broken by an earlier failure: skip (ncclInProgress: finalizing, after this task)
        if (comm->aborted || (comm->state != ncclSuccess && comm->state != ncclInProgress)) return;
    }
    const int n_ranks = comm->nranks, rank = comm->rank;
    const size_t size = type_size(op.type);
    const size_t chunk = CHUNK_BYTES / size;
    std::vector<char> scratch(std::min(op.count, chunk) * size * n_ranks), packed;
    const char* send = (const char*)op.send;
    char* recv = (char*)op.recv;
    for (size_t begin = 0; begin < op.count; begin += chunk) {
        const size_t n = std::min(chunk, op.count - begin), bytes = n * size, offset = begin * size;
        switch (op.kind) {
            case Kind::AllReduce:
                if (!all_gather_bytes(op, send + offset, scratch.data(), bytes)) return;
                reduce_ranks(op.type, recv + offset, scratch.data(), n, n_ranks, op.red);
                break;
            case Kind::Reduce:
                if (!gather_bytes(op, send + offset, scratch.data(), bytes)) return;
                if (rank == op.root) reduce_ranks(op.type, recv + offset, scratch.data(), n, n_ranks, op.red);
                break;
            case Kind::ReduceScatter:  // send holds n_ranks blocks of count; block j is reduced on rank j
                packed.resize(bytes * n_ranks);
                for (int j = 0; j < n_ranks; j++) memcpy(packed.data() + j * bytes, send + j * op.count * size + offset, bytes);
                if (!all_to_all_bytes(op, packed.data(), scratch.data(), bytes)) return;
                reduce_ranks(op.type, recv + offset, scratch.data(), n, n_ranks, op.red);
                break;
            case Kind::AllGather:  // rank i's count elements go to recv + i * count
                if (!all_gather_bytes(op, send + offset, scratch.data(), bytes)) return;
                for (int i = 0; i < n_ranks; i++) memcpy(recv + i * op.count * size + offset, scratch.data() + i * bytes, bytes);
                break;
            case Kind::Broadcast:
                if (rank == op.root) memcpy(scratch.data(), send + offset, bytes);
                if (!broadcast_bytes(op, scratch.data(), bytes)) return;
                memcpy(recv + offset, scratch.data(), bytes);
                break;
        }
    }
}

// ----------------------------------------------------------------------------
// checks at call time, and queuing

ncclResult_t check_buffer(const Op& op, const char* which, const void* p, size_t elements) {
    size_t bytes = elements * type_size(op.type);
    if (bytes == 0) return ncclSuccess;
    if (p == nullptr || !emu::is_device_pointer(p, bytes)) {
        return error(ncclInvalidArgument, "%s: %s %p is not device memory (cudaMalloc) of at least %zu bytes (%zu "
                     "elements of %s)", op.name, which, p, bytes, elements, type_name(op.type));
    }
    return ncclSuccess;
}

ncclResult_t check(const Op& op) {
    ncclResult_t usable = nccl_emu::check_usable(op.comm, op.name);
    if (usable != ncclSuccess) return usable;
    if (op.type == ncclFloat8e4m3 || op.type == ncclFloat8e5m2) {
        emu::fail("%s: %s is not emulated", op.name, type_name(op.type));
    }
    if (type_size(op.type) == 0) return error(ncclInvalidArgument, "%s: data type %d is not an ncclDataType_t", op.name, (int)op.type);
    bool reduces = op.kind == Kind::AllReduce || op.kind == Kind::Reduce || op.kind == Kind::ReduceScatter;
    if (reduces && (op.red < 0 || op.red >= ncclNumOps)) {
        return error(ncclInvalidArgument, "%s: reduction operator %d is not ncclSum/Prod/Max/Min/Avg (operators made "
                     "by ncclRedOpCreatePreMulSum are not emulated)", op.name, (int)op.red);
    }
    const int n_ranks = op.comm->nranks, rank = op.comm->rank;
    bool rooted = op.kind == Kind::Reduce || op.kind == Kind::Broadcast;
    if (rooted && (op.root < 0 || op.root >= n_ranks)) {
        return error(ncclInvalidArgument, "%s: root = %d, must be in [0, %d)", op.name, op.root, n_ranks);
    }
    if (op.count > SIZE_MAX / 8 / (size_t)n_ranks) return error(ncclInvalidArgument, "%s: count %zu is too large", op.name, op.count);
    const size_t all = op.count * n_ranks;
    ncclResult_t r = ncclSuccess;
    switch (op.kind) {
        case Kind::AllReduce:
            if ((r = check_buffer(op, "sendbuff", op.send, op.count)) != ncclSuccess) return r;
            return check_buffer(op, "recvbuff", op.recv, op.count);
        case Kind::Reduce:  // recvbuff is used on the root only
            if ((r = check_buffer(op, "sendbuff", op.send, op.count)) != ncclSuccess) return r;
            return rank == op.root ? check_buffer(op, "recvbuff", op.recv, op.count) : ncclSuccess;
        case Kind::ReduceScatter:
            if ((r = check_buffer(op, "sendbuff (nranks * recvcount elements)", op.send, all)) != ncclSuccess) return r;
            return check_buffer(op, "recvbuff", op.recv, op.count);
        case Kind::AllGather:
            if ((r = check_buffer(op, "sendbuff", op.send, op.count)) != ncclSuccess) return r;
            return check_buffer(op, "recvbuff (nranks * sendcount elements)", op.recv, all);
        case Kind::Broadcast:  // sendbuff is used on the root only
            if (rank == op.root && (r = check_buffer(op, "sendbuff", op.send, op.count)) != ncclSuccess) return r;
            return check_buffer(op, "recvbuff", op.recv, op.count);
    }
    return ncclSuccess;
}

// Tells initcheck (dev/emu/device_memory.cpp) that the op's output is written: the transports write
// it with memcpy and MPI, which its instrumentation does not see.
void mark_output_written(const Op& op) {
    size_t size = type_size(op.type), n_ranks = (size_t)op.comm->nranks;
    switch (op.kind) {
        case Kind::AllReduce:
        case Kind::ReduceScatter:
        case Kind::Broadcast: emu::initcheck_mark_written(op.recv, op.count * size); break;
        case Kind::Reduce:
            if (op.comm->rank == op.root) emu::initcheck_mark_written(op.recv, op.count * size);
            break;
        case Kind::AllGather: emu::initcheck_mark_written(op.recv, op.count * n_ranks * size); break;
    }
}

// Queues `ops` (all on one stream) as one task that runs them in order.
void enqueue(cudaStream_t stream, std::vector<Op> ops, const char* what) {
    for (const Op& op : ops) {
        op.comm->pending++;
        std::lock_guard<std::mutex> lock(op.comm->mutex);
        bool known = false;
        for (cudaStream_t s : op.comm->streams) known = known || s == stream;
        if (!known) op.comm->streams.push_back(stream);
    }
    emu::enqueue(stream, what, [ops]() {
        for (const Op& op : ops) {
            run(op);
            mark_output_written(op);
            op.comm->pending--;
        }
    });
}

ncclResult_t submit(const Op& op) {
    ncclResult_t r = check(op);
    if (group_depth_now > 0) {
        if (r != ncclSuccess && group_result == ncclSuccess) group_result = r;
        if (r == ncclSuccess) group_ops.push_back(op);
        return r;
    }
    if (r != ncclSuccess) return r;
    enqueue(op.stream, {op}, op.name);
    return ncclSuccess;
}

}  // namespace

int nccl_emu::group_depth() { return group_depth_now; }

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit({Kind::AllReduce, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return submit({Kind::Reduce, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root, comm, stream});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit({Kind::ReduceScatter, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit({Kind::AllGather, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit({Kind::Broadcast, "ncclBroadcast", sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
    return submit({Kind::Broadcast, "ncclBcast", buff, buff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclGroupStart(void) {
    if (group_depth_now++ == 0) {
        group_ops.clear();
        group_result = ncclSuccess;
    }
    return ncclSuccess;
}

// At the outermost end: one task per stream with that stream's operations, in call order. A group
// in which a call failed queues nothing and returns that call's error, as NCCL does.
ncclResult_t ncclGroupEnd(void) {
    if (group_depth_now == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth_now > 0) return ncclSuccess;
    std::vector<Op> ops;
    ops.swap(group_ops);
    if (group_result != ncclSuccess) return group_result;
    // every operation's communicator must still be usable (none was aborted since it was recorded)
    for (const Op& op : ops) {
        ncclResult_t r = nccl_emu::check_usable(op.comm, op.name);
        if (r != ncclSuccess) return r;
    }
    std::vector<bool> queued(ops.size(), false);
    for (size_t i = 0; i < ops.size(); i++) {
        if (queued[i]) continue;
        std::vector<Op> same_stream;
        for (size_t j = i; j < ops.size(); j++) {
            if (!queued[j] && ops[j].stream == ops[i].stream) {
                same_stream.push_back(ops[j]);
                queued[j] = true;
            }
        }
        enqueue(ops[i].stream, same_stream, same_stream.size() == 1 ? same_stream[0].name : "an NCCL group (ncclGroupEnd)");
    }
    return ncclSuccess;
}

}  // extern "C"
