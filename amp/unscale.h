// The scaler's one pass over a gradient: unscale and look for inf/NaN together.
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::amp {

/// out = grad * inv_scale in float32 (out may be grad itself when grad is float32); the product
/// is formed in double and rounded once. Returns true if any element of the result is inf/NaN.
/// CPU or CUDA (grad and out on one device); on CUDA it waits for the GPU to read the flag.
bool unscale_and_check(const Tensor& grad, double inv_scale, Tensor& out);

/// The same over many gradients (outs[k] for grads[k]); returns true if any result is inf/NaN.
/// CUDA tensors are handled by ONE fused launch and ONE host sync for the flag, whatever their number.
bool unscale_and_check_all(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs);

namespace cuda {
/// For every k: outs[k] (float32, CUDA) = grads[k] * inv_scale (product in double, rounded once to
/// float), in ONE kernel launch over all tensors; sets found_inf[0] = 1.0f (a float32 CUDA tensor
/// of one element, zeroed by the caller) if any result is inf/NaN. Does not wait for the GPU.
/// (PyTorch's _amp_foreach_non_finite_check_and_unscale_ idea; in unscale_cuda.cu.)
void unscale_and_check_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                             Tensor& found_inf);
}  // namespace cuda

}  // namespace ampgrad::amp
