// The ops of classifiers and transformers beyond the op table: losses at extreme logits, errors for
// bad targets, ids and probabilities, dropout's semantics, the autocast dtype of every new op, and
// the new modules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "framework/autograd.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/normalization.h"
#include "ops/ops.h"
#include "precision_cases.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Shape;
using ag::Tensor;

namespace {

Tensor ids(std::vector<int64_t> v, Shape shape) { return Tensor::from_vector(v, shape); }

TEST(CrossEntropy, ExtremeLogitsStayFinite) {
  for (DType low : ag::kLowPrecisionDTypes) {
    for (DType dtype : {DType::kFloat32, low}) {
      SCOPED_TRACE(::testing::Message() << ag::dtype_name(dtype) << " under " << ag::dtype_name(low) << " autocast");
      Tensor logits = Tensor::from_vector(std::vector<float>{1e4f, -1e4f, 0, -1e4f, 1e4f, 1e4f}, {2, 3}, DType::kFloat32);
      logits = logits.to(dtype);  // float16 holds +-10000 exactly, bfloat16 rounds it to 9984
      logits.set_requires_grad(true);
      Tensor loss;
      {
        ag::amp::AutocastGuard autocast(ag::Device::kCPU, low);
        loss = ag::ops::cross_entropy(logits, ids({1, 0}, {2}));
        EXPECT_EQ(loss.dtype(), DType::kFloat32);  // the loss runs in float32 under autocast
      }
      loss.backward();
      EXPECT_TRUE(std::isfinite(loss.item()));
      // Sample 0: lse - z_1 = v + v; sample 1: (v + ln 2) - (-v), v the stored 1e4. The mean: 2v + ln(2) / 2.
      const double v = logits.to_double_vector()[0];
      EXPECT_NEAR(loss.item(), 2 * v + std::log(2.0) / 2, 0.01);
      EXPECT_TRUE(ag::test::all_finite(logits.grad()));
    }
  }
  // The same at float32 without autocast, and log_softmax of extreme values.
  const Tensor big = Tensor::from_vector(std::vector<float>{1e4f, -1e4f}, {1, 2});
  EXPECT_TRUE(ag::test::all_finite(ag::ops::log_softmax(big, -1)));
  EXPECT_EQ(ag::ops::softmax(big, -1).to_vector(), (std::vector<float>{1, 0}));
}

// The loss and gradient at logit offsets up to 1e6 within float32 rounding of float64 (the CUDA
// kernel is checked the same way in cuda_test.cc).
TEST(CrossEntropy, LargeLogitOffsetsKeepFloat32Precision) {
  EXPECT_TRUE(ag::test::check_cross_entropy_at_large_offsets(ag::Device::kCPU));
  EXPECT_TRUE(ag::test::check_cross_entropy_at_large_offsets(ag::Device::kCPU, DType::kFloat64));
}

// A GPT classifier's loss under autocast: no float32 copy of the 16-bit logits, and the float32
// path's loss and gradient (cuda_test.cc checks the CUDA kernel the same way).
TEST(CrossEntropy, ReadsSixteenBitLogitsInPlaceUnderAutocast) {
  for (DType low : ag::kLowPrecisionDTypes) {
    EXPECT_TRUE(ag::test::check_cross_entropy_reads_16bit_logits_in_place(ag::Device::kCPU, low)) << ag::dtype_name(low);
  }
}

TEST(CrossEntropy, IgnoredSamplesAndMeans) {
  Tensor logits = ag::randn({4, 3});
  logits.set_requires_grad(true);
  const Tensor all_ignored = ag::ops::cross_entropy(logits, ids({-100, -100, -100, -100}, {4}));
  EXPECT_TRUE(std::isnan(all_ignored.item()));  // 0 / 0, as PyTorch
  // No samples at all: PyTorch's nan, not the sign-set NaN that 0 / 0 leaves on x86 ("-nan").
  const float none = ag::ops::cross_entropy(ag::zeros({0, 3}), ids({}, {0})).item();
  EXPECT_TRUE(std::isnan(none));
  EXPECT_FALSE(std::signbit(none));
  const Tensor loss = ag::ops::cross_entropy(logits, ids({0, 7, 1, 7}, {4}), {.ignore_index = 7});
  loss.backward();
  const std::vector<float> g = logits.grad().to_vector();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(g[3 + c], 0.0f);  // ignored rows get no gradient
    EXPECT_EQ(g[9 + c], 0.0f);
  }
  double row_sum = 0;  // softmax - one-hot sums to zero over a row
  for (int c = 0; c < 3; ++c) row_sum += g[c];
  EXPECT_NEAR(row_sum, 0.0, 1e-7);
}

// float16 logits: the mean of 70000 losses of log(8) is log(8), although neither the sum (about
// 145000) nor the count fits in float16; the gradient is 1/N-sized, not 0.
TEST(CrossEntropy, Float16MeanOverManySamplesReducesInFloat32) {
  for (int64_t n : {40000, 70000}) {
    Tensor logits = ag::zeros({n, 8}, DType::kFloat16);
    logits.set_requires_grad(true);
    Tensor loss = ag::ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>(n, 3), {n}));
    EXPECT_EQ(loss.dtype(), DType::kFloat16);
    EXPECT_NEAR(loss.item(), std::log(8.0), 2e-3) << "n = " << n;
    loss.backward();
    const std::vector<float> g = logits.grad().to_vector();
    EXPECT_NEAR(g[0], 1.0 / 8 / n, 0.02 / 8 / n) << "n = " << n;  // softmax 1/8, over n samples
    EXPECT_NEAR(g[3], -7.0 / 8 / n, 0.02 * 7 / 8 / n) << "n = " << n;
    Tensor sum = ag::ops::cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>(n, 3), {n}),
                                        {.reduction = ag::ops::Reduction::kSum});
    EXPECT_TRUE(std::isinf(sum.item())) << "a float16 sum over 65504 overflows, as in PyTorch";
  }
}

// Under float16 autocast, q and k of magnitude 150 with D = 4 have q.k = 90000 > 65504: scaling each
// by D^-1/4 before the product (as PyTorch) keeps the scores finite.
TEST(Attention, LargeQueriesStayFiniteUnderFloat16Autocast) {
  Tensor q = ag::full({1, 1, 2, 4}, 150.0);
  Tensor k = ag::full({1, 1, 2, 4}, 150.0);
  Tensor v = ag::randn({1, 1, 2, 4});
  Tensor expected = ag::ops::scaled_dot_product_attention(q, k, v, true);
  ag::amp::AutocastGuard guard(ag::Device::kCPU, DType::kFloat16);
  Tensor out = ag::ops::scaled_dot_product_attention(q, k, v, true);
  const std::vector<float> a = out.to_vector(), e = expected.to_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], e[i], 1e-2 * (1 + std::abs(e[i]))) << i;
}

TEST(CrossEntropy, BadInputIsAClearError) {
  const Tensor logits = ag::randn({3, 4});
  EXPECT_ERROR([&] { (void)ag::ops::cross_entropy(logits, ids({0, 4, 1}, {3})); }, "cross_entropy", "target 4",
               "sample 1", "[0, 4)");
  EXPECT_ERROR([&] { (void)ag::ops::cross_entropy(logits, ids({0, -1, 1}, {3})); }, "target -1");
  EXPECT_ERROR([&] { (void)ag::ops::cross_entropy(logits, ag::zeros({3})); }, "cross_entropy", "int64");
  EXPECT_ERROR([&] { (void)ag::ops::cross_entropy(logits, ids({0, 1}, {2})); }, "cross_entropy", "[N, C]", "[2]");
  EXPECT_ERROR([&] { (void)ag::ops::cross_entropy(ag::randn({3}), ids({0, 1, 2}, {3})); }, "cross_entropy");
  EXPECT_ERROR([&] { (void)ag::ops::cross_entropy(logits, ids({0, 1, 2}, {3}), {.label_smoothing = 1.5}); },
               "label_smoothing");
  EXPECT_ERROR([&] { (void)ag::ops::nll_loss(logits, ids({0, 9, 1}, {3})); }, "target 9");
}

TEST(Embedding, BadIdsAndDtypesAreClearErrors) {
  const Tensor w = ag::randn({5, 3});
  EXPECT_ERROR([&] { (void)ag::ops::embedding(ids({0, 5}, {2}), w); }, "embedding", "id 5", "position 1", "[0, 5)");
  EXPECT_ERROR([&] { (void)ag::ops::embedding(ids({-1}, {1}), w); }, "id -1");
  EXPECT_ERROR([&] { (void)ag::ops::embedding(ag::zeros({2}), w); }, "embedding", "int64");
  EXPECT_ERROR([&] { (void)ag::ops::embedding(ids({0}, {1}), ag::randn({5})); }, "embedding", "[V, C]");
  EXPECT_EQ(ag::ops::embedding(ids({3, 1, 2, 0, 4, 4}, {2, 3}), w).shape(), (Shape{2, 3, 3}));
}

TEST(Dropout, SemanticsAsPyTorch) {
  const Tensor x = ag::ones({1000});
  EXPECT_ERROR([&] { (void)ag::ops::dropout(x, 1.5); }, "dropout", "p must be in [0, 1]", "1.5");
  EXPECT_ERROR([&] { (void)ag::ops::dropout(x, -0.1); }, "dropout");
  EXPECT_TRUE(ag::ops::dropout(x, 0.3, /*training=*/false).is_same(x));
  EXPECT_TRUE(ag::ops::dropout(x, 0.0).is_same(x));
  EXPECT_EQ(ag::ops::dropout(x, 1.0).to_vector(), std::vector<float>(1000, 0.0f));
  ag::manual_seed(7);
  const std::vector<float> a = ag::ops::dropout(x, 0.3).to_vector();
  ag::manual_seed(7);
  EXPECT_EQ(ag::ops::dropout(x, 0.3).to_vector(), a);  // reproducible
  int kept = 0;
  for (float v : a) {
    EXPECT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.7f) < 1e-6f);
    kept += v != 0.0f;
  }
  EXPECT_NEAR(kept, 700, 60);  // ~4.5 standard deviations of a binomial(1000, 0.7)
  EXPECT_NE(ag::ops::dropout(x, 0.3).to_vector(), a);  // a new mask each call
}

// The same lists under FP16 and BF16 autocast, as PyTorch's (one list for both dtypes).
class AutocastPolicies : public ::testing::TestWithParam<DType> {};

TEST_P(AutocastPolicies, NewOpsFollowPyTorchsLists) {
  const DType low = GetParam();
  const Tensor x16 = ag::randn({2, 4}, low), x32 = ag::randn({2, 4});
  ag::amp::AutocastGuard autocast(ag::Device::kCPU, low);
  EXPECT_EQ(ag::ops::gelu(x16).dtype(), low);  // none: the input's dtype
  EXPECT_EQ(ag::ops::gelu(x32).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::tanh(x16).dtype(), low);
  EXPECT_EQ(ag::ops::sigmoid(x16).dtype(), low);
  EXPECT_EQ(ag::ops::exp(x16).dtype(), DType::kFloat32);  // float32
  EXPECT_EQ(ag::ops::log(x16 * x16).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::softmax(x16, -1).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::log_softmax(x16, -1).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::layer_norm(x16, Tensor(), Tensor()).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::cross_entropy(x16, ids({1, 3}, {2})).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::nll_loss(x16, ids({1, 3}, {2})).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::embedding(ids({1}, {1}), x32).dtype(), DType::kFloat32);  // the weight's dtype
  EXPECT_EQ(ag::ops::embedding(ids({1}, {1}), x16).dtype(), low);
  EXPECT_EQ(ag::ops::dropout(x16, 0.5).dtype(), low);
  EXPECT_EQ(ag::ops::div(x16, x32).dtype(), DType::kFloat32);  // promote: the widest input
  EXPECT_EQ(ag::ops::div(x16, x16).dtype(), low);
  EXPECT_EQ(ag::ops::max(x16, 1, false).dtype(), low);        // none
  EXPECT_EQ(ag::ops::sum(x16, {1}, false).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::matmul(ag::ops::reshape(x32, {1, 2, 4}), ag::ops::reshape(x32, {1, 4, 2})).dtype(), low);  // batched too
  const Tensor q = ag::randn({1, 2, 3, 4});
  EXPECT_EQ(ag::ops::scaled_dot_product_attention(q, q, q, true).dtype(), low);  // its matmuls
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AutocastPolicies, ::testing::ValuesIn(ag::kLowPrecisionDTypes),
                         [](const auto& info) { return std::string(ag::dtype_name(info.param)); });

TEST(Modules, NewLayersRegisterAndFollowTrainEval) {
  ag::manual_seed(1);
  ag::nn::Sequential model{ag::nn::Embedding(10, 8), ag::nn::LayerNorm(8), ag::nn::Linear(8, 8),
                           ag::nn::GELU(ag::ops::GeluApproximation::kTanh), ag::nn::Dropout(0.5), ag::nn::Tanh(),
                           ag::nn::Sigmoid()};
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "1.weight", "1.bias", "2.weight", "2.bias"}));
  const Tensor x = ids({1, 2, 3}, {3});
  model.eval();
  const std::vector<float> a = model(x).to_vector(), b = model(x).to_vector();
  EXPECT_EQ(a, b);  // no dropout in eval
  model.train();
  EXPECT_NE(model(x).to_vector(), a);
  EXPECT_ERROR([] { ag::nn::Dropout(2.0); }, "Dropout", "p must be in [0, 1]");
  EXPECT_ERROR([] { ag::nn::Embedding(0, 4); }, "Embedding");
  ag::nn::LayerNorm plain(4, 1e-5, ag::nn::ElementwiseAffine::kNo);
  EXPECT_TRUE(plain.parameters().empty());
}

}  // namespace
