// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (PyTorch's rule).
#pragma once

#include "optim/optimizer.h"

namespace ampgrad::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// g = grad + wd * w;  buf = g on the first step, then momentum * buf + (1 - dampening) * g;
/// g = nesterov ? g + momentum * buf : buf (when momentum != 0);  w -= lr * g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  std::string name() const override { return "SGD"; }
  const SGDOptions& options() const { return options_; }
  /// Momentum buffer of parameter `index` (FP32; undefined before its first step).
  const Tensor& momentum_buffer(size_t index) const { return buffers_.at(index); }

 protected:
  void update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) override;
  void save_param_state(size_t index, ParamState& out) const override;
  void load_param_state(size_t index, const ParamState& in) override;

 private:
  SGDOptions options_;
  std::vector<Tensor> buffers_;
};

}  // namespace ampgrad::optim
