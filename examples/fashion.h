// The Fashion-MNIST classifier of examples/fashion_mnist: the data (data::load_mnist, flattened and
// normalised), the MLP, and its training and evaluation, shared with the tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ampgrad.h"

namespace ampgrad::fashion {

/// Where Debian's dataset-fashion-mnist package installs the four .gz files.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
/// What a data error adds: how to get the files.
inline constexpr const char* kDataHint =
    "hint: install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (./bazelw installs it), or pass "
    "--data DIR for a folder holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]";
/// The training images' mean and standard deviation (of pixel / 255), the usual normalisation.
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;

struct Dataset {
  Tensor images;  // float32 [N, 784]: (pixel / 255 - kPixelMean) / kPixelStd
  Tensor labels;  // int64 [N], classes 0..9
  int64_t size() const { return labels.numel(); }
};

/// A split from `dir` (its first max_samples images when >= 0). Errors from the files (missing,
/// truncated, corrupt, inconsistent) are rethrown with kDataHint appended.
Dataset load_dataset(const std::string& dir, data::MnistSplit split, int64_t max_samples = -1);

/// The MLP's sizes. The defaults are the example's model: 784-512-256-10.
struct MlpConfig {
  int64_t in_features = 784;
  std::vector<int64_t> hidden = {512, 256};
  int64_t classes = 10;
};

/// "784-512-256-10".
std::string describe(const MlpConfig& config);

/// Sequential{Linear(in, h0), ReLU, Linear(h0, h1), ReLU, ..., Linear(h_last, classes)}: its
/// state_dict names (0.weight, 0.bias, 2.weight, ...) are those of the same torch.nn.Sequential.
nn::Sequential make_mlp(const MlpConfig& config = {});

/// The CNN's widths. The defaults are the example's model: two conv-BN-ReLU-pool stages of 32 and
/// 64 channels, then a 128-wide hidden layer.
struct CnnConfig {
  std::vector<int64_t> channels = {32, 64};
  int64_t hidden = 128;
  int64_t classes = 10;
};

/// "conv32-conv64-fc128-10".
std::string describe(const CnnConfig& config);

/// Sequential{Unflatten(1, {1, 28, 28}), then per stage Conv2d(c_in, c, 3, padding 1, no bias),
/// BatchNorm2d(c), ReLU, MaxPool2d(2) (28 -> 14 -> 7 -> 3), then Flatten, Linear(c_last s s,
/// hidden), ReLU, Linear(hidden, classes)}: takes the datasets' flat [B, 784] images; state_dict names are
/// those of the same torch.nn.Sequential.
nn::Sequential make_cnn(const CnnConfig& config = {});

/// Which classifier an example trains.
enum class Model : uint8_t { kMlp, kCnn };

/// kAmp: FP16 autocast + GradScaler; kAmpBf16: BF16 autocast, no scaler (BF16's gradients do not
/// underflow); kFp8: the same with the linears' and convolutions' GEMMs in FP8 (Float8Guard, delayed scaling);
/// kBf16Params: the model stored in BF16 (BF16 autocast casts the FP32 images), no scaler, its
/// updates kept by FP32 masters or stochastic rounding (TrainOptions::master_weights).
enum class Precision : uint8_t { kFp32, kAmp, kAmpBf16, kFp8, kBf16Params };

/// The autocast dtype of an AMP precision (float32 for kFp32: no autocast).
DType autocast_dtype(Precision precision);
/// A CPU autocast guard for `precision`: disabled (and its dtype unused) for kFp32.
amp::AutocastGuard autocast_for(Precision precision);
/// A CPU Float8Guard (Transformer Engine's default recipe), enabled for kFp8 only.
amp::Float8Guard float8_for(Precision precision);
/// "FP32", "AMP (FP16 autocast + GradScaler)", "AMP (BF16 autocast, no scaler)", "FP8 ...".
const char* precision_name(Precision precision);
/// "FP32 masters", "stochastic rounding" or "no masters (round to nearest)".
const char* master_weights_name(optim::MasterWeights mode);

struct TrainOptions {
  Precision precision = Precision::kFp32;
  int64_t batch_size = 128;
  double lr = 1e-3;           // Adam's peak lr; a cosine schedule takes it to min_lr_factor * lr
  double min_lr_factor = 0.0;
  int64_t total_steps = 0;    // the schedule's length (> 0)
  // How kBf16Params updates its BF16 parameters (other precisions train FP32 parameters).
  optim::MasterWeights master_weights = optim::MasterWeights::kFp32;
};

/// The model with its Adam optimizer, cosine lr schedule and GradScaler (enabled for kAmp).
class Classifier {
 public:
  Classifier(nn::Sequential model, const TrainOptions& options);
  Classifier(const Classifier&) = delete;
  Classifier& operator=(const Classifier&) = delete;

  /// One optimizer step on x [B, 784], y int64 [B]: forward (under autocast for kAmp and kAmpBf16),
  /// cross_entropy, scaled backward, step (skipped on inf/NaN gradients), scale update, schedule.
  /// Returns the loss (FP32).
  float train_step(const Tensor& x, const Tensor& y);

  nn::Sequential model;
  optim::Adam optimizer;
  amp::GradScaler scaler;
  optim::CosineWithWarmupLR schedule;
  const TrainOptions options;
};

struct Evaluation {
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // fraction of argmax(logits) == label
};

/// The model on every sample of `data`, in eval mode and without grad (under the precision's
/// autocast, as it was trained); restores the training mode.
Evaluation evaluate(nn::Module& model, const Dataset& data, Precision precision, int64_t batch_size = 1000);

/// The samples of `data` in a random order (the global generator: manual_seed makes it
/// reproducible), as int64 index tensors of batch_size (the last one may be shorter).
std::vector<Tensor> shuffled_batches(int64_t size, int64_t batch_size);

/// data's rows at `indices` (int64 [B]): images [B, 784] and labels [B].
Dataset gather(const Dataset& data, const Tensor& indices);

/// One epoch of train_step over `data` in a random order; calls on_step(steps done in this epoch,
/// loss) after each step. Returns the mean training loss.
double train_epoch(Classifier& classifier, const Dataset& data,
                   const std::function<void(int64_t, float)>& on_step = nullptr);

/// The command line of the Fashion-MNIST examples: --amp[=fp16|bf16|fp8|bf16-params],
/// --master-weights=fp32|stochastic|none (with --amp=bf16-params), --model=mlp|cnn, --data DIR,
/// --epochs N, --batch-size N, --lr X, --train-samples N, --seed N, and where `outputs` is set
/// --plot DIR and --logdir DIR; each value as "--name VALUE" or "--name=VALUE" (--amp,
/// --master-weights and --model only with "=").
struct CommandLine {
  Precision precision = Precision::kFp32;
  optim::MasterWeights master_weights = optim::MasterWeights::kFp32;
  Model model = Model::kMlp;
  std::string data = kDefaultDataDir;
  int64_t epochs = 5;
  int64_t batch_size = 128;
  double lr = 1e-3;
  int64_t train_samples = -1;  // all
  uint64_t seed = 0;
  std::string plot;    // a folder for loss.png and scale.png
  std::string logdir;  // a TensorBoard log folder
};
enum class OutputFlags : bool { kNo, kYes };

/// Parses argv into `out`; false on a flag it does not know (--plot and --logdir without
/// `outputs`) or a missing value, and (after printing which flag and why) on a malformed value, a
/// count below 1, an lr that is not positive or a negative seed.
bool parse_command_line(int argc, char** argv, CommandLine& out, OutputFlags outputs);

}  // namespace ampgrad::fashion
