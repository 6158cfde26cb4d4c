// nn::LayerNorm over ops::layer_norm.
#include "nn/normalization.h"

#include "framework/error.h"
#include "ops/ops.h"

namespace ampgrad::nn {

namespace {

Tensor affine_init(int64_t size, ElementwiseAffine affine, double value) {
  AG_CHECK(size > 0, "nn::LayerNorm(", size, "): the normalised size must be positive");
  return affine == ElementwiseAffine::kYes ? full({size}, value) : Tensor();
}

}  // namespace

LayerNorm::LayerNorm(int64_t normalized_shape, double eps_in, ElementwiseAffine affine)
    : weight(register_parameter("weight", affine_init(normalized_shape, affine, 1.0))),
      bias(register_parameter("bias", affine_init(normalized_shape, affine, 0.0))),
      eps(eps_in) {
  AG_CHECK(eps >= 0, "nn::LayerNorm: eps must be >= 0, got ", eps);
}

Tensor LayerNorm::forward(const Tensor& x) { return ops::layer_norm(x, weight, bias, eps); }

}  // namespace ampgrad::nn
