// Gradient utilities.
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::nn::utils {

/// Scales the gradients of `params` in place so that their joint L2 norm is at most max_norm,
/// and returns the norm before clipping (inf or NaN if any gradient is non-finite, in which case
/// nothing is scaled). For a parameter with an FP32 master copy whose gradient was unscaled
/// (GradScaler::unscale_), that FP32 gradient is the one measured and clipped.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace ampgrad::nn::utils
