// Optimizer parameter groups: per-group options match separate optimizers bit for bit,
// add_param_group, one source of truth for lr, and every option saved and restored (PyTorch's
// load_state_dict restores the saved options, lr included).
#include <gtest/gtest.h>

#include <vector>

#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/module.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace optim = ampgrad::optim;
using ag::Tensor;
using ag::test::throws_error;

namespace {

Tensor param(const std::vector<float>& values) {
  Tensor p = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  p.set_requires_grad(true);
  return p;
}

// Gives every parameter the gradient sum(p * c) would, for a fixed c per step.
void set_grads(const std::vector<Tensor>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    Tensor p = ps[i];
    const std::vector<double> g = ag::test::random_values(static_cast<size_t>(p.numel()), -2, 2, 40 + 7 * step + i);
    p.set_grad(Tensor::from_vector(g, p.shape(), ag::DType::kFloat32));
  }
}

TEST(ParamGroups, EachGroupUpdatesAsItsOwnOptimizerWould) {
  // AdamW without weight decay on biases: the usual transformer recipe.
  const optim::AdamWOptions decay{.lr = 0.01, .weight_decay = 0.1};
  optim::AdamWOptions no_decay = decay;
  no_decay.weight_decay = 0.0;
  const std::vector<float> w0{0.5f, -1.0f, 2.0f}, b0{0.25f, 1.5f};
  Tensor w = param(w0), b = param(b0), w_alone = param(w0), b_alone = param(b0);
  optim::AdamW grouped({{.params = {w}}, {.params = {b}, .options = no_decay}}, decay);
  optim::AdamW only_w({w_alone}, decay), only_b({b_alone}, no_decay);
  EXPECT_EQ(grouped.num_param_groups(), 2u);
  EXPECT_EQ(grouped.options(0).weight_decay, 0.1);
  EXPECT_EQ(grouped.options(1).weight_decay, 0.0);
  EXPECT_EQ(grouped.param_group_of(1), 1u);
  for (int step = 0; step < 5; ++step) {
    set_grads({w, b}, step);
    set_grads({w_alone, b_alone}, step);
    grouped.step();
    only_w.step();
    only_b.step();
  }
  EXPECT_EQ(w.to_vector(), w_alone.to_vector());  // exact: the same float operations
  EXPECT_EQ(b.to_vector(), b_alone.to_vector());
  EXPECT_NE(w.to_vector(), Tensor::from_vector(w0, {3}).to_vector());
}

TEST(ParamGroups, AddParamGroup) {
  Tensor a = param({1, 2}), b = param({3}), c = param({4});
  optim::SGD sgd({a}, {.lr = 0.1, .momentum = 0.9});
  sgd.add_param_group({.params = {b}, .options = optim::SGDOptions{.lr = 0.5}});
  sgd.add_param_group({.params = {c}});  // the defaults: the options given at construction
  EXPECT_EQ(sgd.num_param_groups(), 3u);
  EXPECT_EQ(sgd.parameters().size(), 3u);
  EXPECT_TRUE(sgd.group_parameters(1)[0].is_same(b));
  EXPECT_EQ(sgd.options(1).lr, 0.5);
  EXPECT_EQ(sgd.options(1).momentum, 0.0);
  EXPECT_EQ(sgd.options(2).momentum, 0.9);
  set_grads({a, b, c}, 0);
  const float gb = b.grad().to_vector()[0];
  sgd.step();
  EXPECT_FLOAT_EQ(b.to_vector()[0], 3 - 0.5f * gb);
  EXPECT_TRUE(sgd.momentum_buffer(2).defined());
  EXPECT_FALSE(sgd.momentum_buffer(1).defined());

  // A parameter in two groups would be stepped twice (PyTorch raises too); a refused group changes nothing.
  Tensor d = param({5});
  EXPECT_TRUE(throws_error([&] { sgd.add_param_group({.params = {d, a}}); }, {"SGD", "parameter 4", "same tensor as parameter 0"}));
  EXPECT_TRUE(throws_error([&] { sgd.add_param_group({.params = {d}, .options = optim::SGDOptions{.lr = -1}}); },
                           {"SGD", "learning rate", "-1"}));
  EXPECT_EQ(sgd.parameters().size(), 3u);
  EXPECT_EQ(sgd.num_param_groups(), 3u);
  EXPECT_TRUE(throws_error([&] { sgd.options(3); }, {"no parameter group 3"}));
  EXPECT_TRUE(throws_error([&] { sgd.param_group_of(3); }, {"no parameter 3"}));
}

TEST(ParamGroups, AnOptimizerNeedsParameters) {
  // PyTorch: "optimizer got an empty parameter list".
  EXPECT_TRUE(throws_error([] { optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}); }, {"SGD", "empty parameter list"}));
  EXPECT_TRUE(throws_error([] { optim::Adam(std::vector<optim::ParamGroup<optim::AdamOptions>>{}); },
                           {"Adam", "empty parameter list"}));
  ag::nn::Sequential nothing{ag::nn::ReLU()};
  EXPECT_TRUE(throws_error([&] { optim::AdamW(nothing.parameters(), {}); }, {"AdamW", "empty parameter list"}));
}

TEST(ParamGroups, LrHasOneSourceOfTruth) {
  Tensor a = param({1}), b = param({2});
  optim::Adam adam({{.params = {a}}, {.params = {b}, .options = optim::AdamOptions{.lr = 0.5}}}, {.lr = 0.1});
  adam.set_lr(0.02);  // every group
  EXPECT_EQ(adam.lr(0), 0.02);
  EXPECT_EQ(adam.options(0).lr, 0.02);
  EXPECT_EQ(adam.options(1).lr, 0.02);
  adam.set_lr(1, 0.3);
  EXPECT_EQ(adam.options(1).lr, 0.3);
  EXPECT_EQ(adam.lr(1), 0.3);
  EXPECT_EQ(adam.lr(0), 0.02);
  optim::AdamOptions o = adam.options(0);
  o.lr = 0.04;
  adam.set_options(0, o);
  EXPECT_EQ(adam.lr(0), 0.04);
  // A bad lr changes no group.
  EXPECT_TRUE(throws_error([&] { adam.set_lr(-1); }, {"Adam", "learning rate", "-1"}));
  EXPECT_EQ(adam.lr(0), 0.04);
  EXPECT_EQ(adam.lr(1), 0.3);
  o.beta1 = 2;
  EXPECT_TRUE(throws_error([&] { adam.set_options(0, o); }, {"Adam", "beta1", "2"}));
  EXPECT_EQ(adam.options(0).beta1, 0.9);
}

TEST(ParamGroups, SavedOptionsReplaceTheConstructedOnes) {
  // PyTorch's load_state_dict restores the saved param_groups options: SGD(momentum=0.9)'s state
  // loaded into SGD(momentum=0) gives momentum 0.9, and the two then step identically.
  Tensor p = param({1, -2, 3}), q = param({1, -2, 3});
  optim::SGD source({p}, {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  set_grads({p}, 0);
  source.step();
  optim::SGD target({q}, {.lr = 0.2});
  q.set_data(p.detach().to(ag::DType::kFloat32) * 1.0f);
  target.load_state(source.state());
  target.load_param_group_state(source.param_group_state());
  EXPECT_EQ(target.options().momentum, 0.9);
  EXPECT_EQ(target.options().dampening, 0.1);
  EXPECT_EQ(target.options().weight_decay, 0.01);
  EXPECT_EQ(target.lr(), 0.05);
  for (int step = 1; step < 4; ++step) {
    set_grads({p}, step);
    set_grads({q}, step);
    source.step();
    target.step();
  }
  EXPECT_EQ(q.to_vector(), p.to_vector());

  // Refusals: group count or size, a missing or unknown option, a bad value; nothing changes.
  std::vector<optim::GroupState> saved = source.param_group_state();
  EXPECT_EQ(saved[0].options.at("nesterov"), 0.0);
  optim::SGD fresh({param({0, 0, 0})}, {.lr = 0.3});
  auto expect_refused = [&](const std::vector<optim::GroupState>& groups, std::initializer_list<std::string_view> what) {
    EXPECT_TRUE(throws_error([&] { fresh.load_param_group_state(groups); }, what));
    EXPECT_EQ(fresh.lr(), 0.3);
    EXPECT_EQ(fresh.options().momentum, 0.0);
  };
  expect_refused({saved[0], saved[0]}, {"SGD", "2 parameter groups", "has 1"});
  std::vector<optim::GroupState> bad = saved;
  bad[0].num_params = 2;
  expect_refused(bad, {"group 0", "2 parameters"});
  bad = saved;
  bad[0].options.erase("dampening");
  expect_refused(bad, {"SGD", "no 'dampening'"});
  bad = saved;
  bad[0].options["beta1"] = 0.9;
  expect_refused(bad, {"SGD", "unknown option 'beta1'"});
  bad = saved;
  bad[0].options["lr"] = -0.5;
  expect_refused(bad, {"SGD", "learning rate", "-0.5"});
  bad = saved;
  bad[0].options["nesterov"] = 1;  // nesterov with dampening 0.1
  expect_refused(bad, {"SGD", "nesterov"});
}

}  // namespace
