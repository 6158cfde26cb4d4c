// Large reductions against float64: sums accumulate in double in pieces fixed by the shape, so the
// relative error stays below 1e-5 at tens of millions of elements (float accumulators were off by
// 2.4% for mean(full({2e7}, 0.1))), and the bits do not depend on the number of threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "framework/autograd.h"
#include "framework/parallel.h"
#include "framework/tensor.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;

namespace {

double relative_error(double actual, double expected) { return std::abs(actual - expected) / std::abs(expected); }

TEST(ReductionAccuracy, MeanAndSumOfTwentyMillion) {
  const int64_t n = 20'000'000;
  const Tensor x = ag::full({n}, 0.1);
  const double point_one = static_cast<double>(0.1f);  // the float32 value every element holds
  EXPECT_LE(relative_error(ag::ops::mean(x).item<double>(), point_one), 1e-5);
  EXPECT_LE(relative_error(ag::ops::sum(x).item<double>(), point_one * static_cast<double>(n)), 1e-5);
  // Over a dimension too, and in float16 (accumulated in double, rounded once).
  EXPECT_LE(relative_error(ag::ops::mean(ag::ops::reshape(x, {4, n / 4}), {1}).to_vector<double>()[3], point_one),
            1e-5);
  const Tensor h = ag::full({n}, 0.25, DType::kFloat16);
  EXPECT_EQ(ag::ops::mean(h).item<double>(), 0.25);
}

TEST(ReductionAccuracy, MseOfFourMillion) {
  const int64_t n = 4'000'000;
  const double d = static_cast<double>(0.3f);
  const float loss = ag::ops::mse_loss(ag::full({n}, 0.3), ag::zeros({n})).item();
  EXPECT_LE(relative_error(loss, static_cast<double>(static_cast<float>(d * d))), 1e-6);
}

TEST(ReductionAccuracy, BiasGradientOverTenMillionRows) {
  // The bias gradient of a linear layer sums dy over the rows: 1e7 rows of 0.1 per column.
  const int64_t rows = 10'000'000;
  Tensor b = ag::zeros({2});
  b.set_requires_grad(true);
  const Tensor x = ag::zeros({rows, 1}), w = ag::zeros({2, 1});
  ag::ops::linear(x, w, b).backward(ag::full({rows, 2}, 0.1));
  const double expected = static_cast<double>(0.1f) * static_cast<double>(rows);
  for (float g : b.grad().to_vector()) EXPECT_LE(relative_error(g, expected), 1e-5);
}

TEST(ReductionAccuracy, RandomDataMatchesFloat64AndIgnoresThreads) {
  const int64_t n = 10'000'000;
  const std::vector<double> values = ag::test::random_values(static_cast<size_t>(n), -1.0, 3.0, 5);
  const Tensor x = Tensor::from_vector(values, {n}, DType::kFloat32);
  double expected = 0.0;
  for (float v : x.to_vector()) expected += static_cast<double>(v);
  const Tensor columns = ag::ops::reshape(x, {n / 8, 8});
  const int before = ag::num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    ag::set_num_threads(threads);
    results.push_back({ag::ops::sum(x).item(), ag::ops::sum(columns, {0}).to_vector()[5],
                       ag::ops::sum(columns, {1}).to_vector()[7]});
  }
  ag::set_num_threads(before);
  EXPECT_LE(relative_error(results[0][0], expected), 1e-6);
  EXPECT_EQ(results[1], results[0]);  // bit for bit, whatever the thread count
  EXPECT_EQ(results[2], results[0]);
}

// The sum of squares over many tensors (clip_grad_norm_'s squared norm): multiples of 1/8 square
// and add exactly in double, so the result is exact; the bits do not depend on the thread count.
TEST(ReductionAccuracy, SumOfSquaresOverManyTensorsIsExactAndThreadCountFree) {
  std::vector<Tensor> xs;
  double expected = 0.0;
  const DType dtypes[] = {DType::kFloat16, DType::kFloat32, DType::kFloat64};
  const int64_t sizes[] = {0, 1, 7, 65536, 65537, 300'001};
  for (size_t k = 0; k < std::size(sizes); ++k) {
    std::vector<double> v = ag::test::random_values(static_cast<size_t>(sizes[k]), -4.0, 4.0, 50 + k);
    for (double& x : v) {
      x = std::round(x * 8.0) / 8.0;
      expected += x * x;
    }
    xs.push_back(Tensor::from_vector(v, {sizes[k]}, dtypes[k % 3]));
  }
  Tensor out = Tensor::empty({}, DType::kFloat64);
  ag::kernels::sum_of_squares(xs, out);
  EXPECT_EQ(out.item<double>(), expected);
  const int threads = ag::num_threads();
  ag::set_num_threads(1);
  Tensor serial = Tensor::empty({}, DType::kFloat64);
  ag::kernels::sum_of_squares({ag::full({1'000'003}, 0.1), ag::full({77}, 0.3, DType::kFloat16)}, serial);
  ag::set_num_threads(threads);
  ag::kernels::sum_of_squares({ag::full({1'000'003}, 0.1), ag::full({77}, 0.3, DType::kFloat16)}, out);
  EXPECT_EQ(out.item<double>(), serial.item<double>());
  ag::kernels::sum_of_squares({}, out);
  EXPECT_EQ(out.item<double>(), 0.0);
  EXPECT_ERROR([&] {
    Tensor f32 = Tensor::empty({});
    ag::kernels::sum_of_squares(xs, f32);
  }, "sum_of_squares", "one float64 element");
  EXPECT_ERROR([&] { ag::kernels::sum_of_squares({Tensor::from_vector(std::vector<int64_t>{1}, {1})}, out); },
               "sum_of_squares", "int64", "hint");
}

}  // namespace
