// The framework's own device work, a kernel family like those of ops/ (AG_ON_BACKEND in device.h):
// copies with dtype conversion and device transfer, fill and accumulate, over raw storage. The
// cpu:: loops are in copy.cc, the cuda:: kernels in copy_cuda.cu. Callers (copy_, fill_,
// accumulate_ in copy.h; DistributedDataParallel's bucket copies; a CUDA kernel reading back one
// value) have checked sizes and dtypes; nothing here bumps a tensor's version.
#pragma once

#include <cstdint>

#include "framework/device.h"
#include "framework/dtype.h"

namespace ampgrad::storage {

/// Whether the host side of a copy is page-locked (from pinned_host_allocator() in allocator.h).
enum class HostMemory : bool { kPageable, kPinned };

/// The backend of a copy: CUDA when either side is on the GPU.
constexpr Device copy_backend(Device dst, Device src) { return dst == Device::kCUDA ? dst : src; }

// dst[0..n) = src[0..n) converted from src_dtype to dst_dtype. On CUDA (at least one side on the
// GPU) conversion happens on the device; host<->device with a dtype change goes through a
// contiguous device staging buffer in the host side's dtype. Every copy touching the host waits
// for the GPU and counts as a host sync, except a host-to-device copy from pinned memory with
// NonBlocking::kYes, which is queued and returns at once.
namespace cpu {
void copy(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
          int64_t n, NonBlocking non_blocking, HostMemory src_memory);
}
namespace cuda {
void copy(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
          int64_t n, NonBlocking non_blocking, HostMemory src_memory);
}
inline void copy(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
                 int64_t n, NonBlocking non_blocking = NonBlocking::kNo,
                 HostMemory src_memory = HostMemory::kPageable) {
  AG_ON_BACKEND(copy_backend(dst_device, src_device), copy, dst, dst_dtype, dst_device, src, src_dtype, src_device,
                n, non_blocking, src_memory);
}

// dst[0..n) = value, rounded once from double to the storage type (an int64 truncated).
namespace cpu {
void fill(void* dst, DType dtype, int64_t n, double value);
}
namespace cuda {
void fill(void* dst, DType dtype, int64_t n, double value);
}
inline void fill(Device device, void* dst, DType dtype, int64_t n, double value) {
  AG_ON_BACKEND(device, fill, dst, dtype, n, value);
}

// dst[i] += src[i] for a floating dtype, summed in the compute type and rounded once.
namespace cpu {
void accumulate(void* dst, const void* src, DType dtype, int64_t n);
}
namespace cuda {
void accumulate(void* dst, const void* src, DType dtype, int64_t n);
}
inline void accumulate(Device device, void* dst, const void* src, DType dtype, int64_t n) {
  AG_ON_BACKEND(device, accumulate, dst, src, dtype, n);
}

}  // namespace ampgrad::storage
