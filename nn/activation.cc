// Activation modules over their ops.
#include "nn/activation.h"

#include "ops/ops.h"

namespace ampgrad::nn {

Tensor ReLU::forward(const Tensor& x) { return ops::relu(x); }

}  // namespace ampgrad::nn
