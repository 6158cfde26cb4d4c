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
#include "framework/device_cuda.h"
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
// and page-faulted afresh each step. Classes: powers of two up to 4 KiB, then four per power of
// two up to 1 MiB (at most 25% over the request), then multiples of 256 KiB.
constexpr size_t kMaxPow2Class = size_t{4} << 10;
constexpr size_t kMaxQuarterClass = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{256} << 10;
// A thread's cache holds at most this much; when a free would pass it, the cache is emptied first
// (blocks of a finished phase, say another batch size, must not stay pinned).
constexpr size_t kMaxCachedPerThread = size_t{256} << 20;

size_t size_class(size_t nbytes) {
  if (nbytes <= kCpuAlignment) return kCpuAlignment;
  if (nbytes <= kMaxPow2Class) return std::bit_ceil(nbytes);
  if (nbytes <= kMaxQuarterClass) {
    const size_t quarter = std::bit_floor(nbytes - 1) / 4;  // a quarter of the power of two below
    return (nbytes + quarter - 1) / quarter * quarter;
  }
  return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

std::atomic<int64_t> cached_bytes{0};  // in every thread's cache, for MemoryStats::reserved_bytes

class ThreadCache {
 public:
  ~ThreadCache() {
    release_all();
    alive = false;
  }

  void* take(size_t size) {
    std::vector<void*>* free_blocks = find(size);
    if (free_blocks == nullptr || free_blocks->empty()) return nullptr;
    void* ptr = free_blocks->back();  // the most recently freed: its lines may still be in cache
    free_blocks->pop_back();
    bytes_ -= size;
    cached_bytes.fetch_sub(static_cast<int64_t>(size));
    return ptr;
  }

  // Keeps a freed block; false if it must go back to the system instead.
  bool keep(void* ptr, size_t size) noexcept {
    if (size > kMaxCachedPerThread) return false;
    if (bytes_ + size > kMaxCachedPerThread) release_all();
    try {
      (size <= kMaxPow2Class ? small_[std::countr_zero(size)] : large_[size]).push_back(ptr);
    } catch (const std::bad_alloc&) {
      return false;  // called from a destructor: never throw
    }
    bytes_ += size;
    cached_bytes.fetch_add(static_cast<int64_t>(size));
    return true;
  }

  // False once this thread's cache is destroyed (thread or program exit); trivially destructible,
  // so it can still be read then, by tensors freed later.
  static thread_local bool alive;

 private:
  std::vector<void*>* find(size_t size) {
    if (size <= kMaxPow2Class) return &small_[std::countr_zero(size)];
    const auto it = large_.find(size);
    return it == large_.end() ? nullptr : &it->second;
  }

  void release_all() noexcept {
    for (auto& bucket : small_) {
      for (void* ptr : bucket) std::free(ptr);
      bucket.clear();
    }
    for (auto& [size, bucket] : large_) {
      for (void* ptr : bucket) std::free(ptr);
      bucket.clear();
    }
    cached_bytes.fetch_sub(static_cast<int64_t>(bytes_));
    bytes_ = 0;
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
    live_class_bytes_.fetch_add(static_cast<int64_t>(size));
    const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    const size_t size = size_class(nbytes);
    current_.fetch_sub(static_cast<int64_t>(nbytes));
    live_class_bytes_.fetch_sub(static_cast<int64_t>(size));
    ThreadCache* cache = thread_cache();
    if (cache == nullptr || !cache->keep(ptr, size)) std::free(ptr);
  }

  MemoryStats stats() const override {
    const int64_t current = current_.load();
    return {.current_bytes = current,
            .peak_bytes = peak_.load(),
            .reserved_bytes = live_class_bytes_.load() + cached_bytes.load()};
  }

  void reset_peak() override { peak_.store(current_.load()); }

 private:
  std::atomic<int64_t> current_{0};           // bytes asked for by live tensors
  std::atomic<int64_t> live_class_bytes_{0};  // what their blocks really take (rounded to class)
  std::atomic<int64_t> peak_{0};
};

}  // namespace

Allocator& allocator_for(Device device) {
  static CpuAllocator* cpu = new CpuAllocator();  // never destroyed: tensors may outlive statics
  if (device == Device::kCPU) return *cpu;
  require_backend(device, "allocating memory");
#if defined(AMPGRAD_WITH_CUDA)
  return cuda::caching_allocator();
#endif
  AG_FAIL("unknown device");
}

Allocator& pinned_host_allocator() {
  require_backend(Device::kCUDA, "pinned host memory");
#if defined(AMPGRAD_WITH_CUDA)
  return cuda::pinned_allocator();
#endif
  AG_FAIL("pinned host memory: no backend provides it");
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }

}  // namespace ampgrad
