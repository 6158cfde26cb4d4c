// SGD: options, groups, the momentum buffers and the scalars of each update (the element loops are
// in update_cpu.cc and update_cuda.cu).
#include "optim/sgd.h"

#include <cmath>
#include <utility>

#include "framework/error.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim {

void SGDOptions::validate(const std::string& who) const {
  check_lr(lr, who);
  AG_CHECK(momentum >= 0 && std::isfinite(momentum), who, ": momentum must be >= 0, got ", momentum);
  AG_CHECK(weight_decay >= 0 && std::isfinite(weight_decay), who, ": weight_decay must be >= 0, got ", weight_decay);
  AG_CHECK(std::isfinite(dampening), who, ": dampening must be finite, got ", dampening);
  AG_CHECK(!nesterov || (momentum > 0 && dampening == 0), who, ": nesterov needs momentum > 0 and dampening == 0, ",
           "got momentum ", momentum, ", dampening ", dampening);
}

OptionValues SGDOptions::values() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SGDOptions SGDOptions::from_values(const OptionValues& values, const std::string& who) {
  check_option_names(values, SGDOptions{}.values(), who);
  return {.lr = values.at("lr"),
          .momentum = values.at("momentum"),
          .dampening = values.at("dampening"),
          .weight_decay = values.at("weight_decay"),
          .nesterov = values.at("nesterov") != 0.0};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD({{.params = std::move(params)}}, options) {}

SGD::SGD(const std::vector<ParamGroup<SGDOptions>>& groups, SGDOptions defaults)
    : OptimizerWithOptions("SGD", groups, defaults) {}

Tensor SGD::momentum_buffer(size_t index) const {
  auto it = buffers_.find(index);
  return it != buffers_.end() ? it->second : Tensor();
}

void SGD::save_param_state(size_t index, ParamState& out) const {
  const Tensor buffer = momentum_buffer(index);
  if (buffer.defined()) out.tensors["momentum_buffer"] = buffer;
}

void SGD::load_param_state(size_t index, const ParamState& in) {
  buffers_[index] = in.tensors.count("momentum_buffer") ? loaded_tensor(index, in, "momentum_buffer") : Tensor();
}

void SGD::update(const std::vector<ParamUpdate>& params) {
  kernels::SgdLists lists;
  std::vector<kernels::SgdScalars> scalars;
  std::vector<std::pair<size_t, Tensor>> made;  // momentum buffers made for this step, kept once it ran
  for (const ParamUpdate& u : params) {
    const SGDOptions& o = options(param_group_of(u.index));
    // A momentum that rounds to 0 in float means none (the kernels compute in float).
    const bool with_momentum = static_cast<float>(o.momentum) != 0.0f;
    Tensor buffer = momentum_buffer(u.index);
    const bool first = with_momentum && !buffer.defined();
    if (first) {
      buffer = Tensor::empty(u.master.shape(), DType::kFloat32, u.master.device());
      made.emplace_back(u.index, buffer);
    }
    lists[kernels::kSgdWeight].push_back(u.master);
    lists[kernels::kSgdGrad].push_back(u.grad);
    lists[kernels::kSgdMomentum].push_back(with_momentum ? buffer : Tensor());
    lists[kernels::kSgdRounded].push_back(u.rounded);
    scalars.push_back({.lr = static_cast<float>(o.lr),
                       .weight_decay = static_cast<float>(o.weight_decay),
                       .momentum = static_cast<float>(o.momentum),
                       .one_minus_dampening = static_cast<float>(1.0 - o.dampening),
                       .nesterov = o.nesterov,
                       .first_step = first,
                       .rounding_key = u.rounding_key});
  }
  kernels::sgd_update(params.front().master.device(), lists, scalars);
  for (auto& [index, buffer] : made) buffers_[index] = buffer;
  for (Tensor& buffer : lists[kernels::kSgdMomentum]) {
    if (buffer.defined()) buffer.bump_version();
  }
}

}  // namespace ampgrad::optim
