// linear and matmul: GEMMs with FP32 accumulation. Autocast runs them in lower precision.
//   linear: y = x w^T + b over x's leading dimensions;  dx = dy w, dw = dy^T x, db = sum_rows(dy)
//   matmul: c = a b per batch, batch dimensions broadcast;  da = dc b^T, db = a^T dc (summed back
//           over the batch dimensions an operand was broadcast along)
#include "framework/dispatch.h"
#include "framework/float8_scaling.h"
#include "ops/checks.h"
#include "ops/linear/linear_float8.h"
#include "ops/linear/linear_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"
#include "ops/strided.h"

namespace ampgrad::ops {

namespace {

using kernels::Transpose;

using kernels::gemm;

// t [..., n] as the matrix [prod(...), n] (a view).
Tensor as_rows(const Tensor& t) {
  return reshape(t, {shape_numel(Shape(t.shape().begin(), t.shape().end() - 1)), t.size(-1)});
}

struct Linear {
  static constexpr OpInfo kInfo{"linear", CastPolicy::kLowerPrecision};
  bool has_bias = false;

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    detail::check_linear(kInfo.name, x, w, b, /*same_dtype=*/true);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    saved.save(x);
    saved.save(w);
    has_bias = b.defined();
    Shape out_shape = x.shape();
    out_shape.back() = w.size(0);
    // The leading dimensions are rows of one GEMM (a reshape is a view, so nothing is copied).
    return reshape(gemm(as_rows(x), Transpose::kNo, w, Transpose::kYes, b), out_shape);
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    const Tensor dy2 = as_rows(dy);
    Tensor dx, dw, db;
    if (saved.needs_grad(0)) dx = reshape(gemm(dy2, Transpose::kNo, w, Transpose::kNo), x.shape());
    if (saved.needs_grad(1)) dw = gemm(dy2, Transpose::kYes, as_rows(x), Transpose::kNo);
    if (has_bias && saved.needs_grad(2)) {
      db = Tensor::empty({w.size(0)}, dy.dtype(), dy.device());
      kernels::sum_to(dy2, 1.0, db);
    }
    return {dx, dw, db};
  }
};

// How matmul sees one operand: a batch of matrices [count, rows, cols].
struct MatmulOperand {
  Shape shape;        // the operand as given
  bool vector;        // 1-D: a row (a) or a column (b)
  Shape matrix;       // [rows, cols] after promoting a vector
  Shape batch;        // its leading dimensions
};

MatmulOperand describe_operand(const Tensor& t, bool is_left) {
  MatmulOperand o{t.shape(), t.dim() == 1, {}, {}};
  if (o.vector) {
    o.matrix = is_left ? Shape{1, t.size(0)} : Shape{t.size(0), 1};
  } else {
    o.matrix = {t.size(-2), t.size(-1)};
    o.batch.assign(t.shape().begin(), t.shape().end() - 2);
  }
  return o;
}

// t as [count, rows, cols] for the full `batch`: a view when its batch is the whole batch or a
// single matrix (shared by every product, stride 0), else an expanded copy.
Tensor as_batch(const Tensor& t, const MatmulOperand& o, const Shape& batch) {
  const int64_t count = shape_numel(batch);
  const int64_t own = shape_numel(o.batch);
  Shape full = batch;
  full.insert(full.end(), o.matrix.begin(), o.matrix.end());
  if (own == 1) return reshape(t, {1, o.matrix[0], o.matrix[1]});
  Shape padded(batch.size() - o.batch.size(), 1);
  padded.insert(padded.end(), o.batch.begin(), o.batch.end());
  if (padded == batch) return reshape(t, {count, o.matrix[0], o.matrix[1]});
  return reshape(expand(reshape(t, [&] {
                          Shape s = padded;
                          s.insert(s.end(), o.matrix.begin(), o.matrix.end());
                          return s;
                        }()),
                        full),
                 {count, o.matrix[0], o.matrix[1]});
}

// The gradient of one operand from its full-batch gradient [count, rows, cols]: summed over the
// batch dimensions it was broadcast along, in its own shape.
Tensor reduce_to_operand(const Tensor& full, const MatmulOperand& o, const Shape& batch) {
  Shape target(batch.size() - o.batch.size(), 1);
  target.insert(target.end(), o.batch.begin(), o.batch.end());
  target.insert(target.end(), o.matrix.begin(), o.matrix.end());
  Shape full_shape = batch;
  full_shape.insert(full_shape.end(), o.matrix.begin(), o.matrix.end());
  Tensor g = reshape(full, full_shape);
  if (full_shape != target) {
    Tensor reduced = Tensor::empty(target, g.dtype(), g.device());
    kernels::sum_to(g, 1.0, reduced);
    g = reduced;
  }
  return reshape(g, o.shape);
}

struct Matmul {
  static constexpr OpInfo kInfo{"matmul", CastPolicy::kLowerPrecision};
  MatmulOperand left, right;
  Shape batch;

  void check(const Tensor& a, const Tensor& b) const {
    check_same_device(kInfo.name, {{"a", &a}, {"b", &b}});
    check_same_dtype(kInfo.name, {{"a", &a}, {"b", &b}});
    const auto both = [&] { return describe({{"a", &a}, {"b", &b}}); };
    AG_CHECK(a.dim() >= 1 && b.dim() >= 1, kInfo.name, ": needs tensors of rank >= 1, got ", both());
    const int64_t k_a = a.size(-1), k_b = b.dim() == 1 ? b.size(0) : b.size(-2);
    AG_CHECK(k_a == k_b, kInfo.name, ": a [..., M, K] and b [..., K, N] disagree on K (", k_a, " vs ", k_b, "): ",
             both());
    const Shape a_batch(a.shape().begin(), a.shape().end() - std::min<int64_t>(a.dim(), 2));
    const Shape b_batch(b.shape().begin(), b.shape().end() - std::min<int64_t>(b.dim(), 2));
    kernels::broadcast_shapes("matmul (batch dimensions)", a_batch, b_batch);
  }

  Tensor forward(SavedTensors& saved, const Tensor& a, const Tensor& b) {
    saved.save(a);
    saved.save(b);
    left = describe_operand(a, true);
    right = describe_operand(b, false);
    batch = kernels::broadcast_shapes(kInfo.name, left.batch, right.batch);
    Tensor c = gemm(as_batch(a, left, batch), Transpose::kNo, as_batch(b, right, batch), Transpose::kNo);
    Shape out_shape = batch;
    if (!left.vector) out_shape.push_back(left.matrix[0]);
    if (!right.vector) out_shape.push_back(right.matrix[1]);
    return reshape(c, out_shape);
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dc) const {
    const int64_t count = shape_numel(batch);
    const Tensor a3 = as_batch(saved[0], left, batch), b3 = as_batch(saved[1], right, batch);
    const Tensor dc3 = reshape(dc, {count, left.matrix[0], right.matrix[1]});
    Tensor da, db;
    if (saved.needs_grad(0)) da = reduce_to_operand(gemm(dc3, Transpose::kNo, b3, Transpose::kYes), left, batch);
    if (saved.needs_grad(1)) {
      if (b3.size(0) == 1 && a3.size(0) == count && count > 1) {
        // b is shared by every product: sum_i a_i^T dc_i is one GEMM over the stacked rows.
        db = reshape(gemm(reshape(a3, {count * left.matrix[0], left.matrix[1]}), Transpose::kYes,
                          reshape(dc3, {count * left.matrix[0], right.matrix[1]}), Transpose::kNo),
                     right.shape);
      } else {
        db = reduce_to_operand(gemm(a3, Transpose::kYes, dc3, Transpose::kNo), right, batch);
      }
    }
    return {da, db};
  }
};

}  // namespace

namespace detail {

void check_linear(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, bool same_dtype) {
  check_same_device(op, {{"x", &x}, {"w", &w}});
  if (b.defined()) check_same_device(op, {{"x", &x}, {"b", &b}});
  if (same_dtype) check_same_dtype(op, {{"x", &x}, {"w", &w}, {"b", &b}});
  // Built only when a check fails: formatting it on every call cost ~40% of a small training step.
  const auto all = [&] { return describe({{"x", &x}, {"w", &w}, {"b", &b}}); };
  AG_CHECK(x.dim() >= 1 && w.dim() == 2, op, ": x must be [..., in] and w [out, in], got ", all());
  AG_CHECK(x.size(-1) == w.size(1), op, ": x has ", x.size(-1), " features but w expects ", w.size(1), " (", all(),
           "); hint: w is [out_features, in_features], as in PyTorch");
  AG_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), op, ": b must be [", w.size(0), "] (", all(),
           ")");
}

}  // namespace detail

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (x.defined() && fp8::region(x.device()).enabled) {
    if (Tensor y = detail::linear_float8(x, w, b); y.defined()) return y;
  }
  return dispatch(Linear{}, x, w, b);
}
Tensor matmul(const Tensor& a, const Tensor& b) { return dispatch(Matmul{}, a, b); }

}  // namespace ampgrad::ops
