// A row's maximum and its sum of exponentials on the CPU, shared by softmax, log_softmax,
// cross_entropy and the fused attention's online softmax.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/lane_sum_cpu.h"
#include "ops/math.h"

namespace ampgrad::kernels::cpu::rows {

// The row loops below run in kLanes independent lanes, which the compiler vectorises: a maximum is
// the same in any order (a NaN is passed over, as std::max does), and a double sum of exponentials
// only changes its rounding order. One lane each, they had stayed scalar (2 ns a logit: 2.4% of a
// GPT-2-small step with its 50304 classes). They are always inlined, so that a caller compiled for
// AVX-512 (the fused attention's) runs them 16 floats to a vector.
inline constexpr int64_t kLanes = 16;

template <typename C>
[[gnu::always_inline]] inline C row_max(const C* v, int64_t n) {
  const int64_t whole = n / kLanes * kLanes;
  C lanes[kLanes];
  std::fill_n(lanes, kLanes, -std::numeric_limits<C>::infinity());
  for (int64_t j = 0; j < whole; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], v[j + l]);
  }
  C max = -std::numeric_limits<C>::infinity();
  for (int64_t j = whole; j < n; ++j) max = std::max(max, v[j]);
  for (int64_t l = 0; l < kLanes; ++l) max = std::max(max, lanes[l]);
  return max;
}

// A row of -inf has no finite maximum: subtract 0, so exp gives 0 and the row NaN, as PyTorch.
template <typename C>
C finite_shift(C max) {
  return max == -std::numeric_limits<C>::infinity() ? C(0) : max;
}

// sum_j exp(v[j] - shift) in double (lane_sum_cpu.h); with kStore, each exponential also goes to
// out[j].
template <bool kStore, typename C>
[[gnu::always_inline]] inline double sum_exp(const C* v, int64_t n, C shift, C* out = nullptr) {
  return lane_sum<kLanes>(n, [v, shift, out](int64_t j) {
    const C e = math::exp(v[j] - shift);
    if constexpr (kStore) out[j] = e;
    return static_cast<double>(e);
  });
}

}  // namespace ampgrad::kernels::cpu::rows
