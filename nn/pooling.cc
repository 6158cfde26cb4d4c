// Pooling and flattening modules over their ops.
#include "nn/pooling.h"

#include "framework/error.h"

namespace ampgrad::nn {

MaxPool2d::MaxPool2d(int64_t k) : options{.kernel_size = {k, k}, .stride = {k, k}} {}
Tensor MaxPool2d::forward(const Tensor& x) { return ops::max_pool2d(x, options); }

AvgPool2d::AvgPool2d(int64_t k) : options{.kernel_size = {k, k}, .stride = {k, k}} {}
Tensor AvgPool2d::forward(const Tensor& x) { return ops::avg_pool2d(x, options); }

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return ops::adaptive_avg_pool2d(x, output_size); }

Tensor Flatten::forward(const Tensor& x) { return ops::flatten(x, start_dim, end_dim); }

Tensor Unflatten::forward(const Tensor& x) {
  AG_CHECK(x.defined() && x.dim() >= 1, "nn::Unflatten: needs a tensor of rank >= 1");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  AG_CHECK(d >= 0 && d < x.dim(), "nn::Unflatten: dimension ", dim, " is out of range for ", x.to_string());
  AG_CHECK(shape_numel(sizes) == x.size(d), "nn::Unflatten: sizes multiply to ", shape_numel(sizes),
           ", not dimension ", dim, "'s size ", x.size(d), " of ", x.to_string());
  Shape shape(x.shape().begin(), x.shape().begin() + d);
  shape.insert(shape.end(), sizes.begin(), sizes.end());
  shape.insert(shape.end(), x.shape().begin() + d + 1, x.shape().end());
  return ops::reshape(x, shape);
}

}  // namespace ampgrad::nn
