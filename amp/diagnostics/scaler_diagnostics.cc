// GradScaler's diagnostics: parameter names, gradient statistics on a schedule, and the report of
// why a step was skipped (the rule is in skip_report.h's InfOrigin).
#include "amp/diagnostics/scaler_diagnostics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "amp/diagnostics/forward_watch.h"
#include "amp/unscale.h"
#include "framework/autograd.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad::amp {

ScalerDiagnostics::ScalerDiagnostics() = default;
ScalerDiagnostics::~ScalerDiagnostics() = default;

void ScalerDiagnostics::set_parameter_names(const std::vector<std::pair<std::string, Tensor>>& named) {
  for (const auto& [name, tensor] : named) {
    AG_CHECK(tensor.defined(), "GradScaler::set_parameter_names: '", name, "' is an undefined tensor");
    names_[tensor.impl()] = {tensor, name};
  }
}

std::string ScalerDiagnostics::parameter_name(const Tensor& param, size_t index) const {
  const auto it = names_.find(param.impl());
  return it != names_.end() ? it->second.second : "param" + std::to_string(index);
}

void ScalerDiagnostics::set_grad_stats_interval(int64_t every) {
  AG_CHECK(every >= 0, "GradScaler::set_grad_stats_interval: every must be >= 0 (0 turns statistics off), got ",
           every);
  stats_every_ = every;
}

void ScalerDiagnostics::request_grad_stats() { stats_requested_ = true; }

bool ScalerDiagnostics::grad_stats_due(int64_t iteration) const {
  return stats_requested_ || (stats_every_ > 0 && iteration % stats_every_ == 0);
}

const GradStatsReport* ScalerDiagnostics::grad_stats() const { return stats_ ? &*stats_ : nullptr; }

const SkipReport* ScalerDiagnostics::last_skip() const { return skip_ ? &*skip_ : nullptr; }

void ScalerDiagnostics::watch_forward(nn::Module& model) { watch_ = std::make_unique<ForwardWatch>(model); }

void ScalerDiagnostics::unwatch_forward() { watch_.reset(); }

void ScalerDiagnostics::record_loss(const Tensor& loss, const Tensor& scaled) {
  losses_.emplace_back(loss.detach(), scaled.detach());
  // Read now, while the graph is certainly alive; a later loss's backward writes after this one's.
  for (const TensorImpl* leaf : leaves_in_backward_order(scaled)) backward_order_[leaf] = ++writes_;
}

void ScalerDiagnostics::end_iteration() {
  losses_.clear();
  backward_order_.clear();
  writes_ = 0;
  stats_requested_ = false;
  if (watch_) watch_->reset();
}

InfOrigin ScalerDiagnostics::find_origin(std::string& module) const {
  if (watch_ && watch_->first_nonfinite()) {
    module = *watch_->first_nonfinite();
    return InfOrigin::kForwardActivation;
  }
  for (const auto& [loss, scaled] : losses_) {
    if (any_nonfinite(loss)) return InfOrigin::kForwardLoss;
  }
  for (const auto& [loss, scaled] : losses_) {
    if (any_nonfinite(scaled)) return InfOrigin::kScaledLoss;
  }
  return InfOrigin::kBackward;
}

void ScalerDiagnostics::diagnose(const UnscalePass& pass) {
  if (pass.counts != nullptr) {
    // A new report for the first optimizer measured in this iteration; later ones add to it.
    if (!stats_ || stats_->iteration != pass.iteration) {
      stats_ = GradStatsReport{.iteration = pass.iteration, .scale = pass.scale};
    }
    for (size_t k = 0; k < pass.grads.size(); ++k) {
      const size_t index = pass.indices[k];
      stats_->params.push_back(make_param_stats(parameter_name(pass.params[index], index), pass.grads[k].dtype(),
                                                pass.grads[k].numel(), pass.scale, (*pass.counts)[k],
                                                low_precision_dtypes()));
    }
  }
  if (!pass.found_inf) return;
  if (!skip_ || skip_->iteration != pass.iteration) {
    SkipReport report{.iteration = pass.iteration, .scale = pass.scale};
    report.origin = find_origin(report.module);
    const Tensor& loss = losses_.empty() ? Tensor() : losses_.front().first;
    report.loss = loss.defined() && loss.numel() == 1 ? loss.item() : std::numeric_limits<double>::quiet_NaN();
    skip_ = std::move(report);
  }
  // The unscaled values are what the inf/NaN check looked at (an FP32 gradient was unscaled in
  // place): count theirs, per gradient.
  std::vector<GradCounts> bad;
  measure_all(pass.outs, 1.0, FormatTable{}, bad);
  for (size_t k = 0; k < pass.outs.size(); ++k) {
    const GradCounts& c = bad[k];
    if (c.infs + c.nans == 0) continue;
    const size_t index = pass.indices[k];
    const Tensor& p = pass.params[index];
    const auto order = backward_order_.find(p.impl());
    skip_->grads.push_back({.name = parameter_name(p, index),
                            .infs = c.infs,
                            .nans = c.nans,
                            .numel = pass.outs[k].numel(),
                            .backward_order = order != backward_order_.end() ? order->second : 0});
  }
  // The FP8 casts of this optimizer's parameters that met an inf/NaN or clamped values.
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t index : pass.indices) {
    if (pass.params[index].impl()->float8 != nullptr) {
      named.emplace_back(parameter_name(pass.params[index], index), pass.params[index]);
    }
  }
  for (Float8TensorStats& s : float8_stats(named)) {
    if (!std::isfinite(s.amax) || s.saturated > 0) skip_->float8.push_back(std::move(s));
  }
  // Unknown order (0) last, in the optimizer's order.
  const auto key = [](const NonfiniteGrad& g) {
    return g.backward_order != 0 ? g.backward_order : std::numeric_limits<uint64_t>::max();
  };
  std::stable_sort(skip_->grads.begin(), skip_->grads.end(),
                   [&](const NonfiniteGrad& a, const NonfiniteGrad& b) { return key(a) < key(b); });
}

}  // namespace ampgrad::amp
