// Trains a small MLP with Adam on a teacher-student regression whose loss carries a 1e-6
// weight, so the true gradients (1e-5..1e-8) sit at or below FP16's subnormal range.
#include "examples/underflow.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace underflow {

namespace ag = ampgrad;

std::string mode_name(Mode mode) {
  switch (mode) {
    case Mode::kFp32: return "fp32";
    case Mode::kFp16NoScaling: return "fp16, no loss scaling";
    case Mode::kFp16StaticScale: return "fp16, static scale 2^20";
    case Mode::kFp16DynamicScale: return "fp16, dynamic GradScaler";
  }
  return "?";
}

Result train(Mode mode, const Config& config) {
  const ag::Device dev = config.device;
  ag::manual_seed(1234);
  // Teacher: a fixed random MLP; student: a fresh one of the same shape.
  ag::nn::Sequential teacher{ag::nn::Linear(32, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
  ag::nn::Sequential model{ag::nn::Linear(32, 64), ag::nn::ReLU(), ag::nn::Linear(64, 1)};
  teacher.to(dev);
  model.to(dev);
  const ag::Tensor x = ag::randn({256, 32}).to(dev);
  ag::Tensor y;
  {
    ag::NoGradGuard no_grad;
    y = teacher(x);
  }

  ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
  const bool fp16 = mode != Mode::kFp32;
  const bool scaled = mode == Mode::kFp16StaticScale || mode == Mode::kFp16DynamicScale;
  ag::amp::GradScalerOptions scaler_options{.enabled = scaled};
  if (mode == Mode::kFp16StaticScale) {
    // A static scale is a scaler whose scale cannot move; it still skips steps that overflow.
    scaler_options.init_scale = scaler_options.min_scale = scaler_options.max_scale = config.static_scale;
  }
  ag::amp::GradScaler scaler(scaler_options);

  Result result;
  int64_t zeros = 0, total = 0;
  std::vector<double> magnitudes;
  for (int64_t step = 0; step < config.steps; ++step) {
    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(dev, ag::DType::kFloat16, /*enabled=*/fp16);
      loss = ag::ops::mse_loss(model(x), y) * static_cast<float>(config.loss_weight);
    }
    scaler.scale(loss).backward();
    // Gradients as the FP16 backward produced them (still scaled): count exact zeros.
    for (const ag::Tensor& p : model.parameters()) {
      for (float g : p.grad().to_vector()) {
        zeros += g == 0.0f;
        ++total;
        if (!fp16 && step == 0) magnitudes.push_back(std::fabs(g));
      }
    }
    result.skipped_steps += scaler.step(opt) ? 0 : 1;
    scaler.update();
  }
  {
    ag::NoGradGuard no_grad;
    result.final_loss = ag::ops::mse_loss(model(x), y).item();
  }
  result.zero_grad_fraction = static_cast<double>(zeros) / static_cast<double>(std::max<int64_t>(total, 1));
  if (!magnitudes.empty()) {
    std::nth_element(magnitudes.begin(), magnitudes.begin() + magnitudes.size() / 2, magnitudes.end());
    result.median_abs_fp32_grad = magnitudes[magnitudes.size() / 2];
  }
  result.final_scale = scaled ? scaler.get_scale() : 1.0;
  return result;
}

}  // namespace underflow
