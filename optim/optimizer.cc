// Optimizer base: master weights, the step skeleton and state export shared by SGD and Adam.
#include "optim/optimizer.h"

#include <cmath>

#include "framework/copy.h"
#include "framework/error.h"

namespace ampgrad::optim {

Optimizer::Optimizer(std::vector<Tensor> params)
    : params_(std::move(params)), synced_storage_(params_.size()), synced_version_(params_.size()) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    AG_CHECK(p.defined(), "optimizer: parameter ", i, " is undefined");
    AG_CHECK(p.is_leaf(), "optimizer: parameter ", i, " (", p.to_string(), ") was produced by an op; ",
             "hint: optimize leaves (model.parameters()), or detach() it and set_requires_grad(true)");
    AG_CHECK(p.dtype() == DType::kFloat32 || is_low_precision(p.dtype()), "optimizer: parameter ", i, " is ",
             p.to_string(), "; optimizers update float32 and lower-precision parameters (the latter through an ",
             "FP32 master copy)");
    for (size_t j = 0; j < i; ++j) {
      AG_CHECK(!params_[j].is_same(p), "optimizer: parameter ", i, " is the same tensor as parameter ", j);
    }
    master_of(i);  // makes the FP32 master of a float16 parameter
  }
}

void Optimizer::set_lr(double lr) {
  AG_CHECK(lr >= 0 && std::isfinite(lr), "optimizer: learning rate must be finite and >= 0, got ", lr);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (Tensor& p : params_) {
    p.set_grad(Tensor());
    Tensor master = p.master();
    if (master.defined()) master.set_grad(Tensor());
  }
}

void Optimizer::mark_in_sync(size_t index) {
  synced_storage_[index] = params_[index].detach();
  synced_version_[index] = params_[index].version();
}

Tensor Optimizer::master_of(size_t index) {
  Tensor& p = params_.at(index);
  if (p.dtype() == DType::kFloat32) return p;
  Tensor master = p.master();
  const bool in_sync = master.defined() && synced_storage_[index].defined() &&
                       synced_storage_[index].data_ptr() == p.data_ptr() && synced_version_[index] == p.version();
  if (!in_sync) {
    Tensor grad = master.defined() ? master.grad() : Tensor();  // an unscaled gradient stays valid
    master = p.detach().to(DType::kFloat32);
    master.set_grad(grad.defined() && grad.shape() == master.shape() ? grad : Tensor());
    p.set_master(master);
    mark_in_sync(index);
  }
  return master;
}

Tensor Optimizer::fp32_grad(size_t index) {
  const Tensor& p = params_.at(index);
  if (p.dtype() == DType::kFloat32) return p.grad();
  const Tensor master = master_of(index);
  if (master.grad().defined()) return master.grad();
  if (!p.grad().defined()) return Tensor();
  return p.grad().detach().to(DType::kFloat32);
}

void Optimizer::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor grad = fp32_grad(i);
    if (!grad.defined()) continue;
    Tensor master = master_of(i);
    const bool has_master = !master.is_same(p);
    // The update rounds the new master into a lower-precision parameter in the same pass.
    update(i, master, grad, has_master ? kernels::RoundedCopy{p.data_ptr(), p.dtype()} : kernels::RoundedCopy{});
    p.bump_version();
    if (has_master) {
      master.bump_version();
      master.set_grad(Tensor());  // consumed: the next step derives it afresh
      mark_in_sync(i);
    }
  }
}

std::vector<ParamState> Optimizer::state() const {
  std::vector<ParamState> out(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].dtype() != DType::kFloat32 && params_[i].master().defined()) {
      out[i].tensors["master"] = params_[i].master();
    }
    save_param_state(i, out[i]);
  }
  return out;
}

Tensor Optimizer::loaded_tensor(size_t index, const ParamState& in, const std::string& key) const {
  auto it = in.tensors.find(key);
  AG_CHECK(it != in.tensors.end(), name(), "::load_state: parameter ", index, " has no '", key, "' state");
  const Tensor& t = it->second;
  const Tensor& p = params_[index];
  AG_CHECK(t.defined() && t.dtype() == DType::kFloat32 && t.shape() == p.shape(), name(), "::load_state: '", key,
           "' of parameter ", index, " is ", t.to_string(), " but the parameter is ", p.to_string(),
           " (state must be float32 of the parameter's shape)");
  Tensor copy = Tensor::empty(p.shape(), DType::kFloat32, p.device());
  copy_(copy, t);  // a private copy: the optimizer owns its state
  return copy;
}

void Optimizer::load_state(const std::vector<ParamState>& state) {
  AG_CHECK(state.size() == params_.size(), name(), "::load_state: the state has ", state.size(),
           " parameters but this optimizer has ", params_.size(), "; hint: build the optimizer over the same model");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (p.dtype() != DType::kFloat32 && state[i].tensors.count("master")) {
      p.set_master(loaded_tensor(i, state[i], "master"));
      mark_in_sync(i);  // keep the exact FP32 master: p holds its rounding
    }
    load_param_state(i, state[i]);
  }
}

}  // namespace ampgrad::optim
