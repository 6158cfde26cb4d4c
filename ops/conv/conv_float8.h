// conv2d inside a Float8Guard (framework/float8_scaling.h): its GEMMs take FP8 operands.
// Internal to ops/conv: conv2d() calls it when this thread's FP8 region is on for x's device.
#pragma once

#include "framework/tensor.h"
#include "ops/ops.h"

namespace ampgrad::ops::detail {

/// conv2d (ops.h) with x and w cast to the recipe's forward format (E4M3) and dy to its backward
/// format (E5M2 under kHybrid), each by its own scale from the scaling states that live with w,
/// as linear_float8's; FP32 accumulation, products descaled by the inverse scales. y takes the
/// autocast dtype when autocast is on for the device, else x's; dx and dw take x's and w's
/// dtypes, db (summed from dy as it is) b's. x is cast whole, before im2col: its amax is over
/// every element, also those a stride or dilation never reads, so a non-finite one there makes y
/// and dw NaN, as any non-finite operand does (where the BF16 route would skip it). Undefined for
/// float64 x and for a depthwise convolution (no GEMM: it runs as outside the guard, in the
/// autocast dtype).
Tensor conv2d_float8(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options);

}  // namespace ampgrad::ops::detail
