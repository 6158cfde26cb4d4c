// Loss kernels, fused forward and backward (no temporary for the difference).
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

// loss (one element) = mean((pred - target)^2), accumulated in float (double for float64); the
// mean of nothing is NaN.
namespace cpu { void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss); }
namespace cuda { void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss); }
inline void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  AG_ON_BACKEND(loss.device(), mse_forward, pred, target, loss);
}

// dpred = 2 (pred - target) / N * dloss; dtarget = -dpred (skipped when undefined). dloss is read
// where it lives (no host sync on CUDA).
namespace cpu {
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget);
}
namespace cuda {
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget);
}
inline void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred,
                         Tensor& dtarget) {
  AG_ON_BACKEND(dpred.device(), mse_backward, pred, target, dloss, dpred, dtarget);
}

}  // namespace ampgrad::kernels
