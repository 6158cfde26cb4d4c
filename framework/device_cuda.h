// What the framework asks of the CUDA runtime: device discovery, the caching allocator, copies with
// dtype conversion, fill, accumulate and synchronisation. Compiled by nvcc (allocator_cuda.cu,
// copy_cuda.cu) over raw pointers, using only framework's header-only core, so //framework can
// depend on it without a cycle. The Tensor-level callers are allocator.cc, copy.cc and device.cc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "framework/allocator.h"
#include "framework/dtype.h"

namespace ampgrad::cuda {

/// Number of usable CUDA devices; 0 on any error (no driver: error 35, no device), printing nothing.
int device_count();

/// The process-wide caching allocator for Device::kCUDA (current device at allocation time).
/// Freed device blocks are kept in free lists per (device, size class) and handed out again, so a
/// training step does not call cudaMalloc/cudaFree. All work runs on the legacy default stream, so
/// reusing a freed block is stream-ordered and safe.
Allocator& caching_allocator();
/// Returns every cached free block to the driver (reserved_bytes drops to current use).
void empty_cache();
/// The size class a request of `nbytes` is rounded up to (what the allocator reserves for it).
size_t size_class(size_t nbytes);

/// dst[0..n) = src[0..n) converted from src_dtype to dst_dtype. At least one side is CUDA.
/// Conversion happens on the device; host<->device with a dtype change goes through a contiguous
/// device staging buffer in the host side's dtype. Device->host waits for the copy.
void copy_raw(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
              int64_t n);
/// dst[0..n) = value, rounded to dtype as the CPU does (double -> compute type -> storage).
void fill_raw(void* dst, DType dtype, int64_t n, double value);
/// dst[i] += src[i] in the compute type, rounded once.
void accumulate_raw(void* dst, const void* src, DType dtype, int64_t n);

/// Waits for all queued device work.
void synchronize();
/// How many times the host has waited for the GPU: synchronize() calls and device-to-host copies.
int64_t host_sync_count();

}  // namespace ampgrad::cuda
