// Gradient utilities: clip_grad_norm_ (the norm as a double or as a tensor on the gradients' device).
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::nn::utils {

/// How clip_grad_norm_ measures the norm (PyTorch's clip_grad_norm_ arguments).
struct ClipGradNormOptions {
  double norm_type = 2.0;           ///< p > 0, or infinity: the largest |g|
  bool error_if_nonfinite = false;  ///< throw when the total norm is inf or NaN
};

/// Scales the gradients of `params` in place so that their joint p-norm (sum over every element
/// of every gradient of |g|^p, to the power 1/p; max |g| for p = inf) is at most max_norm, and
/// returns the norm before clipping. Each gradient counts once, however often its parameter is
/// listed (tied weights). For a parameter whose gradient GradScaler::unscale_ wrote into its FP32
/// master, that FP32 gradient is measured and clipped (Tensor::step_grad). A non-finite norm
/// throws with error_if_nonfinite; otherwise it is returned and, unlike PyTorch (which multiplies
/// every gradient by 0 or NaN), nothing is scaled.
/// With p = 2 and every gradient on one device the norm is one multi-tensor pass
/// (kernels::sum_of_squares, in double; one launch on CUDA) and the gradients are scaled by another
/// (kernels::clip_by_norm_): on CUDA the host waits once, to read the norm back. Other p read CPU
/// gradients in place and copy CUDA ones to the host; nothing copies a CPU gradient.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, ClipGradNormOptions options = {});

/// clip_grad_norm_ that hands the norm back as a float64 scalar tensor (PyTorch's return value)
/// instead of a double: on the gradients' device when they share one, else on the CPU. With CUDA
/// gradients, p = 2 and error_if_nonfinite = false the host never waits for the GPU (the clip
/// coefficient is worked out and applied on the device); error_if_nonfinite costs one wait.
Tensor clip_grad_norm_tensor_(const std::vector<Tensor>& params, double max_norm, ClipGradNormOptions options = {});

}  // namespace ampgrad::nn::utils
