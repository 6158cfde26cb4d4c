// Pooling kernels over planes: x [N, C, H, W] (or [C, H, W]) is a stack of H x W planes, each
// pooled on its own into Ho x Wo (the window geometry is conv's, ops/conv/conv_kernels.h; its
// output size already reflects ceil_mode). Sums are in the compute type (float for FP16/BF16),
// rounded once. Callers have checked shapes, dtypes and devices; outputs are preallocated and
// overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"
#include "ops/conv/conv_kernels.h"

namespace ampgrad::kernels {

// y = the maximum of each window (taps in the padding skipped; a NaN replaces anything, so the
// last NaN wins, as PyTorch), indices (int64, y's shape) = where it came from, h W + w within its
// plane (the first maximum); a window with every tap in the padding gives -inf and index -1.
namespace cpu {
void max_pool2d(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& indices);
}
namespace cuda {
void max_pool2d(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& indices);
}
inline void max_pool2d(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& indices) {
  AG_ON_BACKEND(y.device(), max_pool2d, x, g, y, indices);
}

// dx[plane, indices[plane, o]] += dy[plane, o] over every output o with an index >= 0, dx zero
// elsewhere (a value that is the maximum of several windows sums their gradients).
namespace cpu {
void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx);
}
namespace cuda {
void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx);
}
inline void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), max_pool2d_backward, dy, indices, dx);
}

/// How avg_pool2d divides each window's sum (PyTorch's count_include_pad and divisor_override).
struct AvgPoolDivisor {
  bool count_include_pad = true;  // the window's size within the padded input, else its taps inside x
  int64_t divisor_override = 0;   // > 0: this, for every window
};

// y = each window's sum / its divisor. A window spans [o s - p, min(o s - p + k, H + p)) clipped
// to [0, H) (and likewise in W); the divisor counts the unclipped span when count_include_pad.
namespace cpu {
void avg_pool2d(const Tensor& x, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& y);
}
namespace cuda {
void avg_pool2d(const Tensor& x, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& y);
}
inline void avg_pool2d(const Tensor& x, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& y) {
  AG_ON_BACKEND(y.device(), avg_pool2d, x, g, divisor, y);
}

// dx = the adjoint of avg_pool2d: every tap of a window gets dy / that window's divisor.
namespace cpu {
void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& dx);
}
namespace cuda {
void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& dx);
}
inline void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), avg_pool2d_backward, dy, g, divisor, dx);
}

// y[plane, i, j] = the mean of x[plane] over rows [floor(i H / Ho), ceil((i + 1) H / Ho)) and the
// columns likewise; sizes from x [..., H, W] and y [..., Ho, Wo].
namespace cpu {
void adaptive_avg_pool2d(const Tensor& x, Tensor& y);
}
namespace cuda {
void adaptive_avg_pool2d(const Tensor& x, Tensor& y);
}
inline void adaptive_avg_pool2d(const Tensor& x, Tensor& y) { AG_ON_BACKEND(y.device(), adaptive_avg_pool2d, x, y); }

// dx = its adjoint: each window's taps get dy / the window's size (summed where windows overlap).
namespace cpu {
void adaptive_avg_pool2d_backward(const Tensor& dy, Tensor& dx);
}
namespace cuda {
void adaptive_avg_pool2d_backward(const Tensor& dy, Tensor& dx);
}
inline void adaptive_avg_pool2d_backward(const Tensor& dy, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), adaptive_avg_pool2d_backward, dy, dx);
}

}  // namespace ampgrad::kernels
