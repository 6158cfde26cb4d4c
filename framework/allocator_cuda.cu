// Caching device allocator: size classes, per-class free lists, byte counters, retry after an
// out-of-memory by releasing the cache.
#include "framework/device_cuda.h"

#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "framework/cuda_check.h"

namespace ampgrad::cuda {

int device_count() {
  // Cached: the answer cannot change during a process. Any error (35 = insufficient driver here)
  // means "no GPU"; cudaGetLastError clears the error so it cannot leak into a later check.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

size_t size_class(size_t nbytes) {
  // Small: multiples of 512 B. Large (>= 1 MiB): the next of 2^k * {1, 1.25, 1.5, 1.75}, so
  // at most 25% is wasted while the number of distinct classes (and cached blocks) stays small.
  constexpr size_t kSmall = 512, kLarge = size_t{1} << 20;
  if (nbytes < kLarge) return nbytes == 0 ? kSmall : (nbytes + kSmall - 1) / kSmall * kSmall;
  size_t pow2 = kLarge;
  while (pow2 * 2 <= nbytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

namespace {

class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    const size_t cls = size_class(nbytes);
    int device = 0;
    AG_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    void* ptr = nullptr;
    std::vector<void*>& free_list = free_[{device, cls}];
    if (!free_list.empty()) {
      ptr = free_list.back();
      free_list.pop_back();
    } else {
      ptr = malloc_locked(cls);
      stats_.reserved_bytes += static_cast<int64_t>(cls);
    }
    owner_[ptr] = device;
    stats_.current_bytes += static_cast<int64_t>(nbytes);
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = owner_.find(ptr);
    if (it == owner_.end()) return;  // not ours: never happens for Storage-owned blocks
    free_[{it->second, size_class(nbytes)}].push_back(ptr);
    owner_.erase(it);
    stats_.current_bytes -= static_cast<int64_t>(nbytes);
  }

  MemoryStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes = stats_.current_bytes;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cache_locked();
  }

 private:
  void* malloc_locked(size_t cls) {
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, cls);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky, but clear it before retrying
      release_cache_locked();
      err = cudaMalloc(&ptr, cls);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      // Thrown directly (not AG_FAIL): this library uses only header-only parts of framework/.
      throw Error(::ampgrad::detail::str_cat(__FILE__, ":", __LINE__, ": CUDA caching allocator: cudaMalloc of ", cls,
                                             " bytes failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                             "); in use ", stats_.current_bytes, " bytes, reserved ",
                                             stats_.reserved_bytes, " bytes; hint: lower the batch size"));
    }
    return ptr;
  }

  void release_cache_locked() {
    // Blocks may still be read by queued kernels: wait for them before giving memory back.
    AG_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& [key, list] : free_) {
      for (void* ptr : list) {
        AG_CUDA_CHECK(cudaFree(ptr));
        stats_.reserved_bytes -= static_cast<int64_t>(key.second);
      }
      list.clear();
    }
  }

  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::map<std::pair<int, size_t>, std::vector<void*>> free_;  // (device, size class) -> free blocks
  std::unordered_map<void*, int> owner_;                        // live block -> its device
};

CachingAllocator& instance() {
  static CachingAllocator* allocator = new CachingAllocator();  // never destroyed: tensors may outlive statics
  return *allocator;
}

}  // namespace

Allocator& caching_allocator() { return instance(); }

void empty_cache() { instance().empty_cache(); }

}  // namespace ampgrad::cuda
