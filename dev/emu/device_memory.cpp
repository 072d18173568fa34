// Device memory, and what is known about it: which bytes something has written (initcheck).
//
// cudaMalloc's memory is host memory, 256-byte aligned like a GPU's allocations and filled with 0xFF
// bytes, so that a read of a never-written float gives NaN (a bf16 too), never zero.
//
// initcheck (the EMU_ASAN=1 build, EMU_INITCHECK=1): like compute-sanitizer --tool initcheck, every
// read of device memory that nothing wrote is reported, with the kernel, the block, the thread, the
// allocation and the line of source. The poison alone misses such reads where the NaN vanishes (fmaxf,
// a comparison, an integer): the value is lost, not the read. How it works:
// - device memory comes from one arena of reserved address space, with a shadow beside it: one byte
//   per byte of the arena, 1 once written. Whether an address is device memory is one comparison;
// - AddressSanitizer's instrumentation already calls a function for every load and store of the
//   kernels (__asan_load4, __asan_store16, ...: the CUDA sources are compiled with
//   asan-instrumentation-with-call-threshold=0, emu.mk). This file defines those functions in the
//   program, in front of AddressSanitizer's own (the dynamic linker takes the program's first): each
//   makes AddressSanitizer's bounds check as its own would, then a store into the arena marks its
//   shadow bytes written and a load checks them;
// - what writes device memory without an instrumented store marks it by hand: copies and memsets
//   (runtime.cpp: a device-to-device copy carries the source's shadow), NCCL's outputs;
// - only reads by a CUDA thread (exec.cpp knows which runs) are reported, and those an emulated
//   library declares (initcheck_read: the cuBLAS GEMM's operands): the host's copies of device memory
//   are not reads a GPU would check;
// - each place in the source is reported once (the load's return address), with the count of all
//   reads at the end; a program with reports exits with status 67 (as the race checker's exit with
//   ThreadSanitizer's 66).
// Allocations in the arena are 256-byte aligned and followed by at least 256 bytes poisoned for
// AddressSanitizer (an access past the end is reported, as its own heap redzones would), and freed
// memory is poisoned (a use after free is reported) and never handed out again.
// This file is compiled without instrumentation: its loads and stores are the checker's own.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

#include <cuda_runtime.h>

#include "internal.h"

#if EMU_INITCHECK
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace emu {

#if !EMU_INITCHECK

void* device_memory_allocate(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return nullptr;
    memset(p, 0xFF, bytes);
    return p;
}

void device_memory_free(void* p, size_t bytes) {
    memset(p, 0xFF, bytes);  // a use after free reads NaN
    free(p);
}

void device_memory_copy(void* dst, const void* src, size_t bytes) { memmove(dst, src, bytes); }
void device_memory_set(void* dst, int value, size_t bytes) { memset(dst, value, bytes); }
void initcheck_mark_written(const void*, size_t) {}
bool initchecking() { return false; }
int initcheck_reports() { return 0; }
void initcheck_forget_reports() {}
void initcheck_read(const void*, size_t, const char*) {}

#else

namespace {

// 256 GiB of address space for all the device memory a process allocates over its life (addresses are
// never reused), and as much for the shadow; reserved, not committed: pages exist once touched
constexpr size_t arena_bytes = 256ull << 30;
constexpr size_t alignment = 256, redzone = 256;

struct Arena {
    char* base = nullptr;
    unsigned char* shadow = nullptr;
    size_t next = 0;  // bytes of the arena handed out (allocations and their redzones)
    std::mutex mutex;
};

void on_asan_report(const char* report);

Arena& arena() {
    static Arena* a = [] {
        Arena* a = new Arena;  // never destroyed: the device thread may outlive main
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
        void* base = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
        void* shadow = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (base == MAP_FAILED || shadow == MAP_FAILED)
            fail("initcheck: cannot reserve %zu GiB of address space for device memory and its shadow", arena_bytes >> 30);
        a->base = (char*)base;
        a->shadow = (unsigned char*)shadow;
        __asan_set_error_report_callback(on_asan_report);
        return a;
    }();
    return *a;
}

// the arena's base, read on every load and store: set once, at the first allocation (before it, no
// address is in the arena)
char* arena_base = nullptr;
unsigned char* arena_shadow = nullptr;

inline bool in_arena(uintptr_t p, size_t bytes) {
    return arena_base && p - (uintptr_t)arena_base < arena_bytes && p + bytes - (uintptr_t)arena_base <= arena_bytes;
}

// the releasable pages of [p, p + bytes): whole pages only
void release_pages(char* p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = ((uintptr_t)p + page - 1) & ~(page - 1), end = ((uintptr_t)p + bytes) & ~(page - 1);
    if (end > begin) madvise((void*)begin, end - begin, MADV_DONTNEED);
}

std::atomic<int> reads_reported{0};
std::mutex reported_mutex;
std::unordered_set<uintptr_t>* reported_places = new std::unordered_set<uintptr_t>;  // load sites reported
bool exit_hook_set = false;

bool reporting() {
    static const bool on = [] {
        const char* e = getenv("EMU_INITCHECK");
        return !(e && strcmp(e, "0") == 0);
    }();
    return on;
}

void exit_with_status() {
    int n = reads_reported.load();
    if (n == 0) return;
    fflush(stdout);
    fprintf(stderr, "cuda-emu: initcheck: %d read(s) of never-written device memory (EMU_INITCHECK=0 turns the check off)\n", n);
    fflush(stderr);
    _exit(67);
}

// The allocation holding `p`, for the report: its start and size (0, 0 when freed)
void describe_allocation(uintptr_t p, uintptr_t* start, size_t* bytes);

// `who`: the CUDA thread, or an emulated library's call; `place`: one report per place
__attribute__((noinline)) void report_read(uintptr_t p, size_t bytes, uintptr_t place, std::string who, const char* where) {
    reads_reported++;
    {
        std::lock_guard<std::mutex> lock(reported_mutex);
        if (!exit_hook_set) {
            exit_hook_set = true;
            atexit(exit_with_status);
        }
        if (!reported_places->insert(place).second) return;  // this place is reported already
    }
    uintptr_t start = 0;
    size_t size = 0;
    describe_allocation(p, &start, &size);
    fflush(stdout);
    fprintf(stderr,
            "cuda-emu: initcheck: %s reads %zu bytes at %p that nothing wrote (device allocation %p of %zu bytes, "
            "offset %zu)\n  at %s\n",
            who.c_str(), bytes, (void*)p, (void*)start, size, (size_t)(p - start), where);
    fflush(stderr);
}

// the first of `bytes` shadow bytes at `p` that is 0 (never written), or nullptr
inline const unsigned char* unwritten(uintptr_t p, size_t bytes) {
    const unsigned char* s = arena_shadow + (p - (uintptr_t)arena_base);
    for (size_t i = 0; i < bytes; i++)
        if (!s[i]) return s + i;
    return nullptr;
}

// a load by kernel code (instrumented); the host's own loads (a test's, the runtime's) are not checked
__attribute__((noinline)) void kernel_load_of_unwritten(uintptr_t p, size_t bytes, uintptr_t place) {
    std::string who = current_cuda_thread();
    if (who.empty() || !reporting()) return;
    char where[512] = "";
    __sanitizer_symbolize_pc((void*)(place - 1), "%F %L", where, sizeof(where));
    report_read(p, bytes, place, who, where);
}

inline void on_load(uintptr_t p, size_t bytes, uintptr_t place) {
    if (in_arena(p, bytes) && unwritten(p, bytes)) kernel_load_of_unwritten(p, bytes, place);
}

inline void on_store(uintptr_t p, size_t bytes) {
    if (in_arena(p, bytes)) memset(arena_shadow + (p - (uintptr_t)arena_base), 1, bytes);
}

// every allocation the arena handed out, freed or not (addresses are never reused): start -> its
// size, and whether it was freed. The runtime's own list knows the live ones too, but under a lock
// this file must not wait for while a report is printed.
struct Allocation {
    size_t bytes;
    bool freed;
};
std::mutex allocations_mutex;
std::map<uintptr_t, Allocation>* allocations = new std::map<uintptr_t, Allocation>;

// the allocation `p` is in or in the redzone after
const std::pair<const uintptr_t, Allocation>* allocation_of(uintptr_t p) {
    auto it = allocations->upper_bound(p);
    if (it == allocations->begin()) return nullptr;
    --it;
    return p - it->first < it->second.bytes + redzone ? &*it : nullptr;
}

void describe_allocation(uintptr_t p, uintptr_t* start, size_t* bytes) {
    std::lock_guard<std::mutex> lock(allocations_mutex);
    if (auto a = allocation_of(p)) *start = a->first, *bytes = a->second.bytes;
}

// AddressSanitizer reports an access to the arena's poisoned bytes as a "use-after-poison"; this adds
// what they are in CUDA's terms (its callback runs before it ends the program)
void on_asan_report(const char*) {
    uintptr_t p = (uintptr_t)__asan_get_report_address();
    if (!in_arena(p, 1)) return;
    std::lock_guard<std::mutex> lock(allocations_mutex);
    auto a = allocation_of(p);
    if (!a) return;
    size_t offset = p - a->first;
    if (a->second.freed)
        fprintf(stderr, "cuda-emu: AddressSanitizer: the address is %zu bytes into device allocation %p of %zu bytes, "
                        "freed by cudaFree (a use after free)\n", offset, (void*)a->first, a->second.bytes);
    else
        fprintf(stderr, "cuda-emu: AddressSanitizer: the address is %zu bytes past the end of device allocation %p of %zu bytes "
                        "(out of bounds)\n", offset - a->second.bytes, (void*)a->first, a->second.bytes);
}

}  // namespace

void* device_memory_allocate(size_t bytes) {
    Arena& a = arena();
    char* p;
    {
        std::lock_guard<std::mutex> lock(a.mutex);
        arena_base = a.base, arena_shadow = a.shadow;
        size_t span = (bytes + alignment - 1) / alignment * alignment + redzone;
        if (span > arena_bytes - a.next) return nullptr;  // the arena's address space is used up
        p = a.base + a.next;
        a.next += span;
        __asan_poison_memory_region(p + bytes, span - bytes);
    }
    memset(p, 0xFF, bytes);  // the poison (not a write: the shadow stays 0)
    std::lock_guard<std::mutex> lock(allocations_mutex);
    (*allocations)[(uintptr_t)p] = {bytes, false};
    return p;
}

void device_memory_free(void* p, size_t bytes) {
    {
        std::lock_guard<std::mutex> lock(allocations_mutex);
        (*allocations)[(uintptr_t)p].freed = true;
    }
    memset(arena_shadow + ((char*)p - arena_base), 0, bytes);
    release_pages((char*)p, bytes);
    release_pages((char*)arena_shadow + ((char*)p - arena_base), bytes);
    __asan_poison_memory_region(p, bytes);  // a use after free: AddressSanitizer's use-after-poison
}

// A copy carries what is known: from device memory, the source's shadow; from the host, written.
void device_memory_copy(void* dst, const void* src, size_t bytes) {
    memmove(dst, src, bytes);
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (!in_arena(d, bytes)) return;
    if (in_arena(s, bytes))
        memmove(arena_shadow + (d - (uintptr_t)arena_base), arena_shadow + (s - (uintptr_t)arena_base), bytes);
    else
        on_store(d, bytes);
}

void device_memory_set(void* dst, int value, size_t bytes) {
    memset(dst, value, bytes);
    on_store((uintptr_t)dst, bytes);
}

void initcheck_mark_written(const void* p, size_t bytes) { on_store((uintptr_t)p, bytes); }

void initcheck_read(const void* p, size_t bytes, const char* who) {
    uintptr_t q = (uintptr_t)p;
    if (!in_arena(q, bytes) || !reporting()) return;
    if (unwritten(q, bytes)) report_read(q, bytes, (uintptr_t)who, who, "(an emulated library call)");
}
bool initchecking() { return reporting(); }
int initcheck_reports() { return reads_reported.load(); }
void initcheck_forget_reports() {
    reads_reported = 0;
    std::lock_guard<std::mutex> lock(reported_mutex);
    reported_places->clear();
}


#endif  // EMU_INITCHECK

}  // namespace emu

#if EMU_INITCHECK
// AddressSanitizer's entry points for instrumented loads and stores, defined here in front of its own
// (see the top of this file). Each makes AddressSanitizer's check (its shadow memory: one byte per 8
// bytes of memory, 0 when all 8 are addressable, k when the first k are, negative when none; a report
// through its __asan_report_* functions), then checks or marks initcheck's shadow. The check is made
// here rather than by calling AddressSanitizer's own __asan_load4: one call per access, not two.
extern "C" {
void __asan_report_load1(uintptr_t);
void __asan_report_load2(uintptr_t);
void __asan_report_load4(uintptr_t);
void __asan_report_load8(uintptr_t);
void __asan_report_load16(uintptr_t);
void __asan_report_load_n(uintptr_t, size_t);
void __asan_report_store1(uintptr_t);
void __asan_report_store2(uintptr_t);
void __asan_report_store4(uintptr_t);
void __asan_report_store8(uintptr_t);
void __asan_report_store16(uintptr_t);
void __asan_report_store_n(uintptr_t, size_t);
}

namespace {
uintptr_t asan_shadow_offset() {
    static const uintptr_t offset = [] {
        size_t scale = 0, offset = 0;
        __asan_get_shadow_mapping(&scale, &offset);
        if (scale != 3) emu::fail("initcheck: AddressSanitizer's shadow scale is %zu, not 3", scale);
        return (uintptr_t)offset;
    }();
    return offset;
}

// true when AddressSanitizer would report an access of `size` bytes at p (size 1, 2, 4, 8 within one
// 8-byte granule; 16 and other sizes through its region check)
inline bool asan_poisoned(uintptr_t p, size_t size) {
    const int8_t* shadow = (const int8_t*)((p >> 3) + asan_shadow_offset());
    if (size <= 8 && (p & 7) + size <= 8) return *shadow != 0 && (int8_t)((p & 7) + size - 1) >= *shadow;
    return __asan_region_is_poisoned((void*)p, size) != nullptr;
}
}  // namespace

#define EMU_ASAN_ACCESS(size)                                                                           \
    extern "C" void __asan_load##size(uintptr_t p) {                                                    \
        if (asan_poisoned(p, size)) __asan_report_load##size(p); /* ends the program */                 \
        emu::on_load(p, size, (uintptr_t)__builtin_return_address(0));                                  \
    }                                                                                                   \
    extern "C" void __asan_store##size(uintptr_t p) {                                                   \
        if (asan_poisoned(p, size)) __asan_report_store##size(p);                                       \
        emu::on_store(p, size);                                                                         \
    }
EMU_ASAN_ACCESS(1)
EMU_ASAN_ACCESS(2)
EMU_ASAN_ACCESS(4)
EMU_ASAN_ACCESS(8)
EMU_ASAN_ACCESS(16)
#undef EMU_ASAN_ACCESS

extern "C" void __asan_loadN(uintptr_t p, size_t size) {
    if (size && asan_poisoned(p, size)) __asan_report_load_n(p, size);
    emu::on_load(p, size, (uintptr_t)__builtin_return_address(0));
}
extern "C" void __asan_storeN(uintptr_t p, size_t size) {
    if (size && asan_poisoned(p, size)) __asan_report_store_n(p, size);
    emu::on_store(p, size);
}
#endif
