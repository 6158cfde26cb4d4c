// Adam and AdamW (PyTorch's update rules, defaults and bias correction), FP32 state.
#pragma once

#include "optim/optimizer.h"

namespace ampgrad::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
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
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  std::string name() const override { return decay_ == Decay::kL2 ? "Adam" : "AdamW"; }
  const AdamOptions& options() const { return options_; }

  struct State {
    int64_t step = 0;
    Tensor exp_avg;     // m, FP32
    Tensor exp_avg_sq;  // v, FP32
  };
  const State& state(size_t index) const { return states_.at(index); }

 protected:
  enum class Decay : bool { kL2, kDecoupled };  // Adam adds wd*w to the gradient; AdamW decays w
  Adam(std::vector<Tensor> params, AdamOptions options, Decay decay);
  void update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) override;
  void save_param_state(size_t index, ParamState& out) const override;
  void load_param_state(size_t index, const ParamState& in) override;

 private:
  AdamOptions options_;
  Decay decay_;
  std::vector<State> states_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
};

}  // namespace ampgrad::optim
