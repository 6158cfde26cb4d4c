// GradScaler: dynamic loss scaling, integrated with the optimizers' FP32 master weights. The
// recipe is PyTorch's; the diagnostics it can report are a separate object (amp/diagnostics/).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "framework/tensor.h"
#include "optim/optimizer.h"

namespace ampgrad::nn {
class Module;
}

namespace ampgrad::amp {

class ScalerDiagnostics;
struct GradStatsReport;
struct SkipReport;

/// GradScaler's schedule, as PyTorch's torch.amp.GradScaler arguments.
struct GradScalerOptions {
  double init_scale = 65536.0;  ///< the first loss scale
  double growth_factor = 2.0;  ///< scale *= this after growth_interval clean steps in a row
  double backoff_factor = 0.5;  ///< scale *= this after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  ///< clean steps before the scale grows
  bool enabled = true;  ///< false: every call is a pass-through
  double min_scale = 0.0;                                       ///< the scale never drops below this
  double max_scale = std::numeric_limits<double>::infinity();  ///< nor grows above this
};

/// Everything needed to resume the schedule (for checkpoints).
struct GradScalerState {
  double scale = 65536.0;  ///< the current loss scale
  int64_t growth_tracker = 0;  ///< clean steps since the last growth or backoff
  GradScalerOptions options;  ///< the schedule the state belongs to
};

/// The loop:  scaler.scale(loss).backward();  [scaler.unscale_(opt); clip]  scaler.step(opt);  scaler.update();
/// update(): on inf/NaN, scale *= backoff and the growth tracker resets (that step was skipped);
/// otherwise the tracker counts clean steps and at growth_interval the scale *= growth. The scale
/// stays a normal float32 (scale() multiplies in float32): growth that would pass float's max is
/// not applied, and a backoff below 2^-126 stops there.
/// Per optimizer and iteration: READY -unscale_-> UNSCALED -step-> STEPPED; misuse throws. step()
/// also throws if a backward reached opt's parameters while it was UNSCALED (those new, scaled
/// gradients would be stepped on unscaled, or dropped: unscale_ belongs after the iteration's last
/// backward).
class GradScaler {
 public:
  /// A scaler with this schedule (PyTorch's defaults).
  explicit GradScaler(GradScalerOptions options = {});
  ~GradScaler();
  /// Moves the schedule, its state and the diagnostics; the moved-from scaler may only be
  /// destroyed or assigned to.
  GradScaler(GradScaler&&) noexcept;
  GradScaler& operator=(GradScaler&&) noexcept;  ///< see the move constructor

  /// loss * scale, in float32 (a float16 loss is widened first so the product cannot overflow).
  Tensor scale(const Tensor& loss);
  /// Divides opt's gradients by the scale (1/scale in double) and checks them for inf/NaN in
  /// the same pass. Float32 gradients are unscaled in place; a lower-precision parameter's
  /// gradient is unscaled into its FP32 master's gradient, never divided in FP16. The flag then
  /// goes through the process-wide found-inf hook (amp/found_inf_sync.h), so that in
  /// data-parallel training every rank skips or steps together.
  void unscale_(optim::Optimizer& opt);
  /// Unscales if not done yet, then steps opt unless an inf/NaN was found. Returns whether it stepped;
  /// a skipped step leaves parameters, masters and optimizer state untouched. Throws when none of
  /// opt's parameters has a gradient (no inf/NaN check was recorded: as PyTorch, not a clean step).
  bool step(optim::Optimizer& opt);
  /// Applies the schedule (see above) and starts the next iteration. Throws unless some optimizer
  /// had gradients checked in this iteration.
  void update();
  /// Sets the scale directly (a normal float32: in [2^-126, float's max]) and starts the next iteration.
  void update(double new_scale);

  double get_scale() const;  ///< 1.0 when disabled
  /// Clean steps counted towards the next growth.
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Whether the scaler scales (false: every call is a pass-through).
  bool is_enabled() const { return options_.enabled; }
  /// The schedule given at construction (or restored by load_state).
  const GradScalerOptions& options() const { return options_; }

  /// The scale, growth tracker and schedule, for a checkpoint.
  GradScalerState state() const;
  /// Restores the scale, growth tracker and schedule options from state(). `enabled` stays the
  /// constructor's choice: a disabled scaler ignores the call (as PyTorch's), and an enabled one
  /// refuses the state of a disabled scaler, which holds no schedule (scaling would silently stop).
  void load_state(const GradScalerState& state);

  // Diagnostics (docs/diagnostics.md, "AMP diagnostics"), kept by a ScalerDiagnostics
  // (amp/diagnostics/scaler_diagnostics.h); none of them changes what the scaler does.
  /// Names the parameters in reports, as Module::named_parameters() gives them, matched to the
  /// optimizers' parameters by identity (the handle). An unnamed one is "param<i>", i its index
  /// in its optimizer.
  void set_parameter_names(const std::vector<std::pair<std::string, Tensor>>& named);
  /// Gradient statistics (amp/diagnostics/grad_stats.h), measured by unscale_ in the same pass,
  /// in every iteration whose number is a multiple of `every` (1: every step; 0: never, the default).
  void set_grad_stats_interval(int64_t every);
  /// Measures them in this iteration's unscale_ as well.
  void request_grad_stats();
  /// The latest statistics measured (nullptr before any), for every optimizer unscaled in that
  /// iteration; replaced by the next iteration that measures.
  const GradStatsReport* grad_stats() const;
  /// Why the latest skipped step was skipped (nullptr if none was). Built by unscale_ when it
  /// finds an inf/NaN, at the cost of one more pass over that iteration's gradients.
  const SkipReport* last_skip() const;
  /// Watches `model`'s module outputs for inf/NaN (a ForwardWatch), so a skip report can name the
  /// module whose activation was already non-finite in the forward. Costs a read of every module
  /// output per training forward; unwatch_forward() removes the hooks.
  void watch_forward(nn::Module& model);
  /// Removes the hooks watch_forward() installed.
  void unwatch_forward();
  /// The number of update() calls so far: the iteration statistics and skip reports carry.
  int64_t iteration() const { return iteration_; }

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct Iteration {
    Stage stage = Stage::kReady;
    bool found_inf = false;
    size_t grads_checked = 0;  // gradients unscale_ checked: none means nothing to step on
    // Each parameter's latest backward pass (TensorImpl::grad_pass) when unscale_ ran: a pass that
    // writes a gradient after it would mix scaled and unscaled values, so step() refuses it.
    std::vector<uint64_t> grad_passes;
  };
  /// Throws if a backward pass wrote a gradient of opt's since unscale_(opt).
  void check_no_gradients_since_unscale(const optim::Optimizer& opt, const Iteration& it) const;
  static void validate(const GradScalerOptions& options);
  void set_scale(double scale);
  void start_next_iteration();

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool scaled_this_iteration_ = false;
  bool warned_below_one_ = false;
  std::unordered_map<const optim::Optimizer*, Iteration> iterations_;
  int64_t iteration_ = 0;
  std::unique_ptr<ScalerDiagnostics> diag_;  // never null (but after a move)
};

}  // namespace ampgrad::amp
