// The training-step workloads shared by train_bench and step_timer (and mirrored in
// pytorch_workloads.py): zero_grad, forward, loss, backward, step.
//   seed: Linear(10, 1), MSE, Adam, batch 64;   mlp: 784-1024-1024-10 with ReLU, batch 256;
//   fashion: examples/fashion_mnist's 784-512-256-10 classifier, cross_entropy, Adam, batch 128.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "ampgrad.h"
#include "examples/fashion.h"

namespace ampgrad::bench {

enum class Precision { kFp32, kAmp };
enum class Optim { kSgd, kAdam };

struct Workload {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  amp::GradScaler scaler;
  Tensor x, y;
  Tensor labels;  // int64 [batch]: the loss is cross_entropy(model(x), labels) instead of MSE

  /// x is [batch, in], y is [batch, out], both N(0, 1); SGD has momentum 0.9; lr 1e-3.
  /// param_dtype kFloat16 gives FP16 parameters with FP32 masters in the optimizer.
  Workload(std::unique_ptr<nn::Sequential> m, Precision precision, int64_t batch, int64_t in, int64_t out,
           Optim optimizer, DType param_dtype = DType::kFloat32)
      : model(std::move(m)), scaler({.enabled = precision == Precision::kAmp}) {
    model->to(param_dtype);
    if (optimizer == Optim::kAdam) {
      opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-3});
    } else {
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
    }
    x = randn({batch, in});
    y = randn({batch, out});
  }

  void step() {
    opt->zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard autocast(Device::kCPU, DType::kFloat16, scaler.is_enabled());
      loss = labels.defined() ? ops::cross_entropy((*model)(x), labels) : ops::mse_loss((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
  }
};

inline Workload seed_workload(Precision precision) {
  manual_seed(0);
  return Workload(std::make_unique<nn::Sequential>(nn::Linear(10, 1)), precision, 64, 10, 1, Optim::kAdam);
}

inline Workload mlp_workload(Precision precision, Optim optimizer, DType param_dtype = DType::kFloat32) {
  manual_seed(0);
  return Workload(std::make_unique<nn::Sequential>(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024),
                                                   nn::ReLU(), nn::Linear(1024, 10)),
                  precision, 256, 784, 10, optimizer, param_dtype);
}

/// The example's training step on random normalised-image-like inputs and labels (the data's
/// values do not change the time). Adam lr 1e-3, as the example (whose cosine schedule only sets lr).
inline Workload fashion_workload(Precision precision) {
  manual_seed(0);
  constexpr int64_t kBatch = 128;
  Workload w(std::make_unique<nn::Sequential>(fashion::make_mlp()), precision, kBatch, 784, 10, Optim::kAdam);
  std::vector<int64_t> labels(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) labels[i] = (i * 7) % 10;
  w.labels = Tensor::from_vector(labels, {kBatch});
  return w;
}

}  // namespace ampgrad::bench
