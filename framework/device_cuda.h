// What the framework asks of the CUDA runtime: device discovery, the caching allocators, argument
// uploads and synchronisation (the storage kernels, copies, fill and accumulate, are declared with
// their CPU twins in storage_kernels.h). Compiled by nvcc (allocator_cuda.cu, copy_cuda.cu) over
// raw pointers, using only framework's header-only core, so //framework can depend on it without a
// cycle. The callers are allocator.cc and device.cc.
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
