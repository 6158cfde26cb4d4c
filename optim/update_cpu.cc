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

// The element loops take their scalars by value and their arrays as restrict pointers: captured
// by reference, the scalars are reloaded after every store (a store through a float* might change
// them), which keeps GCC from vectorising the loop (measured: Adam's loop ran scalar, 17% of a
// GPT-2-small BF16 step at half the machine's copy bandwidth).
void sgd_elements(int64_t n, const float* __restrict g, float* __restrict w, SgdScalars s) {
  for (int64_t i = 0; i < n; ++i) w[i] -= s.lr * (g[i] + s.weight_decay * w[i]);
}

void sgd_momentum_elements(int64_t n, const float* __restrict g, float* __restrict w, float* __restrict buf,
                           SgdScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + s.weight_decay * w[i];
    buf[i] = s.first_step ? d : s.momentum * buf[i] + s.one_minus_dampening * d;
    w[i] -= s.lr * (s.nesterov ? d + s.momentum * buf[i] : buf[i]);
  }
}

void adam_elements(int64_t n, const float* __restrict g, float* __restrict w, float* __restrict m,
                   float* __restrict v, AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + s.l2 * w[i];
    w[i] *= s.decoupled;
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    w[i] -= s.step_size * m[i] / (std::sqrt(v[i]) / s.bc2_sqrt + s.eps);
  }
}

}  // namespace

void sgd_update(const std::vector<Chunk<kSgdLists>>& chunks, const std::vector<SgdScalars>& scalars) {
  multi_tensor::apply_cpu(chunks, scalars, [](const Chunk<kSgdLists>& c, const SgdScalars& s) {
    float* const weights = chunk_data<float>(c, kSgdWeight);
    float* const buffer = chunk_data<float>(c, kSgdMomentum);
    with_float_grad(c, kSgdGrad, [&](int64_t start, int64_t n, const float* g) {
      if (buffer == nullptr) {
        sgd_elements(n, g, weights + start, s);
      } else {
        sgd_momentum_elements(n, g, weights + start, buffer + start, s);
      }
    });
    write_rounded(weights, c, kSgdRounded);
  });
}

void adam_update(const std::vector<Chunk<kAdamLists>>& chunks, const std::vector<AdamScalars>& scalars) {
  multi_tensor::apply_cpu(chunks, scalars, [](const Chunk<kAdamLists>& c, const AdamScalars& s) {
    float* const weights = chunk_data<float>(c, kAdamWeight);
    float* const exp_avg = chunk_data<float>(c, kAdamExpAvg);
    float* const exp_avg_sq = chunk_data<float>(c, kAdamExpAvgSq);
    with_float_grad(c, kAdamGrad, [&](int64_t start, int64_t n, const float* g) {
      adam_elements(n, g, weights + start, exp_avg + start, exp_avg_sq + start, s);
    });
    write_rounded(weights, c, kAdamRounded);
  });
}

}  // namespace ampgrad::optim::kernels::cpu
