// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (PyTorch's rule).
#pragma once

#include <map>

#include "optim/optimizer.h"

namespace ampgrad::optim {

/// SGD's options, PyTorch's arguments of torch.optim.SGD.
struct SGDOptions {
  double lr = 1e-3;  ///< the learning rate
  double momentum = 0.0;  ///< momentum factor (0: plain SGD, no buffer)
  double dampening = 0.0;  ///< the momentum buffer takes (1 - dampening) of each new gradient
  double weight_decay = 0.0;  ///< L2 penalty: wd * w is added to the gradient
  bool nesterov = false;  ///< Nesterov momentum (needs momentum > 0 and dampening 0)

  /// Throws unless every option is valid (see the fields); `who` names the optimizer.
  void validate(const std::string& who) const;
  /// The options by name, as checkpoints store them.
  OptionValues values() const;
  /// The options from values(), validated.
  static SGDOptions from_values(const OptionValues& values, const std::string& who);
};

/// g = grad + wd * w;  buf = g on the first step, then momentum * buf + (1 - dampening) * g;
/// g = nesterov ? g + momentum * buf : buf (when momentum != 0);  w -= lr * g.
class SGD : public OptimizerWithOptions<SGDOptions> {
 public:
  using Options = SGDOptions;  ///< what its constructors take (for generic code)
  /// One group of `params` with `options`.
  SGD(std::vector<Tensor> params, SGDOptions options);
  /// Parameter groups, each with its own options or `defaults`.
  explicit SGD(const std::vector<ParamGroup<SGDOptions>>& groups, SGDOptions defaults = {});
  /// Momentum buffer of parameter `index` (FP32; undefined before its first step).
  Tensor momentum_buffer(size_t index) const;

 protected:
  void update(const std::vector<ParamUpdate>& params) override;
  void save_param_state(size_t index, ParamState& out) const override;
  /// Restores a save_param_state() of the same parameter.
  void load_param_state(size_t index, const ParamState& in) override;

 private:
  std::map<size_t, Tensor> buffers_;  // by parameter index; a map, as groups can be added later
};

}  // namespace ampgrad::optim
