// Precision contracts of the ops: FP16 GEMMs and reductions accumulate in FP32 (a long FP16
// accumulation would be badly off), and casts round once and send gradients back in the source dtype.
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

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Tensor;

namespace {

constexpr int64_t kK = 4096;

// What a kernel accumulating in FP16 would compute: each partial sum rounded to half.
double half_accumulated_dot(const std::vector<double>& a, const std::vector<double>& b) {
  float acc = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    acc = ag::half_to_float(ag::float_to_half(acc + ag::half_to_float(ag::float_to_half(static_cast<float>(a[i] * b[i])))));
  }
  return acc;
}

double exact_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0.0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

TEST(OpsPrecision, Float16MatmulAccumulatesInFloat32) {
  // Ones: an FP16 accumulator stops at 2048 (2048 + 1 rounds back to 2048); FP32 gets 4096 exactly.
  const Tensor ones_row = ag::ones({1, kK}, DType::kFloat16);
  const Tensor ones_col = ag::ones({kK, 1}, DType::kFloat16);
  EXPECT_EQ(ag::ops::matmul(ones_row, ones_col).item(), 4096.0f);
  EXPECT_EQ(half_accumulated_dot(std::vector<double>(kK, 1.0), std::vector<double>(kK, 1.0)), 2048.0);

  // Random positive values: the result must be the exact dot product rounded once (plus float
  // accumulation error, far below a half ulp), while FP16 accumulation is off by many ulps.
  const Tensor a = Tensor::from_vector(agt::random_values(kK, 0.5, 1.0, 1), {1, kK}, DType::kFloat16);
  const Tensor b = Tensor::from_vector(agt::random_values(kK, 0.5, 1.0, 2), {kK, 1}, DType::kFloat16);
  const std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector();
  const double exact = exact_dot(av, bv);
  const Tensor c = ag::ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::kFloat16);
  EXPECT_CLOSE(c, {exact}, DType::kFloat16);
  EXPECT_FALSE(agt::all_close({half_accumulated_dot(av, bv)}, {exact}, DType::kFloat16))
      << "the check above would not catch FP16 accumulation";
  // The same through linear (x [1, K] against w [1, K]), with and without a bias.
  const Tensor w = Tensor::from_vector(bv, {1, kK}, DType::kFloat16);
  const Tensor bias = Tensor::from_vector(std::vector<float>{-1000.0f}, {1}, DType::kFloat16);
  EXPECT_CLOSE(ag::ops::linear(a, w), {exact}, DType::kFloat16);
  EXPECT_CLOSE(ag::ops::linear(a, w, bias), {exact - 1000.0}, DType::kFloat16);
}

TEST(OpsPrecision, Float16BackwardGemmsAndReductionsAccumulateInFloat32) {
  // linear over a batch of K rows: dw and db sum over the batch, dx over the outputs.
  Tensor x = ag::ones({kK, 1}, DType::kFloat16);
  Tensor w = ag::ones({1, 1}, DType::kFloat16);
  Tensor b = ag::zeros({1}, DType::kFloat16);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  ag::ops::linear(x, w, b).backward(ag::ones({kK, 1}, DType::kFloat16));
  EXPECT_EQ(w.grad().dtype(), DType::kFloat16);
  EXPECT_EQ(w.grad().item(), 4096.0f);
  EXPECT_EQ(b.grad().item(), 4096.0f);
  // matmul's backward: da = dc b^T sums over N.
  Tensor m = ag::ones({1, 1}, DType::kFloat16);
  m.set_requires_grad(true);
  ag::ops::matmul(m, ag::ones({1, kK}, DType::kFloat16)).backward(ag::ones({1, kK}, DType::kFloat16));
  EXPECT_EQ(m.grad().item(), 4096.0f);
  // Reductions.
  EXPECT_EQ(ag::ops::sum(ag::ones({kK}, DType::kFloat16)).item(), 4096.0f);
  // 8192 * half(0.1) = 8192 * 1638 / 16384 = 819 exactly; FP16 accumulation would stall near 256.
  EXPECT_EQ(ag::ops::sum(ag::full({2 * kK}, 0.1, DType::kFloat16)).item(), 819.0f);
  EXPECT_EQ(ag::ops::mean(ag::ones({3 * kK}, DType::kFloat16)).item(), 1.0f);
  EXPECT_EQ(ag::ops::mse_loss(ag::ones({kK}, DType::kFloat16), ag::zeros({kK}, DType::kFloat16)).item(), 1.0f);
  // An element-wise broadcast gradient: d(x + b)/db sums dy over K rows.
  Tensor row = ag::zeros({2}, DType::kFloat16);
  row.set_requires_grad(true);
  ag::ops::sum(ag::ones({kK, 2}, DType::kFloat16) + row).backward();
  EXPECT_EQ(row.grad().to_vector(), (std::vector<float>{4096, 4096}));
}

TEST(OpsPrecision, CastRoundsOnceAndIsDifferentiable) {
  const std::vector<double> values{0.1, 1.0 + 0x1p-11 + 0x1p-40, 70000.0, -3e-8, 2.5};
  Tensor d = Tensor::from_vector(values, {5});
  d.set_requires_grad(true);
  const Tensor h = ag::ops::cast(d, DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(h.data<ag::Half>()[i].bits, ag::double_to_half(values[i]).bits) << i;
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
