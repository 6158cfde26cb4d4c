// Element-wise ops: add, sub, mul (NumPy broadcasting at any rank, dtype promotion), the scalar
// forms (x * s, x + s), and relu. The gradient of a broadcast operand is summed back to its shape.
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/elementwise_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/strided.h"
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
  return op == kernels::BinaryOp::kAdd ? "add" : op == kernels::BinaryOp::kSub ? "sub" : "mul";
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
    if constexpr (op == kernels::BinaryOp::kMul) {
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
        if (saved.needs_grad(0)) da = reduce_grad(times(dy, saved[1]), a_shape, 1.0);
        if (saved.needs_grad(1)) db = reduce_grad(times(dy, saved[0]), b_shape, 1.0);
        break;
    }
    return {da, db};
  }

  // dy * other, at dy's (the output's) shape; other is broadcast.
  static Tensor times(const Tensor& dy, const Tensor& other) {
    Tensor out = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    kernels::binary(kernels::BinaryOp::kMul, dy, other, out);
    return out;
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
