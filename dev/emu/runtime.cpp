// The emulator's runtime: device memory, streams, events, errors and device properties.
//
// Streams are lazy. Work queued on a stream (kernels, async copies, NCCL's tasks) does not run when
// it is queued; one emulator device thread runs it when the host waits for something (a synchronous
// copy, cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaFree) or asks about
// it (cudaStreamQuery, cudaEventQuery: these start the device on everything queued and return at
// once, so a host polling loop makes progress). When several streams have work that may run, the
// device picks the most recently created stream first (EMU_STREAM_ORDER=issue: oldest work first),
// which differs from the order of issue: work that lacks an event dependency on another stream runs
// in the "wrong" order and changes the result, as it may on a GPU.
//
// Dependencies are CUDA's: stream order; cudaStreamWaitEvent (waits for the work queued before the
// matching cudaEventRecord); and the legacy default stream, whose work waits for all earlier work on
// blocking streams, and whose earlier work every blocking stream's later work waits for (streams
// made with cudaStreamNonBlocking take no part).
//
// Race checker (EMU_TSAN=1): the device thread runs each stream's work as a ThreadSanitizer fiber of
// its own, and tells TSan CUDA's orderings: a task happens after its stream's earlier tasks and the
// tasks it depends on (events, the legacy default stream); a host wait happens after the tasks it
// waited for; and what the host did before the call that let the device run (a wait or a query)
// happens before the task (a little more than CUDA promises: the host's calls after the launch too).
// Work on two streams with no such order between them is not ordered, so a kernel that reads what
// another stream's kernel writes without an event between them is reported, whichever ran first.
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#ifndef EMU_TSAN
#define EMU_TSAN 0
#endif
#if EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#include <cuda_runtime.h>

#include "internal.h"

using Clock = std::chrono::steady_clock;

struct CUstream_st {
    int id;  // creation order; the legacy default stream is 0
    unsigned flags;
    int priority;
    struct Task {
        unsigned long long seq, issue;
        std::string what;
        std::function<void()> run;
        // work that ends later (enqueue_async): started by `start`, finished when `poll` says so
        std::function<std::function<bool()>()> start;
        std::function<bool()> poll;
        bool in_flight = false;  // started, not finished: the stream's later work waits
        std::vector<std::pair<CUstream_st*, unsigned long long>> after;  // (stream, seq) to wait for
        // EMU_TSAN: tasks it comes after although they were done when it was queued (legacy stream)
        std::vector<std::pair<CUstream_st*, unsigned long long>> ordered_after;
    };
    std::deque<Task> queue;
    unsigned long long enqueued = 0, completed = 0;
    bool destroyed = false;
    // EMU_TSAN: the stream's TSan fiber, and one sync object per task, released when it is done (a
    // deque, so their addresses stay put)
    void* tsan_fiber = nullptr;
    std::deque<char> tsan_sync;
    char* done_sync(unsigned long long seq) { return &tsan_sync[seq - 1]; }
    bool blocking() const { return !(flags & cudaStreamNonBlocking); }
};

struct CUevent_st {
    unsigned flags;
    CUstream_st* stream = nullptr;  // where it was last recorded; nullptr: never recorded
    unsigned long long seq = 0;
    Clock::time_point time;
    bool destroyed = false;
};

namespace emu {

// ----------------------------------------------------------------------------
// errors

namespace {
thread_local cudaError_t last_error = cudaSuccess;
}

cudaError_t set_error(cudaError_t error) {
    if (error != cudaSuccess) last_error = error;
    return error;
}

void fail(const char* fmt, ...) {
    char message[4096];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    fflush(stdout);
    fprintf(stderr, "cuda-emu: %s\n", message);
    fflush(stderr);
    _exit(1);  // other threads may hold locks that exit()'s destructors would need
}

bool env_choice(const char* name, const char* usual, const char* other) {
    const char* env = getenv(name);
    if (env == nullptr || strcmp(env, usual) == 0) return false;
    if (strcmp(env, other) == 0) return true;
    fail("%s must be %s or %s, not '%s'", name, usual, other, env);
}

// ----------------------------------------------------------------------------
// memory

namespace {

struct Allocations {
    std::mutex mutex;
    std::map<uintptr_t, size_t> device, pinned;  // start -> bytes
    size_t device_bytes = 0;
};
Allocations& allocations() {
    static Allocations* a = new Allocations;  // never destroyed: the device thread may outlive main
    return *a;
}

bool inside(const std::map<uintptr_t, size_t>& map, const void* p, size_t bytes) {
    uintptr_t q = (uintptr_t)p;
    auto it = map.upper_bound(q);
    if (it == map.begin()) return false;
    --it;
    // a pointer just past the end of an allocation counts (an empty range at its end)
    return q >= it->first && q - it->first <= it->second && bytes <= it->second - (q - it->first);
}

}  // namespace

bool is_device_pointer(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(allocations().mutex);
    return inside(allocations().device, p, bytes);
}

bool is_pinned_host_pointer(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(allocations().mutex);
    return inside(allocations().pinned, p, bytes);
}

// ----------------------------------------------------------------------------
// the device thread and its streams

namespace {

StreamOrder stream_order_setting() {
    return env_choice("EMU_STREAM_ORDER", "newest", "issue") ? StreamOrder::issue : StreamOrder::newest_stream_first;
}

struct Device {
    std::mutex mutex;
    std::condition_variable work;  // the device thread waits here
    std::condition_variable done;  // host threads wait here for work to complete
    std::vector<CUstream_st*> streams;
    std::vector<CUevent_st*> events;  // destroyed ones stay until their record has run
    CUstream_st legacy{0, cudaStreamDefault, 0, {}, 0, 0, false};
    unsigned long long issued = 0;
    int waiters = 0;        // host threads blocked until something completes
    bool kicked = false;    // a query asked for progress: run everything that can run
    bool running = false;   // a task is running now
    StreamOrder order = stream_order_setting();
    bool started = false;
#if EMU_TSAN
    void* device_fiber = nullptr;
    char host_relay = 0;  // the device thread passes on what it knows of the host (mutex, wait)
#endif

    Device() { streams.push_back(&legacy); }

    static bool ready(const CUstream_st::Task& t) {
        for (auto& [stream, seq] : t.after)
            if (stream->completed < seq) return false;
        return true;
    }

    CUstream_st* pick() {
        CUstream_st* best = nullptr;
        if (order == StreamOrder::newest_stream_first) {
            for (auto it = streams.rbegin(); it != streams.rend(); ++it) {
                CUstream_st* s = *it;
                if (runnable(s)) return s;
            }
            return nullptr;
        }
        for (CUstream_st* s : streams)
            if (runnable(s) && (!best || s->queue.front().issue < best->queue.front().issue)) best = s;
        return best;
    }

    static bool runnable(const CUstream_st* s) {
        return !s->queue.empty() && !s->queue.front().in_flight && ready(s->queue.front());
    }

    bool active() const { return waiters > 0 || kicked; }

    // Streams whose first task is work in flight (enqueue_async): the device asks each, between other
    // tasks, whether it has finished.
    std::vector<CUstream_st*> in_flight;

    void loop() {
        std::unique_lock<std::mutex> lock(mutex);
#if EMU_TSAN
        device_fiber = __tsan_get_current_fiber();
#endif
        for (;;) {
            if (!in_flight.empty()) poll_in_flight(lock);
            CUstream_st* s = nullptr;
            if (in_flight.empty()) {
                work.wait(lock, [&] { return active() && (s = pick()) != nullptr; });
            } else if (!active()) {
                work.wait(lock, [&] { return active(); });
                continue;
            } else if ((s = pick()) == nullptr) {
                // only work in flight: ask it again soon (or as soon as new work or a waiter arrives)
                work.wait_for(lock, std::chrono::microseconds(50));
                continue;
            }
            CUstream_st::Task& task = s->queue.front();
            running = true;
            std::function<void()> run = std::move(task.run);
            std::function<std::function<bool()>()> start = std::move(task.start);
            std::function<bool()> poll;
#if EMU_TSAN
            // the task runs as its stream's fiber, after what queued it and what it waits for
            if (!s->tsan_fiber) {
                s->tsan_fiber = __tsan_create_fiber(0);
                std::string name = s == &legacy ? "the legacy default stream (copies, memsets)"
                                                : "stream " + std::to_string(s->id) + " (copies, memsets)";
                __tsan_set_fiber_name(s->tsan_fiber, name.c_str());
            }
            std::vector<char*> acquire = {&host_relay};
            for (auto* list : {&task.after, &task.ordered_after})
                for (auto& [stream, seq] : *list) acquire.push_back(stream->done_sync(seq));
            char* task_done = s->done_sync(task.seq);
            lock.unlock();
            __tsan_release(&host_relay);
            __tsan_switch_to_fiber(s->tsan_fiber, __tsan_switch_to_fiber_no_sync);
            for (char* sync : acquire) __tsan_acquire(sync);
            if (run) run();
            if (start) poll = start();
            run = nullptr;  // what it captured (a kernel's arguments) is freed by the stream too
            start = nullptr;
            bool finished = !poll || poll();
            if (finished) poll = nullptr;  // its state (a transfer's buffers) too
            if (finished) __tsan_release(task_done);
            __tsan_switch_to_fiber(device_fiber, __tsan_switch_to_fiber_no_sync);
#else
            lock.unlock();
            if (run) run();
            if (start) poll = start();
            run = nullptr;
            bool finished = !poll || poll();
#endif
            lock.lock();
            running = false;
            if (finished) {
                finish_front(s);
            } else {
                s->queue.front().poll = std::move(poll);
                s->queue.front().in_flight = true;
                in_flight.push_back(s);
            }
        }
    }

    // caller holds mutex: the first task of s is done
    void finish_front(CUstream_st* s) {
        s->completed = s->queue.front().seq;
        s->queue.pop_front();
        if (!events.empty()) free_destroyed_events();
        if (pick() == nullptr && in_flight.empty()) kicked = false;
        done.notify_all();
    }

    // caller holds mutex (released while a poll runs): asks each piece of work in flight whether it has
    // finished, and finishes those that have
    void poll_in_flight(std::unique_lock<std::mutex>& lock) {
        for (size_t i = 0; i < in_flight.size();) {
            CUstream_st* s = in_flight[i];
            std::function<bool()>* poll = &s->queue.front().poll;  // a deque's elements stay put
#if EMU_TSAN
            char* task_done = s->done_sync(s->queue.front().seq);
#endif
            lock.unlock();
#if EMU_TSAN
            __tsan_switch_to_fiber(s->tsan_fiber, __tsan_switch_to_fiber_no_sync);
            bool finished = (*poll)();
            if (finished) *poll = nullptr;  // its state is freed by the stream too
            if (finished) __tsan_release(task_done);
            __tsan_switch_to_fiber(device_fiber, __tsan_switch_to_fiber_no_sync);
#else
            bool finished = (*poll)();
#endif
            lock.lock();
            if (finished) {
                in_flight[i] = in_flight.back();
                in_flight.pop_back();
                finish_front(s);
            } else {
                i++;
            }
        }
    }

    // caller holds mutex
    void free_destroyed_events() {
        for (size_t i = 0; i < events.size();) {
            CUevent_st* e = events[i];
            if (e->destroyed && (!e->stream || e->stream->completed >= e->seq)) {
                delete e;
                events[i] = events.back();
                events.pop_back();
            } else {
                i++;
            }
        }
    }

    // caller holds mutex
    void start() {
        if (started) return;
        started = true;
        std::thread([this] { loop(); }).detach();
    }

    // caller holds mutex; blocks until `finished` holds, running the device meanwhile
    template <typename F>
    void wait_until(std::unique_lock<std::mutex>& lock, F finished) {
        if (finished()) return;
        start();
        waiters++;
        work.notify_one();
        done.wait(lock, finished);
        waiters--;
    }

    // caller holds mutex; for the queries: gives the device up to 1 ms to finish before answering
    // "not ready". A host loop that polls a query (llmc/parallel/gpu_start.cuh's dp_wait: every 20 us) then sleeps
    // here instead of waking up tens of thousands of times a second and taking the CPU from the
    // device thread (on 2 cores, or under mpirun's binding to one core, that halved the speed).
    template <typename F>
    bool wait_briefly(std::unique_lock<std::mutex>& lock, F finished) {
        return done.wait_for(lock, std::chrono::milliseconds(1), finished);
    }

    // caller holds mutex; EMU_TSAN: the calling host thread has waited for task `seq` of `s` (and so
    // for its stream's earlier tasks): what they did happens before what the host does next
    void waited_for(CUstream_st* s, unsigned long long seq) {
#if EMU_TSAN
        if (seq > 0) __tsan_acquire(s->done_sync(seq));
#else
        (void)s, (void)seq;
#endif
    }

    CUstream_st* resolve(cudaStream_t stream) {
        if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return &legacy;
        return stream;
    }

    // caller holds mutex
    unsigned long long push(CUstream_st* s, std::string what, std::function<void()> run,
                            std::function<std::function<bool()>()> start = nullptr) {
        CUstream_st::Task t;
        t.seq = ++s->enqueued;
        t.issue = ++issued;
        t.what = std::move(what);
        t.run = std::move(run);
        t.start = std::move(start);
        if (!s->queue.empty()) {
            // stream order is the queue's own; only cross-stream dependencies are listed
        }
        if (s == &legacy) {
            for (CUstream_st* other : streams)
                if (other != &legacy && other->blocking() && other->enqueued > 0)
                    (other->completed < other->enqueued ? t.after : t.ordered_after).emplace_back(other, other->enqueued);
        } else if (s->blocking() && legacy.enqueued > 0) {
            (legacy.completed < legacy.enqueued ? t.after : t.ordered_after).emplace_back(&legacy, legacy.enqueued);
        }
        if (EMU_TSAN) s->tsan_sync.resize(s->enqueued);
        s->queue.push_back(std::move(t));
        return s->enqueued;
    }
};

Device& device() {
    static Device* d = new Device;  // never destroyed: its thread runs until the process ends
    return *d;
}

}  // namespace

void enqueue_named(cudaStream_t stream, std::string what, std::function<void()> task) {
    Device& d = device();
    std::lock_guard<std::mutex> lock(d.mutex);
    CUstream_st* s = d.resolve(stream);
    if (s->destroyed) fail("%s queued on a destroyed stream", what.c_str());
    d.push(s, std::move(what), std::move(task));
}

void enqueue(cudaStream_t stream, const char* what, std::function<void()> task) {
    enqueue_named(stream, what ? what : "task", std::move(task));
}

void enqueue_async(cudaStream_t stream, const char* what, std::function<std::function<bool()>()> start) {
    Device& d = device();
    std::lock_guard<std::mutex> lock(d.mutex);
    CUstream_st* s = d.resolve(stream);
    if (s->destroyed) fail("%s queued on a destroyed stream", what ? what : "work");
    d.push(s, what ? what : "work", nullptr, std::move(start));
}

void set_stream_order(StreamOrder order) {
    Device& d = device();
    std::lock_guard<std::mutex> lock(d.mutex);
    d.order = order;
}

namespace {

// queue `run` on `stream` and wait for it (synchronous copies)
void run_and_wait(cudaStream_t stream, const char* what, std::function<void()> run) {
    Device& d = device();
    std::unique_lock<std::mutex> lock(d.mutex);
    CUstream_st* s = d.resolve(stream);
    unsigned long long seq = d.push(s, what, std::move(run));
    d.wait_until(lock, [&] { return s->completed >= seq; });
    d.waited_for(s, seq);
}

void synchronize_device() {
    Device& d = device();
    std::unique_lock<std::mutex> lock(d.mutex);
    d.wait_until(lock, [&] {
        for (CUstream_st* s : d.streams)
            if (s->completed < s->enqueued) return false;
        return true;
    });
    for (CUstream_st* s : d.streams) d.waited_for(s, s->enqueued);
}

}  // namespace

}  // namespace emu

using emu::set_error;

// ----------------------------------------------------------------------------
// errors

const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInitializationError: return "cudaErrorInitializationError";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
        case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorNotSupported: return "cudaErrorNotSupported";
        default: return "cudaErrorUnknown";
    }
}

// the texts of NVIDIA's runtime
const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInitializationError: return "initialization error";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidPitchValue: return "invalid pitch argument";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorNotSupported: return "operation not supported";
        default: return "unknown error";
    }
}

// Launch-configuration errors are not sticky: reading them resets them (all our errors are of that kind;
// a fault inside a kernel ends the emulated program with a message instead).
cudaError_t cudaGetLastError() {
    cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return emu::last_error; }

// ----------------------------------------------------------------------------
// device

namespace {
int device_count() {
    const char* env = getenv("EMU_DEVICE_COUNT");
    int n = env ? atoi(env) : 1;
    if (n < 0 || n > 64) emu::fail("EMU_DEVICE_COUNT must be between 0 and 64, not '%s'", env);
    return n;
}
thread_local int current_device = 0;
}  // namespace

size_t emu::device_memory_bytes() {
    static const size_t bytes = [] {
        const char* env = getenv("EMU_DEVICE_MEMORY");
        if (!env || !*env) return H100.global_memory;
        char* end = nullptr;
        double value = strtod(env, &end);
        double unit = 1;
        if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
        else if (*end == 'M' || *end == 'm') unit = 1048576.0, end++;
        else if (*end == 'G' || *end == 'g') unit = 1073741824.0, end++;
        if (end == env || *end != '\0' || !(value > 0) || value * unit > 1e15) {
            emu::fail("EMU_DEVICE_MEMORY must be a size in bytes, optionally with K, M or G (e.g. 24G), not '%s'", env);
        }
        return (size_t)(value * unit);
    }();
    return bytes;
}

cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return set_error(cudaErrorInvalidValue);
    *count = device_count();
    if (*count == 0) return set_error(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return set_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    if (!device) return set_error(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop) return set_error(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return set_error(cudaErrorInvalidDevice);
    const emu::DeviceLimits& h = emu::H100;
    *prop = cudaDeviceProp{};
    // no GPU model in the name: the trainer's MFU table must not mistake the emulator for one
    snprintf(prop->name, sizeof(prop->name), "CUDA emulator (sm_90 limits, on the CPU)");
    prop->totalGlobalMem = emu::device_memory_bytes();
    prop->sharedMemPerBlock = h.max_shared_per_block;
    prop->sharedMemPerBlockOptin = h.max_shared_per_block_optin;
    prop->sharedMemPerMultiprocessor = h.shared_per_sm;
    prop->reservedSharedMemPerBlock = 1024;
    prop->regsPerBlock = h.registers_per_block;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = 2147483647;
    prop->maxThreadsPerBlock = h.max_threads_per_block;
    prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
    prop->clockRate = 1980000;
    prop->totalConstMem = 65536;
    // EMU_COMPUTE_CAPABILITY=8.0 (say): the version reported, for a program's refusals of older GPUs; the
    // limits above and the arithmetic stay sm_90's
    prop->major = 9;
    prop->minor = 0;
    if (const char* cc = getenv("EMU_COMPUTE_CAPABILITY")) {
        if (sscanf(cc, "%d.%d", &prop->major, &prop->minor) != 2 || prop->major < 1 || prop->minor < 0) {
            emu::fail("EMU_COMPUTE_CAPABILITY must be MAJOR.MINOR (e.g. 8.0), not '%s'", cc);
        }
    }
    prop->textureAlignment = 512;
    prop->multiProcessorCount = h.multiprocessors;
    prop->concurrentKernels = 1;
    prop->asyncEngineCount = 3;
    prop->unifiedAddressing = 1;
    prop->memoryClockRate = 2619000;
    prop->memoryBusWidth = 5120;
    prop->l2CacheSize = h.l2_bytes;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->streamPrioritiesSupported = 1;
    prop->globalL1CacheSupported = 1;
    prop->localL1CacheSupported = 1;
    prop->managedMemory = 1;
    prop->cooperativeLaunch = 1;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->pciBusID = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess || !value) return set_error(e != cudaSuccess ? e : cudaErrorInvalidValue);
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
        case cudaDevAttrWarpSize: *value = p.warpSize; break;
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
        default: return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
    emu::synchronize_device();
    return cudaSuccess;
}

cudaError_t cudaDeviceReset() {
    emu::synchronize_device();
    return cudaSuccess;
}

// CUDA's convention: numerically lower is higher priority
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    std::lock_guard<std::mutex> lock(emu::allocations().mutex);
    size_t used = emu::allocations().device_bytes;
    size_t total = emu::device_memory_bytes();
    if (total_bytes) *total_bytes = total;
    if (free_bytes) *free_bytes = used < total ? total - used : 0;
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// memory

namespace {

// pinned host memory: 256-byte aligned, filled with 0xFF bytes like device memory (device_memory.cpp)
void* allocate_pinned(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return nullptr;
    memset(p, 0xFF, bytes);
    return p;
}

}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    if (!ptr) return set_error(cudaErrorInvalidValue);
    auto& a = emu::allocations();
    {
        std::lock_guard<std::mutex> lock(a.mutex);
        if (a.device_bytes + bytes > emu::device_memory_bytes()) return set_error(cudaErrorMemoryAllocation);
    }
    void* p = emu::device_memory_allocate(bytes);
    if (!p) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lock(a.mutex);
    a.device[(uintptr_t)p] = bytes;
    a.device_bytes += bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (!ptr) return cudaSuccess;
    emu::synchronize_device();  // as on a GPU, cudaFree waits for the device
    auto& a = emu::allocations();
    size_t bytes;
    {
        std::lock_guard<std::mutex> lock(a.mutex);
        auto it = a.device.find((uintptr_t)ptr);
        if (it == a.device.end()) return set_error(cudaErrorInvalidValue);
        bytes = it->second;
        a.device_bytes -= bytes;
        a.device.erase(it);
    }
    emu::device_memory_free(ptr, bytes);  // a use after free reads NaN (ASan builds report it)
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
    if (!ptr) return set_error(cudaErrorInvalidValue);
    void* p = allocate_pinned(bytes);
    if (!p) return set_error(cudaErrorMemoryAllocation);
    auto& a = emu::allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    a.pinned[(uintptr_t)p] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
    if (!ptr) return cudaSuccess;
    emu::synchronize_device();
    auto& a = emu::allocations();
    {
        std::lock_guard<std::mutex> lock(a.mutex);
        auto it = a.pinned.find((uintptr_t)ptr);
        if (it == a.pinned.end()) return set_error(cudaErrorInvalidValue);
        a.pinned.erase(it);
    }
    free(ptr);
    return cudaSuccess;
}

namespace {

// checks that the device side(s) of a copy lie inside device memory; resolves cudaMemcpyDefault
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind& kind) {
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    if (kind == cudaMemcpyDefault) {
        bool d = emu::is_device_pointer(dst, bytes), s = emu::is_device_pointer(src, bytes);
        kind = s ? (d ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost) : (d ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    }
    switch (kind) {
        case cudaMemcpyHostToHost: return cudaSuccess;
        case cudaMemcpyHostToDevice: return emu::is_device_pointer(dst, bytes) ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDeviceToHost: return emu::is_device_pointer(src, bytes) ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDeviceToDevice:
            return emu::is_device_pointer(dst, bytes) && emu::is_device_pointer(src, bytes) ? cudaSuccess : cudaErrorInvalidValue;
        default: return cudaErrorInvalidMemcpyDirection;
    }
}

}  // namespace

// On the legacy default stream, waiting for it (and so for all blocking streams' earlier work).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) return set_error(e);
    if (bytes == 0) return cudaSuccess;
    emu::run_and_wait(nullptr, "cudaMemcpy", [=] { emu::device_memory_copy(dst, src, bytes); });
    return cudaSuccess;
}

// As the CUDA documentation describes for pageable host memory: a copy from it is staged at the call
// (the caller may reuse the buffer at once), a copy into it returns only when done. Pinned memory is
// read and written when the copy runs on the stream.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) return set_error(e);
    if (bytes == 0) return cudaSuccess;
    bool from_pageable = (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost) && !emu::is_pinned_host_pointer(src, bytes);
    bool to_pageable = (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost) && !emu::is_pinned_host_pointer(dst, bytes);
    if (from_pageable) {
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char*)src, (const unsigned char*)src + bytes);
        if (to_pageable) {
            emu::run_and_wait(stream, "cudaMemcpyAsync", [=] { emu::device_memory_copy(dst, staged->data(), bytes); });
        } else {
            emu::enqueue(stream, "cudaMemcpyAsync", [=] { emu::device_memory_copy(dst, staged->data(), bytes); });
        }
    } else if (to_pageable) {
        emu::run_and_wait(stream, "cudaMemcpyAsync", [=] { emu::device_memory_copy(dst, src, bytes); });
    } else {
        emu::enqueue(stream, "cudaMemcpyAsync", [=] { emu::device_memory_copy(dst, src, bytes); });
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return cudaSuccess;
    if (!emu::is_device_pointer(ptr, bytes)) return set_error(cudaErrorInvalidValue);
    emu::enqueue(stream, "cudaMemset", [=] { emu::device_memory_set(ptr, value, bytes); });
    return cudaSuccess;
}

// asynchronous with respect to the host for device memory (CUDA Runtime API, "API synchronization behavior")
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) { return cudaMemsetAsync(ptr, value, bytes, nullptr); }

// ----------------------------------------------------------------------------
// streams

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
    if (!stream || (flags & ~cudaStreamNonBlocking)) return set_error(cudaErrorInvalidValue);
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    CUstream_st* s = new CUstream_st{(int)d.streams.size(), flags, priority, {}, 0, 0, false};
    d.streams.push_back(s);
    *stream = s;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    return cudaStreamCreateWithPriority(stream, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0); }

// Work already queued still runs (CUDA: resources are released once the device has finished).
// The stream object stays allocated, since events and tasks may refer to it.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (stream == nullptr || stream->destroyed) return set_error(cudaErrorInvalidResourceHandle);
    stream->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    emu::Device& d = emu::device();
    std::unique_lock<std::mutex> lock(d.mutex);
    CUstream_st* s = d.resolve(stream);
    unsigned long long target = s->enqueued;
    d.wait_until(lock, [&] { return s->completed >= target; });
    d.waited_for(s, target);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    emu::Device& d = emu::device();
    std::unique_lock<std::mutex> lock(d.mutex);
    CUstream_st* s = d.resolve(stream);
    unsigned long long target = s->enqueued;
    if (s->completed < target) {
        d.start();
        d.kicked = true;
        d.work.notify_one();
        if (!d.wait_briefly(lock, [&] { return s->completed >= target; })) return cudaErrorNotReady;
    }
    d.waited_for(s, target);
    return cudaSuccess;  // not an error to record: cudaGetLastError stays as it was
}

// ----------------------------------------------------------------------------
// events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    if (!event) return set_error(cudaErrorInvalidValue);
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    *event = new CUevent_st{flags, nullptr, 0, Clock::time_point{}, false};
    d.events.push_back(*event);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event || event->destroyed) return set_error(cudaErrorInvalidResourceHandle);
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    CUstream_st* s = d.resolve(stream);
    event->stream = s;
    event->seq = d.push(s, "cudaEventRecord", [event] { event->time = Clock::now(); });
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event || event->destroyed) return set_error(cudaErrorInvalidResourceHandle);
    emu::Device& d = emu::device();
    std::unique_lock<std::mutex> lock(d.mutex);
    if (!event->stream) return cudaSuccess;  // never recorded: nothing to wait for
    CUstream_st* s = event->stream;
    unsigned long long seq = event->seq;
    d.wait_until(lock, [&] { return s->completed >= seq; });
    d.waited_for(s, seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event || event->destroyed) return set_error(cudaErrorInvalidResourceHandle);
    emu::Device& d = emu::device();
    std::unique_lock<std::mutex> lock(d.mutex);
    if (!event->stream) return cudaSuccess;
    CUstream_st* s = event->stream;
    unsigned long long seq = event->seq;
    if (s->completed < seq) {
        d.start();
        d.kicked = true;
        d.work.notify_one();
        if (!d.wait_briefly(lock, [&] { return s->completed >= seq; })) return cudaErrorNotReady;
    }
    d.waited_for(s, seq);
    return cudaSuccess;
}

// host wall-clock time between the moments the device reached the two events
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return set_error(cudaErrorInvalidValue);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return set_error(cudaErrorInvalidResourceHandle);
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (!start->stream || !end->stream) return set_error(cudaErrorInvalidResourceHandle);
    if (start->stream->completed < start->seq || end->stream->completed < end->seq) return set_error(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
    return cudaSuccess;
}

// An event whose record has not run yet stays allocated until it has (the record writes its time).
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (!event || event->destroyed) return set_error(cudaErrorInvalidResourceHandle);
    event->destroyed = true;
    d.free_destroyed_events();
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!event || event->destroyed) return set_error(cudaErrorInvalidResourceHandle);
    emu::Device& d = emu::device();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (!event->stream) return cudaSuccess;  // an event never recorded is complete
    CUstream_st* s = d.resolve(stream);
    CUstream_st* on = event->stream;
    unsigned long long seq = event->seq;
    d.push(s, "cudaStreamWaitEvent", [] {});
    s->queue.back().after.emplace_back(on, seq);
    return cudaSuccess;
}
