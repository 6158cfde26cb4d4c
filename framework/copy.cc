// copy_/fill_/accumulate_: dtype conversion and device transfer, one loop per storage type.
#include "framework/copy.h"

#include <algorithm>
#include <type_traits>

#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/tensor_impl.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "framework/device_cuda.h"
#endif

namespace ampgrad {

namespace {

template <typename To, typename From>
void convert_cpu(const From* src, To* dst, int64_t n) {
  if constexpr (std::is_same_v<To, From>) {
    std::copy(src, src + n, dst);
  } else if constexpr (kIsLowPrecision<From> && std::is_same_v<To, float>) {
    widen(src, dst, static_cast<size_t>(n));
  } else if constexpr (std::is_same_v<From, float> && kIsLowPrecision<To>) {
    narrow(src, dst, static_cast<size_t>(n));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
  }
}

// Conversions of large tensors (an AMP step casts every weight and weight gradient) are
// memory-bound on one core, so they are spread over the pool.
void copy_cpu(Tensor& dst, const Tensor& src) {
  visit_dtype(dst.dtype(), [&](auto to) {
    visit_dtype(src.dtype(), [&](auto from) {
      using To = decltype(to);
      using From = decltype(from);
      const From* s = src.data<From>();
      To* d = dst.data<To>();
      parallel_range(src.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) { convert_cpu<To, From>(s + lo, d + lo, hi - lo); });
    });
  });
}

}  // namespace

// non_blocking matters only to CUDA copies (unused in a CPU-only build).
void copy_(Tensor& dst, const Tensor& src, [[maybe_unused]] NonBlocking non_blocking) {
  AG_CHECK(dst.numel() == src.numel(), "copy_: ", src.to_string(), " into ", dst.to_string(),
           " needs equal element counts");
  if (dst.device() == Device::kCPU && src.device() == Device::kCPU) {
    copy_cpu(dst, src);
  } else {
    require_backend(Device::kCUDA, "copy_");
#if defined(AMPGRAD_WITH_CUDA)
    cuda::copy_raw(dst.data_ptr(), dst.dtype(), dst.device(), src.data_ptr(), src.dtype(), src.device(), src.numel(),
                   non_blocking, src.is_pinned() ? cuda::HostMemory::kPinned : cuda::HostMemory::kPageable);
#endif
  }
  dst.bump_version();
}

void fill_(Tensor& dst, double value) {
  if (dst.device() == Device::kCPU) {
    visit_dtype(dst.dtype(), [&](auto t) {
      using T = decltype(t);
      std::fill_n(dst.data<T>(), dst.numel(), convert<T>(value));  // rounded once from double
    });
  } else {
    require_backend(dst.device(), "fill_");
#if defined(AMPGRAD_WITH_CUDA)
    cuda::fill_raw(dst.data_ptr(), dst.dtype(), dst.numel(), value);
#endif
  }
  dst.bump_version();
}

void accumulate_(Tensor& dst, const Tensor& src) {
  AG_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
           "accumulate_: cannot add ", src.to_string(), " into ", dst.to_string());
  if (dst.device() == Device::kCPU) {
    visit_floating_dtype(dst.dtype(), [&](auto t) {
      using T = decltype(t);
      T* d = dst.data<T>();
      const T* s = src.data<T>();
      // Gradient sums of whole weights: on the pool, 16-bit floats widened a block at a time.
      parallel_range(dst.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
        if constexpr (kIsLowPrecision<T>) {
          constexpr int64_t kBlock = 512;
          float a[kBlock], b[kBlock];
          for (int64_t start = lo; start < hi; start += kBlock) {
            const int64_t n = std::min(kBlock, hi - start);
            widen(d + start, a, static_cast<size_t>(n));
            widen(s + start, b, static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) a[i] += b[i];
            narrow(a, d + start, static_cast<size_t>(n));
          }
        } else {
          for (int64_t i = lo; i < hi; ++i) d[i] += s[i];
        }
      });
    });
  } else {
    require_backend(dst.device(), "accumulate_");
#if defined(AMPGRAD_WITH_CUDA)
    cuda::accumulate_raw(dst.data_ptr(), src.data_ptr(), dst.dtype(), dst.numel());
#endif
  }
  dst.bump_version();
}

}  // namespace ampgrad
