// Optimizer base: parameters, FP32 master weights for lower-precision parameters, zero_grad and
// the step skeleton. Subclasses implement the update rule on FP32 buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "framework/tensor.h"

namespace ampgrad::optim {

class Optimizer {
 public:
  /// Any parameter that is not float32 gets an FP32 master copy (param.master()): the step
  /// updates the master in FP32 and writes the rounded value back into the parameter.
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Sets every gradient to none (as PyTorch 2 does), including the masters' FP32 gradients.
  void zero_grad();
  /// One update of every parameter that has a gradient, from its FP32 gradient.
  void step();

  const std::vector<Tensor>& parameters() const { return params_; }
  /// The FP32 tensor the update writes: the master copy, or the parameter itself if float32.
  Tensor master_of(size_t index) const;
  /// The FP32 gradient the next step would use for parameter `index` (undefined if none):
  /// the master's gradient when GradScaler::unscale_ wrote one, else the parameter's gradient
  /// (converted to FP32 when the parameter is lower precision).
  Tensor fp32_grad(size_t index) const;

  double lr() const { return lr_; }
  void set_lr(double lr);

 protected:
  /// The update rule for parameter `index`: `master` (FP32) -= f(grad, state).
  virtual void update(size_t index, Tensor& master, const Tensor& grad) = 0;
  /// For update(): the lower-precision parameter `index` when a fused kernel should write its
  /// rounded copy in the same pass (else undefined), and the call that says it was written, so
  /// step() skips its own copy. Used by the CUDA SGD/Adam kernels.
  Tensor fused_param_copy(size_t index) const;
  void mark_param_written() { param_written_ = true; }
  double lr_ = 0.0;

 private:
  std::vector<Tensor> params_;
  std::vector<uint64_t> written_versions_;  // parameter version after our last write-back
  bool param_written_ = false;               // set by update() through mark_param_written()
};

}  // namespace ampgrad::optim
