// The underflow demo's claim, asserted: FP16 without loss scaling stalls on tiny gradients
// (most gradient values flush to zero), while static and dynamic loss scaling track FP32.
#include <gtest/gtest.h>

#include "examples/underflow.h"

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

  // Scaled FP16 (static or dynamic): few zeros, no skipped steps, and a loss within 10% of FP32's.
  for (const underflow::Result& r : {fixed, dynamic}) {
    EXPECT_LT(r.zero_grad_fraction, 0.05);
    EXPECT_EQ(r.skipped_steps, 0);
    EXPECT_NEAR(r.final_loss, fp32.final_loss, 0.1 * fp32.final_loss);
  }
  EXPECT_EQ(fixed.final_scale, 1048576.0);
  EXPECT_EQ(dynamic.final_scale, 65536.0);
}

}  // namespace
