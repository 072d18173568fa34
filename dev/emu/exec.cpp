// The emulator's execution engine: runs a kernel's grid on the CPU, one fiber per CUDA thread.
//
// A block runs on one host thread. Each of its CUDA threads is a fiber (Boost.Context's fcontext:
// a stack switch in user space, no system call) that runs until it reaches __syncthreads, a warp
// collective or its end, and then switches back to the block's scheduler. The scheduler sweeps the
// threads in a fixed order (forward, or reverse with EMU_THREAD_ORDER=reverse), so code that forgets
// a __syncthreads reads different values in the two orders. Fibers and their stacks are made once per
// host thread and reused for every block and launch.
//
// __syncthreads: the barrier opens when every thread of the block that has not exited is waiting at
// it. Threads that have exited count as arrived, as on the hardware since Volta (a block whose threads
// `return` early and then sync is common and correct); a barrier that can never open (threads waiting
// at a barrier while others wait in a warp collective) is reported as a deadlock.
// Warp collectives: a lane waits until every lane named in the mask has called the same collective;
// then every result is computed at once from the values all lanes gave, and the lanes resume. A lane
// named in the mask that has exited, or is stuck elsewhere, is an error, never a hang.
//
// Launches are checked against an H100's limits when they are made (launch_check); registers per
// thread come from the ptxas table of the real sm_90 build (set_kernel_resources).
//
// Race checking (EMU_TSAN=1, dev/emu/README.md): the kernels are compiled with -fsanitize=thread and
// every CUDA thread is a ThreadSanitizer fiber with its own stack. TSan sees no order between the fibers
// except what this file tells it: what the launch's stream had done (runtime.cpp) happens before its
// threads run; everything a thread did before a __syncthreads happens before what any thread of its
// block does after it; likewise for the lanes of a warp collective; every thread's end happens before
// the stream's next work. Blocks are not ordered among themselves: a block's threads take the next
// fibers of a pool, and before each block its shared memory is mapped afresh and its sync objects'
// page unmapped and mapped again, so TSan forgets what the previous block did there. Two accesses to
// one address, at least one a write and not both atomic, with no such order between them are
// reported as a data race. This file is not instrumented, and the scheduler runs with TSan ignoring
// its accesses: the emulator's own bookkeeping between fibers is invisible to TSan.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fiber_switch.h"

#include <cuda_runtime.h>

#include "internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#ifndef EMU_TSAN
#define EMU_TSAN 0
#endif
#if EMU_TSAN
#include <sanitizer/tsan_interface.h>
// exported by GCC's libtsan but declared in no header: ignoring accesses, a write of a range (what the
// instrumentation calls) and a read of one, and reading a report (tsan_debugging.cpp in the sanitizer sources)
extern "C" {
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();
void __tsan_write_range(void* address, unsigned long size);
void __tsan_read_range(void* address, unsigned long size);
int __tsan_get_report_data(void* report, const char** description, int* count, int* stack_count, int* mop_count,
                           int* loc_count, int* mutex_count, int* thread_count, int* unique_tid_count, void** sleep_trace,
                           uintptr_t trace_size);
int __tsan_get_report_mop(void* report, uintptr_t idx, int* tid, void** addr, int* size, int* write, int* atomic,
                          void** trace, uintptr_t trace_size);
int __tsan_get_report_thread(void* report, uintptr_t idx, int* tid, uint64_t* os_id, int* running, const char** name,
                             int* parent_tid, void** trace, uintptr_t trace_size);
}
#endif

__thread uint3 threadIdx;
__thread uint3 blockIdx;
__thread dim3 blockDim;
__thread dim3 gridDim;

namespace emu {

// ----------------------------------------------------------------------------
// kernels: names, resources, attributes

namespace {

struct KernelInfo {
    std::string mangled;   // empty when the symbol could not be found
    std::string readable;  // demangled, or the address
    int registers = -1;    // from the ptxas table; -1: unknown
    int static_shared = 0;
    int max_threads = 0;  // __launch_bounds__; 0: none
    int max_dynamic_shared = -1;  // cudaFuncAttributeMaxDynamicSharedMemorySize; -1: not set
    bool warned_registers = false;
};

struct Resources {
    int registers, static_shared, max_threads;
};

std::recursive_mutex kernels_mutex;  // launch_check names the kernel while holding it
std::unordered_map<const void*, KernelInfo>& kernels() {
    static std::unordered_map<const void*, KernelInfo> map;
    return map;
}
std::unordered_map<std::string, Resources>& resource_table() {
    static std::unordered_map<std::string, Resources> table;
    return table;
}

// caller holds kernels_mutex
KernelInfo& kernel_info(const void* kernel) {
    auto it = kernels().find(kernel);
    if (it != kernels().end()) return it->second;
    KernelInfo info;
    Dl_info dl;
    if (dladdr(kernel, &dl) && dl.dli_sname && dl.dli_saddr == kernel) {
        info.mangled = dl.dli_sname;
        int status = 0;
        char* readable = abi::__cxa_demangle(dl.dli_sname, nullptr, nullptr, &status);
        info.readable = status == 0 && readable ? readable : dl.dli_sname;
        free(readable);
        auto r = resource_table().find(info.mangled);
        if (r != resource_table().end()) {
            info.registers = r->second.registers;
            info.static_shared = r->second.static_shared;
            info.max_threads = r->second.max_threads;
        }
    } else {
        char address[64];
        snprintf(address, sizeof(address), "kernel at %p (link with -rdynamic to see its name)", kernel);
        info.readable = address;
    }
    return kernels().emplace(kernel, info).first->second;
}

}  // namespace

void set_kernel_resources(const char* mangled_name, int registers, int static_shared_bytes, int max_threads_per_block) {
    std::lock_guard<std::recursive_mutex> lock(kernels_mutex);
    resource_table()[mangled_name] = Resources{registers, static_shared_bytes, max_threads_per_block};
    for (auto& [kernel, info] : kernels()) {
        if (info.mangled == mangled_name) {
            info.registers = registers;
            info.static_shared = static_shared_bytes;
            info.max_threads = max_threads_per_block;
        }
    }
}

std::string kernel_name(const void* kernel) {
    std::lock_guard<std::recursive_mutex> lock(kernels_mutex);
    return kernel_info(kernel).readable;
}

}  // namespace emu

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    std::lock_guard<std::recursive_mutex> lock(emu::kernels_mutex);
    emu::KernelInfo& info = emu::kernel_info(func);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value + info.static_shared > emu::H100.max_shared_per_block_optin)
            return emu::set_error(cudaErrorInvalidValue);
        info.max_dynamic_shared = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return emu::set_error(cudaErrorInvalidValue);
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
    if (!attr) return emu::set_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(emu::kernels_mutex);
    emu::KernelInfo& info = emu::kernel_info(func);
    *attr = cudaFuncAttributes{};
    attr->sharedSizeBytes = info.static_shared;
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = info.registers < 0 ? 0 : info.registers;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = info.max_dynamic_shared >= 0 ? info.max_dynamic_shared : 48 * 1024 - info.static_shared;
    return cudaSuccess;
}

namespace emu {

// ----------------------------------------------------------------------------
// launch checks: what a real launch on an H100 refuses

bool launch_check(const void* kernel, const LaunchConfig& c) {
    auto refuse = [&](cudaError_t error, const char* fmt, ...) {
        char reason[512];
        va_list args;
        va_start(args, fmt);
        vsnprintf(reason, sizeof(reason), fmt, args);
        va_end(args);
        if (getenv("EMU_QUIET_LAUNCH_ERRORS") == nullptr)
            fprintf(stderr, "cuda-emu: launch of %s refused: %s\n", kernel_name(kernel).c_str(), reason);
        set_error(error);
        return false;
    };
    const DeviceLimits& h = H100;
    const dim3 b = c.block, g = c.grid;
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0)
        return refuse(cudaErrorInvalidConfiguration, "grid (%u,%u,%u) or block (%u,%u,%u) has a zero dimension", g.x, g.y,
                      g.z, b.x, b.y, b.z);
    if (b.x > 1024 || b.y > 1024 || b.z > 64 || threads > (unsigned long long)h.max_threads_per_block)
        return refuse(cudaErrorInvalidConfiguration, "block (%u,%u,%u) = %llu threads; at most 1024 threads and (1024,1024,64)",
                      b.x, b.y, b.z, threads);
    if (g.x > 2147483647u || g.y > 65535u || g.z > 65535u)
        return refuse(cudaErrorInvalidConfiguration, "grid (%u,%u,%u) above (2^31-1, 65535, 65535)", g.x, g.y, g.z);

    std::unique_lock<std::recursive_mutex> lock(kernels_mutex);
    KernelInfo& info = kernel_info(kernel);
    if (info.max_threads > 0 && threads > (unsigned long long)info.max_threads)
        return refuse(cudaErrorLaunchOutOfResources, "%llu threads per block, above the kernel's __launch_bounds__ of %d",
                      threads, info.max_threads);
    // without the attribute, static + dynamic shared memory must fit in the default 48 KiB
    size_t dynamic_limit = info.max_dynamic_shared >= 0 ? (size_t)info.max_dynamic_shared
                           : info.static_shared < h.max_shared_per_block ? (size_t)(h.max_shared_per_block - info.static_shared) : 0;
    if (c.shared_bytes > dynamic_limit)
        return refuse(cudaErrorInvalidConfiguration,
                      "%zu bytes of dynamic shared memory (and %d static), above the kernel's limit of %zu dynamic (raise it "
                      "with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize), to at most %d minus the static part)",
                      c.shared_bytes, info.static_shared, dynamic_limit, h.max_shared_per_block_optin);
    if (c.shared_bytes + info.static_shared > (size_t)h.max_shared_per_block_optin)
        return refuse(cudaErrorInvalidConfiguration, "%d static + %zu dynamic bytes of shared memory, above %d",
                      info.static_shared, c.shared_bytes, h.max_shared_per_block_optin);
    if (info.registers < 0) {
        static const bool warn = getenv("EMU_REGISTER_WARNINGS") == nullptr || strcmp(getenv("EMU_REGISTER_WARNINGS"), "0") != 0;
        if (warn && !info.warned_registers) {
            info.warned_registers = true;
            fprintf(stderr,
                    "cuda-emu: warning: no ptxas register count for %s; its registers-per-block limit is not checked\n",
                    info.readable.c_str());
        }
    } else {
        // registers are allocated per warp in units of 256 (sm_90)
        long per_warp = ((long)info.registers * 32 + 255) / 256 * 256;
        long warps = (long)((threads + 31) / 32);
        if (per_warp * warps > h.registers_per_block)
            return refuse(cudaErrorLaunchOutOfResources, "%d registers per thread x %llu threads need %ld registers, above %d",
                          info.registers, threads, per_warp * warps, h.registers_per_block);
    }
    return true;
}

void check_pointer_argument(const void* kernel, int index, const void* pointer) {
    if (is_device_pointer(pointer, 0) || is_pinned_host_pointer(pointer, 0)) return;
    fail("kernel %s argument %d is a host pointer (%p), neither from cudaMalloc nor cudaMallocHost; the GPU would "
         "fault on it",
         kernel_name(kernel).c_str(), index, pointer);
}

void refuse_integer_for_pointer(const void* kernel, int index, long long value) {
    fail("kernel %s argument %d is the integer %lld for a pointer parameter (only NULL or 0 converts)",
         kernel_name(kernel).c_str(), index, value);
}

// ----------------------------------------------------------------------------
// fibers

namespace {

ThreadOrder thread_order_setting() {
    return env_choice("EMU_THREAD_ORDER", "forward", "reverse") ? ThreadOrder::reverse : ThreadOrder::forward;
}
std::atomic<ThreadOrder> thread_order{thread_order_setting()};

// EMU_TSAN: fibers (TSan threads) a host thread's blocks take in turn; twice the largest block, so
// two consecutive blocks never share one
constexpr int tsan_fiber_pool = 2048;

size_t fiber_stack_bytes() {
    const char* env = getenv("EMU_STACK_KB");
    if (env) return (size_t)atol(env) * 1024;
    // ASan's redzones make frames several times larger; TSan prints its reports on the fiber's stack
    return EMU_ASAN || EMU_TSAN ? 256 * 1024 : 64 * 1024;
}

// A CUDA thread's state in the block being run. A thread gets a fiber when it starts; a fiber whose
// thread ends goes straight on with the next thread in the sweep if that one has not started, so
// kernels without synchronization run a whole block on one fiber with no switch per thread.
enum class ThreadState : uint8_t { not_started, runnable, running, at_barrier, at_warp, done };

struct Fiber {
    emu_fiber::Context context = nullptr;  // where it resumes
    char* stack_bottom = nullptr;
    size_t stack_bytes = 0;
    void* asan_fake_stack = nullptr;
    void* tsan_fiber = nullptr;  // EMU_TSAN: the TSan context of the CUDA thread this fiber runs
    // EMU_TSAN: the windows of the cp.async copies its threads issue (race_check_copy_issue), created
    // when first needed: TSan contexts of their own, each holding the clock of a copy's issue
    void* tsan_copy[4] = {};
};
constexpr int copy_windows = 4;

// EMU_TSAN: a warp's collectives with one mask release into and acquire from a pair of TSan sync
// objects (addresses in Worker::sync_page). Consecutive collectives alternate between the two: every
// lane of instance k releases into object k % 2 before any lane acquires it, and no lane can release
// for instance k + 2 before all have acquired instance k (instance k + 1 needs them all), so a lane
// never acquires what another did after the collective. __syncthreads does the same with pair 0.
struct WarpSync {
    unsigned mask;
    unsigned completed;
    int pair;  // index of its pair of objects in sync_page
};

struct ThreadSlot {
    ThreadState state;
    int fiber;  // -1: none
    uint3 index;  // threadIdx
    // EMU_TSAN: the fence patterns (race_check_fence): has the thread passed a __threadfence, and the
    // address of its latest atomic
    bool fenced;
    const void* last_atomic;
    // EMU_TSAN: the thread's count of synchronizations that may have moved its clock (barriers, warp
    // collectives, fences), and its open cp.async window: Fiber::tsan_copy[window], opened at count
    // window_syncs; window_count counts the windows it opened (the next one is that modulo copy_windows)
    unsigned syncs;
    int window;
    unsigned window_syncs, window_count;
    const char* window_kind;  // what its accesses are called in a report ("cp.async", "wgmma.mma_async")
};

// one lane's part in a warp collective
struct LaneSlot {
    WarpOp op;
    const char* name;
    unsigned mask;
    int arg, width;
    uint64_t value, result;
};

struct Worker {
    std::vector<Fiber> fibers;
    std::vector<int> free_fibers;
    std::vector<ThreadSlot> threads_of_block;  // [thread]
    std::vector<LaneSlot> lanes;               // [thread]
    std::vector<unsigned> warp_arrived;        // [warp]: lanes waiting in a collective
    emu_fiber::Context scheduler = nullptr;
    int current_thread = -1;  // -1: not inside a kernel
    int current_fiber = -1;
    int switched_from = -1;  // the fiber that made the latest switch (-1: the scheduler)
    const void* scheduler_stack_bottom = nullptr;
    size_t scheduler_stack_bytes = 0;
    void* scheduler_fake_stack = nullptr;
    // the block being run
    void (*run_thread)(void*) = nullptr;
    void* args = nullptr;
    const void* kernel = nullptr;
    int threads = 0;
    bool reverse = false;
    int sweep = 0;  // position in the current sweep over the threads
    int runnable = 0, at_barrier = 0, at_warp = 0, live = 0;
    dim3 indexed_block{0, 0, 0};  // the blockDim that threads_of_block[].index was computed for
    // dynamic shared memory, 1024-byte aligned: in dynamic_storage, or with EMU_TSAN a mapped region
    char* dynamic_shared = nullptr;
    size_t dynamic_shared_bytes = 0;
    std::vector<uint4> dynamic_storage;
    // counts the blocks this host thread has started (from 1): a static __shared__ variable whose note
    // differs has not been filled with 0xFF yet in this block (shared_declared)
    unsigned long long block_serial = 0;
    std::vector<std::pair<const char*, size_t>> static_shared;  // every static __shared__ variable seen
    // EMU_TSAN: the static __shared__ variables live in a mapped region (shared_declared), so that the
    // block's shared memory can be mapped afresh
    char* static_arena = nullptr;
    size_t static_arena_used = 0;
    // EMU_TSAN: the TSan context the scheduler runs in (the launch's stream, runtime.cpp); the objects
    // that order a launch's start before its threads and their ends before the stream's next work; the
    // block's first fiber in the pool
    // (a block's threads take the next blockDim fibers, round the pool, so consecutive blocks are
    // different TSan threads); the page whose addresses are the block's barrier and warp-collective
    // sync objects, unmapped and mapped again for every block, which makes TSan drop them (a block
    // must not acquire what an earlier block released)
    void* tsan_host = nullptr;
    std::string kernel_label;  // the kernel's short name, for the fibers' names in reports
    char launch_start_sync = 0, threads_end_sync = 0;
    int first_fiber = 0;
    char* sync_page = nullptr;
    unsigned barriers_opened = 0;
    int sync_pairs_used = 1;  // pair 0: __syncthreads
    std::vector<WarpSync> warp_sync[32];  // [warp]: one entry per mask used in this block

    int thread_at(int position) const { return reverse ? threads - 1 - position : position; }
};

thread_local Worker* this_worker = nullptr;

Worker& worker() {
    if (this_worker == nullptr) {
        this_worker = new Worker;  // lives as long as its host thread; fibers are never torn down
        this_worker->fibers.reserve(1024);
        this_worker->threads_of_block.resize(1024);
        this_worker->lanes.resize(1024);
        this_worker->warp_arrived.resize(32);
    }
    return *this_worker;
}

// EMU_TSAN: tell ThreadSanitizer which CUDA thread runs now, and what orders what
inline void tsan_switch(void* fiber) {
#if EMU_TSAN
    __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
#else
    (void)fiber;
#endif
}
inline void tsan_release(void* sync) {
#if EMU_TSAN
    __tsan_release(sync);
#else
    (void)sync;
#endif
}
inline void tsan_acquire(void* sync) {
#if EMU_TSAN
    __tsan_acquire(sync);
#else
    (void)sync;
#endif
}

inline void asan_start(void** fake_stack_save, const void* bottom, size_t bytes) {
#if EMU_ASAN
    __sanitizer_start_switch_fiber(fake_stack_save, bottom, bytes);
#else
    (void)fake_stack_save, (void)bottom, (void)bytes;
#endif
}
inline void asan_finish(void* fake_stack_save, const void** bottom_old, size_t* bytes_old) {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, bytes_old);
#else
    (void)fake_stack_save, (void)bottom_old, (void)bytes_old;
#endif
}

// The switches. A block's scheduler (run_block, on the host thread's stack) starts a sweep over the
// block's threads; from then on each fiber, when its thread waits (a barrier, a warp collective) or
// ends, does the scheduler's part itself: records where its thread stopped (note_arrival), picks the
// next thread of the sweep that can run and switches straight to that thread's fiber. Only at the end
// of a sweep does it switch back to the scheduler, which opens a barrier, starts the next sweep or ends
// the block. One switch per waiting thread instead of two (to the scheduler and out again): the
// emulator spends much of its time switching (a warp collective is 32 fibers waiting in turn).

// after a switch into fiber (or scheduler) `self`: keeps where the one that switched here resumes
void arrived(Worker& w, int self, emu_fiber::Transfer t) {
    int from = w.switched_from;
    void* fake_stack = self < 0 ? w.scheduler_fake_stack : w.fibers[self].asan_fake_stack;
    if (from < 0) {  // from the scheduler: its stack's bounds, which only the switch tells
        asan_finish(fake_stack, &w.scheduler_stack_bottom, &w.scheduler_stack_bytes);
        w.scheduler = t.fctx;
    } else {
        asan_finish(fake_stack, nullptr, nullptr);
        w.fibers[from].context = t.fctx;
    }
}

// switches from fiber `from` (-1: the scheduler) to fiber `to` (-1: the scheduler); returns when some
// fiber or the scheduler switches back to `from`
void switch_fibers(Worker& w, int from, int to) {
    void** fake_stack = from < 0 ? &w.scheduler_fake_stack : &w.fibers[from].asan_fake_stack;
    emu_fiber::Context target;
    if (to < 0) {
        asan_start(fake_stack, w.scheduler_stack_bottom, w.scheduler_stack_bytes);
        tsan_switch(w.tsan_host);
        target = w.scheduler;
    } else {
        Fiber& f = w.fibers[to];
        asan_start(fake_stack, f.stack_bottom, f.stack_bytes);
        tsan_switch(f.tsan_fiber);
        target = f.context;
    }
    w.switched_from = from;
    emu_fiber::Transfer t = emu_fiber::fiber_jump(target, &w);
    arrived(w, from, t);  // `fibers` may have grown meanwhile: indices, not references, from here on
}

// The next thread of the sweep that can run, after position w.sweep, which moves to it; -1 when the
// sweep is over. From a fiber under EMU_TSAN, a thread that has not started is left to the scheduler
// (-1, the sweep stopped before it): starting one maps stacks and creates TSan contexts, host work that
// the scheduler's TSan context hides.
int next_in_sweep(Worker& w, bool on_fiber) {
    if (w.runnable == 0) return -1;
    for (int p = w.sweep + 1; p < w.threads; p++) {
        int i = w.thread_at(p);
        ThreadState state = w.threads_of_block[i].state;
        if (state != ThreadState::runnable && state != ThreadState::not_started) continue;
        if (EMU_TSAN && on_fiber && state == ThreadState::not_started) {
            w.sweep = p - 1;
            return -1;
        }
        w.sweep = p;
        return i;
    }
    w.sweep = w.threads;
    return -1;
}

// makes thread `i` the running one (on a fiber of its own if it has not started); returns its fiber
int take_thread(Worker& w, int i);

// the running thread waits (its state says for what) or has ended: note it, and switch to the next
// thread of the sweep, or back to the scheduler; returns when this fiber's thread runs again
void note_arrival(Worker& w, int t);
void leave_thread(Worker& w) {
    int self = w.current_fiber;  // an index: `fibers` may grow while this fiber waits
    note_arrival(w, w.current_thread);
    int next = next_in_sweep(w, true);
    switch_fibers(w, self, next < 0 ? -1 : take_thread(w, next));
}

void fiber_main(emu_fiber::Transfer t) {
    Worker& w = *static_cast<Worker*>(t.data);
    const int self = w.current_fiber;  // whoever switched here made this fiber the current one
    arrived(w, self, t);
    for (;;) {
        // current_thread is a thread that has not started, given to this fiber
        int next;
        for (;;) {
            tsan_acquire(&w.launch_start_sync);
            w.run_thread(w.args);
            tsan_release(&w.threads_end_sync);
            ThreadSlot& ended = w.threads_of_block[w.current_thread];
            ended.state = ThreadState::done;
            ended.fiber = -1;
            w.live--;
            next = next_in_sweep(w, true);
            // a thread that has not started goes on on this fiber, with no switch; under EMU_TSAN a
            // thread runs on the fiber the pool gives it (its TSan context): the next thread on this
            // stack would otherwise seem to race with this one on the stack's memory
            if (EMU_TSAN || next < 0 || w.threads_of_block[next].state != ThreadState::not_started) break;
            ThreadSlot& slot = w.threads_of_block[next];
            w.runnable--;
            slot.state = ThreadState::running;
            slot.fiber = self;
            w.current_thread = next;
            threadIdx = slot.index;
        }
        if (!EMU_TSAN) w.free_fibers.push_back(self);
        switch_fibers(w, self, next < 0 ? -1 : take_thread(w, next));
    }
}

int take_fiber(Worker& w) {
    if (!w.free_fibers.empty()) {
        int f = w.free_fibers.back();
        w.free_fibers.pop_back();
        return f;
    }
    size_t bytes = fiber_stack_bytes();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    // one guard page below the stack: an overflow faults instead of corrupting the next stack
    char* region = (char*)mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) fail("cannot map a %zu-byte fiber stack", bytes);
    mprotect(region, page, PROT_NONE);
    Fiber f;
    f.stack_bottom = region + page;
    f.stack_bytes = bytes;
    // stacks are a multiple of 4 KiB apart, so their tops would all fall in the same L1 cache sets;
    // a different offset per fiber spreads the saved contexts over the sets
    size_t stagger = (w.fibers.size() % 63) * 64;
    f.context = emu_fiber::fiber_make(f.stack_bottom + bytes - stagger, bytes - stagger, fiber_main);
#if EMU_TSAN
    f.tsan_fiber = __tsan_create_fiber(0);
#endif
    w.fibers.push_back(f);
    return (int)w.fibers.size() - 1;
}

int take_thread(Worker& w, int i) {
    ThreadSlot& slot = w.threads_of_block[i];
    if (slot.state == ThreadState::not_started) {
#if EMU_TSAN
        int fiber = (w.first_fiber + i) % tsan_fiber_pool;
        while ((int)w.fibers.size() <= fiber) take_fiber(w);
        slot.fiber = fiber;
        char name[128];  // what a race report calls this thread
        snprintf(name, sizeof(name), "%s block (%u,%u,%u) thread (%u,%u,%u)", w.kernel_label.c_str(), blockIdx.x,
                 blockIdx.y, blockIdx.z, slot.index.x, slot.index.y, slot.index.z);
        __tsan_set_fiber_name(w.fibers[fiber].tsan_fiber, name);
        slot.fenced = false;
        slot.last_atomic = nullptr;
        slot.syncs = 0;
        slot.window = -1;
        slot.window_count = 0;
        slot.window_kind = nullptr;
#else
        slot.fiber = take_fiber(w);
#endif
    }
    slot.state = ThreadState::running;
    w.runnable--;
    w.current_thread = i;
    w.current_fiber = slot.fiber;
    threadIdx = slot.index;
    return slot.fiber;
}

std::string lanes_text(unsigned bits) {
    std::string s;
    for (int i = 0; i < 32; i++) {
        if (bits & (1u << i)) s += (s.empty() ? "" : ",") + std::to_string(i);
    }
    return s;
}

// the warp's sync objects for collectives with `mask` (EMU_TSAN)
WarpSync& warp_sync(Worker& w, int warp, unsigned mask) {
    for (WarpSync& s : w.warp_sync[warp])
        if (s.mask == mask) return s;
    if (2 * (size_t)(w.sync_pairs_used + 1) > (size_t)sysconf(_SC_PAGESIZE))
        fail("kernel %s: more warp masks in one block than the race checker has sync objects for", kernel_name(w.kernel).c_str());
    // The calling CUDA thread's fiber grows the list: TSan's interceptors (malloc, memmove) see that even
    // in this uninstrumented file, and another lane of the warp may have grown it last. Bookkeeping, not
    // the kernel's accesses: hidden (tiles of 1 or 2 lanes use 16 or 32 masks per warp).
#if EMU_TSAN
    __tsan_ignore_thread_begin();
#endif
    w.warp_sync[warp].push_back(WarpSync{mask, 0, w.sync_pairs_used++});
#if EMU_TSAN
    __tsan_ignore_thread_end();
#endif
    return w.warp_sync[warp].back();
}

// All lanes of `mask` in warp `warp` have arrived: compute every result, then let them run.
void complete_collective(Worker& w, int warp, unsigned mask) {
    LaneSlot* lanes = &w.lanes[warp * 32];
    int first = __builtin_ctz(mask);
    const LaneSlot& leader = lanes[first];
    for (int j = 0; j < 32; j++) {
        if (!(mask & (1u << j))) continue;
        if (lanes[j].op != leader.op || lanes[j].mask != mask)
            fail("kernel %s block (%u,%u,%u) warp %d: lane %d called %s(mask 0x%08x) while lane %d called %s(mask 0x%08x)",
                 kernel_name(w.kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, warp, j, lanes[j].name, lanes[j].mask,
                 first, leader.name, leader.mask);
    }
    uint64_t reduced = 0;
    switch (leader.op) {
        case WarpOp::ballot:
        case WarpOp::any:
        case WarpOp::all:
            for (int j = 0; j < 32; j++)
                if ((mask & (1u << j)) && lanes[j].value) reduced |= 1ull << j;
            if (leader.op == WarpOp::any) reduced = reduced != 0;
            if (leader.op == WarpOp::all) reduced = reduced == mask;
            break;
        case WarpOp::reduce_add:
        case WarpOp::reduce_min:
        case WarpOp::reduce_max: {
            uint32_t acc = leader.op == WarpOp::reduce_min ? 0xFFFFFFFFu : 0;
            for (int j = 0; j < 32; j++) {
                if (!(mask & (1u << j))) continue;
                uint32_t v = (uint32_t)lanes[j].value;
                if (leader.op == WarpOp::reduce_add) acc += v;
                if (leader.op == WarpOp::reduce_min) acc = v < acc ? v : acc;
                if (leader.op == WarpOp::reduce_max) acc = v > acc ? v : acc;
            }
            reduced = acc;
            break;
        }
        default:
            break;
    }
    for (int j = 0; j < 32; j++) {
        if (!(mask & (1u << j))) continue;
        LaneSlot& lane = lanes[j];
        int width = lane.width;
        int segment = j & ~(width - 1);
        int src = j;
        switch (lane.op) {
            case WarpOp::shfl: src = segment + (lane.arg & (width - 1)); break;
            case WarpOp::shfl_up: src = j - lane.arg < segment ? j : j - lane.arg; break;
            case WarpOp::shfl_down: src = j + lane.arg >= segment + width ? j : j + lane.arg; break;
            case WarpOp::shfl_xor: src = (j ^ lane.arg) >= segment + width ? j : (j ^ lane.arg); break;
            default: break;
        }
        switch (lane.op) {
            case WarpOp::shfl:
            case WarpOp::shfl_up:
            case WarpOp::shfl_down:
            case WarpOp::shfl_xor:
                if (!(mask & (1u << src)))
                    fail("kernel %s block (%u,%u,%u) warp %d: lane %d's %s reads lane %d, which is not in the mask 0x%08x "
                         "(its value is undefined in CUDA)",
                         kernel_name(w.kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, warp, j, lane.name, src, mask);
                lane.result = lanes[src].value;
                break;
            case WarpOp::sync: lane.result = 0; break;
            default: lane.result = reduced; break;
        }
        w.threads_of_block[warp * 32 + j].state = ThreadState::runnable;
    }
    if (EMU_TSAN) warp_sync(w, warp, mask).completed++;
    w.warp_arrived[warp] &= ~mask;
    w.at_warp -= __builtin_popcount(mask);
    w.runnable += __builtin_popcount(mask);
}

// no thread can run and the barrier cannot open: say who waits for whom
[[noreturn]] void report_deadlock(Worker& w) {
    std::string detail;
    for (int warp = 0; warp * 32 < w.threads; warp++) {
        unsigned arrived = w.warp_arrived[warp];
        if (!arrived) continue;
        int lane = __builtin_ctz(arrived);
        const LaneSlot& slot = w.lanes[warp * 32 + lane];
        unsigned missing = slot.mask & ~arrived;
        std::string exited, at_barrier, absent;
        for (int j = 0; j < 32; j++) {
            if (!(missing & (1u << j))) continue;
            int t = warp * 32 + j;
            if (t >= w.threads) absent += (absent.empty() ? "" : ",") + std::to_string(j);
            else if (w.threads_of_block[t].state == ThreadState::done) exited += (exited.empty() ? "" : ",") + std::to_string(j);
            else at_barrier += (at_barrier.empty() ? "" : ",") + std::to_string(j);
        }
        char line[1024];
        snprintf(line, sizeof(line), "\n  warp %d: lanes %s wait in %s(mask 0x%08x) for lanes that%s%s%s%s%s%s", warp,
                 lanes_text(arrived).c_str(), slot.name, slot.mask, exited.empty() ? "" : " have exited: ", exited.c_str(),
                 at_barrier.empty() ? "" : " wait at __syncthreads: ", at_barrier.c_str(),
                 absent.empty() ? "" : " do not exist in this block: ", absent.c_str());
        detail += line;
    }
    fail("kernel %s block (%u,%u,%u) cannot go on (on a GPU it would hang or read undefined values):%s",
         kernel_name(w.kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, detail.c_str());
}

// thread t has stopped running: at a barrier, in a warp collective (the last lane to arrive completes
// it), or ended (fiber_main has counted it)
void note_arrival(Worker& w, int t) {
    switch (w.threads_of_block[t].state) {
        case ThreadState::done: break;
        case ThreadState::at_barrier: w.at_barrier++; break;
        case ThreadState::at_warp: {
            w.at_warp++;
            int warp = t / 32;
            unsigned mask = w.lanes[t].mask;
            w.warp_arrived[warp] |= 1u << (t % 32);
            if ((w.warp_arrived[warp] & mask) == mask) complete_collective(w, warp, mask);
            break;
        }
        default: fail("internal: a fiber left while its thread is running");
    }
}

void run_block(Worker& w) {
    const int n = w.threads;
    const dim3 b = blockDim;
    if (w.indexed_block.x != b.x || w.indexed_block.y != b.y || w.indexed_block.z != b.z) {
        for (int i = 0; i < n; i++) w.threads_of_block[i].index = uint3{i % b.x, (i / b.x) % b.y, i / (b.x * b.y)};
        w.indexed_block = b;
    }
    for (int i = 0; i < n; i++) {
        w.threads_of_block[i].state = ThreadState::not_started;
        w.threads_of_block[i].fiber = -1;
    }
    for (int k = 0; k < (n + 31) / 32; k++) w.warp_arrived[k] = 0;
    w.runnable = n;
    w.live = n;
    w.at_barrier = 0;
    w.at_warp = 0;
    w.reverse = thread_order.load(std::memory_order_relaxed) == ThreadOrder::reverse;
    w.sweep = -1;
    for (;;) {
        // the sweep goes on from fiber to fiber (leave_thread) and comes back here when it is over, or
        // under EMU_TSAN before a thread that has not started
        int next = next_in_sweep(w, false);
        if (next >= 0) {
            switch_fibers(w, -1, take_thread(w, next));
            continue;
        }
        w.sweep = -1;
        if (w.runnable > 0) continue;
        if (w.live == 0) break;
        if (w.at_warp == 0 && w.at_barrier == w.live) {
            for (int i = 0; i < n; i++)
                if (w.threads_of_block[i].state == ThreadState::at_barrier) w.threads_of_block[i].state = ThreadState::runnable;
            w.runnable = w.at_barrier;
            w.at_barrier = 0;
            w.barriers_opened++;
            continue;
        }
        report_deadlock(w);
    }
    w.current_thread = -1;
}

}  // namespace

void set_thread_order(ThreadOrder order) { thread_order.store(order); }

// ----------------------------------------------------------------------------
// race reports (EMU_TSAN)

namespace {
std::atomic<int> races_reported{0};

// what memory an address is, for the report
const char* memory_kind(const void* p, size_t bytes) {
    if (is_device_pointer(p, bytes)) return "global memory";
    Worker* w = this_worker;
    if (w == nullptr) return "host memory";
    const char* c = (const char*)p;
    if (c >= w->dynamic_shared && c < w->dynamic_shared + w->dynamic_shared_bytes) return "dynamic shared memory";
    for (const auto& [variable, size] : w->static_shared)
        if (c >= variable && c < variable + size) return "static shared memory";
    return "host or stack memory";
}
}  // namespace

std::string current_cuda_thread() {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) return "";
    char text[160];
    snprintf(text, sizeof(text), " block (%u,%u,%u) thread (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
             threadIdx.y, threadIdx.z);
    return "kernel " + kernel_name(w->kernel) + text;
}

// EMU_TSAN: the PTX memory model's fence patterns, which ThreadSanitizer does not see (it ignores
// fences). A fence and then, in program order, an atomic is a release: what the thread did before
// (here: before the atomic) is released to the atomic's address. An atomic and then a fence is an
// acquire: at the fence the thread acquires what was released to that address. So the "last block"
// reduction (every block writes its partials, fences, takes a ticket with atomicAdd; the block that
// takes the last ticket fences and reads all partials) is ordered, and without its fences reported.
void race_check_atomic(const void* address) {
#if EMU_TSAN
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) return;
    ThreadSlot& t = w->threads_of_block[w->current_thread];
    if (t.fenced) __tsan_release((void*)address);
    t.last_atomic = address;
#else
    (void)address;
#endif
}
void race_check_fence() {
#if EMU_TSAN
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) return;
    ThreadSlot& t = w->threads_of_block[w->current_thread];
    if (t.last_atomic) __tsan_acquire((void*)t.last_atomic);
    t.fenced = true;
    t.syncs++;
#endif
}

// EMU_TSAN: a cp.async's write of shared memory may happen at any time from its issue to the
// cp.async.wait_group that covers it, so the race checker must see it as concurrent with every access
// that is not ordered before the issue or after the wait. It is written by a TSan context of its own
// (a window: Fiber::tsan_copy) that takes the issuing thread's clock at the issue and nothing after; at
// the wait the thread acquires the window's clock, so what it does next comes after the write. A window
// serves the thread's copies until its next synchronization (each group of a double-buffered loop gets
// its own); a thread has copy_windows of them in turn, so a copy whose window was reopened for a later
// issue is seen as later than it was (a race can be missed, never invented). The windows belong to the
// pooled fiber, whose threads TSan already sees in program order.
int race_check_copy_issue(const char* kind) {
#if EMU_TSAN
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) return -1;
    ThreadSlot& t = w->threads_of_block[w->current_thread];
    if (t.window >= 0 && t.window_syncs == t.syncs && t.window_kind == kind) return t.window;
    Fiber& f = w->fibers[t.fiber];
    int k = (int)(t.window_count++ % copy_windows);
    if (f.tsan_copy[k] == nullptr) f.tsan_copy[k] = __tsan_create_fiber(0);
    char name[128];  // what a race report calls the copy's write (TSan keeps 63 characters; the kernel is named)
    snprintf(name, sizeof(name), "%s of block (%u,%u,%u) thread (%u,%u,%u)", kind, blockIdx.x, blockIdx.y, blockIdx.z,
             t.index.x, t.index.y, t.index.z);
    __tsan_set_fiber_name(f.tsan_copy[k], name);
    __tsan_switch_to_fiber(f.tsan_copy[k], 0);  // with synchronization: the window acquires the thread's clock
    __tsan_switch_to_fiber(f.tsan_fiber, __tsan_switch_to_fiber_no_sync);
    t.window = k;
    t.window_syncs = t.syncs;
    t.window_kind = kind;
    return k;
#else
    (void)kind;
    return -1;
#endif
}

void race_check_copy_land(int window, void* shared, size_t bytes) {
#if EMU_TSAN
    Worker* w = this_worker;
    if (window < 0 || w == nullptr || w->current_thread < 0) return;
    Fiber& f = w->fibers[w->threads_of_block[w->current_thread].fiber];
    __tsan_switch_to_fiber(f.tsan_copy[window], __tsan_switch_to_fiber_no_sync);
    __tsan_write_range(shared, bytes);
    __tsan_switch_to_fiber(f.tsan_fiber, 0);  // with synchronization: the thread acquires the window's clock
#else
    (void)window, (void)shared, (void)bytes;
#endif
}

// EMU_TSAN: wgmma's read of shared memory (wgmma_emu.h), made at the covering wgmma.wait_group but
// possibly anywhere from the issue on: read in a window (race_check_copy_issue, opened at the
// wgmma.fence before the issue), so that a write of the operand by any thread not ordered before the
// fence, the issuing thread's own writes after it included, is reported; the thread then acquires the
// window's clock.
void race_check_async_read(int window, const void* shared, size_t bytes) {
#if EMU_TSAN
    Worker* w = this_worker;
    if (window < 0 || w == nullptr || w->current_thread < 0) return;
    Fiber& f = w->fibers[w->threads_of_block[w->current_thread].fiber];
    __tsan_switch_to_fiber(f.tsan_copy[window], __tsan_switch_to_fiber_no_sync);
    __tsan_read_range(const_cast<void*>(shared), bytes);
    __tsan_switch_to_fiber(f.tsan_fiber, 0);
#else
    (void)window, (void)shared, (void)bytes;
#endif
}

// The shared window (the addresses of __cvta_generic_to_shared and of wgmma's descriptors) is the
// block's dynamic shared memory from address 0, as on a GPU whose kernel declares no static shared
// memory; a static __shared__ variable has no window address here (each is a variable of its own).
size_t shared_window_offset(const void* p) {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) fail("__cvta_generic_to_shared outside a kernel");
    const char* c = (const char*)p;
    if (c >= w->dynamic_shared && c <= w->dynamic_shared + w->dynamic_shared_bytes) return (size_t)(c - w->dynamic_shared);
    fail("__cvta_generic_to_shared(%p) in %s: the address is %s; the emulator gives a shared-window address only to "
         "dynamic shared memory (extern __shared__)", p, current_cuda_thread().c_str(), memory_kind(p, 1));
}

unsigned char* shared_window(size_t* bytes, const char* what) {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) fail("%s outside a kernel", what);
    *bytes = w->dynamic_shared_bytes;
    return reinterpret_cast<unsigned char*>(w->dynamic_shared);
}

unsigned long long block_serial() {
    Worker* w = this_worker;
    return w == nullptr || w->current_thread < 0 ? 0 : w->block_serial;
}

void shared_window_overrun(size_t offset, size_t bytes, size_t window, const char* what) {
    fail("%s in %s: shared address 0x%zx (+%zu bytes) is past the block's %zu bytes of dynamic shared memory", what,
         current_cuda_thread().c_str(), offset, bytes, window);
}

bool race_checking() { return EMU_TSAN; }
int race_reports() { return races_reported.load(); }
void race_check_pause() {
#if EMU_TSAN
    __tsan_ignore_thread_begin();
#endif
}
void race_check_resume() {
#if EMU_TSAN
    __tsan_ignore_thread_end();
#endif
}

}  // namespace emu

#if EMU_TSAN
// ThreadSanitizer calls this after printing each report (its stacks name the kernel's source lines);
// this adds one line in CUDA's terms: the kernel, the two threads, the address and its kind.
extern "C" void __tsan_on_report(void* report) {
    emu::races_reported++;
    const char* description = "";
    int count = 0, stacks = 0, mops = 0, locations = 0, mutexes = 0, threads = 0, unique_tids = 0;
    void* sleep = nullptr;
    if (!__tsan_get_report_data(report, &description, &count, &stacks, &mops, &locations, &mutexes, &threads,
                                &unique_tids, &sleep, 0))
        return;
    std::string text = std::string("cuda-emu: ") + description;
    emu::Worker* w = emu::this_worker;
    if (w && w->current_thread >= 0) text += " in kernel " + emu::kernel_name(w->kernel);
    text += " (no __syncthreads, warp collective, stream order or event orders these accesses):";
    for (int m = 0; m < mops; m++) {
        int tid = -1, size = 0, write = 0, atomic = 0;
        void* address = nullptr;
        void* trace = nullptr;
        if (!__tsan_get_report_mop(report, m, &tid, &address, &size, &write, &atomic, &trace, 0)) continue;
        std::string who = "a host thread";
        for (int t = 0; t < threads; t++) {
            int id = -1, running = 0, parent = 0;
            uint64_t os_id = 0;
            const char* name = nullptr;
            void* thread_trace = nullptr;
            if (__tsan_get_report_thread(report, t, &id, &os_id, &running, &name, &parent, &thread_trace, 0) && id == tid &&
                name && name[0])
                who = name;
        }
        char line[512];
        snprintf(line, sizeof(line), "\n  %s %s%s of %d bytes at %p (%s)", m == 0 ? "this" : "earlier", write ? "write" : "read",
                 atomic ? " (atomic)" : "", size, address, emu::memory_kind(address, (size_t)size));
        text += line;
        text += " by " + who;
    }
    fprintf(stderr, "%s\n", text.c_str());
}
#endif

namespace emu {

uint64_t warp_collective(WarpOp op, const char* name, unsigned mask, uint64_t value, int arg, int width) {
    if (this_worker == nullptr || this_worker->current_thread < 0) fail("%s called outside a kernel", name);
    Worker& w = *this_worker;
    int i = w.current_thread;
    int lane = i % 32;
    if (!(mask & (1u << lane)))
        fail("kernel %s block (%u,%u,%u) thread %d: %s with mask 0x%08x that does not name the calling lane %d",
             kernel_name(w.kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, i, name, mask, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("kernel %s: %s with width %d (must be a power of 2 up to 32)", kernel_name(w.kernel).c_str(), name, width);
    LaneSlot& slot = w.lanes[i];
    slot.op = op;
    slot.name = name;
    slot.mask = mask;
    slot.arg = arg;
    slot.width = width;
    slot.value = value;
    w.threads_of_block[i].state = ThreadState::at_warp;
#if EMU_TSAN
    WarpSync& sync = warp_sync(w, i / 32, mask);
    char* order = w.sync_page + 2 * sync.pair + sync.completed % 2;
    tsan_release(order);
    leave_thread(w);
    tsan_acquire(order);
    w.threads_of_block[i].syncs++;
#else
    leave_thread(w);
#endif
    return w.lanes[i].result;
}

void syncthreads() {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) fail("__syncthreads called outside a kernel");
    w->threads_of_block[w->current_thread].state = ThreadState::at_barrier;
#if EMU_TSAN
    char* order = w->sync_page + w->barriers_opened % 2;  // alternating, as in WarpSync
    tsan_release(order);
    leave_thread(*w);
    tsan_acquire(order);
    w->threads_of_block[w->current_thread].syncs++;
#else
    leave_thread(*w);
#endif
}

void trap() {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) fail("__trap called outside a kernel");
    fail("kernel %s block (%u,%u,%u) thread (%u,%u,%u) called __trap() (on a GPU the launch fails and the CUDA "
         "context with it)",
         kernel_name(w->kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
}

int syncthreads_count(int predicate) {
    if (this_worker == nullptr || this_worker->current_thread < 0) fail("__syncthreads_count called outside a kernel");
    Worker& w = *this_worker;
    // each thread leaves its predicate in its own slot; after the barrier every thread counts the
    // slots of the threads that have not exited
    w.lanes[w.current_thread].value = predicate != 0;
    syncthreads();
    int count = 0;
    for (int i = 0; i < w.threads; i++)
        if (w.threads_of_block[i].state != ThreadState::done) count += (int)w.lanes[i].value;
    syncthreads();  // nobody overwrites its slot before all have counted
    return count;
}

namespace {
// EMU_TSAN: shared memory is mapped here, not in host-thread-local storage
constexpr size_t static_arena_bytes = 16 << 20;  // room for every static __shared__ variable of the program
constexpr size_t dynamic_region_bytes = 256 << 10;  // above an H100's 227 KiB per block

char* map_region(size_t bytes) {
#if EMU_TSAN
    __tsan_ignore_thread_begin();  // else TSan takes the mapping for a write by the thread that maps it
#endif
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
#if EMU_TSAN
    __tsan_ignore_thread_end();
#endif
    if (p == MAP_FAILED) fail("cannot map %zu bytes for shared memory", bytes);
    return (char*)p;
}

char* take_static_shared(Worker& w, size_t bytes) {
    if (w.static_arena == nullptr) w.static_arena = map_region(static_arena_bytes);
    size_t offset = (w.static_arena_used + 63) & ~(size_t)63;  // at least any __align__ of the declaration
    if (offset + bytes > static_arena_bytes)
        fail("the static __shared__ variables need more than the race checker's %zu bytes", static_arena_bytes);
    w.static_arena_used = offset + bytes;
    return w.static_arena + offset;
}

#if EMU_TSAN
// Before each block: nothing of the previous block may order this one. Its shared memory is mapped
// afresh while TSan ignores this thread, which makes TSan forget every access to it, then the dynamic
// part is filled with 0xFF, unseen too. The sync objects' page is unmapped and mapped again (TSan
// drops the sync objects in unmapped memory). The block's threads take the pool's next fibers.
void forget_block(Worker& w, size_t dynamic_bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    auto remap = [&](char* p, size_t bytes) {
        bytes = (bytes + page - 1) / page * page;
        if (bytes && mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
            fail("cannot map shared memory afresh");
    };
    __tsan_ignore_thread_begin();
    remap(w.static_arena, w.static_arena_used);
    remap(w.dynamic_shared, dynamic_bytes);
    memset(w.dynamic_shared, 0xFF, dynamic_bytes);
    if (w.sync_page) munmap(w.sync_page, page);
    void* p = mmap(w.sync_page, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (w.sync_page ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (p == MAP_FAILED || (w.sync_page && p != w.sync_page)) fail("cannot map the race checker's sync page again");
    w.sync_page = (char*)p;
    __tsan_ignore_thread_end();
    w.barriers_opened = 0;
    w.sync_pairs_used = 1;
    for (auto& masks : w.warp_sync) masks.clear();
    w.first_fiber = (w.first_fiber + w.threads) % tsan_fiber_pool;
}
#endif

}  // namespace

void* shared_declared(SharedNote* note, void* storage, size_t bytes) {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) fail("a __shared__ variable was used outside a kernel");
    if (note->block == w->block_serial) return note->address;
    if (note->address == nullptr) {
        note->address = EMU_TSAN ? take_static_shared(*w, bytes) : storage;
        w->static_shared.emplace_back((const char*)note->address, bytes);
    }
    note->block = w->block_serial;
#if EMU_TSAN
    __tsan_ignore_thread_begin();  // the fill is no thread's write: a read of a slot nobody wrote is no race
#endif
    memset(note->address, 0xFF, bytes);
#if EMU_TSAN
    __tsan_ignore_thread_end();
#endif
    return note->address;
}

void* dynamic_shared_memory() {
    Worker* w = this_worker;
    if (w == nullptr || w->current_thread < 0) fail("dynamic shared memory used outside a kernel");
    return w->dynamic_shared;
}

// ----------------------------------------------------------------------------
// grids: blocks shared out to EMU_THREADS host threads

namespace {

struct Grid {
    const void* kernel;
    LaunchConfig config{1, 1};
    void (*run_thread)(void*);
    void* args;
    std::atomic<unsigned long long> next_block{0};
    unsigned long long blocks;
};

void run_blocks(Grid& g) {
    Worker& w = worker();
    const LaunchConfig& c = g.config;
    blockDim = c.block;
    gridDim = c.grid;
    w.kernel = g.kernel;
    w.run_thread = g.run_thread;
    w.args = g.args;
    w.threads = (int)(c.block.x * c.block.y * c.block.z);
#if EMU_TSAN
    w.tsan_host = __tsan_get_current_fiber();  // the launch's stream (runtime.cpp): its fibers return there
    // The scheduler's own memory (its stack is the device thread's, shared by every stream's TSan
    // context) is bookkeeping, not the kernel's: hidden from TSan while the grid runs. The CUDA threads
    // are fibers of their own, still seen.
    __tsan_ignore_thread_begin();
    // "ns::kernel(args)" or "void ns::kernel<T>(args)": the name alone, short (TSan keeps 63 characters
    // of a thread's name, and the block and thread indices must fit)
    std::string name = kernel_name(g.kernel);
    name = name.substr(0, name.find('('));
    name = name.substr(0, name.find('<'));
    size_t cut = name.find_last_of(": ");
    if (cut != std::string::npos) name = name.substr(cut + 1);
    w.kernel_label = name.empty() ? "kernel" : name.substr(0, 24);
    if (w.dynamic_shared == nullptr) w.dynamic_shared = map_region(dynamic_region_bytes);
    if (c.shared_bytes > dynamic_region_bytes) fail("%zu bytes of dynamic shared memory", c.shared_bytes);
    w.dynamic_shared_bytes = c.shared_bytes;
    tsan_release(&w.launch_start_sync);  // what the host did before the launch comes before its threads
#else
    // on a 1024-byte boundary: the shared window's address 0 (shared_window_offset), whose low bits
    // wgmma's swizzle reads, is the pointer's too, as on a GPU
    size_t shared_words = (c.shared_bytes + 1024 + sizeof(uint4) - 1) / sizeof(uint4);
    if (w.dynamic_storage.size() < shared_words) w.dynamic_storage.resize(shared_words);
    w.dynamic_shared = (char*)(((uintptr_t)w.dynamic_storage.data() + 1023) & ~(uintptr_t)1023);
    w.dynamic_shared_bytes = c.shared_bytes;
#endif
    for (;;) {
        unsigned long long b = g.next_block.fetch_add(1, std::memory_order_relaxed);
        if (b >= g.blocks) break;
        blockIdx = uint3{(unsigned)(b % c.grid.x), (unsigned)((b / c.grid.x) % c.grid.y), (unsigned)(b / ((unsigned long long)c.grid.x * c.grid.y))};
        // never-written shared memory reads as NaN (0xFF bytes), as device memory does; static
        // __shared__ variables are filled when the block first reaches them (shared_declared)
        w.block_serial++;
#if EMU_TSAN
        forget_block(w, c.shared_bytes);
#else
        if (c.shared_bytes) memset(w.dynamic_shared, 0xFF, c.shared_bytes);
#endif
        run_block(w);
#if EMU_TSAN
        // The block's cp.async and wgmma windows serve no one now (they touched only its shared memory,
        // which the next block gets afresh): destroyed, so that TSan reuses their contexts. It has about
        // 8000; windows kept with the pool's 2048 fibers, up to 4 each, used them up in the dev/cuda
        // attention programs, whose every thread opens windows.
        for (int i = 0; i < w.threads; i++) {
            int fiber = (w.first_fiber + i) % tsan_fiber_pool;
            if (fiber >= (int)w.fibers.size()) break;
            for (void*& window : w.fibers[fiber].tsan_copy) {
                if (window != nullptr) __tsan_destroy_fiber(window);
                window = nullptr;
            }
        }
#endif
    }
    tsan_acquire(&w.threads_end_sync);  // every thread's end comes before what the host does next
#if EMU_TSAN
    __tsan_ignore_thread_end();
#endif
}

int block_threads_setting() {
    const char* env = getenv("EMU_THREADS");
    int n = env ? atoi(env) : 1;
    if (n < 1 || n > 256) fail("EMU_THREADS must be between 1 and 256, not '%s'", env);
    return n;
}

// helper host threads that run blocks beside the device thread
struct BlockPool {
    std::mutex mutex;
    std::condition_variable wake, done;
    Grid* grid = nullptr;
    unsigned long long generation = 0;
    int busy = 0;
    std::vector<std::thread> threads;

    explicit BlockPool(int helpers) {
        for (int i = 0; i < helpers; i++) threads.emplace_back([this] { loop(); });
        for (auto& t : threads) t.detach();
    }
    void loop() {
        unsigned long long seen = 0;
        for (;;) {
            Grid* g;
            {
                std::unique_lock<std::mutex> lock(mutex);
                wake.wait(lock, [&] { return generation != seen; });
                seen = generation;
                g = grid;
            }
            run_blocks(*g);
            std::lock_guard<std::mutex> lock(mutex);
            if (--busy == 0) done.notify_all();
        }
    }
    void run(Grid& g) {
        {
            std::lock_guard<std::mutex> lock(mutex);
            grid = &g;
            busy = (int)threads.size();
            generation++;
        }
        wake.notify_all();
        run_blocks(g);
        std::unique_lock<std::mutex> lock(mutex);
        done.wait(lock, [&] { return busy == 0; });
    }
};

}  // namespace

void launch_enqueue(const void* kernel, const LaunchConfig& config, void (*run_thread)(void*), std::shared_ptr<void> args) {
    std::string what = "kernel " + kernel_name(kernel);
    enqueue_named(config.stream, what, [kernel, config, run_thread, args] {
        static const int host_threads = block_threads_setting();
        Grid g;
        g.kernel = kernel;
        g.config = config;
        g.run_thread = run_thread;
        g.args = args.get();
        g.blocks = (unsigned long long)config.grid.x * config.grid.y * config.grid.z;
        if (host_threads == 1 || g.blocks == 1) {
            run_blocks(g);
        } else {
            // never destroyed: destroying a condition variable its threads wait on would hang exit()
            static BlockPool* pool = new BlockPool(host_threads - 1);
            pool->run(g);
        }
    });
}

}  // namespace emu
