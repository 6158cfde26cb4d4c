// The kernels ops are built from. Each picks its backend by the tensors' device (CPU: Eigen and
// loops in ops/cpu, CUDA: ops/cuda) and its instantiation by dtype. Callers have already checked
// shapes, dtypes and devices; outputs are preallocated. Half storage always computes in float.
#pragma once

#include "framework/tensor.h"

namespace ampgrad::kernels {

enum class Transpose : bool { kNo, kYes };

/// out[M,N] = op(a) @ op(b) (+ bias[N] on every row when bias is defined). op(a) is [M,K],
/// op(b) is [K,N]. FP32 accumulation for float16 (tensor-core semantics), rounded once.
void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out);

enum class BinaryOp : uint8_t { kAdd, kSub, kMul };

/// out[i] = a[i % a.numel()] (op) b[i % b.numel()]: each operand is out-shaped, a trailing row
/// of it, or a single element.
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);

/// out[i] = alpha * src[i % src.numel()] + beta: scaling and shifting, and broadcasting a row
/// or an element to out's shape.
void affine(const Tensor& src, double alpha, double beta, Tensor& out);

/// out[j] = alpha * sum_i x[i * out.numel() + j]: sums the leading dimensions away (to a
/// trailing row, or to one element). Accumulates in float (double for float64).
void sum_to(const Tensor& x, double alpha, Tensor& out);

/// y = max(x, 0);  dx = dy where x > 0, else 0.
void relu(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);

/// loss (one element) = mean((pred - target)^2), accumulated in float (double for float64).
void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss);
/// dpred = 2 (pred - target) / N * dloss; dtarget = -dpred (skipped when undefined).
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget);

}  // namespace ampgrad::kernels
