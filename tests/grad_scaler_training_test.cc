// GradScaler on real models: skipped steps leave parameters, masters and optimizer state
// bit-identical, unscale_ + clip_grad_norm_ sees true gradients, and a long run with injected
// inf/NaN gradients skips exactly the poisoned steps and still converges.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

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

namespace {

using Bytes = std::vector<uint8_t>;

// A small MLP whose last layer is FP16 (so masters are involved), trained under autocast.
ag::nn::Sequential mixed_mlp(uint64_t seed) {
  ag::manual_seed(seed);
  ag::nn::Sequential model{ag::nn::Linear(4, 8), ag::nn::ReLU(), ag::nn::Linear(8, 1)};
  model[2].to(DType::kFloat16);
  return model;
}

// Forward under autocast and a scaled backward; returns the (unscaled) loss.
double forward_backward(ag::nn::Module& model, ag::optim::Optimizer& opt, GradScaler& scaler,
                        const ag::amp_testing::Regression& data) {
  opt.zero_grad();
  Tensor loss;
  {
    ag::amp::AutocastGuard autocast(Device::kCPU, DType::kFloat16);
    loss = ag::ops::mse_loss(model(data.x), data.y);
  }
  scaler.scale(loss).backward();
  return loss.item();
}

// Writes `value` into element `index` of a gradient of either float dtype.
void poison(Tensor grad, int64_t index, float value) {
  if (grad.dtype() == DType::kFloat16) {
    grad.data<ag::Half>()[index] = ag::float_to_half(value);
  } else {
    grad.data<float>()[index] = value;
  }
  grad.bump_version();
}

// The bytes of every parameter and every FP32 master (what a step writes).
std::vector<Bytes> weights_snapshot(const ag::optim::Optimizer& opt) {
  std::vector<Bytes> out;
  for (const Tensor& p : opt.parameters()) {
    out.push_back(bytes_of(p));
    if (p.master().defined()) out.push_back(bytes_of(p.master()));
  }
  return out;
}

TEST(GradScalerSkip, SkippedSgdStepLeavesWeightsMastersAndMomentumBitIdentical) {
  ag::nn::Sequential model = mixed_mlp(20);
  const auto data = ag::amp_testing::make_regression(21, 16, 4, 0.1);
  ag::optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler({.init_scale = 256, .growth_interval = 1000});
  for (int i = 0; i < 3; ++i) {
    forward_backward(model, sgd, scaler, data);
    ASSERT_TRUE(scaler.step(sgd));
    scaler.update();
  }
  const auto weights = weights_snapshot(sgd);
  std::vector<Bytes> momentum;
  for (size_t i = 0; i < sgd.parameters().size(); ++i) momentum.push_back(bytes_of(sgd.momentum_buffer(i)));

  forward_backward(model, sgd, scaler, data);
  poison(sgd.parameters()[3].grad(), 0, std::numeric_limits<float>::infinity());  // the FP16 bias
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 128.0);
  EXPECT_EQ(weights_snapshot(sgd), weights);
  for (size_t i = 0; i < sgd.parameters().size(); ++i) {
    EXPECT_EQ(bytes_of(sgd.momentum_buffer(i)), momentum[i]) << "momentum of parameter " << i;
    const Tensor master = sgd.parameters()[i].master();
    if (master.defined()) {
      EXPECT_FALSE(master.grad().defined()) << "a skipped step must not leave FP32 grads";
    }
  }
  forward_backward(model, sgd, scaler, data);  // and the next clean step does move things
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_NE(weights_snapshot(sgd), weights);
}

TEST(GradScalerSkip, SkippedAdamStepOnAGenuineOverflowLeavesMomentsAndStepCountBitIdentical) {
  ag::nn::Sequential model = mixed_mlp(22);
  const auto data = ag::amp_testing::make_regression(23, 16, 4, 0.1);
  ag::optim::Adam adam(model.parameters(), {.lr = 1e-2});
  GradScaler scaler({.init_scale = 1024, .growth_interval = 1000});
  for (int i = 0; i < 3; ++i) {
    forward_backward(model, adam, scaler, data);
    ASSERT_TRUE(scaler.step(adam));
    scaler.update();
  }
  const auto weights = weights_snapshot(adam);
  std::vector<Bytes> moments;
  for (size_t i = 0; i < adam.parameters().size(); ++i) {
    EXPECT_EQ(adam.state(i).step, 3);
    moments.push_back(bytes_of(adam.state(i).exp_avg));
    moments.push_back(bytes_of(adam.state(i).exp_avg_sq));
  }
  scaler.update(1e30);  // the FP32 loss * 1e30 is finite, but its FP16 gradients overflow
  forward_backward(model, adam, scaler, data);
  EXPECT_FALSE(scaler.step(adam));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 5e29);
  EXPECT_EQ(weights_snapshot(adam), weights);
  for (size_t i = 0; i < adam.parameters().size(); ++i) {
    EXPECT_EQ(adam.state(i).step, 3) << i;
    EXPECT_EQ(bytes_of(adam.state(i).exp_avg), moments[2 * i]) << i;
    EXPECT_EQ(bytes_of(adam.state(i).exp_avg_sq), moments[2 * i + 1]) << i;
  }
}

TEST(GradScalerClip, UnscaleThenClipGradNormSeesTheTrueGradientsOfFp32AndFp16Parameters) {
  Tensor p32 = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor p16 = Tensor::from_vector(std::vector<float>{1, 1}, {2}, DType::kFloat16);
  p32.set_requires_grad(true);
  p16.set_requires_grad(true);
  ag::optim::SGD sgd({p32, p16}, {.lr = 1.0});
  GradScaler scaler({.init_scale = 1024});
  const Tensor c32 = Tensor::from_vector(std::vector<float>{3, 0, 4}, {3});
  const Tensor c16 = Tensor::from_vector(std::vector<float>{0, 12}, {2}, DType::kFloat16);
  // d/dp32 = c32 and d/dp16 = c16: unscaled norm sqrt(9 + 16 + 144) = 13.
  scaler.scale(ag::ops::sum(p32 * c32) + ag::ops::sum(p16 * c16)).backward();
  EXPECT_EQ(p16.grad().to_vector(), (std::vector<float>{0, 12 * 1024}));  // scaled, in FP16
  scaler.unscale_(sgd);
  EXPECT_EQ(p32.grad().to_vector(), (std::vector<float>{3, 0, 4}));
  EXPECT_EQ(p16.master().grad().dtype(), DType::kFloat32);
  EXPECT_EQ(p16.master().grad().to_vector(), (std::vector<float>{0, 12}));

  EXPECT_NEAR(ag::nn::utils::clip_grad_norm_({p32, p16}, 6.5), 13.0, 1e-9);
  EXPECT_TRUE(scaler.step(sgd));  // uses the clipped gradients (halved), not unscaled twice
  scaler.update();
  const std::vector<float> w32 = p32.to_vector(), w16 = p16.master().to_vector();
  EXPECT_NEAR(w32[0], 1 - 1.5, 1e-5);
  EXPECT_NEAR(w32[1], 2, 1e-5);
  EXPECT_NEAR(w32[2], 3 - 2, 1e-5);
  EXPECT_NEAR(w16[0], 1, 1e-5);
  EXPECT_NEAR(w16[1], 1 - 6, 1e-5);
  EXPECT_EQ(p16.to_vector(), (std::vector<float>{1, -5}));
}

TEST(GradScalerFaultInjection, PoisonedStepsAreSkippedAndTrainingStillConverges) {
  ag::manual_seed(30);
  ag::nn::Sequential model{ag::nn::Linear(8, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  const auto data = ag::amp_testing::make_regression(31, 128, 8, 0.05);
  const double initial_loss = ag::amp_testing::eval_loss(model, data);
  ag::optim::Adam adam(model.parameters(), {.lr = 3e-3});
  const int64_t interval = 10;
  GradScaler scaler({.init_scale = 65536, .growth_interval = interval});
  std::mt19937 rng(32);
  std::bernoulli_distribution inject(0.02);  // rare enough that growth outpaces backoff
  const float poisons[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};

  int injected = 0, genuine = 0;
  double expected_scale = 65536;
  int64_t expected_tracker = 0;
  for (int step = 0; step < 2000; ++step) {
    forward_backward(model, adam, scaler, data);
    const std::vector<Tensor> params = model.parameters();
    bool overflow = false;
    for (const Tensor& p : params) overflow = overflow || !ag::test::all_finite(p.grad());
    const bool poisoned = inject(rng);
    if (poisoned) {
      const Tensor& victim = params[std::uniform_int_distribution<size_t>(0, params.size() - 1)(rng)];
      const int64_t index = std::uniform_int_distribution<int64_t>(0, victim.numel() - 1)(rng);
      poison(victim.grad(), index, poisons[std::uniform_int_distribution<int>(0, 2)(rng)]);
    }
    injected += poisoned;
    genuine += overflow && !poisoned;
    const bool stepped = scaler.step(adam);
    ASSERT_EQ(stepped, !(poisoned || overflow)) << "step " << step;
    scaler.update();
    // The rule, replayed alongside.
    if (!stepped) {
      expected_scale *= 0.5;
      expected_tracker = 0;
    } else if (++expected_tracker == interval) {
      expected_scale *= 2;
      expected_tracker = 0;
    }
    ASSERT_EQ(scaler.get_scale(), expected_scale) << "step " << step;
    for (const Tensor& p : params) ASSERT_TRUE(ag::test::all_finite(p)) << "step " << step;
  }
  EXPECT_GT(injected, 25);
  // Growth outpaces the injected backoffs, so the scale climbs until FP16 gradients genuinely
  // overflow, and settles there: well above 1, never collapsing.
  EXPECT_GT(genuine, 0);
  EXPECT_GE(scaler.get_scale(), 1024.0);
  const double final_loss = ag::amp_testing::eval_loss(model, data);
  EXPECT_LT(final_loss, 0.05 * initial_loss) << "initial " << initial_loss << ", final " << final_loss;
  EXPECT_LT(final_loss, 0.02);
}

}  // namespace
