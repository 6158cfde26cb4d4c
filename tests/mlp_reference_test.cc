// The MLP classifier of examples/fashion.h against PyTorch (tests/data/make_mlp_reference.py wrote
// the files once): the weights load from PyTorch's state_dict by name, and the logits, the
// cross-entropy loss and every gradient match PyTorch's, in FP32 and under FP16 autocast with a
// GradScaler.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "ampgrad.h"
#include "examples/fashion.h"

namespace ag = ampgrad;

namespace {

constexpr const char* kModelFile = "tests/data/mlp_reference_model.safetensors";
constexpr const char* kReferenceFile = "tests/data/mlp_reference.safetensors";

// The reference file's tensors by name.
std::map<std::string, ag::Tensor> reference() {
  const ag::checkpoint::NamedTensors file = ag::checkpoint::load_safetensors(kReferenceFile);
  return {file.tensors.begin(), file.tensors.end()};
}

// The generator's model (784-16-16-10) with PyTorch's weights, loaded by their state_dict names.
ag::nn::Sequential reference_model() {
  ag::nn::Sequential model = ag::fashion::make_mlp({.hidden = {16, 16}});
  ag::checkpoint::load_model(kModelFile, model);  // strict: every name present, shapes and dtypes equal
  return model;
}

// |actual - expected| <= tol * max|expected| everywhere: errors scaled to the tensor's largest
// value, since a sum of products that cancels keeps the absolute error of its terms.
::testing::AssertionResult near(const ag::Tensor& actual, const ag::Tensor& expected, double tol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << actual.to_string() << " vs expected " << expected.to_string();
  }
  const std::vector<double> a = actual.to_double_vector(), e = expected.to_double_vector();
  double scale = 0, worst = 0;
  size_t at = 0;
  for (const double v : e) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - e[i]);
    if (!(err <= worst)) {  // NaN counts as the worst
      worst = err;
      at = i;
    }
  }
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "largest error " << worst << " at [" << at << "] (" << a[at] << " vs "
                                       << e[at] << ") exceeds " << tol << " * max|expected| " << scale;
}

// Results computed with the same FP16 roundings as PyTorch's: agreement to FP32 accuracy, except
// where an FP32 sum lands so close to an FP16 rounding boundary that another summation order rounds
// it the other way (one FP16 ulp, in a few elements). A missing or extra cast to FP16 would move
// almost every element by FP16 rounding errors (about 1e-4 of the largest value here) and fail.
::testing::AssertionResult same_fp16_roundings(const ag::Tensor& actual, const ag::Tensor& expected) {
  constexpr double kFp16Ulp = 1.0 / 1024;
  if (auto all = near(actual, expected, kFp16Ulp); !all) return all;
  const std::vector<double> a = actual.to_double_vector(), e = expected.to_double_vector();
  double scale = 0;
  for (const double v : e) scale = std::max(scale, std::abs(v));
  size_t off = 0;
  for (size_t i = 0; i < a.size(); ++i) off += std::abs(a[i] - e[i]) > 2e-6 * scale;  // more than FP32 differences
  if (off * 100 <= a.size()) return ::testing::AssertionSuccess();  // at most 1%
  return ::testing::AssertionFailure() << off << " of " << a.size()
                                       << " values differ from PyTorch's by more than FP32 rounding";
}

}  // namespace

TEST(MlpReference, StateDictNamesArePyTorchs) {
  ag::nn::Sequential model = reference_model();
  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  // The loaded values are PyTorch's, not the initialisation's.
  const auto file = ag::checkpoint::load_safetensors(kModelFile);
  const auto it = std::find_if(file.tensors.begin(), file.tensors.end(), [](const auto& e) { return e.first == "0.weight"; });
  ASSERT_NE(it, file.tensors.end());
  EXPECT_EQ(model.state_dict()[0].second.to_vector(), it->second.to_vector());
}

// FP32 against PyTorch's float64 run (rounded to FP32): the only differences are FP32 rounding in
// sums of up to 784 products, a few FP32 ulps of the largest value.
TEST(MlpReference, Fp32MatchesPyTorch) {
  auto ref = reference();
  ag::nn::Sequential model = reference_model();
  const ag::Tensor logits = model(ref.at("x"));
  const ag::Tensor loss = ag::ops::cross_entropy(logits, ref.at("target"));
  loss.backward();
  constexpr double kTol = 2e-6;  // 16 FP32 ulps (2^-23) of the largest value; seen: 4e-7
  EXPECT_TRUE(near(logits, ref.at("logits"), kTol));
  EXPECT_TRUE(near(loss, ref.at("loss"), kTol));
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), ag::DType::kFloat32) << name;
    EXPECT_TRUE(near(p.grad(), ref.at("grad." + name), kTol)) << name;
  }
}

// The AMP step as training runs it (FP16 autocast, a scaled backward, unscale_) against PyTorch's
// FP16 autocast: both round the same values to FP16 at the same places (the linears' inputs,
// weights and outputs, and their gradients), so they agree to about one FP16 ulp of the largest
// value; and against the float64 run, to FP16 accuracy.
TEST(MlpReference, Fp16AutocastMatchesPyTorch) {
  auto ref = reference();
  ag::nn::Sequential model = reference_model();
  ag::optim::SGD sgd(model.parameters(), {.lr = 0.1});
  ag::amp::GradScaler scaler;
  ag::Tensor logits, loss;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kFloat16);
    logits = model(ref.at("x"));
    loss = ag::ops::cross_entropy(logits, ref.at("target"));
  }
  EXPECT_EQ(logits.dtype(), ag::DType::kFloat16);  // linear: lower precision
  EXPECT_EQ(loss.dtype(), ag::DType::kFloat32);    // cross_entropy: FP32
  scaler.scale(loss).backward();
  scaler.unscale_(sgd);

  constexpr double kTolExact = 2e-3;  // 2 FP16 ulps (2^-10) of the largest value; seen: 6e-4
  EXPECT_TRUE(same_fp16_roundings(logits, ref.at("autocast.logits")));
  EXPECT_TRUE(near(logits, ref.at("logits"), kTolExact));
  EXPECT_TRUE(same_fp16_roundings(loss, ref.at("autocast.loss")));
  EXPECT_TRUE(near(loss, ref.at("loss"), kTolExact));
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), ag::DType::kFloat32) << name;  // an FP32 parameter's grad, via the recorded casts
    EXPECT_TRUE(same_fp16_roundings(p.grad(), ref.at("autocast.grad." + name))) << name;
    EXPECT_TRUE(near(p.grad(), ref.at("grad." + name), kTolExact)) << name;
  }
}
