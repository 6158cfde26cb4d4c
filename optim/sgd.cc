// SGD update on FP32 master weights.
#include "optim/sgd.h"

#include <cmath>

#include "framework/error.h"

namespace ampgrad::optim {

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : Optimizer(std::move(params)), options_(options) {
  set_lr(options.lr);
  AG_CHECK(options.momentum >= 0 && std::isfinite(options.momentum), "SGD: momentum must be >= 0, got ",
           options.momentum);
  AG_CHECK(options.weight_decay >= 0 && std::isfinite(options.weight_decay), "SGD: weight_decay must be >= 0, got ",
           options.weight_decay);
  AG_CHECK(std::isfinite(options.dampening), "SGD: dampening must be finite, got ", options.dampening);
  AG_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0), "SGD: nesterov needs momentum > 0 ",
           "and dampening == 0, got momentum ", options.momentum, ", dampening ", options.dampening);
  buffers_.resize(parameters().size());
}

void SGD::update(size_t index, Tensor& master, const Tensor& grad) {
  AG_CHECK(master.device() == Device::kCPU, "SGD: the CUDA update is not built into this optimizer yet");
  const int64_t n = master.numel();
  float* w = master.data<float>();
  const float* g = grad.data<float>();
  const float lr = static_cast<float>(lr_), wd = static_cast<float>(options_.weight_decay);
  const float momentum = static_cast<float>(options_.momentum);
  const float dampening = static_cast<float>(options_.dampening);
  if (momentum == 0.0f) {
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    return;
  }
  Tensor& buffer = buffers_[index];
  const bool first = !buffer.defined();
  if (first) buffer = Tensor::empty(master.shape(), DType::kFloat32, master.device());
  float* buf = buffer.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * w[i];
    buf[i] = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
    w[i] -= lr * (options_.nesterov ? d + momentum * buf[i] : buf[i]);
  }
}

}  // namespace ampgrad::optim
