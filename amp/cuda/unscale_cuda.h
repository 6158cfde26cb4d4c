// CUDA unscale + inf/NaN check over many gradients in one launch (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_ idea), writing a device-side found-inf flag.
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::amp::cuda {

/// For every k: outs[k] (float32, CUDA) = grads[k] * inv_scale (product in double, rounded once to
/// float), in ONE kernel launch over all tensors; sets found_inf[0] = 1.0f (a float32 CUDA tensor
/// of one element, zeroed by the caller) if any result is inf/NaN. Does not wait for the GPU.
void unscale_and_check_multi(const std::vector<Tensor>& grads, double inv_scale, std::vector<Tensor>& outs,
                             Tensor& found_inf);

}  // namespace ampgrad::amp::cuda
