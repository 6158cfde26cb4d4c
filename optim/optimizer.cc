// Optimizer base: parameter groups, master weights, the step skeleton and state export shared by SGD and Adam.
#include "optim/optimizer.h"

#include <array>
#include <cmath>

#include "framework/copy.h"
#include "framework/counter_random.h"
#include "framework/error.h"
#include "framework/random.h"

namespace ampgrad::optim {

void check_lr(double lr, const std::string& who) {
  AG_CHECK(lr >= 0 && std::isfinite(lr), who, ": learning rate must be finite and >= 0, got ", lr);
}

void check_option_names(const OptionValues& values, const OptionValues& expected, const std::string& who) {
  for (const auto& [key, value] : expected) {
    AG_CHECK(values.count(key), who, ": the saved options have no '", key, "'; hint: was the state saved by ", who,
             "?");
  }
  for (const auto& [key, value] : values) {
    AG_CHECK(expected.count(key), who, ": unknown option '", key, "' in the saved options");
  }
}

void Optimizer::add_params(const std::vector<Tensor>& params) {
  // Check the whole group first, so a refused group leaves the optimizer as it was.
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const size_t index = params_.size() + i;
    AG_CHECK(p.defined(), name_, ": parameter ", index, " is undefined");
    AG_CHECK(p.is_leaf(), name_, ": parameter ", index, " (", p.to_string(), ") was produced by an op; ",
             "hint: optimize leaves (model.parameters()), or detach() it and set_requires_grad(true)");
    AG_CHECK(p.dtype() == DType::kFloat32 || is_low_precision(p.dtype()), name_, ": parameter ", index, " is ",
             p.to_string(), "; optimizers update float32 and lower-precision parameters (the latter through an ",
             "FP32 master copy)");
    // A parameter listed twice would be updated twice per step. model.parameters() lists each
    // once (tied ones too); PyTorch warns within a group and raises across groups.
    for (size_t j = 0; j < index; ++j) {
      const Tensor& other = j < params_.size() ? params_[j] : params[j - params_.size()];
      AG_CHECK(!other.is_same(p), name_, ": parameter ", index, " is the same tensor as parameter ", j,
               "; hint: list each parameter once, in one group (model.parameters() does)");
    }
  }
  group_begin_.push_back(params_.size());
  for (const Tensor& p : params) {
    params_.push_back(p);
    synced_storage_.emplace_back();
    synced_version_.push_back(0);
    rounding_steps_.push_back(0);
    // The FP32 master of a lower-precision parameter, where masters are kept.
    if (master_weights_ == MasterWeights::kFp32) master_of(params_.size() - 1);
  }
}

void Optimizer::set_master_weights(MasterWeights mode) {
  if (mode == MasterWeights::kStochasticRounding && !rounding_seed_given_) set_rounding_seed(random::next_u64());
  master_weights_ = mode;
  if (mode != MasterWeights::kFp32) {
    for (Tensor& p : params_) {
      if (p.dtype() != DType::kFloat32) p.set_master(Tensor());
    }
  }
}

size_t Optimizer::param_group_of(size_t index) const {
  AG_CHECK(index < params_.size(), name_, ": no parameter ", index, " (the optimizer has ", params_.size(), ")");
  size_t group = group_begin_.size() - 1;
  while (group_begin_[group] > index) --group;  // groups are few; a scan is enough
  return group;
}

std::vector<Tensor> Optimizer::group_parameters(size_t group) const {
  AG_CHECK(group < group_begin_.size(), name_, ": no parameter group ", group, " (the optimizer has ",
           group_begin_.size(), ")");
  const size_t end = group + 1 < group_begin_.size() ? group_begin_[group + 1] : params_.size();
  return {params_.begin() + static_cast<std::ptrdiff_t>(group_begin_[group]),
          params_.begin() + static_cast<std::ptrdiff_t>(end)};
}

double Optimizer::lr(size_t group) const { return group_lr(group); }

void Optimizer::set_lr(double lr) {
  check_lr(lr, name_);  // before any group changes
  for (size_t g = 0; g < num_param_groups(); ++g) set_group_lr(g, lr);
}

void Optimizer::set_lr(size_t group, double lr) { set_group_lr(group, lr); }

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
  const bool in_sync = master_weights_ == MasterWeights::kFp32 && master.defined() &&
                       synced_storage_[index].defined() && synced_storage_[index].data_ptr() == p.data_ptr() &&
                       synced_version_[index] == p.version();
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
  master_of(index);  // remade first if stale; an unscaled gradient on it stays valid
  const Tensor grad = p.step_grad();
  return grad.defined() ? grad.detach().to(DType::kFloat32) : grad;
}

size_t Optimizer::register_step_pre_hook(StepHook hook) {
  AG_CHECK(hook, name_, "::register_step_pre_hook: the hook is empty");
  pre_step_hooks_.emplace(next_hook_handle_, std::move(hook));
  return next_hook_handle_++;
}

size_t Optimizer::register_step_post_hook(StepHook hook) {
  AG_CHECK(hook, name_, "::register_step_post_hook: the hook is empty");
  post_step_hooks_.emplace(next_hook_handle_, std::move(hook));
  return next_hook_handle_++;
}

void Optimizer::remove_step_hook(size_t handle) {
  pre_step_hooks_.erase(handle);
  post_step_hooks_.erase(handle);
}

void Optimizer::step() {
  for (auto& [handle, hook] : pre_step_hooks_) hook(*this);
  // Every parameter with a gradient, one update pass per device. Under kNone each 16-bit
  // parameter with a gradient is its own pass, so the FP32 masters this step makes for them are
  // dropped one at a time; stochastic rounding makes none.
  std::array<std::vector<ParamUpdate>, kNumDevices> passes;
  const auto run = [&](std::vector<ParamUpdate>& pass) {
    if (pass.empty()) return;
    update(pass);
    for (const ParamUpdate& u : pass) {
      Tensor& p = params_[u.index];
      p.bump_version();
      if (u.master.is_same(p) && p.dtype() != DType::kFloat32) {  // rounded stochastically
        p.set_master(Tensor());  // GradScaler's step-only master, if it made one
        ++rounding_steps_[u.index];
        continue;
      }
      if (!u.rounded.defined()) continue;
      if (master_weights_ == MasterWeights::kNone) {
        p.set_master(Tensor());  // not kept: the next step starts from the rounded parameter
      } else {
        Tensor master = u.master;
        master.bump_version();
        master.set_grad(Tensor());  // consumed: the next step derives it afresh
        mark_in_sync(u.index);
      }
    }
    pass.clear();
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (master_weights_ == MasterWeights::kStochasticRounding && p.dtype() != DType::kFloat32) {
      // Updated in place: the pass widens the 16-bit weights and rounds them back stochastically.
      Tensor grad = p.step_grad();  // GradScaler's unscaled FP32 one (on a step-only master), or p's own
      if (!grad.defined()) {
        p.set_master(Tensor());  // a step-only master that master_of() or fp32_grad() made is not kept
        continue;
      }
      const uint64_t key = counter_random_bits(counter_random_bits(rounding_seed_, i),
                                               static_cast<uint64_t>(rounding_steps_[i]));
      passes[device_index(p.device())].push_back({.index = i, .master = p, .grad = grad, .rounded = Tensor(), .rounding_key = key});
      continue;
    }
    Tensor master = master_of(i);  // remade first if stale; an unscaled gradient on it stays valid
    // The unscaled FP32 gradient, or the parameter's own: a 16-bit one is widened as the pass
    // reads it, so no FP32 copy is made.
    Tensor grad = p.step_grad();
    if (!grad.defined()) {
      if (master_weights_ == MasterWeights::kNone) p.set_master(Tensor());  // step-only, as below
      continue;
    }
    const bool has_master = !master.is_same(p);
    std::vector<ParamUpdate>& pass = passes[device_index(p.device())];
    pass.push_back({.index = i, .master = master, .grad = grad, .rounded = has_master ? p : Tensor()});
    if (has_master && master_weights_ == MasterWeights::kNone) run(pass);
  }
  for (std::vector<ParamUpdate>& pass : passes) run(pass);
  ++steps_taken_;
  for (auto& [handle, hook] : post_step_hooks_) hook(*this);
}

std::vector<ParamState> Optimizer::state() const {
  std::vector<ParamState> out(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].dtype() != DType::kFloat32 && params_[i].master().defined()) {
      out[i].tensors["master"] = params_[i].master();
    }
    if (rounding_steps_[i] > 0 || (master_weights_ == MasterWeights::kStochasticRounding &&
                                   params_[i].dtype() != DType::kFloat32)) {
      out[i].counters["rounding_seed"] = static_cast<int64_t>(rounding_seed_);  // the bits, as int64
      out[i].counters["rounding_step"] = rounding_steps_[i];
    }
    save_param_state(i, out[i]);
  }
  return out;
}

Tensor Optimizer::loaded_tensor(size_t index, const ParamState& in, const std::string& key) const {
  auto it = in.tensors.find(key);
  AG_CHECK(it != in.tensors.end(), name_, "::load_state: parameter ", index, " has no '", key, "' state");
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
  // Stochastic rounding's seed and counts, checked before anything changes.
  std::optional<int64_t> seed;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& counters = state[i].counters;
    const auto saved_seed = counters.find("rounding_seed"), step = counters.find("rounding_step");
    AG_CHECK((saved_seed == counters.end()) == (step == counters.end()) &&
                 (step == counters.end() || step->second >= 0),
             name(), "::load_state: parameter ", i, " has a malformed stochastic rounding state");
    if (saved_seed == counters.end()) continue;
    AG_CHECK(!seed || *seed == saved_seed->second, name(), "::load_state: parameter ", i,
             " has another stochastic rounding seed than the parameters before it");
    seed = saved_seed->second;
  }
  if (seed) {  // else (a state saved without stochastic rounding) the counts go on from where they are
    set_rounding_seed(static_cast<uint64_t>(*seed));
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto step = state[i].counters.find("rounding_step");
      rounding_steps_[i] = step == state[i].counters.end() ? 0 : step->second;
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (p.dtype() != DType::kFloat32 && master_weights_ == MasterWeights::kFp32 && state[i].tensors.count("master")) {
      p.set_master(loaded_tensor(i, state[i], "master"));
      mark_in_sync(i);  // keep the exact FP32 master: p holds its rounding
    }
    load_param_state(i, state[i]);
  }
}

std::vector<GroupState> Optimizer::param_group_state() const {
  std::vector<GroupState> out;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    out.push_back({.num_params = group_parameters(g).size(), .options = group_option_values(g)});
  }
  return out;
}

void Optimizer::load_param_group_state(const std::vector<GroupState>& groups) {
  AG_CHECK(groups.size() == num_param_groups(), name_, "::load_param_group_state: the state has ", groups.size(),
           " parameter groups but this optimizer has ", num_param_groups(),
           "; hint: build the optimizer with the same groups (add_param_group before loading)");
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t n = group_parameters(g).size();
    AG_CHECK(groups[g].num_params == n, name_, "::load_param_group_state: group ", g, " of the state has ",
             groups[g].num_params, " parameters but this optimizer's has ", n);
    check_option_values(groups[g].options);
  }
  for (size_t g = 0; g < groups.size(); ++g) set_group_option_values(g, groups[g].options);
}

}  // namespace ampgrad::optim
