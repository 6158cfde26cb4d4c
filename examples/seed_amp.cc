// The reference program: one training step of Linear(10, 1) with MSE and Adam on a batch of 64,
// in FP16 autocast with dynamic loss scaling. Runs on CUDA when available, else on the CPU;
// --device=cpu or --device=cuda forces either. --dtype=bf16 runs BF16 autocast instead, with the
// recommended BF16 recipe: no loss scaling (BF16 has FP32's range), FP32 weights in the optimizer.
#include <cstdio>
#include <cstring>
#include <string>

#include "ampgrad.h"

namespace ag = ampgrad;

int main(int argc, char** argv) {
  ag::Device device = ag::cuda_is_available() ? ag::Device::kCUDA : ag::Device::kCPU;
  ag::DType dtype = ag::DType::kFloat16;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device=cpu") {
      device = ag::Device::kCPU;
    } else if (arg == "--device=cuda") {
      device = ag::Device::kCUDA;
    } else if (arg == "--dtype=fp16") {
      dtype = ag::DType::kFloat16;
    } else if (arg == "--dtype=bf16") {
      dtype = ag::DType::kBFloat16;
    } else {
      std::fprintf(stderr, "usage: %s [--device=cpu|--device=cuda] [--dtype=fp16|--dtype=bf16]\n", argv[0]);
      return 2;
    }
  }
  // FP16 needs loss scaling (its gradients underflow); BF16 does not, so its scaler is off.
  const bool scaling = dtype == ag::DType::kFloat16;
  try {
    ag::manual_seed(0);
    ag::nn::Linear model(10, 1);
    model.to(device);
    ag::optim::Adam opt(model.parameters(), {.lr = 1e-3});
    ag::amp::GradScaler scaler({.enabled = scaling});

    const ag::Tensor x = ag::randn({64, 10}).to(device);
    const ag::Tensor y = ag::randn({64, 1}).to(device);
    std::printf("device: %s\n", std::string(ag::device_name(device)).c_str());
    std::printf("autocast dtype: %s\n", std::string(ag::dtype_name(dtype)).c_str());
    const double initial_scale = scaler.get_scale();
    if (scaling) {
      std::printf("initial loss scale: %.1f\n", initial_scale);
    } else {
      std::printf("loss scaling: off (bfloat16 has float32's exponent range: gradients do not underflow)\n");
    }

    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(device, dtype);
      const ag::Tensor out = model(x);          // linear runs in FP16 (or BF16)
      loss = ag::ops::mse_loss(out, y);         // mse runs in FP32
    }
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();

    ag::Tensor after;
    {
      ag::NoGradGuard no_grad;
      ag::amp::AutocastGuard autocast(device, dtype);
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
    if (scaling) std::printf("updated loss scale: %.1f\n", scaler.get_scale());
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
