// The training-step workloads shared by train_bench and step_timer (and mirrored in
// pytorch_workloads.py): zero_grad, forward, loss, backward, step.
//   seed: Linear(10, 1), MSE, Adam, batch 64;   mlp: 784-1024-1024-10 with ReLU, batch 256.
#pragma once

#include <memory>
#include <utility>

#include "ampgrad.h"

namespace ampgrad::bench {

enum class Precision { kFp32, kAmp };
enum class Optim { kSgd, kAdam };

struct Workload {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  amp::GradScaler scaler;
  Tensor x, y;

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
      loss = ops::mse_loss((*model)(x), y);
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

}  // namespace ampgrad::bench
