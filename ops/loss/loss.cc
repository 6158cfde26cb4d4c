// mse_loss: mean((pred - target)^2), fused forward and backward. Autocast runs it in float32.
//   d/dpred = 2 (pred - target) / N * dloss,   d/dtarget = -d/dpred
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/loss/loss_kernels.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

struct MseLoss {
  static constexpr OpInfo kInfo{"mse_loss", CastPolicy::kFloat32};

  void check(const Tensor& pred, const Tensor& target) const {
    check_same_device(kInfo.name, {{"pred", &pred}, {"target", &target}});
    check_same_dtype(kInfo.name, {{"pred", &pred}, {"target", &target}});
    AG_CHECK(pred.shape() == target.shape(), kInfo.name, ": pred and target must have equal shapes (",
             describe({{"pred", &pred}, {"target", &target}}), "); mse_loss does not broadcast, as a silent ",
             "[N,1] vs [N] broadcast would train on the wrong loss");
  }

  Tensor forward(SavedTensors& saved, const Tensor& pred, const Tensor& target) const {
    saved.save(pred);
    saved.save(target);
    Tensor loss = Tensor::empty({}, pred.dtype(), pred.device());
    kernels::mse_forward(pred, target, loss);
    return loss;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dloss) const {
    const Tensor& pred = saved[0];
    const Tensor& target = saved[1];
    Tensor dpred = Tensor::empty(pred.shape(), pred.dtype(), pred.device());
    Tensor dtarget;
    if (saved.needs_grad(1)) dtarget = Tensor::empty(target.shape(), target.dtype(), target.device());
    kernels::mse_backward(pred, target, dloss, dpred, dtarget);
    if (!saved.needs_grad(0)) dpred = Tensor();
    return {dpred, dtarget};
  }
};

}  // namespace

Tensor mse_loss(const Tensor& pred, const Tensor& target) { return dispatch(MseLoss{}, pred, target); }

}  // namespace ampgrad::ops
