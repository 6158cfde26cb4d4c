// float16 conversions: exhaustive half -> float, float -> half rounding at every tie, the F16C
// and bulk paths against the bit-level reference, and double -> half rounding once.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"

namespace ag = ampgrad;
using ag::Half;

namespace {

uint16_t h16(float f) { return ag::float_to_half(f).bits; }
float f32(uint16_t bits) { return ag::half_to_float(Half{bits}); }
bool is_nan_half(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0; }

// Float and half bit patterns are compared exactly; two NaNs only need to agree on NaN-ness and
// sign (NaN payloads are not specified by IEEE conversions, and F16C keeps them where the
// portable path does not).
::testing::AssertionResult same_half(uint16_t a, uint16_t b) {
  if (a == b || (is_nan_half(a) && is_nan_half(b) && (a & 0x8000u) == (b & 0x8000u))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << std::hex << "0x" << a << " vs 0x" << b;
}

::testing::AssertionResult same_float(float a, float b) {
  if (std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
      (std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << std::hexfloat << a << " vs " << b;
}

TEST(Half, EveryPatternConvertsToFloatAsTheReferenceAndRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = f32(h);
    ASSERT_TRUE(same_float(f, ag::detail::half_to_float_reference(Half{h}))) << "half 0x" << std::hex << bits;
    ASSERT_EQ(std::isnan(f), is_nan_half(h)) << "half 0x" << std::hex << bits;
    ASSERT_TRUE(same_half(h16(f), h)) << "round trip of half 0x" << std::hex << bits;
    ASSERT_TRUE(same_half(ag::detail::float_to_half_reference(f).bits, h)) << "reference round trip 0x" << std::hex << bits;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(f32(0x3c00), 1.0f);
  EXPECT_EQ(f32(0xc000), -2.0f);
  EXPECT_EQ(f32(0x7bff), 65504.0f);
  EXPECT_EQ(f32(0x0001), 0x1p-24f);   // smallest subnormal
  EXPECT_EQ(f32(0x0400), 0x1p-14f);   // smallest normal
  EXPECT_EQ(f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(f32(0x8000)));
}

TEST(Half, FloatToHalfRoundsToNearestEvenAndKeepsSubnormals) {
  EXPECT_EQ(h16(6e-8f), 0x0001);            // nearest to 5.96e-8, the smallest subnormal
  EXPECT_EQ(h16(0x1p-25f), 0x0000);         // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(h16(0x1.000002p-25f), 0x0001);  // just above the tie
  EXPECT_EQ(h16(3 * 0x1p-26f), 0x0001);     // 0.75 * 2^-24 rounds up
  EXPECT_EQ(h16(3 * 0x1p-25f), 0x0002);     // 1.5 * 2^-24: tie, even is 2
  EXPECT_EQ(h16(-0x1p-25f), 0x8000);        // sign kept on underflow
  EXPECT_EQ(h16(0x1.ff8p-15f), 0x03ff);     // the largest subnormal
  EXPECT_EQ(h16(0x1.ffcp-15f), 0x0400);     // its tie with the smallest normal: odd 0x3ff rounds up
  EXPECT_EQ(h16(1.0f + 0x1p-11f), 0x3c00);  // tie: 1.0 has an even mantissa
  EXPECT_EQ(h16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(h16(2049.0f), 0x6800);          // 2048 (ulp 2 here)
  EXPECT_EQ(h16(2051.0f), 0x6802);          // 2052
  EXPECT_EQ(h16(0.1f), 0x2e66);
}

TEST(Half, OverflowInfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(h16(65504.0f), 0x7bff);
  EXPECT_EQ(h16(65519.996f), 0x7bff);  // below the midpoint to 2^16
  EXPECT_EQ(h16(65520.0f), 0x7c00);    // the midpoint: ties to "even" 2^16, which is inf
  EXPECT_EQ(h16(-65520.0f), 0xfc00);
  EXPECT_EQ(h16(1e10f), 0x7c00);
  EXPECT_EQ(h16(inf), 0x7c00);
  EXPECT_EQ(h16(-inf), 0xfc00);
  EXPECT_TRUE(is_nan_half(h16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_nan_half(h16(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_nan_half(h16(std::bit_cast<float>(0x7f800001u))));  // payload only in the low bits
  EXPECT_TRUE(is_nan_half(ag::detail::float_to_half_reference(std::bit_cast<float>(0x7f800001u)).bits));
  EXPECT_TRUE(std::isnan(f32(0x7c01)));
}

// Every rounding decision: for each pair of adjacent halves, the floats at, just below and just
// above their midpoint, converted by F16C (or whatever float_to_half uses) and the reference.
TEST(Half, FloatToHalfMatchesReferenceAroundEveryMidpoint) {
  for (uint32_t bits = 0; bits < 0x7c00u; ++bits) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const float lo = f32(static_cast<uint16_t>(bits | sign));
      const float hi = bits + 1 == 0x7c00u ? (sign ? -65536.0f : 65536.0f) : f32(static_cast<uint16_t>((bits + 1) | sign));
      const float mid = (lo + hi) / 2;  // exact: halves have 11 significant bits
      const uint32_t m = std::bit_cast<uint32_t>(mid);
      for (uint32_t u : {m - 2, m - 1, m, m + 1, m + 2}) {
        const float f = std::bit_cast<float>(u);
        ASSERT_TRUE(same_half(h16(f), ag::detail::float_to_half_reference(f).bits)) << std::hexfloat << f;
      }
      const uint16_t expected_at_mid = (bits & 1u) ? static_cast<uint16_t>((bits + 1) | sign)
                                                   : static_cast<uint16_t>(bits | sign);
      ASSERT_EQ(h16(mid), expected_at_mid) << std::hexfloat << mid;
      ASSERT_EQ(h16(std::nextafter(mid, 0.0f)), static_cast<uint16_t>(bits | sign)) << std::hexfloat << mid;
    }
  }
}

TEST(Half, RandomFloatsScalarBulkAndReferenceAgree) {
  std::mt19937 engine(1234);
  constexpr size_t kCount = 1 << 20;
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    // Half are random bit patterns (every exponent, NaNs and infinities); half are in half's range.
    const uint32_t u = engine();
    values[i] = i % 2 ? std::bit_cast<float>(u) : std::ldexp(static_cast<float>(u) * 0x1p-32f - 0.5f, int(u % 44) - 26);
  }
  std::vector<Half> bulk(kCount);
  ag::float_to_half(values.data(), bulk.data(), kCount - 3);  // odd length: the vector loop and its tail
  bulk[kCount - 3] = bulk[kCount - 2] = bulk[kCount - 1] = Half{0x1234};
  for (size_t i = 0; i < kCount; ++i) {
    const uint16_t scalar = h16(values[i]);
    ASSERT_TRUE(same_half(scalar, ag::detail::float_to_half_reference(values[i]).bits)) << std::hexfloat << values[i];
    if (i < kCount - 3) {
      ASSERT_EQ(bulk[i].bits, scalar) << std::hexfloat << values[i];
    }
  }
  EXPECT_EQ(bulk[kCount - 1].bits, 0x1234);  // the bulk converter stops at n

  std::vector<float> back(kCount);
  ag::half_to_float(bulk.data(), back.data(), kCount - 5);
  for (size_t i = 0; i + 5 < kCount; ++i) ASSERT_TRUE(same_float(back[i], ag::half_to_float(bulk[i]))) << i;
}

// The exact double -> half rounding, for reference: find the neighbouring halves lo <= |d| < hi
// and compare |d| with their midpoint (exact in double).
uint16_t double_to_half_exact(double d) {
  if (std::isnan(d)) return 0x7e00;
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  const double a = std::abs(d);
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0, top = 0x7bff;  // binary search: the largest lo with value(lo) <= a
  while (lo < top) {
    const uint16_t probe = static_cast<uint16_t>((lo + top + 1) / 2);
    if (f32(probe) <= a) lo = probe; else top = static_cast<uint16_t>(probe - 1);
  }
  const double hi_value = lo + 1 == 0x7c00 ? 65536.0 : f32(static_cast<uint16_t>(lo + 1));
  const double mid = (f32(lo) + hi_value) / 2;
  const bool up = a > mid || (a == mid && (lo & 1u));
  return sign | static_cast<uint16_t>(lo + (up ? 1 : 0));
}

TEST(Half, DoubleToHalfRoundsOnce) {
  // 1 + 2^-11 + 2^-40 is just above the tie between 1 and 1 + 2^-10, so it rounds up. Via float
  // it would first become the tie 1 + 2^-11 and then round to even, down to 1.
  const double d = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(h16(static_cast<float>(d)), 0x3c00) << "the example must double-round via float";
  EXPECT_EQ(ag::double_to_half(d).bits, 0x3c01);
  EXPECT_EQ(ag::double_to_half(-d).bits, 0xbc01);
  EXPECT_EQ(ag::double_to_half(1.0 + 0x1p-11 - 0x1p-40).bits, 0x3c00);
  EXPECT_EQ(ag::double_to_half(0x1p-25 + 0x1p-60).bits, 0x0001);  // subnormal: via float it would be the tie -> 0
  EXPECT_EQ(ag::double_to_half(0x1p-25).bits, 0x0000);
  EXPECT_EQ(ag::double_to_half(65520.0 - 0x1p-20).bits, 0x7bff);  // via float: 65520, i.e. inf
  EXPECT_EQ(ag::double_to_half(65520.0).bits, 0x7c00);
  EXPECT_EQ(ag::double_to_half(1e300).bits, 0x7c00);
  EXPECT_EQ(ag::double_to_half(-1e-300).bits, 0x8000);
  EXPECT_TRUE(is_nan_half(ag::double_to_half(std::numeric_limits<double>::quiet_NaN()).bits));
  // The same through a tensor: from_vector(double) and to(float16) of a float64 tensor.
  const ag::Tensor t = ag::Tensor::from_vector(std::vector<double>{d}, {1}, ag::DType::kFloat16);
  EXPECT_EQ(t.data<Half>()[0].bits, 0x3c01);
  EXPECT_EQ(ag::Tensor::from_vector(std::vector<double>{d}, {1}).to(ag::DType::kFloat16).data<Half>()[0].bits, 0x3c01);
  // And through full() (zeros, ones and fills), on every device.
  std::vector<ag::Device> devices{ag::Device::kCPU};
  if (ag::cuda_is_available()) devices.push_back(ag::Device::kCUDA);
  for (const ag::Device device : devices) {
    for (const auto& [value, bits] : {std::pair{d, 0x3c01}, std::pair{-d, 0xbc01}, std::pair{0x1p-25 + 0x1p-60, 0x0001},
                                      std::pair{65520.0 - 0x1p-20, 0x7bff}}) {
      const ag::Tensor f = ag::full({3}, value, ag::DType::kFloat16, device).to(ag::Device::kCPU);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(f.data<Half>()[i].bits, bits) << std::hexfloat << value << " on " << device;
    }
  }
}

TEST(Half, DoubleToHalfMatchesExactRoundingOnRandomAndNearTieValues) {
  std::mt19937_64 engine(99);
  for (int i = 0; i < 3000; ++i) {
    const uint64_t u = engine();
    const double magnitude = std::ldexp(1.0 + static_cast<double>(u >> 11) * 0x1p-53, int(u % 42) - 26);
    // Every third value sits within a few double ulps of a half midpoint: where double rounding bites.
    double d = magnitude;
    if (i % 3 == 0) {
      const uint16_t h = h16(static_cast<float>(magnitude)) & 0x7fff;
      if (h >= 0x7bff) continue;
      const double mid = (static_cast<double>(f32(h)) + f32(static_cast<uint16_t>(h + 1))) / 2;
      d = mid + mid * 0x1p-50 * (static_cast<double>(u % 9) - 4.0);
    }
    if (u & 1u) d = -d;
    ASSERT_EQ(ag::double_to_half(d).bits, double_to_half_exact(d)) << std::hexfloat << d;
  }
}

}  // namespace
