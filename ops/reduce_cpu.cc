// Reductions on CPU, accumulating in float (double for float64) and rounding once.
#include "ops/reduce_kernels.h"

#include <vector>

namespace ampgrad::kernels::cpu {

void sum_to(const Tensor& x, double alpha, Tensor& out) {
  visit_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const int64_t cols = out.numel();
    // Nothing to write. (Without this, rows = 0 / 0 raised SIGFPE: e.g. db of a linear with 0 outputs.)
    if (cols == 0) return;
    const int64_t rows = x.numel() / cols;
    if (cols == 1) {
      // Pairwise over 8 lanes keeps the float error ~ log(n) eps instead of n eps.
      C lanes[8] = {};
      int64_t i = 0;
      for (; i + 8 <= rows; i += 8) {
        for (int k = 0; k < 8; ++k) lanes[k] += load(in[i + k]);
      }
      C total = 0;
      for (; i < rows; ++i) total += load(in[i]);
      total += ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
      out.data<T>()[0] = store<T>(static_cast<C>(alpha * total));
      return;
    }
    std::vector<C> acc(static_cast<size_t>(cols), C(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = in + r * cols;
      for (int64_t j = 0; j < cols; ++j) acc[j] += load(row[j]);
    }
    for (int64_t j = 0; j < cols; ++j) out.data<T>()[j] = store<T>(static_cast<C>(alpha * acc[j]));
  });
}

}  // namespace ampgrad::kernels::cpu
