// Activation and dropout modules over their ops.
#include "nn/activation.h"

#include "framework/error.h"
#include "ops/ops.h"

namespace ampgrad::nn {

Tensor ReLU::forward(const Tensor& x) { return ops::relu(x); }
Tensor GELU::forward(const Tensor& x) { return ops::gelu(x, approximate); }
Tensor Tanh::forward(const Tensor& x) { return ops::tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return ops::sigmoid(x); }

Dropout::Dropout(double p_in) : p(p_in) {
  AG_CHECK(p >= 0.0 && p <= 1.0, "nn::Dropout: p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return ops::dropout(x, p, is_training()); }

}  // namespace ampgrad::nn
