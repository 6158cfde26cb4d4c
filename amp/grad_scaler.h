// GradScaler: dynamic loss scaling, integrated with the optimizers' FP32 master weights.
#pragma once

#include <cstdint>
#include <limits>
#include <unordered_map>

#include "framework/tensor.h"
#include "optim/optimizer.h"

namespace ampgrad::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: every call is a pass-through
  double min_scale = 0.0;                                       // the scale never drops below this
  double max_scale = std::numeric_limits<double>::infinity();  // nor grows above this
};

/// Everything needed to resume the schedule (for checkpoints).
struct GradScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;
  GradScalerOptions options;
};

/// The loop:  scaler.scale(loss).backward();  [scaler.unscale_(opt); clip]  scaler.step(opt);  scaler.update();
/// update(): on inf/NaN, scale *= backoff and the growth tracker resets (that step was skipped);
/// otherwise the tracker counts clean steps and at growth_interval the scale *= growth (if finite).
/// Per optimizer and iteration: READY -unscale_-> UNSCALED -step-> STEPPED; misuse throws.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  /// loss * scale, in float32 (a float16 loss is widened first so the product cannot overflow).
  Tensor scale(const Tensor& loss);
  /// Divides opt's gradients by the scale (1/scale in double) and checks them for inf/NaN in
  /// the same pass. Float32 gradients are unscaled in place; a lower-precision parameter's
  /// gradient is unscaled into its FP32 master's gradient, never divided in FP16.
  void unscale_(optim::Optimizer& opt);
  /// Unscales if not done yet, then steps opt unless an inf/NaN was found. Returns whether it stepped;
  /// a skipped step leaves parameters, masters and optimizer state untouched.
  bool step(optim::Optimizer& opt);
  /// Applies the schedule (see above) and starts the next iteration.
  void update();
  /// Sets the scale directly (finite, > 0) and starts the next iteration.
  void update(double new_scale);

  double get_scale() const;  // 1.0 when disabled
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  GradScalerState state() const;
  void load_state(const GradScalerState& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct Iteration {
    Stage stage = Stage::kReady;
    bool found_inf = false;
  };
  static void validate(const GradScalerOptions& options);
  void set_scale(double scale);
  void start_next_iteration();

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool scaled_this_iteration_ = false;
  bool warned_below_one_ = false;
  std::unordered_map<const optim::Optimizer*, Iteration> iterations_;
};

}  // namespace ampgrad::amp
