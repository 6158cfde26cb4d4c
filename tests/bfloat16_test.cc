// bfloat16 conversions: every pattern to float, every rounding midpoint from float, all 2^32 floats
// through each vectorised path against the scalar reference, the reference against an independent
// exact rounding, and double / int64 -> bfloat16 rounded once.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "framework/bfloat16.h"
#include "framework/cpu_features.h"
#include "framework/dtype.h"
#include "framework/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace ag = ampgrad;
using ag::BFloat16;
using ag::detail::Bf16Path;

namespace {

constexpr Bf16Path kPaths[] = {Bf16Path::kScalar, Bf16Path::kAvx2, Bf16Path::kAvx512};

std::string path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::kScalar: return "scalar";
    case Bf16Path::kAvx2: return "avx2";
    case Bf16Path::kAvx512: return "avx512";
  }
  return "?";
}

bool is_nan_bf16(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// An independent exact rounding of a finite double to bfloat16 bits: the two bfloat16 neighbours
// of |d| by search over the ordered bit patterns, and the nearer by exact double arithmetic (each
// difference is exact by Sterbenz's lemma, or because both values are multiples of 2^-1074 far
// below double's precision), ties to the even pattern.
uint16_t nearest_bf16(double d) {
  const uint16_t sign = std::signbit(d) ? 0x8000u : 0u;
  const double a = std::fabs(d);
  const auto value = [](uint32_t bits) { return static_cast<double>(std::bit_cast<float>(bits << 16)); };
  uint32_t lo = 0, hi = 0x7f80;  // value(lo) <= a < value(hi) once narrowed; 0x7f80 is inf
  if (a >= value(0x7f7f) + std::ldexp(1.0, 127 - 8)) return sign | 0x7f80u;  // at or past the midpoint to 2^128
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (value(mid) <= a ? lo : hi) = mid;
  }
  const double below = a - value(lo), above = value(hi) - a;
  const uint32_t pick = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

// Runs one bulk path over `in` and checks it against the scalar reference, bit for bit.
::testing::AssertionResult path_matches(Bf16Path path, const std::vector<float>& in) {
  std::vector<BFloat16> out(in.size());
  ag::detail::float_to_bfloat16_with(path, in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t expected = ag::bf16::from_float_bits(std::bit_cast<uint32_t>(in[i]));
    if (out[i].bits != expected) {
      return ::testing::AssertionFailure() << path_name(path) << ": float 0x" << std::hex
                                           << std::bit_cast<uint32_t>(in[i]) << " -> 0x" << out[i].bits
                                           << ", reference 0x" << expected;
    }
  }
  return ::testing::AssertionSuccess();
}

// The floats on and around every rounding midpoint: for each bfloat16 pattern b below inf, the
// midpoint to the next pattern and its two float neighbours, in both signs.
std::vector<float> midpoint_floats() {
  std::vector<float> out;
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    const uint32_t mid = (b << 16) | 0x8000u;
    for (uint32_t u : {mid - 1, mid, mid + 1}) {
      out.push_back(std::bit_cast<float>(u));
      out.push_back(std::bit_cast<float>(u | 0x80000000u));
    }
  }
  return out;
}

#define SKIP_UNLESS_AVAILABLE(path)                                                                 \
  do {                                                                                             \
    if (!ag::detail::bf16_path_available(path))                                                    \
      GTEST_SKIP() << "the " << path_name(path) << " path is not available: "                      \
                   << ((path) == Bf16Path::kAvx512 ? "this CPU lacks AVX-512 F/BW/DQ/VL"            \
                                                   : "ampgrad was built without -mavx2");           \
  } while (false)

class Bf16PathTest : public ::testing::TestWithParam<Bf16Path> {};

TEST_P(Bf16PathTest, EveryPatternWidensExactly) {
  SKIP_UNLESS_AVAILABLE(GetParam());
  std::vector<BFloat16> in(65536);
  for (uint32_t b = 0; b < 65536; ++b) in[b] = BFloat16{static_cast<uint16_t>(b)};
  std::vector<float> out(in.size());
  ag::detail::bfloat16_to_float_with(GetParam(), in.data(), out.data(), in.size());
  for (uint32_t b = 0; b < 65536; ++b) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[b]), b << 16) << "bfloat16 0x" << std::hex << b;
    ASSERT_EQ(std::isnan(out[b]), is_nan_bf16(static_cast<uint16_t>(b))) << "bfloat16 0x" << std::hex << b;
  }
  // And back: every value returns to its pattern; a signalling NaN comes back quiet, sign kept.
  std::vector<BFloat16> back(in.size());
  ag::detail::float_to_bfloat16_with(GetParam(), out.data(), back.data(), out.size());
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t expected = is_nan_bf16(static_cast<uint16_t>(b)) ? static_cast<uint16_t>(b | 0x40u) : b;
    ASSERT_EQ(back[b].bits, expected) << "round trip of 0x" << std::hex << b;
  }
}

TEST_P(Bf16PathTest, EveryMidpointRoundsToEven) {
  SKIP_UNLESS_AVAILABLE(GetParam());
  const std::vector<float> in = midpoint_floats();
  ASSERT_TRUE(path_matches(GetParam(), in));
  // The reference itself, against the definition: below a midpoint rounds down, above rounds up,
  // on it to the even pattern (the largest finite value's midpoint rounds to inf).
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    const uint32_t mid = (b << 16) | 0x8000u;
    const uint16_t even = static_cast<uint16_t>(b % 2 == 0 ? b : b + 1);
    ASSERT_EQ(ag::float_to_bfloat16(std::bit_cast<float>(mid - 1)).bits, b) << std::hex << mid;
    ASSERT_EQ(ag::float_to_bfloat16(std::bit_cast<float>(mid)).bits, even) << std::hex << mid;
    ASSERT_EQ(ag::float_to_bfloat16(std::bit_cast<float>(mid + 1)).bits, b + 1) << std::hex << mid;
    ASSERT_EQ(ag::float_to_bfloat16(-std::bit_cast<float>(mid)).bits, even | 0x8000u) << std::hex << mid;
  }
}

// Every one of the 2^32 float patterns (every subnormal, every NaN payload, both infinities):
// the bulk path gives the scalar reference's bits. Lengths vary so the scalar tails run too.
TEST_P(Bf16PathTest, AllFloatsMatchTheReference) {
  SKIP_UNLESS_AVAILABLE(GetParam());
  if (GetParam() == Bf16Path::kScalar) GTEST_SKIP() << "the scalar path is the reference itself";
#if defined(__SANITIZE_ADDRESS__)
  constexpr uint64_t kStride = 61;  // instrumented code is ~10x slower: every 61st chunk
#else
  constexpr uint64_t kStride = 1;
#endif
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<float> in(kChunk);
  std::vector<BFloat16> out(kChunk);
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kChunk * kStride) {
    for (uint64_t i = 0; i < kChunk; ++i) in[i] = std::bit_cast<float>(static_cast<uint32_t>(base + i));
    const size_t n = kChunk - (base >> 16) % 17;  // 0 to 16 fewer: every tail length
    ag::detail::float_to_bfloat16_with(GetParam(), in.data(), out.data(), n);
    uint32_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad |= out[i].bits ^ ag::bf16::from_float_bits(static_cast<uint32_t>(base + i));
    if (bad != 0) {
      std::vector<float> chunk(in.begin(), in.begin() + static_cast<int64_t>(n));
      ASSERT_TRUE(path_matches(GetParam(), chunk));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Bf16PathTest, ::testing::ValuesIn(kPaths),
                         [](const auto& info) { return path_name(info.param); });

TEST(BFloat16, ReferenceAgreesWithAnIndependentExactRounding) {
  // Every midpoint neighbourhood, every float subnormal (the smallest exponent, where rounding
  // runs through the subnormal/normal boundary) and random floats of every exponent.
  std::vector<float> in = midpoint_floats();
  for (uint32_t u = 0; u < (1u << 23); ++u) in.push_back(std::bit_cast<float>(u));
  std::mt19937 rng(7);
  while (in.size() < (1u << 23) + 2000000) {
    const uint32_t u = static_cast<uint32_t>(rng()) & 0x7fffffffu;
    if (u < 0x7f800000u) in.push_back(std::bit_cast<float>(u | (in.size() % 2 == 0 ? 0x80000000u : 0u)));
  }
  for (float f : in) {
    if (std::isnan(f)) continue;
    const uint16_t reference = ag::float_to_bfloat16(f).bits;
    ASSERT_EQ(reference, nearest_bf16(f)) << std::hexfloat << f;
    ASSERT_EQ(ag::double_to_bfloat16(static_cast<double>(f)).bits, reference) << std::hexfloat << f;
  }
}

TEST(BFloat16, KnownValues) {
  EXPECT_EQ(ag::float_to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(ag::float_to_bfloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(ag::bfloat16_to_float(BFloat16{0x3f81}), 1.0f + 0x1p-7f);  // eps is 2^-7
  EXPECT_EQ(ag::float_to_bfloat16(1.0f + 0x1p-8f).bits, 0x3f80);       // a tie: to even (1)
  EXPECT_EQ(ag::float_to_bfloat16(1.0f + 0x1p-8f + 0x1p-23f).bits, 0x3f81);
  EXPECT_EQ(ag::float_to_bfloat16(0x1p-133f).bits, 0x0001);             // the smallest subnormal, kept
  EXPECT_EQ(ag::float_to_bfloat16(0x1p-134f).bits, 0x0000);             // half of it: a tie, to even (0)
  EXPECT_EQ(ag::float_to_bfloat16(0x1.8p-134f).bits, 0x0001);
  EXPECT_EQ(ag::float_to_bfloat16(-0x1p-140f).bits, 0x8000);            // underflows to -0
  EXPECT_EQ(ag::float_to_bfloat16(0x1.fep-127f).bits, 0x0080);          // rounds up into the normals
  EXPECT_EQ(ag::float_to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // overflows to inf
  EXPECT_EQ(ag::float_to_bfloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  // NaN: quiet, sign kept, top of the payload kept; a signalling NaN with only low payload bits
  // would truncate to inf, so the quiet bit is what keeps it a NaN.
  EXPECT_EQ(ag::bf16::from_float_bits(0x7f800001u), 0x7fc0);
  EXPECT_EQ(ag::bf16::from_float_bits(0xff800001u), 0xffc0);
  EXPECT_EQ(ag::bf16::from_float_bits(0x7fa00000u), 0x7fe0);
  EXPECT_EQ(ag::bf16::from_float_bits(0xffffffffu), 0xffff);
  EXPECT_EQ(ag::bf16::from_double_bits(0xfff0000000000001u), 0xffc0);
  EXPECT_EQ(ag::bf16::from_double_bits(std::bit_cast<uint64_t>(-std::numeric_limits<double>::infinity())), 0xff80);
}

// double -> bfloat16 must round once. Through float it would round twice: a double just above a
// bfloat16 midpoint that float rounds onto the midpoint would then tie to even, downwards.
TEST(BFloat16, DoubleRoundsOnce) {
  const double trap = 1.0 + 0x1p-8 + 0x1p-40;  // just above the midpoint between 1 and 1 + 2^-7
  EXPECT_EQ(ag::float_to_bfloat16(static_cast<float>(trap)).bits, 0x3f80);  // twice: wrong
  EXPECT_EQ(ag::double_to_bfloat16(trap).bits, 0x3f81);                     // once: right
  std::vector<double> in;
  for (uint32_t b = 0; b < 0x7f7fu; ++b) {  // every finite pattern with a finite successor
    const double lo = std::bit_cast<float>(b << 16), hi = std::bit_cast<float>((b + 1) << 16);
    const double mid = lo + (hi - lo) / 2;  // exact
    for (double d : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300), mid + (hi - lo) * 0x1p-30,
                     mid - (hi - lo) * 0x1p-30, lo, hi}) {
      in.push_back(d);
      in.push_back(-d);
    }
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    // Random doubles with exponents from below double's subnormals' reach into bfloat16's overflow.
    const uint64_t bits = (rng() & 0x800fffffffffffffu) | (static_cast<uint64_t>(rng() % 320 + 1023 - 160) << 52);
    in.push_back(std::bit_cast<double>(bits));
  }
  // Subnormal doubles, far below bfloat16's smallest subnormal: they round to zero.
  for (uint64_t u = 1; u < (uint64_t{1} << 52); u = u * 3 + 1) in.push_back(std::bit_cast<double>(u));
  // Around the largest bfloat16, 0x1.fep127: its midpoint with 2^128 ties to even, which is inf.
  for (double d : {0x1.fep127, 0x1.ffp127, 0x1.ffp127 * (1 - 0x1p-40), 0x1.ffp127 * (1 + 0x1p-40), 0x1p128,
                   std::numeric_limits<double>::max()}) {
    in.push_back(d);
    in.push_back(-d);
  }
  for (double d : in) ASSERT_EQ(ag::double_to_bfloat16(d).bits, nearest_bf16(d)) << std::hexfloat << d;
  EXPECT_TRUE(std::isnan(ag::bfloat16_to_float(ag::double_to_bfloat16(std::nan("")))));
}

// int64 -> bfloat16 rounds once too: through double, 2^60 + 2^52 + 1 becomes the midpoint
// 2^60 + 2^52 and then ties down to 2^60; the right answer is 2^60 + 2^53.
TEST(BFloat16, Int64RoundsOnce) {
  const int64_t trap = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;
  EXPECT_EQ(ag::double_to_bfloat16(static_cast<double>(trap)).bits, ag::float_to_bfloat16(0x1p60f).bits);
  EXPECT_EQ(ag::bfloat16_to_float(ag::int64_to_bfloat16(trap)), 0x1p60f + 0x1p53f);
  EXPECT_EQ(ag::bfloat16_to_float(ag::int64_to_bfloat16(-trap)), -(0x1p60f + 0x1p53f));
  EXPECT_EQ(ag::bfloat16_to_float(ag::int64_to_bfloat16(INT64_MIN)), -0x1p63f);
  EXPECT_EQ(ag::int64_to_bfloat16(0).bits, 0);
  EXPECT_EQ(ag::convert<BFloat16>(trap).bits, ag::int64_to_bfloat16(trap).bits);  // what casts use
  // Exhaustively near every power of two: values are exact integers, so the reference is exact.
  for (int p = 0; p < 63; ++p) {
    for (int64_t delta = -300; delta <= 300; ++delta) {
      const int64_t v = static_cast<int64_t>((uint64_t{1} << p) + static_cast<uint64_t>(delta));
      if (v <= 0) continue;
      // Nearest by exact integer arithmetic (every bfloat16 >= 2^7 is an integer; below, v is exact).
      const float got = ag::bfloat16_to_float(ag::int64_to_bfloat16(v));
      const int top = 63 - std::countl_zero(static_cast<uint64_t>(v));
      const uint64_t spacing = top > 7 ? uint64_t{1} << (top - 7) : 1;
      const uint64_t below = static_cast<uint64_t>(v) / spacing * spacing, above = below + spacing;
      const uint64_t d_below = static_cast<uint64_t>(v) - below, d_above = above - static_cast<uint64_t>(v);
      const bool below_even = (below / spacing) % 2 == 0;
      const uint64_t expected = d_below < d_above ? below : d_above < d_below ? above : (below_even ? below : above);
      ASSERT_EQ(static_cast<double>(got), static_cast<double>(expected)) << v;
    }
  }
}

TEST(BFloat16, BulkConversionsUseTheBestPathAllowed) {
  if (std::getenv("AMPGRAD_CPU_ISA") != nullptr) GTEST_SKIP() << "AMPGRAD_CPU_ISA is set in this environment";
  const Bf16Path expected = ag::detail::bf16_path_available(Bf16Path::kAvx512) ? Bf16Path::kAvx512
                            : ag::detail::bf16_path_available(Bf16Path::kAvx2) ? Bf16Path::kAvx2
                                                                               : Bf16Path::kScalar;
  EXPECT_EQ(ag::detail::bf16_selected_path(), expected);
  EXPECT_EQ(ag::detail::bf16_path_available(Bf16Path::kAvx512), ag::cpu_supports(ag::CpuIsa::kAvx512));
}

TEST(BFloat16, UnavailablePathIsAnError) {
  for (Bf16Path path : kPaths) {
    if (ag::detail::bf16_path_available(path)) continue;
    float f = 0;
    BFloat16 b;
    EXPECT_THROW(ag::detail::float_to_bfloat16_with(path, &f, &b, 1), ag::Error) << path_name(path);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// Why the bulk paths do not use AVX512_BF16's VCVTNEPS2BF16: it treats subnormal inputs as zero
// (its rounding is fixed: nearest even, denormals are zero), so it disagrees with the reference
// (and with IEEE rounding) on every float subnormal that rounds to a non-zero bfloat16.
[[gnu::target("avx512f,avx512vl,avx512bf16")]] uint16_t hardware_convert(float f) {
  const __m128bh h = _mm_cvtneps_pbh(_mm_set1_ps(f));
  uint16_t lanes[8];
  std::memcpy(lanes, &h, sizeof lanes);
  return lanes[0];
}

TEST(BFloat16, HardwareConversionFlushesSubnormals) {
  if (!ag::cpu_features().avx512_bf16) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const float subnormal = 0x1p-130f;  // a float subnormal, exactly a bfloat16 subnormal (0x0008)
  EXPECT_EQ(ag::float_to_bfloat16(subnormal).bits, 0x0008);
  EXPECT_EQ(hardware_convert(subnormal), 0x0000) << "VCVTNEPS2BF16 kept a subnormal: it could be used";
  EXPECT_EQ(hardware_convert(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);  // normal values do agree
}
#endif

}  // namespace
