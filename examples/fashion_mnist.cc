// Trains an MLP (or with --model=cnn a CNN with batch norm) classifier on Fashion-MNIST in FP32,
// with FP16 autocast and a GradScaler (--amp),
// with BF16 autocast and no scaler (--amp=bf16), with FP8 GEMMs in BF16 autocast (--amp=fp8), or
// with BF16 parameters (--amp=bf16-params) kept by FP32 masters or stochastic rounding;
// prints the loss and test accuracy after each
// epoch (progress and times on stderr).
//   ./bazelw run //examples:fashion_mnist -- [--amp[=fp16|bf16|fp8|bf16-params]] [--master-weights=fp32|stochastic|none] [--model=mlp|cnn] [--data DIR] [--epochs N] [--train-samples N]
//       [--plot DIR] [--logdir DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "examples/fashion.h"
#include "examples/training_plots.h"

namespace ag = ampgrad;
namespace fm = ampgrad::fashion;

namespace {

constexpr const char* kUsage =
    "usage: fashion_mnist [--amp[=fp16|bf16|fp8|bf16-params]] [--master-weights=fp32|stochastic|none] [--model=mlp|cnn] [--data DIR] [--epochs N] [--batch-size N] [--lr X] [--train-samples N] "
    "[--seed N] [--plot DIR] [--logdir DIR]\n"
    "  --amp, --amp=fp16 FP16 autocast + GradScaler (default: FP32)\n"
    "  --amp=bf16        BF16 autocast, no GradScaler\n"
    "  --amp=fp8         BF16 autocast with the linears' and convolutions' GEMMs in FP8 (delayed scaling), no GradScaler\n"
    "  --amp=bf16-params the model stored in BF16, no GradScaler; its updates kept by\n"
    "  --master-weights=fp32 (FP32 masters, the default), =stochastic (stochastic rounding, no masters)\n"
    "                    or =none (no masters, round to nearest: small updates are lost)\n"
    "  --model=cnn       a CNN (two conv-BN-ReLU-pool stages; default: --model=mlp, 784-512-256-10)\n"
    "  --data DIR        the folder of {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]\n"
    "                    (default /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist)\n"
    "  --train-samples N train on the first N training images only\n"
    "  --plot DIR        draw loss.png (and with --amp scale.png) into DIR (needs gnuplot)\n"
    "  --logdir DIR      TensorBoard scalars; with --amp also gradient statistics every 100 steps\n";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  fm::CommandLine args;
  if (!fm::parse_command_line(argc, argv, args, fm::OutputFlags::kYes)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    ag::manual_seed(args.seed);
    const fm::Dataset train = fm::load_dataset(args.data, ag::data::MnistSplit::kTrain, args.train_samples);
    const fm::Dataset test = fm::load_dataset(args.data, ag::data::MnistSplit::kTest);
    const int64_t steps_per_epoch = (train.size() + args.batch_size - 1) / args.batch_size;
    const fm::Precision precision = args.precision;
    const bool scaled = precision == fm::Precision::kAmp;  // the loss scale and skipped steps are worth printing
    const fm::MlpConfig mlp;
    const fm::CnnConfig cnn;
    const bool is_cnn = args.model == fm::Model::kCnn;
    fm::Classifier classifier(is_cnn ? fm::make_cnn(cnn) : fm::make_mlp(mlp), {.precision = precision,
                                               .batch_size = args.batch_size,
                                               .lr = args.lr,
                                               .total_steps = steps_per_epoch * args.epochs,
                                               .master_weights = args.master_weights});
    int64_t parameters = 0;
    for (const ag::Tensor& p : classifier.model.parameters()) parameters += p.numel();
    const std::string precision_text =
        std::string(fm::precision_name(precision)) +
        (precision == fm::Precision::kBf16Params ? std::string(", ") + fm::master_weights_name(args.master_weights) : "");
    std::printf("Fashion-MNIST, %s %s (%lld parameters), %s\n", is_cnn ? "CNN" : "MLP",
                is_cnn ? fm::describe(cnn).c_str() : fm::describe(mlp).c_str(),
                static_cast<long long>(parameters), precision_text.c_str());
    std::printf("Adam lr %g with a cosine decay, batch %lld, %lld epochs; %lld training and %lld test images\n",
                args.lr, static_cast<long long>(args.batch_size), static_cast<long long>(args.epochs),
                static_cast<long long>(train.size()), static_cast<long long>(test.size()));
    std::fflush(stdout);

    std::unique_ptr<ag::utils::SummaryWriter> writer;
    if (!args.logdir.empty()) {
      writer = std::make_unique<ag::utils::SummaryWriter>(args.logdir);
      if (scaled) {
        classifier.scaler.set_parameter_names(classifier.model.named_parameters());
        classifier.scaler.set_grad_stats_interval(100);
      }
    }
    training_plots::Curves curves{.title = std::string("fashion_mnist, ") + fm::precision_name(precision),
                                  .first_step = 1};
    ag::utils::ProgressLine progress(steps_per_epoch * args.epochs, std::cerr);
    int64_t last_skip_reported = -1;
    fm::Evaluation result;
    for (int64_t epoch = 1; epoch <= args.epochs; ++epoch) {
      const auto epoch_start = std::chrono::steady_clock::now();
      const double train_loss = fm::train_epoch(classifier, train, [&](int64_t step, float loss) {
        ag::utils::ProgressFields fields = {{"epoch", static_cast<double>(epoch)}, {"loss", loss}};
        if (scaled) fields.emplace_back("scale", classifier.scaler.get_scale());
        const int64_t global_step = (epoch - 1) * steps_per_epoch + step;
        progress.update(global_step, fields);
        if (const ag::amp::SkipReport* skip = classifier.scaler.last_skip();
            skip != nullptr && skip->iteration != last_skip_reported) {
          last_skip_reported = skip->iteration;
          progress.finish();
          std::fprintf(stderr, "%s\n", skip->to_string().c_str());
        }
        curves.train_loss.push_back(loss);
        if (scaled) curves.scale.push_back(classifier.scaler.get_scale());
        if (writer) {
          writer->add_scalar("loss/train", loss, global_step);
          if (scaled) writer->add_scalar("amp/scale", classifier.scaler.get_scale(), global_step);
          const ag::amp::GradStatsReport* stats = classifier.scaler.grad_stats();
          if (stats != nullptr && stats->iteration == classifier.scaler.iteration() - 1) {
            ag::amp::add_grad_stats(*writer, *stats, global_step);
          }
        }
      });
      result = fm::evaluate(classifier.model, test, precision);
      if (writer) {
        writer->add_scalar("loss/test", result.loss, epoch * steps_per_epoch);
        writer->add_scalar("accuracy/test", result.accuracy, epoch * steps_per_epoch);
      }
      std::fprintf(stderr, "epoch %lld took %.1f s\n", static_cast<long long>(epoch), seconds_since(epoch_start));
      std::printf("epoch %lld/%lld  train loss %.4f  test loss %.4f  test accuracy %.2f%%", static_cast<long long>(epoch),
                  static_cast<long long>(args.epochs), train_loss, result.loss, 100 * result.accuracy);
      if (scaled) {
        std::printf("  scale %g  skipped steps %lld", classifier.scaler.get_scale(),
                    static_cast<long long>(epoch * steps_per_epoch - classifier.optimizer.steps_taken()));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    if (!args.plot.empty()) {
      for (const std::string& path : training_plots::write(curves, args.plot)) std::printf("wrote %s\n", path.c_str());
    }
    const std::string short_name = precision == fm::Precision::kFp32  ? "FP32"
                                   : scaled                           ? "FP16 AMP"
                                   : precision == fm::Precision::kFp8 ? "FP8"
                                   : precision == fm::Precision::kBf16Params
                                       ? std::string("BF16 params, ") + fm::master_weights_name(args.master_weights)
                                       : "BF16 AMP";
    std::printf("final test accuracy %.2f%% (%s, %lld epochs)\n", 100 * result.accuracy, short_name.c_str(),
                static_cast<long long>(args.epochs));
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "wall time %.1f s\n", seconds_since(start));
  return 0;
}
