// GEMM kernels for linear and matmul: FP32 accumulation for every storage type (tensor-core
// semantics: FP16 inputs, FP32 sums, one rounding of the result), on the CPU too.
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

enum class Transpose : bool { kNo, kYes };

// out[i] = op(a[i]) @ op(b[i]) (+ bias[N] on every row when bias is defined) for each matrix i of
// out's batch. op(a[i]) is [M,K] and op(b[i]) [K,N], each a row-major matrix or the transpose of
// one. A 3-D tensor is a batch [count, rows, cols] and a 2-D one a single matrix; a or b may hold
// one matrix (2-D, or a batch of 1) that every product shares, otherwise its count is out's.
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

// gemm into a new tensor of a's dtype and device: [count, M, N] when a or b is 3-D, else [M, N].
// A batch of one broadcasts, so against an empty batch the result is empty.
inline Tensor gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b,
                   const Tensor& bias = Tensor()) {
  const int64_t rows = a.size(trans_a == Transpose::kYes ? -1 : -2);
  const int64_t cols = b.size(trans_b == Transpose::kYes ? -2 : -1);
  const int64_t a_batch = a.dim() == 3 ? a.size(0) : 1, b_batch = b.dim() == 3 ? b.size(0) : 1;
  const Shape shape = a.dim() == 3 || b.dim() == 3 ? Shape{a_batch == 1 ? b_batch : a_batch, rows, cols}
                                                   : Shape{rows, cols};
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  gemm(a, trans_a, b, trans_b, bias, out);
  return out;
}

}  // namespace ampgrad::kernels
