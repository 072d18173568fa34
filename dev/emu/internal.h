// Shared between the emulator core's own files (exec.cpp, runtime.cpp); not seen by CUDA sources.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <cuda_runtime.h>

namespace emu {

// An H100 SXM's limits (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
// for 9.0, and the H100 datasheet for the SM count and memory).
struct DeviceLimits {
    int max_threads_per_block = 1024;
    int max_shared_per_block = 48 * 1024;          // without opting in
    int max_shared_per_block_optin = 227 * 1024;   // cudaFuncAttributeMaxDynamicSharedMemorySize
    int shared_per_sm = 228 * 1024;
    int registers_per_block = 65536;
    int multiprocessors = 132;
    size_t global_memory = 80ull << 30;
    int l2_bytes = 50 * 1024 * 1024;
};
inline constexpr DeviceLimits H100{};

// The emulated device's memory: H100.global_memory, or EMU_DEVICE_MEMORY (bytes, or with a K, M or G
// suffix, powers of 1024: "24G" for a 24 GiB card). cudaMalloc beyond it fails with
// cudaErrorMemoryAllocation, and cudaMemGetInfo and the device properties report against it.
size_t device_memory_bytes();

// Records `error` as this host thread's last error (cudaGetLastError) and returns it.
cudaError_t set_error(cudaError_t error);

// enqueue with a name built at run time
void enqueue_named(cudaStream_t stream, std::string what, std::function<void()> task);

// the kernel's demangled name (or its address when the symbol is not visible)
std::string kernel_name(const void* kernel);

// Device memory (device_memory.cpp): cudaMalloc's and cudaFree's memory, 256-byte aligned and filled
// with 0xFF bytes; copies and memsets into it, which tell initcheck (EMU_INITCHECK builds) what they wrote.
void* device_memory_allocate(size_t bytes);  // nullptr when there is no room
void device_memory_free(void* p, size_t bytes);
void device_memory_copy(void* dst, const void* src, size_t bytes);  // memmove; either side may be device memory
void device_memory_set(void* dst, int value, size_t bytes);

// "kernel <name> block (x,y,z) thread (x,y,z)" of the CUDA thread running on this host thread, or ""
// outside a kernel (exec.cpp)
std::string current_cuda_thread();

}  // namespace emu
