// What the framework asks of the CUDA runtime: device discovery, the caching allocators, copies with
// dtype conversion, fill, accumulate and synchronisation. Compiled by nvcc (allocator_cuda.cu,
// copy_cuda.cu) over raw pointers, using only framework's header-only core, so //framework can
// depend on it without a cycle. The Tensor-level callers are allocator.cc, copy.cc and device.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "framework/allocator.h"
#include "framework/device.h"
#include "framework/dtype.h"

namespace ampgrad::cuda {

/// Number of usable CUDA devices; 0 on any error (no driver: error 35, no device), printing nothing.
int device_count();
/// Why cudaGetDeviceCount failed ("" when it did not), for cuda::unavailable_reason().
const std::string& device_query_error();

/// The process-wide caching allocator for Device::kCUDA (current device at allocation time).
/// Freed device blocks are kept in free lists per (device, size class) and handed out again, so a
/// training step does not call cudaMalloc/cudaFree. All work runs on the legacy default stream, so
/// reusing a freed block is stream-ordered and safe.
Allocator& caching_allocator();
/// Page-locked host memory (cudaHostAlloc), cached the same way. A freed block is handed out again
/// only once the copies queued before its free have finished (an event recorded at the free).
Allocator& pinned_allocator();
/// Returns every cached free block (device and pinned) to the driver.
void empty_cache();

/// Whether the host side of a copy is page-locked (from pinned_allocator()).
enum class HostMemory : bool { kPageable, kPinned };

/// dst[0..n) = src[0..n) converted from src_dtype to dst_dtype. At least one side is CUDA.
/// Conversion happens on the device; host<->device with a dtype change goes through a contiguous
/// device staging buffer in the host side's dtype. Every copy touching the host waits for the GPU
/// (cudaMemcpy from pageable memory first waits for queued work), and is counted as a host sync,
/// except a host-to-device copy from pinned memory with NonBlocking::kYes, which is queued with
/// cudaMemcpyAsync and returns at once.
void copy_raw(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
              int64_t n, NonBlocking non_blocking = NonBlocking::kNo, HostMemory src_memory = HostMemory::kPageable);
/// dst[0..n) = value, rounded to dtype as the CPU does (double -> compute type -> storage).
void fill_raw(void* dst, DType dtype, int64_t n, double value);
/// dst[i] += src[i] in the compute type, rounded once.
void accumulate_raw(void* dst, const void* src, DType dtype, int64_t n);

/// A device copy of nbytes of host data (a kernel's argument table), queued without a host wait:
/// the bytes go through a pinned block, then cudaMemcpyAsync. Return it with
/// caching_allocator().deallocate(ptr, nbytes) once the kernels that read it are queued.
void* upload_async(const void* host, size_t nbytes);

/// Waits for all queued device work.
void synchronize();
/// How many times the host has waited for the GPU: synchronize() calls, device-to-host copies and
/// host-to-device copies other than the asynchronous pinned ones.
int64_t host_sync_count();

}  // namespace ampgrad::cuda
