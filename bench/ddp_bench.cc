// Data-parallel step time split into compute and communication, and the overlap achieved:
//   mpirun -np N bazel-bin/bench/ddp_bench [--width=1024] [--layers=4] [--batch=64] [--steps=20]
//                                          [--bucket_mb=25] [--first_bucket_mb=1]
// For each precision (fp32, fp16 autocast with fp32 parameters, fp16 parameters) it times, per
// step and as the slowest rank sees it: compute alone (no reduction), the bucket all-reduces
// alone, the step with every bucket reduced after backward (no overlap) and with overlap, and how
// long each of those two waited for communication at the end of backward; "hidden" is the share
// of that wait overlap removed. It also prints the gradient bytes all-reduced per step against
// the fp32 bytes of the same parameters.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ampgrad_distributed.h"
#include "bench/rank_timing.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
using ampgrad::bench::slowest_median;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int64_t width = 1024, layers = 4, batch = 64;
  int steps = 20;
  double bucket_mb = 25, first_bucket_mb = 1;
};

enum class Precision { kFloat32, kAutocast, kFloat16Parameters };
const char* precision_name(Precision p) {
  return p == Precision::kFloat32 ? "fp32" : p == Precision::kAutocast ? "fp16 autocast" : "fp16 params";
}

struct Model {
  ag::nn::Sequential net;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<ag::optim::Adam> opt;
  ag::amp::GradScaler scaler;
};

std::unique_ptr<Model> build(dist::ProcessGroup& world, const Args& a, Precision precision, bool overlap) {
  auto m = std::make_unique<Model>();
  ag::manual_seed(1);
  for (int64_t l = 0; l < a.layers; ++l) {
    m->net.push_back(ag::nn::Linear(a.width, a.width));
    m->net.push_back(ag::nn::ReLU());
  }
  m->net.push_back(ag::nn::Linear(a.width, 10));
  if (precision == Precision::kFloat16Parameters) m->net.to(ag::DType::kFloat16);
  m->ddp = std::make_unique<dist::DistributedDataParallel>(
      m->net, world,
      dist::DataParallelOptions{.bucket_cap_mb = a.bucket_mb, .first_bucket_cap_mb = a.first_bucket_mb,
                                .overlap = overlap});
  m->opt = std::make_unique<ag::optim::Adam>(m->net.parameters(), ag::optim::AdamOptions{.lr = 1e-4});
  m->scaler = ag::amp::GradScaler({.init_scale = 1024, .enabled = precision != Precision::kFloat32});
  return m;
}

// One training step; `sync` false runs it under no_sync() (compute alone).
void step(Model& m, const ag::Tensor& x, const ag::Tensor& y, Precision precision, bool sync) {
  std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
  if (!sync) no_sync.emplace(*m.ddp);
  m.opt->zero_grad();
  ag::Tensor loss;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, ag::DType::kFloat16, precision != Precision::kFloat32);
    loss = ag::ops::mse_loss((*m.ddp)(x).to(ag::DType::kFloat32), y);
  }
  m.scaler.scale(loss).backward();
  m.scaler.step(*m.opt);
  m.scaler.update();
}

// The all-reduces DDP issues for this model, alone: one flat tensor per bucket.
std::vector<ag::Tensor> bucket_tensors(const Args& a, ag::nn::Module& net) {
  std::vector<dist::BucketParam> params;
  for (const ag::Tensor& p : net.parameters()) {
    params.push_back({.bytes = p.numel() * static_cast<int64_t>(ag::element_size(p.dtype())), .dtype = p.dtype(),
                      .device = p.device()});
  }
  const double mib = 1024.0 * 1024.0;
  std::vector<ag::Tensor> out;
  for (const auto& bucket : dist::assign_buckets(params, static_cast<int64_t>(a.first_bucket_mb * mib),
                                                 static_cast<int64_t>(a.bucket_mb * mib))) {
    int64_t bytes = 0;
    for (size_t i : bucket) bytes += params[i].bytes;
    const ag::DType dtype = params[bucket.front()].dtype;
    out.push_back(ag::zeros({bytes / static_cast<int64_t>(ag::element_size(dtype))}, dtype));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto num = [&](const char* prefix) { return std::stod(arg.substr(std::strlen(prefix))); };
    if (arg.rfind("--width=", 0) == 0) a.width = static_cast<int64_t>(num("--width="));
    else if (arg.rfind("--layers=", 0) == 0) a.layers = static_cast<int64_t>(num("--layers="));
    else if (arg.rfind("--batch=", 0) == 0) a.batch = static_cast<int64_t>(num("--batch="));
    else if (arg.rfind("--steps=", 0) == 0) a.steps = static_cast<int>(num("--steps="));
    else if (arg.rfind("--bucket_mb=", 0) == 0) a.bucket_mb = num("--bucket_mb=");
    else if (arg.rfind("--first_bucket_mb=", 0) == 0) a.first_bucket_mb = num("--first_bucket_mb=");
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  try {
    dist::ProcessGroup& world = dist::init_process_group();
    // The machine's cores shared among the ranks on it (mpirun starts them all here).
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ag::set_num_threads(std::max(1, cores / world.size()));
    ag::manual_seed(100 + world.rank());
    const ag::Tensor x = ag::randn({a.batch, a.width}), y = ag::randn({a.batch, 10});
    if (world.rank() == 0) {
      std::printf("ranks %d, %d thread(s) per rank, MLP %lld x (%lld -> %lld) -> 10, batch %lld per rank, %d steps\n",
                  world.size(), ag::num_threads(), static_cast<long long>(a.layers), static_cast<long long>(a.width),
                  static_cast<long long>(a.width), static_cast<long long>(a.batch), a.steps);
      std::printf("%-14s %7s %9s %9s %9s %9s %9s %9s %7s %11s %11s\n", "precision", "buckets", "compute",
                  "comm", "step", "step", "wait", "wait", "hidden", "bytes/step", "fp32 bytes");
      std::printf("%-14s %7s %9s %9s %9s %9s %9s %9s %7s %11s %11s\n", "", "", "alone", "alone", "serial",
                  "overlap", "serial", "overlap", "", "", "");
    }
    for (Precision precision : {Precision::kFloat32, Precision::kAutocast, Precision::kFloat16Parameters}) {
      std::unique_ptr<Model> with = build(world, a, precision, true), without = build(world, a, precision, false);
      std::vector<ag::Tensor> buckets = bucket_tensors(a, with->net);
      std::vector<double> compute, comm, serial, overlapped, wait_serial, wait_overlapped;
      for (int s = -3; s < a.steps; ++s) {  // 3 warm-up steps
        // Interleaved, so a slow spell of the machine hits every variant alike.
        world.barrier();
        auto t0 = Clock::now();
        step(*with, x, y, precision, false);
        auto t1 = Clock::now();
        world.barrier();
        auto t2 = Clock::now();
        std::vector<std::shared_ptr<dist::Work>> works;
        for (ag::Tensor& b : buckets) works.push_back(world.all_reduce_async(b, dist::ReduceOp::kAvg,
                                                                             dist::CheckAcrossRanks::kNo));
        for (auto& w : works) w->wait();
        auto t3 = Clock::now();
        world.barrier();
        auto t4 = Clock::now();
        step(*without, x, y, precision, true);
        auto t5 = Clock::now();
        world.barrier();
        auto t6 = Clock::now();
        step(*with, x, y, precision, true);
        auto t7 = Clock::now();
        if (s < 0) continue;
        const auto sec = [](Clock::time_point p, Clock::time_point q) { return std::chrono::duration<double>(q - p).count(); };
        compute.push_back(sec(t0, t1));
        comm.push_back(sec(t2, t3));
        serial.push_back(sec(t4, t5));
        overlapped.push_back(sec(t6, t7));
        wait_serial.push_back(without->ddp->stats().last_wait_seconds);
        wait_overlapped.push_back(with->ddp->stats().last_wait_seconds);
      }
      const double c = slowest_median(world, compute), m = slowest_median(world, comm),
                   se = slowest_median(world, serial), ov = slowest_median(world, overlapped),
                   ws = slowest_median(world, wait_serial), wo = slowest_median(world, wait_overlapped);
      const double hidden = ws > 0 ? 1.0 - wo / ws : 0.0;
      const dist::DataParallelStats& st = with->ddp->stats();
      if (world.rank() == 0) {
        std::printf("%-14s %7lld %7.1fms %7.1fms %7.1fms %7.1fms %7.1fms %7.1fms %6.0f%% %11lld %11lld\n",
                    precision_name(precision), static_cast<long long>(st.buckets), 1e3 * c, 1e3 * m, 1e3 * se,
                    1e3 * ov, 1e3 * ws, 1e3 * wo, 100 * hidden, static_cast<long long>(st.bytes_per_sync),
                    static_cast<long long>(4 * st.parameters));
      }
    }
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  dist::destroy_process_group();
  return 0;
}
