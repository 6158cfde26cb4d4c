// The CPU's float FMA peak, measured for each vector width it has: 12 independent chains of FMAs
// per thread (enough to cover the FMA latency on two pipes), 8-wide (AVX2/FMA) and 16-wide
// (AVX-512F, compiled for that target alone and run only where the CPU has the avx512 level), on
// 1 thread and on every core; and the BF16 dot-product peak (VDPBF16PS: 16 lanes x 2 products,
// FP32 sums) where it has the avx512_bf16 level (a level it lacks is named, with the reason). The
// GEMM figures in bench/README.md are read against these numbers rather than a datasheet clock.
// Each line gives the wall-clock rate and, for 1 thread, the rate per second of CPU time the
// thread got (what a shared, busy machine still lets one compare).
//   fma_peak [--seconds=S]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "framework/cpu_features.h"

#if defined(__AVX2__) && defined(__FMA__)
// GCC 12 warns, wrongly, that _mm512_extractf64x4_pd's _mm256_undefined_pd value is used
// uninitialized once inlined into a target("avx512f") function (GCC bug 105593); the warning is
// attributed to the header, so it is silenced around the include.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace {

constexpr int kChains = 12;

// Runs `iterations` rounds of kChains 8-wide FMAs; returns a value so the work is not optimised away.
float fma_chains_avx2(long iterations) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}

// The same with 16-wide FMAs.
[[gnu::target("avx512f")]] float fma_chains_avx512(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

// The same with VDPBF16PS: each instruction adds two bfloat16 products to each of 16 lanes.
[[gnu::target("avx512f,avx512bf16")]] float dpbf16_chains(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-7f * static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // the pair (1, 1)
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33d633d6);  // the pair (1e-7, 1e-7), about
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}

// What one measurement runs: its name, the level whose CPUs run it, the FLOP one instruction
// does, and the chains.
struct Unit {
  const char* name;
  ampgrad::CpuIsa level;
  int flop;
  float (*chains)(long iterations);
};
constexpr Unit kUnits[] = {{"avx2", ampgrad::CpuIsa::kBaseline, 8 * 2, fma_chains_avx2},
                           {"avx512", ampgrad::CpuIsa::kAvx512, 16 * 2, fma_chains_avx512},
                           {"avx512_bf16", ampgrad::CpuIsa::kAvx512Bf16, 16 * 4, dpbf16_chains}};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Rate {
  double wall, cpu;  // GFLOP/s per wall-clock second (all threads), per CPU second (thread 0)
};

Rate gflops(int threads, double seconds, const Unit& unit) {
  const long iterations = static_cast<long>(seconds * 3e8 * 16 / unit.flop);  // ~1 s per thread at ~3 GHz, 2 pipes
  std::vector<std::thread> pool;
  std::vector<float> sink(static_cast<size_t>(threads));
  double cpu0 = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const double c = thread_cpu_seconds();
      sink[static_cast<size_t>(t)] = unit.chains(iterations);
      if (t == 0) cpu0 = thread_cpu_seconds() - c;
    });
  }
  for (std::thread& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (sink[0] == 12345.0f) std::puts("");  // keeps the result alive
  const double flop = static_cast<double>(iterations) * kChains * unit.flop;
  return {static_cast<double>(threads) * flop / elapsed / 1e9, flop / cpu0 / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) seconds = std::atof(arg.c_str() + 10);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const Unit& unit : kUnits) {
    if (!ampgrad::cpu_supports(unit.level)) {
      std::printf("fma_peak %s: skipped, %s\n", unit.name, ampgrad::cpu_unsupported_reason(unit.level).c_str());
    }
  }
  for (int round = 0; round < 3; ++round) {
    for (int u = 0; u < 3; ++u) {
      if (!ampgrad::cpu_supports(kUnits[u].level)) continue;
      const Rate one = gflops(1, seconds, kUnits[u]), all = gflops(cores, seconds, kUnits[u]);
      std::printf("fma_peak %s 1 thread %.1f GFLOP/s (%.1f per CPU second), %d threads %.1f GFLOP/s\n",
                  kUnits[u].name, one.wall, one.cpu, cores, all.wall);
    }
  }
  return 0;
}
#else
int main() {
  std::puts("fma_peak: built without AVX2 and FMA");
  return 0;
}
#endif
