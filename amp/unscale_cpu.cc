// The CPU functors of the unscale kernel family, over the multi-tensor chunk table on the pool.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>

#include "amp/unscale_kernels.h"
#include "framework/error.h"
#include "framework/multi_tensor.h"

namespace ampgrad::amp::kernels::cpu {

namespace {

using UnscaleChunk = multi_tensor::Chunk<kUnscaleLists>;

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

// Calls values(wide, start, len) over the chunk's gradient in compute-type blocks: 16-bit values
// are widened to float a block at a time (exact, vectorised), float and double are read in place.
template <typename Values>
void in_blocks(const UnscaleChunk& c, Values&& values) {
  visit_floating_dtype(c.dtype[kUnscaleGrad], [&](auto t) {
    using T = decltype(t);
    const T* g = multi_tensor::chunk_data<const T>(c, kUnscaleGrad);
    if constexpr (kIsLowPrecision<T>) {
      constexpr int64_t kBlock = 2048;
      float wide[kBlock];
      for (int64_t start = 0; start < c.n; start += kBlock) {
        const int64_t len = std::min(kBlock, c.n - start);
        widen(g + start, wide, static_cast<size_t>(len));
        values(static_cast<const float*>(wide), start, len);
      }
    } else {
      values(g, int64_t{0}, c.n);
    }
  });
}

}  // namespace

bool unscale_and_check(const UnscaleChunks& chunks, double inv_scale) {
  std::atomic<bool> any_bad{false};  // chunks run on the pool: one flag, set by whichever finds one
  multi_tensor::apply_cpu(chunks, [&](const UnscaleChunk& c) {
    float* o = multi_tensor::chunk_data<float>(c, kUnscaleOut);
    in_blocks(c, [&](const auto* g, int64_t start, int64_t len) {
      if (unscale_values(g, len, inv_scale, o + start)) any_bad.store(true, std::memory_order_relaxed);
    });
  });
  return any_bad;
}

bool unscale_check_and_measure(const UnscaleChunks& chunks, double inv_scale, const FormatTable& formats,
                               GradCounts* counts, size_t tensors) {
  std::mutex lock;  // each chunk counts into its own GradCounts, merged into its tensor's under it
  multi_tensor::apply_cpu(chunks, [&](const UnscaleChunk& c) {
    float* o = multi_tensor::chunk_data<float>(c, kUnscaleOut);  // null: measure only
    GradCounts piece{};
    in_blocks(c, [&](const auto* g, int64_t start, int64_t len) {
      measure_values(g, len, inv_scale, o != nullptr ? o + start : nullptr, formats, piece);
    });
    std::lock_guard<std::mutex> guard(lock);
    merge(counts[c.tensor], piece, formats.count);
  });
  bool found_inf = false;
  for (size_t k = 0; k < tensors; ++k) found_inf |= counts[k].unscaled_nonfinite > 0;
  return found_inf;
}

}  // namespace ampgrad::amp::kernels::cpu
