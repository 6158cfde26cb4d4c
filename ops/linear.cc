// linear and matmul: GEMMs with FP32 accumulation. Autocast runs them in lower precision.
//   forward:  y = x w^T + b            matmul: c = a b
//   backward: dx = dy w, dw = dy^T x, db = sum_rows(dy);   da = dc b^T, db = a^T dc
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/linear_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

using kernels::Transpose;

Tensor gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& bias = Tensor()) {
  const int64_t m = ta == Transpose::kYes ? a.size(1) : a.size(0);
  const int64_t n = tb == Transpose::kYes ? b.size(0) : b.size(1);
  Tensor out = Tensor::empty({m, n}, a.dtype(), a.device());
  kernels::gemm(a, ta, b, tb, bias, out);
  return out;
}

struct Linear {
  static constexpr OpInfo kInfo{"linear", CastPolicy::kLowerPrecision};

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    check_same_device(kInfo.name, {{"x", &x}, {"w", &w}});
    if (b.defined()) check_same_device(kInfo.name, {{"x", &x}, {"b", &b}});
    check_same_dtype(kInfo.name, {{"x", &x}, {"w", &w}, {"b", &b}});
    // Built only when a check fails: formatting it on every call cost ~40% of a small training step.
    const auto all = [&] { return describe({{"x", &x}, {"w", &w}, {"b", &b}}); };
    AG_CHECK(x.dim() == 2 && w.dim() == 2, kInfo.name, ": x must be [N, in] and w [out, in], got ", all());
    AG_CHECK(x.size(1) == w.size(1), kInfo.name, ": x has ", x.size(1), " features but w expects ", w.size(1),
             " (", all(), "); hint: w is [out_features, in_features], as in PyTorch");
    AG_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), kInfo.name, ": b must be [", w.size(0),
             "] (", all(), ")");
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    saved.save(x);
    saved.save(w);
    has_bias = b.defined();
    return gemm(x, Transpose::kNo, w, Transpose::kYes, b);
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    Tensor dx, dw, db;
    if (saved.needs_grad(0)) dx = gemm(dy, Transpose::kNo, w, Transpose::kNo);
    if (saved.needs_grad(1)) dw = gemm(dy, Transpose::kYes, x, Transpose::kNo);
    if (has_bias && saved.needs_grad(2)) {
      db = Tensor::empty({w.size(0)}, dy.dtype(), dy.device());
      kernels::sum_to(dy, 1.0, db);
    }
    return {dx, dw, db};
  }

  bool has_bias = false;
};

struct Matmul {
  static constexpr OpInfo kInfo{"matmul", CastPolicy::kLowerPrecision};

  void check(const Tensor& a, const Tensor& b) const {
    check_same_device(kInfo.name, {{"a", &a}, {"b", &b}});
    check_same_dtype(kInfo.name, {{"a", &a}, {"b", &b}});
    AG_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), kInfo.name,
             ": needs a [M, K] and b [K, N], got ", describe({{"a", &a}, {"b", &b}}));
  }

  Tensor forward(SavedTensors& saved, const Tensor& a, const Tensor& b) {
    saved.save(a);
    saved.save(b);
    return gemm(a, Transpose::kNo, b, Transpose::kNo);
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dc) const {
    Tensor da, db;
    if (saved.needs_grad(0)) da = gemm(dc, Transpose::kNo, saved[1], Transpose::kYes);
    if (saved.needs_grad(1)) db = gemm(saved[0], Transpose::kYes, dc, Transpose::kNo);
    return {da, db};
  }
};

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return dispatch(Linear{}, x, w, b); }
Tensor matmul(const Tensor& a, const Tensor& b) { return dispatch(Matmul{}, a, b); }

}  // namespace ampgrad::ops
