// The scaler's one pass over a gradient: unscale and look for inf/NaN together.
#pragma once

#include <vector>

#include "amp/grad_counts.h"
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

namespace cuda {
/// For every k: outs[k] (float32, CUDA) = grads[k] * inv_scale (product in double, rounded once to
/// float), in ONE kernel launch over all tensors; sets found_inf[0] = 1.0f (a float32 CUDA tensor
/// of one element, zeroed by the caller) if any result is inf/NaN. Does not wait for the GPU.
/// (PyTorch's _amp_foreach_non_finite_check_and_unscale_ idea; in unscale_cuda.cu.)
void unscale_and_check_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                             Tensor& found_inf);

/// The same launch that also measures: counts (an int64 CUDA tensor of grads.size() *
/// sizeof(GradCounts) / 8 elements, zeroed by the caller) receives one GradCounts per gradient.
/// outs may be null: then nothing is written and found_inf may be undefined (measure only).
void unscale_check_and_measure_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>* outs,
                                     Tensor* found_inf, const FormatTable& formats, Tensor& counts);
}  // namespace cuda

}  // namespace ampgrad::amp
