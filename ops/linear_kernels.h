// GEMM kernels for linear and matmul: FP32 accumulation for every storage type (tensor-core
// semantics: FP16 inputs, FP32 sums, one rounding of the result), on the CPU too.
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

enum class Transpose : bool { kNo, kYes };

// out[M,N] = op(a) @ op(b) (+ bias[N] on every row when bias is defined); op(a) is [M,K] and
// op(b) [K,N], each a row-major matrix or the transpose of one.
namespace cpu {
void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out);
}
namespace cuda {
void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out);
}
inline void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias,
                 Tensor& out) {
  AG_ON_BACKEND(out.device(), gemm, a, trans_a, b, trans_b, bias, out);
}

}  // namespace ampgrad::kernels
