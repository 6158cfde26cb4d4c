// nn::Conv2d: PyTorch's initialisation (kaiming_uniform_(a = sqrt(5)), i.e. +-1/sqrt(fan_in)),
// forward through ops::conv2d.
#include "nn/conv.h"

#include <cmath>

#include "framework/error.h"

namespace ampgrad::nn {

namespace {

Tensor conv_init(const Shape& shape, int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return uniform(shape, -bound, bound);
}

// The weight [out, in / groups, kH, kW] and its init, after checking the arguments.
Tensor checked_weight(int64_t in, int64_t out, ops::Size2 k, const Conv2dOptions& o) {
  AG_CHECK(in > 0 && out > 0 && k[0] > 0 && k[1] > 0, "nn::Conv2d(", in, ", ", out, ", {", k[0], ", ", k[1],
           "}): channel counts and kernel sizes must be positive");
  AG_CHECK(o.groups >= 1 && in % o.groups == 0 && out % o.groups == 0, "nn::Conv2d(", in, ", ", out,
           "): groups = ", o.groups, " must divide both channel counts");
  return conv_init({out, in / o.groups, k[0], k[1]}, in / o.groups * k[0] * k[1]);
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel_size, const Conv2dOptions& o)
    : Conv2d(in, out, ops::Size2{kernel_size, kernel_size}, o) {}

Conv2d::Conv2d(int64_t in, int64_t out, ops::Size2 k, const Conv2dOptions& o)
    // weight is initialised first (members in declaration order), so bias's fan_in is safe to divide.
    : weight(register_parameter("weight", checked_weight(in, out, k, o))),
      bias(register_parameter("bias", o.bias == Bias::kYes ? conv_init({out}, weight.numel() / out) : Tensor())),
      options{.stride = o.stride, .padding = o.padding, .dilation = o.dilation, .groups = o.groups} {}

Tensor Conv2d::forward(const Tensor& x) { return ops::conv2d(x, weight, bias, options); }

}  // namespace ampgrad::nn
