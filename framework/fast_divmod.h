// Division by a divisor fixed before a kernel starts, as a multiply-high, an add and a shift: how
// GPU kernels split a flat index into coordinates. A 64-bit `/` or `%` is a subroutine of dozens
// of instructions on a GPU, and a kernel that makes five of them per element is bound by them.
#pragma once

#include <cstdint>

#include "framework/device.h"
#include "framework/error.h"

namespace ampgrad {

/// A quotient and its remainder.
template <typename Index>
struct QuotientRemainder {
  Index quotient, remainder;
};

/// n / d and n % d for every 32-bit n and a divisor 1 <= d <= 2^31 fixed at construction
/// (Granlund and Montgomery's method): with l = ceil(log2 d) and the 33-bit m = 2^32 + multiplier
/// = floor(2^(32+l) / d) + 1, m d lies in [2^(32+l), 2^(32+l) + 2^l], which makes
/// floor(m n / 2^(32+l)) = floor(n / d) exact for all n < 2^32. It is computed as
/// (mulhi(multiplier, n) + n) >> l, the add in 64 bits so that it cannot overflow.
struct FastDivmod {
  using Index = uint32_t;
  uint32_t divisor = 1, multiplier = 1, shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(int64_t d) {
    AG_CHECK(d >= 1 && d <= (int64_t{1} << 31), "FastDivmod: the divisor must be in [1, 2^31], got ", d);
    divisor = static_cast<uint32_t>(d);
    while ((int64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor)) / divisor + 1);
  }

  AG_HOST_DEVICE uint32_t quotient(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(n, multiplier);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
    return static_cast<uint32_t>((uint64_t{high} + n) >> shift);
  }
  AG_HOST_DEVICE QuotientRemainder<uint32_t> divmod(uint32_t n) const {
    const uint32_t q = quotient(n);
    return {q, n - q * divisor};
  }
};

/// FastDivmod's interface over 64-bit indices, by plain division: for the rare launch whose indices
/// do not fit in 32 bits.
struct WideDivmod {
  using Index = int64_t;
  int64_t divisor = 1;

  WideDivmod() = default;
  explicit WideDivmod(int64_t d) : divisor(d) {
    AG_CHECK(d >= 1, "WideDivmod: the divisor must be positive, got ", d);
  }

  AG_HOST_DEVICE int64_t quotient(int64_t n) const { return n / divisor; }
  AG_HOST_DEVICE QuotientRemainder<int64_t> divmod(int64_t n) const { return {n / divisor, n % divisor}; }
};

/// Whether FastDivmod may divide values up to `value` (and by divisors up to it): below 2^31, a
/// margin under its 2^32 so that a caller's sums of such values still fit. A launch checks every
/// value its index math divides: the element count, and any other it forms (col2im's rows plus
/// padding, its strides).
inline bool fits_fast_divmod(int64_t value) { return value >= 0 && value < (int64_t{1} << 31); }

}  // namespace ampgrad
