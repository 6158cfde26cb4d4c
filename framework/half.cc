// binary16 <-> binary32 conversions: F16C when available, else an exact bit-level fallback.
#include "framework/half.h"

#include <cmath>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace ampgrad {

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Bit-level conversions, used where F16C is missing (and to test F16C against).
float half_to_float_soft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return float_of(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    // Zero or subnormal: value = mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return float_of(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_half_soft(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (keep NaN quiet and non-zero)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: let the float adder round to a multiple of 2^-24 (nearest even).
    const float rounded = float_of(abs) + 0.5f;  // 0.5 = 2^23 * 2^-24 fixes the ulp at 2^-24
    return static_cast<uint16_t>(sign | (bits_of(rounded) - bits_of(0.5f)));
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  const uint32_t mantissa_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xfffu + mantissa_odd - (112u << 23);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

}  // namespace

float half_to_float(Half h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return half_to_float_soft(h.bits);
#endif
}

Half float_to_half(float f) {
#if defined(__F16C__)
  return Half{static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#else
  return Half{float_to_half_soft(f)};
#endif
}

Half double_to_half(double d) {
  // Round to float with round-to-odd (truncate, then set the last bit if anything was dropped):
  // float keeps 13 more bits than half, so the final rounding to half is then correct.
  float f = static_cast<float>(d);
  if (std::isfinite(f) && static_cast<double>(f) != d) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    f = float_of(bits_of(f) | 1u);
  }
  return float_to_half(f);
}

void half_to_float(const Half* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void float_to_half(const float* src, Half* dst, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

namespace detail {
// Exposed for the test that checks F16C against the bit-level reference on all 2^16 / many values.
float half_to_float_reference(Half h) { return half_to_float_soft(h.bits); }
Half float_to_half_reference(float f) { return Half{float_to_half_soft(f)}; }
}  // namespace detail

}  // namespace ampgrad
