// Optimizer updates on the CPU: the element loops run on the pool in pieces, and each piece
// rounds its part of the new master into the lower-precision parameter while it is still in cache.
#include <cmath>

#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim::kernels::cpu {

namespace {

// copy[lo, hi) = round(w[lo, hi)) in the copy's dtype (vectorised bulk rounding).
void write_rounded(const float* w, RoundedCopy copy, int64_t lo, int64_t hi) {
  if (copy.data == nullptr) return;
  AG_CHECK(is_low_precision(copy.dtype), "optimizer: no rounded-copy path for ", copy.dtype);
  visit_floating_dtype(copy.dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) narrow(w + lo, static_cast<T*>(copy.data) + lo, static_cast<size_t>(hi - lo));
  });
}

}  // namespace

void sgd_update(float* w, const float* g, float* buf, RoundedCopy copy, int64_t n, const SgdScalars& s,
                Nesterov nesterov, FirstStep first) {
  const float lr = s.lr, wd = s.weight_decay, momentum = s.momentum, one_minus_dampening = s.one_minus_dampening;
  const bool is_first = first == FirstStep::kYes, is_nesterov = nesterov == Nesterov::kYes;
  parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    if (buf == nullptr) {
      for (int64_t i = lo; i < hi; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else {
      for (int64_t i = lo; i < hi; ++i) {
        const float d = g[i] + wd * w[i];
        buf[i] = is_first ? d : momentum * buf[i] + one_minus_dampening * d;
        w[i] -= lr * (is_nesterov ? d + momentum * buf[i] : buf[i]);
      }
    }
    write_rounded(w, copy, lo, hi);
  });
}

void adam_update(float* w, const float* g, float* m, float* v, RoundedCopy copy, int64_t n, const AdamScalars& s) {
  const float b1 = s.beta1, b2 = s.beta2, one_minus_b1 = s.one_minus_beta1, one_minus_b2 = s.one_minus_beta2;
  const float step_size = s.step_size, bc2_sqrt = s.bc2_sqrt, eps = s.eps, l2 = s.l2, decoupled = s.decoupled;
  parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g[i] + l2 * w[i];
      w[i] *= decoupled;
      m[i] = b1 * m[i] + one_minus_b1 * gi;
      v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
      w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
    write_rounded(w, copy, lo, hi);
  });
}

}  // namespace ampgrad::optim::kernels::cpu
