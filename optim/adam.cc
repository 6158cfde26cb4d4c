// Adam / AdamW: options, groups, state and the scalars of each update (the element loops are in
// update_cpu.cc and update_cuda.cu).
#include "optim/adam.h"

#include <cmath>

#include "framework/error.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim {

void AdamOptions::validate(const std::string& who) const {
  check_lr(lr, who);
  AG_CHECK(beta1 >= 0 && beta1 < 1, who, ": beta1 must be in [0, 1), got ", beta1);
  AG_CHECK(beta2 >= 0 && beta2 < 1, who, ": beta2 must be in [0, 1), got ", beta2);
  AG_CHECK(eps >= 0 && std::isfinite(eps), who, ": eps must be finite and >= 0, got ", eps);
  AG_CHECK(weight_decay >= 0 && std::isfinite(weight_decay), who, ": weight_decay must be finite and >= 0, got ",
           weight_decay);
}

OptionValues AdamOptions::values() const {
  return {{"lr", lr}, {"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay}};
}

AdamOptions AdamOptions::from_values(const OptionValues& values, const std::string& who) {
  check_option_names(values, AdamOptions{}.values(), who);
  return {.lr = values.at("lr"),
          .beta1 = values.at("beta1"),
          .beta2 = values.at("beta2"),
          .eps = values.at("eps"),
          .weight_decay = values.at("weight_decay")};
}

namespace {

AdamOptions adam_options(const AdamWOptions& o) {
  return {.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
}

ParamGroup<AdamOptions> adam_group(const ParamGroup<AdamWOptions>& group) {
  ParamGroup<AdamOptions> out{.params = group.params};
  if (group.options) out.options = adam_options(*group.options);
  return out;
}

std::vector<ParamGroup<AdamOptions>> adam_groups(const std::vector<ParamGroup<AdamWOptions>>& groups) {
  std::vector<ParamGroup<AdamOptions>> out;
  for (const ParamGroup<AdamWOptions>& group : groups) out.push_back(adam_group(group));
  return out;
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam({{.params = std::move(params)}}, options) {}

Adam::Adam(const std::vector<ParamGroup<AdamOptions>>& groups, AdamOptions defaults)
    : Adam(groups, defaults, Decay::kL2) {}

Adam::Adam(const std::vector<ParamGroup<AdamOptions>>& groups, AdamOptions defaults, Decay decay)
    : OptimizerWithOptions(decay == Decay::kL2 ? "Adam" : "AdamW", groups, defaults), decay_(decay) {}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options) : AdamW({{.params = std::move(params)}}, options) {}

AdamW::AdamW(const std::vector<ParamGroup<AdamWOptions>>& groups, AdamWOptions defaults)
    : Adam(adam_groups(groups), adam_options(defaults), Decay::kDecoupled) {}

void AdamW::add_param_group(const ParamGroup<AdamWOptions>& group) { Adam::add_param_group(adam_group(group)); }

Adam::State Adam::state(size_t index) const {
  auto it = states_.find(index);
  return it != states_.end() ? it->second : State();
}

void Adam::save_param_state(size_t index, ParamState& out) const {
  const State s = state(index);
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

void Adam::update(const std::vector<ParamUpdate>& params) {
  kernels::AdamLists lists;
  std::vector<kernels::AdamScalars> scalars;
  std::vector<State> next;  // each parameter's state after this step, kept once the pass ran
  for (const ParamUpdate& u : params) {
    const AdamOptions& o = options(param_group_of(u.index));
    State s = state(u.index);
    if (s.step == 0) {
      s.exp_avg = zeros(u.master.shape(), DType::kFloat32, u.master.device());
      s.exp_avg_sq = zeros(u.master.shape(), DType::kFloat32, u.master.device());
    }
    s.step += 1;
    // Bias corrections in double, rounded once (as PyTorch does).
    const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(s.step));
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, static_cast<double>(s.step)));
    const float wd = static_cast<float>(o.weight_decay);
    scalars.push_back(
        {.step_size = static_cast<float>(o.lr / bias_correction1),
         .bc2_sqrt = static_cast<float>(bias_correction2_sqrt),
         .beta1 = static_cast<float>(o.beta1),
         .beta2 = static_cast<float>(o.beta2),
         .one_minus_beta1 = static_cast<float>(1.0 - o.beta1),
         .one_minus_beta2 = static_cast<float>(1.0 - o.beta2),
         .eps = static_cast<float>(o.eps),
         .l2 = decay_ == Decay::kL2 ? wd : 0.0f,
         .decoupled = decay_ == Decay::kDecoupled ? static_cast<float>(1.0 - o.lr * o.weight_decay) : 1.0f,
         .rounding_key = u.rounding_key});
    lists[kernels::kAdamWeight].push_back(u.master);
    lists[kernels::kAdamGrad].push_back(u.grad);
    lists[kernels::kAdamExpAvg].push_back(s.exp_avg);
    lists[kernels::kAdamExpAvgSq].push_back(s.exp_avg_sq);
    lists[kernels::kAdamRounded].push_back(u.rounded);
    next.push_back(s);
  }
  kernels::adam_update(params.front().master.device(), lists, scalars);
  for (size_t k = 0; k < params.size(); ++k) {
    next[k].exp_avg.bump_version();
    next[k].exp_avg_sq.bump_version();
    states_[params[k].index] = next[k];
  }
}

}  // namespace ampgrad::optim
