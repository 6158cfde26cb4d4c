// clip_grad_norm_: norms accumulated in double, one scale kernel per gradient.
#include "nn/utils.h"

#include <cmath>

#include "framework/error.h"
#include "ops/elementwise_kernels.h"

namespace ampgrad::nn::utils {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  AG_CHECK(max_norm >= 0 && std::isfinite(max_norm), "clip_grad_norm_: max_norm must be finite and >= 0, got ",
           max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    const Tensor master = p.master();
    Tensor g = master.defined() && master.grad().defined() ? master.grad() : p.grad();
    if (g.defined()) grads.push_back(g);
  }
  double sum_of_squares = 0.0;
  for (const Tensor& g : grads) {
    for (double v : g.to_double_vector()) sum_of_squares += v * v;
  }
  const double norm = std::sqrt(sum_of_squares);
  const double coeff = max_norm / (norm + 1e-6);  // PyTorch's epsilon
  if (std::isfinite(norm) && coeff < 1.0) {
    for (Tensor& g : grads) {
      kernels::affine(g, coeff, 0.0, g);
      g.bump_version();
    }
  }
  return norm;
}

}  // namespace ampgrad::nn::utils
