// Soak: 1e5 AMP steps of the seed workload (Linear(10, 1), MSE, Adam, batch 64) with an inf
// injected into a gradient every few hundred steps. Memory stays flat, every step follows the
// GradScaler rule exactly (tracked here independently), and the loss ends finite and lower.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "ampgrad.h"
#include "test_util.h"

namespace ag = ampgrad;

namespace {

constexpr int64_t kSteps = 100'000;
constexpr int64_t kInjectEvery = 317;  // prime, so injections drift across the growth intervals
constexpr int64_t kGrowthInterval = 50;

TEST(Soak, AmpWithInjectedOverflows) {
  ag::manual_seed(0);
  ag::nn::Linear model(10, 1);
  ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
  const ag::amp::GradScalerOptions options{.growth_interval = kGrowthInterval};
  ag::amp::GradScaler scaler(options);
  const ag::Tensor x = ag::randn({64, 10});
  const ag::Tensor y = ag::randn({64, 1});

  double expected_scale = options.init_scale;
  int64_t expected_tracker = 0;
  int64_t injected = 0, genuine = 0, both = 0, skipped = 0;
  int64_t bytes_at_1e3 = -1;
  float first_loss = 0.0f, last_loss = 0.0f;

  for (int64_t step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kFloat16);
      loss = ag::ops::mse_loss(model(x), y);
    }
    scaler.scale(loss).backward();

    // A genuine overflow (the scale grew too far for FP16) is seen before anything is injected.
    bool overflow = false;
    for (const ag::Tensor& p : model.parameters()) overflow = overflow || !ag::test::all_finite(p.grad());
    genuine += overflow;
    if (step % kInjectEvery == kInjectEvery - 1) {
      ag::Tensor g = model.weight.grad();
      g.data<float>()[step % 10] = std::numeric_limits<float>::infinity();
      g.bump_version();
      both += overflow;
      overflow = true;
      ++injected;
    }

    const bool stepped = scaler.step(opt);
    ASSERT_EQ(stepped, !overflow) << "step " << step;
    skipped += !stepped;
    scaler.update();

    // The rule: on overflow back off and reset the tracker; after growth_interval clean steps grow.
    if (overflow) {
      expected_scale *= options.backoff_factor;
      expected_tracker = 0;
    } else if (++expected_tracker == kGrowthInterval) {
      expected_scale *= options.growth_factor;
      expected_tracker = 0;
    }
    ASSERT_EQ(scaler.get_scale(), expected_scale) << "step " << step;
    ASSERT_EQ(scaler.growth_tracker(), expected_tracker) << "step " << step;

    if (stepped) {
      const float value = loss.item();
      ASSERT_TRUE(std::isfinite(value)) << "step " << step;
      if (first_loss == 0.0f) first_loss = value;
      last_loss = value;
    }
    loss = ag::Tensor();
    if (step + 1 == 1000) bytes_at_1e3 = ag::memory_stats(ag::Device::kCPU).current_bytes;
  }

  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, bytes_at_1e3);
  EXPECT_EQ(injected, kSteps / kInjectEvery);
  EXPECT_EQ(skipped, injected + genuine - both);  // `both`: injected where it overflowed anyway
  EXPECT_GT(genuine, 0) << "the scale never grew far enough to overflow FP16: the test lost its point";
  EXPECT_TRUE(std::isfinite(last_loss));
  EXPECT_LT(last_loss, 0.9f * first_loss);
  std::printf("soak: %lld steps, %lld injected, %lld genuine overflows, loss %.4g -> %.4g, scale %g\n",
              static_cast<long long>(kSteps), static_cast<long long>(injected), static_cast<long long>(genuine),
              first_loss, last_loss, scaler.get_scale());
}

}  // namespace
