// One double sum in independent lanes, shared by the CPU kernels whose row or channel sums run long
// (layer_norm, batch_norm, softmax's sum of exponentials, the gradient norm's sum of squares).
#pragma once

#include <cstdint>

namespace ampgrad::kernels::cpu {

// sum_{j < n} term(j) in double, in kLanes partial sums that the compiler vectorises: in one sum
// every add waits on the one before (about 4 cycles a value). The tail is added first and then the
// lanes in order, a fixed order, so the bits do not depend on the thread count. Each caller picks
// the lane count its term's cost pays for. Always inlined, so it vectorises for its caller's target.
template <int64_t kLanes, typename Term>
[[gnu::always_inline]] inline double lane_sum(int64_t n, Term&& term) {
  double lanes[kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t j = 0; j < whole; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += term(j + l);
  }
  double sum = 0.0;
  for (int64_t j = whole; j < n; ++j) sum += term(j);
  for (const double lane : lanes) sum += lane;
  return sum;
}

}  // namespace ampgrad::kernels::cpu
