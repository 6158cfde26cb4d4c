// Optimizer updates on the CPU: the pool takes the chunks of every parameter one at a time; each
// chunk reads a 16-bit gradient widened a block at a time and rounds its part of the new master
// into the lower-precision parameter while it is still in cache. Without a master, bfloat16
// weights are widened, updated and rounded back stochastically in one pass (AVX-512 where
// allowed); float16 weights a block at a time.
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "framework/cpu_features.h"
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

// Whether indices [first, first + n) lie in one 2^32-aligned block, where the Weyl counter of
// stochastic::random_bits steps by addition (a loop over them vectorises).
bool in_one_weyl_block(uint64_t first, int64_t n) {
  return (first & 0xffffffffu) + static_cast<uint64_t>(n) <= (uint64_t{1} << 32);
}

// random_bits(key, index + i) in that block, from counter = weyl_counter(key, index).
[[gnu::always_inline]] inline uint32_t weyl_random(uint32_t counter, int64_t i) {
  return stochastic::finalise(counter + static_cast<uint32_t>(i) * stochastic::kWeylStep);
}

// src[0, n) rounded stochastically into the 16-bit tensor at `data` from element `first`; the
// random bits of element i are keyed by `key` and i's index in the tensor, `index0` + i.
template <typename T>
void round_stochastically(const float* __restrict src, T* __restrict dst, int64_t n, uint64_t key, int64_t index0) {
  const auto bits16 = [](float v, uint32_t random) {
    const uint32_t u = std::bit_cast<uint32_t>(v);
    return std::is_same_v<T, BFloat16> ? stochastic::bfloat16_bits(u, random) : stochastic::float16_bits(u, random);
  };
  const uint64_t first = static_cast<uint64_t>(index0);
  if (in_one_weyl_block(first, n)) {
    const uint32_t counter = stochastic::weyl_counter(key, first);
    for (int64_t i = 0; i < n; ++i) dst[i].bits = bits16(src[i], weyl_random(counter, i));
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

// One element's update, shared by the float loops and the fused bfloat16 loops below so that both
// compute the same float. Inlined into loops that take their scalars by value and their arrays as
// restrict pointers: captured by reference, the scalars are reloaded after every store (a store
// through a float* might change them), which keeps GCC from vectorising the loop (measured: Adam's
// loop ran scalar, 17% of a GPT-2-small BF16 step at half the machine's copy bandwidth).
[[gnu::always_inline]] inline float sgd_element(float g, float w, const SgdScalars& s) {
  return w - s.lr * (g + s.weight_decay * w);
}

[[gnu::always_inline]] inline float sgd_momentum_element(float g, float w, float& buf, const SgdScalars& s) {
  const float d = g + s.weight_decay * w;
  buf = s.first_step ? d : s.momentum * buf + s.one_minus_dampening * d;
  return w - s.lr * (s.nesterov ? d + s.momentum * buf : buf);
}

[[gnu::always_inline]] inline float adam_element(float g, float w, float& m, float& v, const AdamScalars& s) {
  const float gi = g + s.l2 * w;
  w *= s.decoupled;
  m = s.beta1 * m + s.one_minus_beta1 * gi;
  v = s.beta2 * v + s.one_minus_beta2 * gi * gi;
  return w - s.step_size * m / (std::sqrt(v) / s.bc2_sqrt + s.eps);
}

void sgd_elements(int64_t n, const float* __restrict g, float* __restrict w, SgdScalars s) {
  for (int64_t i = 0; i < n; ++i) w[i] = sgd_element(g[i], w[i], s);
}

void sgd_momentum_elements(int64_t n, const float* __restrict g, float* __restrict w, float* __restrict buf,
                           SgdScalars s) {
  for (int64_t i = 0; i < n; ++i) w[i] = sgd_momentum_element(g[i], w[i], buf[i], s);
}

void adam_elements(int64_t n, const float* __restrict g, float* __restrict w, float* __restrict m,
                   float* __restrict v, AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) w[i] = adam_element(g[i], w[i], m[i], v[i], s);
}

// Bfloat16 weights without a master, in one pass: each weight is widened, updated and rounded
// back stochastically in registers (the block path above widens into a buffer, updates it and
// rounds it in three passes: 1.05x the step time of FP32 masters on an MLP). The counter is the
// Weyl counter of element 0 (its 2^32-aligned block holds all n).
[[gnu::always_inline]] inline float widened(float g) { return g; }
[[gnu::always_inline]] inline float widened(BFloat16 x) { return std::bit_cast<float>(bf16::to_float_bits(x.bits)); }

[[gnu::always_inline]] inline uint16_t rounded_bits(float w, uint32_t counter, int64_t i) {
  return stochastic::bfloat16_bits(std::bit_cast<uint32_t>(w), weyl_random(counter, i));
}

template <typename G>
[[gnu::always_inline]] inline void sgd_bfloat16_elements(int64_t n, const G* __restrict g, BFloat16* __restrict w,
                                                         float* __restrict buf, SgdScalars s, uint32_t counter) {
  if (buf == nullptr) {
    for (int64_t i = 0; i < n; ++i) w[i].bits = rounded_bits(sgd_element(widened(g[i]), widened(w[i]), s), counter, i);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      w[i].bits = rounded_bits(sgd_momentum_element(widened(g[i]), widened(w[i]), buf[i], s), counter, i);
    }
  }
}

template <typename G>
[[gnu::always_inline]] inline void adam_bfloat16_elements(int64_t n, const G* __restrict g, BFloat16* __restrict w,
                                                          float* __restrict m, float* __restrict v, AdamScalars s,
                                                          uint32_t counter) {
  for (int64_t i = 0; i < n; ++i) {
    w[i].bits = rounded_bits(adam_element(widened(g[i]), widened(w[i]), m[i], v[i], s), counter, i);
  }
}

// The same loops compiled for AVX-512 (16 floats a vector), chosen where effective_cpu_isa() allows.
template <typename G>
[[gnu::target(AMPGRAD_AVX512_FEATURES ",prefer-vector-width=512")]] void sgd_bfloat16_elements_avx512(
    int64_t n, const G* __restrict g, BFloat16* __restrict w, float* __restrict buf, SgdScalars s, uint32_t counter) {
  sgd_bfloat16_elements(n, g, w, buf, s, counter);
}

template <typename G>
[[gnu::target(AMPGRAD_AVX512_FEATURES ",prefer-vector-width=512")]] void adam_bfloat16_elements_avx512(
    int64_t n, const G* __restrict g, BFloat16* __restrict w, float* __restrict m, float* __restrict v, AdamScalars s,
    uint32_t counter) {
  adam_bfloat16_elements(n, g, w, m, v, s, counter);
}

// Runs fused(g, w, counter) on a chunk whose weights are bfloat16 and whose gradient is bfloat16
// or float32, when its indices lie in one 2^32-aligned block; false (nothing done) otherwise.
template <size_t Lists, typename Fused>
bool fused_bfloat16(const Chunk<Lists>& c, size_t weight, size_t grad, uint64_t key, Fused&& fused) {
  const uint64_t first = static_cast<uint64_t>(c.start);
  if (c.dtype[weight] != DType::kBFloat16 || !in_one_weyl_block(first, c.n)) return false;
  auto* const w = chunk_data<BFloat16>(c, weight);
  const uint32_t counter = stochastic::weyl_counter(key, first);
  if (c.dtype[grad] == DType::kBFloat16) {
    fused(chunk_data<const BFloat16>(c, grad), w, counter);
  } else if (c.dtype[grad] == DType::kFloat32) {
    fused(chunk_data<const float>(c, grad), w, counter);
  } else {
    return false;
  }
  return true;
}

}  // namespace

void sgd_update(const std::vector<Chunk<kSgdLists>>& chunks, const std::vector<SgdScalars>& scalars) {
  const bool avx512 = effective_cpu_isa() >= CpuIsa::kAvx512;
  multi_tensor::apply_cpu(chunks, scalars, [avx512](const Chunk<kSgdLists>& c, const SgdScalars& s) {
    float* const buffer = chunk_data<float>(c, kSgdMomentum);
    const bool fused = fused_bfloat16(c, kSgdWeight, kSgdGrad, s.rounding_key, [&](const auto* g, BFloat16* w, uint32_t counter) {
      if (avx512) {
        sgd_bfloat16_elements_avx512(c.n, g, w, buffer, s, counter);
      } else {
        sgd_bfloat16_elements(c.n, g, w, buffer, s, counter);
      }
    });
    if (fused) return;
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
  const bool avx512 = effective_cpu_isa() >= CpuIsa::kAvx512;
  multi_tensor::apply_cpu(chunks, scalars, [avx512](const Chunk<kAdamLists>& c, const AdamScalars& s) {
    float* const exp_avg = chunk_data<float>(c, kAdamExpAvg);
    float* const exp_avg_sq = chunk_data<float>(c, kAdamExpAvgSq);
    const bool fused = fused_bfloat16(c, kAdamWeight, kAdamGrad, s.rounding_key, [&](const auto* g, BFloat16* w, uint32_t counter) {
      if (avx512) {
        adam_bfloat16_elements_avx512(c.n, g, w, exp_avg, exp_avg_sq, s, counter);
      } else {
        adam_bfloat16_elements(c.n, g, w, exp_avg, exp_avg_sq, s, counter);
      }
    });
    if (fused) return;
    with_float_blocks(c, kAdamWeight, kAdamGrad, s.rounding_key, [&](int64_t start, int64_t n, float* w, const float* g) {
      adam_elements(n, g, w, exp_avg + start, exp_avg_sq + start, s);
    });
    write_rounded(chunk_data<float>(c, kAdamWeight), c, kAdamRounded);
  });
}

}  // namespace ampgrad::optim::kernels::cpu
