// Reduction kernels: sums accumulated in float (double for float64) and rounded once.
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

// out[j] = alpha * sum_i x[i * out.numel() + j]: sums the leading dimensions away (to a trailing
// row, or to one element). The bias gradient and the broadcast gradients use it.
namespace cpu { void sum_to(const Tensor& x, double alpha, Tensor& out); }
namespace cuda { void sum_to(const Tensor& x, double alpha, Tensor& out); }
inline void sum_to(const Tensor& x, double alpha, Tensor& out) { AG_ON_BACKEND(out.device(), sum_to, x, alpha, out); }

}  // namespace ampgrad::kernels
