// CRC-32C: both paths against RFC 3720's test vectors, a bit-by-bit reference and each other;
// TFRecord's mask; the AMPGRAD_CPU_ISA parser.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "utils/cpu_isa.h"
#include "utils/crc32c.h"

namespace ampgrad::utils {
namespace {

// The definition, one bit at a time (reflected polynomial 0x82F63B78), independent of both paths.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82f63b78u : 0u);
  }
  return ~crc;
}

struct Vector {
  std::vector<unsigned char> bytes;
  uint32_t crc;
};

std::vector<Vector> rfc3720_vectors() {
  std::vector<unsigned char> ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i), descending[i] = static_cast<unsigned char>(31 - i);
  const std::string digits = "123456789";
  return {{std::vector<unsigned char>(32, 0x00), 0x8A9136AAu},
          {std::vector<unsigned char>(32, 0xFF), 0x62A8AB43u},
          {ascending, 0x46DD794Eu},
          {descending, 0x113FDB5Cu},
          {std::vector<unsigned char>(digits.begin(), digits.end()), 0xE3069283u}};
}

TEST(Crc32c, TablePathMatchesRfc3720Vectors) {
  for (const Vector& v : rfc3720_vectors()) {
    EXPECT_EQ(crc32c_table(v.bytes.data(), v.bytes.size()), v.crc);
    EXPECT_EQ(crc32c_bitwise(v.bytes.data(), v.bytes.size()), v.crc);  // the reference itself is right
  }
}

TEST(Crc32c, HardwarePathMatchesRfc3720Vectors) {
  if (!crc32c_hardware_supported()) GTEST_SKIP() << "this CPU has no SSE4.2";
  for (const Vector& v : rfc3720_vectors()) EXPECT_EQ(crc32c_hardware(v.bytes.data(), v.bytes.size()), v.crc);
}

TEST(Crc32c, DispatchedPathMatchesVectors) {
  for (const Vector& v : rfc3720_vectors()) EXPECT_EQ(crc32c(v.bytes.data(), v.bytes.size()), v.crc);
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);  // the CRC of nothing
}

TEST(Crc32c, PathsAgreeOnRandomLengthsAndAlignments) {
  std::mt19937_64 rng(17);
  std::vector<unsigned char> buffer(1100);
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  const bool hw = crc32c_hardware_supported();
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t offset = rng() % 16, length = rng() % 1000;  // every alignment, lengths around the 8-byte blocks
    const unsigned char* p = buffer.data() + offset;
    const uint32_t expected = crc32c_bitwise(p, length);
    ASSERT_EQ(crc32c_table(p, length), expected) << "offset " << offset << " length " << length;
    if (hw) {
      ASSERT_EQ(crc32c_hardware(p, length), expected) << "offset " << offset << " length " << length;
    }
  }
}

TEST(Crc32c, ExtendsAcrossPieces) {
  const std::string text = "The quick brown fox jumps over the lazy dog, twice over.";
  const uint32_t whole = crc32c(text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string_view a = std::string_view(text).substr(0, cut), b = std::string_view(text).substr(cut);
    ASSERT_EQ(crc32c_table(b.data(), b.size(), crc32c_table(a.data(), a.size())), whole) << cut;
    if (crc32c_hardware_supported()) {
      ASSERT_EQ(crc32c_hardware(b.data(), b.size(), crc32c_hardware(a.data(), a.size())), whole) << cut;
    }
  }
}

TEST(Crc32c, MaskIsTfRecordsRotationPlusConstant) {
  EXPECT_EQ(crc32c_mask(0), 0xa282ead8u);
  EXPECT_EQ(crc32c_mask(1), (1u << 17) + 0xa282ead8u);
  EXPECT_EQ(crc32c_mask(0x8000u), 1u + 0xa282ead8u);  // bit 15 rotates to bit 0
  EXPECT_EQ(crc32c_mask(0xE3069283u), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t c = rng();
    ASSERT_EQ(crc32c_unmask(crc32c_mask(c)), c);
  }
}

TEST(Crc32c, SelectionFollowsCpuAndEnvironment) {
  if (std::getenv("AMPGRAD_CPU_ISA") != nullptr) GTEST_SKIP() << "AMPGRAD_CPU_ISA is set in this environment";
  EXPECT_EQ(cpu_isa(), CpuIsa::kNative);
  EXPECT_EQ(crc32c_uses_hardware(), crc32c_hardware_supported());
}

TEST(CpuIsa, ParsesTheVariable) {
  EXPECT_EQ(parse_cpu_isa(nullptr), CpuIsa::kNative);
  EXPECT_EQ(parse_cpu_isa(""), CpuIsa::kNative);
  EXPECT_EQ(parse_cpu_isa("native"), CpuIsa::kNative);
  EXPECT_EQ(parse_cpu_isa("baseline"), CpuIsa::kBaseline);
  EXPECT_TRUE(test::throws_error([] { parse_cpu_isa("avx9000"); }, {"AMPGRAD_CPU_ISA", "avx9000", "baseline"}));
}

}  // namespace
}  // namespace ampgrad::utils
