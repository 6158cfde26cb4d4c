// The scaler's one pass over a gradient: unscale and look for inf/NaN together.
#pragma once

#include "framework/tensor.h"

namespace ampgrad::amp {

/// out = grad * inv_scale in float32 (out may be grad itself when grad is float32); the product
/// is formed in double and rounded once. Returns true if any element of the result is inf/NaN.
bool unscale_and_check(const Tensor& grad, double inv_scale, Tensor& out);

}  // namespace ampgrad::amp
