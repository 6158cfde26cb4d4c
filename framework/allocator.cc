// The CPU allocator (64-byte aligned, caching freed blocks, with byte counters) and the device ->
// allocator switch.
#include "framework/allocator.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <iterator>
#include <list>
#include <mutex>
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

// Freed CPU blocks are kept by size class and handed out again. A training step frees and
// reallocates the same sizes every time: with glibc's aligned_alloc, chunk splitting and
// consolidation were 40% of the instructions of a small AMP step, and large tensors were mapped
// afresh each step, every page zeroed by the kernel on its first touch (a fifth of a GPT-2-small
// step). Classes: powers of two up to 4 KiB, then four per power of two up to 1 MiB (at most 25%
// over the request), then multiples of 256 KiB.
constexpr size_t kMaxPow2Class = size_t{4} << 10;
constexpr size_t kMaxQuarterClass = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{256} << 10;
// Small blocks (up to 1 MiB) are cached per thread, without a lock; when a free would pass this,
// that thread's small cache is emptied first (blocks of a finished phase must not stay pinned).
constexpr size_t kMaxCachedPerThread = size_t{256} << 20;
// Large blocks are cached process-wide (a block freed on a pool thread serves the next step's
// request on another), up to the most bytes live tensors ever held, and at least this: so the
// process reserves at most twice its own peak. Over it, the blocks freed longest ago go first.
constexpr size_t kMinLargeCache = size_t{256} << 20;

size_t size_class(size_t nbytes) {
  if (nbytes <= kCpuAlignment) return kCpuAlignment;
  if (nbytes <= kMaxPow2Class) return std::bit_ceil(nbytes);
  if (nbytes <= kMaxQuarterClass) {
    const size_t quarter = std::bit_floor(nbytes - 1) / 4;  // a quarter of the power of two below
    return (nbytes + quarter - 1) / quarter * quarter;
  }
  return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

std::atomic<int64_t> small_cached_bytes{0};  // in every thread's small cache, for reserved_bytes

class ThreadCache {
 public:
  ~ThreadCache() {
    release_all();
    alive = false;
  }

  void* take(size_t size) {
    std::vector<void*>& free_blocks = bucket(size);
    if (free_blocks.empty()) return nullptr;
    void* ptr = free_blocks.back();  // the most recently freed: its lines may still be in cache
    free_blocks.pop_back();
    bytes_ -= size;
    small_cached_bytes.fetch_sub(static_cast<int64_t>(size));
    return ptr;
  }

  // Keeps a freed block; false if it must go back to the system instead.
  bool keep(void* ptr, size_t size) noexcept {
    if (bytes_ + size > kMaxCachedPerThread) release_all();
    try {
      bucket(size).push_back(ptr);
    } catch (const std::bad_alloc&) {
      return false;  // called from a destructor: never throw
    }
    bytes_ += size;
    small_cached_bytes.fetch_add(static_cast<int64_t>(size));
    return true;
  }

  void release_all() noexcept {
    for (auto& blocks : small_) {
      for (void* ptr : blocks) std::free(ptr);
      blocks.clear();
    }
    small_cached_bytes.fetch_sub(static_cast<int64_t>(bytes_));
    bytes_ = 0;
  }

  // False once this thread's cache is destroyed (thread or program exit); trivially destructible,
  // so it can still be read then, by tensors freed later.
  static thread_local bool alive;

 private:
  // Up to 4 KiB by log2 of the class; above, by the class's quarter step (4 classes per power of
  // two from 4 KiB to 1 MiB: 8 powers of two, 32 classes in all).
  std::vector<void*>& bucket(size_t size) {
    if (size <= kMaxPow2Class) return small_[std::countr_zero(size)];
    const int power = std::bit_width(size - 1) - 1;  // size is in (2^power, 2^(power+1)]
    const size_t quarter = (size_t{1} << power) / 4;
    const size_t step = (size - (size_t{1} << power)) / quarter - 1;  // 0..3
    return quarter_[static_cast<size_t>(power - std::countr_zero(kMaxPow2Class)) * 4 + step];
  }

  std::vector<void*> small_[std::countr_zero(kMaxPow2Class) + 1];
  std::vector<void*> quarter_[(std::countr_zero(kMaxQuarterClass) - std::countr_zero(kMaxPow2Class)) * 4];
  size_t bytes_ = 0;
};

thread_local bool ThreadCache::alive = true;

ThreadCache* thread_cache() {
  if (!kCacheBlocks || !ThreadCache::alive) return nullptr;
  thread_local ThreadCache cache;
  return &cache;
}

// The process-wide cache of blocks over 1 MiB: free lists by class, and the order they were freed
// in, so that the oldest go first when the cache is over its bound.
class LargeBlockCache {
 public:
  void* take(size_t size) {
    std::lock_guard lock(mutex_);
    const auto it = by_size_.find(size);
    if (it == by_size_.end() || it->second.empty()) return nullptr;
    const auto block = it->second.back();
    it->second.pop_back();
    void* ptr = block->ptr;
    by_age_.erase(block);
    bytes_ -= size;
    return ptr;
  }

  // Keeps a freed block within `bound` bytes; false if it must go back to the system instead.
  bool keep(void* ptr, size_t size, size_t bound) noexcept {
    std::vector<void*> evicted;
    {
      std::lock_guard lock(mutex_);
      if (size > bound) return false;
      try {
        if (bytes_ + size > bound) evicted.reserve(by_age_.size());
        while (bytes_ + size > bound) evicted.push_back(evict_oldest_locked());
        auto& list = by_size_[size];
        by_age_.push_back({ptr, size});
        try {
          list.push_back(std::prev(by_age_.end()));
        } catch (...) {
          by_age_.pop_back();
          throw;
        }
      } catch (const std::bad_alloc&) {
        for (void* p : evicted) std::free(p);
        return false;  // called from a destructor: never throw
      }
      bytes_ += size;
    }
    for (void* p : evicted) std::free(p);  // outside the lock
    return true;
  }

  void release_all() {
    std::vector<void*> blocks;
    {
      std::lock_guard lock(mutex_);
      for (const Block& b : by_age_) blocks.push_back(b.ptr);
      by_age_.clear();
      by_size_.clear();
      bytes_ = 0;
    }
    for (void* p : blocks) std::free(p);
  }

  int64_t bytes() const {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(bytes_);
  }

 private:
  struct Block {
    void* ptr;
    size_t size;
  };
  using Age = std::list<Block>::iterator;

  void* evict_oldest_locked() noexcept {
    const Block oldest = by_age_.front();
    const auto it = by_size_.find(oldest.size);  // its entry is that list's first: freed first
    it->second.erase(it->second.begin());        // (a class rarely holds more than a few blocks)
    if (it->second.empty()) by_size_.erase(it);
    by_age_.pop_front();
    bytes_ -= oldest.size;
    return oldest.ptr;
  }

  mutable std::mutex mutex_;
  std::list<Block> by_age_;                             // oldest free first
  std::unordered_map<size_t, std::vector<Age>> by_size_;  // per class, in the order freed
  size_t bytes_ = 0;
};

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t size = size_class(nbytes);
    void* ptr = nullptr;
    if (kCacheBlocks && size > kMaxQuarterClass) {
      ptr = large_.take(size);
    } else if (ThreadCache* cache = thread_cache()) {
      ptr = cache->take(size);
    }
    if (ptr == nullptr) ptr = std::aligned_alloc(kCpuAlignment, size);  // size is a multiple of the alignment
    if (ptr == nullptr) {  // the system is out: give back what is cached and try once more
      empty_cache();
      ptr = std::aligned_alloc(kCpuAlignment, size);
    }
    AG_CHECK(ptr != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
    const int64_t live = live_class_bytes_.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
    raise(most_live_class_bytes_, live);
    raise(peak_, current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes));
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    const size_t size = size_class(nbytes);
    current_.fetch_sub(static_cast<int64_t>(nbytes));
    live_class_bytes_.fetch_sub(static_cast<int64_t>(size));
    bool kept = false;
    if (kCacheBlocks && size > kMaxQuarterClass) {
      const auto most = static_cast<size_t>(most_live_class_bytes_.load());
      kept = large_.keep(ptr, size, std::max(kMinLargeCache, most));
    } else if (ThreadCache* cache = thread_cache()) {
      kept = cache->keep(ptr, size);
    }
    if (!kept) std::free(ptr);
  }

  MemoryStats stats() const override {
    return {.current_bytes = current_.load(),
            .peak_bytes = peak_.load(),
            .reserved_bytes = live_class_bytes_.load() + small_cached_bytes.load() + large_.bytes()};
  }

  void reset_peak() override { peak_.store(current_.load()); }

  void raise_peak(int64_t bytes) override { raise(peak_, bytes); }

  // Every large cached block, and this thread's small ones (other threads' are bounded, and go
  // when those threads end). The large cache's bound starts over from what is live now.
  void empty_cache() override {
    large_.release_all();
    if (ThreadCache* cache = thread_cache()) cache->release_all();
    most_live_class_bytes_.store(live_class_bytes_.load());
  }

 private:
  static void raise(std::atomic<int64_t>& high, int64_t value) {
    int64_t seen = high.load();
    while (value > seen && !high.compare_exchange_weak(seen, value)) {
    }
  }

  std::atomic<int64_t> current_{0};           // bytes asked for by live tensors
  std::atomic<int64_t> live_class_bytes_{0};  // what their blocks really take (rounded to class)
  std::atomic<int64_t> most_live_class_bytes_{0};  // the most live_class_bytes_ ever was: the cache's bound
  std::atomic<int64_t> peak_{0};
  LargeBlockCache large_;
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

void empty_cache(Device device) {
  allocator_for(device).empty_cache();
  if (device == Device::kCUDA) pinned_host_allocator().empty_cache();
}

}  // namespace ampgrad
