// linear inside a Float8Guard (framework/float8_scaling.h): its three GEMMs take FP8 operands.
// Internal to ops/linear: linear() calls it when this thread's FP8 region is on for x's device.
#pragma once

#include "framework/tensor.h"

namespace ampgrad::ops::detail {

/// y = x w^T + b with x and w cast to the recipe's forward format (E4M3) and dy to its backward
/// format (E5M2 under kHybrid), each by its own scale from the scaling state that lives with w;
/// FP32 accumulation, products descaled by the inverse scales. y takes the autocast dtype when
/// autocast is on for the device, else x's; dx and dw take x's and w's dtypes, db (summed from
/// dy as it is) b's.
/// On CUDA the GEMMs are cuBLASLt's FP8 matmul (bfloat16 GEMMs of the same values on GPUs without
/// FP8 tensor cores and for shapes it refuses). Undefined for float64 x (autocast leaves float64
/// alone too), and linear then runs as it would outside the guard.
Tensor linear_float8(const Tensor& x, const Tensor& w, const Tensor& b);

/// linear's input checks (devices, shapes; dtypes all equal when same_dtype), shared by both paths.
void check_linear(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, bool same_dtype);

}  // namespace ampgrad::ops::detail
