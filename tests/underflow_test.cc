// The underflow demo's claims, asserted: FP16 without loss scaling stalls on tiny gradients
// (most gradient values flush to zero), while static and dynamic loss scaling track FP32 (the
// dynamic scaler growing until FP16 gradients overflow, then backing off); BF16
// needs no scaling (no gradient flushes), but BF16 parameters without FP32 masters lose most small
// updates to rounding and stall, while masters keep them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "examples/underflow.h"
#include "test_util.h"

namespace {

using underflow::Mode;

TEST(UnderflowDemo, ScalingRescuesTinyGradients) {
  const underflow::Result fp32 = underflow::train(Mode::kFp32);
  const underflow::Result plain = underflow::train(Mode::kFp16NoScaling);
  const underflow::Result fixed = underflow::train(Mode::kFp16StaticScale);
  const underflow::Result dynamic = underflow::train(Mode::kFp16DynamicScale);

  // The task really has tiny gradients: below FP16's normal range (6.1e-5), above 1e-9.
  EXPECT_LT(fp32.median_abs_fp32_grad, 1e-5);
  EXPECT_GT(fp32.median_abs_fp32_grad, 1e-9);
  EXPECT_EQ(fp32.zero_grad_fraction, 0.0);

  // Unscaled FP16: most gradients are exactly zero and training stalls far above FP32's loss.
  EXPECT_GT(plain.zero_grad_fraction, 0.5);
  EXPECT_GT(plain.final_loss, 5.0 * fp32.final_loss);

  // A static scale: few zeros, no skipped steps, and a loss within 10% of FP32's.
  EXPECT_LT(fixed.zero_grad_fraction, 0.05);
  EXPECT_EQ(fixed.skipped_steps, 0);
  EXPECT_EQ(fixed.scale_growths, 0);
  EXPECT_EQ(fixed.final_scale, 1048576.0);
  EXPECT_NEAR(fixed.final_loss, fp32.final_loss, 0.1 * fp32.final_loss);

  // The dynamic scaler really moves: it grows every growth_interval clean steps until FP16
  // gradients overflow, and each overflow skips the step and halves the scale.
  EXPECT_LT(dynamic.zero_grad_fraction, 0.05);
  EXPECT_GE(dynamic.scale_growths, 10);
  EXPECT_GE(dynamic.skipped_steps, 3);
  EXPECT_EQ(dynamic.final_scale, std::ldexp(65536.0, static_cast<int>(dynamic.scale_growths - dynamic.skipped_steps)));
  // Skipped steps do not train, and the loss still falls fast at the end, so compare with FP32
  // trained for as many applied steps.
  underflow::Config same_steps;
  same_steps.steps -= dynamic.skipped_steps;
  const underflow::Result fp32_same = underflow::train(Mode::kFp32, same_steps);
  EXPECT_NEAR(dynamic.final_loss, fp32_same.final_loss, 0.1 * fp32_same.final_loss);
  EXPECT_LT(fp32.lost_update_fraction, 0.01);  // a few dead ReLU units' weights
  EXPECT_GT(plain.lost_update_fraction, 0.5);  // zero gradients: the weights stop moving

  // The per-step records behind the plots.
  EXPECT_EQ(dynamic.losses.size(), 400u);
  EXPECT_EQ(dynamic.scales.front(), 65536.0);
  EXPECT_EQ(dynamic.skipped.size(), static_cast<size_t>(dynamic.skipped_steps));
  EXPECT_NEAR(dynamic.losses.back(), dynamic.final_loss, 0.2 * dynamic.final_loss);
  // The dynamic scaler's statistics recommend a scale that keeps the gradients finite in FP16
  // and loses under 0.1% of them; the true gradients sit far below FP16's normal range.
  ASSERT_FALSE(dynamic.recommended.empty);
  EXPECT_TRUE(dynamic.recommended.meets_underflow);
  EXPECT_GE(dynamic.recommended.scale, dynamic.scale_at_recommendation);
  EXPECT_LT(dynamic.histogram.max_exponent(), -10);
  EXPECT_EQ(dynamic.histogram.nonzero_finite() + dynamic.histogram.zeros, 32 * 64 + 64 + 64 + 1);
}

TEST(UnderflowDemo, PlotsAreNonEmptyPngsOfTheExpectedSize) {
  if (!ampgrad::utils::gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  underflow::Config config;
  config.steps = 60;
  config.stats_every = 20;
  std::vector<std::pair<Mode, underflow::Result>> runs;
  for (Mode mode : underflow::all_modes()) runs.emplace_back(mode, underflow::train(mode, config));
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("underflow_plots_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> paths = underflow::write_plots(runs, dir.string());
  ASSERT_EQ(paths.size(), 4u);
  const std::vector<std::pair<std::string, std::pair<uint32_t, uint32_t>>> expected = {
      {"loss.png", {800, 480}},
      {"scale.png", {800, 480}},
      {"grad_exponents.png", {900, 400}},
      {"fp8_grad_scale.png", {800, 480}}};
  for (size_t i = 0; i < paths.size(); ++i) {
    SCOPED_TRACE(paths[i]);
    EXPECT_EQ(std::filesystem::path(paths[i]).filename(), expected[i].first);
    EXPECT_GT(std::filesystem::file_size(paths[i]), 1000u);
    EXPECT_EQ(ampgrad::test::png_size(paths[i]), expected[i].second);
  }
  std::filesystem::remove_all(dir);
}

TEST(UnderflowDemo, Bf16NeedsNoScalingButNeedsMasters) {
  const underflow::Result fp32 = underflow::train(Mode::kFp32);
  const underflow::Result autocast = underflow::train(Mode::kBf16NoScaling);
  const underflow::Result no_masters = underflow::train(Mode::kBf16ParamsNoMasters);
  const underflow::Result masters = underflow::train(Mode::kBf16ParamsMasters);
  const underflow::Result stochastic = underflow::train(Mode::kBf16ParamsStochastic);
  for (const underflow::Result& r : {autocast, no_masters, masters, stochastic}) {
    // FP32's exponent range: the same tiny gradients that flush in FP16 survive, unscaled.
    EXPECT_LT(r.zero_grad_fraction, 0.01);
    EXPECT_EQ(r.skipped_steps, 0);
    EXPECT_EQ(r.final_scale, 1.0);
  }
  // BF16 autocast over FP32 weights and BF16 weights with FP32 masters track FP32 (within BF16's
  // coarser rounding of activations and gradients), and every update lands in FP32 weights.
  for (const underflow::Result& r : {autocast, masters}) {
    EXPECT_LT(r.lost_update_fraction, 0.01);
    EXPECT_LT(r.final_loss, 2.0 * fp32.final_loss);
  }
  // Without masters most updates are smaller than half a BF16 step of the weight and round away:
  // the run stalls far above the others.
  EXPECT_GT(no_masters.lost_update_fraction, 0.5);
  EXPECT_GT(no_masters.final_loss, 20.0 * masters.final_loss);
  // Stochastic rounding leaves as many weights' bits unchanged per step, but keeps the updates on
  // average: without masters it ends near the masters' loss, not the stalled one.
  EXPECT_GT(stochastic.lost_update_fraction, 0.5);
  EXPECT_LT(stochastic.final_loss, 2.0 * masters.final_loss);
  EXPECT_LT(stochastic.final_loss, 0.05 * no_masters.final_loss);
}

TEST(UnderflowDemo, Fp8NeedsEveryTensorScaled) {
  const underflow::Result fp32 = underflow::train(Mode::kFp32);
  const underflow::Result plain = underflow::train(Mode::kFp8NoScaling);
  const underflow::Result current = underflow::train(Mode::kFp8CurrentScaling);
  const underflow::Result delayed = underflow::train(Mode::kFp8DelayedScaling);
  // Unscaled, every gradient of 1e-7 is far below E5M2's smallest subnormal (1.5e-5): nothing trains.
  EXPECT_GT(plain.zero_grad_fraction, 0.99);
  EXPECT_GT(plain.lost_update_fraction, 0.99);
  EXPECT_GT(plain.final_loss, 1000.0 * fp32.final_loss);
  // Scaled per tensor, the gradients live (delayed scaling loses its first step, cast at scale 1
  // before any amax was seen), and the run ends within E4M3's 3-bit precision of the fit.
  EXPECT_LT(current.zero_grad_fraction, 1e-4);  // a few exact zeros, as a dead ReLU unit gives
  EXPECT_LT(delayed.zero_grad_fraction, 0.01);
  for (const underflow::Result& r : {current, delayed}) {
    EXPECT_LT(r.lost_update_fraction, 0.01);
    EXPECT_LT(r.final_loss, plain.final_loss / 100.0);
    EXPECT_LT(r.final_loss, 1e-3);
  }
  // The FP8 diagnostics say why: unscaled, the output layer's casts flush every gradient to zero
  // (the zeros it passes back are exact, not flushed); scaled, almost none flushes, and under
  // current scaling nothing saturates.
  ASSERT_EQ(plain.fp8_casts.size(), 2u);
  const underflow::Result::Float8Casts& output = plain.fp8_casts.back();
  EXPECT_EQ(output.weight, "2.weight");
  EXPECT_EQ(output.grad_flushed, 1.0);
  EXPECT_EQ(output.grad_saturated, 0.0);
  EXPECT_EQ(plain.fp8_casts.front().grad_flushed, 0.0);
  ASSERT_EQ(current.fp8_casts.size(), 2u);
  for (const underflow::Result::Float8Casts& c : current.fp8_casts) {
    EXPECT_EQ(c.grad_saturated, 0.0) << c.weight;
    EXPECT_EQ(c.forward_saturated, 0.0) << c.weight;
    EXPECT_EQ(c.grad_flushed, 0.0) << c.weight;
    EXPECT_LT(c.forward_flushed, 1e-5) << c.weight;  // a few values in a million
  }
  // Delayed scaling flushes the output layer's gradients of the first step, cast at scale 1 before
  // any amax was seen, and about half of the first layer's of the second (its first step received
  // exact zeros, whose amax 0 keeps the scale at 1; a dead ReLU's zeros are the other half).
  const int64_t steps = underflow::Config{}.steps;
  ASSERT_EQ(delayed.fp8_casts.size(), 2u);
  EXPECT_GE(delayed.fp8_casts.back().grad_flushed, 1.0 / steps);
  EXPECT_LT(delayed.fp8_casts.back().grad_flushed, 1.01 / steps);
  EXPECT_GT(delayed.fp8_casts.front().grad_flushed, 0.4 / steps);
  EXPECT_LT(delayed.fp8_casts.front().grad_flushed, 0.6 / steps);
  for (const underflow::Result::Float8Casts& c : delayed.fp8_casts) EXPECT_LT(c.forward_flushed, 1e-5) << c.weight;
  ASSERT_EQ(plain.fp8_grad_amax.size(), static_cast<size_t>(underflow::Config{}.steps));
  for (size_t step = 0; step < current.fp8_grad_amax.size(); ++step) {
    EXPECT_EQ(plain.fp8_grad_scale[step], 1.0);
    EXPECT_LT(plain.fp8_grad_amax[step], std::ldexp(1.0, -17));  // below the flush line: all lost
    // Current scaling maps this step's amax onto the largest value (to float's rounding).
    EXPECT_NEAR(current.fp8_grad_amax[step] * current.fp8_grad_scale[step], 57344.0, 0.1);
  }
  EXPECT_TRUE(fp32.fp8_grad_amax.empty());
}

}  // namespace
