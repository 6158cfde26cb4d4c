// Optimizer base: master weights and the step skeleton shared by SGD and Adam.
#include "optim/optimizer.h"

#include <cmath>

#include "framework/copy.h"
#include "framework/error.h"

namespace ampgrad::optim {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    AG_CHECK(p.defined(), "optimizer: parameter ", i, " is undefined");
    AG_CHECK(p.is_leaf(), "optimizer: parameter ", i, " (", p.to_string(), ") was produced by an op; ",
             "hint: optimize leaves (model.parameters()), or detach() it and set_requires_grad(true)");
    AG_CHECK(p.dtype() != DType::kFloat64, "optimizer: parameter ", i, " is ", p.to_string(),
             "; optimizers update float32 and float16 parameters (float16 through an FP32 master copy)");
    for (size_t j = 0; j < i; ++j) {
      AG_CHECK(!params_[j].is_same(p), "optimizer: parameter ", i, " is the same tensor as parameter ", j);
    }
    if (p.dtype() != DType::kFloat32) {
      params_[i].set_master(p.detach().to(DType::kFloat32));
    }
  }
  for (const Tensor& p : params_) written_versions_.push_back(p.version());
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

Tensor Optimizer::master_of(size_t index) const {
  const Tensor& p = params_.at(index);
  return p.dtype() == DType::kFloat32 ? p : p.master();
}

Tensor Optimizer::fp32_grad(size_t index) const {
  const Tensor& p = params_.at(index);
  if (p.dtype() == DType::kFloat32) return p.grad();
  const Tensor master = p.master();
  if (master.grad().defined()) return master.grad();
  if (!p.grad().defined()) return Tensor();
  return p.grad().detach().to(DType::kFloat32);
}

Tensor Optimizer::fused_param_copy(size_t index) const {
  const Tensor& p = params_.at(index);
  return p.dtype() == DType::kFloat16 && p.device() == Device::kCUDA ? p : Tensor();
}

void Optimizer::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    const Tensor grad = fp32_grad(i);
    if (!grad.defined()) continue;
    Tensor master = master_of(i);
    if (!master.is_same(p) && p.version() != written_versions_[i]) {
      copy_(master, p);  // the parameter was changed outside the optimizer (e.g. loaded): resync
    }
    param_written_ = false;
    update(i, master, grad);
    if (master.is_same(p) || param_written_) {
      p.bump_version();  // updated in place, or the fused kernel already wrote the rounded copy
      if (!master.is_same(p)) master.set_grad(Tensor());
    } else {
      copy_(p, master);  // round the FP32 master into the lower-precision parameter
      master.set_grad(Tensor());  // consumed: the next step derives it afresh
    }
    written_versions_[i] = p.version();
  }
}

}  // namespace ampgrad::optim
