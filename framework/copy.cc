// copy_/fill_/accumulate_ over tensors, and the CPU loops of the storage kernels they call: one
// loop per pair of storage types.
#include "framework/copy.h"

#include <algorithm>
#include <type_traits>

#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/storage_kernels.h"
#include "framework/tensor_impl.h"

namespace ampgrad {

namespace storage::cpu {

namespace {

template <typename To, typename From>
void convert_cpu(const From* src, To* dst, int64_t n) {
  if constexpr (std::is_same_v<To, From>) {
    std::copy(src, src + n, dst);
  } else if constexpr (kWidensToFloat<From> && std::is_same_v<To, float>) {
    widen(src, dst, static_cast<size_t>(n));
  } else if constexpr (std::is_same_v<From, float> && kWidensToFloat<To>) {
    narrow(src, dst, static_cast<size_t>(n));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
  }
}

}  // namespace

// Conversions of large tensors (an AMP step casts every weight and weight gradient) are
// memory-bound on one core, so they are spread over the pool. The devices and host memory kind
// matter only to CUDA copies: here both sides are on the CPU.
void copy(void* dst, DType dst_dtype, Device, const void* src, DType src_dtype, Device, int64_t n, NonBlocking,
          HostMemory) {
  visit_dtype(dst_dtype, [&](auto to) {
    visit_dtype(src_dtype, [&](auto from) {
      using To = decltype(to);
      using From = decltype(from);
      const From* s = static_cast<const From*>(src);
      To* d = static_cast<To*>(dst);
      parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) { convert_cpu<To, From>(s + lo, d + lo, hi - lo); });
    });
  });
}

void fill(void* dst, DType dtype, int64_t n, double value) {
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    std::fill_n(static_cast<T*>(dst), n, convert<T>(value));  // rounded once from double
  });
}

void accumulate(void* dst_ptr, const void* src_ptr, DType dtype, int64_t n) {
  visit_dtype(dtype, [&](auto t) {  // every floating dtype: an 8-bit float's gradient accumulates too
    using T = decltype(t);
    T* d = static_cast<T*>(dst_ptr);
    const T* s = static_cast<const T*>(src_ptr);
    // Gradient sums of whole weights: on the pool, 16-bit floats widened a block at a time.
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kWidensToFloat<T>) {
        constexpr int64_t kBlock = 512;
        float a[kBlock], b[kBlock];
        for (int64_t start = lo; start < hi; start += kBlock) {
          const int64_t len = std::min(kBlock, hi - start);
          widen(d + start, a, static_cast<size_t>(len));
          widen(s + start, b, static_cast<size_t>(len));
          for (int64_t i = 0; i < len; ++i) a[i] += b[i];
          narrow(a, d + start, static_cast<size_t>(len));
        }
      } else {
        for (int64_t i = lo; i < hi; ++i) d[i] += s[i];
      }
    });
  });
}

}  // namespace storage::cpu

void copy_(Tensor& dst, const Tensor& src, NonBlocking non_blocking) {
  AG_CHECK(dst.numel() == src.numel(), "copy_: ", src.to_string(), " into ", dst.to_string(),
           " needs equal element counts");
  require_backend(storage::copy_backend(dst.device(), src.device()), "copy_");
  storage::copy(dst.data_ptr(), dst.dtype(), dst.device(), src.data_ptr(), src.dtype(), src.device(), src.numel(),
                non_blocking, src.is_pinned() ? storage::HostMemory::kPinned : storage::HostMemory::kPageable);
  dst.bump_version();
}

void fill_(Tensor& dst, double value) {
  require_backend(dst.device(), "fill_");
  storage::fill(dst.device(), dst.data_ptr(), dst.dtype(), dst.numel(), value);
  dst.bump_version();
}

void accumulate_(Tensor& dst, const Tensor& src) {
  AG_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
           "accumulate_: cannot add ", src.to_string(), " into ", dst.to_string());
  require_backend(dst.device(), "accumulate_");
  storage::accumulate(dst.device(), dst.data_ptr(), src.data_ptr(), dst.dtype(), dst.numel());
  dst.bump_version();
}

}  // namespace ampgrad
