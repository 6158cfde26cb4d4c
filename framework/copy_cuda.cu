// Copies with dtype conversion (conversion kernel on the device), fill and accumulate.
#include "framework/device_cuda.h"

#include <atomic>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"

namespace ampgrad::cuda {

namespace {

// out is (n), in is (n): out[i] = convert(in[i]).
template <typename To, typename From>
__global__ void convert_kernel(To* out, const From* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = dconvert<To>(in[i]);
  }
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
      convert_kernel<To, From><<<blocks_for(n), kThreads>>>(static_cast<To*>(dst), static_cast<const From*>(src), n);
      AG_CUDA_CHECK_LAUNCH();
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

void copy_raw(void* dst, DType dst_dtype, Device dst_device, const void* src, DType src_dtype, Device src_device,
              int64_t n) {
  if (n == 0) return;
  if (dst_device == Device::kCPU) host_syncs.fetch_add(1);  // a device-to-host copy waits for the GPU
  const bool same = dst_dtype == src_dtype;
  if (src_device == Device::kCPU && dst_device == Device::kCUDA) {
    if (same) {
      AG_CUDA_CHECK(cudaMemcpy(dst, src, bytes_of(src_dtype, n), cudaMemcpyHostToDevice));
      return;
    }
    Staging staging(bytes_of(src_dtype, n));  // host bytes as they are, converted on the device
    AG_CUDA_CHECK(cudaMemcpy(staging.get(), src, bytes_of(src_dtype, n), cudaMemcpyHostToDevice));
    convert_on_device(dst, dst_dtype, staging.get(), src_dtype, n);
  } else if (src_device == Device::kCUDA && dst_device == Device::kCPU) {
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

void fill_raw(void* dst, DType dtype, int64_t n, double value) {
  if (n == 0) return;
  visit_dtype(dtype, [&](auto t) {
    using T = DeviceType<decltype(t)>;
    // As the CPU: rounded once from double (an int64 truncated, NaN giving INT64_MIN).
    const T v = dconvert<T>(value);
    fill_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<T*>(dst), v, n);
    AG_CUDA_CHECK_LAUNCH();
  });
}

void accumulate_raw(void* dst, const void* src, DType dtype, int64_t n) {
  if (n == 0) return;
  visit_dtype(dtype, [&](auto t) {
    using T = DeviceType<decltype(t)>;
    accumulate_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<T*>(dst), static_cast<const T*>(src), n);
    AG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ampgrad::cuda
