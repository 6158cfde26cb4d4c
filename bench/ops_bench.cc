// Per-op micro-benchmarks: GEMM (linear forward) in FP32, FP16 and BF16 at a few sizes, in GFLOP/s;
// and a GPT-2-small MLP projection under BF16 autocast with and without FP8 GEMMs (Float8Guard).
#include <benchmark/benchmark.h>

#include "ampgrad.h"

namespace ag = ampgrad;

namespace {

// linear forward, x [n, n] @ w [n, n]^T: 2 n^3 FLOP.
void BM_LinearForward(benchmark::State& state, ag::DType dtype) {
  const int64_t n = state.range(0);
  ag::manual_seed(0);
  const ag::Tensor x = ag::randn({n, n}, dtype), w = ag::randn({n, n}, dtype);
  for (auto _ : state) benchmark::DoNotOptimize(ag::ops::linear(x, w).data_ptr());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// linear forward + backward (dx and dw): 6 n^3 FLOP.
void BM_LinearForwardBackward(benchmark::State& state, ag::DType dtype) {
  const int64_t n = state.range(0);
  ag::manual_seed(0);
  ag::Tensor x = ag::randn({n, n}, dtype), w = ag::randn({n, n}, dtype);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  for (auto _ : state) {
    ag::ops::sum(ag::ops::linear(x, w)).backward();
    x.set_grad({});
    w.set_grad({});
  }
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// GPT-2 small's first MLP linear, x [rows, 768] -> [rows, 3072], FP32 parameters under BF16 autocast,
// forward + backward (6 rows 768 3072 FLOP), with linear's GEMMs in BF16 or in FP8 (delayed
// scaling). held_MB: what the forward's graph holds until backward (saved operands and the
// output), from memory_stats.
void BM_LinearAutocast(benchmark::State& state, bool fp8) {
  const int64_t rows = state.range(0), in = 768, out = 3072;
  ag::manual_seed(0);
  ag::Tensor x = ag::randn({rows, in}), w = ag::randn({out, in}) * 0.02f;
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const auto forward = [&] {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kBFloat16);
    ag::amp::Float8Guard float8(ag::Device::kCPU, {}, fp8);
    return ag::ops::sum(ag::ops::linear(x, w));
  };
  {
    const int64_t before = ag::memory_stats(ag::Device::kCPU).current_bytes;
    const ag::Tensor loss = forward();
    state.counters["held_MB"] = static_cast<double>(ag::memory_stats(ag::Device::kCPU).current_bytes - before) / 1e6;
  }
  for (auto _ : state) {
    forward().backward();
    x.set_grad({});
    w.set_grad({});
  }
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * rows * in * out, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

}  // namespace

BENCHMARK_CAPTURE(BM_LinearAutocast, bf16, false)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearAutocast, fp8, true)->Arg(2048)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForward, fp32, ag::DType::kFloat32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForward, fp16, ag::DType::kFloat16)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForward, bf16, ag::DType::kBFloat16)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForwardBackward, fp32, ag::DType::kFloat32)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForwardBackward, fp16, ag::DType::kFloat16)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForwardBackward, bf16, ag::DType::kBFloat16)->Arg(1024)->Unit(benchmark::kMillisecond);
