// Stochastic rounding of a float to bfloat16 or float16: x becomes one of its two neighbours in
// the 16-bit format, the farther one with probability |x - nearer| / spacing, so the rounding is
// unbiased (E[round(x)] = x) and an update smaller than half the spacing still moves a weight on
// average, where round to nearest would lose it every time. Exactly representable values, infs
// and NaNs (quieted) are kept; past the largest finite value the upper neighbour is inf. The
// random bits are counter-based (random_bits below), so every backend rounds alike.
#pragma once

#include <cstdint>
#include <cstring>

#include "framework/bfloat16.h"
#include "framework/device.h"

namespace ampgrad::stochastic {

/// The Weyl step of random_bits: counter(key, index + i) = counter(key, index) + i * kWeylStep
/// (mod 2^32) while index + i stays in index's 2^32-aligned block, so a loop over a block of
/// elements steps it by addition.
inline constexpr uint32_t kWeylStep = 0x9e3779b9u;

/// The 32-bit counter random_bits finalises: the key folded to 32 bits plus (index folded + 1)
/// Weyl steps.
AG_HOST_DEVICE constexpr uint32_t weyl_counter(uint64_t key, uint64_t index) {
  const uint32_t folded = static_cast<uint32_t>(index) + static_cast<uint32_t>(index >> 32) * 0x27d4eb2fu;
  return (static_cast<uint32_t>(key) ^ static_cast<uint32_t>(key >> 32)) + (folded + 1u) * kWeylStep;
}

/// murmur3's 32-bit finaliser: every input bit reaches every output bit.
AG_HOST_DEVICE constexpr uint32_t finalise(uint32_t z) {
  z = (z ^ (z >> 16)) * 0x85ebca6bu;
  z = (z ^ (z >> 13)) * 0xc2b2ae35u;
  return z ^ (z >> 16);
}

/// 32 random bits for element `index` under a 64-bit `key` (itself a hash: counter_random.h): a
/// Weyl sequence over the index through a finaliser. 32-bit arithmetic only, so a CPU loop over a
/// block of elements vectorises (AVX2 has 32-bit but no 64-bit multiplies).
AG_HOST_DEVICE constexpr uint32_t random_bits(uint64_t key, uint64_t index) { return finalise(weyl_counter(key, index)); }

/// Float bits -> bfloat16 bits: adding 16 random bits to the 16 that truncation drops carries into
/// the kept part with probability (dropped bits) / 2^16, which is the distance to the lower
/// neighbour over the spacing, in every binade, subnormals included (the bit patterns of floats of
/// one sign are ordered as their magnitudes). `random` supplies its low 16 bits.
AG_HOST_DEVICE constexpr uint16_t bfloat16_bits(uint32_t u, uint32_t random) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16::from_float_bits(u);  // NaN: quieted, as every cast
  return static_cast<uint16_t>((u + (random & 0xffffu)) >> 16);
}

/// Float bits -> float16 bits. |x| is split into a whole number m of float16 spacings and a
/// fraction (both exact in float: a scaling by a power of two), and m goes up by one when 24
/// random bits, as a fraction, fall below it (exact for |x| >= 2^-25; below, where the fraction has
/// bits past 2^-24, the probability is rounded up to a multiple of 2^-24: the rounded value's bias
/// is then at most 2^-48). m spacings of binade E assemble into the bits
/// ((E + 14) << 10) + m (m = 2048 carries into the next binade; E = -14 covers the subnormals).
/// `random` supplies its low 24 bits.
AG_HOST_DEVICE inline uint16_t float16_bits(uint32_t u, uint32_t random) {
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
