// Times one workload in a plain loop, for callgrind and for compare_pytorch.sh:
//   step_timer WORKLOAD [--seconds=S] [--steps=N] [--threads=T] [--cpu-time] [--memory]
// WORKLOAD: seed_{fp32,amp,bf16} mlp_{sgd,adam}_{fp32,amp,bf16,fp8} fashion_{fp32,amp,bf16,fp8}
//           fashion_cnn_{fp32,amp,bf16} mlp_adam_bf16params_{fp32masters,stochastic} (BF16 parameters
//           in BF16 autocast, with FP32 masters or stochastic rounding)
//   gpt_{fp32,amp,bf16,fp8} gpt2s_{fp32,amp,bf16,fp8} (GPT-2 small's shape, T = 256, batch 2; gpt2s_ckpt_*
//   with --checkpoint-activations) gpt2s1024_{fp32,amp,bf16} (the same at T = 1024, batch 1)
//   gpt6_{fp32,amp,bf16} (6 layers, width 384, T = 256, batch 8) gemm1024_{fp32,fp16,bf16} (prints GFLOP/s); amp is FP16 autocast with a
//   GradScaler, bf16 is BF16 autocast without one, fp8 the same with linear's GEMMs in FP8; the single ops of op_workloads.h (add_bias_*, add_residual_*,
//   bmm_*, copy_bandwidth: prints "WORKLOAD <median us> <GB/s or GFLOP/s>"),
//   memory_seed (live bytes and peak RSS after 1e3 and 1e5 AMP seed steps),
//   memory_mlp_{fp32,fp16params,bf16params_fp32masters,bf16params_stochastic} (peak bytes and RSS
//   over 20 Adam steps),
//   memory_fashion_{fp32,amp} (live bytes and peak RSS after 1e2 and 1e4 fashion steps),
//   memory_gpt_{fp32,amp} (live bytes after 20 and 200 char_gpt steps, peak RSS).
// Prints "WORKLOAD <median us per step over 5 chunks>" (or the figures named above); --memory adds
// the CPU allocator's peak bytes and the process's peak RSS, in MiB, for a training workload.
// --cpu-time (1 thread only) times with the process's CPU clock instead of the wall clock: time
// the process spent descheduled on a busy machine is then left out.
//   step_timer ratio WORKLOAD_A WORKLOAD_B [--seconds=S] [--threads=T]
// alternates short chunks of A and B in one process (this machine's speed drifts by 2x over
// seconds, so separate runs cannot be compared) and prints "ratio A B <median us of A>
// <median us of B> <median of the per-pair ratios B/A> <min> <max>".
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/op_workloads.h"
#include "bench/workloads.h"

namespace ag = ampgrad;
using ag::bench::Optim;
using ag::bench::Precision;

namespace {

bool use_cpu_time = false;

double now_s() {
  if (use_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
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

std::unique_ptr<ag::bench::Steppable> make_workload(const std::string& name) {
  const Precision precision = name.ends_with("_amp")    ? Precision::kAmp
                              : name.ends_with("_bf16") ? Precision::kAmpBf16
                              : name.ends_with("_fp8")  ? Precision::kFp8
                                                        : Precision::kFp32;
  if (name.rfind("seed_", 0) == 0) return std::make_unique<ag::bench::Workload>(ag::bench::seed_workload(precision));
  if (name.rfind("fashion_", 0) == 0) {
    const auto model = name.rfind("fashion_cnn_", 0) == 0 ? ag::fashion::Model::kCnn : ag::fashion::Model::kMlp;
    return std::make_unique<ag::bench::Workload>(ag::bench::fashion_workload(precision, model));
  }
  if (name.rfind("gpt_", 0) == 0) return std::make_unique<ag::bench::GptWorkload>(precision);
  if (name.rfind("gpt6_", 0) == 0) return std::make_unique<ag::bench::GptWorkload>(precision, ag::bench::kGpt6Layer);
  if (name.rfind("gpt2s1024_", 0) == 0) {
    return std::make_unique<ag::bench::GptWorkload>(precision, ag::bench::kGpt2Small1024);
  }
  if (name.rfind("gpt2s_", 0) == 0) {
    ag::bench::GptShape shape = ag::bench::kGpt2Small;
    shape.checkpoint_activations = name.find("_ckpt") != std::string::npos;
    return std::make_unique<ag::bench::GptWorkload>(precision, shape);
  }
  if (name.rfind("mlp_adam_bf16params_", 0) == 0) {  // BF16 parameters in BF16 autocast, no scaler
    ag::bench::Workload w = ag::bench::mlp_workload(Precision::kAmpBf16, Optim::kAdam, ag::DType::kBFloat16);
    w.opt->set_master_weights(name.ends_with("_stochastic") ? ag::optim::MasterWeights::kStochasticRounding
                                                            : ag::optim::MasterWeights::kFp32);
    return std::make_unique<ag::bench::Workload>(std::move(w));
  }
  if (name.rfind("mlp_", 0) == 0) {
    const Optim optim = name.rfind("mlp_adam", 0) == 0 ? Optim::kAdam : Optim::kSgd;
    return std::make_unique<ag::bench::Workload>(ag::bench::mlp_workload(precision, optim));
  }
  std::fprintf(stderr, "step_timer: unknown workload '%s'\n", name.c_str());
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Pairs of ~10 ms chunks (at least one step each), A then B, for `seconds` in all.
int run_ratio(const std::string& name_a, const std::string& name_b, double seconds) {
  const auto a = make_workload(name_a), b = make_workload(name_b);
  if (!a || !b) return 2;
  const auto seconds_per_step = [](ag::bench::Steppable& w) {
    w.step();
    const double t0 = now_s();
    w.step();
    return std::max(now_s() - t0, 1e-9);
  };
  const int steps_a = std::max(1, static_cast<int>(0.01 / seconds_per_step(*a)));
  const int steps_b = std::max(1, static_cast<int>(0.01 / seconds_per_step(*b)));
  const auto chunk = [](ag::bench::Steppable& w, int steps) {
    const double start = now_s();
    for (int i = 0; i < steps; ++i) w.step();
    return (now_s() - start) / steps;
  };
  std::vector<double> times_a, times_b, ratios;
  for (const double end = now_s() + seconds; now_s() < end || ratios.size() < 5;) {
    times_a.push_back(chunk(*a, steps_a));
    times_b.push_back(chunk(*b, steps_b));
    ratios.push_back(times_b.back() / times_a.back());
  }
  std::printf("ratio %s %s %.3f %.3f %.3f %.3f %.3f\n", name_a.c_str(), name_b.c_str(), median(times_a) * 1e6,
              median(times_b) * 1e6, median(ratios), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  return 0;
}

int run(const std::string& name, double seconds, long steps, bool memory) {
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
  if (name.rfind("memory_fashion_", 0) == 0) {
    ag::bench::Workload w = ag::bench::fashion_workload(name.ends_with("_amp") ? Precision::kAmp : Precision::kFp32);
    for (int i = 0; i < 100; ++i) w.step();
    const int64_t bytes_1e2 = ag::memory_stats(ag::Device::kCPU).current_bytes;
    const double rss_1e2 = peak_rss_mib();
    for (int i = 100; i < 10000; ++i) w.step();
    std::printf("%s live_bytes_1e2 %lld live_bytes_1e4 %lld peak_rss_mib_1e2 %.2f peak_rss_mib_1e4 %.2f\n",
                name.c_str(), static_cast<long long>(bytes_1e2),
                static_cast<long long>(ag::memory_stats(ag::Device::kCPU).current_bytes), rss_1e2, peak_rss_mib());
    return 0;
  }
  if (name.rfind("memory_gpt_", 0) == 0) {
    ag::bench::GptWorkload w(name.ends_with("_amp") ? Precision::kAmp : Precision::kFp32);
    for (int i = 0; i < 20; ++i) w.step();
    const int64_t bytes_20 = ag::memory_stats(ag::Device::kCPU).current_bytes;
    for (int i = 20; i < 200; ++i) w.step();
    std::printf("%s live_bytes_20 %lld live_bytes_200 %lld peak_rss_mib %.2f\n", name.c_str(),
                static_cast<long long>(bytes_20), static_cast<long long>(ag::memory_stats(ag::Device::kCPU).current_bytes),
                peak_rss_mib());
    return 0;
  }
  if (name.rfind("memory_mlp_", 0) == 0) {
    const bool fp16 = name == "memory_mlp_fp16params", bf16 = name.rfind("memory_mlp_bf16params_", 0) == 0;
    ag::bench::Workload w = ag::bench::mlp_workload(fp16 ? Precision::kAmp : bf16 ? Precision::kAmpBf16 : Precision::kFp32,
                                                    Optim::kAdam, fp16 ? ag::DType::kFloat16 : bf16 ? ag::DType::kBFloat16 : ag::DType::kFloat32);
    if (name == "memory_mlp_bf16params_stochastic") w.opt->set_master_weights(ag::optim::MasterWeights::kStochasticRounding);
    for (int i = 0; i < 20; ++i) w.step();
    std::printf("%s peak_bytes_mib %.2f peak_rss_mib %.2f\n", name.c_str(),
                static_cast<double>(ag::memory_stats(ag::Device::kCPU).peak_bytes) / (1 << 20), peak_rss_mib());
    return 0;
  }
  if (name.rfind("gemm1024_", 0) == 0) {
    const ag::DType dtype = name == "gemm1024_fp16"   ? ag::DType::kFloat16
                            : name == "gemm1024_bf16" ? ag::DType::kBFloat16
                                                      : ag::DType::kFloat32;
    ag::manual_seed(0);
    const ag::Tensor x = ag::randn({1024, 1024}, dtype), w = ag::randn({1024, 1024}, dtype);
    const double s = median_seconds_per_call([&] { ag::ops::linear(x, w); }, seconds);
    std::printf("%s %.2f\n", name.c_str(), 2.0 * 1024 * 1024 * 1024 / s / 1e9);
    return 0;
  }
  if (const std::unique_ptr<ag::bench::OpWorkload> op = ag::bench::make_op_workload(name)) {
    const double s = median_seconds_per_call(op->run, seconds);
    std::printf("%s %.3f %.2f\n", name.c_str(), s * 1e6, (op->bytes > 0 ? op->bytes : op->flop) / s / 1e9);
    return 0;
  }
  const std::unique_ptr<ag::bench::Steppable> w = make_workload(name);
  if (!w) return 2;
  double us = 0;
  if (steps > 0) {
    const double start = now_s();
    for (long i = 0; i < steps; ++i) w->step();
    us = (now_s() - start) / static_cast<double>(steps) * 1e6;
  } else {
    us = median_seconds_per_call([&] { w->step(); }, seconds) * 1e6;
  }
  if (memory) {
    std::printf("%s %.3f peak_bytes_mib %.1f peak_rss_mib %.1f\n", name.c_str(), us,
                static_cast<double>(ag::memory_stats(ag::Device::kCPU).peak_bytes) / (1 << 20), peak_rss_mib());
  } else {
    std::printf("%s %.3f\n", name.c_str(), us);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: step_timer WORKLOAD [--seconds=S] [--steps=N] [--threads=T] [--memory]\n");
    return 2;
  }
  double seconds = 2.0;
  long steps = 0;
  bool memory = false;
  const bool ratio = std::string(argv[1]) == "ratio";
  if (ratio && argc < 4) {
    std::fprintf(stderr, "usage: step_timer ratio WORKLOAD_A WORKLOAD_B [--seconds=S] [--threads=T]\n");
    return 2;
  }
  for (int i = ratio ? 4 : 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) seconds = std::atof(arg.c_str() + 10);
    if (arg.rfind("--steps=", 0) == 0) steps = std::atol(arg.c_str() + 8);
    if (arg.rfind("--threads=", 0) == 0) ag::set_num_threads(std::atoi(arg.c_str() + 10));
    if (arg == "--cpu-time") use_cpu_time = true;
    if (arg == "--memory") memory = true;
  }
  if (use_cpu_time && ag::num_threads() != 1) {
    std::fprintf(stderr, "step_timer: --cpu-time needs --threads=1 (a pool's waits would not count)\n");
    return 2;
  }
  return ratio ? run_ratio(argv[2], argv[3], seconds) : run(argv[1], seconds, steps, memory);
}
