// Optimizers: SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW against PyTorch's
// update formulas evaluated in double, zero_grad, option validation, and an MLP that learns.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Tensor;
using agt::throws_error;
using Values = std::vector<double>;

namespace {

constexpr int kSteps = 6;
constexpr size_t kSize = 7;

// The gradient fed at step t: fixed values of both signs and a few magnitudes.
Values grad_at(int t) { return agt::random_values(kSize, -3.0, 3.0, 100 + t); }

// Runs kSteps of `opt` on one parameter (initial values w0), setting the gradient directly, and
// compares every step with `reference(w, g, t)` (t = 1, 2, ...), which updates w in double.
void expect_matches_reference(const std::function<std::unique_ptr<ag::optim::Optimizer>(const Tensor&)>& make,
                              const std::function<void(Values& w, const Values& g, int t)>& reference) {
  Values w = agt::random_values(kSize, -1.0, 1.0, 5);
  Tensor param = Tensor::from_vector(w, {static_cast<int64_t>(kSize)}, DType::kFloat32);
  param.set_requires_grad(true);
  for (double& v : w) v = static_cast<float>(v);  // the reference starts from the float32 values
  const std::unique_ptr<ag::optim::Optimizer> opt = make(param);
  for (int t = 1; t <= kSteps; ++t) {
    const Values g = grad_at(t);
    param.set_grad(Tensor::from_vector(g, param.shape(), DType::kFloat32));
    Values g32 = g;
    for (double& v : g32) v = static_cast<float>(v);
    opt->step();
    reference(w, g32, t);
    const Values got = param.to_double_vector();
    for (size_t i = 0; i < kSize; ++i) {
      // float32 arithmetic against double: ~1e-6 relative, with an absolute floor for values near 0.
      ASSERT_NEAR(got[i], w[i], 1e-6 * std::abs(w[i]) + 1e-7) << "step " << t << ", element " << i;
    }
  }
}

struct SgdCase {
  const char* name;
  ag::optim::SGDOptions options;
};

TEST(Optim, SgdMatchesPyTorchFormula) {
  const SgdCase cases[] = {
      {"plain", {.lr = 0.1}},
      {"weight_decay", {.lr = 0.05, .weight_decay = 0.1}},
      {"momentum", {.lr = 0.1, .momentum = 0.9}},
      {"dampening", {.lr = 0.1, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01}},
      {"nesterov", {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.02, .nesterov = true}},
  };
  for (const SgdCase& c : cases) {
    SCOPED_TRACE(c.name);
    const ag::optim::SGDOptions o = c.options;
    Values buf;  // the momentum buffer, created on the first step (torch.optim.SGD)
    expect_matches_reference(
        [&](const Tensor& p) { return std::make_unique<ag::optim::SGD>(std::vector<Tensor>{p}, o); },
        [&](Values& w, const Values& g, int t) {
          if (t == 1) buf.assign(kSize, 0.0);
          for (size_t i = 0; i < kSize; ++i) {
            double d = g[i] + o.weight_decay * w[i];
            if (o.momentum != 0) {
              buf[i] = t == 1 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
              d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
            }
            w[i] -= o.lr * d;
          }
        });
  }
}

// torch.optim.Adam / AdamW: bias-corrected moments, eps outside the square root.
void adam_reference(Values& w, Values& m, Values& v, const Values& g, int t, const ag::optim::AdamOptions& o,
                    bool decoupled) {
  if (t == 1) {
    m.assign(kSize, 0.0);
    v.assign(kSize, 0.0);
  }
  for (size_t i = 0; i < kSize; ++i) {
    double gi = g[i];
    if (decoupled) {
      w[i] *= 1 - o.lr * o.weight_decay;
    } else {
      gi += o.weight_decay * w[i];
    }
    m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
    v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    w[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
  }
}

TEST(Optim, AdamMatchesPyTorchFormula) {
  const ag::optim::AdamOptions cases[] = {
      {.lr = 1e-2},
      {.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.1},
  };
  for (const ag::optim::AdamOptions& o : cases) {
    SCOPED_TRACE(o.weight_decay);
    Values m, v;
    expect_matches_reference(
        [&](const Tensor& p) { return std::make_unique<ag::optim::Adam>(std::vector<Tensor>{p}, o); },
        [&](Values& w, const Values& g, int t) { adam_reference(w, m, v, g, t, o, false); });
  }
}

TEST(Optim, AdamWMatchesPyTorchFormula) {
  const ag::optim::AdamWOptions o{.lr = 0.05, .beta1 = 0.85, .weight_decay = 0.2};
  const ag::optim::AdamOptions same{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay};
  Values m, v;
  expect_matches_reference(
      [&](const Tensor& p) { return std::make_unique<ag::optim::AdamW>(std::vector<Tensor>{p}, o); },
      [&](Values& w, const Values& g, int t) { adam_reference(w, m, v, g, t, same, true); });
  EXPECT_EQ(ag::optim::AdamWOptions{}.weight_decay, 1e-2);  // PyTorch's AdamW default
}

TEST(Optim, AdamStateAndParametersWithoutGradients) {
  Tensor a = ag::ones({3}), b = ag::ones({2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  ag::optim::Adam adam({a, b}, {.lr = 0.1});
  a.set_grad(ag::ones({3}));
  adam.step();  // b has no gradient: skipped, no state
  EXPECT_EQ(adam.state(0).step, 1);
  EXPECT_EQ(adam.state(1).step, 0);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{1, 1}));
  EXPECT_NEAR(a.to_vector()[0], 0.9, 1e-6);  // the first Adam step moves by lr * sign(g)
}

TEST(Optim, ZeroGradClearsGradients) {
  Tensor p = ag::ones({2});
  p.set_requires_grad(true);
  ag::optim::SGD sgd({p}, {.lr = 0.1});
  ag::ops::sum(p * p).backward();
  ASSERT_TRUE(p.grad().defined());
  sgd.zero_grad();
  EXPECT_FALSE(p.grad().defined());
  sgd.step();  // nothing to do without gradients
  EXPECT_EQ(p.to_vector(), (std::vector<float>{1, 1}));
  ag::ops::sum(p * p).backward();  // the next backward starts afresh (no accumulation into old grads)
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{2, 2}));
}

TEST(Optim, StepHooksRunBeforeAndAfterTheUpdateInOrderUntilRemoved) {
  Tensor p = ag::ones({2});
  p.set_requires_grad(true);
  ag::optim::SGD sgd({p}, {.lr = 0.5});
  std::vector<std::string> calls;
  const size_t first = sgd.register_step_pre_hook([&](ag::optim::Optimizer& o) {
    calls.push_back("pre1 " + std::to_string(o.steps_taken()) + " " + std::to_string(p.to_vector()[0]));
  });
  sgd.register_step_pre_hook([&](ag::optim::Optimizer&) { calls.push_back("pre2"); });
  const size_t post = sgd.register_step_post_hook([&](ag::optim::Optimizer& o) {
    calls.push_back("post " + std::to_string(o.steps_taken()) + " " + std::to_string(p.to_vector()[0]));
  });
  ag::ops::sum(p * p).backward();  // grad 2: the step moves 1 to 0
  sgd.step();
  EXPECT_EQ(calls, (std::vector<std::string>{"pre1 0 1.000000", "pre2", "post 1 0.000000"}));
  sgd.remove_step_hook(first);
  sgd.remove_step_hook(post);
  sgd.remove_step_hook(12345);  // unknown: ignored
  calls.clear();
  sgd.step();
  EXPECT_EQ(calls, (std::vector<std::string>{"pre2"}));
  EXPECT_ERROR([&] { sgd.register_step_post_hook(nullptr); }, "SGD::register_step_post_hook: the hook is empty");
}

TEST(Optim, OptionsAreValidated) {
  Tensor p = ag::ones({2});
  p.set_requires_grad(true);
  const std::vector<Tensor> ps{p};
  using ag::optim::Adam, ag::optim::AdamW, ag::optim::SGD;
  EXPECT_TRUE(throws_error([&] { SGD(ps, {.lr = -0.5}); }, {"learning rate", "-0.5"}));
  EXPECT_TRUE(throws_error([&] { SGD(ps, {.lr = 0.1, .momentum = -0.9}); }, {"momentum", "-0.9"}));
  EXPECT_TRUE(throws_error([&] { SGD(ps, {.lr = 0.1, .weight_decay = -1}); }, {"weight_decay", "-1"}));
  EXPECT_TRUE(throws_error([&] { SGD(ps, {.lr = 0.1, .nesterov = true}); }, {"nesterov", "momentum 0"}));
  EXPECT_TRUE(throws_error([&] { SGD(ps, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
                           {"nesterov", "dampening 0.1"}));
  EXPECT_TRUE(throws_error([&] { Adam(ps, {.lr = -1e-3}); }, {"learning rate", "-0.001"}));
  EXPECT_TRUE(throws_error([&] { Adam(ps, {.beta1 = 1}); }, {"Adam", "beta1", "got 1"}));
  EXPECT_TRUE(throws_error([&] { Adam(ps, {.beta2 = -0.1}); }, {"Adam", "beta2", "-0.1"}));
  EXPECT_TRUE(throws_error([&] { Adam(ps, {.eps = -1e-8}); }, {"Adam", "eps", "-1e-08"}));
  EXPECT_TRUE(throws_error([&] { Adam(ps, {.weight_decay = -0.01}); }, {"Adam", "weight_decay", "-0.01"}));
  EXPECT_TRUE(throws_error([&] { AdamW(ps, {.beta1 = 1.5}); }, {"AdamW", "beta1", "1.5"}));
  EXPECT_TRUE(throws_error([&] { SGD(ps, {.lr = std::nan("")}); }, {"learning rate", "nan"}));
  SGD sgd(ps, {.lr = 0.1});
  EXPECT_TRUE(throws_error([&] { sgd.set_lr(-2); }, {"learning rate", "-2"}));
  EXPECT_EQ(sgd.lr(), 0.1);
  // Parameters must be distinct leaves of float32 or float16.
  EXPECT_TRUE(throws_error([&] { SGD({p, p}, {}); }, {"same tensor"}));
  EXPECT_TRUE(throws_error([&] { SGD({p * 2.0f}, {}); }, {"produced by an op"}));
  EXPECT_TRUE(throws_error([&] { SGD({Tensor()}, {}); }, {"undefined"}));
}

TEST(Optim, MlpLearnsASmoothFunction) {
  // y = sin(x1) + x2^2 on 256 fixed points in [-1.5, 1.5]^2; target variance ~0.8.
  ag::manual_seed(2024);
  const int64_t n = 256;
  const Tensor x = ag::uniform({n, 2}, -1.5, 1.5);
  const std::vector<float> xv = x.to_vector();
  std::vector<float> yv(n);
  for (int64_t i = 0; i < n; ++i) yv[i] = std::sin(xv[2 * i]) + xv[2 * i + 1] * xv[2 * i + 1];
  const Tensor y = Tensor::from_vector(yv, {n, 1});

  ag::nn::Sequential model{ag::nn::Linear(2, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  ag::optim::Adam opt(model.parameters(), {.lr = 1e-2});
  const float initial = ag::ops::mse_loss(model(x), y).item();
  float loss = initial;
  for (int step = 0; step < 2000; ++step) {
    opt.zero_grad();
    const Tensor l = ag::ops::mse_loss(model(x), y);
    loss = l.item();
    l.backward();
    opt.step();
  }
  ::testing::Test::RecordProperty("final_mse", std::to_string(loss));
  EXPECT_GT(initial, 0.3f);  // the task is not trivially solved at initialisation
  EXPECT_LT(loss, 0.01f);
}

}  // namespace
