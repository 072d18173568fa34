// The emulator core's interface to the other emulated libraries (cuBLAS, NCCL) and to tests.
// See dev/emu/CONTRACT.md. Everything here runs on the CPU; "device" means the emulator's device thread.
#pragma once

#include <cstddef>
#include <functional>

struct CUstream_st;
typedef CUstream_st* cudaStream_t;

namespace emu {

// Queues `task` on `stream` (nullptr: the legacy default stream). It runs later on the emulated
// device, after everything queued before it on that stream and after the events the stream waits
// for, never at the time of the call (streams are lazy). `what` names it in error messages.
void enqueue(cudaStream_t stream, const char* what, std::function<void()> task);

// Queues work that starts on the device and ends later, when another process has done its part (the
// emulated NCCL's transfers). When the stream reaches it, the device runs `start`, which begins the
// work and returns a function that says whether it has finished (nullptr: finished at once). Until it
// says so, the stream's later work waits, while the device runs other streams' work and asks again
// between tasks, as a GPU runs other streams' kernels while a communication kernel waits for its peer.
void enqueue_async(cudaStream_t stream, const char* what, std::function<std::function<bool()>()> start);

// True when `p` lies inside memory from cudaMalloc (device memory); `bytes` must fit inside too.
bool is_device_pointer(const void* p, size_t bytes);

// Queues work that starts on the device and ends later, when another process has done its part (the
// emulated NCCL's transfers). When the stream reaches it, the device runs `start`, which begins the
// work and returns a function that says whether it has finished (nullptr: finished at once). Until it
// says so, the stream's later work waits, while the device runs other streams' work and asks again
// between tasks, as a GPU runs other streams' kernels while a communication kernel waits for its peer.
void enqueue_async(cudaStream_t stream, const char* what, std::function<std::function<bool()>()> start);

// True when `p` lies inside memory from cudaMallocHost (pinned host memory); `bytes` must fit too.
bool is_pinned_host_pointer(const void* p, size_t bytes);

// Ends the program with a clear message (an unsupported call or argument): "cuda-emu: <message>".
[[noreturn]] __attribute__((format(printf, 1, 2))) void fail(const char* fmt, ...);

// A setting of two words (EMU_THREAD_ORDER, EMU_STREAM_ORDER, EMU_CP_ASYNC, EMU_LT_TIMING): false when the
// variable `name` is unset or `usual`, true when it is `other`; any other value ends the program (fail).
bool env_choice(const char* name, const char* usual, const char* other);

// ---- for tests and the build (not part of CUDA) ----

// Order in which a block's threads run between two synchronization points (__syncthreads, warp
// collectives): forward (thread 0 first, the default) or reverse (EMU_THREAD_ORDER=reverse).
enum class ThreadOrder { forward, reverse };
void set_thread_order(ThreadOrder order);

// Race checking: true in the EMU_TSAN=1 build (build/emu-tsan/), where ThreadSanitizer watches every
// launch for data races between CUDA threads (dev/emu/README.md); race_reports() counts the reports
// so far (each also printed, with a "cuda-emu: data-race in kernel ..." line). Other builds: false, 0.
bool race_checking();
int race_reports();
// The race checker does not see what the calling CUDA thread accesses between these two calls: for the
// emulator's own bookkeeping in code compiled with the kernels (mma_emu.h's lane exchange and cp.async
// queues). No-ops in other builds.
void race_check_pause();
void race_check_resume();
// cp.async's write of shared memory, which may land any time from the issue to the covering
// cp.async.wait_group: race_check_copy_issue() at the issue returns the copy's window (-1 in other
// builds), race_check_copy_land(window, ...) at the wait makes the race checker see the write there, as
// made at the issue, and the calling thread ordered after it (exec.cpp). mma_emu.h's cp_async16.
int race_check_copy_issue(const char* kind = "cp.async");
void race_check_copy_land(int window, void* shared, size_t bytes);
// wgmma's read of a shared-memory operand (wgmma_emu.h), in the window of its issue, made at its wait.
void race_check_async_read(int window, const void* shared, size_t bytes);
// The shared window: the calling thread's block's dynamic shared memory, its start (address 0) and its
// size in bytes; `what` names the caller should it be called outside a kernel. __cvta_generic_to_shared
// gives the addresses (kernel.h). shared_window_overrun ends the run: an access at [offset, offset +
// bytes) past the window's `window` bytes.
unsigned char* shared_window(size_t* bytes, const char* what);
// A number of the calling thread's block, another for every block a host thread runs, launch after
// launch: bookkeeping kept per block by code compiled with the kernels (mma_emu.h's proxy tracking)
// starts afresh where it changes. 0 outside a kernel.
unsigned long long block_serial();
[[noreturn]] void shared_window_overrun(size_t offset, size_t bytes, size_t window, const char* what);

// initcheck: true in the EMU_ASAN=1 build (build/emu-asan/) unless EMU_INITCHECK=0: every read of device
// memory that nothing wrote, by a CUDA thread or declared with initcheck_read, is reported
// ("cuda-emu: initcheck: ...", device_memory.cpp). initcheck_reports() counts such reads so far;
// initcheck_forget_reports() sets the count back to 0 (a program with reports at its end exits with
// status 67). Other builds: false, 0, nothing.
bool initchecking();
int initcheck_reports();
void initcheck_forget_reports();
// For the emulated libraries, whose own loads and stores initcheck does not see: `who` (such as
// "cuBLAS GEMM operand A") reads [p, p + bytes) of device memory; it wrote [p, p + bytes).
void initcheck_read(const void* p, size_t bytes, const char* who);
void initcheck_mark_written(const void* p, size_t bytes);

// Order in which the device picks among streams that all have runnable work: the most recently
// created stream first (the default), or plain issue order (EMU_STREAM_ORDER=issue).
enum class StreamOrder { newest_stream_first, issue };
void set_stream_order(StreamOrder order);

// Registers per thread, static shared memory and the __launch_bounds__ maximum of threads per block
// (0: none) of a kernel, as ptxas and the PTX show them for the real sm_90 build (the build generates
// a table that calls this; tests may add synthetic entries).
void set_kernel_resources(const char* mangled_name, int registers, int static_shared_bytes, int max_threads_per_block = 0);

}  // namespace emu
