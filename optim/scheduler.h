// Learning-rate schedulers: on each step() every group's lr becomes base_lr * factor(epoch),
// where base_lr is the group's lr when the scheduler was built (PyTorch's closed forms).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace ampgrad::optim {

/// What checkpoints save of a scheduler.
struct LRSchedulerState {
  int64_t last_epoch = 0;  ///< steps taken since construction
  std::vector<double> base_lrs = {};  ///< each group's lr at construction, what the factor multiplies
};

/// The common part. Construction sets epoch 0's lr (as PyTorch's initial step), so the first
/// optimizer step uses factor(0). Call step() after each optimizer step (or epoch).
///
/// A step() with no optimizer step since the previous one (GradScaler skipped it, or the calls
/// are in the wrong order) still advances the schedule, as PyTorch's does, and prints a one-time
/// warning. To count only the steps taken: `if (scaler.step(opt)) scheduler.step();`.
class LRScheduler {
 public:
  /// The multiplier of the base lrs at an epoch (0 first).
  using Factor = std::function<double(int64_t epoch)>;
  /// Sets each group's lr to base_lr * factor(0); `name` is for errors and checkpoints.
  LRScheduler(Optimizer& optimizer, std::string name, Factor factor);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances the epoch and sets each group's lr to base_lr * factor(epoch).
  void step();
  /// The lr of each group set by the last step (or the construction).
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Steps taken since construction (0 right after it).
  int64_t last_epoch() const { return last_epoch_; }
  /// The lrs the groups had at construction.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The scheduler's kind ("StepLR", ...), for checkpoints.
  const std::string& name() const { return name_; }

  /// The epoch and base lrs, for a checkpoint.
  LRSchedulerState state() const { return {.last_epoch = last_epoch_, .base_lrs = base_lrs_}; }
  /// Restores the epoch and base lrs (the optimizer's lrs come from the optimizer's own state).
  void load_state(const LRSchedulerState& state);

 private:
  std::vector<double> lrs_at(int64_t epoch) const;  // checked: finite, >= 0
  void check_groups() const;

  Optimizer& optimizer_;
  std::string name_;
  Factor factor_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
  int64_t optimizer_steps_seen_ = 0;
  bool warned_ = false;
};

/// lr = base_lr * gamma^(epoch / step_size) (integer division): decay by gamma every step_size steps.
class StepLR : public LRScheduler {
 public:
  /// Decays every step_size steps by gamma.
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
};

/// CosineWithWarmupLR's schedule, in steps.
struct CosineWithWarmupOptions {
  int64_t warmup_steps = 0;    ///< linear warmup length
  int64_t total_steps = 0;     ///< warmup plus cosine decay; > warmup_steps
  double min_lr_factor = 0.0;  ///< the floor, as a fraction of base_lr, in [0, 1]
};

/// Linear warmup, then cosine decay to min_lr_factor * base_lr (llm.c's schedule):
///   t < W:       factor = (t + 1) / W
///   W <= t < T:  factor = m + (1 - m) * (1 + cos(pi * (t - W) / (T - W))) / 2
///   t >= T:      factor = m
class CosineWithWarmupLR : public LRScheduler {
 public:
  /// The schedule of `options` over the optimizer's groups.
  CosineWithWarmupLR(Optimizer& optimizer, CosineWithWarmupOptions options);
};

/// lr = base_lr * lr_lambda(epoch), for any schedule (PyTorch's LambdaLR).
class LambdaLR : public LRScheduler {
 public:
  /// lr = base_lr * lr_lambda(epoch).
  LambdaLR(Optimizer& optimizer, Factor lr_lambda);
};

}  // namespace ampgrad::optim
