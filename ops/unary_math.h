// The formulas of the element-wise unary ops, written once for both backends: forward(x) and the
// gradient from the input x, the output y and the upstream dy. C is the compute type (float for
// 16-bit storage and float32, double for float64). visit_unary maps an op to its formula.
#pragma once

#include "ops/elementwise_kernels.h"
#include "ops/math.h"

namespace ampgrad::kernels {

struct GeluExact {  // x Phi(x) = x/2 (1 + erf(x / sqrt 2))
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
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return math::tanh(x); }
  template <typename C> AG_HOST_DEVICE static C backward(C, C y, C dy) { return dy * (C(1) - y * y); }
};

struct Sigmoid {  // 1 / (1 + e^-x); the gradient y (1 - y)
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return C(1) / (C(1) + math::exp(-x)); }
  template <typename C> AG_HOST_DEVICE static C backward(C, C y, C dy) { return dy * y * (C(1) - y); }
};

struct Exp {
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return math::exp(x); }
  template <typename C> AG_HOST_DEVICE static C backward(C, C y, C dy) { return dy * y; }
};

struct Log {
  template <typename C> AG_HOST_DEVICE static C forward(C x) { return math::log(x); }
  template <typename C> AG_HOST_DEVICE static C backward(C x, C, C dy) { return dy / x; }
};

/// Calls fn(Formula{}) for the formula of `op`.
template <typename Fn>
AG_HOST_DEVICE decltype(auto) visit_unary(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::kGelu: return fn(GeluExact{});
    case UnaryOp::kGeluTanh: return fn(GeluTanh{});
    case UnaryOp::kTanh: return fn(Tanh{});
    case UnaryOp::kSigmoid: return fn(Sigmoid{});
    case UnaryOp::kExp: return fn(Exp{});
    case UnaryOp::kLog: return fn(Log{});
  }
  return fn(Exp{});  // unreachable: every enumerator is handled above
}

}  // namespace ampgrad::kernels
