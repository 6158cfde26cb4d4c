// The float32 approximations of ops/math.h against double: within 2 ulp over the whole useful range
// (a dense sweep plus every power of two), and exact at the special values (0, +-inf, NaN,
// subnormal results and inputs). The CPU's unary kernels give the same bits at every
// instruction-set level they pick at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "framework/cpu_features.h"
#include "framework/tensor.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/elementwise/unary_math.h"
#include "ops/math.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace math = ampgrad::kernels::math;

namespace {

// |actual - exact| in units of the float spacing at exact (subnormal spacing below the normals).
double ulps(float actual, double exact) {
  if (std::isnan(exact)) return std::isnan(actual) ? 0 : 1e9;
  if (std::isinf(exact)) return actual == exact ? 0 : 1e9;
  // ilogb(0) is INT_MIN, so zero (and anything below the normals) takes the subnormal spacing.
  const float rounded = static_cast<float>(exact);
  const int exponent = std::fpclassify(rounded) == FP_NORMAL ? std::ilogb(rounded) : -126;
  const double spacing = std::ldexp(1.0, exponent - 23);
  return std::abs(static_cast<double>(actual) - exact) / spacing;
}

template <typename F, typename R>
double worst_ulps(F f, R reference, float lo, float hi, int steps) {
  double worst = 0;
  for (int i = 0; i <= steps; ++i) {
    const float x = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(steps);
    worst = std::max(worst, ulps(f(x), reference(static_cast<double>(x))));
  }
  return worst;
}

TEST(FastMath, ExpWithinTwoUlps) {
  const auto f = [](float x) { return math::exp(x); };
  const auto r = [](double x) { return std::exp(x); };
  EXPECT_LE(worst_ulps(f, r, -87.0f, 88.7f, 2'000'000), 2.0);
  EXPECT_LE(worst_ulps(f, r, -103.9f, -87.0f, 200'000), 2.0);  // subnormal results
  EXPECT_LE(worst_ulps(f, r, -1e-3f, 1e-3f, 200'000), 2.0);
  EXPECT_EQ(math::exp(0.0f), 1.0f);
  EXPECT_EQ(math::exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(math::exp(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(math::exp(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(math::exp(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(math::exp(std::nanf(""))));
}

TEST(FastMath, LogWithinTwoUlps) {
  const auto f = [](float x) { return math::log(x); };
  const auto r = [](double x) { return std::log(x); };
  EXPECT_LE(worst_ulps(f, r, 1e-6f, 10.0f, 2'000'000), 2.0);
  EXPECT_LE(worst_ulps(f, r, 0.5f, 2.0f, 1'000'000), 2.0);  // around 1, where log is small
  double worst = 0;
  for (int e = -149; e < 128; ++e) {  // every power of two, subnormals included
    const float x = std::ldexp(1.0f, e);
    worst = std::max(worst, ulps(math::log(x), std::log(static_cast<double>(x))));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(math::log(1.0f), 0.0f);
  EXPECT_EQ(math::log(0.0f), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(math::log(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(math::log(-1.0f)));
  EXPECT_TRUE(std::isnan(math::log(std::nanf(""))));
}

TEST(FastMath, TanhWithinTwoUlps) {
  const auto f = [](float x) { return math::tanh(x); };
  const auto r = [](double x) { return std::tanh(x); };
  EXPECT_LE(worst_ulps(f, r, -10.0f, 10.0f, 2'000'000), 2.0);
  EXPECT_LE(worst_ulps(f, r, -0.7f, 0.7f, 1'000'000), 2.0);  // both sides of the 0.625 switch
  EXPECT_LE(worst_ulps(f, r, -1e-4f, 1e-4f, 100'000), 2.0);
  EXPECT_EQ(math::tanh(50.0f), 1.0f);
  EXPECT_EQ(math::tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(math::tanh(std::nanf(""))));
  EXPECT_TRUE(std::signbit(math::tanh(-0.0f)));
}

// Every 4099th float bit pattern (all signs, exponents and specials' neighbourhoods), a dense
// sweep of [-12, 12] and the special values, as `dtype`.
ag::Tensor unary_inputs(ag::DType dtype) {
  std::vector<double> values;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
    float f;
    const auto bits = static_cast<uint32_t>(u);
    std::memcpy(&f, &bits, sizeof f);
    values.push_back(f);
  }
  for (int i = -120000; i <= 120000; ++i) values.push_back(i * 1e-4);
  for (double v : {0.0, -0.0, 1e-45, -1e-45, 88.72, 89.0, -104.0, -110.0}) values.push_back(v);
  values.push_back(std::numeric_limits<double>::infinity());
  values.push_back(-std::numeric_limits<double>::infinity());
  values.push_back(std::numeric_limits<double>::quiet_NaN());
  return ag::Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, ag::DType::kFloat64).to(dtype);
}

TEST(UnaryKernels, EveryLevelGivesTheBaselinesBits) {
  using ag::CpuIsa;
  if (!ag::cpu_supports(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "the AVX-512 loops cannot run here: " << ag::cpu_unsupported_reason(CpuIsa::kAvx512);
  }
  if (static_cast<int>(ag::effective_cpu_isa()) < static_cast<int>(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "AMPGRAD_CPU_ISA=" << ag::cpu_isa_name(ag::cpu_isa()) << " caps the level below avx512";
  }
  constexpr size_t kOps = std::tuple_size_v<ag::kernels::UnaryFormulas>;
  for (ag::DType dtype : {ag::DType::kFloat32, ag::DType::kFloat64, ag::DType::kBFloat16, ag::DType::kFloat16}) {
    const ag::Tensor x = unary_inputs(dtype);
    const ag::Tensor dy = ag::Tensor::from_vector(std::vector<double>(static_cast<size_t>(x.numel()), 0.75),
                                                  x.shape(), ag::DType::kFloat64).to(dtype);
    for (size_t i = 0; i < kOps; ++i) {
      const auto op = static_cast<ag::kernels::UnaryOp>(i);
      ag::Tensor y[2], dx[2];
      const CpuIsa levels[2] = {CpuIsa::kBaseline, CpuIsa::kAvx512};
      for (int l = 0; l < 2; ++l) {
        y[l] = ag::Tensor::empty(x.shape(), dtype);
        dx[l] = ag::Tensor::empty(x.shape(), dtype);
        ag::kernels::cpu::unary(op, x, y[l], levels[l]);
        ag::kernels::cpu::unary_backward(op, x, y[0], dy, dx[l], levels[l]);
      }
      EXPECT_TRUE(ag::test::same_bits(y[0], y[1])) << "forward of formula " << i << " in " << ag::dtype_name(dtype);
      EXPECT_TRUE(ag::test::same_bits(dx[0], dx[1])) << "backward of formula " << i << " in " << ag::dtype_name(dtype);
    }
  }
}

}  // namespace
