// GradScaler: the update rule and the per-optimizer state machine; the diagnostics calls are
// forwarded to its ScalerDiagnostics.
#include "amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

#include "amp/diagnostics/grad_stats.h"
#include "amp/diagnostics/scaler_diagnostics.h"
#include "amp/found_inf_sync.h"
#include "amp/unscale.h"
#include "framework/error.h"
#include "framework/tensor_impl.h"
#include "ops/ops.h"

namespace ampgrad::amp {

namespace {
// scale() multiplies a float32 loss (a float16 one is widened first) by the scale as a float32,
// and backward multiplies by it again in float32, so the scale must be a normal float: above
// float's max it is inf (every step would overflow), below its smallest normal it loses bits and
// under 2^-149 becomes 0 (every gradient silently zero). Growth stops below the top; a backoff
// is clamped at the bottom.
constexpr double kSmallestScale = std::numeric_limits<float>::min();  // 2^-126
constexpr double kLargestScale = std::numeric_limits<float>::max();   // (2 - 2^-23) 2^127

bool representable(double scale) { return scale >= kSmallestScale && scale <= kLargestScale; }
}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(options.init_scale), diag_(std::make_unique<ScalerDiagnostics>()) {
  validate(options);
}

GradScaler::~GradScaler() = default;
GradScaler::GradScaler(GradScaler&&) noexcept = default;
GradScaler& GradScaler::operator=(GradScaler&&) noexcept = default;

void GradScaler::validate(const GradScalerOptions& o) {
  AG_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0, "GradScaler: init_scale must be finite and > 0, got ",
           o.init_scale);
  AG_CHECK(representable(o.init_scale), "GradScaler: init_scale ", o.init_scale, " is outside [", kSmallestScale, ", ",
           kLargestScale, "], the normal float32 range the scaled loss is computed in");
  AG_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ",
           o.growth_factor);
  AG_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "GradScaler: backoff_factor must be in (0, 1), got ",
           o.backoff_factor);
  AG_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ", o.growth_interval);
  AG_CHECK(o.min_scale >= 0 && o.min_scale <= o.max_scale && !std::isnan(o.max_scale),
           "GradScaler: need 0 <= min_scale <= max_scale, got min_scale ", o.min_scale, ", max_scale ", o.max_scale);
  // The scale never leaves [min_scale, max_scale] (set_scale clamps), so it cannot start outside it either.
  AG_CHECK(o.init_scale >= o.min_scale && o.init_scale <= o.max_scale, "GradScaler: init_scale ", o.init_scale,
           " must lie in [min_scale, max_scale] = [", o.min_scale, ", ", o.max_scale, "]");
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  AG_CHECK(loss.defined(), "GradScaler::scale: the loss is undefined");
  scaled_this_iteration_ = true;
  const Tensor wide = is_low_precision(loss.dtype()) ? loss.to(DType::kFloat32) : loss;
  Tensor scaled = ops::scale(wide, scale_);
  diag_->record_loss(loss, scaled);
  return scaled;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  AG_CHECK(scaled_this_iteration_, "GradScaler::unscale_: scale() was not called since the last update(); ",
           "hint: scaler.scale(loss).backward() comes first");
  Iteration& it = iterations_[&opt];
  AG_CHECK(it.stage == Stage::kReady, "GradScaler::unscale_: ",
           it.stage == Stage::kUnscaled ? "unscale_() was already called on this optimizer since the last update()"
                                        : "unscale_() called after step() on this optimizer",
           "; hint: call unscale_ at most once per iteration, before step()");
  const double inv_scale = 1.0 / scale_;  // in double: exact for power-of-two scales, best-rounded otherwise
  // Collect every (gradient, FP32 destination) pair first, so the CUDA ones are unscaled and
  // checked in one fused launch with one host sync (see unscale_and_check_all).
  std::vector<Tensor> grads, outs;
  std::vector<size_t> indices;  // of the parameters with a gradient
  for (size_t i = 0; i < opt.parameters().size(); ++i) {
    const Tensor& p = opt.parameters()[i];
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    indices.push_back(i);
    if (p.dtype() == DType::kFloat32) {
      outs.push_back(grad);
    } else {
      Tensor master = opt.master_of(i);  // remade first if the parameter changed outside the optimizer
      Tensor master_grad = Tensor::empty(grad.shape(), DType::kFloat32, grad.device());
      master.set_grad(master_grad);
      outs.push_back(master_grad);
    }
  }
  // With statistics due, the same pass also measures every gradient (unscale_kernels.h). Every
  // rank of a data-parallel job must take the same decision, or their weights diverge: the
  // installed hook (if any) makes the flag the OR over all processes, also for a rank whose own
  // gradients were clean or that had none.
  std::vector<GradCounts> counts;
  const bool measure = diag_->grad_stats_due(iteration_);
  const bool found_inf = sync_found_inf(
      measure ? unscale_check_and_measure_all(grads, inv_scale, outs, make_format_table(low_precision_dtypes()), counts)
              : unscale_and_check_all(grads, inv_scale, outs));
  diag_->diagnose({.params = opt.parameters(),
                   .indices = indices,
                   .grads = grads,
                   .outs = outs,
                   .found_inf = found_inf,
                   .counts = measure ? &counts : nullptr,
                   .iteration = iteration_,
                   .scale = scale_});
  it.stage = Stage::kUnscaled;
  it.found_inf = found_inf;
  it.grads_checked = grads.size();
  it.grad_passes.clear();
  for (const Tensor& p : opt.parameters()) it.grad_passes.push_back(p.impl()->grad_pass);
}

void GradScaler::check_no_gradients_since_unscale(const optim::Optimizer& opt, const Iteration& it) const {
  const std::vector<Tensor>& params = opt.parameters();
  for (size_t i = 0; i < params.size() && i < it.grad_passes.size(); ++i) {
    AG_CHECK(params[i].impl()->grad_pass == it.grad_passes[i], "GradScaler::step: a backward pass wrote the ",
             "gradient of parameter ", diag_->parameter_name(params[i], i), " ", params[i].to_string(),
             " after unscale_() ",
             "on this optimizer, so its gradients are part scaled, part unscaled; hint: run every backward of the ",
             "iteration (gradient accumulation included) before unscale_(), or call unscale_ only through step()");
  }
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return true;
  }
  AG_CHECK(scaled_this_iteration_, "GradScaler::step: scale() was not called since the last update(); ",
           "hint: scaler.scale(loss).backward() comes first");
  AG_CHECK(iterations_[&opt].stage != Stage::kStepped, "GradScaler::step: step() was already called on this ",
           "optimizer since the last update(); hint: call scaler.update() once per iteration");
  if (iterations_[&opt].stage == Stage::kReady) {
    unscale_(opt);
  } else {
    check_no_gradients_since_unscale(opt, iterations_[&opt]);
  }
  Iteration& it = iterations_[&opt];
  // Nothing was checked, so nothing says the step is clean: counting it would grow the scale.
  AG_CHECK(it.grads_checked > 0, "GradScaler::step: no inf/NaN check was recorded for this optimizer: none of its ",
           opt.parameters().size(), " parameters has a gradient; hint: run scaler.scale(loss).backward() on a loss ",
           "that uses them, and do not zero_grad() between backward and step");
  it.stage = Stage::kStepped;
  if (it.found_inf) {
    // Skip: drop the unscaled FP32 gradients so nothing stale reaches a later step (and a
    // step-only master, where masters are not kept, with its gradient).
    const bool kept = opt.master_weights() == optim::MasterWeights::kFp32;
    for (Tensor p : opt.parameters()) {
      Tensor master = p.master();
      if (!master.defined()) continue;
      if (kept) {
        master.set_grad(Tensor());
      } else {
        p.set_master(Tensor());
      }
    }
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  AG_CHECK(scaled_this_iteration_, "GradScaler::update: scale() was not called since the last update(); ",
           "hint: the order is scale(loss).backward(), step(opt), update()");
  bool found_inf = false, checked = false;
  for (const auto& [opt, it] : iterations_) {
    found_inf |= it.found_inf;
    checked |= it.grads_checked > 0;
  }
  AG_CHECK(checked, "GradScaler::update: no inf/NaN check was recorded in this iteration; ",
           "hint: call scaler.step(opt) (or unscale_) on an optimizer whose parameters have gradients before update()");
  if (found_inf) {
    set_scale(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (grown <= kLargestScale) set_scale(grown);  // else it stays: a float32 inf would overflow every step
    growth_tracker_ = 0;
  }
  ++iteration_;
  start_next_iteration();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  AG_CHECK(std::isfinite(new_scale) && new_scale > 0, "GradScaler::update(new_scale): must be finite and > 0, got ",
           new_scale);
  AG_CHECK(representable(new_scale), "GradScaler::update(new_scale): ", new_scale, " is outside [", kSmallestScale,
           ", ", kLargestScale, "], the normal float32 range the scaled loss is computed in");
  set_scale(new_scale);
  ++iteration_;
  start_next_iteration();
}

void GradScaler::set_scale(double scale) {
  // The bounds meet: validate() put init_scale inside both ranges.
  scale_ = std::clamp(scale, std::max(options_.min_scale, kSmallestScale), std::min(options_.max_scale, kLargestScale));
  if (scale_ < 1.0 && !warned_below_one_) {
    warned_below_one_ = true;
    std::cerr << "ampgrad: GradScaler scale fell below 1 (" << scale_ << "): gradients overflow even unscaled; "
              << "look for inf/NaN in the inputs or the loss, or lower the learning rate\n";
  }
}

void GradScaler::start_next_iteration() {
  iterations_.clear();
  scaled_this_iteration_ = false;
  diag_->end_iteration();
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

GradScalerState GradScaler::state() const {
  return {.scale = scale_, .growth_tracker = growth_tracker_, .options = options_};
}

void GradScaler::load_state(const GradScalerState& state) {
  if (!options_.enabled) return;  // a pass-through has no schedule to restore
  AG_CHECK(state.options.enabled, "GradScaler::load_state: the state comes from a disabled GradScaler, which has no ",
           "scale to resume, and this one is enabled; hint: construct the scaler with the options you want ",
           "(enabled is never loaded), and skip load_state when the saved run did not scale");
  validate(state.options);
  AG_CHECK(std::isfinite(state.scale) && state.scale > 0 && representable(state.scale),
           "GradScaler::load_state: scale must be in [", kSmallestScale, ", ", kLargestScale, "], got ", state.scale);
  AG_CHECK(state.scale >= state.options.min_scale && state.scale <= state.options.max_scale,
           "GradScaler::load_state: scale ", state.scale, " must lie in [min_scale, max_scale] = [",
           state.options.min_scale, ", ", state.options.max_scale, "]");
  AG_CHECK(state.growth_tracker >= 0 && state.growth_tracker < state.options.growth_interval,
           "GradScaler::load_state: growth_tracker ", state.growth_tracker, " must be in [0, growth_interval = ",
           state.options.growth_interval, ")");
  options_ = state.options;  // enabled in both, as checked above
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  start_next_iteration();
}

// Diagnostics: the ScalerDiagnostics keeps them.
void GradScaler::set_parameter_names(const std::vector<std::pair<std::string, Tensor>>& named) {
  diag_->set_parameter_names(named);
}
void GradScaler::set_grad_stats_interval(int64_t every) { diag_->set_grad_stats_interval(every); }
void GradScaler::request_grad_stats() { diag_->request_grad_stats(); }
const GradStatsReport* GradScaler::grad_stats() const { return diag_->grad_stats(); }
const SkipReport* GradScaler::last_skip() const { return diag_->last_skip(); }
void GradScaler::watch_forward(nn::Module& model) { diag_->watch_forward(model); }
void GradScaler::unwatch_forward() { diag_->unwatch_forward(); }

}  // namespace ampgrad::amp
