// Optimizer base: parameters, FP32 master weights for lower-precision parameters, zero_grad, the
// step skeleton and state export for checkpoints. Subclasses implement the update rule on FP32.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "framework/tensor.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim {

/// One parameter's optimizer state, by name: FP32 tensors ("master", "momentum_buffer",
/// "exp_avg", ...) and integer counters ("step").
struct ParamState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, int64_t> counters;
};

class Optimizer {
 public:
  /// Any lower-precision parameter gets an FP32 master copy (param.master()): the step updates the
  /// master in FP32 and writes the rounded value back into the parameter.
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// "SGD", "Adam", "AdamW": recorded in checkpoints so a state is never loaded into another kind.
  virtual std::string name() const = 0;

  /// Sets every gradient to none (as PyTorch 2 does), including the masters' FP32 gradients.
  void zero_grad();
  /// One update of every parameter that has a gradient, from its FP32 gradient.
  void step();

  const std::vector<Tensor>& parameters() const { return params_; }
  /// The FP32 tensor the update writes: the parameter itself if float32, else its master copy,
  /// first remade from the parameter if the parameter changed outside the optimizer (a
  /// model.to(), a checkpoint load or a manual write), so the master is never stale.
  Tensor master_of(size_t index);
  /// The FP32 gradient the next step would use for parameter `index` (undefined if none):
  /// the master's gradient when GradScaler::unscale_ wrote one, else the parameter's gradient
  /// (converted to FP32 when the parameter is lower precision).
  Tensor fp32_grad(size_t index);

  double lr() const { return lr_; }
  void set_lr(double lr);

  /// Every parameter's state, for checkpoints (the tensors are the live ones: copy to keep).
  std::vector<ParamState> state() const;
  /// Restores a state() taken from an optimizer of the same kind over parameters of the same
  /// shapes. Load the parameters' values first: the masters loaded here are then kept as they
  /// are (bit-exact), not remade from the rounded parameters.
  void load_state(const std::vector<ParamState>& state);

 protected:
  /// The update rule for parameter `index`: `master` (FP32) -= f(grad, state), writing the
  /// rounded parameter into `copy` in the same pass (see optim/update_kernels.h).
  virtual void update(size_t index, Tensor& master, const Tensor& grad, kernels::RoundedCopy copy) = 0;
  /// Subclass state of parameter `index` (momentum, moments, step counts) for state()/load_state().
  virtual void save_param_state(size_t index, ParamState& out) const = 0;
  virtual void load_param_state(size_t index, const ParamState& in) = 0;
  /// Copies a loaded state tensor for parameter `index`, checking it is FP32 with the
  /// parameter's shape, onto the parameter's device.
  Tensor loaded_tensor(size_t index, const ParamState& in, const std::string& key) const;

  double lr_ = 0.0;

 private:
  // Records that the master of parameter `index` matches the parameter's current contents.
  void mark_in_sync(size_t index);

  std::vector<Tensor> params_;
  // What each parameter looked like when its master was last in sync with it: an alias of its
  // storage (held, so the address cannot be reused) and that storage's version.
  std::vector<Tensor> synced_storage_;
  std::vector<uint64_t> synced_version_;
};

}  // namespace ampgrad::optim
