// 2-D pooling: max_pool2d, avg_pool2d and adaptive_avg_pool2d over the last two dimensions of
// [N, C, H, W] (or [C, H, W]). Autocast: none (they run in the input's dtype, summing in float).
//   max: dx[argmax] += dy;  avg: each tap of a window gets dy / divisor;  adaptive: dy / window size
#include <string>

#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"
#include "ops/pool/pool_kernels.h"

namespace ampgrad::ops {

namespace {

using kernels::ConvGeometry;

// PyTorch's pooling_output_shape: floor (or ceil) of the window count, and with ceil_mode a last
// window must start inside the input or its left padding.
int64_t pool_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation, bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  const int64_t floor_div = span >= 0 ? span / stride : -((-span + stride - 1) / stride);
  int64_t out = floor_div + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

struct WindowOptions {
  Size2 kernel, stride, padding, dilation;
  bool ceil_mode;
};

// Built by appending: GCC 12's "literal" + std::string&& inlining warns falsely (-Wrestrict).
std::string pair(Size2 p) {
  std::string text = "{";
  text += std::to_string(p[0]);
  text += ", ";
  text += std::to_string(p[1]);
  text += "}";
  return text;
}

// Checks x and the window and returns the geometry (stride {0, 0} is the kernel size).
ConvGeometry window_geometry(const char* op, const Tensor& x, WindowOptions o) {
  AG_CHECK(x.defined(), op, ": x is undefined");
  AG_CHECK(x.dim() == 3 || x.dim() == 4, op, ": x must be [N, C, H, W] or [C, H, W], got ", describe({{"x", &x}}));
  AG_CHECK(x.size(-2) >= 1 && x.size(-1) >= 1, op, ": the input's H and W must be positive (as in PyTorch), got ",
           describe({{"x", &x}}));
  if (o.stride == Size2{0, 0}) o.stride = o.kernel;
  AG_CHECK(o.kernel[0] >= 1 && o.kernel[1] >= 1, op, ": kernel_size must be positive, got ", pair(o.kernel));
  AG_CHECK(o.stride[0] >= 1 && o.stride[1] >= 1, op, ": stride must be positive, got ", pair(o.stride));
  AG_CHECK(o.dilation[0] >= 1 && o.dilation[1] >= 1, op, ": dilation must be positive, got ", pair(o.dilation));
  AG_CHECK(o.padding[0] >= 0 && o.padding[1] >= 0 && o.padding[0] <= o.kernel[0] / 2 && o.padding[1] <= o.kernel[1] / 2,
           op, ": padding ", pair(o.padding), " must be at most half the kernel size ", pair(o.kernel),
           " (as in PyTorch)");
  const int64_t h = x.size(-2), w = x.size(-1);
  const ConvGeometry g{.kh = o.kernel[0], .kw = o.kernel[1], .stride_h = o.stride[0], .stride_w = o.stride[1],
                       .pad_h = o.padding[0], .pad_w = o.padding[1], .dilation_h = o.dilation[0],
                       .dilation_w = o.dilation[1],
                       .out_h = pool_out_size(h, o.kernel[0], o.stride[0], o.padding[0], o.dilation[0], o.ceil_mode),
                       .out_w = pool_out_size(w, o.kernel[1], o.stride[1], o.padding[1], o.dilation[1], o.ceil_mode)};
  AG_CHECK(g.out_h >= 1 && g.out_w >= 1, op, ": the input ", h, " x ", w, " is too small for kernel ", pair(o.kernel),
           ", stride ", pair(o.stride), ", padding ", pair(o.padding), ", dilation ", pair(o.dilation),
           ": output ", g.out_h, " x ", g.out_w, " (", describe({{"x", &x}}), ")");
  return g;
}

Shape pooled_shape(const Tensor& x, int64_t out_h, int64_t out_w) {
  Shape s = x.shape();
  s[s.size() - 2] = out_h;
  s[s.size() - 1] = out_w;
  return s;
}

struct MaxPool2d {
  static constexpr OpInfo kInfo{"max_pool2d", CastPolicy::kNone};
  MaxPool2dOptions options;
  ConvGeometry geometry{};
  Tensor indices;  // where each maximum came from (not a graph tensor)
  Shape in_shape;

  void check(const Tensor& x) const {
    window_geometry(kInfo.name, x, {options.kernel_size, options.stride, options.padding, options.dilation, options.ceil_mode});
  }

  Tensor forward(SavedTensors&, const Tensor& x) {
    geometry = window_geometry(kInfo.name, x,
                               {options.kernel_size, options.stride, options.padding, options.dilation, options.ceil_mode});
    in_shape = x.shape();
    const Shape out_shape = pooled_shape(x, geometry.out_h, geometry.out_w);
    Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
    indices = Tensor::empty(out_shape, DType::kInt64, x.device());
    kernels::max_pool2d(x, geometry, y, indices);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(in_shape, dy.dtype(), dy.device());
    kernels::max_pool2d_backward(dy, indices, dx);
    return {dx};
  }
};

struct AvgPool2d {
  static constexpr OpInfo kInfo{"avg_pool2d", CastPolicy::kNone};
  AvgPool2dOptions options;
  ConvGeometry geometry{};
  Shape in_shape;

  WindowOptions window() const {
    return {options.kernel_size, options.stride, options.padding, {1, 1}, options.ceil_mode};
  }
  kernels::AvgPoolDivisor divisor() const { return {options.count_include_pad, options.divisor_override}; }

  void check(const Tensor& x) const {
    window_geometry(kInfo.name, x, window());
    AG_CHECK(options.divisor_override >= 0, kInfo.name, ": divisor_override must be positive (or 0: none), got ",
             options.divisor_override);
  }

  Tensor forward(SavedTensors&, const Tensor& x) {
    geometry = window_geometry(kInfo.name, x, window());
    in_shape = x.shape();
    Tensor y = Tensor::empty(pooled_shape(x, geometry.out_h, geometry.out_w), x.dtype(), x.device());
    kernels::avg_pool2d(x, geometry, divisor(), y);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(in_shape, dy.dtype(), dy.device());
    kernels::avg_pool2d_backward(dy, geometry, divisor(), dx);
    return {dx};
  }
};

struct AdaptiveAvgPool2d {
  static constexpr OpInfo kInfo{"adaptive_avg_pool2d", CastPolicy::kNone};
  Size2 output_size;
  Shape in_shape;

  void check(const Tensor& x) const {
    AG_CHECK(x.defined(), kInfo.name, ": x is undefined");
    AG_CHECK(x.dim() == 3 || x.dim() == 4, kInfo.name, ": x must be [N, C, H, W] or [C, H, W], got ",
             describe({{"x", &x}}));
    AG_CHECK(output_size[0] >= 1 && output_size[1] >= 1, kInfo.name, ": output_size must be positive, got ",
             pair(output_size));
    AG_CHECK(x.size(-2) >= 1 && x.size(-1) >= 1, kInfo.name, ": the input's H and W must be positive, got ",
             describe({{"x", &x}}));
  }

  Tensor forward(SavedTensors&, const Tensor& x) {
    in_shape = x.shape();
    Tensor y = Tensor::empty(pooled_shape(x, output_size[0], output_size[1]), x.dtype(), x.device());
    kernels::adaptive_avg_pool2d(x, y);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(in_shape, dy.dtype(), dy.device());
    kernels::adaptive_avg_pool2d_backward(dy, dx);
    return {dx};
  }
};

}  // namespace

Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& options) {
  return dispatch(MaxPool2d{.options = options, .indices = {}, .in_shape = {}}, x);
}
Tensor avg_pool2d(const Tensor& x, const AvgPool2dOptions& options) {
  return dispatch(AvgPool2d{.options = options, .in_shape = {}}, x);
}
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size) {
  return dispatch(AdaptiveAvgPool2d{.output_size = output_size, .in_shape = {}}, x);
}

}  // namespace ampgrad::ops
