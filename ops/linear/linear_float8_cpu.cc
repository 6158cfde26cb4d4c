// The element-wise halves of the CPU FP8 linear (linear_float8_kernels.h): the scaled saturating
// cast with its amax in the same pass, the amax alone (current scaling), and the epilogue that
// descales the float products and adds the bias. The GEMM itself is the packed float GEMM, which
// decodes FP8 operands exactly while it packs them (linear_gemm_pack_cpu.cc).
#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <vector>

#include "framework/dtype.h"
#include "framework/parallel.h"
#include "ops/linear/linear_float8_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

constexpr int64_t kChunk = 4096;  // elements widened at a time (a float buffer on the stack)

// max(a, |v|) where a NaN anywhere wins: an amax that hides a NaN would scale it like a number.
inline float amax_step(float a, float v) {
  const float m = std::fabs(v);
  return (m > a || m != m) && a == a ? m : a;
}

// fn(floats, count, offset) over src widened to float, kChunk at a time, on the pool; returns the
// NaN-propagating max of fn's results.
template <typename Fn>
float over_chunks(const Tensor& src, Fn&& fn) {
  const int64_t n = src.numel();
  float amax = 0.0f;
  std::mutex mutex;
  visit_floating_dtype(src.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* data = static_cast<const T*>(src.data_ptr());
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      float wide[kChunk];
      float a = 0.0f;
      for (int64_t i = lo; i < hi; i += kChunk) {
        const int64_t count = std::min(kChunk, hi - i);
        if constexpr (std::is_same_v<T, float>) {
          a = amax_step(a, fn(data + i, count, i));
        } else {
          for (int64_t j = 0; j < count; ++j) wide[j] = static_cast<float>(load(data[i + j]));
          a = amax_step(a, fn(wide, count, i));
        }
      }
      const std::lock_guard<std::mutex> lock(mutex);
      amax = amax_step(amax, a);
    });
  });
  return amax;
}

}  // namespace

float amax(const Tensor& src) {
  return over_chunks(src, [](const float* x, int64_t count, int64_t) {
    float a = 0.0f;
    for (int64_t j = 0; j < count; ++j) a = amax_step(a, x[j]);
    return a;
  });
}

float quantize_float8(const Tensor& src, float scale, Tensor& dst) {
  void* out = dst.data_ptr();
  const bool e4m3 = dst.dtype() == DType::kFloat8E4M3;
  return over_chunks(src, [&](const float* x, int64_t count, int64_t offset) {
    float a = 0.0f;
    for (int64_t j = 0; j < count; ++j) a = amax_step(a, x[j]);
    if (e4m3) {
      float_to_float8_saturated(x, scale, static_cast<Float8E4M3*>(out) + offset, static_cast<size_t>(count));
    } else {
      float_to_float8_saturated(x, scale, static_cast<Float8E5M2*>(out) + offset, static_cast<size_t>(count));
    }
    return a;
  });
}

void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out) {
  const int64_t n = products.size(-1), rows = products.numel() / std::max<int64_t>(n, 1);
  const float* c = products.data<float>();
  std::vector<double> b(static_cast<size_t>(n), 0.0);
  if (bias.defined()) {
    visit_floating_dtype(bias.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(bias.data_ptr());
      for (int64_t j = 0; j < n; ++j) b[static_cast<size_t>(j)] = static_cast<double>(load(p[j]));
    });
  }
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(out.data_ptr());
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1));
    parallel_range(rows, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double v = static_cast<double>(c[i * n + j]) * alpha + b[static_cast<size_t>(j)];
          y[i * n + j] = convert<T>(v);  // once from double
        }
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
