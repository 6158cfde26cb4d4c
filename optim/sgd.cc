// SGD update on FP32 master weights.
#include "optim/sgd.h"

#include <cmath>

#include "framework/error.h"

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

void SGD::update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) {
  // A momentum that rounds to 0 in float means none (the kernels compute in float).
  const bool with_momentum = static_cast<float>(options_.momentum) != 0.0f;
  Tensor& buffer = buffers_[index];
  const bool first = with_momentum && !buffer.defined();
  if (first) buffer = Tensor::empty(master.shape(), DType::kFloat32, master.device());
  const kernels::SgdScalars s{.lr = static_cast<float>(lr_),
                              .weight_decay = static_cast<float>(options_.weight_decay),
                              .momentum = static_cast<float>(options_.momentum),
                              .one_minus_dampening = static_cast<float>(1.0 - options_.dampening)};
  kernels::sgd_update(master.device(), master.data<float>(), grad.data<float>(),
                      with_momentum ? buffer.data<float>() : nullptr, copy, master.numel(), s,
                      options_.nesterov ? kernels::Nesterov::kYes : kernels::Nesterov::kNo,
                      first ? kernels::FirstStep::kYes : kernels::FirstStep::kNo);
  if (with_momentum) buffer.bump_version();
}

}  // namespace ampgrad::optim
