// Adam / AdamW: options, state and the scalars of each update (the element loops are in
// update_cpu.cc and update_cuda.cu).
#include "optim/adam.h"

#include <cmath>

#include "framework/error.h"

namespace ampgrad::optim {

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, Decay::kL2) {}

Adam::Adam(std::vector<Tensor> params, AdamOptions options, Decay decay)
    : Optimizer(std::move(params)), options_(options), decay_(decay) {
  const char* name = decay == Decay::kL2 ? "Adam" : "AdamW";
  set_lr(options.lr);
  AG_CHECK(options.beta1 >= 0 && options.beta1 < 1, name, ": beta1 must be in [0, 1), got ", options.beta1);
  AG_CHECK(options.beta2 >= 0 && options.beta2 < 1, name, ": beta2 must be in [0, 1), got ", options.beta2);
  AG_CHECK(options.eps >= 0 && std::isfinite(options.eps), name, ": eps must be finite and >= 0, got ", options.eps);
  AG_CHECK(options.weight_decay >= 0 && std::isfinite(options.weight_decay), name,
           ": weight_decay must be finite and >= 0, got ", options.weight_decay);
  states_.resize(parameters().size());
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : Adam(std::move(params), {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay},
           Decay::kDecoupled) {}

void Adam::save_param_state(size_t index, ParamState& out) const {
  const State& s = states_[index];
  out.counters["step"] = s.step;
  if (s.step > 0) {
    out.tensors["exp_avg"] = s.exp_avg;
    out.tensors["exp_avg_sq"] = s.exp_avg_sq;
  }
}

void Adam::load_param_state(size_t index, const ParamState& in) {
  auto step = in.counters.find("step");
  AG_CHECK(step != in.counters.end() && step->second >= 0, name(), "::load_state: parameter ", index,
           " needs a 'step' counter >= 0");
  State s;
  s.step = step->second;
  if (s.step > 0) {
    s.exp_avg = loaded_tensor(index, in, "exp_avg");
    s.exp_avg_sq = loaded_tensor(index, in, "exp_avg_sq");
  }
  states_[index] = s;
}

void Adam::update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) {
  State& s = states_[index];
  if (s.step == 0) {
    s.exp_avg = zeros(master.shape(), DType::kFloat32, master.device());
    s.exp_avg_sq = zeros(master.shape(), DType::kFloat32, master.device());
  }
  s.step += 1;
  // Bias corrections in double, rounded once (as PyTorch does).
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(s.step));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, static_cast<double>(s.step)));
  const float wd = static_cast<float>(options_.weight_decay);
  const kernels::AdamScalars scalars{
      .step_size = static_cast<float>(lr_ / bias_correction1),
      .bc2_sqrt = static_cast<float>(bias_correction2_sqrt),
      .beta1 = static_cast<float>(options_.beta1),
      .beta2 = static_cast<float>(options_.beta2),
      .one_minus_beta1 = static_cast<float>(1.0 - options_.beta1),
      .one_minus_beta2 = static_cast<float>(1.0 - options_.beta2),
      .eps = static_cast<float>(options_.eps),
      .l2 = decay_ == Decay::kL2 ? wd : 0.0f,
      .decoupled = decay_ == Decay::kDecoupled ? static_cast<float>(1.0 - lr_ * options_.weight_decay) : 1.0f};
  kernels::adam_update(master.device(), master.data<float>(), grad.data<float>(), s.exp_avg.data<float>(),
                       s.exp_avg_sq.data<float>(), copy, master.numel(), scalars);
  s.exp_avg.bump_version();
  s.exp_avg_sq.bump_version();
}

}  // namespace ampgrad::optim
