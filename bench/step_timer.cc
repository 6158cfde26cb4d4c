// Times one workload in a plain loop, for callgrind and for compare_pytorch.sh:
//   step_timer WORKLOAD [--seconds=S] [--steps=N] [--threads=T]
// WORKLOAD: seed_fp32 seed_amp mlp_{sgd,adam}_{fp32,amp} gemm1024_{fp32,fp16} (prints GFLOP/s),
//   memory_seed (live bytes and peak RSS after 1e3 and 1e5 AMP seed steps),
//   memory_mlp_{fp32,fp16params} (peak bytes and RSS over 20 Adam steps).
// Prints "WORKLOAD <median us per step over 5 chunks>" (or the figures named above).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/workloads.h"

namespace ag = ampgrad;
using ag::bench::Optim;
using ag::bench::Precision;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Median seconds per call over 5 chunks of ~seconds/5 each, after one warm-up call.
double median_seconds_per_call(const std::function<void()>& fn, double seconds) {
  fn();
  const double t0 = now_s();
  fn();
  const double one = std::max(now_s() - t0, 1e-9);
  const int per_chunk = std::max(1, static_cast<int>(seconds / 5 / one));
  std::vector<double> chunks;
  for (int c = 0; c < 5; ++c) {
    const double start = now_s();
    for (int i = 0; i < per_chunk; ++i) fn();
    chunks.push_back((now_s() - start) / per_chunk);
  }
  std::sort(chunks.begin(), chunks.end());
  return chunks[2];
}

int run(const std::string& name, double seconds, long steps) {
  if (name.rfind("memory_seed", 0) == 0) {
    ag::bench::Workload w = ag::bench::seed_workload(Precision::kAmp);
    for (int i = 0; i < 1000; ++i) w.step();
    const int64_t bytes_1e3 = ag::memory_stats(ag::Device::kCPU).current_bytes;
    const double rss_1e3 = peak_rss_mib();
    for (int i = 0; i < 99000; ++i) w.step();
    std::printf("%s live_bytes_1e3 %lld live_bytes_1e5 %lld peak_rss_mib_1e3 %.2f peak_rss_mib_1e5 %.2f\n",
                name.c_str(), static_cast<long long>(bytes_1e3),
                static_cast<long long>(ag::memory_stats(ag::Device::kCPU).current_bytes), rss_1e3, peak_rss_mib());
    return 0;
  }
  if (name.rfind("memory_mlp_", 0) == 0) {
    const bool fp16 = name == "memory_mlp_fp16params";
    ag::bench::Workload w = ag::bench::mlp_workload(fp16 ? Precision::kAmp : Precision::kFp32, Optim::kAdam,
                                                    fp16 ? ag::DType::kFloat16 : ag::DType::kFloat32);
    for (int i = 0; i < 20; ++i) w.step();
    std::printf("%s peak_bytes_mib %.2f peak_rss_mib %.2f\n", name.c_str(),
                static_cast<double>(ag::memory_stats(ag::Device::kCPU).peak_bytes) / (1 << 20), peak_rss_mib());
    return 0;
  }
  if (name.rfind("gemm1024_", 0) == 0) {
    const ag::DType dtype = name == "gemm1024_fp16" ? ag::DType::kFloat16 : ag::DType::kFloat32;
    ag::manual_seed(0);
    const ag::Tensor x = ag::randn({1024, 1024}, dtype), w = ag::randn({1024, 1024}, dtype);
    const double s = median_seconds_per_call([&] { ag::ops::linear(x, w); }, seconds);
    std::printf("%s %.2f\n", name.c_str(), 2.0 * 1024 * 1024 * 1024 / s / 1e9);
    return 0;
  }
  std::unique_ptr<ag::bench::Workload> w;
  const Precision precision = name.ends_with("_amp") ? Precision::kAmp : Precision::kFp32;
  if (name.rfind("seed_", 0) == 0) {
    w = std::make_unique<ag::bench::Workload>(ag::bench::seed_workload(precision));
  } else if (name.rfind("mlp_", 0) == 0) {
    const Optim optim = name.rfind("mlp_adam", 0) == 0 ? Optim::kAdam : Optim::kSgd;
    w = std::make_unique<ag::bench::Workload>(ag::bench::mlp_workload(precision, optim));
  } else {
    std::fprintf(stderr, "step_timer: unknown workload '%s'\n", name.c_str());
    return 2;
  }
  if (steps > 0) {
    const double start = now_s();
    for (long i = 0; i < steps; ++i) w->step();
    std::printf("%s %.3f\n", name.c_str(), (now_s() - start) / static_cast<double>(steps) * 1e6);
    return 0;
  }
  std::printf("%s %.3f\n", name.c_str(), median_seconds_per_call([&] { w->step(); }, seconds) * 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: step_timer WORKLOAD [--seconds=S] [--steps=N] [--threads=T]\n");
    return 2;
  }
  double seconds = 2.0;
  long steps = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) seconds = std::atof(arg.c_str() + 10);
    if (arg.rfind("--steps=", 0) == 0) steps = std::atol(arg.c_str() + 8);
    if (arg.rfind("--threads=", 0) == 0) ag::set_num_threads(std::atoi(arg.c_str() + 10));
  }
  return run(argv[1], seconds, steps);
}
