// GradScaler's diagnostics: parameter names, gradient statistics on a schedule, and the report
// of why a step was skipped (the rule is in skip_report.h's InfOrigin).
#include <algorithm>
#include <cmath>
#include <limits>

#include "amp/forward_watch.h"
#include "amp/grad_scaler.h"
#include "amp/unscale.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad::amp {

void GradScaler::set_parameter_names(const std::vector<std::pair<std::string, Tensor>>& named) {
  for (const auto& [name, tensor] : named) {
    AG_CHECK(tensor.defined(), "GradScaler::set_parameter_names: '", name, "' is an undefined tensor");
    diag_.names[tensor.impl()] = {tensor, name};
  }
}

void GradScaler::set_grad_stats_interval(int64_t every) {
  AG_CHECK(every >= 0, "GradScaler::set_grad_stats_interval: every must be >= 0 (0 turns statistics off), got ",
           every);
  diag_.stats_every = every;
}

void GradScaler::request_grad_stats() { diag_.stats_requested = true; }

const GradStatsReport* GradScaler::grad_stats() const { return diag_.stats ? &*diag_.stats : nullptr; }

const SkipReport* GradScaler::last_skip() const { return diag_.skip ? &*diag_.skip : nullptr; }

void GradScaler::watch_forward(nn::Module& model) { diag_.watch = std::make_shared<ForwardWatch>(model); }

void GradScaler::unwatch_forward() { diag_.watch.reset(); }

bool GradScaler::grad_stats_due() const {
  return diag_.stats_requested || (diag_.stats_every > 0 && iteration_ % diag_.stats_every == 0);
}

std::string GradScaler::parameter_name(const Tensor& param, size_t index) const {
  const auto it = diag_.names.find(param.impl());
  return it != diag_.names.end() ? it->second.second : "param" + std::to_string(index);
}

void GradScaler::end_diagnostics_iteration() {
  diag_.losses.clear();
  diag_.stats_requested = false;
  if (diag_.watch) diag_.watch->reset();
}

InfOrigin GradScaler::find_origin(std::string& module) const {
  if (diag_.watch && diag_.watch->first_nonfinite()) {
    module = *diag_.watch->first_nonfinite();
    return InfOrigin::kForwardActivation;
  }
  for (const auto& [loss, scaled] : diag_.losses) {
    if (any_nonfinite(loss)) return InfOrigin::kForwardLoss;
  }
  for (const auto& [loss, scaled] : diag_.losses) {
    if (any_nonfinite(scaled)) return InfOrigin::kScaledLoss;
  }
  return InfOrigin::kBackward;
}

void GradScaler::diagnose(const std::vector<Tensor>& params, const std::vector<size_t>& indices,
                          const std::vector<Tensor>& grads, const std::vector<Tensor>& outs, bool found_inf,
                          const std::vector<GradCounts>* counts) {
  if (counts != nullptr) {
    // A new report for the first optimizer measured in this iteration; later ones add to it.
    if (!diag_.stats || diag_.stats->iteration != iteration_) {
      diag_.stats = GradStatsReport{.iteration = iteration_, .scale = scale_};
    }
    for (size_t k = 0; k < grads.size(); ++k) {
      diag_.stats->params.push_back(make_param_stats(parameter_name(params[indices[k]], indices[k]), grads[k].dtype(),
                                                     grads[k].numel(), scale_, (*counts)[k], low_precision_dtypes()));
    }
  }
  if (!found_inf) return;
  if (!diag_.skip || diag_.skip->iteration != iteration_) {
    SkipReport report{.iteration = iteration_, .scale = scale_};
    report.origin = find_origin(report.module);
    const Tensor& loss = diag_.losses.empty() ? Tensor() : diag_.losses.front().first;
    report.loss = loss.defined() && loss.numel() == 1 ? loss.item() : std::numeric_limits<double>::quiet_NaN();
    diag_.skip = std::move(report);
  }
  // The unscaled values are what the inf/NaN check looked at (an FP32 gradient was unscaled in
  // place): count theirs, per gradient.
  std::vector<GradCounts> bad;
  measure_all(outs, 1.0, FormatTable{}, bad);
  for (size_t k = 0; k < outs.size(); ++k) {
    const GradCounts& c = bad[k];
    if (c.infs + c.nans == 0) continue;
    const Tensor& p = params[indices[k]];
    diag_.skip->grads.push_back({.name = parameter_name(p, indices[k]),
                                 .infs = c.infs,
                                 .nans = c.nans,
                                 .numel = outs[k].numel(),
                                 .backward_order = p.impl()->grad_order});
  }
  std::stable_sort(diag_.skip->grads.begin(), diag_.skip->grads.end(),
                   [](const NonfiniteGrad& a, const NonfiniteGrad& b) { return a.backward_order < b.backward_order; });
}

}  // namespace ampgrad::amp
