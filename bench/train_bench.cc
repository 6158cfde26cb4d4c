// End-to-end training steps (zero_grad, forward, loss, backward, step), FP32 and AMP:
//   seed: Linear(10, 1), MSE, Adam, batch 64;   mlp: 784-1024-1024-10 with ReLU, batch 256.
// Memory: live CPU bytes after 1e3 and 1e5 seed steps (must be equal).
#include <benchmark/benchmark.h>

#include <memory>

#include "ampgrad.h"

namespace ag = ampgrad;

namespace {

enum class Precision { kFp32, kAmp };

struct Workload {
  std::unique_ptr<ag::nn::Sequential> model;
  std::unique_ptr<ag::optim::Optimizer> opt;
  ag::amp::GradScaler scaler;
  ag::Tensor x, y;

  Workload(std::unique_ptr<ag::nn::Sequential> m, Precision precision, int64_t batch, int64_t in, int64_t out,
           bool adam)
      : model(std::move(m)), scaler({.enabled = precision == Precision::kAmp}) {
    if (adam) {
      opt = std::make_unique<ag::optim::Adam>(model->parameters(), ag::optim::AdamOptions{.lr = 1e-3});
    } else {
      opt = std::make_unique<ag::optim::SGD>(model->parameters(), ag::optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
    }
    x = ag::randn({batch, in});
    y = ag::randn({batch, out});
  }

  void step() {
    opt->zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kFloat16, scaler.is_enabled());
      loss = ag::ops::mse_loss((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
  }
};

Workload seed_workload(Precision precision) {
  ag::manual_seed(0);
  return Workload(std::make_unique<ag::nn::Sequential>(ag::nn::Linear(10, 1)), precision, 64, 10, 1, true);
}

void BM_SeedStep(benchmark::State& state, Precision precision) {
  Workload w = seed_workload(precision);
  for (auto _ : state) w.step();
}

void BM_MlpStep(benchmark::State& state, Precision precision, bool adam) {
  ag::manual_seed(0);
  Workload w(std::make_unique<ag::nn::Sequential>(ag::nn::Linear(784, 1024), ag::nn::ReLU(), ag::nn::Linear(1024, 1024),
                                                  ag::nn::ReLU(), ag::nn::Linear(1024, 10)),
             precision, 256, 784, 10, adam);
  for (auto _ : state) w.step();
}

// Live CPU bytes after 1e3 and after 1e5 seed steps: a leak of even one tensor per step shows.
void BM_SeedMemory(benchmark::State& state, Precision precision) {
  for (auto _ : state) {
    Workload w = seed_workload(precision);
    for (int i = 0; i < 1000; ++i) w.step();
    const int64_t after_1e3 = ag::memory_stats(ag::Device::kCPU).current_bytes;
    for (int i = 0; i < 99000; ++i) w.step();
    const int64_t after_1e5 = ag::memory_stats(ag::Device::kCPU).current_bytes;
    state.counters["bytes_after_1e3"] = static_cast<double>(after_1e3);
    state.counters["bytes_after_1e5"] = static_cast<double>(after_1e5);
    state.counters["peak_bytes"] = static_cast<double>(ag::memory_stats(ag::Device::kCPU).peak_bytes);
  }
}

}  // namespace

BENCHMARK_CAPTURE(BM_SeedStep, fp32, Precision::kFp32)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SeedStep, amp, Precision::kAmp)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MlpStep, fp32_sgd, Precision::kFp32, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, amp_sgd, Precision::kAmp, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, fp32_adam, Precision::kFp32, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, amp_adam, Precision::kAmp, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SeedMemory, amp, Precision::kAmp)->Iterations(1)->Unit(benchmark::kSecond);
