// Layer-norm kernels over the last dimension: x is viewed as [rows, C]. Statistics are computed
// in float (double for float64) with a two-pass variance. Callers have checked shapes, dtypes and
// devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

// y = (x - mean) * rstd * w + b per row (w and b [C] may be undefined: 1 and 0); mean and rstd
// ([rows], float32, or float64 for float64 x) are written for the backward. rstd = 1/sqrt(var + eps)
// with the biased variance, as PyTorch.
namespace cpu {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean, Tensor& rstd);
}
namespace cuda {
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean, Tensor& rstd);
}
inline void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  AG_ON_BACKEND(y.device(), layer_norm, x, w, b, eps, y, mean, rstd);
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w and xhat = (x - mean) rstd; and
// dy_xhat = dy * xhat (x's shape; summed over rows it is dw, and dy summed is db). dx and dy_xhat
// may be undefined when not needed.
namespace cpu {
void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         Tensor& dx, Tensor& dy_xhat);
}
namespace cuda {
void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         Tensor& dx, Tensor& dy_xhat);
}
inline void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor& dy_xhat) {
  AG_ON_BACKEND(dy.device(), layer_norm_backward, x, w, mean, rstd, dy, dx, dy_xhat);
}

}  // namespace ampgrad::kernels
