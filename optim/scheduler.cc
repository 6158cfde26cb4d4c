// Learning-rate schedulers: the shared step logic and the closed-form factors.
#include "optim/scheduler.h"

#include <cmath>
#include <iostream>
#include <numbers>

#include "framework/error.h"

namespace ampgrad::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name, Factor factor)
    : optimizer_(optimizer), name_(std::move(name)), factor_(std::move(factor)) {
  AG_CHECK(factor_ != nullptr, name_, ": the lr factor function is empty");
  for (size_t g = 0; g < optimizer_.num_param_groups(); ++g) base_lrs_.push_back(optimizer_.lr(g));
  optimizer_steps_seen_ = optimizer_.steps_taken();
  last_lr_ = lrs_at(0);
  for (size_t g = 0; g < last_lr_.size(); ++g) optimizer_.set_lr(g, last_lr_[g]);
}

void LRScheduler::check_groups() const {
  AG_CHECK(optimizer_.num_param_groups() == base_lrs_.size(), name_, ": the optimizer has ",
           optimizer_.num_param_groups(), " parameter groups but the scheduler was built for ", base_lrs_.size(),
           "; hint: build the scheduler after the last add_param_group");
}

std::vector<double> LRScheduler::lrs_at(int64_t epoch) const {
  const double factor = factor_(epoch);
  AG_CHECK(std::isfinite(factor) && factor >= 0, name_, ": the lr factor at epoch ", epoch, " is ", factor,
           "; it must be finite and >= 0");
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * factor);
  return lrs;
}

void LRScheduler::step() {
  check_groups();
  if (optimizer_.steps_taken() == optimizer_steps_seen_ && !warned_) {
    warned_ = true;
    std::cerr << "ampgrad: " << name_ << "::step() with no optimizer step since the last one (a step the "
              << "GradScaler skipped, or the calls in the wrong order); the schedule advances anyway, as in "
              << "PyTorch. To count only steps taken: if (scaler.step(opt)) scheduler.step();\n";
  }
  optimizer_steps_seen_ = optimizer_.steps_taken();
  const std::vector<double> lrs = lrs_at(last_epoch_ + 1);  // checked before anything changes
  ++last_epoch_;
  last_lr_ = lrs;
  for (size_t g = 0; g < lrs.size(); ++g) optimizer_.set_lr(g, lrs[g]);
}

void LRScheduler::load_state(const LRSchedulerState& state) {
  check_groups();
  AG_CHECK(state.base_lrs.size() == base_lrs_.size(), name_, "::load_state: the state has ", state.base_lrs.size(),
           " base lrs but the optimizer has ", base_lrs_.size(), " parameter groups");
  AG_CHECK(state.last_epoch >= 0, name_, "::load_state: last_epoch must be >= 0, got ", state.last_epoch);
  for (double lr : state.base_lrs) check_lr(lr, name_ + "::load_state");
  const std::vector<double> saved = base_lrs_;
  base_lrs_ = state.base_lrs;
  try {
    last_lr_ = lrs_at(state.last_epoch);
  } catch (...) {
    base_lrs_ = saved;
    throw;
  }
  last_epoch_ = state.last_epoch;
  optimizer_steps_seen_ = optimizer_.steps_taken();
}

namespace {

// Each schedule's options are checked once, here, before its factor function exists.
LRScheduler::Factor step_factor(int64_t step_size, double gamma) {
  AG_CHECK(step_size >= 1, "StepLR: step_size must be >= 1, got ", step_size);
  AG_CHECK(std::isfinite(gamma) && gamma >= 0, "StepLR: gamma must be finite and >= 0, got ", gamma);
  return [step_size, gamma](int64_t epoch) { return std::pow(gamma, static_cast<double>(epoch / step_size)); };
}

LRScheduler::Factor cosine_factor(const CosineWithWarmupOptions& o) {
  AG_CHECK(o.warmup_steps >= 0 && o.total_steps > o.warmup_steps, "CosineWithWarmupLR: need 0 <= warmup_steps < ",
           "total_steps, got warmup_steps ", o.warmup_steps, ", total_steps ", o.total_steps);
  AG_CHECK(o.min_lr_factor >= 0 && o.min_lr_factor <= 1, "CosineWithWarmupLR: min_lr_factor must be in [0, 1], got ",
           o.min_lr_factor);
  return [o](int64_t t) {
    if (t < o.warmup_steps) return static_cast<double>(t + 1) / static_cast<double>(o.warmup_steps);
    if (t >= o.total_steps) return o.min_lr_factor;
    const double progress =
        static_cast<double>(t - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
    return o.min_lr_factor + (1 - o.min_lr_factor) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
  };
}

}  // namespace

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR", step_factor(step_size, gamma)) {}

CosineWithWarmupLR::CosineWithWarmupLR(Optimizer& optimizer, CosineWithWarmupOptions options)
    : LRScheduler(optimizer, "CosineWithWarmupLR", cosine_factor(options)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, Factor lr_lambda) : LRScheduler(optimizer, "LambdaLR", std::move(lr_lambda)) {}

}  // namespace ampgrad::optim
