// Float64 reference implementations of the ops, written the plainest way (index by index over
// row-major data), for the op-case table and every test that checks an op's values. They share no
// code with the library.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::test {

using Values = std::vector<double>;

/// The broadcast of two shapes (NumPy rules), assumed compatible.
Shape broadcast_ref_shape(const Shape& a, const Shape& b);
/// f(a, b) element by element, each operand stretched to the broadcast shape.
Values broadcast_ref(const Values& a, const Shape& a_shape, const Values& b, const Shape& b_shape,
                     const std::function<double(double, double)>& f);
Values map_ref(const Values& x, const std::function<double(double)>& f);
/// f(a[i], b[i]) for equally long a and b.
Values zip_ref(const Values& a, const Values& b, const std::function<double(double, double)>& f);
double sum_ref(const Values& x);
double mse_ref(const Values& pred, const Values& target);
/// x with dimensions reordered: out.shape[i] = shape[dims[i]].
Values permute_ref(const Values& x, const Shape& shape, const std::vector<int64_t>& dims);
/// x[..., start:start+length, ...] along dim.
Values narrow_ref(const Values& x, const Shape& shape, int64_t dim, int64_t start, int64_t length);
/// xs joined along dim.
Values cat_ref(const std::vector<Values>& xs, const std::vector<Shape>& shapes, int64_t dim);
/// x summed over `dims` (non-negative, each once), as a flat array in the kept dimensions' order.
Values sum_dims_ref(const Values& x, const Shape& shape, const std::vector<int64_t>& dims);
/// The maxima along dim (first maximum), flat in the order of the other dimensions.
Values max_dim_ref(const Values& x, const Shape& shape, int64_t dim);
/// softmax (or log_softmax) of each row of `cols` values; causal rows of a [.., tq, cols] matrix
/// see only columns j <= i + cols - tq (the rest give 0).
Values softmax_ref(const Values& x, int64_t cols, bool log = false, int64_t causal_tq = 0);
/// Per-sample cross-entropy of logits [n, classes] (or log-probabilities) against int targets,
/// with label smoothing eps; ignored samples give 0.
Values cross_entropy_ref(const Values& scores, int64_t classes, const std::vector<int64_t>& target, int64_t ignore,
                         double eps, bool log_probs = false);
/// layer norm of each row of `cols` values, with weight and bias (empty: 1 and 0).
Values layer_norm_ref(const Values& x, int64_t cols, const Values& w, const Values& b, double eps);
/// c[m,n] = a[m,k] b[k,n], row-major.
Values matmul_ref(const Values& a, const Values& b, int64_t m, int64_t k, int64_t n);
/// y[n,out] = x[n,in] w[out,in]^T + b[out] (b empty: no bias).
Values linear_ref(const Values& x, const Values& w, const Values& b, int64_t n, int64_t in, int64_t out);
/// Batched a @ b: a [..., m, k] and b [..., k, n] with broadcast batch dimensions.
Values batched_matmul_ref(const Values& a, const Shape& a_shape, const Values& b, const Shape& b_shape);

// The convolutional ops (reference_conv.cc); x is [N, C, H, W] (pools: any [..., H, W]).
/// The spatial arguments of conv2d and the pools: {H, W} pairs.
struct WindowRef {
  int64_t kh, kw, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};
/// conv2d with groups; b may be empty. Output [N, O, Ho, Wo].
Values conv2d_ref(const Values& x, const Shape& x_shape, const Values& w, const Shape& w_shape, const Values& b,
                  const WindowRef& g, int64_t groups);
/// max_pool2d / avg_pool2d over out_h x out_w windows (the caller gives the output size, which
/// ceil_mode decides); avg divides by the padded span (count_include_pad) or by the taps inside.
Values max_pool2d_ref(const Values& x, const Shape& x_shape, const WindowRef& g, int64_t out_h, int64_t out_w);
Values avg_pool2d_ref(const Values& x, const Shape& x_shape, const WindowRef& g, int64_t out_h, int64_t out_w,
                      bool count_include_pad);
Values adaptive_avg_pool2d_ref(const Values& x, const Shape& x_shape, int64_t out_h, int64_t out_w);
/// batch norm of x [N, C, ...] with the given per-channel mean and var (empty: the batch's, biased).
Values batch_norm_ref(const Values& x, const Shape& x_shape, const Values& mean, const Values& var, const Values& w,
                      const Values& b, double eps);

}  // namespace ampgrad::test
