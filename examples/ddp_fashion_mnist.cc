// The Fashion-MNIST classifier of examples/fashion_mnist trained data-parallel, one process per rank:
//   mpirun -np 2 bazel-bin/examples/ddp_fashion_mnist [--amp[=fp16|bf16|bf16-params]] [--master-weights=fp32|stochastic|none] [--model=mlp|cnn] [--data DIR] [--epochs N]
//          [--batch-size N] [--lr X] [--train-samples N] [--seed N]
// --batch-size is the global batch: each rank takes batch-size / ranks samples of its own shard
// (DistributedSampler) per step, so the run follows the single-process one step for step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ampgrad_distributed.h"
#include "examples/fashion.h"

namespace ag = ampgrad;
namespace dist = ampgrad::distributed;
namespace fm = ampgrad::fashion;

namespace {

constexpr const char* kUsage =
    "usage: mpirun -np N ddp_fashion_mnist [--amp[=fp16|bf16|bf16-params]] [--master-weights=fp32|stochastic|none] [--model=mlp|cnn] [--data DIR] [--epochs N] [--batch-size N]\n"
    "                                      [--lr X] [--train-samples N] [--seed N]\n"
    "  --amp, --amp=fp16 FP16 autocast + GradScaler (default: FP32)\n"
    "  --amp=bf16        BF16 autocast, no GradScaler\n"
    "  --amp=bf16-params the model stored in BF16, no GradScaler; --master-weights=stochastic rounds its\n"
    "                    updates stochastically instead of keeping FP32 masters (=none: round to nearest)\n"
    "  --model=cnn       the CNN with batch norm (rank 0's running statistics broadcast each step)\n"
    "  --batch-size N    the global batch, split evenly over the ranks (default 128)\n"
    "  --data DIR        the folder of {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]\n"
    "                    (default /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist)\n"
    "  --train-samples N train on the first N training images only\n";

// Every rank's parameters, byte for byte, compared on all ranks.
bool replicas_identical(dist::ProcessGroup& world, ag::nn::Module& model) {
  std::string bytes;
  for (const ag::Tensor& p : model.parameters()) {
    bytes.append(static_cast<const char*>(p.data_ptr()), p.numel() * ag::element_size(p.dtype()));
  }
  const std::vector<std::string> all = world.all_gather_bytes(bytes);
  for (const std::string& other : all) {
    if (other != all[0]) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  fm::CommandLine args;
  if (!fm::parse_command_line(argc, argv, args, fm::OutputFlags::kNo)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  int rank = -1;
  try {
    dist::ProcessGroup& world = dist::init_process_group();
    rank = world.rank();
    AG_CHECK(args.batch_size % world.size() == 0, "ddp_fashion_mnist: --batch-size ", args.batch_size,
             " does not split evenly over ", world.size(), " ranks");
    const int64_t local_batch = args.batch_size / world.size();
    const auto start = std::chrono::steady_clock::now();

    // Every rank reads the whole data set and draws its own shard of it each epoch.
    const fm::Dataset train = fm::load_dataset(args.data, ag::data::MnistSplit::kTrain, args.train_samples);
    const fm::Dataset test = fm::load_dataset(args.data, ag::data::MnistSplit::kTest);
    dist::DistributedSampler sampler(train.size(), world, {.seed = args.seed, .drop_last = true});
    const int64_t steps_per_epoch = sampler.size() / local_batch;
    AG_CHECK(steps_per_epoch > 0, "ddp_fashion_mnist: ", train.size(), " training images give no full batch of ",
             args.batch_size);

    const fm::Precision precision = args.precision;
    const bool scaled = precision == fm::Precision::kAmp;  // the loss scale and skipped steps are worth printing
    ag::manual_seed(args.seed + static_cast<uint64_t>(rank));  // each its own init: the wrapper broadcasts rank 0's
    const bool is_cnn = args.model == fm::Model::kCnn;
    fm::Classifier classifier(is_cnn ? fm::make_cnn() : fm::make_mlp(), {.precision = precision,
                                               .batch_size = local_batch,
                                               .lr = args.lr,
                                               .total_steps = steps_per_epoch * args.epochs,
                                               .master_weights = args.master_weights});
    // Stochastic rounding's bits must be the same on every rank, or the replicas drift apart:
    // each rank drew its seed from its own generator, so give them one.
    classifier.optimizer.set_rounding_seed(args.seed);
    dist::DistributedDataParallel ddp(classifier.model, world);
    if (rank == 0) {
      std::printf("Fashion-MNIST, %s %s on %d ranks, %s; global batch %lld (%lld per rank), %lld steps per epoch\n",
                  is_cnn ? "CNN" : "MLP", is_cnn ? fm::describe(fm::CnnConfig{}).c_str() : fm::describe(fm::MlpConfig{}).c_str(),
                  world.size(), fm::precision_name(precision),
                  static_cast<long long>(args.batch_size), static_cast<long long>(local_batch),
                  static_cast<long long>(steps_per_epoch));
      std::fflush(stdout);
    }

    fm::Evaluation result;
    for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
      const auto epoch_start = std::chrono::steady_clock::now();
      sampler.set_epoch(epoch);
      const std::vector<int64_t> indices = sampler.indices();
      classifier.model.train();
      double loss_sum = 0;
      for (int64_t step = 0; step < steps_per_epoch; ++step) {
        const std::vector<int64_t> rows(indices.begin() + step * local_batch,
                                        indices.begin() + (step + 1) * local_batch);
        const fm::Dataset batch = fm::gather(train, ag::Tensor::from_vector(rows, {local_batch}));
        // Classifier::train_step's step, with the forward through the wrapper.
        classifier.optimizer.zero_grad();
        ag::Tensor loss;
        {
          const ag::amp::AutocastGuard autocast = fm::autocast_for(precision);
          const ag::amp::Float8Guard fp8 = fm::float8_for(precision);  // the wrapper reduces the amaxes
          loss = ag::ops::cross_entropy(ddp(batch.images), batch.labels);
        }
        classifier.scaler.scale(loss).backward();  // the gradients are the ranks' average here
        if (classifier.scaler.step(classifier.optimizer)) classifier.schedule.step();
        classifier.scaler.update();
        loss_sum += loss.item();
      }
      // The mean training loss over every rank's shard.
      ag::Tensor mean = ag::Tensor::from_vector(
          std::vector<float>{static_cast<float>(loss_sum / static_cast<double>(steps_per_epoch))}, {1});
      world.all_reduce(mean, dist::ReduceOp::kAvg);
      // Every rank holds the same model, so rank 0 alone evaluates it; in FP8 every rank does, since
      // an evaluation moves the weights' amax histories, which must stay alike on every rank.
      if (rank == 0 || precision == fm::Precision::kFp8) result = fm::evaluate(classifier.model, test, precision);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
      if (rank == 0) {
        std::printf("epoch %lld/%lld  train loss %.4f  test loss %.4f  test accuracy %.2f%%",
                    static_cast<long long>(epoch + 1), static_cast<long long>(args.epochs), mean.item(), result.loss,
                    100 * result.accuracy);
        if (scaled) {
          std::printf("  scale %g  skipped steps %lld", classifier.scaler.get_scale(),
                      static_cast<long long>((epoch + 1) * steps_per_epoch - classifier.optimizer.steps_taken()));
        }
        std::printf("  %.1f s\n", seconds);
        std::fflush(stdout);
      }
    }
    const bool identical = replicas_identical(world, classifier.model);
    if (rank == 0) {
      std::printf("parameters identical on all %d ranks: %s\n", world.size(), identical ? "yes" : "NO");
      std::printf("final test accuracy %.2f%% (%s, %d ranks, %lld epochs, %.1f s)\n", 100 * result.accuracy,
                  fm::precision_name(precision), world.size(), static_cast<long long>(args.epochs),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    AG_CHECK(identical, "ddp_fashion_mnist: the replicas' parameters differ after training");
  } catch (const ag::Error& e) {
    // No destroy_process_group(): exiting without MPI_Finalize makes mpirun end the whole job at once.
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 1;
  }
  dist::destroy_process_group();
  return 0;
}
