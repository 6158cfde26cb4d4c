// The scaler's one pass over gradients: unscale and look for inf/NaN together, on any device
// (the kernels are in unscale_kernels.h).
#pragma once

#include <vector>

#include "amp/diagnostics/grad_counts.h"
#include "framework/tensor.h"

namespace ampgrad::amp {

/// out = grad * inv_scale in float32 (out may be grad itself when grad is float32); the product
/// is formed in double and rounded once. Returns true if any element of the result is inf/NaN.
/// CPU or CUDA (grad and out on one device); on CUDA it waits for the GPU to read the flag.
bool unscale_and_check(const Tensor& grad, double inv_scale, Tensor& out);

/// The same over many gradients (outs[k] for grads[k]); returns true if any result is inf/NaN.
/// CUDA tensors are handled by ONE fused launch and ONE host sync for the flag, whatever their number.
bool unscale_and_check_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs);

/// unscale_and_check_all that also measures every gradient in the same pass (one fused launch on
/// CUDA): counts[k] (resized and zeroed here) gets grads[k]'s counts against `formats` (see
/// grad_counts.h). The unscaled values are bit-identical to unscale_and_check_all's.
bool unscale_check_and_measure_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                                   const FormatTable& formats, std::vector<GradCounts>& counts);

/// The measurement alone, writing nothing: gradients (or any floating tensors) carrying the scale
/// 1 / inv_scale. counts is resized and zeroed.
void measure_all(const std::vector<Tensor>& grads, double inv_scale, const FormatTable& formats,
                 std::vector<GradCounts>& counts);

/// Whether any element of a floating tensor (CPU or CUDA) is inf or NaN; false for integer tensors.
bool any_nonfinite(const Tensor& values);

}  // namespace ampgrad::amp
