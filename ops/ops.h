// The functional ops. Each is declared once, in its own file (linear.cc, elementwise.cc, ...),
// with its cast policy, checks, forward and backward; see framework/dispatch.h for the order.
#pragma once

#include "framework/tensor.h"

namespace ampgrad::ops {

/// y[N,out] = x[N,in] @ w[out,in]^T + b[out] (b may be undefined). Autocast: lower precision.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
/// c[M,N] = a[M,K] @ b[K,N]. Autocast: lower precision.
Tensor matmul(const Tensor& a, const Tensor& b);

/// Element-wise, with b (or a) the same shape, a trailing row ([C] against [..., C]) or one element.
/// Inputs of different dtypes are promoted to the wider one.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// max(x, 0); a NaN stays NaN (as in PyTorch), so it still reaches the loss.
Tensor relu(const Tensor& x);

/// Sum / mean of all elements, as a 0-dim tensor. Accumulates in FP32; autocast: float32.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

/// mean((pred - target)^2) over all elements, 0-dim; shapes must be equal. Autocast: float32.
Tensor mse_loss(const Tensor& pred, const Tensor& target);

/// alpha * x, computed in the compute type (float, double for float64) and rounded once to x's
/// dtype (what x * 2.0f calls).
Tensor scale(const Tensor& x, double alpha);

/// x in `dtype` (differentiable; same as x.to(dtype)).
Tensor cast(const Tensor& x, DType dtype);

}  // namespace ampgrad::ops

namespace ampgrad {

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
/// Scalar forms: the scalar is not rounded to the tensor's dtype first; x * s is computed in the
/// compute type (float, double for float64) and rounded once, as PyTorch does.
Tensor operator+(const Tensor& a, float s);
Tensor operator-(const Tensor& a, float s);
Tensor operator*(const Tensor& a, float s);
Tensor operator*(float s, const Tensor& a);
Tensor operator-(const Tensor& a);
}  // namespace ampgrad
