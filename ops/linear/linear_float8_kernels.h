// The element-wise kernels of the FP8 linear around its GEMMs (which are linear_kernels.h's gemm
// with FP8 operands and a float32 result). CPU only so far: on CUDA, linear inside a Float8Guard
// runs as outside the guard until the cuBLASLt FP8 GEMMs land (linear_float8.cc says so once).
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/tensor.h"

namespace ampgrad::kernels::cpu {

/// The largest |src| (0 for an empty tensor; NaN if any element is NaN), as a float.
float amax(const Tensor& src);
/// dst = saturate(src * scale) in dst's 8-bit format (clamped to +-max, NaN kept), element-wise;
/// returns amax(src) from the same pass (delayed scaling records it).
float quantize_float8(const Tensor& src, float scale, Tensor& dst);
/// out[i, j] = products[i, j] * alpha + bias[j] (bias may be undefined), in float (alpha rounded
/// to float) where alpha is a normal float, else in double, rounded once to out's dtype; products
/// is float32 of out's shape.
void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out);

}  // namespace ampgrad::kernels::cpu
