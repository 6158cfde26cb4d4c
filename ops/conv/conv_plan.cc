// conv2d's checks and geometry (conv_plan.h), shared by its plain and FP8 forms.
#include "ops/conv/conv_plan.h"

#include "ops/checks.h"

namespace ampgrad::ops::detail {

namespace {

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

}  // namespace

void check_conv2d(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options,
                  bool same_dtype) {
  check_same_device(op, {{"x", &x}, {"weight", &w}});
  if (b.defined()) check_same_device(op, {{"x", &x}, {"bias", &b}});
  if (same_dtype) check_same_dtype(op, {{"x", &x}, {"weight", &w}, {"bias", &b}});
  const auto all = [&] { return describe({{"x", &x}, {"weight", &w}, {"bias", &b}}); };
  const auto& o = options;
  AG_CHECK(x.dim() == 4 && w.dim() == 4, op,
           ": x must be [N, C, H, W] (or [C, H, W]) and weight [O, C/groups, kH, kW], got ", all());
  AG_CHECK(o.groups >= 1, op, ": groups must be >= 1, got ", o.groups);
  AG_CHECK(o.stride[0] >= 1 && o.stride[1] >= 1, op, ": stride must be >= 1, got {", o.stride[0], ", ",
           o.stride[1], "}");
  AG_CHECK(o.dilation[0] >= 1 && o.dilation[1] >= 1, op, ": dilation must be >= 1, got {", o.dilation[0],
           ", ", o.dilation[1], "}");
  AG_CHECK(o.padding[0] >= 0 && o.padding[1] >= 0, op, ": padding must be >= 0, got {", o.padding[0], ", ",
           o.padding[1], "}");
  AG_CHECK(x.size(1) >= 1 && w.size(0) >= 1 && w.size(2) >= 1 && w.size(3) >= 1, op,
           ": channels and kernel sizes must be positive (", all(), ")");
  AG_CHECK(x.size(1) % o.groups == 0 && w.size(0) % o.groups == 0, op, ": groups = ", o.groups,
           " must divide the input channels (", x.size(1), ") and the output channels (", w.size(0), ") (", all(), ")");
  AG_CHECK(w.size(1) * o.groups == x.size(1), op, ": x has ", x.size(1), " channels but weight expects ",
           w.size(1), " x groups ", o.groups, " = ", w.size(1) * o.groups, " (", all(),
           "); hint: weight is [out_channels, in_channels / groups, kH, kW], as in PyTorch");
  AG_CHECK(!b.defined() || b.shape() == Shape{w.size(0)}, op, ": bias must be [", w.size(0), "] (", all(), ")");
  const int64_t out_h = conv_out_size(x.size(2), w.size(2), o.stride[0], o.padding[0], o.dilation[0]);
  const int64_t out_w = conv_out_size(x.size(3), w.size(3), o.stride[1], o.padding[1], o.dilation[1]);
  AG_CHECK(out_h >= 1 && out_w >= 1, op, ": the kernel (", w.size(2), " x ", w.size(3), ", dilation {",
           o.dilation[0], ", ", o.dilation[1], "}) is larger than the padded input (", x.size(2) + 2 * o.padding[0],
           " x ", x.size(3) + 2 * o.padding[1], "): output ", out_h, " x ", out_w, " (", all(), ")");
}

void ConvPlan::set_geometry(const Tensor& x, const Tensor& w) {
  const Conv2dOptions& o = options;
  geometry = {.kh = w.size(2), .kw = w.size(3), .stride_h = o.stride[0], .stride_w = o.stride[1],
              .pad_h = o.padding[0], .pad_w = o.padding[1], .dilation_h = o.dilation[0], .dilation_w = o.dilation[1],
              .out_h = conv_out_size(x.size(2), w.size(2), o.stride[0], o.padding[0], o.dilation[0]),
              .out_w = conv_out_size(x.size(3), w.size(3), o.stride[1], o.padding[1], o.dilation[1])};
}

}  // namespace ampgrad::ops::detail
