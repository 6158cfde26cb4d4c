// One double sum in independent lanes, shared by the CPU kernels whose sums run long: layer_norm's
// and batch_norm's statistics, softmax's sum of exponentials, a reduction's sum along the inner
// dimension, the gradient norm's squares and mse_loss's squared errors.
#pragma once

#include <cstdint>

namespace ampgrad::kernels::cpu {

// sum_{j < n} term(j) in double, in kLanes partial sums that the compiler vectorises: in one sum
// every add waits on the one before (about 4 cycles a value). term(j) is called once for each j.
// The tail is added first and then the lanes in order: the order is fixed by kLanes alone, so the
// bits do not depend on the vector width the caller is compiled for (the fused attention runs it
// in a baseline and an AVX-512 build). Each caller picks the lane count its term's cost pays for.
// Always inlined, so it vectorises for its caller's target.
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
