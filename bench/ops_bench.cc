// Per-op micro-benchmarks: GEMM (linear forward) in FP32, FP16 and BF16 at a few sizes, in GFLOP/s.
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

}  // namespace

BENCHMARK_CAPTURE(BM_LinearForward, fp32, ag::DType::kFloat32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForward, fp16, ag::DType::kFloat16)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForward, bf16, ag::DType::kBFloat16)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForwardBackward, fp32, ag::DType::kFloat32)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForwardBackward, fp16, ag::DType::kFloat16)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LinearForwardBackward, bf16, ag::DType::kBFloat16)->Arg(1024)->Unit(benchmark::kMillisecond);
