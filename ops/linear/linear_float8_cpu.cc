// The element-wise halves of the CPU FP8 linear (linear_float8_kernels.h): the scaled saturating
// cast with its amax and its saturated and flushed counts in the same pass, the amax alone
// (current scaling), and the epilogue that descales the float products and adds the bias. The GEMM itself is the packed GEMM, which decodes
// FP8 operands exactly while it packs them (linear_gemm_pack_cpu.cc).
//
// The cast is framework/float8.h's saturating one written without branches, so that -O3
// vectorises it (the reference's loop took 3x an FP32 training step of the Fashion-MNIST MLP):
// normals round to nearest even by adding half an FP8 step (less one, plus the kept bit) to the
// float's bits, subnormals by letting a float addition round them (x + 2^(e_min - m + 23) holds
// round(x / 2^(e_min - m)) in its low bits). The amax is the largest |x| as bits: unsigned order
// is magnitude order, and every NaN's bits lie above inf's, so a NaN wins.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <vector>

#include "framework/dtype.h"
#include "framework/parallel.h"
#include "ops/linear/linear_float8_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

constexpr int64_t kChunk = 4096;  // elements widened at a time (a float buffer on the stack)

inline uint32_t abs_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

// fp8::from_float_bits<T>(bits of x, saturate = true), branch-free (see the top of the file).
template <typename T>
inline uint8_t saturated_code(float x) {
  using F = fp8::Format<T>;
  constexpr int m = F::kMantissaBits;
  constexpr uint32_t max_bits = fp8::to_float_bits<T>(F::kMaxCode);
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(127 + 1 - F::kBias) << 23;
  constexpr uint32_t magic_bits = static_cast<uint32_t>(127 + 1 - F::kBias - m + 23) << 23;
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t c = std::min(a, max_bits);  // inf and beyond to max (NaN is picked below)
  const uint32_t normal = ((c + ((1u << (22 - m)) - 1u) + ((c >> (23 - m)) & 1u)) >> (23 - m)) -
                          (static_cast<uint32_t>(127 - F::kBias) << m);
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(c) + std::bit_cast<float>(magic_bits)) - magic_bits;
  const uint32_t code = c < min_normal_bits ? subnormal : normal;
  return static_cast<uint8_t>(sign | (a > 0x7f800000u ? 0x7fu : code));
}

// A pass's partial result: the amax as bits, and the cast's counts (zero for amax alone).
struct Partial {
  uint32_t amax_bits = 0;
  int64_t saturated = 0, flushed = 0;

  void add(const Partial& other) {
    amax_bits = std::max(amax_bits, other.amax_bits);
    saturated += other.saturated;
    flushed += other.flushed;
  }
};

// dst[j] = saturated_code(x[j] * scale), with the largest |x[j]| as bits and how many products
// the clamp changed (saturated: at or past fp8::saturation_bits, infs too) or nonzero x[j] came out as
// +-0 (flushed). The counts are 32-bit (a chunk has at most kChunk elements) so that the loop
// stays vectorised.
template <typename T>
Partial cast_chunk(const float* x, int64_t count, float scale, uint8_t* dst) {
  constexpr uint32_t clamped_bits = fp8::saturation_bits<T>();
  uint32_t amax = 0;
  int32_t saturated = 0, flushed = 0;
  for (int64_t j = 0; j < count; ++j) {
    const uint32_t a = abs_bits(x[j]);
    const float v = x[j] * scale;
    const uint32_t av = abs_bits(v);
    const uint8_t code = saturated_code<T>(v);
    amax = std::max(amax, a);
    saturated += static_cast<int32_t>((av >= clamped_bits) & (av <= 0x7f800000u));
    flushed += static_cast<int32_t>(((code & 0x7fu) == 0) & (a != 0));
    dst[j] = code;
  }
  return {amax, saturated, flushed};
}

// fn(floats, count, offset) -> Partial, over src widened to float kChunk at a time, on the pool;
// returns the partials combined.
template <typename Fn>
Partial over_chunks(const Tensor& src, Fn&& fn) {
  const int64_t n = src.numel();
  Partial total;
  std::mutex mutex;
  visit_floating_dtype(src.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* data = static_cast<const T*>(src.data_ptr());
    parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
      float wide[kChunk];
      Partial part;
      for (int64_t i = lo; i < hi; i += kChunk) {
        const int64_t count = std::min(kChunk, hi - i);
        if constexpr (std::is_same_v<T, float>) {
          part.add(fn(data + i, count, i));
        } else {
          for (int64_t j = 0; j < count; ++j) wide[j] = static_cast<float>(load(data[i + j]));
          part.add(fn(wide, count, i));
        }
      }
      const std::lock_guard<std::mutex> lock(mutex);
      total.add(part);
    });
  });
  return total;
}

}  // namespace

float amax(const Tensor& src) {
  return std::bit_cast<float>(over_chunks(src, [](const float* x, int64_t count, int64_t) {
                                uint32_t a = 0;
                                for (int64_t j = 0; j < count; ++j) a = std::max(a, abs_bits(x[j]));
                                return Partial{a};
                              }).amax_bits);
}

Float8CastCounts quantize_float8(const Tensor& src, float scale, Tensor& dst) {
  auto* out = static_cast<uint8_t*>(dst.data_ptr());
  const bool e4m3 = dst.dtype() == DType::kFloat8E4M3;
  const Partial total = over_chunks(src, [&](const float* x, int64_t count, int64_t offset) {
    return e4m3 ? cast_chunk<Float8E4M3>(x, count, scale, out + offset)
                : cast_chunk<Float8E5M2>(x, count, scale, out + offset);
  });
  return {.format = dst.dtype(),
          .scale = scale,
          .amax = std::bit_cast<float>(total.amax_bits),
          .numel = src.numel(),
          .saturated = total.saturated,
          .flushed = total.flushed};
}

void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out) {
  const int64_t n = products.size(-1), rows = products.numel() / std::max<int64_t>(n, 1);
  const float* c = products.data<float>();
  // In float where alpha is a normal float (always but for absurd scales): one rounding of alpha
  // (none for power-of-two scales) and a loop that vectorises; else in double.
  const bool in_float = alpha >= FLT_MIN && alpha <= FLT_MAX && out.dtype() != DType::kFloat64;
  std::vector<double> b(static_cast<size_t>(n), 0.0);
  std::vector<float> bf(static_cast<size_t>(n), 0.0f);
  if (bias.defined()) {
    visit_floating_dtype(bias.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* p = static_cast<const T*>(bias.data_ptr());
      for (int64_t j = 0; j < n; ++j) b[static_cast<size_t>(j)] = static_cast<double>(load(p[j]));
    });
    for (int64_t j = 0; j < n; ++j) bf[static_cast<size_t>(j)] = static_cast<float>(b[static_cast<size_t>(j)]);
  }
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    T* y = static_cast<T*>(out.data_ptr());
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1));
    const float alpha_f = static_cast<float>(alpha);
    parallel_range(rows, grain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float* ci = c + i * n;
        T* yi = y + i * n;
        if (in_float) {
          if constexpr (!std::is_same_v<T, double>) {
            for (int64_t j = 0; j < n; ++j) yi[j] = store<T>(std::fma(ci[j], alpha_f, bf[static_cast<size_t>(j)]));
          }
        } else {
          for (int64_t j = 0; j < n; ++j) {
            // Rounded once, from double.
            yi[j] = convert<T>(std::fma(static_cast<double>(ci[j]), alpha, b[static_cast<size_t>(j)]));
          }
        }
      }
    });
  });
}

namespace {
std::atomic<bool> twins_for_testing{false};
}  // namespace

void make_twins_for_testing(bool on) { twins_for_testing = on; }

// The packed GEMM reads an operand in either layout at no cost (it decodes while it packs), so the
// CPU keeps no transposed twin, unless a test asks for one.
Float8CastCounts quantize_float8_pair(const Tensor& src, float scale, Tensor& dst, Tensor& dst_t) {
  const Float8CastCounts cast = quantize_float8(src, scale, dst);
  if (!twins_for_testing) {
    dst_t = Tensor();
    return cast;
  }
  const int64_t rows = src.size(0), cols = src.size(1);
  dst_t = Tensor::empty({cols, rows}, dst.dtype());
  const auto* in = static_cast<const uint8_t*>(dst.data_ptr());
  auto* out = static_cast<uint8_t*>(dst_t.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
  return cast;
}

}  // namespace ampgrad::kernels::cpu
