// utils::checkpoint and the grad() it builds on: gradients bit for bit those of the plain forward
// (a GPT with dropout in FP32, BF16 autocast and FP16 autocast with a GradScaler, nested
// checkpoints, tensors with a graph of their own read by fn, inputs without gradients, the
// attention backend), the random generator left as without checkpointing, the activation memory
// it saves (under autocast too), parameter hooks that see the whole gradient once, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "examples/gpt.h"
#include "framework/allocator.h"
#include "framework/autocast.h"
#include "framework/autograd.h"
#include "framework/random.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "test_util.h"
#include "utils/activation_checkpoint.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;

namespace {

Tensor leaf(std::vector<float> v, ag::Shape shape) {
  Tensor t = Tensor::from_vector(v, shape);
  t.set_requires_grad(true);
  return t;
}

TEST(Grad, ReturnsTheGradientsInsteadOfAccumulatingThem) {
  const Tensor a = leaf({1, 2, 3}, {3}), b = leaf({4, 5, 6}, {3}), unused = leaf({7}, {1});
  const Tensor y = ag::ops::sum(a * b) + ag::ops::sum(a);
  const std::vector<Tensor> g = ag::grad(y, Tensor(), {a, b, unused, a});
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].to_vector(), (std::vector<float>{5, 6, 7}));  // b + 1
  EXPECT_EQ(g[1].to_vector(), (std::vector<float>{1, 2, 3}));  // a
  EXPECT_FALSE(g[2].defined()) << "a leaf the graph does not reach";
  EXPECT_EQ(g[3].to_vector(), g[0].to_vector()) << "a repeated target";
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_TRUE(ag::test::throws_error([&] { ag::grad(ag::ops::sum(a * b), Tensor(), {a * b}); },
                                     {"grad", "leaf"}));
}

// The nodes named `name` a backward from `root` would run.
int count_nodes(const Tensor& root, std::string_view name) {
  int count = 0;
  std::vector<const ag::Node*> stack{root.grad_fn().get()}, seen;
  while (!stack.empty()) {
    const ag::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || std::find(seen.begin(), seen.end(), node) != seen.end()) continue;
    seen.push_back(node);
    if (node->name() == name) ++count;
    for (const ag::Edge& e : node->next_edges) stack.push_back(e.node.get());
  }
  return count;
}

enum class Mode { kFloat32, kBFloat16, kFloat16Scaled };

struct GptRun {
  std::vector<std::vector<double>> grads;  // every parameter's, in parameters() order
  double loss = 0;
  std::string rng_after;
};

// One forward and backward of a 2-layer GPT with dropout on a fixed batch, from a fixed seed.
GptRun run_gpt(Mode mode, bool checkpoint) {
  ag::manual_seed(5);
  gpt::GPT model({.vocab_size = 37, .block_size = 24, .n_layer = 2, .n_head = 2, .n_embd = 32, .dropout = 0.1,
                  .checkpoint_activations = checkpoint});
  std::vector<int64_t> ids(2 * 24), next(2 * 24);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>(i * 7 % 37);
    next[i] = static_cast<int64_t>(i * 11 % 37);
  }
  const Tensor x = Tensor::from_vector(ids, {2, 24}), y = Tensor::from_vector(next, {2 * 24});
  ag::amp::GradScaler scaler({.init_scale = 1024.0});
  Tensor loss;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, mode == Mode::kBFloat16 ? DType::kBFloat16 : DType::kFloat16,
                                    /*enabled=*/mode != Mode::kFloat32);
    loss = ag::ops::cross_entropy(ag::ops::reshape(model(x), {2 * 24, 37}), y);
  }
  EXPECT_EQ(count_nodes(loss, "checkpoint"), checkpoint ? 2 : 0) << "one per block";
  (mode == Mode::kFloat16Scaled ? scaler.scale(loss) : loss).backward();
  GptRun run{.grads = {}, .loss = loss.item(), .rng_after = ag::random::get_state()};
  for (const Tensor& p : model.parameters()) run.grads.push_back(p.grad().to_double_vector());
  return run;
}

TEST(Checkpoint, GptGradientsAreBitIdenticalWithDropoutAndAutocast) {
  for (Mode mode : {Mode::kFloat32, Mode::kBFloat16, Mode::kFloat16Scaled}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const GptRun plain = run_gpt(mode, false), checkpointed = run_gpt(mode, true);
    EXPECT_EQ(checkpointed.loss, plain.loss);
    ASSERT_EQ(checkpointed.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(checkpointed.grads[i], plain.grads[i]) << "parameter " << i;
    EXPECT_EQ(checkpointed.rng_after, plain.rng_after) << "the generator ends where it would without checkpointing";
  }
}

// A stack of linear + GELU layers as one function of x.
struct Stack {
  std::vector<ag::nn::Linear> layers;
  explicit Stack(int n) {
    layers.reserve(static_cast<size_t>(n));  // constructed in place: a module is not moved after
    for (int i = 0; i < n; ++i) layers.emplace_back(256, 256);
  }
  Tensor operator()(Tensor x) {
    for (ag::nn::Linear& layer : layers) x = ag::ops::gelu(layer(x));
    return x;
  }
};

TEST(Checkpoint, NestedCheckpointsGiveThePlainGradients) {
  ag::manual_seed(1);
  Stack stack(4);
  const auto inner = [&](const std::vector<Tensor>& in) { return ag::ops::gelu(stack.layers[1](in[0])); };
  const auto outer = [&](const std::vector<Tensor>& in) {
    const Tensor h = ag::ops::gelu(stack.layers[0](in[0]));
    return ag::ops::gelu(stack.layers[2](ag::utils::checkpoint(inner, {h})));
  };
  const auto plain = [&](const std::vector<Tensor>& in) {
    const Tensor h = ag::ops::gelu(stack.layers[0](in[0]));
    return ag::ops::gelu(stack.layers[2](inner({h})));
  };
  const auto grads_of = [&](bool checkpoint) {
    ag::manual_seed(2);
    Tensor x = ag::randn({8, 256});
    x.set_requires_grad(true);
    for (ag::nn::Linear& l : stack.layers) {
      l.weight.set_grad(Tensor());
      l.bias.set_grad(Tensor());
    }
    const Tensor out = checkpoint ? ag::utils::checkpoint(outer, {x}) : plain({x});
    ag::ops::sum(out * out).backward();
    std::vector<std::vector<double>> g{x.grad().to_double_vector()};
    for (int i = 0; i < 3; ++i) {
      g.push_back(stack.layers[static_cast<size_t>(i)].weight.grad().to_double_vector());
      g.push_back(stack.layers[static_cast<size_t>(i)].bias.grad().to_double_vector());
    }
    return g;
  };
  EXPECT_EQ(grads_of(true), grads_of(false));
}

TEST(Checkpoint, KeepsOnlyItsInputsForTheBackward) {
  ag::manual_seed(3);
  Stack stack(8);
  Tensor x = ag::randn({512, 256});
  x.set_requires_grad(true);
  const int64_t layer_bytes = 512 * 256 * 4;
  const auto kept_after_forward = [&](bool checkpoint) {
    const int64_t before = ag::memory_stats(ag::Device::kCPU).current_bytes;
    const Tensor out = checkpoint ? ag::utils::checkpoint([&](const std::vector<Tensor>& in) { return stack(in[0]); }, {x})
                                  : stack(x);
    const int64_t kept = ag::memory_stats(ag::Device::kCPU).current_bytes - before;
    ag::ops::sum(out).backward();
    return kept;
  };
  const int64_t plain = kept_after_forward(false), checkpointed = kept_after_forward(true);
  EXPECT_GE(plain, 8 * layer_bytes) << "each layer keeps at least its linear output for GELU's backward";
  EXPECT_LE(checkpointed, layer_bytes + 4096) << "the output only: x is the caller's";
}

TEST(Checkpoint, AParametersHookRunsOnceWithItsWholeGradient) {
  // w is used inside the checkpoint and after it: the hook must see both contributions, once.
  const Tensor w = leaf({0.5f, -1.0f, 2.0f}, {3});
  const Tensor x = leaf({1, 2, 3}, {3});
  std::vector<std::vector<float>> seen;
  Tensor hooked = w;
  hooked.register_post_accumulate_grad_hook([&](const Tensor& p) { seen.push_back(p.grad().to_vector()); });
  const auto fn = [&](const std::vector<Tensor>& in) { return ag::ops::tanh(in[0] * w); };
  ag::ops::sum(ag::utils::checkpoint(fn, {x}) * w).backward();
  const std::vector<float> checkpointed = w.grad().to_vector();
  hooked.set_grad(Tensor());
  ag::ops::sum(fn({x}) * w).backward();
  ASSERT_EQ(seen.size(), 2u) << "one call per backward";
  EXPECT_EQ(seen[0], checkpointed);
  EXPECT_EQ(seen[0], seen[1]);
}

TEST(Checkpoint, ATensorWithAGraphOfItsOwnThatFnReadsGetsItsGradientOnce) {
  // c = 2a is made outside fn, read by two checkpoints and used after them too (as an encoder's
  // output is by cross-attention): the mul node that made it runs once, in the outer backward.
  const auto grads = [](bool checkpoint) {
    const Tensor a = leaf({1, -2, 3}, {3}), x = leaf({0.5f, 0.25f, -1}, {3});
    const Tensor c = a * 2.0f;
    const auto fn = [&c](const std::vector<Tensor>& in) { return ag::ops::tanh(in[0] * c); };
    const auto run = [&](const std::vector<Tensor>& in) { return checkpoint ? ag::utils::checkpoint(fn, in) : fn(in); };
    ag::ops::sum(run({x}) + run({x * x}) + c).backward();
    return std::vector<std::vector<float>>{a.grad().to_vector(), x.grad().to_vector()};
  };
  EXPECT_EQ(grads(true), grads(false));
}

TEST(Checkpoint, InputsWithoutGradientsAndAReturnedParameter) {
  const Tensor w = leaf({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor scale = Tensor::from_vector(std::vector<float>{2, 3}, {2});  // needs no gradient
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{2, 0, 2}, {3});
  const auto fn = [&w](const std::vector<Tensor>& in) { return ag::ops::embedding(in[0], w) * in[2]; };
  ag::ops::sum(ag::utils::checkpoint(fn, {ids, Tensor(), scale})).backward();
  const std::vector<float> checkpointed = w.grad().to_vector();
  Tensor(w).set_grad(Tensor());
  ag::ops::sum(fn({ids, Tensor(), scale})).backward();
  EXPECT_EQ(checkpointed, w.grad().to_vector());

  // fn returning a tensor it reads (not an input): its gradient must still arrive.
  Tensor(w).set_grad(Tensor());
  const Tensor x = leaf({1}, {1});
  ag::ops::sum(ag::utils::checkpoint([&w](const std::vector<Tensor>&) { return w; }, {x})).backward();
  EXPECT_EQ(w.grad().to_vector(), std::vector<float>(6, 1.0f));
}

TEST(Checkpoint, UnderAutocastFnsCastsAreItsOwnAndDoNotOutliveIt) {
  // A linear first (as an MLP block's): without its own cast cache, the 16-bit copy of the
  // checkpoint's input would be cached, and kept, until the autocast region ends.
  ag::manual_seed(4);
  Stack stack(4);
  Tensor x = ag::randn({512, 256});
  x.set_requires_grad(true);
  ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
  const size_t cached = ag::autocast::cache_size();
  const int64_t before = ag::memory_stats(ag::Device::kCPU).current_bytes;
  const Tensor out = ag::utils::checkpoint([&](const std::vector<Tensor>& in) { return stack(in[0]); }, {x});
  EXPECT_EQ(ag::autocast::cache_size(), cached);
  EXPECT_LE(ag::memory_stats(ag::Device::kCPU).current_bytes - before, out.numel() * 2 + 4096) << "the output only";
  const Tensor plain_out = stack(x);
  EXPECT_EQ(out.to_double_vector(), plain_out.to_double_vector());
  ag::ops::sum(out).backward();
  const std::vector<double> checkpointed = stack.layers[0].weight.grad().to_double_vector();
  stack.layers[0].weight.set_grad(Tensor());
  ag::ops::sum(plain_out).backward();
  EXPECT_EQ(checkpointed, stack.layers[0].weight.grad().to_double_vector());
}

TEST(Checkpoint, TheRecomputeUsesTheForwardsAttentionBackend) {
  const auto grads = [](bool checkpoint) {
    Tensor q = Tensor::from_vector(ag::test::random_values(2 * 40 * 16, -1, 1, 9), {2, 40, 16});
    q.set_requires_grad(true);
    const auto fn = [](const std::vector<Tensor>& in) {
      return ag::ops::scaled_dot_product_attention(in[0], in[0], in[0], true);
    };
    Tensor out;
    {
      ag::ops::AttentionBackendGuard composed(ag::ops::AttentionBackend::kComposed);
      out = checkpoint ? ag::utils::checkpoint(fn, {q}) : fn({q});
    }
    ag::ops::sum(out).backward();  // outside the guard
    return q.grad().to_double_vector();
  };
  EXPECT_EQ(grads(true), grads(false));
}

TEST(Checkpoint, AnInputFnModifiesInPlaceIsAnError) {
  const Tensor x = leaf({1, 2, 3}, {3});
  const auto fn = [](const std::vector<Tensor>& in) {
    Tensor y = in[0];
    y.data<float>()[0] = 5.0f;  // what an in-place op would do
    y.bump_version();
    return ag::ops::tanh(y);
  };
  const Tensor out = ag::utils::checkpoint(fn, {x});
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::sum(out).backward(); }, {"checkpoint", "input 0", "in place"}));
}

TEST(Checkpoint, AnInputModifiedAfterTheForwardIsAnError) {
  Tensor x = leaf({1, 2, 3}, {3});
  const Tensor out = ag::utils::checkpoint([](const std::vector<Tensor>& in) { return ag::ops::tanh(in[0]); }, {x});
  x.data<float>()[0] = 5.0f;
  x.bump_version();
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::sum(out).backward(); }, {"checkpoint", "input 0", "in place"}));
}

TEST(Checkpoint, ARecomputationThatDiffersIsAnError) {
  const Tensor x = leaf({1, 2, 3}, {3}), other = leaf({4, 5, 6}, {3});
  int calls = 0;
  const auto fn = [&](const std::vector<Tensor>& in) { return ++calls == 1 ? in[0] * in[0] : in[0] * other; };
  const Tensor out = ag::utils::checkpoint(fn, {x});
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::sum(out).backward(); }, {"checkpoint", "recomputation"}));
}

TEST(Checkpoint, WithoutGradModeItIsTheFunctionItself) {
  const Tensor x = leaf({1, 2, 3}, {3});
  ag::NoGradGuard no_grad;
  const Tensor out = ag::utils::checkpoint([](const std::vector<Tensor>& in) { return ag::ops::tanh(in[0]); }, {x});
  EXPECT_FALSE(out.requires_grad());
}

}  // namespace
