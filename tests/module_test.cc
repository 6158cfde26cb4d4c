// nn::Module semantics: modules are shared handles (containers hold the modules they are given,
// so passing one twice ties it), registration, PyTorch's names for nested and tied modules
// (named_parameters dedupes, state_dict keeps every name), train/eval, to() on tied parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace nn = ampgrad::nn;
using ag::DType;
using ag::Tensor;
using ag::test::throws_error;

namespace {

std::vector<std::string> names_of(const nn::Named<Tensor>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

Tensor leaf(const ag::Shape& shape, float value) {
  Tensor t = ag::full(shape, value);
  t.set_requires_grad(true);
  return t;
}

// A custom module the way docs/models.md shows it: children and a buffer registered once, kept as
// members; a plain member that is not registered state.
class TwoLayer : public nn::Module {
 public:
  TwoLayer(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", nn::Linear(in, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, out))),
        calls(register_buffer("calls", ag::zeros({1}))) {}
  Tensor forward(const Tensor& x) override { return fc2(ag::ops::relu(fc1(x))); }

  nn::Linear fc1, fc2;
  Tensor& calls;
  int plain = 0;  // copied with the handle, not shared (only registered state is)
};

// A GPT-shaped nesting: blocks in a ModuleList, each with named children and a Sequential.
class Block : public nn::Module {
 public:
  Block()
      : attn(register_module("attn", nn::Linear(4, 4))),
        mlp(register_module("mlp", nn::Sequential{nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 4)})) {}
  Tensor forward(const Tensor& x) override { return mlp(attn(x)); }
  nn::Linear attn;
  nn::Sequential mlp;
};

class Net : public nn::Module {
 public:
  Net() : blocks(register_module("blocks", nn::ModuleList{Block(), Block()})), head(register_module("head", nn::Linear(4, 4))) {}
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& block : blocks.children()) h = (*block)(h);
    return head(h);
  }
  nn::ModuleList blocks;
  nn::Linear head;
};

TEST(Module, SequentialHoldsTheModulesItIsGiven) {
  ag::manual_seed(1);
  nn::Linear l1(3, 2);
  nn::Sequential s{l1, nn::ReLU()};
  EXPECT_TRUE(s[0].is_same(l1));
  // Assigning a parameter through either handle reaches the other.
  const Tensor w = leaf({2, 3}, 0.5f);
  l1.weight = w;
  EXPECT_TRUE(s.at<nn::Linear>(0).weight.is_same(w));
  EXPECT_TRUE(s.parameters()[0].is_same(w));
  const Tensor x = ag::randn({4, 3});
  EXPECT_EQ(s(x).to_vector(), ag::ops::relu(ag::ops::linear(x, w, l1.bias)).to_vector());
  const Tensor b = leaf({2}, -1.0f);
  s.at<nn::Linear>(0).bias = b;
  EXPECT_TRUE(l1.bias.is_same(b));
  // A copy of a container is the same container, also from a non-const lvalue (not a nesting).
  nn::Sequential copy(s);
  EXPECT_TRUE(copy.is_same(s));
  copy.push_back(nn::Linear(2, 2));
  EXPECT_EQ(s.size(), 3u);
  // Assignment would rebind one handle only, so it does not compile.
  static_assert(!std::is_copy_assignable_v<nn::Linear>);
  static_assert(!std::is_copy_assignable_v<nn::Sequential>);
  static_assert(!std::is_copy_assignable_v<TwoLayer>);
}

TEST(Module, PassingAModuleTwiceTiesItsWeights) {
  ag::manual_seed(2);
  nn::Linear s(4, 4);
  nn::Sequential m{s, nn::ReLU(), s};
  // Each parameter once, first name first (named_parameters); every name in state_dict.
  EXPECT_EQ(names_of(m.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
  const std::vector<Tensor> ps = m.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_TRUE(ps[0].is_same(s.weight));
  EXPECT_TRUE(ps[1].is_same(s.bias));
  const nn::Named<Tensor> sd = m.state_dict();
  EXPECT_EQ(names_of(sd), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_TRUE(sd[2].second.is_same(s.weight));
  std::vector<std::string> modules;
  for (const auto& [name, module] : m.named_modules()) modules.push_back(name);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "0", "1"}));

  // The gradient sums both uses, and one SGD step applies it once.
  const Tensor x = ag::randn({3, 4});
  const std::vector<float> w0 = s.weight.to_vector();
  ag::ops::sum(m(x)).backward();
  // The same computation with two untied copies: the tied gradient is the sum of theirs.
  Tensor wa = s.weight.detach().to(DType::kFloat32), ba = s.bias.detach().to(DType::kFloat32);
  Tensor wb = Tensor::from_vector(w0, {4, 4}), bb = Tensor::from_vector(s.bias.to_vector(), {4});
  for (Tensor* t : {&wa, &ba, &wb, &bb}) t->set_requires_grad(true);
  ag::ops::sum(ag::ops::linear(ag::ops::relu(ag::ops::linear(x, wa, ba)), wb, bb)).backward();
  std::vector<double> expected = wa.grad().to_double_vector();
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += wb.grad().to_double_vector()[i];
  EXPECT_CLOSE(s.weight.grad(), expected, DType::kFloat32);
  ag::optim::SGD sgd(m.parameters(), {.lr = 0.1});  // PyTorch's tied-weights case: accepted
  ag::optim::Adam adam(m.parameters(), {.lr = 0.1});
  const std::vector<float> g = s.weight.grad().to_vector();
  sgd.step();
  const std::vector<float> w1 = s.weight.to_vector();
  for (size_t i = 0; i < w1.size(); ++i) {
    // Updated once: a second update would move it by another 0.1 * g.
    EXPECT_NEAR(w1[i], w0[i] - 0.1 * g[i], 1e-6 * (std::abs(w0[i]) + std::abs(0.1 * g[i]))) << i;
  }
}

TEST(Module, CustomModuleStateIsShared) {
  ag::manual_seed(3);
  TwoLayer t(3, 5, 2);
  EXPECT_EQ(names_of(t.named_parameters()), (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(names_of(t.named_buffers()), (std::vector<std::string>{"calls"}));
  // PyTorch's state_dict order: a module's parameters, then its buffers, then its children.
  EXPECT_EQ(names_of(t.state_dict()),
            (std::vector<std::string>{"calls", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_FALSE(t.calls.requires_grad());

  // By value: registered state (parameters, buffers, children) is shared, plain members are copied.
  nn::Sequential by_value{t, nn::ReLU()};
  t.calls = ag::ones({1});
  t.fc2.weight = leaf({2, 5}, 0.25f);
  t.plain = 7;
  const nn::Named<Tensor> sd = by_value.state_dict();
  EXPECT_EQ(sd[0].first, "0.calls");
  EXPECT_EQ(sd[0].second.to_vector(), (std::vector<float>{1}));
  EXPECT_TRUE(by_value.at<TwoLayer>(0).fc2.weight.is_same(t.fc2.weight));
  EXPECT_EQ(by_value.at<TwoLayer>(0).plain, 0);
  const Tensor x = ag::randn({4, 3});
  EXPECT_EQ(by_value(x).to_vector(), ag::ops::relu(t(x)).to_vector());

  // By std::shared_ptr: the very object, plain members included.
  auto shared = std::make_shared<TwoLayer>(3, 5, 2);
  nn::Sequential by_pointer;
  by_pointer.push_back(shared);
  shared->plain = 9;
  EXPECT_EQ(&by_pointer.at<TwoLayer>(0), shared.get());
  EXPECT_EQ(by_pointer.at<TwoLayer>(0).plain, 9);
  EXPECT_TRUE(throws_error([&] { by_pointer.at<nn::Linear>(0); }, {"at(0)", "TwoLayer"}));
}

TEST(Module, NestedNamesAreThoseOfPyTorchStateDict) {
  ag::manual_seed(4);
  Net net;
  const std::vector<std::string> expected{
      "blocks.0.attn.weight",  "blocks.0.attn.bias",  "blocks.0.mlp.0.weight", "blocks.0.mlp.0.bias",
      "blocks.0.mlp.2.weight", "blocks.0.mlp.2.bias", "blocks.1.attn.weight",  "blocks.1.attn.bias",
      "blocks.1.mlp.0.weight", "blocks.1.mlp.0.bias", "blocks.1.mlp.2.weight", "blocks.1.mlp.2.bias",
      "head.weight",           "head.bias"};
  EXPECT_EQ(names_of(net.named_parameters()), expected);
  EXPECT_EQ(names_of(net.state_dict()), expected);
  std::vector<std::string> modules;
  for (const auto& [name, module] : net.named_modules()) modules.push_back(name);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "blocks", "blocks.0", "blocks.0.attn", "blocks.0.mlp",
                                               "blocks.0.mlp.0", "blocks.0.mlp.1", "blocks.0.mlp.2", "blocks.1",
                                               "blocks.1.attn", "blocks.1.mlp", "blocks.1.mlp.0", "blocks.1.mlp.1",
                                               "blocks.1.mlp.2", "head"}));
  EXPECT_EQ(net(ag::randn({2, 4})).shape(), (ag::Shape{2, 4}));

  // Tying by assignment (an LM head sharing the embedding): the second name leaves
  // named_parameters and parameters() but stays in state_dict, as in PyTorch.
  net.head.weight = net.blocks.at<Block>(0).attn.weight;
  const std::vector<std::string> params = names_of(net.named_parameters());
  EXPECT_EQ(params.size(), expected.size() - 1);
  EXPECT_EQ(params.back(), "head.bias");
  EXPECT_EQ(net.parameters().size(), expected.size() - 1);
  EXPECT_EQ(names_of(net.state_dict()), expected);
}

TEST(Module, TrainAndEvalReachEveryDescendant) {
  Net net;
  nn::Sequential other;
  other.push_back(net.blocks.at<Block>(1).mlp);  // holds that Sequential too
  EXPECT_TRUE(net.is_training());
  net.eval();
  for (const auto& [name, module] : net.named_modules()) EXPECT_FALSE(module->is_training()) << name;
  EXPECT_FALSE(other[0].is_training());
  EXPECT_TRUE(other.is_training());  // the new container itself was not reached
  other.train();
  EXPECT_TRUE(net.blocks.at<Block>(1).mlp[1].is_training());
  EXPECT_FALSE(net.blocks.at<Block>(0).mlp[1].is_training());
  EXPECT_EQ(&net.train(), &net);  // chains, as PyTorch's returns self
  for (const auto& [name, module] : net.named_modules()) EXPECT_TRUE(module->is_training()) << name;
}

TEST(Module, ToConvertsATiedParameterOnceAndKeepsItTied) {
  ag::manual_seed(5);
  nn::Linear s(3, 3);
  TwoLayer t(3, 4, 3);
  nn::Sequential m{s, nn::ReLU(), s, t};
  const Tensor weight = s.weight;
  const std::vector<float> before = s.weight.to_vector();
  m.to(DType::kFloat16);
  const nn::Named<Tensor> sd = m.state_dict();
  EXPECT_TRUE(sd[0].second.is_same(weight));  // the handles users hold stay valid
  EXPECT_TRUE(sd[2].second.is_same(weight));  // and stay tied
  EXPECT_EQ(weight.dtype(), DType::kFloat16);
  EXPECT_EQ(weight.to_vector(), Tensor::from_vector(before, {3, 3}).to(DType::kFloat16).to_vector());
  EXPECT_EQ(t.calls.dtype(), DType::kFloat16);  // floating buffers are converted too
  EXPECT_EQ(m(ag::randn({2, 3}, DType::kFloat16)).dtype(), DType::kFloat16);

  // As PyTorch's: to(dtype) leaves int64 buffers (token ids, counters) alone and takes only a
  // floating dtype.
  nn::Linear lin(2, 2);
  const Tensor ids = lin.register_buffer("ids", Tensor::from_vector(std::vector<int64_t>{3, 1, 4}, {3}));
  lin.to(DType::kFloat16);
  EXPECT_EQ(ids.dtype(), DType::kInt64);
  EXPECT_EQ(lin.weight.dtype(), DType::kFloat16);
  EXPECT_TRUE(throws_error([&] { lin.to(DType::kInt64); }, {"Linear::to(int64)", "floating"}));
  EXPECT_EQ(lin.weight.dtype(), DType::kFloat16);
}

TEST(Module, RegistrationErrors) {
  struct Custom : nn::Module {};
  Custom c;
  c.register_parameter("w", leaf({2}, 1.0f));
  EXPECT_TRUE(throws_error([&] { c.register_parameter("w", leaf({2}, 1.0f)); }, {"register_parameter(\"w\")", "already"}));
  EXPECT_TRUE(throws_error([&] { c.register_buffer("w", ag::zeros({1})); }, {"register_buffer(\"w\")", "already"}));
  EXPECT_TRUE(throws_error([&] { c.register_module("w", nn::ReLU()); }, {"register_module(\"w\")", "already"}));
  EXPECT_TRUE(throws_error([&] { c.register_parameter("a.b", leaf({2}, 1.0f)); }, {"a.b", "'.'"}));
  EXPECT_TRUE(throws_error([&] { c.register_buffer("", ag::zeros({1})); }, {"non-empty"}));
  EXPECT_TRUE(throws_error([&] { c.register_parameter("y", leaf({2}, 1.0f) * 2.0f); }, {"\"y\"", "produced by an op"}));
  EXPECT_TRUE(throws_error([&] { c(ag::ones({1})); }, {"Custom", "no forward"}));
  // A frozen parameter is still a parameter.
  Tensor& frozen = c.register_parameter("frozen", ag::ones({2}), nn::RequiresGrad::kNo);
  EXPECT_FALSE(frozen.requires_grad());
  EXPECT_EQ(names_of(c.named_parameters()), (std::vector<std::string>{"w", "frozen"}));
  // An undefined parameter reserves its name and appears once assigned (Linear's absent bias).
  nn::Linear no_bias(2, 3, nn::Bias::kNo);
  EXPECT_EQ(names_of(no_bias.named_parameters()), (std::vector<std::string>{"weight"}));
  no_bias.bias = leaf({3}, 0.0f);
  EXPECT_EQ(names_of(no_bias.named_parameters()), (std::vector<std::string>{"weight", "bias"}));

  // A module cannot contain itself, directly or through another.
  nn::Sequential a{nn::ReLU()}, b{nn::ReLU()};
  EXPECT_TRUE(throws_error([&] { a.push_back(a); }, {"own descendant"}));
  b.push_back(a);
  EXPECT_TRUE(throws_error([&] { a.push_back(b); }, {"own descendant"}));
  EXPECT_EQ(a.size(), 1u);  // refused registrations change nothing
  nn::ModuleList list{nn::Linear(2, 2)};
  EXPECT_TRUE(throws_error([&] { list(ag::ones({1, 2})); }, {"ModuleList", "no forward"}));
  EXPECT_TRUE(throws_error([&] { list[1]; }, {"ModuleList[1]", "out of range"}));
}

}  // namespace
