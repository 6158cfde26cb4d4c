// Element-wise CPU kernels: add/sub/mul/div and affine maps with NumPy broadcasting, the unary ops
// of unary_math.h, dropout, relu.
// Storage T, compute type float (double for float64): store(op(load(a), load(b))). Float16 and
// bfloat16 rows are converted a block at a time (vectorised), so every loop runs on floats.
#include <algorithm>
#include <type_traits>

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define AMPGRAD_HALF_ROWS_F16C 1
#endif

#include "framework/cpu_features.h"
#include "framework/parallel.h"
#include "ops/elementwise/dropout_mask.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/strided.h"
#include "ops/wide_loops_cpu.h"
#include "ops/elementwise/unary_math.h"

namespace ampgrad::kernels::cpu {

namespace {

constexpr int64_t kBlock = 512;  // 16-bit elements converted per block (three 2 KiB buffers)

// n values of a strided row as compute-type values: the row itself when it is contiguous in the
// compute type, else a copy in `buffer` (16-bit floats widened, strides gathered, a broadcast filled).
template <typename T>
const ComputeType<T>* row_values(const T* src, int64_t stride, int64_t n, ComputeType<T>* buffer) {
  if constexpr (kIsLowPrecision<T>) {
    if (stride == 1) {
      widen(src, buffer, static_cast<size_t>(n));
      return buffer;
    }
  } else {
    if (stride == 1) return src;
  }
  if (stride == 0) {
    std::fill_n(buffer, n, load(src[0]));
  } else {
    for (int64_t j = 0; j < n; ++j) buffer[j] = load(src[j * stride]);
  }
  return buffer;
}

// Writes n compute-type values into a contiguous row of T (16-bit floats rounded in bulk).
template <typename T>
void store_row(const ComputeType<T>* values, int64_t n, T* dst) {
  if constexpr (kIsLowPrecision<T>) {
    narrow(values, dst, static_cast<size_t>(n));
  } else if (values != dst) {
    std::copy_n(values, n, dst);
  }
}

// Runs row(offsets, inner) over every row of the plan, on the pool when there is enough work.
template <int N, typename Row>
void run_rows(const StridedPlan<N>& plan, Row&& row) {
  const int64_t rows = plan_rows(plan);
  if (rows == 0) return;
  const int64_t inner = plan.numel / rows;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1));
  parallel_range(rows, grain, [&](int64_t lo, int64_t hi) { for_each_row(plan, lo, hi, row); });
}

template <int N>
int64_t inner_stride(const StridedPlan<N>& plan, int n) {
  return plan.rank > 0 ? plan.strides[n][plan.rank - 1] : 1;
}

#ifdef AMPGRAD_HALF_ROWS_F16C
inline __m256 load_half8(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// out[j] = f(a[j * sa], b[j * sb]) for j < n, each of a and b contiguous (stride 1) or one value
// (stride 0): one pass, 8 at a time, widened and rounded in registers. The blocked path (widen
// each operand into a buffer, add, round) ran 4 loops per block and reached 0.78 of this
// machine's copy bandwidth on the [64,512,768] + [768] add. Same rounding: float math, RNE.
template <typename F>
void binary_half_row(const Half* a, int64_t sa, const Half* b, int64_t sb, Half* out, int64_t n, F f) {
  const auto run = [&](auto load_a, auto load_b) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m128i rounded = _mm256_cvtps_ph(f(load_a(j), load_b(j)), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), rounded);
    }
    for (; j < n; ++j) out[j] = float_to_half(f(half_to_float(a[j * sa]), half_to_float(b[j * sb])));
  };
  const __m256 a0 = _mm256_set1_ps(half_to_float(a[0])), b0 = _mm256_set1_ps(half_to_float(b[0]));
  const auto row_a = [&](int64_t j) { return load_half8(a + j); };
  const auto row_b = [&](int64_t j) { return load_half8(b + j); };
  const auto one_a = [&](int64_t) { return a0; };
  const auto one_b = [&](int64_t) { return b0; };
  if (sa == 1 && sb == 1) return run(row_a, row_b);
  if (sa == 1) return run(row_a, one_b);
  if (sb == 1) return run(one_a, row_b);
  run(one_a, one_b);
}
#endif

// out = f(a, b) over the plan (operand 0 out, contiguous; 1 a; 2 b), in blocks of kBlock.
template <typename T, typename F>
void binary_plan(const T* a, const T* b, T* out, const StridedPlan<3>& plan, F f) {
  using C = ComputeType<T>;
  const int64_t sa = inner_stride(plan, 1), sb = inner_stride(plan, 2);
#ifdef AMPGRAD_HALF_ROWS_F16C
  if constexpr (std::is_same_v<T, Half>) {
    if ((sa == 0 || sa == 1) && (sb == 0 || sb == 1)) {
      return run_rows(plan, [&](const int64_t* offsets, int64_t inner) {
        binary_half_row(a + offsets[1], sa, b + offsets[2], sb, out + offsets[0], inner, f);
      });
    }
  }
#endif
  run_rows(plan, [&](const int64_t* offsets, int64_t inner) {
    C wa[kBlock], wb[kBlock], wo[kBlock];
    for (int64_t start = 0; start < inner; start += kBlock) {
      const int64_t n = std::min(kBlock, inner - start);
      const C* va = row_values(a + offsets[1] + start * sa, sa, n, wa);
      const C* vb = row_values(b + offsets[2] + start * sb, sb, n, wb);
      T* o = out + offsets[0] + start;
      C* vo = std::is_same_v<T, C> ? reinterpret_cast<C*>(o) : wo;
      for (int64_t j = 0; j < n; ++j) vo[j] = f(va[j], vb[j]);
      store_row(vo, n, o);
    }
  });
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (out.numel() == 0) return;
  const StridedPlan<3> plan = make_plan<3>(
      out.shape(), {contiguous_strides(out.shape()), broadcast_strides(a.shape(), out.shape()),
                    broadcast_strides(b.shape(), out.shape())});
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    auto run = [&](auto f) { binary_plan<T>(a.data<T>(), b.data<T>(), out.data<T>(), plan, f); };
    switch (op) {
      case BinaryOp::kAdd: run([](auto x, auto y) { return x + y; }); break;
      case BinaryOp::kSub: run([](auto x, auto y) { return x - y; }); break;
      case BinaryOp::kMul: run([](auto x, auto y) { return x * y; }); break;
      case BinaryOp::kDiv: run([](auto x, auto y) { return x / y; }); break;
    }
  });
}

namespace {

// out = f(in...) over contiguous rows of n elements: float16 is widened and narrowed a block at a
// time so the formula always runs over compute-type arrays (and vectorises where it can).
template <typename T, typename F>
void map_rows(int64_t n, F&& f) {
  parallel_range(n, kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t start = lo; start < hi; start += kBlock) f(start, std::min(kBlock, hi - start));
  });
}

// A formula over a block of compute-type values, built for the baseline and for AVX-512
// (wide_loops_cpu.h; tests/math_test.cc holds the two to the same bits). At [2048, 1536] float32 the
// AVX-512 loops take GELU's (tanh) forward from 3.9 to 2.5 ms on one Zen 4 core; formulas that call
// libm per value (float64, exact GELU) gain little.
template <typename F, typename C>
struct ForwardBlock {
  [[gnu::always_inline]] static void run(const C* x, C* y, int64_t n) {
    for (int64_t j = 0; j < n; ++j) y[j] = F::template forward<C>(x[j]);
  }
};
template <typename F, typename C>
struct BackwardBlock {
  [[gnu::always_inline]] static void run(const C* x, const C* y, const C* dy, C* dx, int64_t n) {
    for (int64_t j = 0; j < n; ++j) dx[j] = F::template backward<C>(x[j], y[j], dy[j]);
  }
};

}  // namespace

void unary(UnaryOp op, const Tensor& x, Tensor& y, CpuIsa isa) {
  const bool wide = wide_loops(isa);
  visit_unary(op, [&](auto formula) {
    using F = decltype(formula);
    visit_floating_dtype(y.dtype(), [&](auto t) {
      using T = decltype(t);
      using C = ComputeType<T>;
      const T* in = x.data<T>();
      T* out = y.data<T>();
      map_rows<T>(y.numel(), [&](int64_t start, int64_t n) {
        C wx[kBlock], wy[kBlock];
        const C* vx = row_values(in + start, 1, n, wx);
        C* vy = std::is_same_v<T, C> ? reinterpret_cast<C*>(out + start) : wy;
        run_loop<ForwardBlock<F, C>>(wide, vx, vy, n);
        store_row(vy, n, out + start);
      });
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, CpuIsa isa) {
  const bool wide = wide_loops(isa);
  visit_unary(op, [&](auto formula) {
    using F = decltype(formula);
    visit_floating_dtype(dx.dtype(), [&](auto t) {
      using T = decltype(t);
      using C = ComputeType<T>;
      const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>();
      T* out = dx.data<T>();
      map_rows<T>(dx.numel(), [&](int64_t start, int64_t n) {
        C wx[kBlock], wy[kBlock], wdy[kBlock], wdx[kBlock];
        const C* vx = row_values(px + start, 1, n, wx);
        const C* vy = row_values(py + start, 1, n, wy);
        const C* vdy = row_values(pdy + start, 1, n, wdy);
        C* vdx = std::is_same_v<T, C> ? reinterpret_cast<C*>(out + start) : wdx;
        run_loop<BackwardBlock<F, C>>(wide, vx, vy, vdy, vdx, n);
        store_row(vdx, n, out + start);
      });
    });
  });
}

void dropout(const Tensor& x, double p, uint64_t seed, Tensor& y) {
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const float threshold = static_cast<float>(p);
    const C scale = static_cast<C>(1.0 / (1.0 - p));
    map_rows<T>(y.numel(), [&](int64_t start, int64_t n) {
      C wx[kBlock], wy[kBlock];
      const C* vx = row_values(in + start, 1, n, wx);
      C* vy = std::is_same_v<T, C> ? reinterpret_cast<C*>(out + start) : wy;
      for (int64_t j = 0; j < n; ++j) {
        const bool keep = dropout_uniform(seed, static_cast<uint64_t>(start + j)) >= threshold;
        vy[j] = keep ? vx[j] * scale : C(0);
      }
      store_row(vy, n, out + start);
    });
  });
}

void affine(const Tensor& src, double alpha, double beta, Tensor& out) {
  if (out.numel() == 0) return;
  const StridedPlan<2> plan =
      make_plan<2>(out.shape(), {contiguous_strides(out.shape()), broadcast_strides(src.shape(), out.shape())});
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* s = src.data<T>();
    T* o = out.data<T>();
    const C scale = static_cast<C>(alpha), shift = static_cast<C>(beta);
    const int64_t ss = inner_stride(plan, 1);
    run_rows(plan, [&](const int64_t* offsets, int64_t inner) {
      C ws[kBlock], wo[kBlock];
      for (int64_t start = 0; start < inner; start += kBlock) {
        const int64_t n = std::min(kBlock, inner - start);
        const C* vs = row_values(s + offsets[1] + start * ss, ss, n, ws);
        T* row = o + offsets[0] + start;
        C* vo = std::is_same_v<T, C> ? reinterpret_cast<C*>(row) : wo;
        for (int64_t j = 0; j < n; ++j) vo[j] = scale * vs[j] + shift;
        store_row(vo, n, row);
      }
    });
  });
}

namespace {

// 16-bit relu on the raw bits with integer masks (no conversion, no branch), which GCC vectorises
// 16 lanes at a time; written over Half values, or with a conditional load of dy, the loops stayed
// scalar with data-dependent branches (relu_backward was 4% of an AMP mlp step). kInf is the
// magnitude bits of infinity (0x7c00 for float16, 0x7f80 for bfloat16):
//   keep x:  x > 0 (sign clear, bits > 0 as int16) or NaN (magnitude above kInf), so relu keeps
//   NaN and maps -0, negatives and -inf to +0.
template <uint16_t kInf>
inline uint16_t keep_mask(uint16_t b) {
  const bool keep = static_cast<int16_t>(b) > 0 || (b & 0x7fffu) > kInf;
  return static_cast<uint16_t>(0u - static_cast<unsigned>(keep));  // 0xffff or 0
}

template <uint16_t kInf>
void relu_bits(const uint16_t* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] & keep_mask<kInf>(in[i]);
}

// dx = x <= 0 ? 0 : dy, so a NaN input passes its gradient (as PyTorch's threshold_backward).
template <uint16_t kInf>
void relu_backward_bits(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] & keep_mask<kInf>(x[i]);
}

// The bits of a 16-bit float tensor, and its infinity's magnitude bits.
template <typename T>
const uint16_t* bits_of(const Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data<T>());
}
template <typename T>
uint16_t* bits_of(Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data<T>());
}
template <typename T> constexpr uint16_t kInfBits = std::is_same_v<T, Half> ? 0x7c00u : 0x7f80u;

}  // namespace

void relu(const Tensor& x, Tensor& y) {
  const int64_t n = y.numel();  // hoisted: an out-of-line call per element kept the loops scalar
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) {
      relu_bits<kInfBits<T>>(bits_of<T>(x), bits_of<T>(y), n);
    } else {
      const T* in = x.data<T>();
      T* out = y.data<T>();
      for (int64_t i = 0; i < n; ++i) out[i] = !(in[i] <= 0) ? in[i] : T{0};  // NaN stays NaN
    }
  });
}

void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const int64_t n = dx.numel();
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (kIsLowPrecision<T>) {
      relu_backward_bits<kInfBits<T>>(bits_of<T>(x), bits_of<T>(dy), bits_of<T>(dx), n);
    } else {
      const T* in = x.data<T>();
      const T* g = dy.data<T>();
      T* out = dx.data<T>();
      for (int64_t i = 0; i < n; ++i) {
        const T gi = g[i];  // read unconditionally: a conditional read became a masked load
        out[i] = in[i] <= 0 ? T{0} : gi;  // NaN passes dy
      }
    }
  });
}

}  // namespace ampgrad::kernels::cpu
