// The CPU loops of the unscale kernel family: each tensor in pieces over the thread pool.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>

#include "amp/unscale_kernels.h"
#include "framework/error.h"
#include "framework/parallel.h"

namespace ampgrad::amp::kernels::cpu {

namespace {

// o = g * inv_scale (in double, rounded once to float); true if any result is inf or NaN. No
// early exit and no branch, so it vectorises: |v| <= FLT_MAX is false exactly for inf and NaN.
template <typename T>
bool unscale_values(const T* g, int64_t n, double inv_scale, float* o) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(static_cast<double>(g[i]) * inv_scale);
    bad |= !(std::fabs(v) <= std::numeric_limits<float>::max());
    o[i] = v;
  }
  return bad != 0;
}

bool unscale_one(const Tensor& grad, double inv_scale, Tensor& out) {
  float* o = out.data<float>();
  const int64_t n = grad.numel();  // hoisted: an out-of-line call per element cost more than the math
  AG_CHECK(is_floating(grad.dtype()), "unscale: gradient ", grad.to_string(), " is not floating");
  std::atomic<bool> any_bad{false};  // pieces run on the pool: one flag, set by whichever finds one
  visit_floating_dtype(grad.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* g = grad.data<T>();
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      if constexpr (kIsLowPrecision<T>) {
        // Widened a block at a time (vectorised), then the float loop: no per-element conversion calls.
        constexpr int64_t kBlock = 2048;
        float wide[kBlock];
        for (int64_t start = lo; start < hi; start += kBlock) {
          const int64_t len = std::min(kBlock, hi - start);
          widen(g + start, wide, static_cast<size_t>(len));
          if (unscale_values(wide, len, inv_scale, o + start)) any_bad = true;
        }
      } else {
        if (unscale_values(g + lo, hi - lo, inv_scale, o + lo)) any_bad = true;
      }
    });
  });
  out.bump_version();
  return any_bad;
}

void merge(GradCounts& into, const GradCounts& from, int formats) {
  into.zeros += from.zeros;
  into.infs += from.infs;
  into.nans += from.nans;
  into.max_abs = std::max(into.max_abs, from.max_abs);
  for (int f = 0; f < formats; ++f) {
    into.subnormal[f] += from.subnormal[f];
    into.underflow[f] += from.underflow[f];
    into.overflow[f] += from.overflow[f];
    into.underflow_unscaled[f] += from.underflow_unscaled[f];
  }
  for (int b = 0; b < kNumExponentBins; ++b) into.exponent[b] += from.exponent[b];
  into.unscaled_zeros += from.unscaled_zeros;
  into.unscaled_nonfinite += from.unscaled_nonfinite;
}

// Values in their compute type (float or double); o (may be null) receives the unscaled floats,
// rounded exactly as unscale_values rounds them.
template <typename C>
void measure_values(const C* g, int64_t n, double inv_scale, float* o, const FormatTable& t, GradCounts& c) {
  const auto add = [](int64_t& field, int64_t k) { field += k; };
  const auto keep_max = [&c](double a) { c.max_abs = std::max(c.max_abs, a); };
  for (int64_t i = 0; i < n; ++i) {
    const double gd = static_cast<double>(g[i]);
    const double vd = gd * inv_scale;
    const float v = static_cast<float>(vd);
    if (o != nullptr) o[i] = v;
    count_value(gd, vd, v, t, c, add, keep_max);
  }
}

// One tensor: pieces on the pool, each into its own counts, merged under a lock.
void measure_one(const Tensor& grad, double inv_scale, Tensor* out, const FormatTable& t, GradCounts& counts) {
  AG_CHECK(is_floating(grad.dtype()), "gradient statistics: ", grad.to_string(),
           " is not floating (integer tensors have no gradients)");
  float* o = out != nullptr ? out->data<float>() : nullptr;
  std::mutex lock;
  visit_dtype(grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(grad.data_ptr());
    parallel_range(grad.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      GradCounts piece{};
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        measure_values(g + lo, hi - lo, inv_scale, o != nullptr ? o + lo : nullptr, t, piece);
      } else if constexpr (!std::is_same_v<T, int64_t>) {
        // 16-bit storage: widened to float a block at a time (exact), then the float loop.
        constexpr int64_t kBlock = 2048;
        float wide[kBlock];
        for (int64_t start = lo; start < hi; start += kBlock) {
          const int64_t len = std::min(kBlock, hi - start);
          if constexpr (std::is_same_v<T, Half>) {
            half_to_float(g + start, wide, static_cast<size_t>(len));
          } else {
            for (int64_t j = 0; j < len; ++j) wide[j] = static_cast<float>(load(g[start + j]));
          }
          measure_values(wide, len, inv_scale, o != nullptr ? o + start : nullptr, t, piece);
        }
      }
      std::lock_guard<std::mutex> guard(lock);
      merge(counts, piece, t.count);
    });
  });
  if (out != nullptr) out->bump_version();
}

}  // namespace

bool unscale_and_check(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs) {
  bool found_inf = false;
  for (size_t k = 0; k < grads.size(); ++k) found_inf |= unscale_one(grads[k], inv_scale, outs[k]);
  return found_inf;
}

bool unscale_check_and_measure(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                               const FormatTable& formats, GradCounts* counts) {
  bool found_inf = false;
  for (size_t k = 0; k < grads.size(); ++k) {
    measure_one(grads[k], inv_scale, outs != nullptr ? &(*outs)[k] : nullptr, formats, counts[k]);
    found_inf |= counts[k].unscaled_nonfinite > 0;
  }
  return found_inf;
}

}  // namespace ampgrad::amp::kernels::cpu
