// The CPU allocator (64-byte aligned, with byte counters) and the device -> allocator switch.
#include "framework/allocator.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "framework/error.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "framework/cuda/cuda_allocator.h"
#include "framework/cuda/cuda_copy.h"
#endif

namespace ampgrad {

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    // aligned_alloc wants a size that is a multiple of the alignment; 0 bytes still gets a pointer.
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    AG_CHECK(ptr != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
    const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    current_.fetch_sub(static_cast<int64_t>(nbytes));
  }

  MemoryStats stats() const override {
    return {.current_bytes = current_.load(), .peak_bytes = peak_.load(), .reserved_bytes = current_.load()};
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
