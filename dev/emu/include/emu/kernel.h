// What kernels see in the emulator: thread indices, __syncthreads, warp collectives, atomics,
// cache-hint loads and stores, fast-math intrinsics, and the launch `k *emu::LaunchConfig{g, b, s, st}(args)`
// that dev/emu/cu2cpp.sh writes in place of `k<<<g, b, s, st>>>(args)`.
//
// Each CUDA thread of a block is a fiber (exec.cpp); the indices below are host-thread-local
// variables the scheduler sets before it resumes a fiber, so they always belong to the running thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// included by cuda_runtime.h after the types it needs
extern __thread uint3 threadIdx;
extern __thread uint3 blockIdx;
extern __thread dim3 blockDim;
extern __thread dim3 gridDim;
constexpr int warpSize = 32;

namespace emu {

// ----------------------------------------------------------------------------
// synchronization inside a block (exec.cpp)

enum class WarpOp : uint8_t { shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all, sync, reduce_add, reduce_min, reduce_max };

// Blocks the calling thread until every lane named in `mask` has called the same collective, then
// returns this lane's result (a shuffled value, a ballot, ...). `arg` is the source lane, delta or
// xor mask; `width` the shuffle's segment width.
uint64_t warp_collective(WarpOp op, const char* name, unsigned mask, uint64_t value, int arg, int width);
void syncthreads();
int syncthreads_count(int predicate);  // the number of threads whose predicate is nonzero
void* dynamic_shared_memory();
// Called where a static __shared__ variable is declared (EMU_SHARED_VARIABLE, below); returns where
// the variable lives: `storage` (its host-thread-local copy), or with the race checker (EMU_TSAN) a
// place in memory the emulator maps afresh for every block. The first call in each block fills the
// variable with 0xFF bytes, as the block's dynamic shared memory is filled.
struct SharedNote {
    unsigned long long block;  // the block (a host thread's count) the variable was last filled for
    void* address;             // where it lives; null until first used
};
void* shared_declared(SharedNote* note, void* storage, size_t bytes);
template <typename T>
inline T* shared_variable(T* storage, SharedNote* note) {
    return static_cast<T*>(shared_declared(note, storage, sizeof(T)));
}

template <typename T>
inline uint64_t to_bits(T value) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffle of a type over 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &value, sizeof(T));
    return bits;
}
template <typename T>
inline T from_bits(uint64_t bits) {
    T value;
    memcpy(&value, &bits, sizeof(T));
    return value;
}

}  // namespace emu

// cu2cpp.sh rewrites every static `__shared__ T name[...];` into `__shared__ T name_emu_storage[...];
// EMU_SHARED_VARIABLE(name);`, which makes `name` a reference to the block's copy. Shared memory on a
// GPU starts each block with whatever was there before; here it starts as 0xFF bytes (NaN for floats),
// so a kernel that reads a slot no thread of its block wrote gets garbage, deterministically.
#define EMU_SHARED_VARIABLE(name)                       \
    static thread_local emu::SharedNote name##_emu_note; \
    auto& name = *emu::shared_variable(&name##_emu_storage, &name##_emu_note)

inline void __syncthreads() { emu::syncthreads(); }
inline int __syncthreads_count(int predicate) { return emu::syncthreads_count(predicate); }
inline int __syncthreads_or(int predicate) { return emu::syncthreads_count(predicate) != 0; }
inline int __syncthreads_and(int predicate) { return emu::syncthreads_count(predicate) == (int)(blockDim.x * blockDim.y * blockDim.z); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_collective(emu::WarpOp::sync, "__syncwarp", mask, 0, 0, 32); }

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return emu::from_bits<T>(emu::warp_collective(emu::WarpOp::shfl, "__shfl_sync", mask, emu::to_bits(var), src_lane, width));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return emu::from_bits<T>(
        emu::warp_collective(emu::WarpOp::shfl_up, "__shfl_up_sync", mask, emu::to_bits(var), (int)delta, width));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return emu::from_bits<T>(
        emu::warp_collective(emu::WarpOp::shfl_down, "__shfl_down_sync", mask, emu::to_bits(var), (int)delta, width));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return emu::from_bits<T>(
        emu::warp_collective(emu::WarpOp::shfl_xor, "__shfl_xor_sync", mask, emu::to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return (unsigned)emu::warp_collective(emu::WarpOp::ballot, "__ballot_sync", mask, predicate != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int predicate) {
    return (int)emu::warp_collective(emu::WarpOp::any, "__any_sync", mask, predicate != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int predicate) {
    return (int)emu::warp_collective(emu::WarpOp::all, "__all_sync", mask, predicate != 0, 0, 32);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
    return (unsigned)emu::warp_collective(emu::WarpOp::reduce_add, "__reduce_add_sync", mask, value, 0, 32);
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
    return (unsigned)emu::warp_collective(emu::WarpOp::reduce_min, "__reduce_min_sync", mask, value, 0, 32);
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
    return (unsigned)emu::warp_collective(emu::WarpOp::reduce_max, "__reduce_max_sync", mask, value, 0, 32);
}
// which lanes are converged here is not modelled (threads run one at a time): refused, not guessed
inline unsigned __activemask() { emu::fail("__activemask is not supported by the emulator"); }
// __trap aborts the kernel on the GPU (the launch fails and the context with it): here the program ends,
// naming the kernel, block and thread (exec.cpp)
namespace emu {
[[noreturn]] void trap();
}
inline void __trap() { emu::trap(); }

// ----------------------------------------------------------------------------
// memory fences and atomics. Blocks may run on several host threads at once (EMU_THREADS), so the
// atomics are real host atomics, with every access to the target atomic (the race checker, EMU_TSAN,
// reports a plain access that meets an atomic one); the fences are full fences.

// With the race checker (EMU_TSAN), ThreadSanitizer, which ignores fences, is told the PTX memory
// model's fence patterns (exec.cpp): a fence and then an atomic release what the thread did before the
// fence; an atomic and then a fence acquire what was released to the atomic's address.
#if EMU_TSAN
namespace emu {
void race_check_fence();
void race_check_atomic(const void* address);
}  // namespace emu
#define EMU_FENCE() emu::race_check_fence()
#define EMU_ATOMIC(address) emu::race_check_atomic(address)
#else
#define EMU_FENCE() (void)0
#define EMU_ATOMIC(address) (void)(address)
#endif

inline void __threadfence() { EMU_FENCE(); __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { EMU_FENCE(); __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { EMU_FENCE(); __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <typename T>
inline T emu_atomic_fetch_add(T* address, T value) {
    EMU_ATOMIC(address);
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
    } else {
        T old;
        __atomic_load(address, &old, __ATOMIC_RELAXED);
        T desired;
        do {
            desired = (T)(old + value);
        } while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    }
}
inline int atomicAdd(int* address, int value) { return emu_atomic_fetch_add(address, value); }
inline unsigned atomicAdd(unsigned* address, unsigned value) { return emu_atomic_fetch_add(address, value); }
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
    return emu_atomic_fetch_add(address, value);
}
inline float atomicAdd(float* address, float value) { return emu_atomic_fetch_add(address, value); }
inline double atomicAdd(double* address, double value) { return emu_atomic_fetch_add(address, value); }
// A pair of 16-bit floats (bf16x2, half2) added by one compare-and-swap on their 32-bit word: CUDA
// promises each half atomically (sm_60+ for half2, sm_80+ for bf16x2), this does both at once. Returns
// the old pair. Pair needs operator+ (cuda_bf16.h, cuda_fp16.h).
template <typename Pair>
inline Pair emu_atomic_add_pair(Pair* address, Pair value) {
    static_assert(sizeof(Pair) == 4, "a pair of 16-bit values");
    uint32_t* word = reinterpret_cast<uint32_t*>(address);
    EMU_ATOMIC(word);
    uint32_t old = __atomic_load_n(word, __ATOMIC_RELAXED);
    for (;;) {
        Pair old_pair;
        memcpy(&old_pair, &old, sizeof(old));
        Pair sum = old_pair + value;
        uint32_t desired;
        memcpy(&desired, &sum, sizeof(desired));
        if (__atomic_compare_exchange_n(word, &old, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old_pair;
    }
}
inline int atomicSub(int* address, int value) { return EMU_ATOMIC(address), __atomic_fetch_sub(address, value, __ATOMIC_RELAXED); }
inline unsigned atomicSub(unsigned* address, unsigned value) {
    return EMU_ATOMIC(address), __atomic_fetch_sub(address, value, __ATOMIC_RELAXED);
}
template <typename T>
inline T atomicExch(T* address, T value) {
    EMU_ATOMIC(address);
    T old;
    __atomic_exchange(address, &value, &old, __ATOMIC_RELAXED);
    return old;
}
template <typename T>
inline T atomicCAS(T* address, T compare, T value) {
    EMU_ATOMIC(address);
    __atomic_compare_exchange(address, &compare, &value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;  // the old value either way
}
template <typename T>
inline T emu_atomic_update(T* address, T value, bool take_new(T, T)) {
    EMU_ATOMIC(address);
    T old;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    while (take_new(old, value)) {
        if (__atomic_compare_exchange(address, &old, &value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
    }
    return old;
}
inline int atomicMax(int* a, int v) { return emu_atomic_update<int>(a, v, [](int o, int n) { return n > o; }); }
inline unsigned atomicMax(unsigned* a, unsigned v) { return emu_atomic_update<unsigned>(a, v, [](unsigned o, unsigned n) { return n > o; }); }
inline int atomicMin(int* a, int v) { return emu_atomic_update<int>(a, v, [](int o, int n) { return n < o; }); }
inline unsigned atomicMin(unsigned* a, unsigned v) { return emu_atomic_update<unsigned>(a, v, [](unsigned o, unsigned n) { return n < o; }); }
// atomicInc: *a = (old >= limit) ? 0 : old + 1; atomicDec: *a = (old == 0 || old > limit) ? limit : old - 1
// (CUDA Programming Guide, "Atomic Functions"); both return the old value
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    EMU_ATOMIC(a);
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, old >= limit ? 0u : old + 1u, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
    EMU_ATOMIC(a);
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, (old == 0 || old > limit) ? limit : old - 1u, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
}
inline int atomicOr(int* a, int v) { return EMU_ATOMIC(a), __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicOr(unsigned* a, unsigned v) { return EMU_ATOMIC(a), __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }
inline int atomicAnd(int* a, int v) { return EMU_ATOMIC(a), __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicAnd(unsigned* a, unsigned v) { return EMU_ATOMIC(a), __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }

// ----------------------------------------------------------------------------
// cache-hinted loads and stores: the hint changes nothing on the CPU

template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldca(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldlu(const T* p) { return *p; }
template <typename T> inline T __ldcv(const T* p) { return *p; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline void __stwb(T* p, T v) { *p = v; }
template <typename T> inline void __stwt(T* p, T v) { *p = v; }
// a shared-memory window address: the offset in the block's dynamic shared memory (exec.cpp), which is
// the window from 0 (static __shared__ variables have none here: it fails for them)
namespace emu {
size_t shared_window_offset(const void* p);
}
inline size_t __cvta_generic_to_shared(const void* p) { return emu::shared_window_offset(p); }

// ----------------------------------------------------------------------------
// intrinsics. The fast-math ones (__expf, __fdividef, ...) are less precise on the GPU; here they
// are the exact functions, so results agree with the GPU's only within the documented ulp bounds.

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline unsigned __float_as_uint(float x) { return emu::from_bits<unsigned>(emu::to_bits(x)); }
inline int __float_as_int(float x) { return emu::from_bits<int>(emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return emu::from_bits<float>(emu::to_bits(x)); }
inline float __int_as_float(int x) { return emu::from_bits<float>(emu::to_bits(x)); }
inline long long __double_as_longlong(double x) { return emu::from_bits<long long>(emu::to_bits(x)); }
inline double __longlong_as_double(long long x) { return emu::from_bits<double>(emu::to_bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __mul24(int a, int b) { return a * b; }

// ----------------------------------------------------------------------------
// launches

namespace emu {

// The first two to four values between <<< >>>: grid, block, dynamic shared bytes, stream.
// Templates so that `<<<n, 256, bytes, stream>>>` with int values converts as in CUDA (no narrowing error).
template <typename... A>
struct PendingLaunch;

struct LaunchConfig {
    dim3 grid, block;
    size_t shared_bytes = 0;
    cudaStream_t stream = nullptr;
    template <typename G, typename B>
    LaunchConfig(G g, B b) : grid(to_dim3(g)), block(to_dim3(b)) {}
    template <typename G, typename B, typename S>
    LaunchConfig(G g, B b, S s) : grid(to_dim3(g)), block(to_dim3(b)), shared_bytes((size_t)s) {}
    template <typename G, typename B, typename S>
    LaunchConfig(G g, B b, S s, cudaStream_t st) : grid(to_dim3(g)), block(to_dim3(b)), shared_bytes((size_t)s), stream(st) {}

    template <typename T>
    static dim3 to_dim3(T v) {
        if constexpr (std::is_integral<T>::value) {
            return dim3((unsigned)v);
        } else {
            return dim3(v);
        }
    }
    template <typename... A>
    PendingLaunch<std::decay_t<A>...> operator()(A&&... args) const;
    // `kernel<<<...>>>(args)` as cu2cpp.sh writes it with EMU_LAUNCH_BY_CALL=1 (below)
    template <typename F, typename... A>
    void by_call(F call, A&&... args) const;
};

template <typename... A>
struct PendingLaunch {
    LaunchConfig config;
    std::tuple<A...> args;
};

template <typename... A>
PendingLaunch<std::decay_t<A>...> LaunchConfig::operator()(A&&... a) const {
    return PendingLaunch<std::decay_t<A>...>{*this, std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
}

// exec.cpp: checks the configuration against the hardware limits (setting the launch error that
// cudaGetLastError returns, as a failed launch does) and returns false if it is refused.
bool launch_check(const void* kernel, const LaunchConfig& config);
// Refuses (fails) a non-null pointer argument that is neither device nor pinned host memory.
void check_pointer_argument(const void* kernel, int index, const void* pointer);
// Queues the grid on config.stream; each thread calls run_thread(args).
void launch_enqueue(const void* kernel, const LaunchConfig& config, void (*run_thread)(void*), std::shared_ptr<void> args);

template <typename... P>
struct BoundKernel {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
    static void run_thread(void* self) {
        BoundKernel* bound = static_cast<BoundKernel*>(self);
        std::apply(bound->kernel, bound->args);  // each thread gets its own copy of the parameters
    }
};

// Refuses (fails) a non-zero integer argument given for a pointer parameter.
void refuse_integer_for_pointer(const void* kernel, int index, long long value);

// One argument converted to its parameter's type P, as the call would. An integer for a pointer
// parameter is NULL (g++'s `__null`, a long) or a literal 0: at the call CUDA takes such a null pointer
// constant as the null pointer, but the launch has stored its value, which no longer converts; it
// becomes nullptr here, and any other integer is refused (CUDA would not compile it).
template <typename P, typename A>
std::decay_t<P> convert_argument(const void* kernel, int index, const A& value) {
    using Param = std::decay_t<P>;
    if constexpr (std::is_pointer<Param>::value && std::is_integral<A>::value && !std::is_same<A, bool>::value) {
        if (value != 0) refuse_integer_for_pointer(kernel, index, (long long)value);
        return nullptr;
    } else {
        Param converted(value);
        return converted;
    }
}
template <typename... P, typename... A, size_t... I>
std::tuple<std::decay_t<P>...> convert_arguments(const void* kernel, const std::tuple<A...>& args,
                                                 std::index_sequence<I...>) {
    return std::tuple<std::decay_t<P>...>(convert_argument<P>(kernel, (int)I + 1, std::get<I>(args))...);
}

template <typename T>
inline void check_argument(const void* kernel, int index, const T& value) {
    if constexpr (std::is_pointer<T>::value) {
        if (value != nullptr) check_pointer_argument(kernel, index, (const void*)value);
    }
}

// Checks the launch, converts the arguments to the kernel's parameter types (once, as CUDA copies
// them at the launch) and queues the grid.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), PendingLaunch<A...>&& pending) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    const void* id = reinterpret_cast<const void*>(kernel);
    auto bound = std::make_shared<BoundKernel<P...>>(
        BoundKernel<P...>{kernel, convert_arguments<P...>(id, pending.args, std::index_sequence_for<P...>{})});
    if (!launch_check(id, pending.config)) return;
    std::apply([&](const auto&... values) {
        int index = 0;
        (check_argument(id, ++index, values), ...);
    }, bound->args);
    launch_enqueue(id, pending.config, &BoundKernel<P...>::run_thread, std::move(bound));
}

// `kernel *LaunchConfig{...}(args)`, what cu2cpp.sh writes for `kernel<<<...>>>(args)`.
template <typename... P, typename... A>
void operator*(void (*kernel)(P...), PendingLaunch<A...>&& pending) {
    launch(kernel, std::move(pending));
}

// A launch that names its kernel by a call, for programs written elsewhere: cu2cpp.sh with
// EMU_LAUNCH_BY_CALL=1 writes `LaunchConfig{...}.by_call([](auto... a) { kernel(a...); }, args)`, so a
// kernel template's arguments are deduced as in a call, as CUDA deduces them (a float* for a const
// float* parameter, which the pointer form above cannot take). Each thread calls the lambda on its own
// copy of the arguments. The launch is known by the lambda's own entry point: it has no ptxas register
// count, and cudaFuncSetAttribute on the kernel does not reach it (above 48 KiB of dynamic shared memory
// the launch is refused).
template <typename F, typename... A>
struct BoundCall {
    F call;
    std::tuple<A...> args;
    static void run_thread(void* self) {
        BoundCall* bound = static_cast<BoundCall*>(self);
        std::apply(bound->call, bound->args);
    }
};

template <typename F, typename... A>
void LaunchConfig::by_call(F call, A&&... args) const {
    using Bound = BoundCall<F, std::decay_t<A>...>;
    const void* id = reinterpret_cast<const void*>(&Bound::run_thread);
    auto bound = std::make_shared<Bound>(Bound{call, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)});
    if (!launch_check(id, *this)) return;
    std::apply([&](const auto&... values) {
        int index = 0;
        (check_argument(id, ++index, values), ...);
    }, bound->args);
    launch_enqueue(id, *this, &Bound::run_thread, std::move(bound));
}

}  // namespace emu

#include "emu/launch_overloaded.h"
