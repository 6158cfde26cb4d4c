// nn::LayerNorm over ops::layer_norm, nn::BatchNorm2d over ops::batch_norm.
#include "nn/normalization.h"

#include "framework/copy.h"
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

namespace {

Tensor channel_init(int64_t size, bool wanted, double value) {
  AG_CHECK(size > 0, "nn::BatchNorm2d(", size, "): the channel count must be positive");
  return wanted ? full({size}, value) : Tensor();
}

}  // namespace

BatchNorm2d::BatchNorm2d(int64_t c, const BatchNormOptions& o)
    : weight(register_parameter("weight", channel_init(c, o.affine, 1.0))),
      bias(register_parameter("bias", channel_init(c, o.affine, 0.0))),
      running_mean(register_buffer("running_mean", channel_init(c, o.track_running_stats, 0.0))),
      running_var(register_buffer("running_var", channel_init(c, o.track_running_stats, 1.0))),
      num_batches_tracked(register_buffer(
          "num_batches_tracked",
          o.track_running_stats ? Tensor::from_vector(std::vector<int64_t>{0}, Shape{}) : Tensor())),
      options(o) {
  AG_CHECK(o.eps >= 0, "nn::BatchNorm2d: eps must be >= 0, got ", o.eps);
  AG_CHECK(o.momentum >= 0 && o.momentum <= 1, "nn::BatchNorm2d: momentum must be in [0, 1], got ", o.momentum);
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  AG_CHECK(x.defined() && x.dim() == 4, "nn::BatchNorm2d: expected a 4-D input [N, C, H, W], got ",
           x.defined() ? x.to_string() : std::string("an undefined tensor"));
  // Without running statistics the batch's are used in eval too (PyTorch's bn_training).
  const bool batch_stats = is_training() || !running_mean.defined();
  Tensor y = ops::batch_norm(x, running_mean, running_var, weight, bias, batch_stats, options.momentum, options.eps);
  if (is_training() && num_batches_tracked.defined()) {
    // Bookkeeping PyTorch keeps (it matters only to momentum = None, which ampgrad does not
    // offer), after the op's checks passed: in place on the CPU, one value read back on a GPU.
    if (num_batches_tracked.device() == Device::kCPU) {
      ++num_batches_tracked.data<int64_t>()[0];
      num_batches_tracked.bump_version();
    } else {
      fill_(num_batches_tracked, static_cast<double>(num_batches_tracked.item<int64_t>() + 1));
    }
  }
  return y;
}

}  // namespace ampgrad::nn
