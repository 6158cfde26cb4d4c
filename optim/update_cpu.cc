// Optimizer updates on the CPU: the pool takes the chunks of every parameter one at a time; each
// chunk reads a 16-bit gradient widened a block at a time and rounds its part of the new master
// into the lower-precision parameter while it is still in cache (or, without a master, rounds the
// widened 16-bit weights back stochastically, a block at a time).
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/multi_tensor.h"
#include "framework/stochastic_rounding.h"
#include "optim/update_kernels.h"

namespace ampgrad::optim::kernels::cpu {

namespace {

using multi_tensor::Chunk;
using multi_tensor::chunk_data;

// n elements of a 16-bit tensor at `data` (dtype), from element `first`, widened into dst (exact).
void widen_block(DType dtype, const void* data, int64_t first, float* dst, int64_t n) {
  visit_floating_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      widen(static_cast<const T*>(data) + first, dst, static_cast<size_t>(n));
    }
  });
}

// src[0, n) rounded stochastically into the 16-bit tensor at `data` from element `first`; the
// random bits of element i are keyed by `key` and i's index in the tensor, `index0` + i. Within a
// 2^32-aligned block of indices the Weyl counter steps by addition, which vectorises.
template <typename T>
void round_stochastically(const float* __restrict src, T* __restrict dst, int64_t n, uint64_t key, int64_t index0) {
  const auto bits16 = [](float v, uint32_t random) {
    const uint32_t u = std::bit_cast<uint32_t>(v);
    return std::is_same_v<T, BFloat16> ? stochastic::bfloat16_bits(u, random) : stochastic::float16_bits(u, random);
  };
  const uint64_t first = static_cast<uint64_t>(index0);
  if ((first & 0xffffffffu) + static_cast<uint64_t>(n) <= (uint64_t{1} << 32)) {
    const uint32_t counter = stochastic::weyl_counter(key, first);
    for (int64_t i = 0; i < n; ++i) {
      dst[i].bits = bits16(src[i], stochastic::finalise(counter + static_cast<uint32_t>(i) * stochastic::kWeylStep));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i].bits = bits16(src[i], stochastic::random_bits(key, first + static_cast<uint64_t>(i)));
  }
}

void round_block_stochastically(const float* src, DType dtype, void* data, int64_t first, int64_t n, uint64_t key,
                                int64_t index0) {
  if (dtype == DType::kBFloat16) {
    round_stochastically(src, static_cast<BFloat16*>(data) + first, n, key, index0);
  } else {
    AG_CHECK(dtype == DType::kFloat16, "stochastic rounding: ", dtype_name(dtype), " weights (16-bit only)");
    round_stochastically(src, static_cast<Half*>(data) + first, n, key, index0);
  }
}

// Calls body(start, len, w, g) over the chunk in blocks, w the weights (list `weight`) and g the
// gradient (list `grad`) of elements [start, start + len) as floats. Float32 lists are used in
// place. A 16-bit gradient is widened a block at a time (exact); 16-bit weights are widened too,
// and rounded back stochastically after the body, keyed by `key`.
template <size_t Lists, typename Body>
void with_float_blocks(const Chunk<Lists>& c, size_t weight, size_t grad, uint64_t key, Body&& body) {
  const bool float_weights = c.dtype[weight] == DType::kFloat32, float_grad = c.dtype[grad] == DType::kFloat32;
  if (float_weights && float_grad) {
    return body(int64_t{0}, c.n, chunk_data<float>(c, weight), chunk_data<const float>(c, grad));
  }
  constexpr int64_t kBlock = 2048;
  float wide_weights[kBlock], wide_grad[kBlock];
  for (int64_t start = 0; start < c.n; start += kBlock) {
    const int64_t len = std::min(kBlock, c.n - start);
    if (!float_grad) widen_block(c.dtype[grad], c.data[grad], start, wide_grad, len);
    if (!float_weights) widen_block(c.dtype[weight], c.data[weight], start, wide_weights, len);
    float* w = float_weights ? chunk_data<float>(c, weight) + start : wide_weights;
    body(start, len, w, float_grad ? chunk_data<const float>(c, grad) + start : static_cast<const float*>(wide_grad));
    if (!float_weights) {
      round_block_stochastically(wide_weights, c.dtype[weight], c.data[weight], start, len, key, c.start + start);
    }
  }
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
    float* const buffer = chunk_data<float>(c, kSgdMomentum);
    with_float_blocks(c, kSgdWeight, kSgdGrad, s.rounding_key, [&](int64_t start, int64_t n, float* w, const float* g) {
      if (buffer == nullptr) {
        sgd_elements(n, g, w, s);
      } else {
        sgd_momentum_elements(n, g, w, buffer + start, s);
      }
    });
    write_rounded(chunk_data<float>(c, kSgdWeight), c, kSgdRounded);
  });
}

void adam_update(const std::vector<Chunk<kAdamLists>>& chunks, const std::vector<AdamScalars>& scalars) {
  multi_tensor::apply_cpu(chunks, scalars, [](const Chunk<kAdamLists>& c, const AdamScalars& s) {
    float* const exp_avg = chunk_data<float>(c, kAdamExpAvg);
    float* const exp_avg_sq = chunk_data<float>(c, kAdamExpAvgSq);
    with_float_blocks(c, kAdamWeight, kAdamGrad, s.rounding_key, [&](int64_t start, int64_t n, float* w, const float* g) {
      adam_elements(n, g, w, exp_avg + start, exp_avg_sq + start, s);
    });
    write_rounded(chunk_data<float>(c, kAdamWeight), c, kAdamRounded);
  });
}

}  // namespace ampgrad::optim::kernels::cpu
