// End-to-end training steps (zero_grad, forward, loss, backward, step), FP32, FP16 AMP and BF16 AMP:
//   seed: Linear(10, 1), MSE, Adam, batch 64;   mlp: 784-1024-1024-10 with ReLU, batch 256;
//   fashion: examples/fashion_mnist's 784-512-256-10 classifier, cross_entropy, Adam, batch 128;
//   gpt: examples/char_gpt's step (4 layers, width 128, context 64, batch 16).
// Memory: live CPU bytes after 1e3 and 1e5 seed steps, and after 1e2 and 1e4 fashion AMP steps
// (each pair must be equal).
#include <benchmark/benchmark.h>

#include "bench/workloads.h"

namespace ag = ampgrad;
using ag::bench::Optim;
using ag::bench::Precision;
using ag::bench::seed_workload;
using ag::bench::Workload;

namespace {

void BM_SeedStep(benchmark::State& state, Precision precision) {
  Workload w = seed_workload(precision);
  for (auto _ : state) w.step();
}

void BM_MlpStep(benchmark::State& state, Precision precision, Optim optim) {
  Workload w = ag::bench::mlp_workload(precision, optim);
  for (auto _ : state) w.step();
}

void BM_FashionStep(benchmark::State& state, Precision precision) {
  Workload w = ag::bench::fashion_workload(precision);
  for (auto _ : state) w.step();
}

void BM_GptStep(benchmark::State& state, Precision precision) {
  ag::bench::GptWorkload w(precision);
  for (auto _ : state) w.step();
}

void BM_FashionMemory(benchmark::State& state, Precision precision) {
  for (auto _ : state) {
    Workload w = ag::bench::fashion_workload(precision);
    for (int i = 0; i < 100; ++i) w.step();
    const int64_t after_1e2 = ag::memory_stats(ag::Device::kCPU).current_bytes;
    for (int i = 100; i < 10000; ++i) w.step();
    state.counters["bytes_after_1e2"] = static_cast<double>(after_1e2);
    state.counters["bytes_after_1e4"] = static_cast<double>(ag::memory_stats(ag::Device::kCPU).current_bytes);
  }
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
BENCHMARK_CAPTURE(BM_SeedStep, bf16, Precision::kAmpBf16)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_MlpStep, fp32_sgd, Precision::kFp32, Optim::kSgd)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, amp_sgd, Precision::kAmp, Optim::kSgd)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, fp32_adam, Precision::kFp32, Optim::kAdam)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, amp_adam, Precision::kAmp, Optim::kAdam)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, bf16_sgd, Precision::kAmpBf16, Optim::kSgd)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MlpStep, bf16_adam, Precision::kAmpBf16, Optim::kAdam)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SeedMemory, amp, Precision::kAmp)->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_FashionStep, fp32, Precision::kFp32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FashionStep, amp, Precision::kAmp)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FashionStep, bf16, Precision::kAmpBf16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, fp32, Precision::kFp32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, amp, Precision::kAmp)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_FashionMemory, amp, Precision::kAmp)->Iterations(1)->Unit(benchmark::kSecond);
