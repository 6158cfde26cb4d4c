// SGD update on FP32 master weights.
#include "optim/sgd.h"

#include <cmath>

#include "framework/error.h"
#include "framework/parallel.h"

#if defined(AMPGRAD_WITH_CUDA)
#include "optim/cuda/optim_cuda.h"
#endif

namespace ampgrad::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : Optimizer(std::move(params)), options_(options) {
  set_lr(options.lr);
  AG_CHECK(options.momentum >= 0 && std::isfinite(options.momentum), "SGD: momentum must be >= 0, got ",
           options.momentum);
  AG_CHECK(options.weight_decay >= 0 && std::isfinite(options.weight_decay), "SGD: weight_decay must be >= 0, got ",
           options.weight_decay);
  AG_CHECK(std::isfinite(options.dampening), "SGD: dampening must be finite, got ", options.dampening);
  AG_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0), "SGD: nesterov needs momentum > 0 ",
           "and dampening == 0, got momentum ", options.momentum, ", dampening ", options.dampening);
  buffers_.resize(parameters().size());
}

void SGD::save_param_state(size_t index, ParamState& out) const {
  if (buffers_[index].defined()) out.tensors["momentum_buffer"] = buffers_[index];
}

void SGD::load_param_state(size_t index, const ParamState& in) {
  buffers_[index] = in.tensors.count("momentum_buffer") ? loaded_tensor(index, in, "momentum_buffer") : Tensor();
}

Optimizer::ParamCopy SGD::update(size_t index, Tensor& master, const Tensor& grad) {
  if (master.device() == Device::kCUDA) {
#if defined(AMPGRAD_WITH_CUDA)
    return update_cuda(index, master, grad);
#else
    AG_FAIL("SGD: ", master.to_string(), " is on CUDA but this build has no CUDA backend");
#endif
  }
  const int64_t n = master.numel();
  float* w = master.data<float>();
  const float* g = grad.data<float>();
  const float lr = static_cast<float>(lr_), wd = static_cast<float>(options_.weight_decay);
  const float momentum = static_cast<float>(options_.momentum);
  const float one_minus_dampening = static_cast<float>(1.0 - options_.dampening);  // in double, as PyTorch
  if (momentum == 0.0f) {
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    });
    return ParamCopy::kNeeded;
  }
  Tensor& buffer = buffers_[index];
  const bool first = !buffer.defined();
  if (first) buffer = Tensor::empty(master.shape(), DType::kFloat32, master.device());
  float* buf = buffer.data<float>();
  const bool nesterov = options_.nesterov;
  parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float d = g[i] + wd * w[i];
      buf[i] = first ? d : momentum * buf[i] + one_minus_dampening * d;
      w[i] -= lr * (nesterov ? d + momentum * buf[i] : buf[i]);
    }
  });
  buffer.bump_version();
  return ParamCopy::kNeeded;
}

#if defined(AMPGRAD_WITH_CUDA)
Optimizer::ParamCopy SGD::update_cuda(size_t index, Tensor& master, const Tensor& grad) {
  // One fused kernel: master, momentum buffer and (for an FP16 parameter) its rounded copy.
  // The same test as the CPU loop (momentum rounded to float): a momentum that rounds to 0 means none.
  const bool with_momentum = static_cast<float>(options_.momentum) != 0.0f;
  Tensor& buffer = buffers_[index];
  const bool first = with_momentum && !buffer.defined();
  if (first) buffer = Tensor::empty(master.shape(), DType::kFloat32, master.device());
  Tensor copy = fused_param_copy(index);
  const cuda::SgdScalars s{.lr = static_cast<float>(lr_),
                           .weight_decay = static_cast<float>(options_.weight_decay),
                           .momentum = static_cast<float>(options_.momentum),
                           .one_minus_dampening = static_cast<float>(1.0 - options_.dampening)};  // as the CPU
  cuda::sgd_update(master.data<float>(), grad.data<float>(), with_momentum ? buffer.data<float>() : nullptr,
                   copy.defined() ? copy.data<Half>() : nullptr, master.numel(), s,
                   options_.nesterov ? cuda::Nesterov::kYes : cuda::Nesterov::kNo,
                   first ? cuda::FirstStep::kYes : cuda::FirstStep::kNo, /*found_inf=*/nullptr);
  if (with_momentum) buffer.bump_version();
  return copy.defined() ? ParamCopy::kWritten : ParamCopy::kNeeded;
}
#endif

}  // namespace ampgrad::optim
