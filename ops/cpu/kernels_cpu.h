// CPU implementations of ops/kernels.h (same contracts), one file per kernel family.
#pragma once

#include "ops/kernels.h"

namespace ampgrad::kernels::cpu {

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out);
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void affine(const Tensor& src, double alpha, double beta, Tensor& out);
void sum_to(const Tensor& x, double alpha, Tensor& out);
void relu(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss);
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget);

}  // namespace ampgrad::kernels::cpu
