// Adam and AdamW (PyTorch's update rules, defaults and bias correction), FP32 state.
#pragma once

#include <map>

#include "optim/optimizer.h"

namespace ampgrad::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;

  void validate(const std::string& who) const;
  OptionValues values() const;
  static AdamOptions from_values(const OptionValues& values, const std::string& who);
};

/// AdamW's options: the same fields, with PyTorch's AdamW default weight decay.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// Per parameter, at step t:
///   g = grad (+ wd * w for Adam; AdamW instead decays w *= 1 - lr * wd)
///   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
///   w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
class Adam : public OptimizerWithOptions<AdamOptions> {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  /// Parameter groups, each with its own options or `defaults`.
  explicit Adam(const std::vector<ParamGroup<AdamOptions>>& groups, AdamOptions defaults = {});

  struct State {
    int64_t step = 0;
    Tensor exp_avg;     // m, FP32
    Tensor exp_avg_sq;  // v, FP32
  };
  /// Parameter `index`'s state (step 0 and no moments before its first step).
  State state(size_t index) const;
  using Optimizer::state;

 protected:
  enum class Decay : bool { kL2, kDecoupled };  // Adam adds wd*w to the gradient; AdamW decays w
  Adam(const std::vector<ParamGroup<AdamOptions>>& groups, AdamOptions defaults, Decay decay);
  void update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) override;
  void save_param_state(size_t index, ParamState& out) const override;
  void load_param_state(size_t index, const ParamState& in) override;

 private:
  Decay decay_;
  std::map<size_t, State> states_;  // by parameter index; a map, as groups can be added later
};

/// Adam with decoupled weight decay. Its options() are AdamOptions with AdamW's values.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  explicit AdamW(const std::vector<ParamGroup<AdamWOptions>>& groups, AdamWOptions defaults = {});
  /// As Adam's, with AdamW's options (a group without options takes the defaults).
  void add_param_group(const ParamGroup<AdamWOptions>& group);
};

}  // namespace ampgrad::optim
