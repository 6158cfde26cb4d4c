// Precision contracts of the ops: FP16 and BF16 GEMMs and reductions accumulate in FP32 (a long
// 16-bit accumulation would be badly off), and casts round once and send gradients back in the
// source dtype.
#include <gtest/gtest.h>

#include <cmath>
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
#include "ops/ops.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Tensor;

namespace {

constexpr int64_t kK = 4096;

// What a kernel accumulating in `dtype` would compute: each product and partial sum rounded.
double low_accumulated_dot(const std::vector<double>& a, const std::vector<double>& b, DType dtype) {
  return ag::visit_floating_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto round = [](double v) { return static_cast<double>(ag::load(ag::convert<T>(v))); };
    double acc = 0.0;
    for (size_t i = 0; i < a.size(); ++i) acc = round(acc + round(a[i] * b[i]));
    return acc;
  });
}

double exact_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0.0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

// float16 and bfloat16 alike: 16-bit inputs, FP32 accumulation, one rounding.
class LowPrecisionTest : public ::testing::TestWithParam<DType> {};

TEST_P(LowPrecisionTest, MatmulAccumulatesInFloat32) {
  const DType dtype = GetParam();
  // Ones: a 16-bit accumulator stalls (at 2048 in float16, 256 in bfloat16: adding 1 rounds
  // back); FP32 gets 4096 exactly.
  const Tensor ones_row = ag::ones({1, kK}, dtype);
  const Tensor ones_col = ag::ones({kK, 1}, dtype);
  EXPECT_EQ(ag::ops::matmul(ones_row, ones_col).item(), 4096.0f);
  EXPECT_LE(low_accumulated_dot(std::vector<double>(kK, 1.0), std::vector<double>(kK, 1.0), dtype), 2048.0);

  // Random positive values: the result must be the exact dot product rounded once (plus float
  // accumulation error, far below half a unit), while 16-bit accumulation is off by many units.
  const Tensor a = Tensor::from_vector(agt::random_values(kK, 0.5, 1.0, 1), {1, kK}, dtype);
  const Tensor b = Tensor::from_vector(agt::random_values(kK, 0.5, 1.0, 2), {kK, 1}, dtype);
  const std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector();
  const double exact = exact_dot(av, bv);
  const Tensor c = ag::ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), dtype);
  EXPECT_CLOSE(c, {exact}, dtype);
  EXPECT_FALSE(agt::all_close({low_accumulated_dot(av, bv, dtype)}, {exact}, dtype))
      << "the check above would not catch 16-bit accumulation";
  // The same through linear (x [1, K] against w [1, K]), with and without a bias.
  const Tensor w = Tensor::from_vector(bv, {1, kK}, dtype);
  const Tensor bias = Tensor::from_vector(std::vector<float>{-1000.0f}, {1}, dtype);
  EXPECT_CLOSE(ag::ops::linear(a, w), {exact}, dtype);
  EXPECT_CLOSE(ag::ops::linear(a, w, bias), {exact - 1000.0}, dtype);
}

TEST_P(LowPrecisionTest, BackwardGemmsAndReductionsAccumulateInFloat32) {
  const DType dtype = GetParam();
  // linear over a batch of K rows: dw and db sum over the batch, dx over the outputs.
  Tensor x = ag::ones({kK, 1}, dtype);
  Tensor w = ag::ones({1, 1}, dtype);
  Tensor b = ag::zeros({1}, dtype);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  ag::ops::linear(x, w, b).backward(ag::ones({kK, 1}, dtype));
  EXPECT_EQ(w.grad().dtype(), dtype);
  EXPECT_EQ(w.grad().item(), 4096.0f);
  EXPECT_EQ(b.grad().item(), 4096.0f);
  // matmul's backward: da = dc b^T sums over N.
  Tensor m = ag::ones({1, 1}, dtype);
  m.set_requires_grad(true);
  ag::ops::matmul(m, ag::ones({1, kK}, dtype)).backward(ag::ones({1, kK}, dtype));
  EXPECT_EQ(m.grad().item(), 4096.0f);
  // Reductions.
  EXPECT_EQ(ag::ops::sum(ag::ones({kK}, dtype)).item(), 4096.0f);
  // 8192 copies of 0.1 as rounded to dtype (float16: 1638 / 16384, bfloat16: 205 / 2048) sum to
  // 819 or 820 exactly; a 16-bit accumulator would stall far below.
  const double tenth = ag::full({1}, 0.1, dtype).item();
  EXPECT_EQ(static_cast<double>(ag::ops::sum(ag::full({2 * kK}, 0.1, dtype)).item()), 2 * kK * tenth);
  EXPECT_EQ(ag::ops::mean(ag::ones({3 * kK}, dtype)).item(), 1.0f);
  EXPECT_EQ(ag::ops::mse_loss(ag::ones({kK}, dtype), ag::zeros({kK}, dtype)).item(), 1.0f);
  // An element-wise broadcast gradient: d(x + b)/db sums dy over K rows.
  Tensor row = ag::zeros({2}, dtype);
  row.set_requires_grad(true);
  ag::ops::sum(ag::ones({kK, 2}, dtype) + row).backward();
  EXPECT_EQ(row.grad().to_vector(), (std::vector<float>{4096, 4096}));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LowPrecisionTest, ::testing::ValuesIn(ag::kLowPrecisionDTypes),
                         [](const auto& info) { return std::string(ag::dtype_name(info.param)); });

TEST(OpsPrecision, CastRoundsOnceAndIsDifferentiable) {
  const std::vector<double> values{0.1, 1.0 + 0x1p-11 + 0x1p-40, 70000.0, -3e-8, 2.5};
  Tensor d = Tensor::from_vector(values, {5});
  d.set_requires_grad(true);
  const Tensor h = ag::ops::cast(d, DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(h.data<ag::Half>()[i].bits, ag::double_to_half(values[i]).bits) << i;
  // bfloat16 likewise, from double directly: 1 + 2^-8 + 2^-40 rounds up (through float, down).
  const Tensor trap = Tensor::from_vector(std::vector<double>{1.0 + 0x1p-8 + 0x1p-40}, {1});
  const Tensor bh = ag::ops::cast(trap, DType::kBFloat16);
  EXPECT_EQ(bh.to_double_vector()[0], 1.0 + 0x1p-7);
  EXPECT_EQ(h.grad_fn()->name(), "cast");
  // The backward of a cast casts the gradient back to the source dtype.
  h.backward(Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 0.5f}, {5}, DType::kFloat16));
  EXPECT_EQ(d.grad().dtype(), DType::kFloat64);
  EXPECT_EQ(d.grad().to_double_vector(), (std::vector<double>{1, 2, 3, 4, 0.5}));
  // float32 -> float64 -> float16 through two casts accumulates into the float32 leaf.
  Tensor f = Tensor::from_vector(std::vector<float>{1, 2}, {2});
  f.set_requires_grad(true);
  ag::ops::sum(ag::ops::cast(ag::ops::cast(f, DType::kFloat64), DType::kFloat16) * 3.0f).backward();
  EXPECT_EQ(f.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(f.grad().to_vector(), (std::vector<float>{3, 3}));
  // Casting to the same dtype is the identity (no node).
  EXPECT_TRUE(ag::ops::cast(f, DType::kFloat32).is_same(f));
}

TEST(OpsPrecision, MixedDtypesPromoteToTheWider) {
  // float16 + bfloat16 meet in float32, where both values are exact.
  const Tensor bf = Tensor::from_vector(std::vector<float>{1e30f, 3.0f}, {2}, DType::kBFloat16);
  const Tensor hf = Tensor::from_vector(std::vector<float>{1.0f / 1024, 0.25f}, {2}, DType::kFloat16);
  EXPECT_EQ((bf + hf).dtype(), DType::kFloat32);
  EXPECT_EQ((hf * bf).to_vector()[1], 0.75f);
  const Tensor h = Tensor::from_vector(std::vector<float>{1.5f, 2}, {2}, DType::kFloat16);
  const Tensor f = Tensor::from_vector(std::vector<float>{0.25f, 1e-4f}, {2});
  const Tensor d = Tensor::from_vector(std::vector<double>{1e-10, 0}, {2});
  EXPECT_EQ((h + f).dtype(), DType::kFloat32);
  EXPECT_EQ((f * h).dtype(), DType::kFloat32);
  EXPECT_EQ((h - d).dtype(), DType::kFloat64);
  EXPECT_EQ((h + f).to_vector(), (std::vector<float>{1.75f, 2.0f + 1e-4f}));  // 1e-4 survives: added in float32
  EXPECT_EQ((h + d).to_double_vector()[0], 1.5 + 1e-10);
}

}  // namespace
