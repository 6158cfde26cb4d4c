// The 8-bit float storage types, PyTorch's float8_e4m3fn and float8_e5m2, and their conversions:
// one bit-level reference per direction, shared by host and device code, that matches PyTorch 2.x
// bit for bit (tests/data/make_float8_reference.py writes the reference; float8_test holds every
// path to it). Arithmetic never happens in 8 bits: kernels widen to float.
//
// What PyTorch 2.15 does past the range, and so what the plain cast (Tensor::to) does:
//   e4m3 (max 448, no inf): a finite value that rounds past 448, and +-inf, saturate to +-448;
//   e5m2 (max 57344, IEEE-like): a value that rounds past 57344 becomes +-inf.
//   NaN becomes the format's NaN (0x7f) with the sign kept.
// The saturating cast of the FP8 scaling recipes clamps every finite and infinite value to
// +-max in both formats (for e4m3 that is the plain cast).
// float64 is rounded to float32 first, as PyTorch does (a float64 just past a midpoint between
// two FP8 values can round down: the reference holds such values).
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

/// float8_e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits; largest 448, NaN 0x7f/0xff, no inf.
struct Float8E4M3 {
  uint8_t bits = 0;
};
/// float8_e5m2: 5 exponent bits (bias 15), 2 mantissa bits; largest 57344, inf and NaN as IEEE.
struct Float8E5M2 {
  uint8_t bits = 0;
};
static_assert(sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1);

namespace fp8 {

/// The facts of one 8-bit format that its conversions need (the dtype table has the rest), as
/// static members so that device code can read them.
template <typename T> struct Format;
/// e4m3: saturates past the range.
template <> struct Format<Float8E4M3> {
  static constexpr int kMantissaBits = 3;
  static constexpr int kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7e;       ///< the largest finite magnitude's code (448)
  static constexpr uint32_t kOverflowCode = 0x7e;  ///< what the plain cast gives past the range
  static constexpr bool kHasInf = false;           ///< its top exponent holds values (and NaN at 0x7f)
};
/// e5m2: overflows to inf.
template <> struct Format<Float8E5M2> {
  static constexpr int kMantissaBits = 2;
  static constexpr int kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7b;       ///< 57344
  static constexpr uint32_t kOverflowCode = 0x7c;  ///< inf
  static constexpr bool kHasInf = true;            ///< +-inf at 0x7c/0xfc, NaN above
};

/// Whether the 7-bit magnitude of a code is NaN: only 0x7f in e4m3; 0x7d..0x7f in e5m2.
template <typename T>
AG_HOST_DEVICE constexpr bool is_nan_magnitude(uint32_t magnitude) {
  return Format<T>::kHasInf ? magnitude > 0x7cu : magnitude == 0x7fu;
}

/// Code -> binary32 bits, exact. NaN: the sign, the quiet bit and the mantissa at the top of the
/// payload (the bits PyTorch's widening gives).
template <typename T>
AG_HOST_DEVICE constexpr uint32_t to_float_bits(uint8_t code) {
  using F = Format<T>;
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t magnitude = code & 0x7fu;
  constexpr int m = F::kMantissaBits;
  const uint32_t exponent = magnitude >> m;
  const uint32_t mantissa = magnitude & ((1u << m) - 1u);
  if (is_nan_magnitude<T>(magnitude)) return sign | 0x7fc00000u | (mantissa << (23 - m));
  if (F::kHasInf && magnitude == 0x7cu) return sign | 0x7f800000u;
  if (exponent == 0) {
    if (mantissa == 0) return sign;
    int top = 0;  // the subnormal's leading bit: value = 2^(top + 1 - bias - m) * 1.rest
    while ((mantissa >> (top + 1)) != 0) ++top;
    const uint32_t rest = (mantissa ^ (1u << top)) << (23 - top);
    return sign | (static_cast<uint32_t>(top + 1 - F::kBias - m + 127) << 23) | rest;
  }
  return sign | ((exponent - static_cast<uint32_t>(F::kBias) + 127u) << 23) | (mantissa << (23 - m));
}

/// The smallest |v| (as binary32 bits) that rounds past the format's largest value: half an ulp
/// above it, the tie included when it rounds up (to an even code beyond the top, as in E5M2). The
/// saturating cast clamps values from here on (464 is the first E4M3 clamps past, 61440 the first
/// E5M2 does); below it the clamp changes nothing that rounding would not.
template <typename T>
AG_HOST_DEVICE constexpr uint32_t saturation_bits() {
  using F = Format<T>;
  return to_float_bits<T>(F::kMaxCode) + (1u << (22 - F::kMantissaBits)) + ((F::kMaxCode & 1u) ? 0u : 1u);
}

/// binary32 bits -> code, round to nearest even, subnormals kept; past the range the plain cast
/// gives kOverflowCode (saturate = false) and the saturating cast kMaxCode (saturate = true); a
/// NaN gives 0x7f with its sign.
template <typename T>
AG_HOST_DEVICE constexpr uint8_t from_float_bits(uint32_t u, bool saturate) {
  using F = Format<T>;
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const uint32_t overflow = saturate ? F::kMaxCode : F::kOverflowCode;
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | overflow);
  const int biased = static_cast<int>(a >> 23);
  if (biased == 0) return static_cast<uint8_t>(sign);  // a float32 subnormal: far below half the smallest FP8 value
  const int e = biased - 127;  // the value is sig * 2^(e - 23), sig in [2^23, 2^24)
  if (e > 16) return static_cast<uint8_t>(sign | overflow);  // at least 2^17: past both ranges
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  constexpr int m = F::kMantissaBits;
  constexpr int min_exponent = 1 - F::kBias;  // of the normals; below it the quantum stays 2^(min - m)
  const int shift = 23 - m + (e < min_exponent ? min_exponent - e : 0);
  if (shift >= 25) return static_cast<uint8_t>(sign);  // below half the smallest subnormal (never half: sig < 2^24)
  uint32_t q = sig >> shift;
  const uint32_t rest = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
  // A normal: q in [2^m, 2^(m+1)], the exponent field e + bias (q = 2^(m+1) carries into it); a
  // subnormal: q itself (q = 2^m is the smallest normal's code).
  const uint32_t code = e >= min_exponent ? (static_cast<uint32_t>(e + F::kBias) << m) + q - (1u << m) : q;
  if (code > F::kMaxCode) return static_cast<uint8_t>(sign | overflow);
  return static_cast<uint8_t>(sign | code);
}

}  // namespace fp8

/// float8 -> float, exact.
inline float float8_to_float(Float8E4M3 v) { return std::bit_cast<float>(fp8::to_float_bits<Float8E4M3>(v.bits)); }
/// float8 -> float, exact.
inline float float8_to_float(Float8E5M2 v) { return std::bit_cast<float>(fp8::to_float_bits<Float8E5M2>(v.bits)); }
/// float -> float8_e4m3fn, round to nearest even; past +-448 (and +-inf) saturates, as PyTorch.
inline Float8E4M3 float_to_float8_e4m3(float x) {
  return Float8E4M3{fp8::from_float_bits<Float8E4M3>(std::bit_cast<uint32_t>(x), false)};
}
/// float -> float8_e5m2, round to nearest even; past 57344 gives inf, as PyTorch.
inline Float8E5M2 float_to_float8_e5m2(float x) {
  return Float8E5M2{fp8::from_float_bits<Float8E5M2>(std::bit_cast<uint32_t>(x), false)};
}

/// The values of the 256 codes, NaN codes included, for kernels that decode by table lookup.
const float* float8_value_table(Float8E4M3);
const float* float8_value_table(Float8E5M2);

/// Bulk conversions (the widening by a 256-entry table).
void float8_to_float(const Float8E4M3* src, float* dst, size_t n);
void float8_to_float(const Float8E5M2* src, float* dst, size_t n);
void float_to_float8(const float* src, Float8E4M3* dst, size_t n);
void float_to_float8(const float* src, Float8E5M2* dst, size_t n);
/// The saturating casts of the FP8 scaling recipes: x * scale rounded to nearest even and clamped
/// to +-max (inf too); NaN stays NaN. scale = 1 is torchao's to_fp8_saturated.
void float_to_float8_saturated(const float* src, float scale, Float8E4M3* dst, size_t n);
void float_to_float8_saturated(const float* src, float scale, Float8E5M2* dst, size_t n);

}  // namespace ampgrad
