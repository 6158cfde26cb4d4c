// GradScaler at its edges, through real scale(loss).backward() passes: the scale stays a normal
// float32 (growth stops below float's max, backoff is clamped at its smallest normal), a step
// with no gradients is an error rather than a clean step, and `enabled` is never loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "amp/grad_scaler.h"
#include "amp_test_util.h"
#include "framework/tensor.h"
#include "ops/ops.h"
#include "optim/sgd.h"

namespace ag = ampgrad;
using ag::Tensor;
using ag::amp::GradScaler;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kFloatMax = std::numeric_limits<float>::max();
constexpr double kFloatMinNormal = std::numeric_limits<float>::min();  // 2^-126

// loss = sum(p * x) over a two-element p; its gradient is x, times the scale while scaled.
struct Problem {
  Problem() : p(Tensor::from_vector(std::vector<float>{1, 1}, {2})), opt({p}, {.lr = 0.0}) {
    p.set_requires_grad(true);
  }

  /// One iteration on input `x`: returns whether it stepped; `unscaled` gets p's gradient after unscale_.
  bool iterate(GradScaler& scaler, const std::vector<float>& x, std::vector<float>* unscaled = nullptr) {
    opt.zero_grad();
    scaler.scale(ag::ops::sum(p * Tensor::from_vector(x, {2}))).backward();
    scaler.unscale_(opt);
    if (unscaled != nullptr) *unscaled = p.grad().to_vector();
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  }

  Tensor p;
  ag::optim::SGD opt;
};

TEST(GradScalerRange, GrowthStopsBelowFloatMax) {
  GradScaler scaler({.init_scale = 0x1p126, .growth_interval = 1});
  Problem problem;
  std::vector<float> grad;
  for (int i = 0; i < 6; ++i) {
    // 2^127 * 1 is finite in float32; 2^128 would be inf and every other step would be skipped.
    EXPECT_TRUE(problem.iterate(scaler, {1, 0.5f}, &grad)) << "iteration " << i;
    EXPECT_EQ(grad, (std::vector<float>{1, 0.5f})) << "iteration " << i;
    EXPECT_EQ(scaler.get_scale(), 0x1p127) << "iteration " << i;
    EXPECT_EQ(scaler.growth_tracker(), 0) << "iteration " << i;
  }
  // A factor that does not land on a power of two stops at the last value below float's max.
  GradScaler odd({.init_scale = 2e38, .growth_factor = 1.5, .growth_interval = 1});
  EXPECT_TRUE(problem.iterate(odd, {1, 1}));
  EXPECT_EQ(odd.get_scale(), 2e38 * 1.5);
  EXPECT_TRUE(problem.iterate(odd, {1, 1}));
  EXPECT_EQ(odd.get_scale(), 2e38 * 1.5);  // 4.5e38 > float's max
}

TEST(GradScalerRange, BackoffStopsAtTheSmallestNormalFloat) {
  GradScaler scaler({.init_scale = 0x1p-110, .growth_interval = 1000});
  Problem problem;
  ::testing::internal::CaptureStderr();  // the one-time "below 1" warning
  for (int i = 0; i < 40; ++i) EXPECT_FALSE(problem.iterate(scaler, {kInf, 1})) << "iteration " << i;
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(scaler.get_scale(), kFloatMinNormal);
  // At 2^-150 the float32 scale would be 0 and every gradient silently zero; here it is exact.
  std::vector<float> grad;
  EXPECT_TRUE(problem.iterate(scaler, {3, -5}, &grad));
  EXPECT_EQ(grad, (std::vector<float>{3, -5}));
}

TEST(GradScalerRange, ScalesOutsideTheFloatRangeAreRefused) {
  EXPECT_ERROR([] { GradScaler s({.init_scale = 1e39}); }, "init_scale");
  EXPECT_ERROR([] { GradScaler s({.init_scale = 1e-39}); }, "init_scale");
  GradScaler scaler;
  Problem problem;
  problem.iterate(scaler, {1, 1});
  EXPECT_ERROR([&] { scaler.update(1e39); }, "new_scale");
  ag::amp::GradScalerState state = scaler.state();
  state.scale = 1e-40;
  EXPECT_ERROR([&] { scaler.load_state(state); }, "scale");
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_NO_THROW(GradScaler({.init_scale = kFloatMax}));
  EXPECT_NO_THROW(GradScaler({.init_scale = kFloatMinNormal}));
}

TEST(GradScalerNoGradients, StepWithoutGradientsThrowsAndDoesNotCountAsClean) {
  GradScaler scaler({.init_scale = 1024, .growth_interval = 1});
  Problem problem;
  // A loss that does not use the optimizer's parameters: nothing to check, nothing to step.
  Tensor other = ag::ones({2});
  other.set_requires_grad(true);
  scaler.scale(ag::ops::sum(other)).backward();
  EXPECT_ERROR([&] { scaler.step(problem.opt); }, "no inf/NaN check was recorded");
  EXPECT_ERROR([&] { scaler.update(); }, "no inf/NaN check was recorded");
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // not grown, as a clean step would have
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // Gradients zeroed between backward and step are the same mistake.
  GradScaler again({.init_scale = 1024, .growth_interval = 1});
  again.scale(ag::ops::sum(problem.p)).backward();
  problem.opt.zero_grad();
  EXPECT_ERROR([&] { again.step(problem.opt); }, "zero_grad");
  // A disabled scaler passes step() through, as PyTorch's does.
  GradScaler disabled({.enabled = false});
  EXPECT_TRUE(disabled.step(problem.opt));
}

TEST(GradScalerLoadState, EnabledIsNeverLoaded) {
  GradScaler disabled({.init_scale = 8, .enabled = false});
  GradScaler enabled({.init_scale = 1024, .growth_interval = 7});
  // A disabled scaler's state holds no schedule: loading it into an enabled one is an error that
  // changes nothing (PyTorch: "The source state dict is empty ... from a disabled instance").
  EXPECT_ERROR([&] { enabled.load_state(disabled.state()); }, "disabled");
  EXPECT_TRUE(enabled.is_enabled());
  EXPECT_EQ(enabled.get_scale(), 1024.0);
  EXPECT_EQ(enabled.options().growth_interval, 7);
  // The reverse is ignored, as in PyTorch: a disabled scaler stays a pass-through.
  disabled.load_state(enabled.state());
  EXPECT_FALSE(disabled.is_enabled());
  EXPECT_EQ(disabled.get_scale(), 1.0);
}

}  // namespace
