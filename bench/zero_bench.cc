// ZeRO against DistributedDataParallel on the char-level GPT: step time and training state per rank.
//   mpirun -np N bazel-bin/bench/zero_bench [--layers=4] [--width=128] [--batch=16] [--steps=20]
// For FP32 parameters and for BF16 parameters with FP32 masters (both AdamW, clipping at 1.0), it
// times the median step (as the slowest rank sees it) of DDP + AdamW, ZeRO stage 1 and ZeRO stage 2,
// and counts the bytes each rank holds when the step runs (optim::training_state_bytes): parameters
// (the model's and the shards the optimizer steps), gradients (the model's and the shards'), FP32
// masters and the two moments, per parameter of the model, and the step's peak. The ZeRO paper's
// column is its figure for the stage: 16-bit weights 2 + 2 + 12/N (stage 1) and 2 + 14/N (stage 2);
// FP32 weights 4 + 4 + 8/N and 4 + 12/N; DDP 16 either way.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ampgrad_distributed.h"
#include "bench/rank_timing.h"
#include "examples/gpt.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
using ampgrad::bench::slowest_median;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int64_t layers = 4, width = 128, batch = 16;
  int steps = 20;
};

enum class Mode { kDataParallel, kZero1, kZero2 };
const char* mode_name(Mode m) { return m == Mode::kDataParallel ? "DDP" : m == Mode::kZero1 ? "ZeRO-1" : "ZeRO-2"; }

struct Row {
  double step_s = 0;
  ag::optim::TrainingMemory memory;  // at step 1, as the step leaves it: every gradient present
};

Row run(dist::ProcessGroup& world, const Args& a, Mode mode, bool bf16) {
  gpt::Config config{.vocab_size = 96, .block_size = 64, .n_layer = a.layers, .n_head = 4, .n_embd = a.width};
  ag::manual_seed(1);
  gpt::GPT model(config);
  if (bf16) model.to(ag::DType::kBFloat16);
  const auto [decay, no_decay] = model.decay_groups();
  const ag::optim::AdamWOptions options{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};
  ag::optim::AdamWOptions no_decay_options = options;
  no_decay_options.weight_decay = 0.0;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<ag::optim::AdamW> adamw;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  if (mode == Mode::kDataParallel) {
    ddp = std::make_unique<dist::DistributedDataParallel>(model, world);
    adamw = std::make_unique<ag::optim::AdamW>(
        std::vector<ag::optim::ParamGroup<ag::optim::AdamWOptions>>{{.params = decay},
                                                                    {.params = no_decay, .options = no_decay_options}},
        options);
  } else {
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(
        std::vector<std::vector<ag::Tensor>>{decay, no_decay},
        dist::shard_optimizer<ag::optim::AdamW>(options, {std::nullopt, no_decay_options}), world,
        dist::ZeroOptions{.stage = mode == Mode::kZero1 ? 1 : 2});
  }
  ag::optim::Optimizer& opt = zero ? zero->optimizer() : *adamw;
  ag::nn::Module& net = ddp ? static_cast<ag::nn::Module&>(*ddp) : model;
  Row row;
  std::vector<double> times;
  for (int step = 0; step < a.steps + 3; ++step) {
    std::mt19937_64 rng(static_cast<uint64_t>(1000 + step * world.size() + world.rank()));
    std::vector<int64_t> ids(static_cast<size_t>(a.batch * (config.block_size + 1)));
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint64_t>(config.vocab_size));
    const ag::Tensor x = ag::Tensor::from_vector(
        std::vector<int64_t>(ids.begin(), ids.begin() + a.batch * config.block_size), {a.batch, config.block_size});
    const ag::Tensor y = ag::Tensor::from_vector(
        std::vector<int64_t>(ids.begin() + a.batch, ids.end()), {a.batch * config.block_size});
    world.barrier();
    std::optional<ag::optim::MemoryMeter> meter;
    if (step == 0) meter.emplace(ag::Device::kCPU);
    const auto start = Clock::now();
    if (zero) {
      zero->zero_grad();
    } else {
      opt.zero_grad();
    }
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kBFloat16, bf16);
      const ag::Tensor logits = net(x);
      loss = ag::ops::cross_entropy(ag::ops::reshape(logits, {-1, logits.size(-1)}), y);
    }
    if (meter) meter->forward_done();
    loss.backward();
    if (zero) {
      zero->clip_grad_norm_(1.0);
    } else {
      ag::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    }
    opt.step();
    if (meter) row.memory = meter->read(model.parameters(), opt);  // the masters are made at step 1
    if (step >= 3) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  row.step_s = slowest_median(world, times);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--layers=")) a.layers = std::atoll(v);
    else if (const char* v = value("--width=")) a.width = std::atoll(v);
    else if (const char* v = value("--batch=")) a.batch = std::atoll(v);
    else if (const char* v = value("--steps=")) a.steps = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  dist::ProcessGroup& world = dist::init_process_group();
  const int n = world.size();
  if (world.rank() == 0) {
    std::printf("GPT %lld layers, width %lld, batch %lld x 64 per rank, %d ranks, AdamW, median of %d steps\n",
                static_cast<long long>(a.layers), static_cast<long long>(a.width), static_cast<long long>(a.batch), n,
                a.steps);
    std::printf("bytes per parameter of the model on each rank, at the step\n");
    std::printf("%-12s %-7s %9s %8s %7s %6s %8s %8s %6s %11s %9s\n", "weights", "mode", "step ms", "vs DDP", "params",
                "grads", "masters", "moments", "total", "ZeRO paper", "peak MiB");
  }
  for (bool bf16 : {false, true}) {
    double ddp_s = 0;
    for (Mode mode : {Mode::kDataParallel, Mode::kZero1, Mode::kZero2}) {
      const Row row = run(world, a, mode, bf16);
      if (mode == Mode::kDataParallel) ddp_s = row.step_s;
      const ag::optim::TrainingMemory& m = row.memory;
      const double w = bf16 ? 2.0 : 4.0;  // bytes of a weight (and of its gradient)
      const double paper = mode == Mode::kDataParallel ? 16.0
                           : mode == Mode::kZero1      ? 2 * w + (16.0 - 2 * w) / n
                                                       : w + (16.0 - w) / n;
      if (world.rank() == 0) {
        std::printf("%-12s %-7s %9.1f %7.2fx %7.2f %6.2f %8.2f %8.2f %6.2f %11.2f %9.1f\n", bf16 ? "bf16+masters" : "fp32",
                    mode_name(mode), row.step_s * 1e3, row.step_s / ddp_s, m.per_parameter(m.parameters),
                    m.per_parameter(m.gradients), m.per_parameter(m.masters), m.per_parameter(m.optimizer_state),
                    m.per_parameter(m.training_state()), paper, static_cast<double>(m.peak) / (1 << 20));
      }
    }
  }
  dist::destroy_process_group();
  return 0;
}
