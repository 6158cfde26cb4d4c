// The CPU allocator (64-byte aligned, caching freed blocks, with byte counters) and the device ->
// allocator switch.
#include "framework/allocator.h"

#include <atomic>
#include <bit>
#include <cstdlib>
#include <new>
#include <unordered_map>
#include <vector>

#include "framework/error.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "framework/cuda/cuda_allocator.h"
#include "framework/cuda/cuda_copy.h"
#endif

namespace ampgrad {

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheBlocks = false;  // AddressSanitizer must see every free to catch use-after-free
#else
constexpr bool kCacheBlocks = true;
#endif

// Freed CPU blocks are kept by size class, per thread, and handed out again. A training step frees
// and reallocates the same sizes every time: with glibc's aligned_alloc, chunk splitting and
// consolidation were 40% of the instructions of a small AMP step, and large tensors were mapped
// and page-faulted afresh each step. Classes: powers of two up to 1 MiB, multiples of 256 KiB above.
constexpr size_t kMaxPow2Class = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{256} << 10;
constexpr size_t kMaxCachedPerThread = size_t{256} << 20;  // beyond this, blocks go back to the system

size_t size_class(size_t nbytes) {
  if (nbytes <= kCpuAlignment) return kCpuAlignment;
  if (nbytes <= kMaxPow2Class) return std::bit_ceil(nbytes);
  return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

std::atomic<int64_t> cached_bytes{0};  // in every thread's cache, for MemoryStats::reserved_bytes

class ThreadCache {
 public:
  ~ThreadCache() {
    for (auto& bucket : small_) {
      for (void* ptr : bucket) std::free(ptr);
    }
    for (auto& [size, bucket] : large_) {
      for (void* ptr : bucket) std::free(ptr);
    }
    cached_bytes.fetch_sub(static_cast<int64_t>(bytes_));
    alive = false;
  }

  void* take(size_t size) {
    std::vector<void*>& free_blocks = bucket(size);
    if (free_blocks.empty()) return nullptr;
    void* ptr = free_blocks.back();  // the most recently freed: its lines may still be in cache
    free_blocks.pop_back();
    bytes_ -= size;
    cached_bytes.fetch_sub(static_cast<int64_t>(size));
    return ptr;
  }

  bool keep(void* ptr, size_t size) {
    if (bytes_ + size > kMaxCachedPerThread) return false;
    bucket(size).push_back(ptr);
    bytes_ += size;
    cached_bytes.fetch_add(static_cast<int64_t>(size));
    return true;
  }

  // False once this thread's cache is destroyed (thread or program exit); trivially destructible,
  // so it can still be read then, by tensors freed later.
  static thread_local bool alive;

 private:
  std::vector<void*>& bucket(size_t size) {
    if (size <= kMaxPow2Class) return small_[std::countr_zero(size)];
    return large_[size];
  }

  std::vector<void*> small_[std::countr_zero(kMaxPow2Class) + 1];  // by log2 of the class
  std::unordered_map<size_t, std::vector<void*>> large_;
  size_t bytes_ = 0;
};

thread_local bool ThreadCache::alive = true;

ThreadCache* thread_cache() {
  if (!kCacheBlocks || !ThreadCache::alive) return nullptr;
  thread_local ThreadCache cache;
  return &cache;
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t size = size_class(nbytes);
    ThreadCache* cache = thread_cache();
    void* ptr = cache ? cache->take(size) : nullptr;
    if (ptr == nullptr) ptr = std::aligned_alloc(kCpuAlignment, size);  // size is a multiple of the alignment
    AG_CHECK(ptr != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
    const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    current_.fetch_sub(static_cast<int64_t>(nbytes));
    ThreadCache* cache = thread_cache();
    if (cache == nullptr || !cache->keep(ptr, size_class(nbytes))) std::free(ptr);
  }

  MemoryStats stats() const override {
    const int64_t current = current_.load();
    return {.current_bytes = current, .peak_bytes = peak_.load(), .reserved_bytes = current + cached_bytes.load()};
  }

  void reset_peak() override { peak_.store(current_.load()); }

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace

Allocator& allocator_for(Device device) {
  switch (device) {
    case Device::kCPU: {
      static CpuAllocator* cpu = new CpuAllocator();  // never destroyed: tensors may outlive statics
      return *cpu;
    }
    case Device::kCUDA:
#if defined(AMPGRAD_WITH_CUDA)
      return cuda::caching_allocator();
#else
      AG_FAIL("this build of ampgrad has no CUDA backend (the CUDA toolkit was not found at build time); ",
              "hint: use Device::kCPU, or rebuild on a machine with the CUDA toolkit installed");
#endif
  }
  AG_FAIL("unknown device");
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }

}  // namespace ampgrad

namespace ampgrad {

void synchronize(Device device) {
  if (device == Device::kCPU) return;
#if defined(AMPGRAD_WITH_CUDA)
  cuda::synchronize();
#else
  allocator_for(device);  // throws the clear "no CUDA backend" error
#endif
}

int64_t cuda_host_sync_count() {
#if defined(AMPGRAD_WITH_CUDA)
  return cuda::host_sync_count();
#else
  return 0;
#endif
}

bool cuda_is_available() {
#if defined(AMPGRAD_WITH_CUDA)
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

}  // namespace ampgrad
