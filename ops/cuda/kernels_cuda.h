// CUDA implementations of ops/kernels.h (same contracts as ops/cpu/kernels_cpu.h), one .cu per
// kernel family. All work is queued on the legacy default stream; nothing here waits for the GPU.
#pragma once

#include "ops/kernels.h"

namespace ampgrad::kernels::cuda {

void gemm(const Tensor& a, Transpose trans_a, const Tensor& b, Transpose trans_b, const Tensor& bias, Tensor& out);
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);
void affine(const Tensor& src, double alpha, double beta, Tensor& out);
void sum_to(const Tensor& x, double alpha, Tensor& out);
void relu(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss);
void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget);

/// FP32 GEMMs may use TF32 tensor cores (10-bit mantissa inputs) when allowed; off by default,
/// so float32 results match the CPU to float rounding. Process-wide.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace ampgrad::kernels::cuda

namespace ampgrad::cuda {
using ::ampgrad::kernels::cuda::allow_tf32;
using ::ampgrad::kernels::cuda::set_allow_tf32;
}  // namespace ampgrad::cuda
