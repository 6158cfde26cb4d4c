// Stochastic rounding of a float to bfloat16 or float16: x becomes one of its two neighbours in
// the 16-bit format, the farther one with probability |x - nearer| / spacing, so the rounding is
// unbiased (E[round(x)] = x) and an update smaller than half the spacing still moves a weight on
// average, where round to nearest would lose it every time. Exactly representable values, infs
// and NaNs (quieted) are kept; past the largest finite value the upper neighbour is inf. The
// random bits are the caller's (counter_random.h), so every backend rounds alike.
#pragma once

#include <cstdint>
#include <cstring>

#include "framework/bfloat16.h"
#include "framework/device.h"

namespace ampgrad::stochastic {

/// Float bits -> bfloat16 bits: adding 16 random bits to the 16 that truncation drops carries into
/// the kept part with probability (dropped bits) / 2^16, which is the distance to the lower
/// neighbour over the spacing, in every binade, subnormals included (the bit patterns of floats of
/// one sign are ordered as their magnitudes). `random` supplies its low 16 bits.
AG_HOST_DEVICE constexpr uint16_t bfloat16_bits(uint32_t u, uint64_t random) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16::from_float_bits(u);  // NaN: quieted, as every cast
  return static_cast<uint16_t>((u + static_cast<uint32_t>(random & 0xffffu)) >> 16);
}

/// Float bits -> float16 bits. |x| is split into a whole number m of float16 spacings and a
/// fraction (both exact in float: a scaling by a power of two), and m goes up by one when 24
/// random bits, as a fraction, fall below it. m spacings of binade E assemble into the bits
/// ((E + 14) << 10) + m (m = 2048 carries into the next binade; E = -14 covers the subnormals).
/// `random` supplies its low 24 bits.
AG_HOST_DEVICE inline uint16_t float16_bits(uint32_t u, uint64_t random) {
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  const int exponent = static_cast<int>(magnitude >> 23) - 127;  // -127 for zero and float subnormals
  if (exponent >= 16) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 2^16 (or inf): past the top
  const int binade = exponent < -14 ? -14 : exponent;
  // |x| * 2^(10 - binade): |x| in spacings of its float16 binade, in [0, 2048).
  const uint32_t scale_bits = static_cast<uint32_t>(10 - binade + 127) << 23;
  float x = 0, scale = 0;
  std::memcpy(&x, &magnitude, sizeof x);
  std::memcpy(&scale, &scale_bits, sizeof scale);
  const float spacings = x * scale;
  uint32_t m = static_cast<uint32_t>(spacings);
  const float fraction = spacings - static_cast<float>(m);
  if (static_cast<float>(random & 0xffffffu) * 0x1p-24f < fraction) ++m;
  const uint32_t bits = (static_cast<uint32_t>(binade + 14) << 10) + m;
  return static_cast<uint16_t>(sign | (bits >= 0x7c00u ? 0x7c00u : bits));
}

}  // namespace ampgrad::stochastic
