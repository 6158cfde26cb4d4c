// The float32 approximations of ops/math.h against double: within 2 ulp over the whole useful range
// (a dense sweep plus every power of two), and exact at the special values (0, +-inf, NaN,
// subnormal results and inputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ops/math.h"

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

}  // namespace
