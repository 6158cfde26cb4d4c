// batch_norm over dimension 1 of [N, C, ...]. Autocast runs it in float32 (its statistics would
// lose the small variances in FP16). With xhat = (x - mean) rstd and g = dy w, per channel:
//   training: dx = rstd (g - mean(g) - xhat mean(g xhat));  eval: dx = rstd g
//   dw = sum(dy xhat), db = sum(dy)
// The running statistics are not inputs of the graph: they are updated in place by the forward.
#include "framework/copy.h"
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/norm/norm_kernels.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

struct BatchNorm {
  static constexpr OpInfo kInfo{"batch_norm", CastPolicy::kFloat32};
  Tensor running_mean, running_var;
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
  Tensor mean, rstd;  // per channel, from the forward (not graph tensors)

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    check_same_device(kInfo.name, {{"x", &x}});
    if (w.defined()) check_same_device(kInfo.name, {{"x", &x}, {"weight", &w}});
    if (b.defined()) check_same_device(kInfo.name, {{"x", &x}, {"bias", &b}});
    if (running_mean.defined()) check_same_device(kInfo.name, {{"x", &x}, {"running_mean", &running_mean}});
    if (running_var.defined()) check_same_device(kInfo.name, {{"x", &x}, {"running_var", &running_var}});
    check_same_dtype(kInfo.name, {{"x", &x}, {"weight", &w}, {"bias", &b}});
    const auto all = [&] {
      return describe({{"x", &x}, {"running_mean", &running_mean}, {"running_var", &running_var}, {"weight", &w},
                       {"bias", &b}});
    };
    AG_CHECK(x.dim() >= 2 && x.size(1) >= 1, kInfo.name, ": x must be [N, C, ...] with C >= 1, got ", all());
    const Shape channels{x.size(1)};
    for (const auto& [name, t] : {std::pair{"weight", &w}, {"bias", &b}, {"running_mean", &running_mean},
                                  {"running_var", &running_var}}) {
      AG_CHECK(!t->defined() || t->shape() == channels, kInfo.name, ": ", name, " must be [", x.size(1), "] (", all(),
               ")");
      AG_CHECK(!t->defined() || is_floating(t->dtype()), kInfo.name, ": ", name, " must be floating (", all(), ")");
    }
    AG_CHECK(!running_mean.defined() || !running_mean.requires_grad(), kInfo.name,
             ": running_mean is updated in place and must not require grad (", all(), ")");
    AG_CHECK(!running_var.defined() || !running_var.requires_grad(), kInfo.name,
             ": running_var is updated in place and must not require grad (", all(), ")");
    AG_CHECK(running_mean.defined() == running_var.defined(), kInfo.name,
             ": running_mean and running_var are given together or not at all (", all(), ")");
    AG_CHECK(training || running_mean.defined(), kInfo.name,
             ": evaluation (training = false) normalises by the running statistics, which are undefined (", all(),
             "); hint: pass them, or training = true");
    AG_CHECK(!training || x.numel() / x.size(1) > 1, kInfo.name,
             ": expected more than 1 value per channel when training, got ", all());
    AG_CHECK(eps >= 0, kInfo.name, ": eps must be >= 0, got ", eps);
    AG_CHECK(momentum >= 0 && momentum <= 1, kInfo.name, ": momentum must be in [0, 1], got ", momentum);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    saved.save(x);
    saved.save(w);
    const int64_t c = x.size(1);
    const DType stat = x.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    rstd = Tensor::empty({c}, stat, x.device());
    Tensor var;
    if (training) {
      mean = Tensor::empty({c}, stat, x.device());
      var = Tensor::empty({c}, stat, x.device());
      kernels::batch_norm_stats(x, mean, var);
      const double count = static_cast<double>(x.numel() / c);
      kernels::batch_norm_finalize(mean, var, eps, {.momentum = momentum, .unbias = count / (count - 1)},
                                   running_mean, running_var, rstd);
      if (running_mean.defined()) {
        running_mean.bump_version();
        running_var.bump_version();
      }
    } else {
      // Copies (a running statistic may change in place before the backward reads mean).
      mean = Tensor::empty({c}, stat, x.device());
      var = Tensor::empty({c}, stat, x.device());
      copy_(mean, running_mean);
      copy_(var, running_var);
      Tensor none_mean, none_var;
      kernels::batch_norm_finalize(mean, var, eps, {}, none_mean, none_var, rstd);
    }
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::batch_norm_apply(x, mean, rstd, w, b, y);
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    Tensor dx, dw, db;
    if (saved.needs_grad(0)) dx = Tensor::empty(x.shape(), dy.dtype(), dy.device());
    if (saved.needs_grad(1)) dw = Tensor::empty({x.size(1)}, dy.dtype(), dy.device());
    if (saved.needs_grad(2)) db = Tensor::empty({x.size(1)}, dy.dtype(), dy.device());
    kernels::batch_norm_backward(x, dy, mean, rstd, w,
                                 training ? kernels::BatchStatistics::kBatch : kernels::BatchStatistics::kRunning, dx,
                                 dw, db);
    return {dx, dw, db};
  }
};

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return dispatch(BatchNorm{.running_mean = running_mean, .running_var = running_var, .training = training,
                            .momentum = momentum, .eps = eps, .mean = {}, .rstd = {}},
                  x, weight, bias);
}

}  // namespace ampgrad::ops
