// layer_norm over the last dimension. Autocast runs it in float32.
//   y = (x - mean) rstd w + b;  dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w;
//   dw = sum_rows(dy xhat), db = sum_rows(dy)
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/norm/norm_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::ops {

namespace {

struct LayerNorm {
  static constexpr OpInfo kInfo{"layer_norm", CastPolicy::kFloat32};
  double eps;
  Tensor mean, rstd;  // per row, from the forward (not graph tensors)

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    check_same_device(kInfo.name, {{"x", &x}});
    if (w.defined()) check_same_device(kInfo.name, {{"x", &x}, {"weight", &w}});
    if (b.defined()) check_same_device(kInfo.name, {{"x", &x}, {"bias", &b}});
    check_same_dtype(kInfo.name, {{"x", &x}, {"weight", &w}, {"bias", &b}});
    const auto all = [&] { return describe({{"x", &x}, {"weight", &w}, {"bias", &b}}); };
    AG_CHECK(x.dim() >= 1, kInfo.name, ": x must have at least one dimension, got ", all());
    AG_CHECK(!w.defined() || w.shape() == Shape{x.size(-1)}, kInfo.name, ": weight must be [", x.size(-1), "] (",
             all(), ")");
    AG_CHECK(!b.defined() || b.shape() == Shape{x.size(-1)}, kInfo.name, ": bias must be [", x.size(-1), "] (", all(),
             ")");
    AG_CHECK(eps >= 0, kInfo.name, ": eps must be >= 0, got ", eps);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    saved.save(x);
    saved.save(w);
    const int64_t rows = x.size(-1) == 0 ? 0 : x.numel() / x.size(-1);
    const DType stat = x.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    mean = Tensor::empty({rows}, stat, x.device());
    rstd = Tensor::empty({rows}, stat, x.device());
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::layer_norm(x, w, b, eps, y, mean, rstd);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    Tensor dx, dw, db, dy_xhat;
    if (saved.needs_grad(0)) dx = Tensor::empty(x.shape(), dy.dtype(), dy.device());
    if (saved.needs_grad(1)) dy_xhat = Tensor::empty(x.shape(), dy.dtype(), dy.device());
    kernels::layer_norm_backward(x, w, mean, rstd, dy, dx, dy_xhat);
    const Shape param_shape{x.size(-1)};
    if (saved.needs_grad(1)) {
      dw = Tensor::empty(param_shape, dy.dtype(), dy.device());
      kernels::sum_to(dy_xhat, 1.0, dw);
    }
    if (saved.needs_grad(2)) {
      db = Tensor::empty(param_shape, dy.dtype(), dy.device());
      kernels::sum_to(dy, 1.0, db);
    }
    return {dx, dw, db};
  }
};

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return dispatch(LayerNorm{.eps = eps, .mean = {}, .rstd = {}}, x, weight, bias);
}

}  // namespace ampgrad::ops
