// CUDA memory: the device count (and why it is zero), and the two caching allocators, for device
// memory (cudaMalloc) and pinned host memory (cudaHostAlloc), over framework/caching_allocator.h.
#include <string>
#include <unordered_map>

#include "framework/caching_allocator.h"
#include "framework/cuda_check.h"
#include "framework/device_cuda.h"

namespace ampgrad::cuda {

namespace {

struct DeviceQuery {
  int count = 0;
  std::string error;  // why cudaGetDeviceCount failed; empty when it did not
};

const DeviceQuery& device_query() {
  // Cached: the answer cannot change during a process. Any error (35 = insufficient driver here)
  // means "no GPU"; cudaGetLastError clears the error so it cannot leak into a later check.
  static const DeviceQuery query = [] {
    DeviceQuery q;
    const cudaError_t err = cudaGetDeviceCount(&q.count);
    if (err != cudaSuccess) {
      cudaGetLastError();
      q.count = 0;
      q.error = ::ampgrad::detail::str_cat("cudaGetDeviceCount failed: ", cudaGetErrorName(err), " (",
                                           cudaGetErrorString(err), ")");
    }
    return q;
  }();
  return query;
}

std::string error_text(const char* call, cudaError_t err) {
  return ::ampgrad::detail::str_cat(call, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")",
                                    detail::fault_hint(err));
}

DeviceMemory::Allocation allocation_result(void* ptr, cudaError_t err, const char* call) {
  DeviceMemory::Allocation result;
  if (err == cudaSuccess) {
    result.ptr = ptr;
    return result;
  }
  cudaGetLastError();  // an allocation failure is not sticky; clear it so no later check reports it
  result.status = err == cudaErrorMemoryAllocation ? DeviceMemory::Status::kOutOfMemory : DeviceMemory::Status::kFailed;
  result.error = error_text(call, err);
  return result;
}

// All work runs on the legacy default stream, so a freed device block is reused in stream order.
class CudaDeviceMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "CUDA device memory"; }
  int current_device() override {
    int device = 0;
    AG_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }
  Allocation allocate(size_t nbytes) override {
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, nbytes);
    return allocation_result(ptr, err, "cudaMalloc");
  }
  void release(void* ptr) override { AG_CUDA_CHECK(cudaFree(ptr)); }
  void synchronize() override { AG_CUDA_CHECK(cudaDeviceSynchronize()); }
};

// Pinned host blocks are read by asynchronous copies that may still be queued when the block is
// freed: an event recorded at the free marks the point after which the block may be reused.
class CudaPinnedMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "pinned host memory"; }
  int current_device() override { return 0; }  // host memory: one set of free lists
  Allocation allocate(size_t nbytes) override {
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable);
    return allocation_result(ptr, err, "cudaHostAlloc");
  }
  void release(void* ptr) override {
    const auto it = events_.find(ptr);
    if (it != events_.end()) {
      cudaEvent_t event = it->second;
      events_.erase(it);
      AG_CUDA_CHECK(cudaEventDestroy(event));
    }
    AG_CUDA_CHECK(cudaFreeHost(ptr));
  }
  void synchronize() override { AG_CUDA_CHECK(cudaDeviceSynchronize()); }
  void mark_freed(void* ptr) override {
    cudaEvent_t& event = events_[ptr];
    if (event == nullptr) AG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    AG_CUDA_CHECK(cudaEventRecord(event, cudaStreamLegacy));  // after every copy queued so far
  }
  bool reusable(void* ptr) override {
    const auto it = events_.find(ptr);
    if (it == events_.end()) return true;
    const cudaError_t err = cudaEventQuery(it->second);
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    AG_CUDA_CHECK(err);
    return true;
  }

 private:
  std::unordered_map<void*, cudaEvent_t> events_;  // guarded by the allocator's lock
};

}  // namespace

int device_count() { return device_query().count; }

const std::string& device_query_error() { return device_query().error; }

Allocator& caching_allocator() {
  // Never destroyed: tensors may outlive statics.
  static CachingAllocator* allocator = new CachingAllocator(*new CudaDeviceMemory());
  return *allocator;
}

Allocator& pinned_allocator() {
  static CachingAllocator* allocator = new CachingAllocator(*new CudaPinnedMemory());
  return *allocator;
}

}  // namespace ampgrad::cuda
