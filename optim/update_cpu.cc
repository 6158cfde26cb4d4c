// Optimizer updates on the CPU: the pool takes the chunks of every parameter one at a time; each
// chunk reads a 16-bit gradient widened a block at a time and rounds its part of the new master
// into the lower-precision parameter while it is still in cache.
#include <algorithm>
#include <cmath>

#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/multi_tensor.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim::kernels::cpu {

namespace {

using multi_tensor::Chunk;
using multi_tensor::chunk_data;

// Calls body(start, len, g) over the chunk, g the gradient (list `list`) of elements
// [start, start + len) as floats: in place when float32, else widened a block at a time (exact).
template <size_t Lists, typename Body>
void with_float_grad(const Chunk<Lists>& c, size_t list, Body&& body) {
  if (c.dtype[list] == DType::kFloat32) return body(int64_t{0}, c.n, chunk_data<const float>(c, list));
  visit_floating_dtype(c.dtype[list], [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) {
      constexpr int64_t kBlock = 2048;
      float wide[kBlock];
      const T* g = chunk_data<const T>(c, list);
      for (int64_t start = 0; start < c.n; start += kBlock) {
        const int64_t len = std::min(kBlock, c.n - start);
        widen(g + start, wide, static_cast<size_t>(len));
        body(start, len, static_cast<const float*>(wide));
      }
    }
  });
}

// The chunk's rounded copy (list `list`, if the parameter has one) = round(w) in its dtype
// (vectorised bulk rounding).
template <size_t Lists>
void write_rounded(const float* w, const Chunk<Lists>& c, size_t list) {
  if (c.data[list] == nullptr) return;
  visit_floating_dtype(c.dtype[list], [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) narrow(w, chunk_data<T>(c, list), static_cast<size_t>(c.n));
  });
}

}  // namespace

void sgd_update(const std::vector<Chunk<kSgdLists>>& chunks, const std::vector<SgdScalars>& scalars) {
  multi_tensor::apply_cpu(chunks, scalars, [](const Chunk<kSgdLists>& c, const SgdScalars& s) {
    float* const weights = chunk_data<float>(c, kSgdWeight);
    float* const buffer = chunk_data<float>(c, kSgdMomentum);
    const float lr = s.lr, wd = s.weight_decay, momentum = s.momentum, one_minus_dampening = s.one_minus_dampening;
    const bool first = s.first_step, nesterov = s.nesterov;
    with_float_grad(c, kSgdGrad, [&](int64_t start, int64_t n, const float* g) {
      float* w = weights + start;
      if (buffer == nullptr) {
        for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
      } else {
        float* buf = buffer + start;
        for (int64_t i = 0; i < n; ++i) {
          const float d = g[i] + wd * w[i];
          buf[i] = first ? d : momentum * buf[i] + one_minus_dampening * d;
          w[i] -= lr * (nesterov ? d + momentum * buf[i] : buf[i]);
        }
      }
    });
    write_rounded(weights, c, kSgdRounded);
  });
}

void adam_update(const std::vector<Chunk<kAdamLists>>& chunks, const std::vector<AdamScalars>& scalars) {
  multi_tensor::apply_cpu(chunks, scalars, [](const Chunk<kAdamLists>& c, const AdamScalars& s) {
    float* const weights = chunk_data<float>(c, kAdamWeight);
    const float b1 = s.beta1, b2 = s.beta2, one_minus_b1 = s.one_minus_beta1, one_minus_b2 = s.one_minus_beta2;
    const float step_size = s.step_size, bc2_sqrt = s.bc2_sqrt, eps = s.eps, l2 = s.l2, decoupled = s.decoupled;
    with_float_grad(c, kAdamGrad, [&](int64_t start, int64_t n, const float* g) {
      float* w = weights + start;
      float* m = chunk_data<float>(c, kAdamExpAvg) + start;
      float* v = chunk_data<float>(c, kAdamExpAvgSq) + start;
      for (int64_t i = 0; i < n; ++i) {
        const float gi = g[i] + l2 * w[i];
        w[i] *= decoupled;
        m[i] = b1 * m[i] + one_minus_b1 * gi;
        v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
        w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
      }
    });
    write_rounded(weights, c, kAdamRounded);
  });
}

}  // namespace ampgrad::optim::kernels::cpu
