// The character-level GPT training loop (see char_gpt_train.h).
#include "examples/char_gpt_train.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

namespace char_gpt {

ag::DType autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFloat32: return ag::DType::kFloat32;
    case Precision::kFloat16Amp: return ag::DType::kFloat16;
    case Precision::kBFloat16Amp: return ag::DType::kBFloat16;
    case Precision::kFp8: return ag::DType::kBFloat16;
    case Precision::kBf16Params: return ag::DType::kBFloat16;
  }
  return ag::DType::kFloat32;
}

bool uses_grad_scaler(Precision precision) { return precision == Precision::kFloat16Amp; }

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFloat32: return "FP32";
    case Precision::kFloat16Amp: return "FP16 AMP";
    case Precision::kBFloat16Amp: return "BF16 AMP";
    case Precision::kFp8: return "FP8 linears in BF16 AMP";
    case Precision::kBf16Params: return "BF16 params";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  AG_CHECK(in.good(), "char_gpt: cannot read ", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// splitmix64: batches come from (seed, step, row), so a resumed run draws the same batches.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// x and y [B, T]: windows of the ids starting at offsets drawn for `key`; y is x shifted by one.
std::pair<ag::Tensor, ag::Tensor> batch(const std::vector<int64_t>& ids, int64_t batch_size, int64_t t, uint64_t key) {
  AG_CHECK(static_cast<int64_t>(ids.size()) > t + 1, "char_gpt: a batch of context ", t, " needs more than ", t + 1,
           " token ids to draw windows from, got ", ids.size());
  std::vector<int64_t> x(static_cast<size_t>(batch_size * t)), y(x.size());
  const uint64_t windows = ids.size() - static_cast<uint64_t>(t) - 1;
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t start = static_cast<int64_t>(mix(key * 1000003ull + static_cast<uint64_t>(b)) % windows);
    for (int64_t i = 0; i < t; ++i) {
      x[static_cast<size_t>(b * t + i)] = ids[static_cast<size_t>(start + i)];
      y[static_cast<size_t>(b * t + i)] = ids[static_cast<size_t>(start + i + 1)];
    }
  }
  return {ag::Tensor::from_vector(x, {batch_size, t}), ag::Tensor::from_vector(y, {batch_size * t})};
}

// The mean cross-entropy of the model on (x, y), logits flattened to [B T, V]; autocast on x's device.
ag::Tensor loss_of(gpt::GPT& model, const ag::Tensor& x, const ag::Tensor& y, Precision precision) {
  const bool amp = precision != Precision::kFloat32;
  ag::amp::AutocastGuard autocast(x.device(), amp ? autocast_dtype(precision) : ag::DType::kFloat16, amp);
  ag::amp::Float8Guard fp8(x.device(), {}, precision == Precision::kFp8);  // delayed scaling
  const ag::Tensor logits = model(x);
  return ag::ops::cross_entropy(ag::ops::reshape(logits, {-1, logits.size(-1)}), y);
}

// The values of scalar losses, in order. On CUDA every read waits for the GPU, so they are read
// together: one wait for all of them.
std::vector<double> read_back(const std::vector<ag::Tensor>& losses) {
  ag::NoGradGuard no_grad;
  std::vector<ag::Tensor> rows;
  for (const ag::Tensor& loss : losses) rows.push_back(ag::ops::reshape(loss, {1}));
  return ag::ops::cat(rows, 0).to_double_vector();
}

double validation_loss(gpt::GPT& model, const Corpus& corpus, const TrainOptions& o) {
  ag::NoGradGuard no_grad;
  model.eval();
  std::vector<ag::Tensor> losses;
  for (int64_t i = 0; i < o.eval_batches; ++i) {
    const auto [x, y] = to_device(batch(corpus.val, o.batch_size, o.model.block_size, ~static_cast<uint64_t>(i)), o.device);
    losses.push_back(loss_of(model, x, y, o.precision));
  }
  double total = 0;
  for (double loss : read_back(losses)) total += loss;
  model.train();
  return total / static_cast<double>(o.eval_batches);
}

// The cross-entropy of the validation text under the training text's character frequencies.
double unigram_loss(const Corpus& corpus) {
  std::vector<double> count(corpus.vocab.size(), 1.0);  // add-one smoothing
  for (int64_t id : corpus.train) count[static_cast<size_t>(id)] += 1;
  double total = 0;
  for (double c : count) total += c;
  double loss = 0;
  for (int64_t id : corpus.val) loss -= std::log(count[static_cast<size_t>(id)] / total);
  return loss / static_cast<double>(corpus.val.size());
}

}  // namespace

Corpus load_corpus(const std::string& path, int64_t block_size) {
  const char* hint = "; hint: ./bazelw installs Debian's fortunes package (texts in /usr/share/games/fortunes), or "
                     "pass --data FILE with any text";
  AG_CHECK(fs::exists(path), "char_gpt: ", path, " does not exist", hint);
  std::string text;
  if (fs::is_directory(path)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && ext != ".dat" && ext != ".u8") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) text += read_file(f);
  } else {
    text = read_file(path);
  }
  AG_CHECK(static_cast<int64_t>(text.size()) > 20 * (block_size + 1), "char_gpt: ", path, " holds ", text.size(),
           " characters, too few for a context of ", block_size, hint);
  std::array<bool, 256> used{};
  for (unsigned char c : text) used[c] = true;
  Corpus corpus;
  std::array<int64_t, 256> id{};
  for (int c = 0; c < 256; ++c) {
    if (!used[static_cast<size_t>(c)]) continue;
    id[static_cast<size_t>(c)] = static_cast<int64_t>(corpus.vocab.size());
    corpus.vocab.push_back(static_cast<char>(c));
  }
  const size_t split = text.size() * 9 / 10;
  for (size_t i = 0; i < text.size(); ++i) {
    (i < split ? corpus.train : corpus.val).push_back(id[static_cast<unsigned char>(text[i])]);
  }
  return corpus;
}

void check_device(const TrainOptions& o) {
  if (o.device != ag::Device::kCUDA) return;
  AG_CHECK(ag::cuda_is_available(), "char_gpt: --device=cuda needs a usable CUDA GPU, and there is none: ",
           ag::cuda::unavailable_reason(), "; hint: --device=cpu (the default) trains on the CPU");
}

ag::optim::AdamW make_optimizer(gpt::GPT& model, const TrainOptions& o) {
  const auto [decay, no_decay] = model.decay_groups();
  const ag::optim::AdamWOptions options{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                        .weight_decay = o.weight_decay};
  ag::optim::AdamWOptions no_decay_options = options;
  no_decay_options.weight_decay = 0.0;
  return ag::optim::AdamW({{.params = decay}, {.params = no_decay, .options = no_decay_options}}, options);
}

std::pair<ag::Tensor, ag::Tensor> batch_for_step(const std::vector<int64_t>& ids, const TrainOptions& o, int64_t step) {
  return batch(ids, o.batch_size, o.model.block_size, o.seed * 7919 + static_cast<uint64_t>(step));
}

std::pair<ag::Tensor, ag::Tensor> to_device(const std::pair<ag::Tensor, ag::Tensor>& batch, ag::Device device) {
  if (device == ag::Device::kCPU) return batch;
  // A new page-locked copy per batch: the previous one's copy may still be queued.
  return {batch.first.pin_memory().to(device, ag::NonBlocking::kYes),
          batch.second.pin_memory().to(device, ag::NonBlocking::kYes)};
}

ag::Tensor train_step(gpt::GPT& model, ag::optim::AdamW& opt, ag::amp::GradScaler& scaler, const ag::Tensor& x,
                      const ag::Tensor& y, const TrainOptions& o, bool& stepped, ag::optim::MemoryMeter* meter) {
  opt.zero_grad();
  const ag::Tensor loss = loss_of(model, x, y, o.precision);
  if (meter != nullptr) meter->forward_done();
  scaler.scale(loss).backward();
  scaler.unscale_(opt);  // clip the true gradients (a pass-through in FP32)
  // The norm stays a tensor: on CUDA the host does not wait for it (on the CPU the same host loop).
  ag::nn::utils::clip_grad_norm_tensor_(model.parameters(), o.grad_clip);
  stepped = scaler.step(opt);
  scaler.update();
  return loss;
}

TrainResult train(const Corpus& corpus, const TrainOptions& o, gpt::GPT& model, const StepCallback& on_step) {
  // A batch, run or evaluation of nothing would train on nothing and report NaN losses.
  AG_CHECK(o.batch_size >= 1 && o.steps >= 1 && o.eval_every >= 1 && o.eval_batches >= 1, "char_gpt::train: ",
           "batch_size, steps, eval_every and eval_batches must be >= 1, got ", o.batch_size, ", ", o.steps, ", ",
           o.eval_every, ", ", o.eval_batches);
  check_device(o);
  model.to(o.device);
  if (o.precision == Precision::kBf16Params) model.to(ag::DType::kBFloat16);  // before the optimizer sees it
  TrainResult result;
  result.parameters = 0;
  for (const ag::Tensor& p : model.parameters()) result.parameters += p.numel();
  result.unigram_loss = unigram_loss(corpus);

  ag::optim::AdamW opt = make_optimizer(model, o);
  opt.set_master_weights(o.master_weights);  // before a resume, which restores its rounding state
  // Warmup at most a tenth of a short run.
  const int64_t warmup = std::min(o.warmup_steps, o.steps / 10);
  ag::optim::CosineWithWarmupLR schedule(opt, {.warmup_steps = warmup, .total_steps = o.steps, .min_lr_factor = 0.1});
  // BF16 trains without a scaler (disabled, it is a pass-through), as PyTorch's BF16 recipe does.
  ag::amp::GradScaler scaler({.enabled = uses_grad_scaler(o.precision)});

  int64_t step = 0;
  if (!o.resume_path.empty()) {
    ag::checkpoint::TrainingState state{.model = &model, .optimizer = &opt, .scaler = &scaler, .scheduler = &schedule};
    ag::checkpoint::load_checkpoint(o.resume_path, state);
    step = std::stoll(state.user_metadata.at("step"));
  }
  result.first_step = step;
  const int64_t end = o.stop_after >= 0 ? std::min(o.steps, step + o.stop_after) : o.steps;
  model.train();
  // The steps whose loss is not read yet: on the CPU none (each is read at once); on CUDA those
  // since the last evaluation, read together there, so the host does not wait for every step.
  struct Unread {
    ag::Tensor loss;
    double scale;
  };
  std::vector<Unread> unread;
  for (; step < end; ++step) {
    const auto [x, y] = to_device(batch_for_step(corpus.train, o, step), o.device);
    bool stepped = false;
    // The first step after one that stepped holds what every later one does (a step makes the
    // optimizer's state); the last one if none did.
    const bool metered = result.memory_step == 0 && (opt.steps_taken() > 0 || step == end - 1);
    std::optional<ag::optim::MemoryMeter> meter;
    if (metered) {
      opt.zero_grad();  // train_step's own: so the last step's gradients are not in what the meter starts from
      meter.emplace(o.device);
    }
    const ag::Tensor loss = train_step(model, opt, scaler, x, y, o, stepped, meter ? &*meter : nullptr);
    if (metered) {
      result.memory = meter->read(model.parameters(), opt);
      result.memory_step = step + 1;
    }
    if (stepped) {
      schedule.step();
    } else {
      ++result.skipped;
    }
    unread.push_back({loss.detach(), scaler.get_scale()});
    double val = std::numeric_limits<double>::quiet_NaN();
    const bool evaluate = (step + 1) % o.eval_every == 0 || step + 1 == end;
    if (evaluate) {
      val = validation_loss(model, corpus, o);
      result.val_loss.emplace_back(step + 1, val);
    }
    if (!evaluate && o.device != ag::Device::kCPU) continue;
    std::vector<ag::Tensor> losses;
    for (const Unread& u : unread) losses.push_back(u.loss);
    const std::vector<double> values = read_back(losses);
    const int64_t first = step + 1 - static_cast<int64_t>(unread.size());
    for (size_t i = 0; i < unread.size(); ++i) {
      result.train_loss.push_back(values[i]);
      result.scale.push_back(unread[i].scale);
      const bool last = i + 1 == unread.size();
      if (on_step) {
        on_step(first + static_cast<int64_t>(i) + 1, values[i], unread[i].scale,
                last ? val : std::numeric_limits<double>::quiet_NaN());
      }
    }
    unread.clear();
  }
  if (!o.save_path.empty()) {
    // The model's shape and vocabulary travel with it, for examples/char_gpt_load.py.
    std::string vocab_hex;
    for (unsigned char c : corpus.vocab) {
      const char* digits = "0123456789abcdef";
      vocab_hex += digits[c >> 4];
      vocab_hex += digits[c & 15];
    }
    const gpt::Config& c = model.config;
    ag::checkpoint::save_checkpoint(o.save_path, {.model = &model,
                                                  .optimizer = &opt,
                                                  .scaler = &scaler,
                                                  .user_metadata = {{"step", std::to_string(step)},
                                                                    {"gpt.vocab_size", std::to_string(c.vocab_size)},
                                                                    {"gpt.block_size", std::to_string(c.block_size)},
                                                                    {"gpt.n_layer", std::to_string(c.n_layer)},
                                                                    {"gpt.n_head", std::to_string(c.n_head)},
                                                                    {"gpt.n_embd", std::to_string(c.n_embd)},
                                                                    {"gpt.vocab_hex", vocab_hex}},
                                                  .scheduler = &schedule});
  }
  return result;
}

std::string sample(gpt::GPT& model, const Corpus& corpus, const std::string& prompt, int64_t length, uint64_t seed) {
  ag::NoGradGuard no_grad;
  model.eval();
  const ag::Device device = model.transformer.wte.weight.device();
  std::vector<int64_t> context;
  for (char c : prompt) {
    const size_t at = corpus.vocab.find(c);
    if (at != std::string::npos) context.push_back(static_cast<int64_t>(at));
  }
  if (context.empty()) context.push_back(0);
  std::string out;
  for (int64_t i = 0; i < length; ++i) {
    const int64_t t = std::min<int64_t>(static_cast<int64_t>(context.size()), model.config.block_size);
    const std::vector<int64_t> window(context.end() - t, context.end());
    // On CUDA the window goes up (a pageable copy), embedding checks its ids and the
    // probabilities come back: three waits per character.
    const ag::Tensor logits = model(ag::Tensor::from_vector(window, {1, t}, ag::DType::kInt64, device));
    const std::vector<float> p = ag::ops::softmax(ag::ops::narrow(ag::ops::reshape(logits, {t, -1}), 0, t - 1, 1), -1).to_vector();
    // Only the text's characters: a vocabulary padded past them (--vocab) has classes with no byte.
    const size_t classes = std::min(p.size(), corpus.vocab.size());
    double mass = 1;
    if (classes < p.size()) {
      mass = 0;
      for (size_t c = 0; c < classes; ++c) mass += p[c];
    }
    const double u = static_cast<double>(mix(seed + static_cast<uint64_t>(i)) >> 11) * 0x1p-53 * mass;
    double acc = 0;
    size_t next = classes - 1;
    for (size_t c = 0; c < classes; ++c) {
      acc += p[c];
      if (u < acc) {
        next = c;
        break;
      }
    }
    context.push_back(static_cast<int64_t>(next));
    out.push_back(corpus.vocab[next]);
  }
  model.train();
  return out;
}

}  // namespace char_gpt
