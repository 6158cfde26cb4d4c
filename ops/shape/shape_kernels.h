// Shape kernels: copying between strided views, which is what permute, narrow, cat, split and
// expand (and their gradients) are made of. Any dtype (integers too): elements are copied as they
// are. Callers build the plan and have checked shapes, dtypes and devices.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"
#include "ops/strided.h"

namespace ampgrad::kernels {

// For every element of the plan: dst[offset 0] = src[offset 1] (operand 0 walks dst, operand 1
// walks src; a src stride of 0 repeats an element). dst and src must not overlap.
namespace cpu { void strided_copy(const Tensor& src, Tensor& dst, const StridedPlan<2>& plan); }
namespace cuda { void strided_copy(const Tensor& src, Tensor& dst, const StridedPlan<2>& plan); }
inline void strided_copy(const Tensor& src, Tensor& dst, const StridedPlan<2>& plan) {
  AG_ON_BACKEND(dst.device(), strided_copy, src, dst, plan);
}

}  // namespace ampgrad::kernels
