// Per-device memory: every tensor's bytes come from the allocator of its device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "framework/device.h"

namespace ampgrad {

/// The bytes an allocator hands out and holds (see memory_stats).
struct MemoryStats {
  int64_t current_bytes = 0;  ///< held by live tensors now
  int64_t peak_bytes = 0;     ///< most ever held at once (since the last reset)
  int64_t reserved_bytes = 0; ///< held from the system, including cached free blocks
};

/// Hands out raw, suitably aligned memory for one device.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// At least nbytes, aligned for any element type (kCpuAlignment on the CPU); throws when out of memory.
  virtual void* allocate(size_t nbytes) = 0;
  /// Returns a block from allocate(nbytes), with the same nbytes.
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  /// Live, peak and reserved bytes.
  virtual MemoryStats stats() const = 0;
  /// Starts the peak over from the bytes held now.
  virtual void reset_peak() = 0;
  /// Makes the peak at least `bytes`: a measurement that reset it gives the earlier peak back.
  virtual void raise_peak(int64_t bytes) = 0;
  /// Gives cached free blocks back to the system; live blocks are untouched.
  virtual void empty_cache() = 0;
};

/// The allocator of `device`; throws a clear Error for CUDA in a build without CUDA.
Allocator& allocator_for(Device device);

/// Page-locked host memory for Tensor::pin_memory, from which host-to-device copies can be queued
/// without a wait; throws a clear Error in a build without CUDA.
Allocator& pinned_host_allocator();

/// Live, peak and reserved bytes of a device's allocator.
MemoryStats memory_stats(Device device);

/// Gives the free blocks a device's allocator caches back to the system, as PyTorch's
/// torch.cuda.empty_cache(): reserved_bytes drops to what live tensors hold (on the CPU, blocks up
/// to 1 MiB cached by other threads stay until those threads end). Freed blocks are cached so a
/// training step reuses the last step's memory instead of asking the system (and, on the CPU,
/// having every page zeroed) again; the cache is bounded, so calling this is never required.
void empty_cache(Device device);

/// CPU allocations are aligned to a cache line (and to any AVX-512 vector).
inline constexpr size_t kCpuAlignment = 64;

}  // namespace ampgrad
