// nn::Conv2d: a 2-D convolution layer over ops::conv2d, with PyTorch's initialisation.
#pragma once

#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"

namespace ampgrad::nn {

/// Conv2d's options beside the channel counts and kernel size (PyTorch's constructor arguments).
struct Conv2dOptions {
  ops::Size2 stride = {1, 1};    ///< step between output positions
  ops::Size2 padding = {0, 0};   ///< zeros on each side
  ops::Size2 dilation = {1, 1};  ///< spacing between kernel taps
  int64_t groups = 1;            ///< channel groups (in and out channels divisible by it)
  Bias bias = Bias::kYes;        ///< whether there is a bias
};

/// y = conv2d(x, weight, bias): x [N, in, H, W] -> [N, out, Ho, Wo]. weight [out, in / groups,
/// kH, kW] and bias [out] uniform in +-1/sqrt(fan_in), fan_in = in / groups kH kW (PyTorch's init).
class Conv2d : public Module {
 public:
  /// A square kernel_size x kernel_size convolution.
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, const Conv2dOptions& options = {});
  /// A kernel_size {kH, kW} convolution.
  Conv2d(int64_t in_channels, int64_t out_channels, ops::Size2 kernel_size, const Conv2dOptions& options = {});
  Tensor forward(const Tensor& x) override;

  Tensor& weight;  ///< [out, in / groups, kH, kW]
  Tensor& bias;    ///< [out]; undefined with Bias::kNo
  ops::Conv2dOptions options;  ///< stride, padding, dilation and groups as ops::conv2d takes them
};

}  // namespace ampgrad::nn
