// FP32 master weights: updates too small for FP16 or BF16 accumulate in the master (and are lost
// without one), scaled FP16 gradients are unscaled into FP32, FP16 / BF16 / mixed / autocast
// training converges like FP32 training, and a scaler changes nothing under BF16 autocast.
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

// The case for BF16: a weight of 1.0 updated by 1e-3 ten times. BF16's spacing just below
// 1 is 2^-8 ~ 3.9e-3, so each 1 - 1e-3 rounds back to 1: without a master the weight never moves;
// with one, the master collects the ten updates and the weight rounds to 0.98828125.
TEST(MasterWeights, Bf16WeightMovesOnlyWithAMaster) {
  const Tensor c = ag::full({1}, 1e-3, DType::kBFloat16);  // d/dp of sum(p * c): the gradient
  const float g = c.item();
  const auto train = [&](ag::optim::MasterWeights mode) {
    Tensor p = ag::ones({1}, DType::kBFloat16);
    p.set_requires_grad(true);
    ag::optim::SGD sgd({p}, {.lr = 1.0});
    sgd.set_master_weights(mode);
    for (int i = 0; i < 10; ++i) {
      sgd.zero_grad();
      ag::ops::sum(p * c).backward();  // a BF16 gradient, no scaler
      EXPECT_EQ(p.grad().dtype(), DType::kBFloat16);
      sgd.step();
    }
    EXPECT_EQ(p.dtype(), DType::kBFloat16);
    return p;
  };
  const Tensor without = train(ag::optim::MasterWeights::kNone);
  EXPECT_EQ(without.to_vector()[0], 1.0f) << "stalled: every update was below half BF16's spacing";
  const Tensor with = train(ag::optim::MasterWeights::kFp32);
  EXPECT_NEAR(with.master().to_vector()[0], 1.0f - 10 * g, 1e-6);
  EXPECT_EQ(with.to_vector()[0], ag::bfloat16_to_float(ag::float_to_bfloat16(1.0f - 10 * g)));
  EXPECT_EQ(with.to_vector()[0], 0.98828125f);
}

// With masters switched off, none is kept and each step restarts from the rounded parameter, for
// Adam as for SGD; a float32 parameter (its own master) is not affected.
TEST(MasterWeights, WithoutMastersEveryStepStartsFromTheRoundedParameter) {
  Tensor low = ag::full({3}, 1.0, DType::kBFloat16), single = ag::full({3}, 1.0);
  for (Tensor* t : {&low, &single}) t->set_requires_grad(true);
  ag::optim::Adam adam({low, single}, {.lr = 1e-3});
  ASSERT_TRUE(low.master().defined());  // made by the constructor
  adam.set_master_weights(ag::optim::MasterWeights::kNone);
  EXPECT_EQ(adam.master_weights(), ag::optim::MasterWeights::kNone);
  EXPECT_FALSE(low.master().defined());
  for (int i = 0; i < 20; ++i) {
    adam.zero_grad();
    ag::ops::sum(low + single).backward();  // gradient 1: Adam moves each weight by lr = 1e-3
    adam.step();
    ASSERT_FALSE(low.master().defined()) << "step " << i;
  }
  const std::vector<ag::optim::ParamState> state = adam.Optimizer::state();
  EXPECT_EQ(state[0].tensors.count("master"), 0u);
  EXPECT_EQ(state[0].counters.at("step"), 20);  // Adam's own state is kept
  EXPECT_EQ(low.to_vector(), (std::vector<float>{1, 1, 1}));
  EXPECT_NEAR(single.to_vector()[0], 1.0f - 20e-3f, 1e-5);
}

// The recommended BF16 recipe: FP32 parameters, BF16 autocast, the optimizer without a scaler.
TEST(MasterWeights, Bf16AutocastWithoutAScalerReachesTheLossOfFp32Training) {
  const Regression data = make_regression(60, 256, 8, 0.3);
  auto train = [&](bool bf16) {
    ag::manual_seed(61);
    ag::nn::Sequential model{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
    ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
    for (int step = 0; step < 600; ++step) {
      adam.zero_grad();
      Tensor loss;
      {
        ag::amp::AutocastGuard autocast(Device::kCPU, DType::kBFloat16, /*enabled=*/bf16);
        const Tensor out = model(data.x);
        EXPECT_EQ(out.dtype(), bf16 ? DType::kBFloat16 : DType::kFloat32);
        loss = ag::ops::mse_loss(out, data.y);
      }
      loss.backward();
      adam.step();
    }
    return eval_loss(model, data);
  };
  ag::manual_seed(61);
  ag::nn::Sequential untrained{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  const double initial = eval_loss(untrained, data);
  const double fp32 = train(false), bf16 = train(true);
  EXPECT_LT(fp32, 0.2 * initial) << "the FP32 baseline must learn for the comparison to mean anything";
  EXPECT_NEAR(bf16, fp32, 0.15 * fp32) << "initial " << initial;
}

// BF16 parameters with FP32 masters train without a scaler, each parameter its master rounded.
TEST(MasterWeights, Bf16ParameterTrainingConverges) {
  ag::manual_seed(50);
  ag::nn::Sequential model{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  model.to(DType::kBFloat16);
  const Regression data = make_regression(51, 128, 8, 0.05);
  const Tensor x = data.x.to(DType::kBFloat16), y = data.y.to(DType::kBFloat16);
  const double initial = eval_loss(model, data);
  ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
  for (int step = 0; step < 600; ++step) {
    adam.zero_grad();
    const Tensor loss = ag::ops::mse_loss(model(x), y);  // all BF16, no autocast, no scaler
    ASSERT_EQ(loss.dtype(), DType::kBFloat16);
    loss.backward();
    adam.step();
  }
  for (const Tensor& p : model.parameters()) {
    EXPECT_EQ(p.dtype(), DType::kBFloat16);
    EXPECT_EQ(bytes_of(p), bytes_of(p.master().to(DType::kBFloat16)));
  }
  const double final_loss = eval_loss(model, data);
  EXPECT_LT(final_loss, 0.05 * initial) << "initial " << initial << ", final " << final_loss;
}

// GradScaler with BF16 autocast is allowed (as in PyTorch) and changes nothing: BF16 has FP32's
// range, so a power-of-two scale neither rescues nor loses a gradient, every rounding commutes
// with it, and the unscaled FP32 gradients are bit for bit the unscaled-free ones. What it adds is
// a pass over the gradients and an inf/NaN check that skips a poisoned step.
TEST(MasterWeights, GradScalerWithBf16AutocastGivesTheSameBitsAsNoScaler) {
  const Regression data = make_regression(70, 64, 6, 0.1);
  auto train = [&](bool scaled) {
    ag::manual_seed(71);
    ag::nn::Sequential model{ag::nn::Linear(6, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1)};
    model[2].to(DType::kBFloat16);  // one BF16 layer (FP32 masters), one FP32 layer
    ag::optim::Adam adam(model.parameters(), {.lr = 1e-2});
    GradScaler scaler({.init_scale = 65536, .growth_interval = 5, .enabled = scaled});  // the scale moves
    for (int step = 0; step < 40; ++step) {
      adam.zero_grad();
      Tensor loss;
      {
        ag::amp::AutocastGuard autocast(Device::kCPU, DType::kBFloat16);
        loss = ag::ops::mse_loss(model(data.x), data.y);
      }
      scaler.scale(loss).backward();
      EXPECT_TRUE(scaler.step(adam));
      scaler.update();
    }
    if (scaled) {
      EXPECT_EQ(scaler.get_scale(), 65536.0 * 256);  // grew 8 times, never overflowed
    }
    std::vector<std::vector<uint8_t>> out;
    for (const Tensor& p : model.parameters()) out.push_back(bytes_of(p));
    return out;
  };
  EXPECT_EQ(train(true), train(false));
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
