// cudaMemcpy2D and cudaMemcpy2DAsync (CUDA Runtime API, "Memory Management"): a matrix of height rows of
// width bytes, row r read at src + r·spitch and written at dst + r·dpitch, the bytes between width and
// the pitches untouched. Each row is one cudaMemcpy / cudaMemcpyAsync, so the copies' checks (kinds,
// device pointers), their stream order and the race checker's annotations are those of runtime.cpp.
//   width 12, height 3, spitch 12, dpitch 16: rows land at dst + 0, 16, 32; dst bytes 12..15 of each
//   row keep their values.
#include <cstdint>

#include <cuda_runtime.h>

#include "internal.h"

namespace {

template <typename Copy>
cudaError_t copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, Copy copy) {
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > dpitch || width > spitch) return emu::set_error(cudaErrorInvalidPitchValue);
    if (dst == nullptr || src == nullptr) return emu::set_error(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) {
        cudaError_t status = copy((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
        if (status != cudaSuccess) return status;
    }
    return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
    return copy_rows(dst, dpitch, src, spitch, width, height,
                     [&](void* d, const void* s, size_t n) { return cudaMemcpy(d, s, n, kind); });
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
    return copy_rows(dst, dpitch, src, spitch, width, height,
                     [&](void* d, const void* s, size_t n) { return cudaMemcpyAsync(d, s, n, kind, stream); });
}
