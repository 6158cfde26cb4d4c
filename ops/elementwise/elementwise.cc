// Element-wise ops: add, sub, mul, div (NumPy broadcasting at any rank, dtype promotion), the
// scalar forms (x * s, x + s), relu, the unary ops of unary_math.h (gelu, tanh, sigmoid, exp, log)
// and dropout. The gradient of a broadcast operand is summed back to its shape.
#include "framework/dispatch.h"
#include "framework/random.h"
#include "ops/checks.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/reduce/reduce_kernels.h"
#include "ops/strided.h"
#include "ops/elementwise/unary_math.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

// The gradient of a broadcast operand: dy summed over the dimensions it was broadcast along,
// scaled by alpha.
Tensor reduce_grad(const Tensor& dy, const Shape& shape, double alpha) {
  if (dy.shape() == shape && alpha == 1.0) return dy;
  Tensor out = Tensor::empty(shape, dy.dtype(), dy.device());
  if (dy.shape() == shape) {
    kernels::affine(dy, alpha, 0.0, out);
  } else {
    kernels::sum_to(dy, alpha, out);
  }
  return out;
}

constexpr const char* binary_name(kernels::BinaryOp op) {
  switch (op) {
    case kernels::BinaryOp::kAdd: return "add";
    case kernels::BinaryOp::kSub: return "sub";
    case kernels::BinaryOp::kMul: return "mul";
    case kernels::BinaryOp::kDiv: return "div";
  }
  return "binary";
}

// a (op) b at the output's shape; b is broadcast.
Tensor apply(kernels::BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  kernels::binary(op, a, b, out);
  return out;
}

template <kernels::BinaryOp op>
struct Binary {
  static constexpr OpInfo kInfo{binary_name(op), CastPolicy::kPromote};
  static constexpr const char* name = kInfo.name;
  Shape a_shape, b_shape;

  void check(const Tensor& a, const Tensor& b) const {
    check_same_device(name, {{"a", &a}, {"b", &b}});
    int64_t dim = 0;
    AG_CHECK(kernels::try_broadcast_shapes(a.shape(), b.shape(), &dim).has_value(), name, ": shapes cannot be ",
             "broadcast (", describe({{"a", &a}, {"b", &b}}), "): they differ at dimension ", dim,
             " (counted from the end) and neither is 1; hint: broadcasting aligns the last dimensions and ",
             "stretches sizes of 1 (PyTorch's rules)");
  }

  Tensor forward(SavedTensors& saved, const Tensor& a, const Tensor& b) {
    a_shape = a.shape();
    b_shape = b.shape();
    if constexpr (op == kernels::BinaryOp::kMul || op == kernels::BinaryOp::kDiv) {
      saved.save(a);
      saved.save(b);
    }
    Tensor out = Tensor::empty(kernels::broadcast_shapes(name, a.shape(), b.shape()), a.dtype(), a.device());
    kernels::binary(op, a, b, out);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    Tensor da, db;
    switch (op) {
      case kernels::BinaryOp::kAdd:
      case kernels::BinaryOp::kSub:
        if (saved.needs_grad(0)) da = reduce_grad(dy, a_shape, 1.0);
        if (saved.needs_grad(1)) db = reduce_grad(dy, b_shape, op == kernels::BinaryOp::kSub ? -1.0 : 1.0);
        break;
      case kernels::BinaryOp::kMul:
        // d(a*b)/da = b: multiply at the output's shape, then sum back to the operand's shape.
        if (saved.needs_grad(0)) da = reduce_grad(apply(kernels::BinaryOp::kMul, dy, saved[1]), a_shape, 1.0);
        if (saved.needs_grad(1)) db = reduce_grad(apply(kernels::BinaryOp::kMul, dy, saved[0]), b_shape, 1.0);
        break;
      case kernels::BinaryOp::kDiv: {
        // d(a/b)/da = 1/b, d(a/b)/db = -a/b^2 = -(dy a / b) / b.
        const Tensor dy_over_b = apply(kernels::BinaryOp::kDiv, dy, saved[1]);
        if (saved.needs_grad(0)) da = reduce_grad(dy_over_b, a_shape, 1.0);
        if (saved.needs_grad(1)) {
          const Tensor t = apply(kernels::BinaryOp::kMul, dy_over_b, saved[0]);
          db = reduce_grad(apply(kernels::BinaryOp::kDiv, t, saved[1]), b_shape, -1.0);
        }
        break;
      }
    }
    return {da, db};
  }
};

// y = f(x); dx = f'(x) dy from x and y (the output is saved detached: no reference cycle).
// Formula is one of unary_math.h's: it names the op and gives its autocast policy.
template <typename Formula>
struct Unary {
  static constexpr OpInfo kInfo = Formula::kInfo;
  static constexpr kernels::UnaryOp op = kernels::unary_op<Formula>();

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  Tensor forward(SavedTensors& saved, const Tensor& x) const {
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::unary(op, x, y);
    saved.save(x);
    saved.save(y.detach());
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    kernels::unary_backward(op, saved[0], saved[1], dy, dx);
    return {dx};
  }
};

// y = x * mask / (1 - p); the mask is regenerated from the seed for the backward.
struct Dropout {
  static constexpr OpInfo kInfo{"dropout", CastPolicy::kNone};
  double p;
  uint64_t seed;

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  Tensor forward(SavedTensors&, const Tensor& x) const {
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::dropout(x, p, seed, y);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    kernels::dropout(dy, p, seed, dx);
    return {dx};
  }
};

// y = alpha * x + beta with compile-time-unknown scalars kept in double (the x * 2.0f forms).
struct Affine {
  static constexpr OpInfo kInfo{"affine", CastPolicy::kNone};
  double alpha;
  double beta;

  void check(const Tensor& x) const {
    AG_CHECK(x.defined(), kInfo.name, " (ops::scale, or a tensor-scalar operator such as x * 2.0f): input is undefined");
  }

  Tensor forward(SavedTensors&, const Tensor& x) const {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::affine(x, alpha, beta, out);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    return {reduce_grad(dy, dy.shape(), alpha)};
  }
};

struct Relu {
  static constexpr OpInfo kInfo{"relu", CastPolicy::kNone};

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  Tensor forward(SavedTensors& saved, const Tensor& x) const {
    saved.save(x);
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::relu(x, y);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    kernels::relu_backward(saved[0], dy, dx);
    return {dx};
  }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return dispatch(Binary<kernels::BinaryOp::kAdd>{}, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return dispatch(Binary<kernels::BinaryOp::kSub>{}, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return dispatch(Binary<kernels::BinaryOp::kMul>{}, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return dispatch(Binary<kernels::BinaryOp::kDiv>{}, a, b); }

Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  if (approximate == GeluApproximation::kTanh) return dispatch(Unary<kernels::GeluTanh>{}, x);
  return dispatch(Unary<kernels::GeluExact>{}, x);
}
Tensor tanh(const Tensor& x) { return dispatch(Unary<kernels::Tanh>{}, x); }
Tensor sigmoid(const Tensor& x) { return dispatch(Unary<kernels::Sigmoid>{}, x); }
Tensor exp(const Tensor& x) { return dispatch(Unary<kernels::Exp>{}, x); }
Tensor log(const Tensor& x) { return dispatch(Unary<kernels::Log>{}, x); }

Tensor dropout(const Tensor& x, double p, bool training) {
  AG_CHECK(x.defined(), "dropout: input is undefined");
  AG_CHECK(p >= 0.0 && p <= 1.0, "dropout: p must be in [0, 1], got ", p, " (for ", x.to_string(), ")");
  if (!training || p == 0.0) return x;
  if (p == 1.0) return scale(x, 0.0);  // everything dropped, as PyTorch (the gradient is 0 too)
  return dispatch(Dropout{.p = p, .seed = random::next_u64()}, x);
}
Tensor relu(const Tensor& x) { return dispatch(Relu{}, x); }
Tensor scale(const Tensor& x, double alpha) { return dispatch(Affine{.alpha = alpha, .beta = 0.0}, x); }
Tensor cast(const Tensor& x, DType dtype) { return x.to(dtype); }

}  // namespace ampgrad::ops

namespace ampgrad {

Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator+(const Tensor& a, float s) { return dispatch(ops::Affine{.alpha = 1.0, .beta = s}, a); }
Tensor operator-(const Tensor& a, float s) { return dispatch(ops::Affine{.alpha = 1.0, .beta = -double(s)}, a); }
Tensor operator*(const Tensor& a, float s) { return ops::scale(a, s); }
Tensor operator*(float s, const Tensor& a) { return a * s; }
Tensor operator-(const Tensor& a) { return ops::scale(a, -1.0); }

}  // namespace ampgrad
