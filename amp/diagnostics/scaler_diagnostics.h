// What GradScaler records beside its recipe: parameter names, gradient statistics on a schedule,
// and the report of why a step was skipped (the rule is in skip_report.h's InfOrigin). The scaler
// holds one by pointer and hands it what its unscale pass saw; none of it changes what the scaler
// does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "amp/diagnostics/grad_counts.h"
#include "amp/diagnostics/grad_stats.h"
#include "amp/diagnostics/skip_report.h"
#include "framework/tensor.h"

namespace ampgrad::nn {
class Module;
}

namespace ampgrad::amp {

class ForwardWatch;

/// What one unscale_ pass over an optimizer's gradients saw: params[indices[k]] has gradient
/// grads[k], unscaled into outs[k]; counts (null unless statistics were due) has their counts.
struct UnscalePass {
  const std::vector<Tensor>& params;
  const std::vector<size_t>& indices;
  const std::vector<Tensor>& grads;
  const std::vector<Tensor>& outs;
  bool found_inf = false;
  const std::vector<GradCounts>* counts = nullptr;
  int64_t iteration = 0;  ///< the scaler's update() count
  double scale = 1.0;     ///< the loss scale the gradients carried
};

/// GradScaler's diagnostics (see GradScaler's methods of the same names for what each means).
class ScalerDiagnostics {
 public:
  ScalerDiagnostics();
  ~ScalerDiagnostics();
  ScalerDiagnostics(const ScalerDiagnostics&) = delete;
  ScalerDiagnostics& operator=(const ScalerDiagnostics&) = delete;

  /// Names for reports, matched to parameters by identity.
  void set_parameter_names(const std::vector<std::pair<std::string, Tensor>>& named);
  /// The name given to `param`, else "param<index>".
  std::string parameter_name(const Tensor& param, size_t index) const;

  /// Statistics every `every` iterations (0: never).
  void set_grad_stats_interval(int64_t every);
  /// Statistics in this iteration too.
  void request_grad_stats();
  /// Whether the unscale pass of `iteration` should measure.
  bool grad_stats_due(int64_t iteration) const;
  /// The latest statistics (nullptr before any).
  const GradStatsReport* grad_stats() const;
  /// The latest skip report (nullptr before any).
  const SkipReport* last_skip() const;

  /// Watches `model`'s module outputs for inf/NaN (see ForwardWatch).
  void watch_forward(nn::Module& model);
  /// Removes the watch.
  void unwatch_forward();

  /// Remembers a loss given to scale() and its scaled value, looked at only if the step is skipped.
  void record_loss(const Tensor& loss, const Tensor& scaled);
  /// Files the pass's statistics (when measured) and, on inf/NaN, the skip report.
  void diagnose(const UnscalePass& pass);
  /// Drops the iteration's losses, forgets a one-off request and rearms the forward watch.
  void end_iteration();

 private:
  InfOrigin find_origin(std::string& module) const;

  std::unordered_map<const TensorImpl*, std::pair<Tensor, std::string>> names_;  // the handle keeps the key alive
  int64_t stats_every_ = 0;
  bool stats_requested_ = false;
  std::optional<GradStatsReport> stats_;
  std::optional<SkipReport> skip_;
  std::vector<std::pair<Tensor, Tensor>> losses_;  // this iteration's (loss, scaled loss), detached
  // This iteration's parameters in the order the backwards from its scaled losses first write
  // them (autograd's leaves_in_backward_order, numbered on across losses). Keys are not owned:
  // only looked up with parameters the optimizer holds.
  std::unordered_map<const TensorImpl*, uint64_t> backward_order_;
  uint64_t writes_ = 0;
  std::unique_ptr<ForwardWatch> watch_;
};

}  // namespace ampgrad::amp
