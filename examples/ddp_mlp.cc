// Data-parallel training of a small MLP on y = sin(x1) + x2^2, one process per rank:
//   mpirun -np 2 bazel-bin/examples/ddp_mlp [--amp] [--accumulate=N] [--epochs=N]
//          [--checkpoint=PATH] [--resume=PATH] [--device=cuda]
// Each rank trains on its own shard (DistributedSampler); DistributedDataParallel averages the
// gradients; the GradScaler's skip decisions agree across ranks; rank 0 prints and checkpoints.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ampgrad_distributed.h"
#include "examples/flags.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;

namespace {

struct Args {
  bool amp = false;
  int accumulate = 1;
  int epochs = 5;
  std::string checkpoint, resume;
  ag::Device device = ag::Device::kCPU;
};

bool parse(int argc, char** argv, Args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* prefix) { return a.substr(std::strlen(prefix)); };
    if (a == "--amp") {
      args.amp = true;
    } else if (a.rfind("--accumulate=", 0) == 0 || a.rfind("--epochs=", 0) == 0) {
      const bool accumulate = a[2] == 'a';
      try {
        const int64_t n = ag::examples::parse_count(accumulate ? "--accumulate" : "--epochs",
                                                    value(accumulate ? "--accumulate=" : "--epochs="));
        (accumulate ? args.accumulate : args.epochs) = static_cast<int>(std::min<int64_t>(n, 1 << 30));
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
        return false;
      }
    } else if (a.rfind("--checkpoint=", 0) == 0) {
      args.checkpoint = value("--checkpoint=");
    } else if (a.rfind("--resume=", 0) == 0) {
      args.resume = value("--resume=");
    } else if (a == "--device=cuda") {
      args.device = ag::Device::kCUDA;
    } else if (a != "--device=cpu") {
      return false;
    }
  }
  return true;
}

// The data set, the same on every rank: n points uniform in [-2, 2]^2 and their targets.
struct Data {
  std::vector<float> x, y;
};

Data make_data(int64_t n) {
  ag::manual_seed(42);
  Data d;
  d.x = ag::uniform({n, 2}, -2.0, 2.0).to_vector();
  for (int64_t i = 0; i < n; ++i) d.y.push_back(std::sin(d.x[2 * i]) + d.x[2 * i + 1] * d.x[2 * i + 1]);
  return d;
}

// Rows `indices[begin, begin + count)` of the data set, on `device`.
void gather(const Data& d, const std::vector<int64_t>& indices, size_t begin, size_t count, ag::Device device,
            ag::Tensor& x, ag::Tensor& y) {
  std::vector<float> xs, ys;
  for (size_t k = begin; k < begin + count; ++k) {
    const int64_t i = indices[k];
    xs.insert(xs.end(), {d.x[2 * i], d.x[2 * i + 1]});
    ys.push_back(d.y[i]);
  }
  x = ag::Tensor::from_vector(xs, {static_cast<int64_t>(count), 2}).to(device);
  y = ag::Tensor::from_vector(ys, {static_cast<int64_t>(count), 1}).to(device);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) {
    std::fprintf(stderr, "usage: mpirun -np N %s [--amp] [--accumulate=N] [--epochs=N] [--checkpoint=PATH] "
                         "[--resume=PATH] [--device=cpu|cuda]\n", argv[0]);
    return 2;
  }
  int rank = -1;
  try {
    dist::ProcessGroup& world =
        dist::init_process_group(args.device == ag::Device::kCUDA ? dist::Backend::kNCCL : dist::Backend::kMPI);
    rank = world.rank();
    const Data data = make_data(8192);
    ag::manual_seed(1234 + rank);  // each rank its own init: the wrapper broadcasts rank 0's
    ag::nn::Sequential model{ag::nn::Linear(2, 64), ag::nn::ReLU(), ag::nn::Linear(64, 64), ag::nn::ReLU(),
                             ag::nn::Linear(64, 1)};
    model.to(args.device);
    dist::DistributedDataParallel ddp(model, world);
    ag::optim::Adam opt(model.parameters(), {.lr = 3e-3});
    ag::amp::GradScaler scaler({.enabled = args.amp});
    dist::DistributedSampler sampler(static_cast<int64_t>(data.y.size()), world, {.seed = 7});

    int first_epoch = 0;
    if (!args.resume.empty()) {
      // The inner model, so that the file has PyTorch's plain names ("0.weight", not "module.0.weight").
      ag::checkpoint::TrainingState state{.model = &model, .optimizer = &opt, .scaler = &scaler};
      dist::load_checkpoint(args.resume, state, world);
      first_epoch = std::stoi(state.user_metadata.at("epoch"));
    }
    if (rank == 0) {
      std::printf("%d ranks (%s), %s, %d micro-batch(es) per step, %lld samples per rank per epoch, %lld buckets\n",
                  world.size(), std::string(dist::backend_name(world.backend())).c_str(),
                  args.amp ? "fp16 autocast + GradScaler" : "fp32", args.accumulate,
                  static_cast<long long>(sampler.size()), static_cast<long long>(ddp.stats().buckets));
    }

    const size_t batch = 64;  // per rank and step, split into `accumulate` micro-batches
    const size_t micro = batch / static_cast<size_t>(args.accumulate);
    for (int epoch = first_epoch; epoch < first_epoch + args.epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      const double waited_before = ddp.stats().total_wait_seconds;
      sampler.set_epoch(epoch);
      const std::vector<int64_t> indices = sampler.indices();
      double loss_sum = 0.0;
      int steps = 0, skipped = 0;
      for (size_t begin = 0; begin + batch <= indices.size(); begin += batch, ++steps) {
        opt.zero_grad();
        for (int m = 0; m < args.accumulate; ++m) {
          // All micro-batches but the last accumulate locally; the last one's backward averages.
          std::optional<dist::DistributedDataParallel::NoSyncGuard> no_sync;
          if (m + 1 < args.accumulate) no_sync.emplace(ddp);
          ag::Tensor x, y, loss;
          gather(data, indices, begin + m * micro, micro, args.device, x, y);
          {
            ag::amp::AutocastGuard autocast(args.device, ag::DType::kFloat16, args.amp);
            loss = ag::ops::mse_loss(ddp(x), y);
          }
          loss_sum += loss.item() / args.accumulate;
          scaler.scale(ag::ops::scale(loss, 1.0 / args.accumulate)).backward();
        }
        skipped += scaler.step(opt) ? 0 : 1;
        scaler.update();
      }
      // The mean training loss over every rank's shard.
      ag::Tensor mean = ag::Tensor::from_vector(std::vector<float>{static_cast<float>(loss_sum / steps)}, {1})
                            .to(args.device);
      world.all_reduce(mean, dist::ReduceOp::kAvg);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rank == 0) {
        std::printf("epoch %d  loss %.5f  steps %d  skipped %d  scale %g  %.2f s (waited %.1f ms for gradients)\n",
                    epoch, mean.item(), steps, skipped, scaler.get_scale(), seconds,
                    1e3 * (ddp.stats().total_wait_seconds - waited_before));
      }
      if (!args.checkpoint.empty()) {
        dist::save_checkpoint(args.checkpoint,
                              {.model = &model, .optimizer = &opt, .scaler = &scaler,
                               .user_metadata = {{"epoch", std::to_string(epoch + 1)}}},
                              world);
      }
    }
    // The replicas never drift: every rank holds the same bits (checked here for the reader).
    std::string bytes;
    for (const ag::Tensor& p : model.parameters()) {
      const ag::Tensor host = p.to(ag::Device::kCPU);
      bytes.append(static_cast<const char*>(host.data_ptr()), host.numel() * ag::element_size(host.dtype()));
    }
    const std::vector<std::string> all = world.all_gather_bytes(bytes);
    bool identical = true;
    for (const std::string& other : all) identical = identical && other == all[0];
    if (rank == 0) std::printf("parameters identical on all %d ranks: %s\n", world.size(), identical ? "yes" : "NO");
  } catch (const ag::Error& e) {
    // No destroy_process_group() here: exiting without MPI_Finalize makes mpirun end the whole job
    // at once, instead of the other ranks waiting out their timeout.
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 1;
  }
  dist::destroy_process_group();
  return 0;
}
