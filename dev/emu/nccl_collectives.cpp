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
//
// Send and receive (ncclSend, ncclRecv) are MPI's synchronous-mode messages (MPI_Issend): a send
// finishes only once its receive has started, so a send blocks its stream until the peer receives,
// as NCCL's does, and two ranks that each send to the other before receiving, outside a group, wait
// forever here as on GPUs. In a group, every send and receive starts at once.
//
// The device never waits inside MPI: a task posts non-blocking MPI calls (emu::enqueue_async) and
// the device asks between other tasks whether they are done, so one stream waiting for a peer does not
// stop this process's other streams (a pipeline's sends on one stream, receives on another), as on a
// GPU. The MPI calls of one communicator are posted in the order the host called NCCL (NCCL's rule:
// every rank calls a communicator's operations in one order), whichever order its streams run them.
#include <emu/device.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "nccl_comm.h"

using nccl_emu::error;

namespace {

constexpr size_t CHUNK_BYTES = size_t(4) << 20;

enum class Kind { AllReduce, Reduce, ReduceScatter, AllGather, Broadcast, Send, Recv };

constexpr size_t P2P_CHUNK_BYTES = size_t(1) << 30;  // one MPI message of a send or receive, at most
constexpr int P2P_TAG = 0x4e43;

struct Op {
    Kind kind;
    const char* name;  // the API call, for messages
    const void* send;
    void* recv;
    size_t count;  // AllReduce, Reduce, Broadcast, Send, Recv: elements; ReduceScatter: recvcount; AllGather: sendcount
    ncclDataType_t type;
    ncclRedOp_t red;
    int root;  // Reduce, Broadcast: the root; Send, Recv: the peer
    ncclComm* comm;
    cudaStream_t stream;
    uint64_t seq = 0;  // its place in the communicator's order (ncclComm::issued)
};

bool point_to_point(const Op& op) { return op.kind == Kind::Send || op.kind == Kind::Recv; }

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
// the operations, as the device runs them

#ifdef USE_MPI
std::string mpi_error_text(int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
    return std::string(text, length);
}

// false after recording the failure as the communicator's asynchronous error
bool mpi_ok(const Op& op, int rc, const char* mpi_call) {
    if (rc == MPI_SUCCESS) return true;
    nccl_emu::set_comm_error(op.comm, ncclRemoteError, std::string(op.name) + " on rank " + std::to_string(op.comm->rank) +
                             ": " + mpi_call + " failed: " + mpi_error_text(rc));
    return false;
}
#endif

// The operation may not run: its communicator was aborted or broken by an earlier failure (a
// communicator being finalized is still usable for what was queued before).
bool skipped(const Op& op) {
    if (op.comm->aborted) return true;
    std::lock_guard<std::mutex> lock(op.comm->mutex);
    return op.comm->state != ncclSuccess && op.comm->state != ncclInProgress;
}

// Tells initcheck (dev/emu/device_memory.cpp) that the op's output is written: the transports write
// it with memcpy and MPI, which its instrumentation does not see.
void mark_output_written(const Op& op) {
    size_t size = type_size(op.type), n_ranks = (size_t)op.comm->nranks;
    switch (op.kind) {
        case Kind::AllReduce:
        case Kind::ReduceScatter:
        case Kind::Broadcast:
        case Kind::Recv: emu::initcheck_mark_written(op.recv, op.count * size); break;
        case Kind::Reduce:
            if (op.comm->rank == op.root) emu::initcheck_mark_written(op.recv, op.count * size);
            break;
        case Kind::AllGather: emu::initcheck_mark_written(op.recv, op.count * n_ranks * size); break;
        case Kind::Send: break;
    }
}

// One task's operations (one call, or one stream's share of a group) on their way. The collectives go
// one after another, chunk by chunk, each chunk one non-blocking MPI collective; the sends and
// receives start when reached (all of a group's at once) and are waited for at the end. advance() is
// the task's poll: it does what it can without waiting and says whether everything is done.
class Transfer {
public:
    explicit Transfer(std::vector<Op> ops) : ops_(std::move(ops)) {}

    bool advance() {
        while (next_ < ops_.size()) {
            Op& op = ops_[next_];
            if (!chunk_started_ && skipped(op)) {
                op.comm->started = std::max(op.comm->started, op.seq + 1);
                finish(op);
                continue;
            }
            if (!chunk_started_ && !op.comm->local && op.comm->started != op.seq) return false;  // not its turn yet
            if (point_to_point(op)) {
                start_message(op);
                next_++;
                continue;
            }
            if (!chunk_started_) {
                if (op.count == 0 || !start_chunk(op)) {  // nothing to move, or the MPI call failed
                    op.comm->started = std::max(op.comm->started, op.seq + 1);
                    finish(op);
                    continue;
                }
                chunk_started_ = true;
                if (begin_ + chunk_elements(op) >= op.count) op.comm->started = op.seq + 1;  // the next may start
            }
            bool ok = true;
            if (!chunk_arrived(op, &ok)) return false;
            chunk_started_ = false;
            if (ok) end_chunk(op);
            begin_ += chunk_elements(op);
            if (!ok || begin_ >= op.count) finish(op);
        }
        return messages_arrived();
    }

private:
    std::vector<Op> ops_;
    size_t next_ = 0;             // the operation being started or worked on
    size_t begin_ = 0;            // its current chunk's first element
    bool chunk_started_ = false;  // that chunk's MPI call is posted
    std::vector<char> scratch_, packed_;
    // sends and receives on their way: MPI requests, and for each the op and the bytes it should move
#ifdef USE_MPI
    MPI_Request request_ = MPI_REQUEST_NULL;  // the current chunk's
    std::vector<MPI_Request> messages_;
#endif
    std::vector<std::pair<const Op*, size_t>> message_ops_;
    std::vector<const Op*> local_sends_;  // one-rank communicators: sends waiting for their receive

    size_t chunk_elements(const Op& op) const {
        return std::min(CHUNK_BYTES / type_size(op.type), op.count - begin_);
    }

    void finish(const Op& op) {
        mark_output_written(op);
        op.comm->pending--;
        next_++;
        begin_ = 0;
    }

    // Posts the current chunk's MPI call (one-rank communicators: does its copy). False if it failed.
    bool start_chunk(const Op& op) {
        const int n_ranks = op.comm->nranks, rank = op.comm->rank;
        const size_t size = type_size(op.type), n = chunk_elements(op), bytes = n * size, offset = begin_ * size;
        const char* send = (const char*)op.send;
        scratch_.resize(bytes * n_ranks);
        if (op.kind == Kind::ReduceScatter) {  // send holds n_ranks blocks of count; block j goes to rank j
            packed_.resize(bytes * n_ranks);
            for (int j = 0; j < n_ranks; j++) memcpy(packed_.data() + j * bytes, send + j * op.count * size + offset, bytes);
        }
        if (op.kind == Kind::Broadcast && rank == op.root) memcpy(scratch_.data(), send + offset, bytes);
        if (op.comm->local) {
            if (op.kind == Kind::ReduceScatter) memcpy(scratch_.data(), packed_.data(), bytes);
            if (op.kind != Kind::Broadcast && op.kind != Kind::ReduceScatter) memcpy(scratch_.data(), send + offset, bytes);
            return true;
        }
#ifdef USE_MPI
        MPI_Comm c = op.comm->mpi;
        const int b = (int)bytes;
        switch (op.kind) {
            case Kind::AllReduce:
            case Kind::AllGather:
                return mpi_ok(op, MPI_Iallgather(send + offset, b, MPI_BYTE, scratch_.data(), b, MPI_BYTE, c, &request_),
                              "MPI_Iallgather");
            case Kind::Reduce:
                return mpi_ok(op, MPI_Igather(send + offset, b, MPI_BYTE, scratch_.data(), b, MPI_BYTE, op.root, c, &request_),
                              "MPI_Igather");
            case Kind::ReduceScatter:
                return mpi_ok(op, MPI_Ialltoall(packed_.data(), b, MPI_BYTE, scratch_.data(), b, MPI_BYTE, c, &request_),
                              "MPI_Ialltoall");
            case Kind::Broadcast:
                return mpi_ok(op, MPI_Ibcast(scratch_.data(), b, MPI_BYTE, op.root, c, &request_), "MPI_Ibcast");
            default: break;
        }
#endif
        return false;
    }

    // Whether the current chunk's MPI call has finished (ok: without an error).
    bool chunk_arrived(const Op& op, bool* ok) {
        *ok = true;
        if (op.comm->local) return true;
#ifdef USE_MPI
        int done = 0;
        int rc = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
        static const char* calls[] = {"MPI_Iallgather", "MPI_Igather", "MPI_Ialltoall", "MPI_Iallgather", "MPI_Ibcast"};
        if (!mpi_ok(op, rc, calls[(int)op.kind])) {
            *ok = false;
            return true;
        }
        return done != 0;
#else
        return true;
#endif
    }

    // Combines or copies what the current chunk brought into the op's output.
    void end_chunk(const Op& op) {
        const int n_ranks = op.comm->nranks, rank = op.comm->rank;
        const size_t size = type_size(op.type), n = chunk_elements(op), bytes = n * size, offset = begin_ * size;
        char* recv = (char*)op.recv;
        switch (op.kind) {
            case Kind::AllReduce:
            case Kind::ReduceScatter: reduce_ranks(op.type, recv + offset, scratch_.data(), n, n_ranks, op.red); break;
            case Kind::Reduce:
                if (rank == op.root) reduce_ranks(op.type, recv + offset, scratch_.data(), n, n_ranks, op.red);
                break;
            case Kind::AllGather:  // rank i's count elements go to recv + i * count
                for (int i = 0; i < n_ranks; i++) memcpy(recv + i * op.count * size + offset, scratch_.data() + i * bytes, bytes);
                break;
            case Kind::Broadcast: memcpy(recv + offset, scratch_.data(), bytes); break;
            default: break;
        }
    }

    // Starts a send or a receive: MPI messages of at most P2P_CHUNK_BYTES. On a one-rank communicator
    // a send waits in local_sends_ for the receive of the same group, which copies it.
    void start_message(const Op& op) {
        const size_t bytes = op.count * type_size(op.type);
        if (op.kind == Kind::Send) emu::initcheck_read(op.send, bytes, "ncclSend's sendbuff");
        if (op.comm->local) {
            if (op.kind == Kind::Send) {
                local_sends_.push_back(&op);
                return;
            }
            if (local_sends_.empty()) {
                emu::fail("%s from itself on a one-rank communicator, with no ncclSend to itself before it in the same "
                          "group: it would wait forever", op.name);
            }
            const Op* send = local_sends_.front();
            local_sends_.erase(local_sends_.begin());
            size_t sent = send->count * type_size(send->type);
            if (sent != bytes) {
                nccl_emu::set_comm_error(op.comm, ncclInvalidUsage, "ncclRecv of " + std::to_string(bytes) +
                                         " bytes matched an ncclSend of " + std::to_string(sent) + " bytes (counts and "
                                         "types must agree)");
            } else {
                memcpy(op.recv, send->send, bytes);
            }
            finish_later(op);
            finish_later(*send);
            return;
        }
#ifdef USE_MPI
        op.comm->started = op.seq + 1;
        for (size_t begin = 0; begin < bytes || begin == 0; begin += P2P_CHUNK_BYTES) {
            int n = (int)std::min(P2P_CHUNK_BYTES, bytes - begin);
            MPI_Request request = MPI_REQUEST_NULL;
            int rc = op.kind == Kind::Send
                         ? MPI_Issend((const char*)op.send + begin, n, MPI_BYTE, op.root, P2P_TAG, op.comm->mpi, &request)
                         : MPI_Irecv((char*)op.recv + begin, n, MPI_BYTE, op.root, P2P_TAG, op.comm->mpi, &request);
            if (!mpi_ok(op, rc, op.kind == Kind::Send ? "MPI_Issend" : "MPI_Irecv")) break;
            messages_.push_back(request);
            message_ops_.push_back({&op, (size_t)n});
            if (bytes == 0) break;
        }
#endif
        finish_later(op);
    }

    // Remembers a send or receive whose end waits for the messages.
    void finish_later(const Op& op) { finished_later_.push_back(&op); }
    std::vector<const Op*> finished_later_;

    // Whether every send and receive has arrived; then they are finished (pending, initcheck). A
    // receive of another size than its send breaks the communicator with the sizes.
    bool messages_arrived() {
        if (!local_sends_.empty()) {
            emu::fail("%s to itself on a one-rank communicator, with no ncclRecv from itself after it in the same group: "
                      "it would wait forever", local_sends_.front()->name);
        }
#ifdef USE_MPI
        if (!messages_.empty()) {
            std::vector<MPI_Status> statuses(messages_.size());
            int done = 0;
            int rc = MPI_Testall((int)messages_.size(), messages_.data(), &done, statuses.data());
            if (rc != MPI_SUCCESS) {
                const Op& op = *message_ops_.front().first;
                nccl_emu::set_comm_error(op.comm, ncclRemoteError,
                                         std::string("ncclSend/ncclRecv on rank ") + std::to_string(op.comm->rank) +
                                         " failed: " + mpi_error_text(rc) + " (a send and its receive must agree on "
                                         "count and type)");
                done = 1;
            } else if (done) {
                for (size_t i = 0; i < messages_.size(); i++) {
                    const Op& op = *message_ops_[i].first;
                    int got = 0;
                    MPI_Get_count(&statuses[i], MPI_BYTE, &got);
                    if (op.kind == Kind::Recv && (size_t)got != message_ops_[i].second) {
                        nccl_emu::set_comm_error(op.comm, ncclInvalidUsage,
                                                 "ncclRecv on rank " + std::to_string(op.comm->rank) + " from rank " +
                                                 std::to_string(op.root) + " expected " +
                                                 std::to_string(op.count * type_size(op.type)) + " bytes, and the peer's "
                                                 "ncclSend sent fewer (a send and its receive must agree on count and "
                                                 "type)");
                    }
                }
            }
            if (!done) return false;
            messages_.clear();
        }
#endif
        for (const Op* op : finished_later_) {
            mark_output_written(*op);
            op->comm->pending--;
        }
        finished_later_.clear();
        return true;
    }
};

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
    if (point_to_point(op) && (op.root < 0 || op.root >= n_ranks)) {
        return error(ncclInvalidArgument, "%s: peer = %d, must be in [0, %d)", op.name, op.root, n_ranks);
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
        case Kind::Send: return check_buffer(op, "sendbuff", op.send, op.count);
        case Kind::Recv: return check_buffer(op, "recvbuff", op.recv, op.count);
    }
    return ncclSuccess;
}

// Queues `ops` (all on one stream, numbered in the communicators' order) as one task.
void enqueue(cudaStream_t stream, std::vector<Op> ops, const char* what) {
    for (const Op& op : ops) {
        op.comm->pending++;
        std::lock_guard<std::mutex> lock(op.comm->mutex);
        bool known = false;
        for (cudaStream_t s : op.comm->streams) known = known || s == stream;
        if (!known) op.comm->streams.push_back(stream);
    }
    emu::enqueue_async(stream, what, [ops]() {
        auto transfer = std::make_shared<Transfer>(ops);
        return std::function<bool()>([transfer] { return transfer->advance(); });
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
    Op numbered = op;
    numbered.seq = op.comm->issued++;
    enqueue(op.stream, {numbered}, op.name);
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

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit({Kind::Send, "ncclSend", sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit({Kind::Recv, "ncclRecv", nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream});
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
    for (Op& op : ops) op.seq = op.comm->issued++;  // in call order
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
