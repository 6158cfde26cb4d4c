// Fused MSE forward and backward on the CPU (one pass each, no temporary for the difference).
// Each squared difference is formed in the compute type and summed in double, in pieces fixed by
// the size alone, so the error does not grow with n and the bits do not depend on the threads.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "framework/parallel.h"
#include "ops/lane_sum_cpu.h"
#include "ops/loss/loss_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

constexpr int64_t kPiece = int64_t{1} << 16;
constexpr int64_t kBlock = 512;  // 16-bit values widened per block

// n values as compute-type values: src itself, or 16-bit floats widened into buffer.
template <typename T>
const ComputeType<T>* widened(const T* src, int64_t n, ComputeType<T>* buffer) {
  if constexpr (kIsLowPrecision<T>) {
    widen(src, buffer, static_cast<size_t>(n));
    return buffer;
  } else {
    return src;
  }
}

// sum of (p - y)^2 over n elements, each term in the compute type, summed in double: in lanes
// (lane_sum_cpu.h) within each block of kBlock widened values, then block by block.
template <typename T>
double squared_error(const T* p, const T* y, int64_t n) {
  using C = ComputeType<T>;
  double total = 0.0;
  C wp[kBlock], wy[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    const C* vp = widened(p + start, len, wp);
    const C* vy = widened(y + start, len, wy);
    total += lane_sum<4>(len, [vp, vy](int64_t j) {
      const C d = vp[j] - vy[j];
      return static_cast<double>(d * d);
    });
  }
  return total;
}

}  // namespace

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  visit_floating_dtype(loss.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* p = pred.data<T>();
    const T* y = target.data<T>();
    const int64_t n = pred.numel();
    const int64_t pieces = (n + kPiece - 1) / kPiece;
    std::vector<double> partial(static_cast<size_t>(pieces), 0.0);
    parallel_for(pieces, [&](int64_t piece) {
      const int64_t lo = piece * kPiece, hi = std::min(n, lo + kPiece);
      partial[static_cast<size_t>(piece)] = squared_error(p + lo, y + lo, hi - lo);
    });
    double total = 0.0;
    for (double v : partial) total += v;
    // The mean of nothing is NaN, as in PyTorch.
    loss.data<T>()[0] = convert<T>(n == 0 ? std::numeric_limits<double>::quiet_NaN() : total / static_cast<double>(n));
  });
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget) {
  visit_floating_dtype(dpred.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* p = pred.data<T>();
    const T* y = target.data<T>();
    T* dp = dpred.data<T>();
    T* dt = dtarget.defined() ? dtarget.data<T>() : nullptr;
    const int64_t n = pred.numel();
    const C coeff = C(2) * load(dloss.data<T>()[0]) / static_cast<C>(n);
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const C g = coeff * (load(p[i]) - load(y[i]));
        dp[i] = store<T>(g);
        if (dt != nullptr) dt[i] = store<T>(-g);
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
