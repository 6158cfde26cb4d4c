// The element-wise unary ops, each written once for both backends as one formula: its op's name
// and autocast policy (PyTorch's lists: exp and log run in float32, the activations in their
// input's dtype, computed in float), forward(x), and the gradient from the input x, the output y
// and the upstream dy. C is the compute type (float for 16-bit storage and float32, double for
// float64). A new unary op is a formula here, its entry in UnaryFormulas, its declaration in
// ops.h and a row of the op table.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "framework/autocast.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/math.h"

namespace ampgrad::kernels {

struct GeluExact {  // x Phi(x) = x/2 (1 + erf(x / sqrt 2))
  static constexpr OpInfo kInfo{"gelu", CastPolicy::kNone};
  template <typename C> AG_HOST_DEVICE static C forward(C x) {
    return C(0.5) * x * (C(1) + math::erf(x * C(0.70710678118654752440)));
  }
  template <typename C> AG_HOST_DEVICE static C backward(C x, C, C dy) {
    const C cdf = C(0.5) * (C(1) + math::erf(x * C(0.70710678118654752440)));
    const C pdf = math::exp(C(-0.5) * x * x) * C(0.39894228040143267794);  // 1 / sqrt(2 pi)
    return dy * (cdf + x * pdf);
  }
};

struct GeluTanh {  // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  static constexpr OpInfo kInfo{"gelu(tanh)", CastPolicy::kNone};
  template <typename C> AG_HOST_DEVICE static C inner(C x) {
    return C(0.79788456080286535588) * (x + C(0.044715) * x * x * x);
  }
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return C(0.5) * x * (C(1) + math::tanh(inner(x))); }
  template <typename C> AG_HOST_DEVICE static C backward(C x, C, C dy) {
    const C t = math::tanh(inner(x));
    const C d_inner = C(0.79788456080286535588) * (C(1) + C(3) * C(0.044715) * x * x);
    return dy * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * d_inner);
  }
};

struct Tanh {
  static constexpr OpInfo kInfo{"tanh", CastPolicy::kNone};
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return math::tanh(x); }
  template <typename C> AG_HOST_DEVICE static C backward(C, C y, C dy) { return dy * (C(1) - y * y); }
};

struct Sigmoid {  // 1 / (1 + e^-x); the gradient y (1 - y)
  static constexpr OpInfo kInfo{"sigmoid", CastPolicy::kNone};
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return C(1) / (C(1) + math::exp(-x)); }
  template <typename C> AG_HOST_DEVICE static C backward(C, C y, C dy) { return dy * y * (C(1) - y); }
};

struct Exp {
  static constexpr OpInfo kInfo{"exp", CastPolicy::kFloat32};
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return math::exp(x); }
  template <typename C> AG_HOST_DEVICE static C backward(C, C y, C dy) { return dy * y; }
};

struct Log {
  static constexpr OpInfo kInfo{"log", CastPolicy::kFloat32};
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return math::log(x); }
  template <typename C> AG_HOST_DEVICE static C backward(C x, C, C dy) { return dy / x; }
};

/// Every formula; an op's UnaryOp is its index here (kernels take the index, since a template
/// cannot cross into the backends' files).
using UnaryFormulas = std::tuple<GeluExact, GeluTanh, Tanh, Sigmoid, Exp, Log>;

/// The UnaryOp of formula F.
template <typename F, size_t I = 0>
constexpr UnaryOp unary_op() {
  static_assert(I < std::tuple_size_v<UnaryFormulas>, "the formula is not listed in UnaryFormulas");
  if constexpr (std::is_same_v<F, std::tuple_element_t<I, UnaryFormulas>>) {
    return static_cast<UnaryOp>(I);
  } else {
    return unary_op<F, I + 1>();
  }
}

/// Calls fn(Formula{}) for the formula of `op` (the last one for an index past the list, which
/// unary_op never gives).
template <size_t I = 0, typename Fn>
decltype(auto) visit_unary(UnaryOp op, Fn&& fn) {
  using F = std::tuple_element_t<I, UnaryFormulas>;
  if constexpr (I + 1 == std::tuple_size_v<UnaryFormulas>) {
    return fn(F{});
  } else {
    if (static_cast<size_t>(op) == I) return fn(F{});
    return visit_unary<I + 1>(op, std::forward<Fn>(fn));
  }
}

}  // namespace ampgrad::kernels
