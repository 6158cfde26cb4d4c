// FP32 master weights: updates too small for FP16 accumulate in the master, scaled FP16 gradients
// are unscaled into FP32, and FP16 / mixed / autocast training converges like FP32 training.
#include <gtest/gtest.h>

#include <cmath>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "amp_test_util.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/utils.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Device;
using ag::Tensor;
using ag::amp::GradScaler;
using ag::test::bytes_of;
using ag::amp_testing::eval_loss;
using ag::amp_testing::make_regression;
using ag::amp_testing::Regression;

namespace {

Tensor fp16_parameter(const std::vector<float>& values) {
  Tensor p = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, DType::kFloat16);
  p.set_requires_grad(true);
  return p;
}

TEST(MasterWeights, UpdatesTooSmallForFp16AccumulateInTheMaster) {
  const float g = ag::half_to_float(ag::float_to_half(1e-4f));
  // FP16 alone: the spacing just below 1 is 2^-11 ~ 4.9e-4, so 1 - 1e-4 rounds back to 1, forever.
  float fp16_only = 1.0f;
  for (int i = 0; i < 10; ++i) fp16_only = ag::half_to_float(ag::float_to_half(fp16_only - g));
  EXPECT_EQ(fp16_only, 1.0f);
  {
    ag::NoGradGuard no_grad;  // the framework's own FP16 arithmetic agrees
    Tensor w = ag::ones({1}, DType::kFloat16);
    for (int i = 0; i < 10; ++i) w = w - ag::full({1}, 1e-4, DType::kFloat16);
    EXPECT_EQ(w.to_vector()[0], 1.0f);
  }
  // ampgrad: SGD(lr = 1) on an FP16 parameter updates its FP32 master.
  Tensor p = fp16_parameter({1.0f});
  ag::optim::SGD sgd({p}, {.lr = 1.0});
  ASSERT_TRUE(p.master().defined());
  const Tensor c = ag::full({1}, 1e-4, DType::kFloat16);
  for (int i = 0; i < 10; ++i) {
    sgd.zero_grad();
    ag::ops::sum(p * c).backward();  // d/dp = c, an FP16 gradient
    ASSERT_EQ(p.grad().dtype(), DType::kFloat16);
    sgd.step();
  }
  EXPECT_NEAR(p.master().to_vector()[0], 1.0f - 10 * g, 1e-6);
  EXPECT_EQ(p.dtype(), DType::kFloat16);
  EXPECT_EQ(p.to_vector()[0], ag::half_to_float(ag::float_to_half(1.0f - 10 * g)));  // 0.99902...
  EXPECT_LT(p.to_vector()[0], 1.0f);
  EXPECT_NEAR(p.to_vector()[0], 0.999f, 5e-4);
}

TEST(MasterWeights, ScaledFp16GradientsAreUnscaledIntoFp32) {
  Tensor p = fp16_parameter({1, 1, 1});
  ag::optim::SGD sgd({p}, {.lr = 1e5});
  const Tensor c = Tensor::from_vector(std::vector<float>{1e-9f, 2e-9f, -3e-9f}, {3});
  // Unscaled, the FP16 gradient is below FP16's smallest subnormal (~6e-8) and flushes to zero.
  ag::ops::sum(p * c).backward();
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{0, 0, 0}));
  sgd.zero_grad();

  GradScaler scaler;  // 65536: 1e-9 becomes ~6.6e-5, a normal FP16 number
  scaler.scale(ag::ops::sum(p * c)).backward();
  EXPECT_EQ(p.grad().dtype(), DType::kFloat16);
  const std::vector<float> scaled = p.grad().to_vector();
  scaler.unscale_(sgd);
  EXPECT_EQ(p.grad().to_vector(), scaled) << "the FP16 gradient itself is left alone";
  const Tensor master_grad = p.master().grad();
  ASSERT_TRUE(master_grad.defined());
  EXPECT_EQ(master_grad.dtype(), DType::kFloat32);
  const std::vector<float> unscaled = master_grad.to_vector();
  const std::vector<float> expected = c.to_vector();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(unscaled[i], 0.0f) << i;
    EXPECT_NEAR(unscaled[i], expected[i], std::abs(expected[i]) * 1e-3) << i;  // FP16 rounding of the scaled value
  }
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  const std::vector<float> master = p.master().to_vector();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(master[i], 1.0f - 1e5f * expected[i], 1e-6) << i;
  EXPECT_FALSE(p.master().grad().defined()) << "the step consumes the master's gradient";
}

// Loss of a model whose parameters mix FP16 and FP32: autocast makes the dtypes meet.
double autocast_loss(ag::nn::Module& model, const Regression& data) {
  ag::NoGradGuard no_grad;
  ag::amp::AutocastGuard autocast(Device::kCPU, DType::kFloat16);
  return ag::ops::mse_loss(model(data.x), data.y).item();
}

TEST(MasterWeights, MixedFp16AndFp32ParameterListsTrain) {
  ag::manual_seed(40);
  ag::nn::Sequential model{ag::nn::Linear(6, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1)};
  model[0].to(DType::kFloat16);
  const Regression data = make_regression(41, 64, 6, 0.05);
  const double initial = autocast_loss(model, data);
  ag::optim::Adam adam(model.parameters(), {.lr = 1e-2});
  GradScaler scaler;
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const bool half = i < 2;
    EXPECT_EQ(params[i].dtype(), half ? DType::kFloat16 : DType::kFloat32) << i;
    EXPECT_EQ(params[i].master().defined(), half) << i;
    EXPECT_TRUE(adam.master_of(i).is_same(half ? params[i].master() : params[i])) << i;
  }
  int skipped = 0;
  for (int step = 0; step < 300; ++step) {
    adam.zero_grad();
    Tensor loss;
    {
      ag::amp::AutocastGuard autocast(Device::kCPU, DType::kFloat16);
      loss = ag::ops::mse_loss(model(data.x), data.y);
    }
    scaler.scale(loss).backward();
    for (const Tensor& p : params) ASSERT_EQ(p.grad().dtype(), p.dtype());
    skipped += !scaler.step(adam);
    scaler.update();
    for (size_t i = 0; i < 2; ++i) {  // each FP16 parameter is its master rounded
      ASSERT_EQ(bytes_of(params[i]), bytes_of(params[i].master().to(DType::kFloat16))) << "step " << step;
    }
  }
  EXPECT_LT(skipped, 10);
  EXPECT_LT(autocast_loss(model, data), 0.05 * initial);
}

TEST(MasterWeights, Fp16ParameterTrainingWithGradScalerConverges) {
  ag::manual_seed(50);
  ag::nn::Sequential model{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  model.to(DType::kFloat16);  // before building the optimizer, which then makes FP32 masters
  const Regression data = make_regression(51, 128, 8, 0.05);
  const Tensor x = data.x.to(DType::kFloat16), y = data.y.to(DType::kFloat16);
  const double initial = eval_loss(model, data);
  ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
  GradScaler scaler({.growth_interval = 50});
  for (int step = 0; step < 600; ++step) {
    adam.zero_grad();
    const Tensor loss = ag::ops::mse_loss(model(x), y);  // all FP16, no autocast
    ASSERT_EQ(loss.dtype(), DType::kFloat16);
    scaler.scale(loss).backward();
    scaler.step(adam);
    scaler.update();
  }
  for (const Tensor& p : model.parameters()) {
    EXPECT_EQ(p.dtype(), DType::kFloat16);
    EXPECT_TRUE(ag::test::all_finite(p));
  }
  const double final_loss = eval_loss(model, data);
  EXPECT_LT(final_loss, 0.02 * initial) << "initial " << initial << ", final " << final_loss;
  EXPECT_LT(final_loss, 0.02);
}

TEST(MasterWeights, AutocastTrainingReachesTheLossOfFp32Training) {
  // Noisy targets give both runs the same loss floor, so a relative comparison is meaningful.
  const Regression data = make_regression(60, 256, 8, 0.3);
  auto train = [&](bool amp) {
    ag::manual_seed(61);
    ag::nn::Sequential model{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
    ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
    GradScaler scaler({.init_scale = 65536, .growth_interval = 100, .enabled = amp});
    for (int step = 0; step < 600; ++step) {
      adam.zero_grad();
      Tensor loss;
      {
        ag::amp::AutocastGuard autocast(Device::kCPU, DType::kFloat16, /*enabled=*/amp);
        const Tensor out = model(data.x);
        EXPECT_EQ(out.dtype(), amp ? DType::kFloat16 : DType::kFloat32);
        loss = ag::ops::mse_loss(out, data.y);
      }
      scaler.scale(loss).backward();
      scaler.step(adam);
      scaler.update();
    }
    return eval_loss(model, data);
  };
  ag::manual_seed(61);
  ag::nn::Sequential untrained{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  const double initial = eval_loss(untrained, data);
  const double fp32 = train(false), amp = train(true);
  EXPECT_LT(fp32, 0.2 * initial) << "the FP32 baseline must learn for the comparison to mean anything";
  EXPECT_NEAR(amp, fp32, 0.15 * fp32) << "initial " << initial;
}

}  // namespace
