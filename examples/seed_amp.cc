// The reference program: one training step of Linear(10, 1) with MSE and Adam on a batch of 64,
// in FP16 autocast with dynamic loss scaling. Runs on CUDA when available, else on the CPU;
// --device=cpu or --device=cuda forces either.
#include <cstdio>
#include <cstring>
#include <string>

#include "ampgrad.h"

namespace ag = ampgrad;

int main(int argc, char** argv) {
  ag::Device device = ag::cuda_is_available() ? ag::Device::kCUDA : ag::Device::kCPU;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device=cpu") {
      device = ag::Device::kCPU;
    } else if (arg == "--device=cuda") {
      device = ag::Device::kCUDA;
    } else {
      std::fprintf(stderr, "usage: %s [--device=cpu|--device=cuda]\n", argv[0]);
      return 2;
    }
  }
  try {
    ag::manual_seed(0);
    ag::nn::Linear model(10, 1);
    model.to(device);
    ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
    ag::amp::GradScaler scaler;

    const ag::Tensor x = ag::randn({64, 10}).to(device);
    const ag::Tensor y = ag::randn({64, 1}).to(device);
    std::printf("device: %s\n", std::string(ag::device_name(device)).c_str());
    const double initial_scale = scaler.get_scale();
    std::printf("initial loss scale: %.1f\n", initial_scale);

    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(device, ag::DType::kFloat16);
      const ag::Tensor out = model(x);          // linear runs in FP16
      loss = ag::ops::mse_loss(out, y);         // mse runs in FP32
    }
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();

    ag::Tensor after;
    {
      ag::NoGradGuard no_grad;
      ag::amp::AutocastGuard autocast(device, ag::DType::kFloat16);
      after = ag::ops::mse_loss(model(x), y);
    }
    std::printf("loss before step: %.6f (%s)\n", loss.item(), std::string(ag::dtype_name(loss.dtype())).c_str());
    if (stepped) {
      std::printf("step taken: yes\n");
    } else {
      // Dynamic scaling starts high on purpose: it finds the largest scale whose FP16 gradients fit.
      std::printf("step taken: no: at scale %.0f an FP16 gradient overflowed, so the scaler skipped the\n"
                  "  step (weights and Adam state untouched) and backed the scale off\n", initial_scale);
    }
    std::printf("loss after step: %.6f\n", after.item());
    std::printf("updated loss scale: %.1f\n", scaler.get_scale());
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
