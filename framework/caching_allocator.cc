// CachingAllocator: see caching_allocator.h. Uses only the header-only parts of framework/ (it is
// linked into framework's CUDA side, which //framework itself depends on).
#include "framework/caching_allocator.h"

#include "framework/error.h"

namespace ampgrad {

size_t CachingAllocator::size_class(size_t nbytes) {
  // Few distinct large classes keep the number of cached blocks small while wasting at most 25%.
  constexpr size_t kSmall = 512, kLarge = size_t{1} << 20;
  if (nbytes < kLarge) return nbytes == 0 ? kSmall : (nbytes + kSmall - 1) / kSmall * kSmall;
  size_t pow2 = kLarge;
  while (pow2 * 2 <= nbytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t cls = size_class(nbytes);
  const int device = memory_.current_device();
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  std::vector<void*>& free_list = free_[{device, cls}];
  // The most recently freed reusable block (warm in caches; for pinned memory the newest is the
  // one least likely to be ready, so look further back).
  for (auto it = free_list.rbegin(); it != free_list.rend(); ++it) {
    if (memory_.reusable(*it)) {
      ptr = *it;
      free_list.erase(std::next(it).base());
      break;
    }
  }
  if (ptr == nullptr) {
    ptr = allocate_locked(cls);
    stats_.reserved_bytes += static_cast<int64_t>(cls);
  }
  owner_[ptr] = device;
  stats_.current_bytes += static_cast<int64_t>(nbytes);
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owner_.find(ptr);
  if (it == owner_.end()) return;  // not ours: never happens for Storage-owned blocks
  memory_.mark_freed(ptr);
  free_[{it->second, size_class(nbytes)}].push_back(ptr);
  owner_.erase(it);
  stats_.current_bytes -= static_cast<int64_t>(nbytes);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CachingAllocator::raise_peak(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > stats_.peak_bytes) stats_.peak_bytes = bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

void* CachingAllocator::allocate_locked(size_t cls) {
  DeviceMemory::Allocation a = memory_.allocate(cls);
  if (a.status == DeviceMemory::Status::kOutOfMemory) {
    release_cache_locked();  // cached blocks of other classes may make room
    a = memory_.allocate(cls);
  }
  if (a.status == DeviceMemory::Status::kOk) return a.ptr;
  // Thrown directly (not AG_FAIL): this file uses only header-only parts of framework/.
  const std::string where = ::ampgrad::detail::str_cat("allocating ", cls, " bytes of ", memory_.name(), " failed: ");
  if (a.status == DeviceMemory::Status::kOutOfMemory) {
    throw Error(::ampgrad::detail::str_cat(where, "out of memory (", a.error, "); in use ", stats_.current_bytes,
                                           " bytes by tensors, ", stats_.reserved_bytes,
                                           " bytes reserved after giving the cached free blocks back; hint: lower "
                                           "the batch size or the model size, or free tensors no longer needed"));
  }
  throw Error(::ampgrad::detail::str_cat(where, a.error));  // not a lack of memory: no memory hint
}

void CachingAllocator::release_cache_locked() {
  bool any = false;
  for (const auto& [key, list] : free_) any = any || !list.empty();
  if (!any) return;
  memory_.synchronize();  // blocks may still be read by queued work: wait before giving them back
  for (auto& [key, list] : free_) {
    while (!list.empty()) {
      void* ptr = list.back();
      list.pop_back();  // out of the cache first: if release throws, it is never released again
      stats_.reserved_bytes -= static_cast<int64_t>(key.second);
      memory_.release(ptr);
    }
  }
}

}  // namespace ampgrad
