// The caching allocator behind CUDA device memory and pinned host memory: size classes, free lists
// per (device, class), byte counters, and the retry after an out-of-memory, over an injected
// DeviceMemory (CUDA's in allocator_cuda.cu), so its bookkeeping and failure paths are tested
// without a GPU (tests/allocator_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "framework/allocator.h"

namespace ampgrad {

/// Raw memory as the caching allocator asks for it.
class DeviceMemory {
 public:
  enum class Status : uint8_t { kOk, kOutOfMemory, kFailed };
  struct Allocation {
    void* ptr = nullptr;
    Status status = Status::kOk;
    std::string error;  // the driver's words, when status is not kOk
  };

  virtual ~DeviceMemory() = default;
  /// What the memory is, for messages ("CUDA device memory").
  virtual std::string name() const = 0;
  /// The device blocks are cached for (each device has its own free lists).
  virtual int current_device() = 0;
  /// Never throws: a failure comes back as kOutOfMemory (retried once the cache is released) or kFailed.
  virtual Allocation allocate(size_t nbytes) = 0;
  /// Gives one block back; throws on failure.
  virtual void release(void* ptr) = 0;
  /// Waits until no queued work can still use a freed block; throws on failure.
  virtual void synchronize() = 0;
  /// Called when a block is freed, and asked before one is handed out again: memory that queued
  /// work may still read (pinned host memory a copy reads) marks the point and says when it passed.
  virtual void mark_freed(void* /*ptr*/) {}
  virtual bool reusable(void* /*ptr*/) { return true; }
};

class CachingAllocator final : public Allocator {
 public:
  /// The size class a request of `nbytes` is rounded up to (what is reserved for it): multiples of
  /// 512 B below 1 MiB, then the next of 2^k * {1, 1.25, 1.5, 1.75} (at most 25% more).
  static size_t size_class(size_t nbytes);

  explicit CachingAllocator(DeviceMemory& memory) : memory_(memory) {}

  /// A block of size_class(nbytes) bytes: a cached free one of that class (on the current device,
  /// reusable) or a new one. When the device is out of memory, the cache is released and the
  /// allocation tried once more; an Error then says how much is in use and reserved.
  void* allocate(size_t nbytes) override;
  /// Keeps the block in its class's free list for the next request.
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void raise_peak(int64_t bytes) override;
  /// Gives every cached free block back. Each block leaves the cache before it is released, so a
  /// release that throws leaves the rest cached and no block is ever released twice.
  void empty_cache() override;

 private:
  void* allocate_locked(size_t cls);
  void release_cache_locked();

  DeviceMemory& memory_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::map<std::pair<int, size_t>, std::vector<void*>> free_;  // (device, size class) -> free blocks
  std::unordered_map<void*, int> owner_;                        // live block -> its device
};

}  // namespace ampgrad
