// Element-wise CPU kernels: add/sub/mul with row or scalar broadcasting, relu, broadcast.
// Storage type T, compute type float (double for float64): store(op(load(a), load(b))).
#include "ops/elementwise_kernels.h"

#include <type_traits>

namespace ampgrad::kernels::cpu {

namespace {

template <typename T, typename F>
void binary_typed(const T* a, int64_t na, const T* b, int64_t nb, T* out, int64_t n, F f) {
  // Nothing to compute. (Without this, [0, C] + [C] reached the row path with cols = 0 and divided by it.)
  if (n == 0) return;
  if (na == n && nb == n) {
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(load(a[i]), load(b[i])));
  } else if (nb == 1) {
    const auto s = load(b[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(load(a[i % na]), s));
  } else if (na == 1) {
    const auto s = load(a[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(s, load(b[i % nb])));
  } else {
    // One operand is a trailing row: walk rows so the inner loop has no modulo.
    const int64_t cols = na < nb ? na : nb;
    for (int64_t row = 0; row < n / cols; ++row) {
      const int64_t base = row * cols;
      const T* ra = na == n ? a + base : a;
      const T* rb = nb == n ? b + base : b;
      for (int64_t j = 0; j < cols; ++j) out[base + j] = store<T>(f(load(ra[j]), load(rb[j])));
    }
  }
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  visit_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    auto run = [&](auto f) { binary_typed<T>(a.data<T>(), a.numel(), b.data<T>(), b.numel(), out.data<T>(), out.numel(), f); };
    switch (op) {
      case BinaryOp::kAdd: run([](auto x, auto y) { return x + y; }); break;
      case BinaryOp::kSub: run([](auto x, auto y) { return x - y; }); break;
      case BinaryOp::kMul: run([](auto x, auto y) { return x * y; }); break;
    }
  });
}

void affine(const Tensor& src, double alpha, double beta, Tensor& out) {
  visit_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* s = src.data<T>();
    T* o = out.data<T>();
    const int64_t ns = src.numel(), n = out.numel();
    const C a = static_cast<C>(alpha), b = static_cast<C>(beta);
    if (ns == n) {
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(a * load(s[i]) + b);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(a * load(s[i % ns]) + b);
    }
  });
}

namespace {

// Half relu on the raw bits with integer masks (no conversion, no branch), which GCC vectorises;
// written over Half values the loop stayed scalar and was 10% of an AMP mlp step.
//   x <= 0: magnitude 0, or sign set and not NaN (magnitude <= 0x7c00, inf included).
//   x > 0:  sign clear, magnitude in (0, 0x7c00].   NaN is neither, so relu keeps it.
void relu_half(const uint16_t* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = in[i], magnitude = b & 0x7fffu;
    const bool nonpositive = magnitude == 0 || ((b & 0x8000u) != 0 && magnitude <= 0x7c00u);
    out[i] = nonpositive ? uint16_t{0} : b;
  }
}

void relu_backward_half(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = x[i], magnitude = b & 0x7fffu;
    const bool positive = (b & 0x8000u) == 0 && magnitude != 0 && magnitude <= 0x7c00u;
    dx[i] = positive ? dy[i] : uint16_t{0};
  }
}

}  // namespace

void relu(const Tensor& x, Tensor& y) {
  const int64_t n = y.numel();  // hoisted: an out-of-line call per element kept the loops scalar
  if (y.dtype() == DType::kFloat16) {
    return relu_half(reinterpret_cast<const uint16_t*>(x.data<Half>()), reinterpret_cast<uint16_t*>(y.data<Half>()), n);
  }
  visit_dtype(y.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, Half>) {
      const T* in = x.data<T>();
      T* out = y.data<T>();
      for (int64_t i = 0; i < n; ++i) out[i] = !(in[i] <= 0) ? in[i] : T{0};  // NaN stays NaN
    }
  });
}

void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const int64_t n = dx.numel();
  if (dx.dtype() == DType::kFloat16) {
    return relu_backward_half(reinterpret_cast<const uint16_t*>(x.data<Half>()),
                              reinterpret_cast<const uint16_t*>(dy.data<Half>()),
                              reinterpret_cast<uint16_t*>(dx.data<Half>()), n);
  }
  visit_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, Half>) {
      const T* in = x.data<T>();
      const T* g = dy.data<T>();
      T* out = dx.data<T>();
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] > 0 ? g[i] : T{0};
    }
  });
}

}  // namespace ampgrad::kernels::cpu
