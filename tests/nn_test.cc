// nn modules: Linear's initialisation and shapes, parameter order, Sequential against manual
// composition, Module::to keeping the parameter handles users hold, and clip_grad_norm_.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
#include "nn/utils.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;
using ag::test::throws_error;

namespace {

TEST(Nn, LinearShapesAndForward) {
  ag::manual_seed(1);
  ag::nn::Linear lin(10, 3);
  EXPECT_EQ(lin.weight.shape(), (ag::Shape{3, 10}));
  EXPECT_EQ(lin.bias.shape(), (ag::Shape{3}));
  EXPECT_TRUE(lin.weight.requires_grad());
  EXPECT_TRUE(lin.bias.requires_grad());
  const Tensor x = ag::randn({4, 10});
  const Tensor y = lin(x);
  EXPECT_EQ(y.shape(), (ag::Shape{4, 3}));
  EXPECT_EQ(y.to_vector(), ag::ops::linear(x, lin.weight, lin.bias).to_vector());
  EXPECT_EQ(lin.forward(x).to_vector(), y.to_vector());

  ag::nn::Linear no_bias(10, 3, ag::nn::Bias::kNo);
  EXPECT_FALSE(no_bias.bias.defined());
  ASSERT_EQ(no_bias.parameters().size(), 1u);
  EXPECT_TRUE(no_bias.parameters()[0].is_same(no_bias.weight));
  EXPECT_EQ(no_bias(x).to_vector(), ag::ops::linear(x, no_bias.weight).to_vector());
  EXPECT_TRUE(throws_error([] { ag::nn::Linear(0, 3); }, {"nn::Linear(0, 3)", "positive"}));
}

TEST(Nn, LinearInitIsUniformWithinOneOverSqrtIn) {
  ag::manual_seed(2);
  const int64_t in = 100;
  ag::nn::Linear lin(in, 300);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  for (const Tensor& p : lin.parameters()) {
    const std::vector<double> v = p.to_double_vector();
    double mean = 0, var = 0;
    std::vector<int> histogram(10, 0);
    for (double x : v) {
      ASSERT_GE(x, -bound);
      ASSERT_LE(x, bound);
      mean += x / v.size();
      ++histogram[std::min(9, static_cast<int>((x + bound) / (2 * bound) * 10))];
    }
    for (double x : v) var += (x - mean) * (x - mean) / v.size();
    // U(-b, b): mean 0, variance b^2 / 3. Bounds are about 5 standard errors at these sizes.
    const double n = static_cast<double>(v.size());
    EXPECT_NEAR(mean, 0.0, 5 * bound / std::sqrt(3 * n)) << p.to_string();
    EXPECT_NEAR(var, bound * bound / 3, 5 * bound * bound * std::sqrt(4.0 / 45 / n)) << p.to_string();
    if (v.size() >= 1000) {  // the weight: every tenth of the range holds about a tenth of the values
      for (int count : histogram) EXPECT_NEAR(count / n, 0.1, 5 * std::sqrt(0.09 / n)) << p.to_string();
    }
  }
  // Seeded: the same seed gives the same layer.
  ag::manual_seed(2);
  EXPECT_EQ(ag::nn::Linear(in, 300).weight.to_vector(), lin.weight.to_vector());
}

TEST(Nn, SequentialParametersAndForward) {
  ag::manual_seed(3);
  ag::nn::Linear l1(3, 8), l2(8, 2, ag::nn::Bias::kNo), l3(2, 1);
  ag::nn::Sequential model{l1, ag::nn::ReLU(), l2, ag::nn::ReLU(), l3};
  EXPECT_EQ(model.size(), 5u);
  // Modules are handles: the model holds the very tensors of l1, l2, l3, in module order.
  const std::vector<Tensor> ps = model.parameters();
  const std::vector<Tensor> expected{l1.weight, l1.bias, l2.weight, l3.weight, l3.bias};
  ASSERT_EQ(ps.size(), expected.size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(ps[i].is_same(expected[i])) << i;
  EXPECT_TRUE(ag::nn::ReLU().parameters().empty());

  const Tensor x = ag::randn({6, 3});
  const Tensor manual = ag::ops::linear(
      ag::ops::relu(ag::ops::linear(ag::ops::relu(ag::ops::linear(x, l1.weight, l1.bias)), l2.weight)), l3.weight,
      l3.bias);
  EXPECT_EQ(model(x).to_vector(), manual.to_vector());
  EXPECT_TRUE(model[0].parameters()[0].is_same(l1.weight));

  // Gradients reach the shared handles.
  ag::ops::sum(model(x)).backward();
  for (const Tensor& p : expected) EXPECT_TRUE(p.grad().defined()) << p.to_string();
}

TEST(Nn, ToDtypeKeepsHandlesAndConvertsValues) {
  ag::manual_seed(4);
  ag::nn::Sequential model{ag::nn::Linear(4, 5), ag::nn::ReLU(), ag::nn::Linear(5, 2)};
  const std::vector<Tensor> before = model.parameters();
  std::vector<std::vector<float>> values;
  for (const Tensor& p : before) values.push_back(p.to_vector());
  ag::ops::sum(model(ag::randn({3, 4}))).backward();
  ASSERT_TRUE(before[0].grad().defined());

  model.to(DType::kFloat16);
  const std::vector<Tensor> after = model.parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(after[i].is_same(before[i])) << i;
    EXPECT_EQ(before[i].dtype(), DType::kFloat16) << i;  // the user's handle sees the change
    EXPECT_TRUE(before[i].requires_grad()) << i;
    EXPECT_TRUE(before[i].is_leaf()) << i;
    EXPECT_FALSE(before[i].grad().defined()) << i;  // stale FP32 gradients are dropped
    EXPECT_EQ(before[i].to_vector(), Tensor::from_vector(values[i], before[i].shape()).to(DType::kFloat16).to_vector());
  }
  // The FP16 model trains: FP16 gradients on the same handles.
  const Tensor out = model(ag::randn({3, 4}, DType::kFloat16));
  EXPECT_EQ(out.dtype(), DType::kFloat16);
  ag::ops::sum(out).backward();
  EXPECT_EQ(before[0].grad().dtype(), DType::kFloat16);

  model.to(DType::kFloat32);  // back: the FP16-rounded values, widened exactly
  EXPECT_EQ(before[2].dtype(), DType::kFloat32);
  EXPECT_EQ(before[2].to_vector(), Tensor::from_vector(values[2], before[2].shape()).to(DType::kFloat16).to_vector());
}

TEST(Nn, ToCudaWithoutCudaThrowsAndLeavesTheModelUsable) {
  if (ag::cuda_is_available()) GTEST_SKIP() << "a GPU is present; this checks the CPU-only build";
  ag::nn::Linear lin(2, 2);
  EXPECT_TRUE(throws_error([&] { lin.to(ag::Device::kCUDA); }, {"CUDA"}));
  EXPECT_EQ(lin.weight.device(), ag::Device::kCPU);
  EXPECT_EQ(lin(ag::ones({1, 2})).shape(), (ag::Shape{1, 2}));
}

Tensor with_grad(const std::vector<float>& values, const std::vector<float>& grad) {
  Tensor p = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  p.set_requires_grad(true);
  p.set_grad(Tensor::from_vector(grad, p.shape()));
  return p;
}

TEST(ClipGradNorm, NormTypes) {
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    double norm_type;
    double norm;  // of the gradients {3, -4} and {12}
  };
  for (const Case& c : {Case{2.0, 13.0}, Case{1.0, 19.0}, Case{3.0, std::cbrt(27.0 + 64 + 1728)}, Case{inf, 12.0}}) {
    SCOPED_TRACE(c.norm_type);
    const Tensor a = with_grad({1, 1}, {3, -4}), b = with_grad({1}, {12});
    EXPECT_NEAR(ag::nn::utils::clip_grad_norm_({a, b}, 100.0, {.norm_type = c.norm_type}), c.norm, 1e-12);
    EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{12}));  // under max_norm: untouched
    EXPECT_NEAR(ag::nn::utils::clip_grad_norm_({a, b}, 6.0, {.norm_type = c.norm_type}), c.norm, 1e-12);
    const double coeff = 6.0 / (c.norm + 1e-6);  // PyTorch's coefficient
    EXPECT_FLOAT_EQ(a.grad().to_vector()[1], static_cast<float>(-4 * coeff));
    EXPECT_FLOAT_EQ(b.grad().to_vector()[0], static_cast<float>(12 * coeff));
  }
  const Tensor p = with_grad({1}, {1});
  EXPECT_TRUE(throws_error([&] { ag::nn::utils::clip_grad_norm_({p}, 1.0, {.norm_type = 0}); }, {"norm_type", "0"}));
  EXPECT_TRUE(throws_error([&] { ag::nn::utils::clip_grad_norm_({p}, 1.0, {.norm_type = std::nan("")}); },
                           {"norm_type"}));
  EXPECT_TRUE(throws_error([&] { ag::nn::utils::clip_grad_norm_({p}, -1.0); }, {"max_norm", "-1"}));
}

TEST(ClipGradNorm, ASharedGradientCountsOnce) {
  // A parameter listed twice (or tied in a model) is measured and scaled once.
  const Tensor p = with_grad({1, 1}, {3, 4});
  EXPECT_NEAR(ag::nn::utils::clip_grad_norm_({p, p}, 1.0), 5.0, 1e-12);
  EXPECT_FLOAT_EQ(p.grad().to_vector()[0], static_cast<float>(3 / (5 + 1e-6)));
  ag::nn::Linear lin(2, 2);
  ag::nn::Sequential tied{lin, ag::nn::ReLU(), lin};
  lin.weight.set_grad(ag::full({2, 2}, 1.0));
  lin.bias.set_grad(ag::zeros({2}));
  EXPECT_NEAR(ag::nn::utils::clip_grad_norm_(tied.parameters(), 100.0), 2.0, 1e-12);
}

TEST(ClipGradNorm, NonFiniteNorms) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    SCOPED_TRACE(bad);
    const Tensor a = with_grad({1, 1}, {bad, 1}), b = with_grad({1}, {2});
    for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
      const double norm = ag::nn::utils::clip_grad_norm_({a, b}, 1.0, {.norm_type = norm_type});
      EXPECT_FALSE(std::isfinite(norm));
      EXPECT_EQ(std::isnan(norm), std::isnan(bad));
      EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{2}));  // nothing scaled
      EXPECT_TRUE(throws_error(
          [&] { ag::nn::utils::clip_grad_norm_({a, b}, 1.0, {.norm_type = norm_type, .error_if_nonfinite = true}); },
          {"clip_grad_norm_", "non-finite", "error_if_nonfinite"}));
    }
  }
}

// The CPU norm against a long-double sum of every |g|^2, and each gradient scaled by the one
// coefficient max_norm / (norm + 1e-6).
TEST(ClipGradNorm, CpuNormIsAccurateAndScalesEveryGradientByItsCoefficient) {
  // Three dtypes, one of them large enough for several chunks of the multi-tensor pass.
  std::vector<Tensor> params, originals;
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kFloat64};
  const int64_t sizes[] = {1000, 1037, 200001};
  long double total = 0.0L;
  for (int k = 0; k < 3; ++k) {
    const int64_t n = sizes[k];
    Tensor p = ag::zeros({n}, dtypes[k]);
    p.set_requires_grad(true);
    p.set_grad(Tensor::from_vector(ag::test::random_values(static_cast<size_t>(n), -2.0, 2.0, 40 + k), {n},
                                   dtypes[k]));
    for (double v : p.grad().to_double_vector()) total += static_cast<long double>(v) * v;
    originals.push_back(Tensor::from_vector(p.grad().to_double_vector(), {n}, dtypes[k]));  // exact
    params.push_back(p);
  }
  const double reference = static_cast<double>(std::sqrt(total));
  const double norm = ag::nn::utils::clip_grad_norm_(params, 3.0);
  EXPECT_NEAR(norm, reference, reference * 1e-14);
  const double coeff = 3.0 / (norm + 1e-6);  // PyTorch's, from the norm returned
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor expected = Tensor::empty(originals[k].shape(), originals[k].dtype());
    ag::kernels::affine(originals[k], coeff, 0.0, expected);
    EXPECT_EQ(params[k].grad().to_double_vector(), expected.to_double_vector()) << k;
  }
}

TEST(ClipGradNorm, CpuNormReadsTheGradientsInPlace) {
  // 1M float32 gradient elements: a copy of them in double would be 8 MB.
  const Tensor p = with_grad(std::vector<float>(1 << 20, 0.5f), std::vector<float>(1 << 20, 0.25f));
  ag::allocator_for(ag::Device::kCPU).reset_peak();
  const int64_t live = ag::memory_stats(ag::Device::kCPU).current_bytes;
  EXPECT_DOUBLE_EQ(ag::nn::utils::clip_grad_norm_({p}, 1e9), 0.25 * 1024);
  EXPECT_LT(ag::memory_stats(ag::Device::kCPU).peak_bytes - live, 4096);
  const Tensor q = with_grad({1, 2}, {3, -4});  // and p = 1 takes its own in-place loop
  EXPECT_DOUBLE_EQ(ag::nn::utils::clip_grad_norm_({p, q}, 1e9, {.norm_type = 1.0}), 0.25 * (1 << 20) + 7);
  EXPECT_LT(ag::memory_stats(ag::Device::kCPU).peak_bytes - live, 4096);
}

// The norm as a tensor: a float64 scalar on the gradients' CPU, equal to the double; the device
// kernel pair (sum_of_squares + clip_by_norm_) gives the CPU path's bits when the sums agree.
TEST(ClipGradNorm, TensorNormAndTheDeviceKernelsOnTheCpu) {
  const Tensor a = with_grad({1, 1}, {3, -4}), b = with_grad({1}, {12});
  const Tensor norm = ag::nn::utils::clip_grad_norm_tensor_({a, b}, 6.0);
  EXPECT_EQ(norm.dtype(), DType::kFloat64);
  EXPECT_EQ(norm.device(), ag::Device::kCPU);
  EXPECT_EQ(norm.numel(), 1);
  EXPECT_EQ(norm.item<double>(), 13.0);
  EXPECT_EQ(ag::nn::utils::clip_grad_norm_tensor_({}, 1.0).item<double>(), 0.0);

  const Tensor c = with_grad({1, 1}, {3, -4}), d = with_grad({1}, {12});
  std::vector<Tensor> grads = {c.grad(), d.grad()};
  Tensor sum_sq = Tensor::empty({}, DType::kFloat64), device_norm = Tensor::empty({}, DType::kFloat64);
  ag::kernels::sum_of_squares(grads, sum_sq);
  ag::kernels::clip_by_norm_(grads, sum_sq, 6.0, device_norm);
  EXPECT_EQ(device_norm.item<double>(), 13.0);
  EXPECT_EQ(c.grad().to_vector(), a.grad().to_vector());
  EXPECT_EQ(d.grad().to_vector(), b.grad().to_vector());
  ag::kernels::clip_by_norm_(grads, sum_sq, 100.0, device_norm);  // coeff >= 1: untouched
  EXPECT_EQ(d.grad().to_vector(), b.grad().to_vector());
  EXPECT_TRUE(throws_error([&] { ag::kernels::clip_by_norm_(grads, sum_sq, 1.0, sum_sq); }, {"clip_by_norm_"}));
  sum_sq.data<double>()[0] = std::numeric_limits<double>::infinity();
  ag::kernels::clip_by_norm_(grads, sum_sq, 1.0, device_norm);  // a non-finite norm scales nothing
  EXPECT_TRUE(std::isinf(device_norm.item<double>()));
  EXPECT_EQ(d.grad().to_vector(), b.grad().to_vector());
}

}  // namespace
