// Why GradScaler skipped a step: an inf injected into one named layer's gradient (by an FP16
// overflow whose size is worked out by hand below) is traced to that layer, and an inf that was
// already in the forward (an activation, the loss, the scaled loss) is told apart from it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "amp/diagnostics/skip_report.h"
#include "amp/grad_scaler.h"
#include "framework/tensor.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "optim/sgd.h"

namespace ag = ampgrad;
namespace amp = ampgrad::amp;
using ag::DType;
using ag::Tensor;

namespace {

// Three 1-in 1-out layers "0", "1", "2" with weights w0, w1, w2 and zero biases, on x = 1 (64
// rows) with target 0. In FP16 autocast at loss scale S, with h0 = w0, h1 = w0 w1, out = w0 w1 w2:
//   loss = out^2, dout = S * 2 out / 64 per row,
//   d(2.weight) = 64 dout h1, d(2.bias) = 64 dout, dh1 = dout w2,
//   d(1.weight) = 64 dh1 h0,  d(1.bias) = 64 dh1,  dh0 = dh1 w1,  d(0.weight) = 64 dh0.
// FP16 stores a value >= 65520 as inf.
struct Chain {
  ag::nn::Sequential model{ag::nn::Linear(1, 1), ag::nn::Linear(1, 1), ag::nn::Linear(1, 1)};
  Tensor x = ag::ones({64, 1});
  Tensor y = ag::zeros({64, 1});

  explicit Chain(std::vector<float> weights) {
    for (auto& [name, p] : model.named_parameters()) {
      const bool is_weight = name.ends_with("weight");
      const float value = is_weight ? weights[static_cast<size_t>(name[0] - '0')] : 0.0f;
      p.set_data(Tensor::from_vector(std::vector<float>{value}, p.shape()));
    }
  }

  // One training step; returns whether the optimizer stepped.
  bool step(amp::GradScaler& scaler, ag::optim::SGD& opt, bool autocast = true) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard guard(ag::Device::kCPU, DType::kFloat16, autocast);
      loss = ag::ops::mse_loss(model(x), y);
    }
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    return stepped;
  }
};

std::vector<std::string> names_of(const amp::SkipReport& report) {
  std::vector<std::string> names;
  for (const amp::NonfiniteGrad& g : report.grads) names.push_back(g.name);
  return names;
}

TEST(SkipReport, NamesTheOneLayerWhoseGradientOverflowed) {
  // w = (200, 0.01, 1), S = 128: out = 2, dout = 128 * 4 / 64 = 8, dh1 = 8, dh0 = 0.08:
  // d(1.weight) = 64 * 8 * 200 = 102400 overflows; d(2.weight) = 1024, the biases 512,
  // d(0.weight) = 5.12 stay finite.
  Chain chain({200.0f, 0.01f, 1.0f});
  ag::optim::SGD opt(chain.model.parameters(), {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 128});
  scaler.set_parameter_names(chain.model.named_parameters());
  EXPECT_FALSE(chain.step(scaler, opt));
  const amp::SkipReport* report = scaler.last_skip();
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->iteration, 0);
  EXPECT_EQ(report->scale, 128.0);
  EXPECT_EQ(report->origin, amp::InfOrigin::kBackward);
  EXPECT_FLOAT_EQ(report->loss, 4.0);
  EXPECT_EQ(names_of(*report), std::vector<std::string>{"1.weight"});
  EXPECT_EQ(report->culprit(), "1.weight");
  EXPECT_EQ(report->grads[0].infs, 1);
  EXPECT_EQ(report->grads[0].numel, 1);
  const std::string text = report->to_string();
  EXPECT_NE(text.find("'1.weight'"), std::string::npos) << text;
  EXPECT_NE(text.find("backward"), std::string::npos) << text;

  // The scaler halved the scale; at 64, d(1.weight) = 51200 is finite: no new report.
  EXPECT_TRUE(chain.step(scaler, opt));
  EXPECT_EQ(scaler.last_skip()->iteration, 0);
}

TEST(SkipReport, ListsEveryAffectedParameterInBackwardOrder) {
  // The same chain at S = 2^14: dout = 1024, d(2.weight) = 131072 and d(2.bias) = 65536 overflow
  // first, then d(1.weight) = 64 * 1024 * 200 and d(1.bias) = 65536; d(0.weight) = 655.36 is finite.
  Chain chain({200.0f, 0.01f, 1.0f});
  ag::optim::SGD opt(chain.model.parameters(), {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 16384});
  scaler.set_parameter_names(chain.model.named_parameters());
  EXPECT_FALSE(chain.step(scaler, opt));
  const amp::SkipReport* report = scaler.last_skip();
  ASSERT_NE(report, nullptr);
  const std::vector<std::string> names = names_of(*report);
  ASSERT_EQ(names.size(), 4u) << report->to_string();
  // Layer 2 comes before layer 1 (the backward reaches it first), whatever the parameter order.
  EXPECT_EQ(names[0].substr(0, 2), "2.");
  EXPECT_EQ(names[1].substr(0, 2), "2.");
  EXPECT_EQ(names[2].substr(0, 2), "1.");
  EXPECT_EQ(names[3].substr(0, 2), "1.");
  EXPECT_EQ(report->culprit().substr(0, 2), "2.");
}

TEST(SkipReport, AGradientNoScaledLossReachesIsListedLast) {
  // The chain at S = 2^14 as above, plus `extra`, first in the optimizer, whose inf gradient was
  // set by hand rather than by a backward from a loss given to scale(): it comes after the four.
  Chain chain({200.0f, 0.01f, 1.0f});
  Tensor extra = ag::zeros({2});
  extra.set_requires_grad(true);
  std::vector<Tensor> params{extra};
  for (const Tensor& p : chain.model.parameters()) params.push_back(p);
  ag::optim::SGD opt(params, {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 16384});
  auto named = chain.model.named_parameters();
  named.emplace_back("extra", extra);
  scaler.set_parameter_names(named);
  Tensor loss;
  {
    amp::AutocastGuard guard(ag::Device::kCPU, DType::kFloat16);
    loss = ag::ops::mse_loss(chain.model(chain.x), chain.y);
  }
  scaler.scale(loss).backward();
  extra.set_grad(Tensor::from_vector(std::vector<float>{INFINITY, 0.0f}, {2}));
  EXPECT_FALSE(scaler.step(opt));
  const std::vector<std::string> names = names_of(*scaler.last_skip());
  ASSERT_EQ(names.size(), 5u) << scaler.last_skip()->to_string();
  EXPECT_EQ(names[0].substr(0, 2), "2.");
  EXPECT_EQ(names[3].substr(0, 2), "1.");
  EXPECT_EQ(names[4], "extra");
  EXPECT_EQ(scaler.last_skip()->grads[4].backward_order, 0u);
}

TEST(SkipReport, UnnamedParametersAreNumberedInTheirOptimizer) {
  Chain chain({200.0f, 0.01f, 1.0f});
  ag::optim::SGD opt(chain.model.parameters(), {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 128});
  EXPECT_FALSE(chain.step(scaler, opt));
  // parameters(): 0.weight, 0.bias, 1.weight, ...: 1.weight is the third.
  EXPECT_EQ(scaler.last_skip()->culprit(), "param2");
}

TEST(SkipReport, AnActivationAlreadyInfInTheForwardIsNamed) {
  // w0 = 1e5 overflows FP16 in layer 0's output: the forward is already inf.
  Chain chain({1e5f, 1.0f, 1.0f});
  ag::optim::SGD opt(chain.model.parameters(), {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 1});
  scaler.watch_forward(chain.model);
  EXPECT_FALSE(chain.step(scaler, opt));
  const amp::SkipReport* report = scaler.last_skip();
  ASSERT_NE(report, nullptr);
  EXPECT_EQ(report->origin, amp::InfOrigin::kForwardActivation);
  EXPECT_EQ(report->module, "0");  // the inner module, before the Sequential that holds it
  EXPECT_NE(report->to_string().find("module '0'"), std::string::npos) << report->to_string();

  // Without the watch the same step is traced to the loss.
  scaler.unwatch_forward();
  EXPECT_FALSE(chain.step(scaler, opt));
  EXPECT_EQ(scaler.last_skip()->iteration, 1);
  EXPECT_EQ(scaler.last_skip()->origin, amp::InfOrigin::kForwardLoss);
  EXPECT_TRUE(std::isinf(scaler.last_skip()->loss));
}

TEST(SkipReport, AScaledLossThatOverflowsFloat32) {
  // FP32 throughout, loss 4 (out = 2), scale 2^126: 4 * 2^126 = 2^128 overflows float32.
  Chain chain({2.0f, 1.0f, 1.0f});
  ag::optim::SGD opt(chain.model.parameters(), {.lr = 0.0});
  amp::GradScaler scaler({.init_scale = 0x1p126});
  EXPECT_FALSE(chain.step(scaler, opt, /*autocast=*/false));
  ASSERT_NE(scaler.last_skip(), nullptr);
  EXPECT_EQ(scaler.last_skip()->origin, amp::InfOrigin::kScaledLoss);
  EXPECT_FLOAT_EQ(scaler.last_skip()->loss, 4.0);
}

TEST(SkipReport, NoneWithoutASkip) {
  Chain chain({0.5f, 0.5f, 0.5f});
  ag::optim::SGD opt(chain.model.parameters(), {.lr = 0.01});
  amp::GradScaler scaler({.init_scale = 1024});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(chain.step(scaler, opt));
  EXPECT_EQ(scaler.last_skip(), nullptr);
  EXPECT_EQ(scaler.grad_stats(), nullptr);  // statistics are off by default
  EXPECT_EQ(scaler.iteration(), 3);
}

}  // namespace
