// The CUDA caching allocator and device discovery. Freed device blocks are kept in free lists per
// (device, size class) and handed out again, so a training step does not call cudaMalloc/cudaFree.
#pragma once

#include "framework/allocator.h"

namespace ampgrad::cuda {

/// Number of usable CUDA devices; 0 on any error (no driver: error 35, no device), printing nothing.
int device_count();

/// The process-wide caching allocator for Device::kCUDA (current device at allocation time).
/// All work runs on the legacy default stream, so reusing a freed block is stream-ordered and safe.
Allocator& caching_allocator();

/// Returns every cached free block to the driver (reserved_bytes drops to current use).
void empty_cache();

/// The size class a request of `nbytes` is rounded up to (what the allocator reserves for it).
size_t size_class(size_t nbytes);

}  // namespace ampgrad::cuda
