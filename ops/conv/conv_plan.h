// What conv2d's two forms (conv.cc's, and conv_float8.cc's inside a Float8Guard) share: the
// checks, the geometry, and the im2col route's views and chunks. Internal to ops/conv.
#pragma once

#include <algorithm>
#include <cstdint>

#include "framework/tensor.h"
#include "ops/conv/conv_kernels.h"
#include "ops/ops.h"

namespace ampgrad::ops::detail {

/// conv2d's checks of x, w, b and the options, naming `op`; same_dtype: x, w and b share one
/// dtype (an FP8 conv2d under autocast casts each as it is, so it asks for less).
void check_conv2d(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options,
                  bool same_dtype);

/// One filter per channel (groups = C = O): a direct kernel, since a GEMM per channel would have
/// one row and kH kW columns.
inline bool is_depthwise(const Tensor& x, const Tensor& w, int64_t groups) {
  return groups > 1 && groups == x.size(1) && w.size(0) == x.size(1);
}

/// A convolution's options, its geometry once the forward has seen x and w (set_geometry), and
/// its im2col route: the weight's groups as matrices, the columns of a chunk of samples, and the
/// chunks.
struct ConvPlan {
  Conv2dOptions options;
  kernels::ConvGeometry geometry{};

  ConvPlan() = default;
  explicit ConvPlan(const Conv2dOptions& o) : options(o) {}

  /// The geometry of checked x and w under the options.
  void set_geometry(const Tensor& x, const Tensor& w);

  bool depthwise(const Tensor& x, const Tensor& w) const { return is_depthwise(x, w, options.groups); }

  /// w [O, C/g, kH, kW] as the g matrices [O/g, Kg] (a view).
  Tensor weight_groups(const Tensor& w) const {
    return reshape(w, {options.groups, w.size(0) / options.groups, w.size(1) * w.size(2) * w.size(3)});
  }

  /// The samples [n0, n0 + n) of x as columns [g, Kg, n L] (a group's rows are one block), in x's
  /// dtype (an 8-bit one too).
  Tensor columns(const Tensor& x, const Tensor& w, int64_t n0, int64_t n) const {
    const int64_t rows = x.size(1) * w.size(2) * w.size(3), len = geometry.out_h * geometry.out_w;
    Tensor cols = Tensor::empty({rows, n, len}, x.dtype(), x.device());
    kernels::im2col(x, n0, geometry, cols);
    return reshape(cols, {options.groups, rows / options.groups, n * len});
  }

  /// fn(n0, n) for chunks of samples whose columns fit the device's budget divided by `share` (at
  /// least one sample a chunk).
  template <typename Fn>
  void for_each_chunk(const Tensor& x, const Tensor& w, int64_t share, Fn&& fn) const {
    const int64_t per_sample = x.size(1) * w.size(2) * w.size(3) * geometry.out_h * geometry.out_w;
    const int64_t budget = kernels::im2col_column_budget(x.device()) / share;
    const int64_t batch = x.size(0), chunk = std::clamp<int64_t>(budget / per_sample, 1, std::max<int64_t>(batch, 1));
    for (int64_t n0 = 0; n0 < batch; n0 += chunk) fn(n0, std::min(chunk, batch - n0));
  }
};

}  // namespace ampgrad::ops::detail
