// Scalar math for the kernels, written once for both backends. float on the CPU uses branch-free
// polynomial approximations (Cephes's minimax coefficients) that the compiler vectorises (with
// -fno-trapping-math, which ops/BUILD sets), within 2 ulp of the exact result; CUDA uses its own
// expf/logf/tanhf/erff; double always uses the standard functions (float64 is the reference dtype).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "framework/device.h"

namespace ampgrad::kernels::math {

#if !defined(__CUDA_ARCH__)
namespace detail {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6 polynomial, 2^n applied as two
// exact powers of two so that results down to the subnormal range stay right.
inline float exp_poly(float x) {
  float clamped = x < -104.0f ? -104.0f : x;  // selects, not fmin/fmax: they vectorise
  clamped = clamped > 88.8f ? 88.8f : clamped;
  // Round to the nearest integer by adding and subtracting 1.5 * 2^23 (exact for |v| < 2^22).
  const float shifter = 12582912.0f;
  const float n = (clamped * 1.44269504088896341f + shifter) - shifter;
  float r = clamped - n * 0.693359375f;  // ln2 in two parts: the first exact with n's bits
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const int32_t k = static_cast<int32_t>(n);
  const int32_t k1 = k >> 1, k2 = k - k1;  // each in [-52, 64]: a normal power of two
  const float s1 = bits_to_float(static_cast<uint32_t>(k1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(k2 + 127) << 23);
  float result = y * s1 * s2;
  result = x > 88.72283905206835f ? std::numeric_limits<float>::infinity() : result;
  return x != x ? x : result;  // NaN stays NaN
}

// log x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m by a degree-9 polynomial of m - 1.
inline float log_poly(float x) {
  const bool subnormal = x < 1.17549435e-38f;
  const float scaled = subnormal ? x * 8388608.0f : x;  // 2^23: subnormals become normal
  const uint32_t bits = float_to_bits(scaled);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xffu) - 126;
  float m = bits_to_float((bits & 0x007fffffu) | 0x3f000000u);  // in [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  e -= low ? 1 : 0;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float p = 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  float y = p * m * z;
  const float fe = static_cast<float>(e - (subnormal ? 23 : 0));
  y += fe * -2.12194440e-4f;
  y += -0.5f * z;
  float result = m + y + fe * 0.693359375f;
  // Exact special cases: log 0 = -inf, log of a negative or NaN = NaN, log inf = inf.
  result = x == 0.0f ? -std::numeric_limits<float>::infinity() : result;
  result = x == std::numeric_limits<float>::infinity() ? x : result;
  return x < 0.0f || x != x ? std::numeric_limits<float>::quiet_NaN() : result;
}

// tanh x: an odd polynomial below |x| = 0.625, else 1 - 2 / (e^2|x| + 1) with x's sign.
inline float tanh_poly(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = std::copysign(p * z * x + x, x);  // keeps -0
  const float large = std::copysign(1.0f - 2.0f / (exp_poly(a + a) + 1.0f), x);
  return a < 0.625f ? small : large;
}

}  // namespace detail
#endif

AG_HOST_DEVICE inline float exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return detail::exp_poly(x);
#endif
}
AG_HOST_DEVICE inline double exp(double x) { return ::exp(x); }

AG_HOST_DEVICE inline float log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return detail::log_poly(x);
#endif
}
AG_HOST_DEVICE inline double log(double x) { return ::log(x); }

AG_HOST_DEVICE inline float tanh(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return detail::tanh_poly(x);
#endif
}
AG_HOST_DEVICE inline double tanh(double x) { return ::tanh(x); }

// erf has no polynomial here: the standard function (scalar on the CPU), exact GELU only.
AG_HOST_DEVICE inline float erf(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  return std::erf(x);
#endif
}
AG_HOST_DEVICE inline double erf(double x) { return ::erf(x); }

}  // namespace ampgrad::kernels::math
