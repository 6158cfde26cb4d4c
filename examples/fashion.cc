// The Fashion-MNIST classifier (see fashion.h).
#include "examples/fashion.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

#include "examples/flags.h"

namespace ampgrad::fashion {

Dataset load_dataset(const std::string& dir, data::MnistSplit split, int64_t max_samples) {
  data::MnistData raw;
  try {
    raw = data::load_mnist(dir, split, {.max_samples = max_samples});
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "\n" + kDataHint);
  }
  const int64_t n = raw.labels.numel();
  const Tensor flat = ops::reshape(raw.images, {n, -1});
  AG_CHECK(flat.size(1) == 784, "fashion::load_dataset: images of ", raw.images.to_string(),
           " in ", dir, ", expected 28 x 28 pixels\n", kDataHint);
  return {.images = ops::scale(flat - kPixelMean, 1.0 / kPixelStd), .labels = raw.labels};
}

std::string describe(const MlpConfig& config) {
  std::string out = std::to_string(config.in_features);
  for (const int64_t h : config.hidden) out += "-" + std::to_string(h);
  return out + "-" + std::to_string(config.classes);
}

nn::Sequential make_mlp(const MlpConfig& config) {
  AG_CHECK(config.in_features > 0 && config.classes > 0, "fashion::make_mlp: in_features ", config.in_features,
           " and classes ", config.classes, " must be positive");
  nn::Sequential model;
  int64_t width = config.in_features;
  for (const int64_t h : config.hidden) {
    model.push_back(nn::Linear(width, h));
    model.push_back(nn::ReLU());
    width = h;
  }
  model.push_back(nn::Linear(width, config.classes));
  return model;
}

std::string describe(const CnnConfig& config) {
  std::string out;
  for (const int64_t c : config.channels) out += "conv" + std::to_string(c) + "-";
  return out + "fc" + std::to_string(config.hidden) + "-" + std::to_string(config.classes);
}

nn::Sequential make_cnn(const CnnConfig& config) {
  AG_CHECK(!config.channels.empty() && config.channels.size() <= 3 && config.hidden > 0 && config.classes > 0,
           "fashion::make_cnn: 1 to 3 stages and positive widths, got ", config.channels.size(), " stages");
  nn::Sequential model;
  model.push_back(nn::Unflatten(1, {1, 28, 28}));
  int64_t in = 1, side = 28;
  for (const int64_t c : config.channels) {
    // No bias before a batch norm: its mean subtraction would cancel it.
    model.push_back(nn::Conv2d(in, c, 3, {.padding = {1, 1}, .bias = nn::Bias::kNo}));
    model.push_back(nn::BatchNorm2d(c));
    model.push_back(nn::ReLU());
    model.push_back(nn::MaxPool2d(2));
    in = c;
    side /= 2;
  }
  model.push_back(nn::Flatten());
  model.push_back(nn::Linear(in * side * side, config.hidden));
  model.push_back(nn::ReLU());
  model.push_back(nn::Linear(config.hidden, config.classes));
  return model;
}

DType autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return DType::kFloat32;
    case Precision::kAmp: return DType::kFloat16;
    case Precision::kAmpBf16: return DType::kBFloat16;
    case Precision::kFp8: return DType::kBFloat16;
    case Precision::kBf16Params: return DType::kBFloat16;
  }
  return DType::kFloat32;
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "FP32";
    case Precision::kAmp: return "AMP (FP16 autocast + GradScaler)";
    case Precision::kAmpBf16: return "AMP (BF16 autocast, no scaler)";
    case Precision::kFp8: return "FP8 GEMMs (E4M3/E5M2, delayed scaling) in BF16 autocast, no scaler";
    case Precision::kBf16Params: return "BF16 parameters, no scaler";
  }
  return "?";
}

const char* master_weights_name(optim::MasterWeights mode) {
  switch (mode) {
    case optim::MasterWeights::kFp32: return "FP32 masters";
    case optim::MasterWeights::kStochasticRounding: return "stochastic rounding";
    case optim::MasterWeights::kNone: return "no masters (round to nearest)";
  }
  return "?";
}

amp::AutocastGuard autocast_for(Precision precision) {
  const bool amp = precision != Precision::kFp32;
  return amp::AutocastGuard(Device::kCPU, amp ? autocast_dtype(precision) : DType::kFloat16, amp);
}

amp::Float8Guard float8_for(Precision precision) {
  return amp::Float8Guard(Device::kCPU, {}, precision == Precision::kFp8);
}

namespace {
// The model in the dtype `precision` stores its parameters in (before the optimizer sees them).
nn::Sequential stored_for(nn::Sequential model, Precision precision) {
  if (precision == Precision::kBf16Params) model.to(DType::kBFloat16);
  return model;
}
}  // namespace

Classifier::Classifier(nn::Sequential m, const TrainOptions& opts)
    : model(stored_for(std::move(m), opts.precision)),
      optimizer(model.parameters(), {.lr = opts.lr}),
      scaler({.enabled = opts.precision == Precision::kAmp}),
      // No warmup: Adam's bias correction already keeps the first steps small.
      schedule(optimizer, {.warmup_steps = 0, .total_steps = opts.total_steps, .min_lr_factor = opts.min_lr_factor}),
      options(opts) {
  optimizer.set_master_weights(opts.master_weights);
}

float Classifier::train_step(const Tensor& x, const Tensor& y) {
  optimizer.zero_grad();
  Tensor loss;
  {
    const amp::AutocastGuard autocast = autocast_for(options.precision);
    const amp::Float8Guard fp8 = float8_for(options.precision);
    loss = ops::cross_entropy(model(x), y);  // 16-bit logits under autocast; cross_entropy runs in FP32
  }
  scaler.scale(loss).backward();
  // The schedule counts the steps taken, so a step skipped on overflow does not shorten it.
  if (scaler.step(optimizer)) schedule.step();
  scaler.update();
  return loss.item();
}

Evaluation evaluate(nn::Module& model, const Dataset& data, Precision precision, int64_t batch_size) {
  AG_CHECK(batch_size > 0 && data.size() > 0, "fashion::evaluate: batch_size ", batch_size, " and the data set's ",
           data.size(), " samples must be positive");
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size(); start += batch_size) {
    const int64_t n = std::min(batch_size, data.size() - start);
    const Tensor x = ops::narrow(data.images, 0, start, n), y = ops::narrow(data.labels, 0, start, n);
    Tensor logits;
    {
      const amp::AutocastGuard autocast = autocast_for(precision);
      const amp::Float8Guard fp8 = float8_for(precision);
      logits = model(x);
      loss_sum += ops::cross_entropy(logits, y, {.reduction = ops::Reduction::kSum}).item<double>();
    }
    const std::vector<int64_t> predicted = ops::argmax(logits, 1).to_vector<int64_t>();
    const std::vector<int64_t> labels = y.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) correct += predicted[i] == labels[i];
  }
  if (was_training) model.train();
  return {.loss = loss_sum / static_cast<double>(data.size()),
          .accuracy = static_cast<double>(correct) / static_cast<double>(data.size())};
}

std::vector<Tensor> shuffled_batches(int64_t size, int64_t batch_size) {
  AG_CHECK(size >= 0 && batch_size > 0, "fashion::shuffled_batches: size ", size, " must be >= 0 and batch_size ",
           batch_size, " positive");
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t i = size - 1; i > 0; --i) {  // Fisher-Yates from the global generator
    std::swap(order[i], order[random::next_u64() % static_cast<uint64_t>(i + 1)]);
  }
  std::vector<Tensor> batches;
  for (int64_t start = 0; start < size; start += batch_size) {
    const int64_t n = std::min(batch_size, size - start);
    batches.push_back(Tensor::from_vector(std::vector<int64_t>(order.begin() + start, order.begin() + start + n), {n}));
  }
  return batches;
}

Dataset gather(const Dataset& data, const Tensor& indices) {
  const std::vector<int64_t> rows = indices.to_vector<int64_t>();
  const int64_t* all_labels = data.labels.data<int64_t>();
  std::vector<int64_t> labels(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    AG_CHECK(rows[i] >= 0 && rows[i] < data.size(), "fashion::gather: index ", rows[i], " outside [0, ", data.size(), ")");
    labels[i] = all_labels[rows[i]];
  }
  // embedding(ids, table) picks rows of a 2-D table: index_select along dimension 0.
  return {.images = ops::embedding(indices, data.images),
          .labels = Tensor::from_vector(labels, {static_cast<int64_t>(labels.size())})};
}

double train_epoch(Classifier& classifier, const Dataset& data, const std::function<void(int64_t, float)>& on_step) {
  classifier.model.train();
  double loss_sum = 0;
  int64_t steps = 0;
  for (const Tensor& indices : shuffled_batches(data.size(), classifier.options.batch_size)) {
    const Dataset batch = gather(data, indices);
    const float loss = classifier.train_step(batch.images, batch.labels);
    loss_sum += loss;
    ++steps;
    if (on_step) on_step(steps, loss);
  }
  return steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0;
}

bool parse_command_line(int argc, char** argv, CommandLine& out, OutputFlags outputs) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg == "--model=mlp" || arg == "--model=cnn") {
      out.model = arg == "--model=cnn" ? Model::kCnn : Model::kMlp;
      continue;
    }
    if (arg == "--amp" || arg == "--amp=fp16" || arg == "--amp=bf16" || arg == "--amp=fp8" ||
        arg == "--amp=bf16-params") {
      out.precision = arg == "--amp=bf16"          ? Precision::kAmpBf16
                      : arg == "--amp=fp8"         ? Precision::kFp8
                      : arg == "--amp=bf16-params" ? Precision::kBf16Params
                                                   : Precision::kAmp;
      continue;
    }
    if (arg == "--master-weights=fp32" || arg == "--master-weights=stochastic" || arg == "--master-weights=none") {
      out.master_weights = arg == "--master-weights=fp32"         ? optim::MasterWeights::kFp32
                           : arg == "--master-weights=stochastic" ? optim::MasterWeights::kStochasticRounding
                                                                  : optim::MasterWeights::kNone;
      continue;
    }
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return false;
    }
    const bool output = arg == "--plot" || arg == "--logdir";
    if (arg == "--data" || (output && outputs == OutputFlags::kYes)) {
      (arg == "--data" ? out.data : arg == "--plot" ? out.plot : out.logdir) = value;
      continue;
    }
    try {
      if (arg == "--lr") out.lr = examples::parse_positive(arg, value);
      else if (arg == "--epochs") out.epochs = examples::parse_count(arg, value);
      else if (arg == "--batch-size") out.batch_size = examples::parse_count(arg, value);
      else if (arg == "--train-samples") out.train_samples = examples::parse_count(arg, value);
      else if (arg == "--seed") out.seed = examples::parse_seed(arg, value);
      else return false;
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
      return false;
    }
  }
  if (out.master_weights != optim::MasterWeights::kFp32 && out.precision != Precision::kBf16Params) {
    std::fprintf(stderr, "%s: --master-weights applies to 16-bit parameters: add --amp=bf16-params\n", argv[0]);
    return false;
  }
  return true;
}

}  // namespace ampgrad::fashion
