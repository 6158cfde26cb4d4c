// The CUDA storage kernels (copies with dtype conversion on the device, fill, accumulate), the
// asynchronous upload of kernel argument tables and synchronisation.
#include "framework/device_cuda.h"

#include <atomic>
#include <cstring>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/storage_kernels.h"

namespace ampgrad::cuda {

namespace {

// out is (n), in is (n): out[i] = convert(in[i]).
template <typename To, typename From>
__global__ void convert_kernel(To* out, const From* in, int64_t n) {
  unrolled_loop<From>(n, [&](int64_t i) { return in[i]; }, [&](int64_t i, From v) { out[i] = dconvert<To>(v); });
}

// out is (n): out[i] = value.
template <typename T>
__global__ void fill_kernel(T* out, T value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

// dst, src are (n): dst[i] = dst[i] + src[i] in the compute type.
template <typename T>
__global__ void accumulate_kernel(T* dst, const T* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = dstore<T>(dload(dst[i]) + dload(src[i]));
  }
}

void convert_on_device(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  visit_dtype(dst_dtype, [&](auto to) {
    visit_dtype(src_dtype, [&](auto from) {
      using To = DeviceType<decltype(to)>;
      using From = DeviceType<decltype(from)>;
      convert_kernel<To, From><<<blocks_for(n, kUnroll), kThreads>>>(static_cast<To*>(dst),
                                                                       static_cast<const From*>(src), n);
      AG_CUDA_CHECK_LAUNCH("convert_kernel");
    });
  });
}

// A device buffer from the caching allocator, returned on scope exit (stream-ordered reuse).
class Staging {
 public:
  explicit Staging(size_t nbytes) : nbytes_(nbytes), ptr_(caching_allocator().allocate(nbytes)) {}
  ~Staging() { caching_allocator().deallocate(ptr_, nbytes_); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t nbytes_;
  void* ptr_;
};

size_t bytes_of(DType dtype, int64_t n) { return element_size(dtype) * static_cast<size_t>(n); }

}  // namespace

namespace {
std::atomic<int64_t> host_syncs{0};
}  // namespace

int64_t host_sync_count() { return host_syncs.load(); }

void synchronize() {
  host_syncs.fetch_add(1);
  AG_CUDA_CHECK(cudaDeviceSynchronize());
}

void* upload_async(const void* host, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  // A pinned block, so that cudaMemcpyAsync neither waits nor stages; freed right after queuing,
  // it is reused only once the copy is done. The device block is the caller's to return.
  Allocator& pinned = pinned_allocator();
  void* staging = pinned.allocate(nbytes);
  std::memcpy(staging, host, nbytes);
  void* device = nullptr;
  try {
    device = caching_allocator().allocate(nbytes);
    AG_CUDA_CHECK(cudaMemcpyAsync(device, staging, nbytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
  } catch (...) {
    if (device != nullptr) caching_allocator().deallocate(device, nbytes);
    pinned.deallocate(staging, nbytes);
    throw;
  }
  pinned.deallocate(staging, nbytes);
  return device;
}

}  // namespace ampgrad::cuda

namespace ampgrad::storage::cuda {

using namespace ::ampgrad::cuda;  // the device helpers above and in framework/cuda_helpers.h

void copy(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
          int64_t n, NonBlocking non_blocking, HostMemory src_memory) {
  if (n == 0) return;
  const bool same = dst_dtype == src_dtype;
  if (src_device == Device::kCPU && dst_device == Device::kCUDA) {
    // From pinned memory, cudaMemcpyAsync is queued and returns at once (the pinned allocator keeps
    // the source block from being reused until the copy is done). Any other host-to-device copy
    // waits: cudaMemcpy from pageable memory first waits for all queued work, from pinned memory
    // until the copy is done.
    const bool async = non_blocking == NonBlocking::kYes && src_memory == HostMemory::kPinned;
    if (!async) host_syncs.fetch_add(1);
    const size_t nbytes = bytes_of(src_dtype, n);
    const auto upload = [&](void* to) {
      if (async) {
        AG_CUDA_CHECK(cudaMemcpyAsync(to, src, nbytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
      } else {
        AG_CUDA_CHECK(cudaMemcpy(to, src, nbytes, cudaMemcpyHostToDevice));
      }
    };
    if (same) {
      upload(dst);
      return;
    }
    Staging staging(nbytes);  // host bytes as they are, converted on the device
    upload(staging.get());
    convert_on_device(dst, dst_dtype, staging.get(), src_dtype, n);
  } else if (src_device == Device::kCUDA && dst_device == Device::kCPU) {
    host_syncs.fetch_add(1);  // a device-to-host copy waits for the GPU
    if (same) {
      AG_CUDA_CHECK(cudaMemcpy(dst, src, bytes_of(src_dtype, n), cudaMemcpyDeviceToHost));
      return;
    }
    Staging staging(bytes_of(dst_dtype, n));  // converted on the device, then one contiguous copy
    convert_on_device(staging.get(), dst_dtype, src, src_dtype, n);
    AG_CUDA_CHECK(cudaMemcpy(dst, staging.get(), bytes_of(dst_dtype, n), cudaMemcpyDeviceToHost));
  } else if (same) {
    AG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes_of(src_dtype, n), cudaMemcpyDeviceToDevice, cudaStreamLegacy));
  } else {
    convert_on_device(dst, dst_dtype, src, src_dtype, n);
  }
}

void fill(void* dst, DType dtype, int64_t n, double value) {
  if (n == 0) return;
  visit_dtype(dtype, [&](auto t) {
    using T = DeviceType<decltype(t)>;
    // As the CPU: rounded once from double (an int64 truncated, NaN giving INT64_MIN).
    const T v = dconvert<T>(value);
    fill_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<T*>(dst), v, n);
    AG_CUDA_CHECK_LAUNCH("fill_kernel");
  });
}

void accumulate(void* dst, const void* src, DType dtype, int64_t n) {
  if (n == 0) return;
  visit_dtype(dtype, [&](auto t) {
    using T = DeviceType<decltype(t)>;
    accumulate_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<T*>(dst), static_cast<const T*>(src), n);
    AG_CUDA_CHECK_LAUNCH("accumulate_kernel");
  });
}

}  // namespace ampgrad::storage::cuda
