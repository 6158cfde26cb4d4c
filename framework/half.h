// IEEE binary16 storage type and exact conversions to and from float (round to nearest even,
// subnormals kept, overflow to inf). F16C does 8 values per instruction where the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ampgrad {

/// 16 bits of IEEE binary16. A storage type only: arithmetic happens in float.
struct Half {
  uint16_t bits = 0;
};
static_assert(sizeof(Half) == 2);

/// binary16 -> binary32, exact.
float half_to_float(Half h);
/// binary32 -> binary16, round to nearest even; keeps subnormals down to 2^-24, overflows to inf.
Half float_to_half(float f);
/// binary64 -> binary16 rounded once (not via float, whose rounding could double-round a tie).
Half double_to_half(double d);

/// Bulk conversions (vectorised with F16C when compiled with -mf16c).
void half_to_float(const Half* src, float* dst, size_t n);
void float_to_half(const float* src, Half* dst, size_t n);

namespace detail {
// The portable bit-level conversions, exposed so tests can check the F16C path against them.
float half_to_float_reference(Half h);
Half float_to_half_reference(float f);
}  // namespace detail

}  // namespace ampgrad
