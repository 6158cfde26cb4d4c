// A small MLP learns y = sin(x1) + x2^2 on [-2, 2]^2, printing progress. --amp (or --amp=fp16)
// trains with FP16 autocast and dynamic loss scaling; --amp=bf16 with BF16 autocast and no loss
// scaling (BF16 has FP32's range); --device=cuda runs on the GPU.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ampgrad.h"

namespace ag = ampgrad;

namespace {

// n points (x1, x2) uniform in [-2, 2]^2 and their targets.
void make_data(int64_t n, ag::Device device, ag::Tensor& x, ag::Tensor& y) {
  const ag::Tensor points = ag::uniform({n, 2}, -2.0, 2.0);
  const std::vector<float> p = points.to_vector();
  std::vector<float> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = std::sin(p[2 * i]) + p[2 * i + 1] * p[2 * i + 1];
  x = points.to(device);
  y = ag::Tensor::from_vector(t, {n, 1}).to(device);
}

}  // namespace

int main(int argc, char** argv) {
  bool amp = false;
  ag::DType amp_dtype = ag::DType::kFloat16;
  ag::Device device = ag::Device::kCPU;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--amp" || arg == "--amp=fp16") {
      amp = true;
    } else if (arg == "--amp=bf16") {
      amp = true;
      amp_dtype = ag::DType::kBFloat16;
    } else if (arg == "--device=cuda") {
      device = ag::Device::kCUDA;
    } else if (arg != "--device=cpu") {
      std::fprintf(stderr, "usage: %s [--amp[=fp16|bf16]] [--device=cpu|cuda]\n", argv[0]);
      return 2;
    }
  }
  const bool fp16 = amp && amp_dtype == ag::DType::kFloat16;
  try {
    ag::manual_seed(42);
    ag::Tensor x, y, x_test, y_test;
    make_data(1024, device, x, y);
    make_data(256, device, x_test, y_test);

    ag::nn::Sequential model{ag::nn::Linear(2, 64), ag::nn::ReLU(), ag::nn::Linear(64, 64), ag::nn::ReLU(),
                             ag::nn::Linear(64, 1)};
    model.to(device);
    ag::optim::Adam opt(model.parameters(), {.lr = 3e-3});
    ag::amp::GradScaler scaler({.enabled = fp16});  // BF16 needs no loss scaling
    const char* mode = !amp   ? "in fp32"
                       : fp16 ? "with AMP (fp16 autocast + GradScaler)"
                              : "with AMP (bf16 autocast, no scaler)";
    std::printf("training %s on %s\n", mode, std::string(ag::device_name(device)).c_str());

    const int steps = 2000;
    for (int step = 1; step <= steps; ++step) {
      opt.zero_grad();
      ag::Tensor loss;
      {
        ag::amp::AutocastGuard autocast(device, amp_dtype, amp);
        loss = ag::ops::mse_loss(model(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      if (step == 1 || step % 250 == 0) {
        ag::NoGradGuard no_grad;
        const float test = ag::ops::mse_loss(model(x_test), y_test).item();
        std::printf("step %5d  train mse %.5f  test mse %.5f  scale %.0f\n", step, loss.item(), test,
                    scaler.get_scale());
      }
    }
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
