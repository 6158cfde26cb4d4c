// Learning-rate schedulers: StepLR, cosine with linear warmup and LambdaLR against their
// formulas, per group; the optimizer uses the lr they set; a step after a skipped optimizer step
// warns once and advances (PyTorch's choice); state round trip; option errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace optim = ampgrad::optim;
using ag::Tensor;
using ag::test::throws_error;

namespace {

Tensor param(float value) {
  Tensor p = ag::full({1}, value);
  p.set_requires_grad(true);
  return p;
}

// Two groups with base lrs 0.1 and 0.4, so each scheduler is checked per group.
struct TwoGroups {
  Tensor a = param(1), b = param(1);
  optim::SGD sgd{{{.params = {a}}, {.params = {b}, .options = optim::SGDOptions{.lr = 0.4}}}, {.lr = 0.1}};

  void step() {
    a.set_grad(ag::ones({1}));
    b.set_grad(ag::ones({1}));
    sgd.step();
  }
};

// Steps `scheduler` through `epochs` epochs (one optimizer step each) and checks every lr
// against base * factor(epoch), in the scheduler, the optimizer and the group options.
void expect_schedule(TwoGroups& run, optim::LRScheduler& scheduler, int epochs, double (*factor)(int64_t)) {
  const double base[2] = {0.1, 0.4};
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    SCOPED_TRACE(epoch);
    EXPECT_EQ(scheduler.last_epoch(), epoch);
    for (size_t g = 0; g < 2; ++g) {
      const double expected = base[g] * factor(epoch);
      EXPECT_NEAR(scheduler.get_last_lr()[g], expected, 1e-15 * base[g]);
      EXPECT_EQ(run.sgd.lr(g), scheduler.get_last_lr()[g]);
      EXPECT_EQ(run.sgd.options(g).lr, scheduler.get_last_lr()[g]);
    }
    run.step();
    scheduler.step();
  }
}

TEST(Scheduler, StepLR) {
  TwoGroups run;
  optim::StepLR scheduler(run.sgd, /*step_size=*/3, /*gamma=*/0.5);
  expect_schedule(run, scheduler, 10, [](int64_t e) { return std::pow(0.5, static_cast<double>(e / 3)); });
}

double cosine(int64_t t) {  // warmup 4, total 12, floor 0.1
  if (t < 4) return (t + 1) / 4.0;
  if (t >= 12) return 0.1;
  return 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * (t - 4) / 8.0));
}

TEST(Scheduler, CosineWithWarmup) {
  TwoGroups run;
  optim::CosineWithWarmupLR scheduler(run.sgd, {.warmup_steps = 4, .total_steps = 12, .min_lr_factor = 0.1});
  expect_schedule(run, scheduler, 16, cosine);
  // Landmarks: a quarter of the peak first, the peak at the end of warmup, half way down in the middle.
  EXPECT_DOUBLE_EQ(cosine(0), 0.25);
  EXPECT_DOUBLE_EQ(cosine(3), 1.0);
  EXPECT_DOUBLE_EQ(cosine(4), 1.0);
  EXPECT_DOUBLE_EQ(cosine(8), 0.55);
  EXPECT_DOUBLE_EQ(cosine(12), 0.1);
}

TEST(Scheduler, LambdaLR) {
  TwoGroups run;
  optim::LambdaLR scheduler(run.sgd, [](int64_t e) { return 1.0 / (1.0 + static_cast<double>(e)); });
  expect_schedule(run, scheduler, 6, [](int64_t e) { return 1.0 / (1.0 + static_cast<double>(e)); });
}

TEST(Scheduler, TheOptimizerStepsWithTheScheduledLr) {
  Tensor p = param(1);
  optim::SGD sgd({p}, {.lr = 1.0});
  optim::StepLR scheduler(sgd, 1, 0.5);  // 1, 0.5, 0.25, ...
  float expected = 1;
  for (int i = 0; i < 4; ++i) {
    p.set_grad(ag::ones({1}));
    sgd.step();
    expected -= std::ldexp(1.0f, -i);
    EXPECT_EQ(p.to_vector()[0], expected) << i;
    scheduler.step();
  }
}

TEST(Scheduler, AStepAfterASkippedOptimizerStepWarnsOnceAndAdvances) {
  Tensor p = param(1);
  optim::SGD sgd({p}, {.lr = 1.0});
  optim::StepLR scheduler(sgd, 1, 0.5);
  ag::amp::GradScaler scaler({.init_scale = 1024});
  auto iteration = [&](float grad) {
    sgd.zero_grad();
    scaler.scale(ag::ops::sum(p * grad)).backward();
    const bool stepped = scaler.step(sgd);
    scaler.update();
    return stepped;
  };
  const float inf = std::numeric_limits<float>::infinity();
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(iteration(inf));
  scheduler.step();  // PyTorch's choice: the schedule advances anyway
  EXPECT_FALSE(iteration(inf));
  scheduler.step();
  EXPECT_TRUE(iteration(1));
  scheduler.step();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(scheduler.last_epoch(), 3);
  EXPECT_EQ(sgd.steps_taken(), 1);
  EXPECT_EQ(sgd.lr(), 0.125);
  const size_t at = err.find("StepLR::step() with no optimizer step");
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find("StepLR::step()", at + 1), std::string::npos) << "warned twice: " << err;
  EXPECT_NE(err.find("if (scaler.step(opt)) scheduler.step();"), std::string::npos) << err;

  // The clean way: count only the steps taken. No warning.
  optim::StepLR counted(sgd, 1, 0.5);
  ::testing::internal::CaptureStderr();
  for (float grad : {inf, 1.0f, inf, 1.0f}) {
    if (iteration(grad)) counted.step();
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(counted.last_epoch(), 2);
}

TEST(Scheduler, StateRoundTrip) {
  TwoGroups run;
  optim::CosineWithWarmupLR scheduler(run.sgd, {.warmup_steps = 2, .total_steps = 10});
  for (int i = 0; i < 5; ++i) {
    run.step();
    scheduler.step();
  }
  const optim::LRSchedulerState saved = scheduler.state();
  EXPECT_EQ(saved.last_epoch, 5);
  EXPECT_EQ(saved.base_lrs, (std::vector<double>{0.1, 0.4}));

  TwoGroups other;
  optim::CosineWithWarmupLR resumed(other.sgd, {.warmup_steps = 2, .total_steps = 10});
  resumed.load_state(saved);
  EXPECT_EQ(resumed.last_epoch(), 5);
  EXPECT_EQ(resumed.get_last_lr(), scheduler.get_last_lr());
  run.step();
  other.step();
  scheduler.step();
  resumed.step();
  EXPECT_EQ(resumed.get_last_lr(), scheduler.get_last_lr());
  EXPECT_TRUE(throws_error([&] { resumed.load_state({.last_epoch = 1, .base_lrs = {0.1}}); }, {"1 base lrs", "2"}));
  EXPECT_TRUE(throws_error([&] { resumed.load_state({.last_epoch = -1, .base_lrs = {0.1, 0.1}}); }, {"last_epoch"}));
  EXPECT_EQ(resumed.last_epoch(), 6);
}

TEST(Scheduler, Errors) {
  TwoGroups run;
  EXPECT_TRUE(throws_error([&] { optim::StepLR(run.sgd, 0); }, {"StepLR", "step_size", "0"}));
  EXPECT_TRUE(throws_error([&] { optim::StepLR(run.sgd, 2, -0.5); }, {"StepLR", "gamma", "-0.5"}));
  EXPECT_TRUE(throws_error([&] { optim::CosineWithWarmupLR(run.sgd, {.warmup_steps = 5, .total_steps = 5}); },
                           {"CosineWithWarmupLR", "warmup_steps 5", "total_steps 5"}));
  EXPECT_TRUE(throws_error([&] { optim::CosineWithWarmupLR(run.sgd, {.total_steps = 5, .min_lr_factor = 1.5}); },
                           {"min_lr_factor", "1.5"}));
  EXPECT_TRUE(throws_error([&] { optim::LambdaLR(run.sgd, nullptr); }, {"LambdaLR", "empty"}));
  EXPECT_EQ(run.sgd.lr(0), 0.1);  // refused schedulers changed nothing

  // A factor that goes bad is refused at that step, leaving the lrs and the epoch as they were.
  optim::LambdaLR bad(run.sgd, [](int64_t e) { return e < 2 ? 1.0 : -1.0; });
  bad.step();
  EXPECT_TRUE(throws_error([&] { bad.step(); }, {"LambdaLR", "epoch 2", "-1"}));
  EXPECT_EQ(bad.last_epoch(), 1);
  EXPECT_EQ(run.sgd.lr(1), 0.4);

  // Groups added after the scheduler was built.
  run.sgd.add_param_group({.params = {param(0)}});
  EXPECT_TRUE(throws_error([&] { bad.step(); }, {"LambdaLR", "3 parameter groups", "built for 2"}));
}

}  // namespace
