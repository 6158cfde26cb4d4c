// Gradient utilities: clip_grad_norm_.
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::nn::utils {

struct ClipGradNormOptions {
  double norm_type = 2.0;           // p > 0, or infinity: the largest |g|
  bool error_if_nonfinite = false;  // throw when the total norm is inf or NaN
};

/// Scales the gradients of `params` in place so that their joint p-norm (sum over every element
/// of every gradient of |g|^p, to the power 1/p; max |g| for p = inf) is at most max_norm, and
/// returns the norm before clipping. Each gradient counts once, however often its parameter is
/// listed (tied weights). For a parameter whose gradient GradScaler::unscale_ wrote into its FP32
/// master, that FP32 gradient is measured and clipped (Tensor::step_grad). A non-finite norm
/// throws with error_if_nonfinite; otherwise it is returned and, unlike PyTorch (which multiplies
/// every gradient by 0 or NaN), nothing is scaled.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipGradNormOptions options = {});

}  // namespace ampgrad::nn::utils
