// clip_grad_norm_: norms accumulated in double, one scale kernel per gradient.
#include "nn/utils.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "framework/error.h"
#include "ops/elementwise_kernels.h"

namespace ampgrad::nn::utils {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipGradNormOptions options) {
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
  // In double, |g|^p of any float32 value stays finite for p up to 8 (PyTorch sums in float).
  double total = 0.0;
  for (const Tensor& g : grads) {
    for (double v : g.to_double_vector()) {
      const double a = std::abs(v);
      if (std::isinf(p)) {
        total = std::isnan(a) || std::isnan(total) ? std::numeric_limits<double>::quiet_NaN() : std::max(total, a);
      } else {
        total += p == 2.0 ? a * a : p == 1.0 ? a : std::pow(a, p);
      }
    }
  }
  const double norm = std::isinf(p) ? total : p == 2.0 ? std::sqrt(total) : p == 1.0 ? total : std::pow(total, 1.0 / p);
  if (!std::isfinite(norm)) {
    AG_CHECK(!options.error_if_nonfinite, "clip_grad_norm_: the total norm of order ", p,
             " of the gradients is non-finite (", norm, "), so it cannot be clipped; hint: look for inf/NaN in the "
             "loss or the inputs, or set error_if_nonfinite = false to get the norm back and leave the gradients");
    return norm;
  }
  const double coeff = max_norm / (norm + 1e-6);  // PyTorch's epsilon
  if (coeff < 1.0) {
    for (Tensor& g : grads) {
      kernels::affine(g, coeff, 0.0, g);
      g.bump_version();
    }
  }
  return norm;
}

}  // namespace ampgrad::nn::utils
