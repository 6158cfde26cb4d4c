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
  explicit GELU(ops::GeluApproximation approximate = ops::GeluApproximation::kNone) : approximate(approximate) {}
  Tensor forward(const Tensor& x) override;
  ops::GeluApproximation approximate;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

/// Zeroes elements with probability p (scaling the rest by 1/(1-p)) in training mode; the
/// identity after eval().
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

}  // namespace ampgrad::nn
