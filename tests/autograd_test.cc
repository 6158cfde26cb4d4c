// The tape: gradient accumulation, retained and consumed graphs, misuse errors, NoGradGuard,
// in-place modification of saved tensors, diamonds, gradient dtypes, steady memory in a loop, and
// post-accumulate-grad hooks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/copy.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::RetainGraph;
using ag::Tensor;
using ag::test::throws_error;

namespace {

Tensor leaf(const std::vector<float>& values, DType dtype = DType::kFloat32) {
  Tensor t = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, dtype);
  t.set_requires_grad(true);
  return t;
}

TEST(Autograd, GradientsAccumulateAcrossBackwards) {
  Tensor x = leaf({1, -2, 3});
  ag::ops::sum(x * x).backward();  // d/dx = 2x
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, -4, 6}));
  const Tensor first_grad = x.grad();
  ag::ops::sum(x * 3.0f).backward();  // += 3
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5, -1, 9}));
  EXPECT_TRUE(x.grad().is_same(first_grad));  // accumulated in place, as PyTorch's +=
}

TEST(Autograd, RetainedGraphCanBackpropagateAgain) {
  Tensor x = leaf({1, 2});
  const Tensor loss = ag::ops::sum(x * x * x);  // d/dx = 3x^2
  loss.backward(Tensor(), RetainGraph::kYes);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{3, 12}));
  loss.backward(Tensor(), RetainGraph::kYes);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{6, 24}));
  loss.backward();  // the last one may free the graph
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{9, 36}));
}

TEST(Autograd, ConsumedGraphThrowsOnSecondBackward) {
  Tensor x = leaf({1, 2});
  const Tensor loss = ag::ops::sum(x * x);
  loss.backward();
  EXPECT_TRUE(throws_error([&] { loss.backward(); }, {"mul", "already consumed", "RetainGraph::kYes"}));
}

TEST(Autograd, MisuseOfBackwardThrows) {
  Tensor x = leaf({1, 2, 3});
  const Tensor y = x * 2.0f;
  EXPECT_TRUE(throws_error([&] { y.backward(); }, {"one-element", "[3]"}));
  EXPECT_TRUE(throws_error([&] { y.backward(ag::ones({2})); }, {"[2]", "[3]"}));
  const Tensor plain = ag::ones({1});
  EXPECT_TRUE(throws_error([&] { plain.backward(); }, {"does not require grad"}));
  EXPECT_TRUE(throws_error([&] { (ag::ones({2}) * ag::ones({2})).backward(ag::ones({2})); }, {"does not require grad"}));
}

TEST(Autograd, BackwardWithExplicitGradForNonScalars) {
  Tensor x = leaf({1, 2, 3});
  const Tensor y = x * 2.0f;
  y.backward(Tensor::from_vector(std::vector<float>{1, 10, 100}, {3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 20, 200}));
  // A gradient of another dtype is converted to the output's.
  Tensor z = leaf({1, 2});
  (z * z).backward(Tensor::from_vector(std::vector<double>{1, 1}, {2}));
  EXPECT_EQ(z.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(z.grad().to_vector(), (std::vector<float>{2, 4}));
  // backward on a leaf itself accumulates the seed.
  Tensor w = leaf({5});
  w.backward();
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{1}));
}

TEST(Autograd, LeafGradientsNeverAliasAnotherTensor) {
  // A first gradient is taken without a copy only when nothing else holds it. Here one buffer
  // flows to two leaves (add passes its gradient through) and a seed the caller keeps.
  Tensor x = leaf({1, 2}), y = leaf({3, 4});
  const Tensor seed = Tensor::from_vector(std::vector<float>{1, 1}, {2});
  (x + y).backward(seed);
  Tensor gx = x.grad();
  ag::fill_(gx, 7.0);
  EXPECT_EQ(y.grad().to_vector(), (std::vector<float>{1, 1}));
  EXPECT_EQ(seed.to_vector(), (std::vector<float>{1, 1}));
  // backward on a leaf with a kept seed: the leaf gets its own buffer.
  Tensor w = leaf({5, 6});
  w.backward(seed);
  Tensor gw = w.grad();
  ag::fill_(gw, 9.0);
  EXPECT_EQ(seed.to_vector(), (std::vector<float>{1, 1}));
  // A fresh gradient (from mul's backward) becomes the grad; later backwards accumulate into it.
  Tensor v = leaf({2, 3});
  (v * 2.0f).backward(seed);
  const Tensor first = v.grad();
  (v * 2.0f).backward(seed);
  EXPECT_TRUE(v.grad().is_same(first));
  EXPECT_EQ(v.grad().to_vector(), (std::vector<float>{4, 4}));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = leaf({1, 2});
  {
    ag::NoGradGuard no_grad;
    EXPECT_FALSE(ag::GradMode::is_enabled());
    const Tensor y = ag::ops::sum(ag::ops::relu(x * x + 1.0f));
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(throws_error([&] { y.backward(); }, {"does not require grad", "NoGradGuard"}));
    {
      ag::NoGradGuard nested;
    }
    EXPECT_FALSE(ag::GradMode::is_enabled());  // the inner guard restored "off"
  }
  EXPECT_TRUE(ag::GradMode::is_enabled());
  const Tensor y = x * x;
  EXPECT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "mul");
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, SavedTensorModifiedInPlaceThrows) {
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  const Tensor loss = ag::ops::sum(x * w);  // mul saves x and w
  w.data<float>()[0] = 5.0f;
  w.bump_version();  // what an optimizer step does
  EXPECT_TRUE(throws_error([&] { loss.backward(); }, {"mul", "modified in place", "version"}));
  // An unrelated tensor's version does not matter.
  Tensor a = leaf({1, 2});
  const Tensor l2 = ag::ops::sum(a * 3.0f);
  Tensor other = ag::ones({2});
  other.bump_version();
  EXPECT_NO_THROW(l2.backward());
}

TEST(Autograd, SavedTensorWhoseDataWasReplacedThrows) {
  // set_data (what Module::to and loading do) swaps the storage under a saved input: its new
  // storage starts at version 0 like the old one, so only the storage identity tells.
  Tensor x = leaf({1, 2});
  Tensor w = leaf({3, 4});
  const Tensor loss = ag::ops::sum(x * w);
  w.set_data(Tensor::from_vector(std::vector<float>{7, 8}, {2}));
  EXPECT_TRUE(throws_error([&] { loss.backward(); }, {"mul", "data replaced", "set_data"}));
  // A failed backward leaves no gradient behind, and the graph can still be freed.
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, DiamondsSumTheirBranches) {
  // A leaf used by two ops: d/dx (x*x + 3x) = 2x + 3.
  Tensor x = leaf({1, -2, 0.5f});
  ag::ops::sum(x * x + x * 3.0f).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{5, -1, 4}));
  // An intermediate used twice: h = relu(x); out = h*h + h, d/dx = (2h + 1) [x > 0].
  Tensor z = leaf({1, -2, 0.5f});
  const Tensor h = ag::ops::relu(z);
  ag::ops::sum(h * h + h).backward();
  EXPECT_EQ(z.grad().to_vector(), (std::vector<float>{3, 0, 2}));
  // A deeper diamond: a = 2x, b = a + a, c = a * b = 4x^2 * 2 -> dc/dx = 16x.
  Tensor p = leaf({1, 3});
  const Tensor a = p * 2.0f;
  const Tensor b = a + a;
  ag::ops::sum(a * b).backward();
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{16, 48}));
}

TEST(Autograd, LeafGradientHasTheLeafDtype) {
  Tensor h = leaf({1, 2}, DType::kFloat16);
  ag::ops::sum(h * h).backward();
  EXPECT_EQ(h.grad().dtype(), DType::kFloat16);
  EXPECT_EQ(h.grad().to_vector(), (std::vector<float>{2, 4}));
  // An FP32 leaf used through a cast to FP16 gets an FP32 gradient, and the other way round.
  Tensor f = leaf({1, 2});
  ag::ops::sum(f.to(DType::kFloat16) * 3.0f).backward();
  EXPECT_EQ(f.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(f.grad().to_vector(), (std::vector<float>{3, 3}));
  Tensor g = leaf({1, 2}, DType::kFloat16);
  ag::ops::sum(g.to(DType::kFloat64) * g.to(DType::kFloat32)).backward();  // promoted to float64
  EXPECT_EQ(g.grad().dtype(), DType::kFloat16);
  EXPECT_EQ(g.grad().to_vector(), (std::vector<float>{2, 4}));
}

TEST(Autograd, OnlyInputsThatNeedGradGetOne) {
  Tensor x = leaf({1, 2});
  const Tensor c = ag::ones({2});
  ag::ops::sum(x * c).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(c.grad().defined());
  EXPECT_FALSE((c * c).requires_grad());
  EXPECT_EQ((c * c).grad_fn(), nullptr);
}

// A training loop must not leak: the bytes held after 1e3 steps and after 1e5 steps are equal,
// and so is the peak since the loop began (every step allocates and frees the same).
template <typename Optimizer, typename Options>
void expect_steady_memory(Options options) {
  ag::allocator_for(ag::Device::kCPU).reset_peak();
  ag::manual_seed(3);
  ag::nn::Linear model(10, 1);
  const Tensor x = ag::randn({64, 10});
  const Tensor y = ag::ops::mean(x) + ag::randn({64, 1});  // anything to fit
  Optimizer opt(model.parameters(), options);
  auto train = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      ag::ops::mse_loss(model(x), y).backward();
      opt.step();
    }
  };
  const float initial_loss = ag::ops::mse_loss(model(x), y).item();
  train(1000);
  const ag::MemoryStats early = ag::memory_stats(ag::Device::kCPU);
  train(99000);
  const ag::MemoryStats late = ag::memory_stats(ag::Device::kCPU);
  EXPECT_EQ(late.current_bytes, early.current_bytes);
  EXPECT_EQ(late.peak_bytes, early.peak_bytes);
  EXPECT_GT(early.peak_bytes, early.current_bytes);  // steps do allocate: the counters are live
  ::testing::Test::RecordProperty("current_bytes", std::to_string(late.current_bytes));
  ::testing::Test::RecordProperty("peak_bytes", std::to_string(late.peak_bytes));
  EXPECT_LT(ag::ops::mse_loss(model(x), y).item(), initial_loss);  // and it trained
}

TEST(Autograd, MemoryIsSteadyInATrainingLoopWithSgd) {
  expect_steady_memory<ag::optim::SGD>(ag::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
}

TEST(Autograd, MemoryIsSteadyInATrainingLoopWithAdam) {
  expect_steady_memory<ag::optim::Adam>(ag::optim::AdamOptions{.lr = 1e-3});
}

// ---- Post-accumulate-grad hooks (what data-parallel training overlaps its communication with) ----

TEST(Autograd, LeavesInBackwardOrderAreTheOrderTheEngineWritesThem) {
  // Each leaf has one consumer here, so its first write is its last: the hooks see the order.
  ag::manual_seed(3);
  ag::nn::Linear l1(4, 8), l2(8, 8), l3(8, 2);
  const Tensor x = ag::randn({5, 4});
  const Tensor loss = ag::ops::sum(l3(ag::ops::relu(l2(ag::ops::relu(l1(x))))));
  std::vector<const ag::TensorImpl*> written;
  std::vector<Tensor> params;
  for (ag::nn::Linear* layer : {&l1, &l2, &l3}) {
    for (Tensor p : layer->parameters()) {
      p.register_post_accumulate_grad_hook([&](const Tensor& t) { written.push_back(t.impl()); });
      params.push_back(p);
    }
  }
  const std::vector<const ag::TensorImpl*> before = ag::leaves_in_backward_order(loss);
  loss.backward();
  ASSERT_EQ(written.size(), 6u);
  EXPECT_EQ(before, written);
  EXPECT_EQ(written.front(), l3.parameters().front().impl()) << "the last layer's weight comes first";
  EXPECT_EQ(ag::leaves_in_backward_order(loss), written) << "the edges outlive the backward";
}

TEST(Autograd, LeavesInBackwardOrderPutASharedLeafAtItsFirstWrite) {
  // w is used first and last: the last use's node runs first and writes w before v and x; the
  // first use writes x (its edge 0) and w again. A node writes its leaves in edge order.
  Tensor x = leaf({1, 2}), w = leaf({3, 4}), v = leaf({5, 6});
  const Tensor loss = ag::ops::sum(((x * w) * v) * w);
  using Order = std::vector<const ag::TensorImpl*>;
  EXPECT_EQ(ag::leaves_in_backward_order(loss), (Order{w.impl(), v.impl(), x.impl()}));
  EXPECT_EQ(ag::leaves_in_backward_order(ag::ops::sum(x * v)), (Order{x.impl(), v.impl()}));
  EXPECT_EQ(ag::leaves_in_backward_order(x), (Order{x.impl()})) << "a leaf root is its own only leaf";
  EXPECT_TRUE(ag::leaves_in_backward_order(ag::zeros({2})).empty()) << "nothing requires grad";
}

TEST(AutogradHooks, RunOnceAfterTheWholeGradientOfAPassWasAccumulated) {
  Tensor x = leaf({1, 2, 3});
  std::vector<std::vector<float>> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& t) { seen.push_back(t.grad().to_vector()); });
  // x reaches the loss three ways (x * x uses it twice): one call, with the summed gradient 2x + 1.
  ag::ops::sum(x * x + x).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<float>{3, 5, 7}));
  ag::ops::sum(x * 2.0f).backward();  // a second pass accumulates (+= 2) and calls again
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<float>{5, 7, 9}));
}

TEST(AutogradHooks, RunDuringBackwardInReverseOrderOfUse) {
  // w1 is used first in the forward, so its gradient is ready last: w2's hook runs while w1 has
  // none yet. This is what lets data-parallel training start reducing w2 before backward ends.
  Tensor w1 = leaf({2}), w2 = leaf({3}), x = leaf({5});
  std::vector<std::string> calls;
  w1.register_post_accumulate_grad_hook([&](const Tensor&) { calls.push_back("w1"); });
  w2.register_post_accumulate_grad_hook([&](const Tensor&) {
    calls.push_back(w1.grad().defined() ? "w2 after w1" : "w2");
  });
  ag::ops::sum((x * w1) * w2).backward();
  EXPECT_EQ(calls, (std::vector<std::string>{"w2", "w1"}));
}

TEST(AutogradHooks, RunForALeafRootAndNotForLeavesWithoutGradient) {
  Tensor x = leaf({4}), y = leaf({1});
  int x_calls = 0, y_calls = 0;
  x.register_post_accumulate_grad_hook([&](const Tensor&) { ++x_calls; });
  y.register_post_accumulate_grad_hook([&](const Tensor&) { ++y_calls; });
  x.backward();  // the root itself is the leaf
  EXPECT_EQ(x_calls, 1);
  ag::ops::sum(x * 3.0f).backward();  // y is not in this graph
  EXPECT_EQ(x_calls, 2);
  EXPECT_EQ(y_calls, 0);
}

TEST(AutogradHooks, RemovedHooksStopAndMisuseIsAnError) {
  Tensor x = leaf({1});
  int a = 0, b = 0;
  const uint64_t id_a = x.register_post_accumulate_grad_hook([&](const Tensor&) { ++a; });
  x.register_post_accumulate_grad_hook([&](const Tensor&) { ++b; });
  x.remove_post_accumulate_grad_hook(id_a);
  ag::ops::sum(x * 2.0f).backward();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_ERROR([&] { x.remove_post_accumulate_grad_hook(id_a); }, "no hook with id");
  const Tensor y = x * 2.0f;
  EXPECT_ERROR([&] { Tensor(y).register_post_accumulate_grad_hook([](const Tensor&) {}); }, "not a leaf");
  EXPECT_ERROR([&] { ag::zeros({1}).register_post_accumulate_grad_hook([](const Tensor&) {}); }, "not a leaf");
}

TEST(AutogradHooks, AnExceptionInAHookEndsBackwardAndLeavesTheEngineUsable) {
  Tensor x = leaf({1, 2});
  bool fail = true;
  x.register_post_accumulate_grad_hook([&](const Tensor&) {
    if (fail) AG_FAIL("hook failed on purpose");
  });
  EXPECT_ERROR([&] { ag::ops::sum(x * x).backward(); }, "hook failed on purpose");
  fail = false;
  x.set_grad(Tensor());
  ag::ops::sum(x * x).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 4}));
}

}  // namespace
