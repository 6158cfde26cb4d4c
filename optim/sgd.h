// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (PyTorch's rule).
#pragma once

#include <map>

#include "optim/optimizer.h"

namespace ampgrad::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;

  void validate(const std::string& who) const;
  OptionValues values() const;
  static SGDOptions from_values(const OptionValues& values, const std::string& who);
};

/// g = grad + wd * w;  buf = g on the first step, then momentum * buf + (1 - dampening) * g;
/// g = nesterov ? g + momentum * buf : buf (when momentum != 0);  w -= lr * g.
class SGD : public OptimizerWithOptions<SGDOptions> {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  /// Parameter groups, each with its own options or `defaults`.
  explicit SGD(const std::vector<ParamGroup<SGDOptions>>& groups, SGDOptions defaults = {});
  /// Momentum buffer of parameter `index` (FP32; undefined before its first step).
  Tensor momentum_buffer(size_t index) const;

 protected:
  void update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) override;
  void save_param_state(size_t index, ParamState& out) const override;
  void load_param_state(size_t index, const ParamState& in) override;

 private:
  std::map<size_t, Tensor> buffers_;  // by parameter index; a map, as groups can be added later
};

}  // namespace ampgrad::optim
