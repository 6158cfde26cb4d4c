// bfloat16 storage type and its conversions: float's exponent range with 8 significand bits. One
// bit-level reference rounding (nearest even; subnormals kept; inf kept; NaN quieted, sign kept),
// shared by host and device code, and bulk paths (AVX2, AVX-512 picked at run time) that match it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define AG_HOST_DEVICE __host__ __device__
#else
#define AG_HOST_DEVICE
#endif

namespace ampgrad {

/// The upper 16 bits of an IEEE binary32. A storage type only: arithmetic happens in float.
struct BFloat16 {
  uint16_t bits = 0;
};
static_assert(sizeof(BFloat16) == 2);

namespace bf16 {

/// binary32 bits -> bfloat16 bits, round to nearest even: the reference every path matches.
/// Adding 0x7fff plus the kept part's lowest bit carries into bit 16 exactly when the dropped 16
/// bits are above half, or at half with an odd kept part; the carry runs through the exponent, so
/// subnormals round as subnormals, the largest values overflow to inf, and inf stays inf. A NaN
/// keeps its sign and the top of its payload, with the quiet bit set (truncating a signalling NaN
/// whose payload sits in the low 16 bits would otherwise give inf).
AG_HOST_DEVICE constexpr uint16_t from_float_bits(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// bfloat16 bits -> binary32 bits: exact (the dropped bits are zero).
AG_HOST_DEVICE constexpr uint32_t to_float_bits(uint16_t b) { return static_cast<uint32_t>(b) << 16; }

/// (-1)^negative * sig * 2^exp rounded once to bfloat16 bits, nearest even (sig any 64-bit
/// integer): the exact rounding that double and int64 conversions use, so neither rounds twice.
AG_HOST_DEVICE constexpr uint16_t round_scaled(bool negative, uint64_t sig, int exp) {
  const uint16_t sign = negative ? 0x8000u : 0u;
  if (sig == 0) return sign;
  int top = 0;  // index of sig's highest set bit
  for (int step = 32; step > 0; step /= 2) {
    if ((sig >> (top + step)) != 0) top += step;
  }
  const int e = top + exp;                  // the leading bit is worth 2^e
  if (e > 127) return sign | 0x7f80u;       // at least 2^128: inf
  // Keep 8 significand bits for a normal result, else bits down to 2^-133 (the subnormal unit).
  const int shift = e >= -126 ? top - 7 : -133 - exp;
  uint64_t q = 0;
  if (shift <= 0) {
    q = sig << -shift;  // exact (a normal result has fewer than 8 bits to spare)
  } else {
    const uint64_t rest = shift >= 64 ? sig : sig & ((uint64_t{1} << shift) - 1);
    q = shift >= 64 ? 0 : sig >> shift;
    if (shift <= 64) {
      const uint64_t half = uint64_t{1} << (shift - 1);
      if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
    }  // shift > 64: rest < 2^64 <= half, rounds down to 0
  }
  // A normal result: q in [128, 256], exponent field e + 127 (q = 256 carries into the next
  // exponent, and from e = 127 into inf). A subnormal one: q itself (128 is the smallest normal).
  const uint32_t bits = e >= -126 ? ((static_cast<uint32_t>(e + 127) << 7) + static_cast<uint32_t>(q) - 128u)
                                  : static_cast<uint32_t>(q);
  return static_cast<uint16_t>(sign | bits);
}

/// binary64 bits -> bfloat16 bits, rounded once (never through float). NaN: quiet, sign and the
/// top of the payload kept, as binary64 -> binary32 -> bfloat16 would give.
AG_HOST_DEVICE constexpr uint16_t from_double_bits(uint64_t u) {
  const bool negative = (u >> 63) != 0;
  const int biased = static_cast<int>((u >> 52) & 0x7ffu);
  const uint64_t fraction = u & ((uint64_t{1} << 52) - 1);
  if (biased == 0x7ff) {
    const uint16_t sign = negative ? 0x8000u : 0u;
    return fraction == 0 ? static_cast<uint16_t>(sign | 0x7f80u)
                         : static_cast<uint16_t>(sign | 0x7fc0u | static_cast<uint16_t>(fraction >> 45));
  }
  if (biased == 0) return round_scaled(negative, fraction, -1074);  // zero or subnormal
  return round_scaled(negative, fraction | (uint64_t{1} << 52), biased - 1075);
}

/// int64 -> bfloat16 bits, rounded once (through double it could round twice above 2^53).
AG_HOST_DEVICE constexpr uint16_t from_int64(int64_t v) {
  const uint64_t magnitude = v < 0 ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  return round_scaled(v < 0, magnitude, 0);
}

}  // namespace bf16

/// bfloat16 -> float, exact.
inline float bfloat16_to_float(BFloat16 b) { return std::bit_cast<float>(bf16::to_float_bits(b.bits)); }
/// float -> bfloat16, round to nearest even (see bf16::from_float_bits).
inline BFloat16 float_to_bfloat16(float f) { return BFloat16{bf16::from_float_bits(std::bit_cast<uint32_t>(f))}; }
/// double -> bfloat16, rounded once.
inline BFloat16 double_to_bfloat16(double d) { return BFloat16{bf16::from_double_bits(std::bit_cast<uint64_t>(d))}; }
/// int64 -> bfloat16, rounded once.
inline BFloat16 int64_to_bfloat16(int64_t v) { return BFloat16{bf16::from_int64(v)}; }

/// Bulk conversions: AVX-512 where the CPU has it and AMPGRAD_CPU_ISA allows it, else AVX2 (when
/// compiled with -mavx2), else the scalar reference; every path gives the same bits.
void bfloat16_to_float(const BFloat16* src, float* dst, size_t n);
void float_to_bfloat16(const float* src, BFloat16* dst, size_t n);

namespace detail {
/// The bulk paths one by one, for the tests that hold each to the reference.
enum class Bf16Path { kScalar, kAvx2, kAvx512 };
/// Whether `path` is compiled in and the CPU can run it (ignores AMPGRAD_CPU_ISA).
bool bf16_path_available(Bf16Path path);
/// The path the bulk conversions above use in this process.
Bf16Path bf16_selected_path();
void bfloat16_to_float_with(Bf16Path path, const BFloat16* src, float* dst, size_t n);
void float_to_bfloat16_with(Bf16Path path, const float* src, BFloat16* dst, size_t n);
}  // namespace detail

}  // namespace ampgrad
