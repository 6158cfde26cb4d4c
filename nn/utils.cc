// clip_grad_norm_: with p = 2 and every gradient on one device, the norm and the scaling are two
// multi-tensor passes on that device (on CUDA two launches, no per-tensor reads); otherwise norms
// are accumulated in double on the host, one scale kernel per gradient.
#include "nn/utils.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_set>

#include "framework/error.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::nn::utils {

namespace {

// The norm on `device`: as a tensor when it was computed there, as a double when the host has it
// (at least one of the two), so neither caller pays a wait or a copy it does not need.
struct ClipResult {
  Tensor norm;
  std::optional<double> host_norm;
  Device device = Device::kCPU;
};

void check_nonfinite(double norm, double p, const ClipGradNormOptions& options) {
  AG_CHECK(std::isfinite(norm) || !options.error_if_nonfinite, "clip_grad_norm_: the total norm of order ", p,
           " of the gradients is non-finite (", norm, "), so it cannot be clipped; hint: look for inf/NaN in the "
           "loss or the inputs, or set error_if_nonfinite = false to get the norm back and leave the gradients");
}

// |g|^p of every element summed in double, in place on the CPU (a copy only for another device's
// gradient); in double, |g|^p of any float32 value stays finite for p up to 8 (PyTorch sums in float).
double host_clip(std::vector<Tensor>& grads, double max_norm, double p, const ClipGradNormOptions& options) {
  double total = 0.0;
  const auto add = [&](double v) {
    const double a = std::abs(v);
    if (std::isinf(p)) {
      total = std::isnan(a) || std::isnan(total) ? std::numeric_limits<double>::quiet_NaN() : std::max(total, a);
    } else {
      total += p == 2.0 ? a * a : p == 1.0 ? a : std::pow(a, p);
    }
  };
  for (const Tensor& g : grads) {
    if (g.device() != Device::kCPU) {
      for (double v : g.to_double_vector()) add(v);
      continue;
    }
    visit_floating_dtype(g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = g.data<T>();
      for (int64_t i = 0; i < g.numel(); ++i) add(static_cast<double>(load(x[i])));
    });
  }
  const double norm = std::isinf(p) ? total : p == 2.0 ? std::sqrt(total) : p == 1.0 ? total : std::pow(total, 1.0 / p);
  check_nonfinite(norm, p, options);
  if (!std::isfinite(norm)) return norm;
  const double coeff = max_norm / (norm + 1e-6);  // PyTorch's epsilon
  if (coeff < 1.0) {
    for (Tensor& g : grads) {
      kernels::affine(g, coeff, 0.0, g);
      g.bump_version();
    }
  }
  return norm;
}

ClipResult clip(const std::vector<Tensor>& params, double max_norm, const ClipGradNormOptions& options) {
  AG_CHECK(max_norm >= 0 && std::isfinite(max_norm), "clip_grad_norm_: max_norm must be finite and >= 0, got ",
           max_norm);
  const double p = options.norm_type;
  AG_CHECK(p > 0, "clip_grad_norm_: norm_type must be > 0 (or infinity), got ", p);
  std::vector<Tensor> grads;
  std::unordered_set<const TensorImpl*> seen;  // a tied parameter's gradient counts once
  for (const Tensor& param : params) {
    Tensor g = param.step_grad();
    if (g.defined() && seen.insert(g.impl()).second) grads.push_back(g);
  }
  const bool one_device = !grads.empty() && std::all_of(grads.begin(), grads.end(), [&](const Tensor& g) {
    return g.device() == grads.front().device();
  });
  const Device device = one_device ? grads.front().device() : Device::kCPU;
  // PyTorch's foreach design, on every backend: one pass squares every gradient into one float64
  // scalar, a second scales them by a coefficient it computes itself. On CUDA the host reads
  // nothing back; on the CPU the gradients are read in place, on the pool, without a copy.
  if (one_device && p == 2.0) {
    Tensor sum_sq = Tensor::empty({}, DType::kFloat64, device);
    kernels::sum_of_squares(grads, sum_sq);
    std::optional<double> host_norm;
    if (options.error_if_nonfinite || device == Device::kCPU) {
      host_norm = std::sqrt(sum_sq.item<double>());  // on CUDA the one wait: throw before anything is scaled
      check_nonfinite(*host_norm, p, options);
    }
    Tensor norm = Tensor::empty({}, DType::kFloat64, device);
    kernels::clip_by_norm_(grads, sum_sq, max_norm, norm);
    return {norm, host_norm, device};
  }
  return {Tensor(), host_clip(grads, max_norm, p, options), device};
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipGradNormOptions options) {
  const ClipResult r = clip(params, max_norm, options);
  return r.host_norm ? *r.host_norm : r.norm.item<double>();
}

Tensor clip_grad_norm_tensor_(const std::vector<Tensor>& params, double max_norm, ClipGradNormOptions options) {
  const ClipResult r = clip(params, max_norm, options);
  if (r.norm.defined()) return r.norm;
  return Tensor::from_vector(std::vector<double>{*r.host_norm}, {}, DType::kFloat64, r.device);
}

}  // namespace ampgrad::nn::utils
