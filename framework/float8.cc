// Bulk 8-bit float conversions: widening by a table of the 256 codes' values, narrowing by the
// bit-level reference of float8.h (branch-light, so the loop stays a few instructions a value).
#include "framework/float8.h"

#include <array>

namespace ampgrad {

namespace {

template <typename T>
const std::array<float, 256>& widening_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = std::bit_cast<float>(fp8::to_float_bits<T>(static_cast<uint8_t>(c)));
    return t;
  }();
  return table;
}

template <typename T>
void widen_with_table(const T* src, float* dst, size_t n) {
  const std::array<float, 256>& table = widening_table<T>();
  for (size_t i = 0; i < n; ++i) dst[i] = table[src[i].bits];
}

template <typename T>
void narrow_bits(const float* src, T* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i].bits = fp8::from_float_bits<T>(std::bit_cast<uint32_t>(src[i]), false);
}

template <typename T>
void narrow_saturated(const float* src, float scale, T* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i].bits = fp8::from_float_bits<T>(std::bit_cast<uint32_t>(src[i] * scale), true);
}

}  // namespace

const float* float8_value_table(Float8E4M3) { return widening_table<Float8E4M3>().data(); }
const float* float8_value_table(Float8E5M2) { return widening_table<Float8E5M2>().data(); }
void float8_to_float(const Float8E4M3* src, float* dst, size_t n) { widen_with_table(src, dst, n); }
void float8_to_float(const Float8E5M2* src, float* dst, size_t n) { widen_with_table(src, dst, n); }
void float_to_float8(const float* src, Float8E4M3* dst, size_t n) { narrow_bits(src, dst, n); }
void float_to_float8(const float* src, Float8E5M2* dst, size_t n) { narrow_bits(src, dst, n); }
void float_to_float8_saturated(const float* src, float scale, Float8E4M3* dst, size_t n) {
  narrow_saturated(src, scale, dst, n);
}
void float_to_float8_saturated(const float* src, float scale, Float8E5M2* dst, size_t n) {
  narrow_saturated(src, scale, dst, n);
}

}  // namespace ampgrad
