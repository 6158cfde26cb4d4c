// The training-step workloads shared by train_bench and step_timer (and mirrored in
// pytorch_workloads.py): zero_grad, forward, loss, backward, step.
//   seed: Linear(10, 1), MSE, Adam, batch 64;   mlp: 784-1024-1024-10 with ReLU, batch 256;
//   fashion: examples/fashion_mnist's 784-512-256-10 classifier, cross_entropy, Adam, batch 128;
//     fashion_cnn: its --model=cnn (two conv-BN-ReLU-pool stages of 32 and 64 channels, fc 128);
//   gpt: examples/char_gpt's step (4 layers, width 128, context 64, batch 16, AdamW, clipping);
//   cuda_bench also runs it on the GPU, and at kGptLarge's size.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "ampgrad.h"
#include "examples/char_gpt_train.h"
#include "examples/fashion.h"

namespace ampgrad::bench {

/// kAmp: FP16 autocast with a GradScaler. kAmpBf16: BF16 autocast without one (BF16's recipe).
enum class Precision { kFp32, kAmp, kAmpBf16, kFp8 };  // kFp8: FP8 linears (delayed scaling) in BF16 autocast
enum class Optim { kSgd, kAdam };

/// A training step to time.
struct Steppable {
  virtual ~Steppable() = default;
  virtual void step() = 0;
};

struct Workload : Steppable {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  amp::GradScaler scaler;
  DType autocast_dtype;
  bool autocast;
  bool fp8;  // the GEMMs of linear and conv2d in FP8 (a Float8Guard inside the autocast)
  Device device;
  Tensor x, y;
  Tensor labels;  // int64 [batch]: the loss is cross_entropy(model(x), labels) instead of MSE
  Tensor loss;    // the last step's

  /// x is [batch, in], y is [batch, out], both N(0, 1); SGD has momentum 0.9; lr 1e-3.
  /// param_dtype kFloat16 (kBFloat16) gives 16-bit parameters with FP32 masters in the optimizer.
  /// Model and data live on `device`.
  Workload(std::unique_ptr<nn::Sequential> m, Precision precision, int64_t batch, int64_t in, int64_t out,
           Optim optimizer, DType param_dtype = DType::kFloat32, Device on = Device::kCPU)
      : model(std::move(m)),
        scaler({.enabled = precision == Precision::kAmp}),
        autocast_dtype(precision == Precision::kAmpBf16 || precision == Precision::kFp8 ? DType::kBFloat16
                                                                                        : DType::kFloat16),
        autocast(precision != Precision::kFp32),
        fp8(precision == Precision::kFp8),
        device(on) {
    model->to(param_dtype);
    model->to(device);
    if (optimizer == Optim::kAdam) {
      opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-3});
    } else {
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
    }
    x = randn({batch, in}).to(device);
    y = randn({batch, out}).to(device);
  }

  void step() override {
    opt->zero_grad();
    {
      amp::AutocastGuard guard(device, autocast_dtype, autocast);
      amp::Float8Guard float8(device, {}, fp8);
      loss = labels.defined() ? ops::cross_entropy((*model)(x), labels) : ops::mse_loss((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
  }
};

inline Workload seed_workload(Precision precision) {
  manual_seed(0);
  return Workload(std::make_unique<nn::Sequential>(nn::Linear(10, 1)), precision, 64, 10, 1, Optim::kAdam);
}

inline Workload mlp_workload(Precision precision, Optim optimizer, DType param_dtype = DType::kFloat32) {
  manual_seed(0);
  return Workload(std::make_unique<nn::Sequential>(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024),
                                                   nn::ReLU(), nn::Linear(1024, 10)),
                  precision, 256, 784, 10, optimizer, param_dtype);
}

/// The example's training step on random normalised-image-like inputs and labels (the data's
/// values do not change the time). Adam lr 1e-3, as the example (whose cosine schedule only sets lr).
/// With fashion::Model::kCnn, the example's CNN (--model=cnn) instead of the MLP.
inline Workload fashion_workload(Precision precision, fashion::Model model = fashion::Model::kMlp,
                                 Device device = Device::kCPU) {
  manual_seed(0);
  constexpr int64_t kBatch = 128;
  Workload w(std::make_unique<nn::Sequential>(model == fashion::Model::kCnn ? fashion::make_cnn() : fashion::make_mlp()),
             precision, kBatch, 784, 10, Optim::kAdam, DType::kFloat32, device);
  std::vector<int64_t> labels(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) labels[i] = (i * 7) % 10;
  w.labels = Tensor::from_vector(labels, {kBatch}).to(device);
  return w;
}

/// A GPT step's sizes. The default is examples/char_gpt's.
struct GptShape {
  int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64, batch = 16;
  int64_t vocab_size = 114;  ///< the fortunes text's characters
  bool checkpoint_activations = false;  ///< each block recomputed in the backward
};
/// A size that fills a GPU better: nanoGPT's Shakespeare-char configuration (10.8M parameters,
/// 16384 tokens a step).
inline constexpr GptShape kGptLarge{.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256, .batch = 64};
/// GPT-2 small's shape (124M parameters with the vocabulary padded to 50304, as nanoGPT's), at
/// T = 256 and batch 2: a CPU step where the memory traffic of large tensors shows.
inline constexpr GptShape kGpt2Small{
    .n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 256, .batch = 2, .vocab_size = 50304};
/// The same at T = 1024, batch 1: the long-context CPU step (attention's share grows with T).
inline constexpr GptShape kGpt2Small1024{
    .n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024, .batch = 1, .vocab_size = 50304};
/// nanoGPT's Shakespeare-char model (kGptLarge) at batch 8: the small CPU step, 2048 tokens.
inline constexpr GptShape kGpt6Layer{.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256, .batch = 8};

/// examples/char_gpt's own training step (char_gpt::train_step: its model, AdamW groups,
/// clip_grad_norm_ after unscale_, GradScaler) on `device`, on one fixed batch of random characters
/// from the shape's vocabulary (by default 114 characters, the size of the fortunes text's).
struct GptWorkload : Steppable {
  char_gpt::TrainOptions options;
  gpt::GPT model;
  optim::AdamW opt;
  amp::GradScaler scaler;
  Tensor x, y;
  Tensor loss;  // the last step's, on `device`

  explicit GptWorkload(Precision precision, const GptShape& shape = {}, Device device = Device::kCPU)
      : options(make_options(precision, shape, device)),
        model((manual_seed(0), options.model)),
        opt(char_gpt::make_optimizer(moved(model, device), options)),
        scaler({.enabled = precision == Precision::kAmp}) {
    // Room for one window more than the batch: batch_for_step draws each window's start.
    std::vector<int64_t> ids(static_cast<size_t>((options.batch_size + 1) * options.model.block_size + 1));
    uint64_t state = 1;
    for (int64_t& id : ids) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      id = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(options.model.vocab_size));
    }
    std::tie(x, y) = char_gpt::to_device(char_gpt::batch_for_step(ids, options, 0), device);
  }

  void step() override {
    bool stepped = false;
    loss = char_gpt::train_step(model, opt, scaler, x, y, options, stepped).detach();
  }

  static gpt::GPT& moved(gpt::GPT& model, Device device) {
    model.to(device);
    return model;
  }

  static char_gpt::TrainOptions make_options(Precision precision, const GptShape& shape, Device device) {
    char_gpt::TrainOptions o;
    o.model = {.vocab_size = shape.vocab_size, .block_size = shape.block_size, .n_layer = shape.n_layer, .n_head = shape.n_head,
               .n_embd = shape.n_embd, .checkpoint_activations = shape.checkpoint_activations};
    o.batch_size = shape.batch;
    o.device = device;
    o.precision = precision == Precision::kAmp       ? char_gpt::Precision::kFloat16Amp
                  : precision == Precision::kAmpBf16 ? char_gpt::Precision::kBFloat16Amp
                  : precision == Precision::kFp8     ? char_gpt::Precision::kFp8
                                                     : char_gpt::Precision::kFloat32;
    return o;
  }
};

}  // namespace ampgrad::bench
