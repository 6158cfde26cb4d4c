// The functional ops. Each is declared once, in its family's file (linear.cc, elementwise.cc,
// reduce.cc, shape.cc, ...), with its cast policy, checks, forward and backward; see
// framework/dispatch.h for the order. Dimensions may be negative (counted from the end).
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::ops {

/// y[..., out] = x[..., in] @ w[out, in]^T + b[out] (b may be undefined), for any number of leading
/// dimensions. Autocast: lower precision.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
/// c = a @ b: [..., M, K] @ [..., K, N] -> [..., M, N] with the batch dimensions broadcast
/// (NumPy/PyTorch rules); a 1-D operand is a row (a) or column (b) vector whose dimension is
/// dropped from the result. Autocast: lower precision.
Tensor matmul(const Tensor& a, const Tensor& b);

/// Element-wise with NumPy/PyTorch broadcasting, any rank ([2,3] + [1,3], [B,T,C] + [C], ...).
/// Inputs of different dtypes are promoted to the wider one.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// max(x, 0); a NaN stays NaN (as in PyTorch), so it still reaches the loss.
Tensor relu(const Tensor& x);

/// Sum / mean of all elements, as a 0-dim tensor. Accumulates in double whatever the size, rounds
/// once; autocast: float32.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
/// Sum / mean over `dims` (each once; empty means all), keeping them as size 1 when keepdim.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// The maxima along `dim` (the gradient goes to the first maximum; a NaN is the maximum).
/// Autocast: none (runs in the input's dtype).
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
/// The index (int64) of the first maximum along `dim`. Not differentiable.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

/// The same elements in another shape (one dimension may be -1: inferred). Shares x's storage (no
/// copy): tensors are always contiguous, so every reshape is a view.
Tensor reshape(const Tensor& x, const Shape& shape);
/// x with a dimension of size 1 inserted at `dim` (in [-rank - 1, rank]) / removed at `dim`.
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
/// Dimensions reordered: out.shape[i] = x.shape[dims[i]]. A contiguous copy.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
/// Two dimensions swapped (a permute).
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
/// Elements [start, start + length) along `dim` (a contiguous copy).
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// Consecutive pieces of `size` along `dim` (the last may be shorter), as torch.split.
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
/// `chunks` pieces along `dim` of ceil(n / chunks) each (fewer if n is small), as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
/// The tensors joined along `dim`; all other dimensions must match.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
/// x broadcast to `shape` (NumPy rules; -1 keeps a dimension), as a contiguous copy.
Tensor expand(const Tensor& x, const Shape& shape);

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
