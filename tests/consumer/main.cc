// The seed program from a user's own workspace: one AMP training step of Linear(10, 1) with MSE and
// Adam under a GradScaler, on CUDA when available, else on the CPU. Prints the loss.
#include <cstdio>
#include <string>

#include "ampgrad.h"

namespace ag = ampgrad;

int main() {
  try {
    const ag::Device device = ag::cuda_is_available() ? ag::Device::kCUDA : ag::Device::kCPU;
    ag::manual_seed(0);
    ag::nn::Linear model(10, 1);
    model.to(device);
    ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
    ag::amp::GradScaler scaler;
    const ag::Tensor x = ag::randn({64, 10}).to(device);
    const ag::Tensor y = ag::randn({64, 1}).to(device);

    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(device, ag::DType::kFloat16);
      loss = ag::ops::mse_loss(model(x), y);  // linear in FP16, mse_loss in FP32
    }
    scaler.scale(loss).backward();
    // Dynamic scaling starts high: if an FP16 gradient overflows at the current scale, step() skips
    // the update and update() halves the scale (this batch's first step does so on the CPU).
    const bool stepped = scaler.step(opt);
    scaler.update();
    std::printf("device %s loss %.6f step %s scale %.1f\n", std::string(ag::device_name(device)).c_str(),
                loss.item(), stepped ? "taken" : "skipped", scaler.get_scale());
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
