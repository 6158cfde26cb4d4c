// Pooling and flattening modules: layers without parameters over ops::max_pool2d, avg_pool2d,
// adaptive_avg_pool2d, flatten and its inverse.
#pragma once

#include <utility>

#include "nn/module.h"
#include "ops/ops.h"

namespace ampgrad::nn {

/// The maximum over each window (ops::max_pool2d); the stride defaults to the kernel size.
class MaxPool2d : public Module {
 public:
  /// A square kernel_size window, stride kernel_size.
  explicit MaxPool2d(int64_t kernel_size);
  /// Every option of ops::max_pool2d.
  explicit MaxPool2d(const ops::MaxPool2dOptions& options) : options(options) {}
  Tensor forward(const Tensor& x) override;
  ops::MaxPool2dOptions options;  ///< the window
};

/// The mean over each window (ops::avg_pool2d); the stride defaults to the kernel size.
class AvgPool2d : public Module {
 public:
  /// A square kernel_size window, stride kernel_size.
  explicit AvgPool2d(int64_t kernel_size);
  /// Every option of ops::avg_pool2d.
  explicit AvgPool2d(const ops::AvgPool2dOptions& options) : options(options) {}
  Tensor forward(const Tensor& x) override;
  ops::AvgPool2dOptions options;  ///< the window and divisor
};

/// The mean over adaptive windows giving a fixed output size (ops::adaptive_avg_pool2d).
class AdaptiveAvgPool2d : public Module {
 public:
  /// A square output_size x output_size output.
  explicit AdaptiveAvgPool2d(int64_t output_size) : output_size{output_size, output_size} {}
  /// An {Ho, Wo} output.
  explicit AdaptiveAvgPool2d(ops::Size2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& x) override;
  ops::Size2 output_size;  ///< {Ho, Wo}
};

/// Merges dimensions start_dim..end_dim (ops::flatten); by default all but the batch dimension.
class Flatten : public Module {
 public:
  /// Flattens start_dim..end_dim (inclusive; negative counts from the end).
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  int64_t start_dim;  ///< first merged dimension
  int64_t end_dim;    ///< last merged dimension
};

/// Splits dimension dim into `sizes` (PyTorch's nn.Unflatten), e.g. [B, 784] -> [B, 1, 28, 28].
class Unflatten : public Module {
 public:
  /// Splits dimension dim (negative counts from the end) into sizes, whose product must be its size.
  Unflatten(int64_t dim, Shape sizes) : dim(dim), sizes(std::move(sizes)) {}
  Tensor forward(const Tensor& x) override;
  int64_t dim;  ///< the dimension split
  Shape sizes;  ///< what it becomes
};

}  // namespace ampgrad::nn
