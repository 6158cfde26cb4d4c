// Activation and dropout modules: the pattern for a layer without parameters (forward calls the op).
#pragma once

#include "nn/module.h"
#include "ops/ops.h"

namespace ampgrad::nn {

/// max(x, 0) element-wise.
class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// GELU, exact or with the tanh approximation (ops::gelu).
class GELU : public Module {
 public:
  /// The exact erf form (kNone, the default) or the tanh approximation (kTanh).
  explicit GELU(ops::GeluApproximation approximate = ops::GeluApproximation::kNone) : approximate(approximate) {}
  Tensor forward(const Tensor& x) override;
  ops::GeluApproximation approximate;  ///< which form forward uses
};

/// tanh(x) element-wise (ops::tanh).
class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// 1 / (1 + exp(-x)) element-wise (ops::sigmoid).
class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// Zeroes elements with probability p (scaling the rest by 1/(1-p)) in training mode; the
/// identity after eval().
class Dropout : public Module {
 public:
  /// Drops with probability p, in [0, 1] (1 zeroes everything).
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;  ///< the probability of zeroing an element
};

}  // namespace ampgrad::nn
