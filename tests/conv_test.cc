// The convolutional layers beyond the op table (op_cases_conv.cc checks values and gradients of
// every op in every dtype): a small CNN with batch norm against PyTorch (tests/data/
// make_cnn_reference.py wrote the files once), the modules' state and modes, autocast policies,
// conv2d's chunked columns, max pooling's ties and NaN, and the errors bad shapes give.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "reference.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Tensor;

namespace {

// The generator's model, layer for layer.
ag::nn::Sequential reference_cnn() {
  return ag::nn::Sequential{
      ag::nn::Conv2d(1, 4, 3, {.padding = {1, 1}}),
      ag::nn::BatchNorm2d(4),
      ag::nn::ReLU(),
      ag::nn::MaxPool2d(2),
      ag::nn::Conv2d(4, 6, 3, {.padding = {1, 1}, .groups = 2, .bias = ag::nn::Bias::kNo}),
      ag::nn::BatchNorm2d(6),
      ag::nn::ReLU(),
      ag::nn::AvgPool2d(2),
      ag::nn::Conv2d(6, 8, 1),
      ag::nn::AdaptiveAvgPool2d(1),
      ag::nn::Flatten(),
      ag::nn::Linear(8, 10),
  };
}

std::map<std::string, Tensor> reference_file() {
  const auto file = ag::checkpoint::load_safetensors("tests/data/cnn_reference.safetensors");
  return {file.tensors.begin(), file.tensors.end()};
}

// |actual - expected| <= tol * max(max|expected|, 1e-3) everywhere (float32 against PyTorch's
// float64). The floor is for gradients that are zero in exact arithmetic (a convolution's bias
// just before a batch norm, whose mean subtraction cancels it): float32 leaves ~1e-9 there.
::testing::AssertionResult near(const Tensor& actual, const Tensor& expected, double tol = 2e-5) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << actual.to_string() << " vs expected " << expected.to_string();
  }
  const std::vector<double> a = actual.to_double_vector(), e = expected.to_double_vector();
  double scale = 0, worst = 0;
  for (const double v : e) scale = std::max(scale, std::abs(v));
  scale = std::max(scale, 1e-3);
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::isnan(a[i]) ? INFINITY : std::abs(a[i] - e[i]));
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "largest error " << worst << " exceeds " << tol << " * " << scale;
}

}  // namespace

TEST(CnnReference, StateDictNamesArePyTorchs) {
  ag::nn::Sequential model = reference_cnn();
  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.num_batches_tracked",
                                             "1.running_mean", "1.running_var", "1.weight", "11.bias", "11.weight",
                                             "4.weight", "5.bias", "5.num_batches_tracked", "5.running_mean",
                                             "5.running_var", "5.weight", "8.bias", "8.weight"}));
  EXPECT_EQ(model.parameters().size(), 11u);  // the buffers are not trained
  EXPECT_EQ(model.buffers().size(), 6u);
}

TEST(CnnReference, TrainingStepAndEvalMatchPyTorch) {
  ag::nn::Sequential model = reference_cnn();
  ag::checkpoint::load_model("tests/data/cnn_reference_model.safetensors", model);  // strict
  auto ref = reference_file();
  const Tensor logits = model(ref.at("x"));
  const Tensor loss = ag::ops::cross_entropy(logits, ref.at("target"));
  loss.backward();
  EXPECT_TRUE(near(logits, ref.at("logits")));
  EXPECT_TRUE(near(loss, ref.at("loss")));
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_TRUE(near(p.grad(), ref.at("grad." + name))) << name;
  }
  for (const auto& [name, b] : model.named_buffers()) {
    if (b.dtype() == DType::kInt64) {
      EXPECT_EQ(b.item<int64_t>(), ref.at("after." + name).item<int64_t>()) << name;
    } else {
      EXPECT_TRUE(near(b, ref.at("after." + name))) << name;  // the unbiased variance, momentum 0.1
    }
  }
  model.eval();
  ag::NoGradGuard no_grad;
  EXPECT_TRUE(near(model(ref.at("x")), ref.at("eval_logits")));
}

TEST(CnnReference, CheckpointRoundTripKeepsTheBuffers) {
  agt::ScratchDir dir("cnn_checkpoint");
  ag::nn::Sequential model = reference_cnn();
  model(ag::randn({3, 1, 8, 8}));  // one training forward: running statistics move, num_batches_tracked = 1
  const std::string path = dir.path("cnn.safetensors");
  ag::checkpoint::save_model(path, model);
  ag::nn::Sequential loaded = reference_cnn();
  ag::checkpoint::load_model(path, loaded);
  const auto saved = model.state_dict(), back = loaded.state_dict();
  ASSERT_EQ(saved.size(), back.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(agt::bytes_of(saved[i].second), agt::bytes_of(back[i].second)) << saved[i].first;
  }
}

TEST(BatchNorm2d, EvalUsesRunningStatisticsAndTrainingUpdatesThem) {
  ag::nn::BatchNorm2d bn(2, {.momentum = 0.5});
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 3, 5, 7, 0, 0, 4, 4}, {2, 2, 1, 2});
  // channel 0: {1, 3, 0, 0}: mean 1, biased var 1.5, unbiased 2; channel 1: {5, 7, 4, 4}: mean 5, var 1.5 / 2
  const Tensor y = bn(x);
  EXPECT_EQ(bn.running_mean.to_vector(), (std::vector<float>{0.5f, 2.5f}));
  EXPECT_EQ(bn.running_var.to_vector(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  EXPECT_NEAR(y.to_vector()[1], (3 - 1) / std::sqrt(1.5 + 1e-5), 1e-6);
  EXPECT_NEAR(y.to_vector()[3], (7 - 5) / std::sqrt(1.5 + 1e-5), 1e-6);
  bn.eval();
  const Tensor z = bn(x);
  EXPECT_NEAR(z.to_vector()[0], (1 - 0.5) / std::sqrt(1.5 + 1e-5), 1e-6);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);  // eval counts nothing
  EXPECT_EQ(bn.running_mean.to_vector(), (std::vector<float>{0.5f, 2.5f}));
  // Without running statistics the batch's are used in eval too.
  ag::nn::BatchNorm2d plain(2, {.track_running_stats = false});
  plain.eval();
  EXPECT_FALSE(plain.running_mean.defined());
  EXPECT_NEAR(plain(x).to_vector()[1], (3 - 1) / std::sqrt(1.5 + 1e-5), 1e-5);
}

TEST(BatchNorm2d, ToLowPrecisionConvertsRunningStatisticsButNotTheCount) {
  ag::nn::BatchNorm2d bn(3);
  bn.to(DType::kBFloat16);
  EXPECT_EQ(bn.running_var.dtype(), DType::kBFloat16);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::kInt64);
  const Tensor y = bn(ag::randn({4, 3, 2, 2}).to(DType::kBFloat16));
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_TRUE(agt::all_finite(bn.running_var));
}

TEST(Autocast, ConvRunsInLowerPrecisionBatchNormInFloat32PoolsInTheirInput) {
  Tensor w = ag::randn({4, 3, 3, 3});
  w.set_requires_grad(true);
  Tensor x = ag::randn({2, 3, 6, 6});
  ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
  const Tensor y = ag::ops::conv2d(x, w);
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_EQ(ag::ops::max_pool2d(y).dtype(), DType::kBFloat16);
  EXPECT_EQ(ag::ops::avg_pool2d(y).dtype(), DType::kBFloat16);
  EXPECT_EQ(ag::ops::adaptive_avg_pool2d(y, {1, 1}).dtype(), DType::kBFloat16);
  // Pools follow their input: an FP32 tensor stays FP32 under the BF16 guard.
  EXPECT_EQ(ag::ops::max_pool2d(x).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::avg_pool2d(x).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::adaptive_avg_pool2d(x, {2, 2}).dtype(), DType::kFloat32);
  const Tensor n = ag::ops::batch_norm(y, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(n.dtype(), DType::kFloat32);
  ag::ops::sum(n * n).backward();
  EXPECT_EQ(w.grad().dtype(), DType::kFloat32);  // the cast is recorded: the FP32 weight gets an FP32 gradient
}

// A convolution whose columns exceed one chunk's budget (1152 rows x 4096 positions = 4.7M per
// sample, and the budget holds 2^23 = 8.4M): every sample is its own chunk, and the weight gradient sums over the
// chunks. Checked against the float64 reference in both directions.
TEST(Conv2d, ChunkedColumnsMatchTheReference) {
  const ag::Shape xs{3, 128, 64, 64}, ws{2, 128, 3, 3};
  Tensor x = Tensor::from_vector(agt::random_values(static_cast<size_t>(ag::shape_numel(xs)), -1, 1, 3), xs,
                                 DType::kFloat32);
  Tensor w = Tensor::from_vector(agt::random_values(static_cast<size_t>(ag::shape_numel(ws)), -1, 1, 4), ws,
                                 DType::kFloat32);
  const agt::Values xv = x.to_double_vector(), wv = w.to_double_vector();  // as rounded to float32
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y = ag::ops::conv2d(x, w, Tensor(), {.padding = {1, 1}});
  const agt::WindowRef g{.kh = 3, .kw = 3, .ph = 1, .pw = 1};
  // The magnitude is the running sum's (a few units), not a term's: each addition rounds at its size.
  EXPECT_CLOSE(y, agt::conv2d_ref(xv, xs, wv, ws, {}, g, 1), DType::kFloat32, {.k = 1152, .magnitude = 4});
  // L = sum(y * c): dw[o, ci, i, j] = sum c[n, o, oy, ox] x[n, ci, tap], dx its adjoint.
  const Tensor c = agt::cotangent_like(y);
  ag::ops::sum(y * c).backward();
  const agt::Values cv = c.to_double_vector();
  const int64_t oh = y.size(2), ow = y.size(3);
  agt::Values dw(wv.size(), 0.0), dx(xv.size(), 0.0);
  for (int64_t n = 0; n < 3; ++n) {
    for (int64_t o = 0; o < 2; ++o) {
      for (int64_t ci = 0; ci < 128; ++ci) {
        for (int64_t i = 0; i < 3; ++i) {
          for (int64_t j = 0; j < 3; ++j) {
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy - 1 + i;
              if (iy < 0 || iy >= 64) continue;
              for (int64_t ox = 0; ox < ow; ++ox) {
                const int64_t ix = ox - 1 + j;
                if (ix < 0 || ix >= 64) continue;
                const size_t xi = static_cast<size_t>(((n * 128 + ci) * 64 + iy) * 64 + ix);
                const size_t wi = static_cast<size_t>(((o * 128 + ci) * 3 + i) * 3 + j);
                const double cy = cv[static_cast<size_t>(((n * 2 + o) * oh + oy) * ow + ox)];
                dw[wi] += cy * xv[xi];
                dx[xi] += cy * wv[wi];
              }
            }
          }
        }
      }
    }
  }
  // 12288 products per weight (|c x| <= 2), summed in a float register over each chunk's 4096, whose
  // running sum wanders to about sqrt(4096) 0.6 ~ 40: that, not a term, is the size each addition
  // rounds at. A wrong tap or chunk offset errs by whole products (~1).
  EXPECT_CLOSE(w.grad(), dw, DType::kFloat32, {.k = 3 * 64 * 64, .magnitude = 40});
  EXPECT_CLOSE(x.grad(), dx, DType::kFloat32, {.k = 18, .magnitude = 2});
}

// An empty batch gives an empty output and zero gradients of the parameters' shapes, as PyTorch.
TEST(Conv2d, EmptyBatchGivesZeroWeightGradients) {
  Tensor x = ag::zeros({0, 3, 5, 5}), w = ag::randn({4, 3, 3, 3}), b = ag::randn({4});
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  const Tensor y = ag::ops::conv2d(x, w, b);
  EXPECT_EQ(y.shape(), (ag::Shape{0, 4, 3, 3}));
  ag::ops::sum(y).backward();
  ASSERT_TRUE(w.grad().defined() && b.grad().defined());
  EXPECT_EQ(agt::max_abs(w.grad()), 0.0);
  EXPECT_EQ(agt::max_abs(b.grad()), 0.0);
  EXPECT_EQ(x.grad().shape(), x.shape());
}

// An infinity in x on the depthwise padded-width grid: the dropped column of a row at tap j = 2
// reads column 0 of the next row (dy 0 times inf), so the grid's weight gradient holds a NaN the
// true taps never make; dw is then computed row by row, and its non-finite entries are float64's.
TEST(Conv2d, DepthwiseWeightGradientWithAnInfinityInXHasTheReferencesNonFiniteEntries) {
  const int64_t n = 2, c = 3, h = 5, wd = 6;
  std::vector<double> xv = agt::random_values(static_cast<size_t>(n * c * h * wd), -1, 1, 11);
  xv[(1 * c + 1) * h * wd + 2 * wd] = std::numeric_limits<double>::infinity();  // x[1, 1, 2, 0]
  const Tensor x = Tensor::from_vector(xv, {n, c, h, wd});
  Tensor w = Tensor::from_vector(agt::random_values(static_cast<size_t>(c * 9), -1, 1, 12), {c, 1, 3, 3});
  const Tensor dy =
      Tensor::from_vector(agt::random_values(static_cast<size_t>(n * c * h * wd), -1, 1, 13), {n, c, h, wd});
  w.set_requires_grad(true);
  ag::ops::sum(ag::ops::conv2d(x, w, Tensor(), {.padding = {1, 1}, .groups = c}) * dy).backward();
  const std::vector<float> dw = w.grad().to_vector();
  const std::vector<double> d = dy.to_double_vector();
  int non_finite = 0;
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 3; ++j) {
        double want = 0;
        for (int64_t s = 0; s < n; ++s) {
          for (int64_t oy = 0; oy < h; ++oy) {
            for (int64_t ox = 0; ox < wd; ++ox) {
              const int64_t iy = oy - 1 + i, ix = ox - 1 + j;
              if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
              want += d[static_cast<size_t>(((s * c + ch) * h + oy) * wd + ox)] *
                      xv[static_cast<size_t>(((s * c + ch) * h + iy) * wd + ix)];
            }
          }
        }
        const float got = dw[static_cast<size_t>((ch * 3 + i) * 3 + j)];
        SCOPED_TRACE(testing::Message() << "channel " << ch << " tap " << i << ", " << j);
        EXPECT_EQ(std::isnan(got), std::isnan(want));
        if (std::isinf(want)) {
          EXPECT_EQ(got, static_cast<float>(want));
        } else if (!std::isnan(want)) {
          EXPECT_NEAR(got, want, 1e-4 * (1 + std::abs(want)));
        }
        non_finite += std::isfinite(want) ? 0 : 1;
      }
    }
  }
  EXPECT_GT(non_finite, 0) << "the infinity should reach some taps";
}

// Dilation can put every tap of a window in the padding: that output is -inf with no gradient.
TEST(MaxPool2d, AWindowWithoutTapsIsMinusInfinity) {
  Tensor x = Tensor::from_vector(std::vector<float>{5}, {1, 1, 1, 1});
  x.set_requires_grad(true);
  const Tensor y = ag::ops::max_pool2d(x, {.kernel_size = {2, 2}, .stride = {1, 1}, .padding = {1, 1}, .dilation = {2, 2}});
  const std::vector<float> out = y.to_vector();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], -INFINITY);
  ag::ops::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>{0});
}

TEST(MaxPool2d, TiesGoToTheFirstMaximumAndNaNPropagates) {
  // Windows {2, 2 / 0, 1} (a tie) and {1, NaN / 3, 1}.
  Tensor x = Tensor::from_vector(std::vector<float>{2, 2, 1, NAN, 0, 1, 3, 1}, {1, 1, 2, 4});
  x.set_requires_grad(true);
  const Tensor y = ag::ops::max_pool2d(x, {.kernel_size = {2, 2}});
  const std::vector<float> out = y.to_vector();
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  ag::ops::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{1, 0, 0, 1, 0, 0, 0, 0}));
}

// The contract's lines for convolutional networks (DESIGN.md), as written there.
TEST(Contract, TheDesignLinesRun) {
  Tensor x = ag::randn({2, 1, 8, 8});
  const Tensor w = ag::randn({4, 1, 3, 3}), b = ag::randn({4});
  Tensor running_mean = ag::zeros({4}), running_var = ag::ones({4}), weight = ag::ones({4}), bias = ag::zeros({4});
  Tensor y = ag::ops::conv2d(x, w, b, {.stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}, .groups = 1});
  y = ag::ops::batch_norm(y, running_mean, running_var, weight, bias, /*training=*/true, /*momentum=*/0.1, /*eps=*/1e-5);
  EXPECT_EQ(ag::ops::max_pool2d(y, {.kernel_size = {2, 2}, .stride = {2, 2}}).shape(), (ag::Shape{2, 4, 4, 4}));
  EXPECT_EQ(ag::ops::avg_pool2d(y, {.kernel_size = {2, 2}, .stride = {2, 2}}).shape(), (ag::Shape{2, 4, 4, 4}));
  EXPECT_EQ(ag::ops::flatten(ag::ops::adaptive_avg_pool2d(y, {1, 1}), /*start_dim=*/1).shape(), (ag::Shape{2, 4}));
  ag::nn::Conv2d conv(/*in=*/1, /*out=*/32, /*kernel_size=*/3, {.padding = {1, 1}});
  ag::nn::BatchNorm2d bn(32);
  ag::nn::Sequential net{conv, bn, ag::nn::MaxPool2d(2), ag::nn::AvgPool2d(2), ag::nn::Flatten()};
  EXPECT_EQ(net(x).shape(), (ag::Shape{2, 32 * 2 * 2}));
}

TEST(Errors, BadShapesNameTheOpAndTheParameter) {
  const Tensor x = ag::randn({2, 4, 5, 5});
  EXPECT_ERROR([&] { ag::ops::conv2d(x, ag::randn({6, 2, 3, 3}), Tensor(), {.groups = 3}); }, "conv2d", "groups = 3",
               "must divide");
  EXPECT_ERROR([&] { ag::ops::conv2d(x, ag::randn({6, 3, 3, 3})); }, "conv2d", "x has 4 channels",
               "in_channels / groups");
  EXPECT_ERROR([&] { ag::ops::conv2d(x, ag::randn({6, 4, 7, 3})); }, "conv2d", "larger than the padded input",
               "Tensor[2, 4, 5, 5]");
  EXPECT_ERROR([&] { ag::ops::conv2d(x, ag::randn({6, 4, 3, 3}), ag::randn({5})); }, "conv2d", "bias must be [6]");
  EXPECT_ERROR([&] { ag::ops::conv2d(x, ag::randn({6, 4, 3, 3}), Tensor(), {.stride = {0, 1}}); }, "conv2d",
               "stride must be >= 1");
  EXPECT_ERROR([&] { ag::ops::conv2d(ag::randn({2, 4}), ag::randn({6, 4, 3, 3})); }, "conv2d", "[N, C, H, W]");
  EXPECT_ERROR([&] { ag::ops::conv2d(x, ag::randn({6, 4, 3, 3}).to(DType::kBFloat16)); }, "conv2d", "bfloat16");
  EXPECT_ERROR([&] { ag::ops::max_pool2d(x, {.kernel_size = {2, 2}, .padding = {2, 0}}); }, "max_pool2d",
               "at most half the kernel size");
  EXPECT_ERROR([&] { ag::ops::max_pool2d(x, {.kernel_size = {6, 6}}); }, "max_pool2d", "too small");
  EXPECT_ERROR([&] { ag::ops::avg_pool2d(ag::randn({5, 5}), {.kernel_size = {2, 2}}); }, "avg_pool2d", "[C, H, W]");
  EXPECT_ERROR([&] { ag::ops::adaptive_avg_pool2d(x, {0, 1}); }, "adaptive_avg_pool2d", "output_size");
  EXPECT_ERROR([&] { ag::ops::max_pool2d(ag::zeros({1, 1, 0, 4}), {.kernel_size = {2, 2}, .padding = {1, 1}}); },
               "max_pool2d", "H and W must be positive");
  EXPECT_ERROR([&] { ag::ops::batch_norm(x, Tensor(), Tensor(), ag::randn({3}), Tensor(), true); }, "batch_norm",
               "weight must be [4]");
  EXPECT_ERROR([&] { ag::ops::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); }, "batch_norm",
               "running statistics");
  EXPECT_ERROR([&] { ag::ops::batch_norm(ag::randn({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               "batch_norm", "more than 1 value per channel");
  EXPECT_ERROR([&] { ag::nn::BatchNorm2d(3)(ag::randn({2, 3})); }, "BatchNorm2d", "4-D");
  EXPECT_ERROR([&] { ag::nn::Conv2d(3, 4, 3, {.groups = 2}); }, "nn::Conv2d", "groups = 2");
  EXPECT_ERROR([&] { ag::ops::flatten(x, 3, 1); }, "flatten", "start_dim");
}
