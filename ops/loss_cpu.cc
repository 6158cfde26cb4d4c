// Fused MSE forward and backward on CPU (one pass each, no temporary for the difference).
#include "ops/loss_kernels.h"

#include <limits>

namespace ampgrad::kernels::cpu {

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  visit_dtype(loss.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* p = pred.data<T>();
    const T* y = target.data<T>();
    const int64_t n = pred.numel();
    C lanes[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int k = 0; k < 4; ++k) {
        const C d = load(p[i + k]) - load(y[i + k]);
        lanes[k] += d * d;
      }
    }
    C total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; ++i) {
      const C d = load(p[i]) - load(y[i]);
      total += d * d;
    }
    loss.data<T>()[0] = store<T>(n == 0 ? std::numeric_limits<C>::quiet_NaN() : total / static_cast<C>(n));  // mean of nothing is NaN
  });
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget) {
  visit_dtype(dpred.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* p = pred.data<T>();
    const T* y = target.data<T>();
    T* dp = dpred.data<T>();
    T* dt = dtarget.defined() ? dtarget.data<T>() : nullptr;
    const int64_t n = pred.numel();
    const C coeff = C(2) * load(dloss.data<T>()[0]) / static_cast<C>(n);
    for (int64_t i = 0; i < n; ++i) {
      const C g = coeff * (load(p[i]) - load(y[i]));
      dp[i] = store<T>(g);
      if (dt != nullptr) dt[i] = store<T>(-g);
    }
  });
}

}  // namespace ampgrad::kernels::cpu
