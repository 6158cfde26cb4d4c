// Op input checks: shape, rank and dtype mismatches throw ampgrad::Error naming the op, the
// shapes and the dtypes; mse_loss refuses to broadcast. Also zero-size inputs, which must not crash.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "ops/ops.h"
#include "test_util.h"
#include "zero_size_cases.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;
using ag::test::throws_error;

namespace {

TEST(OpsErrors, LinearShapes) {
  const Tensor x = ag::randn({4, 3}), w = ag::randn({5, 4}), b = ag::randn({5});
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(x, w, b); }, {"linear", "[4, 3]", "[5, 4]", "3 features", "expects 4"}));
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(x, ag::randn({5, 3}), ag::randn({4})); }, {"linear", "b must be [5]", "[4]"}));
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(ag::randn({}), w); }, {"linear", "[..., in]", "Tensor[] float32"}));
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(x, ag::randn({2, 5, 3})); }, {"linear", "[2, 5, 3]"}));
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(Tensor(), w); }, {"linear", "x", "undefined"}));
}

TEST(OpsErrors, LinearDtypes) {
  const Tensor x = ag::randn({4, 3}), w = ag::randn({5, 3}, DType::kFloat16);
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(x, w); }, {"linear", "different dtypes", "[4, 3] float32", "[5, 3] float16"}));
  EXPECT_TRUE(throws_error([&] { ag::ops::linear(x, ag::randn({5, 3}), ag::randn({5}, DType::kFloat64)); },
                           {"linear", "b: Tensor[5] float64"}));
}

TEST(OpsErrors, MatmulShapesAndDtypes) {
  EXPECT_TRUE(throws_error([] { ag::ops::matmul(ag::randn({2, 3}), ag::randn({2, 3})); },
                          {"matmul", "[2, 3]", "[..., K, N]", "disagree on K", "3 vs 2"}));
  EXPECT_TRUE(throws_error([] { ag::ops::matmul(ag::randn({2, 3, 1}), ag::randn({3, 1})); }, {"matmul", "[2, 3, 1]"}));
  EXPECT_TRUE(throws_error([] { ag::ops::matmul(ag::randn({2, 3, 4}), ag::randn({5, 4, 2})); },
                           {"matmul (batch dimensions)", "[2]", "[5]", "dimension -1"}));
  EXPECT_TRUE(throws_error([] { ag::ops::matmul(ag::randn({}), ag::randn({3})); }, {"matmul", "rank >= 1"}));
  EXPECT_TRUE(throws_error([] { ag::ops::matmul(ag::randn({2, 3}), ag::randn({3, 4}, DType::kFloat16)); },
                           {"matmul", "float32", "float16"}));
}

TEST(OpsErrors, ElementwiseBroadcastShapes) {
  const Tensor a = ag::randn({2, 3});
  EXPECT_TRUE(throws_error([&] { (void)(a + ag::randn({4})); }, {"add", "[2, 3]", "[4]", "cannot be broadcast"}));
  EXPECT_TRUE(throws_error([&] { (void)(ag::randn({2}) - a); }, {"sub", "[2]", "[2, 3]"}));
  EXPECT_TRUE(throws_error([&] { (void)(a * ag::randn({3, 1})); }, {"mul", "[3, 1]", "dimension -2"}));
  EXPECT_TRUE(throws_error([&] { (void)(a + ag::randn({3, 2})); }, {"add", "[3, 2]", "dimension -1"}));
  EXPECT_TRUE(throws_error([&] { (void)(ag::randn({5, 1, 3}) + ag::randn({4, 2, 3})); },
                           {"add", "[5, 1, 3]", "[4, 2, 3]", "dimension -3", "neither is 1"}));
  // Mixed dtypes are promoted before the checks run, so the message shows the promoted inputs.
  EXPECT_TRUE(throws_error([&] { (void)(ag::randn({1, 4, 2}, DType::kFloat16) - ag::randn({3, 2})); },
                           {"sub", "[1, 4, 2] float32", "[3, 2] float32"}));
}

TEST(OpsErrors, MseLossNeedsEqualShapes) {
  // The classic bug: predictions [N, 1] against targets [N] would broadcast to [N, N] elsewhere.
  EXPECT_TRUE(throws_error([] { ag::ops::mse_loss(ag::randn({4, 1}), ag::randn({4})); },
                           {"mse_loss", "equal shapes", "[4, 1]", "[4]"}));
  EXPECT_TRUE(throws_error([] { ag::ops::mse_loss(ag::randn({4}), ag::randn({1})); }, {"mse_loss", "[4]", "[1]"}));
  EXPECT_TRUE(throws_error([] { ag::ops::mse_loss(ag::randn({4}), ag::randn({4}, DType::kFloat16)); },
                           {"mse_loss", "float32", "float16"}));
  EXPECT_TRUE(throws_error([] { ag::ops::mse_loss(ag::randn({4}), Tensor()); }, {"mse_loss", "target", "undefined"}));
}

TEST(OpsErrors, UndefinedInputs) {
  EXPECT_TRUE(throws_error([] { ag::ops::sum(Tensor()); }, {"sum", "undefined"}));
  EXPECT_TRUE(throws_error([] { ag::ops::mean(Tensor()); }, {"mean", "undefined"}));
  EXPECT_TRUE(throws_error([] { (void)(Tensor() * 2.0f); }, {"affine", "undefined"}));
  EXPECT_TRUE(throws_error([] { ag::ops::matmul(ag::randn({2, 2}), Tensor()); }, {"matmul", "undefined"}));
}

TEST(OpsErrors, FailedOpsRecordNothing) {
  Tensor w = ag::randn({5, 4});
  w.set_requires_grad(true);
  EXPECT_THROW(ag::ops::linear(ag::randn({4, 3}), w), ag::Error);
  // The failed call left no trace: a correct one works and its backward reaches w once.
  ag::ops::sum(ag::ops::linear(ag::ones({1, 4}), w)).backward();
  EXPECT_EQ(w.grad().to_vector(), std::vector<float>(20, 1.0f));
}

TEST(OpsEdgeCases, ZeroSizeTensors) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    // No rows: the weight gradients sum over nothing and are zero.
    Tensor x = ag::zeros({0, 3}, dtype), w = ag::ones({5, 3}, dtype), b = ag::ones({5}, dtype);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    const Tensor y = ag::ops::linear(x, w, b);
    EXPECT_EQ(y.shape(), (ag::Shape{0, 5}));
    ag::ops::sum(y).backward();
    EXPECT_EQ(w.grad().to_vector(), std::vector<float>(15, 0.0f));
    EXPECT_EQ(b.grad().to_vector(), std::vector<float>(5, 0.0f));
    EXPECT_EQ(x.grad().numel(), 0);
    // No outputs (with a bias): x's gradient sums over nothing.
    Tensor x2 = ag::ones({2, 3}, dtype), w2 = ag::ones({0, 3}, dtype), b2 = ag::ones({0}, dtype);
    for (Tensor* t : {&x2, &w2, &b2}) t->set_requires_grad(true);
    ag::ops::sum(ag::ops::linear(x2, w2, b2)).backward();
    EXPECT_EQ(x2.grad().to_vector(), std::vector<float>(6, 0.0f));
    EXPECT_EQ(b2.grad().numel(), 0);
    // Reductions of nothing: sum 0, mean and mse NaN (as PyTorch).
    EXPECT_EQ(ag::ops::sum(ag::zeros({2, 0}, dtype)).item(), 0.0f);
    EXPECT_TRUE(std::isnan(ag::ops::mean(ag::zeros({0}, dtype)).item()));
    EXPECT_TRUE(std::isnan(ag::ops::mse_loss(ag::zeros({0}, dtype), ag::zeros({0}, dtype)).item()));
    // Broadcasting a row over no rows.
    Tensor row = ag::ones({4}, dtype);
    row.set_requires_grad(true);
    const Tensor prod = ag::zeros({0, 4}, dtype) * row;
    EXPECT_EQ(prod.shape(), (ag::Shape{0, 4}));
    ag::ops::sum(prod + row).backward();
    EXPECT_EQ(row.grad().to_vector(), std::vector<float>(4, 0.0f));
  }
}

// Every zero-size row (tests/zero_size_cases.cc) in every floating dtype on the CPU; cuda_test.cc
// runs the same rows on CUDA.
class ZeroSizeTest : public ::testing::TestWithParam<std::tuple<ag::test::ZeroSizeCase, DType>> {};

TEST_P(ZeroSizeTest, GivesPyTorchsShapeAndEmptyOrZeroGradients) {
  const auto& [c, dtype] = GetParam();
  EXPECT_TRUE(ag::test::check_zero_size_case(c, dtype, ag::Device::kCPU));
}

INSTANTIATE_TEST_SUITE_P(Ops, ZeroSizeTest,
                         ::testing::Combine(::testing::ValuesIn(ag::test::zero_size_cases()),
                                            ::testing::ValuesIn(ag::kFloatingDTypes)),
                         ag::test::row_and_dtype_name);

}  // namespace
