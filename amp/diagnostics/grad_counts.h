// The per-value arithmetic of gradient statistics, written once for the CPU and CUDA: where a
// value falls against each low-precision format's ranges, and the exponent bin of its unscaled value.
#pragma once

#include <cstdint>

#include "framework/device.h"
#include "framework/dtype.h"

#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

namespace ampgrad::amp {

/// At most this many formats are measured in one pass (the low-precision dtypes: float16, bfloat16).
inline constexpr int kMaxFormats = 4;
/// Exponent bins: floor(log2 |v|) of a finite nonzero float32 spans [-149, 127] (subnormals included).
inline constexpr int kMinExponent = -149;
inline constexpr int kMaxExponent = 127;
inline constexpr int kNumExponentBins = kMaxExponent - kMinExponent + 1;

/// Where a format's round-to-nearest-even puts a magnitude |x|, from its row in framework/dtype.h.
struct FormatLimits {
  DType dtype = DType::kFloat16;
  double underflow_max = 0;  // 0 < |x| <= this rounds to 0: half the smallest subnormal (the tie goes to even 0)
  double normal_min = 0;     // |x| >= this rounds to a normal: min_normal - min_subnormal / 2 (the tie goes up)
  double overflow_min = 0;   // |x| >= this rounds to inf: max + half an ulp of max (the tie goes to inf)
};

/// The formats one pass measures (by value into a CUDA kernel's parameters).
struct FormatTable {
  int count = 0;
  FormatLimits formats[kMaxFormats];
};

/// Counts for one gradient tensor: a plain struct, so the CUDA kernel can accumulate an array of
/// them on the device. g is the stored gradient (scaled by the loss scale, in its own dtype);
/// v = g / scale is the unscaled (true) value.
struct GradCounts {
  int64_t zeros;               // g == 0
  int64_t infs;                // g is +-inf
  int64_t nans;                // g is NaN
  double max_abs;              // the largest finite |g|
  int64_t subnormal[kMaxFormats];           // per format: |g| in its subnormal range (kept, with fewer bits)
  int64_t underflow[kMaxFormats];           // per format: g != 0 but rounded to 0 there
  int64_t overflow[kMaxFormats];            // per format: g rounded to inf there (infs included)
  int64_t underflow_unscaled[kMaxFormats];  // per format: v != 0 but rounded to 0 there
  int64_t exponent[kNumExponentBins];       // v finite and nonzero: bin floor(log2 |v|) - kMinExponent
  int64_t unscaled_zeros;                   // v == 0 (g == 0, or so small that g / scale is 0 in float32)
  int64_t unscaled_nonfinite;               // v is inf or NaN
};

/// floor(log2 |v|) of a finite nonzero float, exact for subnormals too.
AG_HOST_DEVICE inline int exponent_of(float v) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(v) & 0x7fffffffu;
  const int leading_zeros = __clz(static_cast<int>(bits));
#else
  const uint32_t bits = std::bit_cast<uint32_t>(v) & 0x7fffffffu;
  const int leading_zeros = std::countl_zero(bits);
#endif
  const int biased = static_cast<int>(bits >> 23);
  // A subnormal is m * 2^-149 with m the 23-bit field, so its exponent is that of m's top bit.
  return biased != 0 ? biased - 127 : kMinExponent + (31 - leading_zeros);
}

/// Which of a format's ranges a magnitude falls in (NaN: none).
enum class FormatRange : uint8_t { kZero, kUnderflow, kSubnormal, kNormal, kOverflow, kNone };

AG_HOST_DEVICE inline FormatRange format_range(double magnitude, const FormatLimits& f) {
  if (magnitude == 0) return FormatRange::kZero;
  if (magnitude <= f.underflow_max) return FormatRange::kUnderflow;
  if (magnitude < f.normal_min) return FormatRange::kSubnormal;
  if (magnitude < f.overflow_min) return FormatRange::kNormal;
  if (magnitude >= f.overflow_min) return FormatRange::kOverflow;
  return FormatRange::kNone;  // NaN fails every comparison
}

/// Adds one value to `c`: g as stored (in double), v its unscaled value rounded to float32 as the
/// unscale writes it, and vd = g * inv_scale in double (classified exactly, before that rounding).
/// `add(field, k)` adds k to a count (a plain += on the CPU, a shared-memory atomic on CUDA) and
/// `keep_max(m)` folds a finite |g| into max_abs.
template <typename Add, typename KeepMax>
AG_HOST_DEVICE inline void count_value(double g, double vd, float v, const FormatTable& t, GradCounts& c, Add add,
                                       KeepMax keep_max) {
  const double a = g < 0 ? -g : g;
  if (a == 0) {
    add(c.zeros, 1);
  } else if (a != a) {
    add(c.nans, 1);
  } else if (a > 1.79769313486231570815e308) {
    add(c.infs, 1);
  } else {
    keep_max(a);
  }
  const double va = vd < 0 ? -vd : vd;
  for (int f = 0; f < t.count; ++f) {
    switch (format_range(a, t.formats[f])) {
      case FormatRange::kUnderflow: add(c.underflow[f], 1); break;
      case FormatRange::kSubnormal: add(c.subnormal[f], 1); break;
      case FormatRange::kOverflow: add(c.overflow[f], 1); break;
      default: break;
    }
    if (format_range(va, t.formats[f]) == FormatRange::kUnderflow) add(c.underflow_unscaled[f], 1);
  }
  const float vabs = v < 0 ? -v : v;
  if (vabs == 0) {
    add(c.unscaled_zeros, 1);
  } else if (!(vabs <= 3.40282346638528859812e38f)) {
    add(c.unscaled_nonfinite, 1);
  } else {
    add(c.exponent[exponent_of(v) - kMinExponent], 1);
  }
}

}  // namespace ampgrad::amp
