// The CPU's float FMA peak, measured: 10 independent chains of 8-wide FMAs per thread (enough
// to cover the FMA latency on two pipes), on 1 thread and then on every core. The GEMM figures in
// bench/README.md are read against this number rather than a datasheet clock.
//   fma_peak [--seconds=S]
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {

constexpr int kChains = 10;

// Runs `iterations` rounds of kChains FMAs; returns a value so the work is not optimised away.
float fma_chains(long iterations) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 10
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}

double gflops(int threads, double seconds) {
  const long iterations = static_cast<long>(seconds * 3e8);  // ~1 s per thread at ~3 GHz
  std::vector<std::thread> pool;
  std::vector<float> sink(static_cast<size_t>(threads));
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink[static_cast<size_t>(t)] = fma_chains(iterations); });
  for (std::thread& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (sink[0] == 12345.0f) std::puts("");  // keeps the result alive
  return static_cast<double>(threads) * static_cast<double>(iterations) * kChains * 16 / elapsed / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) seconds = std::atof(arg.c_str() + 10);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int round = 0; round < 3; ++round) {
    std::printf("fma_peak 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s\n", gflops(1, seconds), cores,
                gflops(cores, seconds));
  }
  return 0;
}
#else
int main() {
  std::puts("fma_peak: built without AVX2 and FMA");
  return 0;
}
#endif
