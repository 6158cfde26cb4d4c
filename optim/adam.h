// Adam and AdamW (PyTorch's update rules, defaults and bias correction), FP32 state.
#pragma once

#include <map>

#include "optim/optimizer.h"

namespace ampgrad::optim {

/// Adam's options, PyTorch's arguments of torch.optim.Adam.
struct AdamOptions {
  double lr = 1e-3;  ///< the learning rate
  double beta1 = 0.9;  ///< decay of the first moment m
  double beta2 = 0.999;  ///< decay of the second moment v
  double eps = 1e-8;  ///< added to the denominator sqrt(v) / sqrt(1 - b2^t), against dividing by 0
  double weight_decay = 0.0;  ///< L2 penalty: wd * w is added to the gradient (AdamW decouples it instead)

  /// Throws unless every option is in range (lr, eps, wd >= 0; betas in [0, 1)); `who` names the optimizer.
  void validate(const std::string& who) const;
  /// The options by name, as checkpoints store them.
  OptionValues values() const;
  /// The options from values(), validated.
  static AdamOptions from_values(const OptionValues& values, const std::string& who);
};

/// AdamW's options: the same fields, with PyTorch's AdamW default weight decay.
struct AdamWOptions {
  double lr = 1e-3;  ///< the learning rate
  double beta1 = 0.9;  ///< decay of the first moment m
  double beta2 = 0.999;  ///< decay of the second moment v
  double eps = 1e-8;  ///< added to sqrt(v) / sqrt(1 - b2^t)
  double weight_decay = 1e-2;  ///< decoupled decay: w *= 1 - lr * wd before the update
};

/// Per parameter, at step t:
///   g = grad (+ wd * w for Adam; AdamW instead decays w *= 1 - lr * wd)
///   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
///   w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
class Adam : public OptimizerWithOptions<AdamOptions> {
 public:
  using Options = AdamOptions;  ///< what its constructors take (for generic code)
  /// One group of `params` with `options`.
  Adam(std::vector<Tensor> params, AdamOptions options);
  /// Parameter groups, each with its own options or `defaults`.
  explicit Adam(const std::vector<ParamGroup<AdamOptions>>& groups, AdamOptions defaults = {});

  /// One parameter's Adam state.
  struct State {
    int64_t step = 0;  ///< steps taken for this parameter (t of the bias correction)
    Tensor exp_avg;     ///< m, FP32
    Tensor exp_avg_sq;  ///< v, FP32
  };
  /// Parameter `index`'s state (step 0 and no moments before its first step).
  State state(size_t index) const;
  using Optimizer::state;

 protected:
  /// How weight decay acts: Adam adds wd * w to the gradient (kL2); AdamW decays w (kDecoupled).
  enum class Decay : bool { kL2, kDecoupled };
  /// Adam (kL2) or AdamW (kDecoupled) over the groups.
  Adam(const std::vector<ParamGroup<AdamOptions>>& groups, AdamOptions defaults, Decay decay);
  void update(const std::vector<ParamUpdate>& params) override;
  void save_param_state(size_t index, ParamState& out) const override;
  /// Restores a save_param_state() of the same parameter.
  void load_param_state(size_t index, const ParamState& in) override;

 private:
  Decay decay_;
  std::map<size_t, State> states_;  // by parameter index; a map, as groups can be added later
};

/// Adam with decoupled weight decay. Its options() are AdamOptions with AdamW's values.
class AdamW : public Adam {
 public:
  using Options = AdamWOptions;  ///< what its constructors take (for generic code)
  /// One group of `params` with `options`.
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  /// Parameter groups, each with its own options or `defaults`.
  explicit AdamW(const std::vector<ParamGroup<AdamWOptions>>& groups, AdamWOptions defaults = {});
  /// As Adam's, with AdamW's options (a group without options takes the defaults).
  void add_param_group(const ParamGroup<AdamWOptions>& group);
};

}  // namespace ampgrad::optim
