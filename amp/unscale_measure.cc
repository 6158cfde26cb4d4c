// The unscale pass that also measures (gradient statistics), and the measurement alone: a loop
// over the thread pool on the CPU, the fused multi-tensor kernel on CUDA (unscale_cuda.cu).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "amp/unscale.h"
#include "framework/error.h"
#include "framework/parallel.h"

namespace ampgrad::amp {

namespace {

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
// rounded exactly as unscale_values in unscale.cc rounds them.
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

// One CPU tensor: pieces on the pool, each into its own counts, merged under a lock.
void measure_cpu(const Tensor& grad, double inv_scale, Tensor* out, const FormatTable& t, GradCounts& counts) {
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

// The CUDA gradients of a list in one launch; counts[index[k]] for cuda_grads[k].
bool measure_cuda(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                  const FormatTable& t, std::vector<GradCounts*>& counts) {
  require_backend(Device::kCUDA, "gradient statistics");
#if defined(AMPGRAD_WITH_CUDA)
  static_assert(sizeof(GradCounts) % sizeof(int64_t) == 0, "GradCounts must be whole int64 words");
  constexpr int64_t kWords = sizeof(GradCounts) / sizeof(int64_t);
  Tensor device_counts = zeros({static_cast<int64_t>(grads.size()) * kWords}, DType::kInt64, Device::kCUDA);
  Tensor found_inf;
  if (outs != nullptr) found_inf = zeros({1}, DType::kFloat32, Device::kCUDA);
  cuda::unscale_check_and_measure_multi(grads, inv_scale, outs, outs != nullptr ? &found_inf : nullptr, t,
                                        device_counts);
  // One host sync: the counts (and with them the flag) come back together.
  const Tensor host = device_counts.to(Device::kCPU);
  const auto* words = static_cast<const char*>(host.data_ptr());
  bool bad = false;
  for (size_t k = 0; k < grads.size(); ++k) {
    std::memcpy(counts[k], words + k * sizeof(GradCounts), sizeof(GradCounts));
    bad |= counts[k]->unscaled_nonfinite > 0;
  }
  return bad;
#else
  (void)grads, (void)inv_scale, (void)outs, (void)t, (void)counts;
  return false;
#endif
}

bool measure_list(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                  const FormatTable& formats, std::vector<GradCounts>& counts) {
  AG_CHECK(outs == nullptr || outs->size() == grads.size(), "unscale: ", grads.size(), " gradients but ",
           outs->size(), " outputs");
  AG_CHECK(formats.count >= 0 && formats.count <= kMaxFormats, "gradient statistics: ", formats.count,
           " formats (at most ", kMaxFormats, ")");
  counts.assign(grads.size(), GradCounts{});
  bool found_inf = false;
  std::vector<Tensor> cuda_grads, cuda_outs;
  std::vector<GradCounts*> cuda_counts;
  for (size_t k = 0; k < grads.size(); ++k) {
    Tensor* out = outs != nullptr ? &(*outs)[k] : nullptr;
    if (out != nullptr) {
      AG_CHECK(out->dtype() == DType::kFloat32 && out->numel() == grads[k].numel() &&
                   out->device() == grads[k].device(),
               "unscale: output ", out->to_string(), " must be float32 with ", grads[k].numel(),
               " elements on the gradient's device (gradient ", grads[k].to_string(), ")");
    }
    if (grads[k].device() == Device::kCUDA) {
      cuda_grads.push_back(grads[k]);
      if (out != nullptr) cuda_outs.push_back(*out);
      cuda_counts.push_back(&counts[k]);
    } else {
      measure_cpu(grads[k], inv_scale, out, formats, counts[k]);
      found_inf |= counts[k].unscaled_nonfinite > 0;
    }
  }
  if (!cuda_grads.empty()) {
    found_inf |= measure_cuda(cuda_grads, inv_scale, outs != nullptr ? &cuda_outs : nullptr, formats, cuda_counts);
  }
  return found_inf;
}

}  // namespace

bool unscale_check_and_measure_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                                   const FormatTable& formats, std::vector<GradCounts>& counts) {
  return measure_list(grads, inv_scale, &outs, formats, counts);
}

void measure_all(const std::vector<Tensor>& grads, double inv_scale, const FormatTable& formats,
                 std::vector<GradCounts>& counts) {
  measure_list(grads, inv_scale, nullptr, formats, counts);
}

bool any_nonfinite(const Tensor& values) {
  if (!values.defined() || !is_floating(values.dtype()) || values.numel() == 0) return false;
  std::vector<GradCounts> counts;
  measure_all({values}, 1.0, FormatTable{}, counts);
  return counts[0].infs + counts[0].nans > 0;
}

}  // namespace ampgrad::amp
