// nn::Linear: PyTorch's initialisation, forward through ops::linear.
#include "nn/linear.h"

#include <cmath>

#include "framework/error.h"
#include "ops/ops.h"

namespace ampgrad::nn {

namespace {

// PyTorch's init for weight and bias: kaiming_uniform_(a = sqrt(5)) gives
// bound = sqrt(6 / ((1 + a^2) fan_in)) = 1 / sqrt(fan_in).
Tensor init_uniform(const Shape& shape, int64_t in_features, int64_t out_features) {
  AG_CHECK(in_features > 0 && out_features > 0, "nn::Linear(", in_features, ", ", out_features,
           "): feature counts must be positive");
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  return uniform(shape, -bound, bound);
}

}  // namespace

Linear::Linear(int64_t in, int64_t out, Bias has_bias)
    : weight(register_parameter("weight", init_uniform({out, in}, in, out))),
      bias(register_parameter("bias", has_bias == Bias::kYes ? init_uniform({out}, in, out) : Tensor())) {}

Tensor Linear::forward(const Tensor& x) { return ops::linear(x, weight, bias); }

}  // namespace ampgrad::nn
