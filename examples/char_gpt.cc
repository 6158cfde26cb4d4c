// Trains a character-level GPT on a text (by default every text of Debian's fortunes package),
// printing train and validation loss as it goes and a sample at the end. --amp (or --amp=fp16)
// trains with FP16 autocast and a GradScaler; --amp=bf16 with BF16 autocast and no scaler;
// --amp=fp8 the same with the linears' GEMMs in FP8 (delayed scaling); --amp=bf16-params stores
// the model in BF16, its updates kept by FP32 masters (--master-weights=fp32, the default), by
// stochastic rounding without masters (=stochastic), or lost below half a step (=none).
// --device=cuda trains on the GPU. --save writes a checkpoint (it loads in PyTorch); --resume
// continues one. --plot=DIR draws the loss (and with FP16 AMP the loss scale) into DIR/*.png
// through gnuplot. --checkpoint-activations recomputes each block in the backward instead of
// keeping its activations. --preset=gpt2-124m takes GPT-2 small's shape (12 layers, 12 heads,
// width 768, context 1024; flags after it change it), --vocab=N pads the vocabulary to N (50304
// for GPT-2's GEMM-friendly size). The progress line shows tokens/s and the allocator's peak.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "examples/char_gpt_train.h"
#include "examples/flags.h"
#include "examples/training_plots.h"

namespace ag = ampgrad;
using ag::examples::parse_count;
using ag::examples::parse_positive;
using ag::examples::parse_seed;

namespace {

void usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--data=PATH] [--device=cpu|cuda] [--amp[=fp16|bf16|fp8|bf16-params]] [--steps=N] [--batch=N] [--block=N] [--layers=N] [--heads=N]\n"
               "          [--embd=N] [--lr=X] [--seed=N] [--eval-every=N] [--save=FILE] [--resume=FILE]\n"
               "          [--sample=N] [--plot=DIR] [--checkpoint-activations] [--preset=gpt2-124m] [--vocab=N]\n"
               "          [--master-weights=fp32|stochastic|none] (with --amp=bf16-params)\n",
               program);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "/usr/share/games/fortunes";
  char_gpt::TrainOptions options;
  int64_t sample_length = 200;
  int64_t padded_vocab = 0;  // 0: the text's own vocabulary
  std::string plot_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq), value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    try {
      if (key == "--data") data = value;
      else if (arg == "--device=cpu") options.device = ag::Device::kCPU;
      else if (arg == "--device=cuda") options.device = ag::Device::kCUDA;
      else if (arg == "--amp" || arg == "--amp=fp16") options.precision = char_gpt::Precision::kFloat16Amp;
      else if (arg == "--amp=bf16") options.precision = char_gpt::Precision::kBFloat16Amp;
      else if (arg == "--amp=fp8") options.precision = char_gpt::Precision::kFp8;
      else if (arg == "--amp=bf16-params") options.precision = char_gpt::Precision::kBf16Params;
      else if (arg == "--master-weights=fp32") options.master_weights = ag::optim::MasterWeights::kFp32;
      else if (arg == "--master-weights=stochastic") options.master_weights = ag::optim::MasterWeights::kStochasticRounding;
      else if (arg == "--master-weights=none") options.master_weights = ag::optim::MasterWeights::kNone;
      else if (key == "--steps") options.steps = parse_count(key, value);
      else if (key == "--batch") options.batch_size = parse_count(key, value);
      else if (key == "--block") options.model.block_size = parse_count(key, value);
      else if (key == "--layers") options.model.n_layer = parse_count(key, value);
      else if (key == "--heads") options.model.n_head = parse_count(key, value);
      else if (key == "--embd") options.model.n_embd = parse_count(key, value);
      else if (key == "--lr") options.lr = parse_positive(key, value);
      else if (key == "--seed") options.seed = parse_seed(key, value);
      else if (key == "--eval-every") options.eval_every = parse_count(key, value);
      else if (key == "--save") options.save_path = value;
      else if (key == "--resume") options.resume_path = value;
      else if (key == "--sample") sample_length = parse_count(key, value, /*min=*/0);
      else if (key == "--plot" && !value.empty()) plot_dir = value;
      else if (arg == "--checkpoint-activations") options.model.checkpoint_activations = true;
      else if (arg == "--preset=gpt2-124m") {
        options.model.n_layer = options.model.n_head = 12;
        options.model.n_embd = 768;
        options.model.block_size = 1024;
      } else if (key == "--vocab") padded_vocab = parse_count(key, value);
      else {
        usage(argv[0]);
        return 2;
      }
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "char_gpt: %s\n", e.what());
      return 2;
    }
  }
  try {
    char_gpt::check_device(options);  // before the text is read: a missing GPU fails at once
    const char_gpt::Corpus corpus = char_gpt::load_corpus(data, options.model.block_size);
    options.model.vocab_size = static_cast<int64_t>(corpus.vocab.size());
    if (padded_vocab > 0) {
      if (padded_vocab < options.model.vocab_size) {
        std::fprintf(stderr, "char_gpt: --vocab=%lld is smaller than the text's %lld characters\n",
                     static_cast<long long>(padded_vocab), static_cast<long long>(options.model.vocab_size));
        return 2;
      }
      options.model.vocab_size = padded_vocab;  // the extra classes are never targets
    }
    if (options.master_weights != ag::optim::MasterWeights::kFp32 &&
        options.precision != char_gpt::Precision::kBf16Params) {
      std::fprintf(stderr, "char_gpt: --master-weights applies to 16-bit parameters: add --amp=bf16-params\n");
      return 2;
    }
    ag::manual_seed(options.seed);
    gpt::GPT model(options.model);
    const bool amp = char_gpt::uses_grad_scaler(options.precision);  // the scale is worth printing
    const std::string precision =
        std::string(char_gpt::precision_name(options.precision)) +
        (options.precision != char_gpt::Precision::kBf16Params                           ? ""
         : options.master_weights == ag::optim::MasterWeights::kStochasticRounding ? ", stochastic rounding"
         : options.master_weights == ag::optim::MasterWeights::kNone                ? ", no masters"
                                                                                     : ", FP32 masters");
    std::printf("char_gpt: %zu characters of text, vocabulary %zu, %s on %s, %lld steps of %lld x %lld tokens\n",
                corpus.train.size() + corpus.val.size(), corpus.vocab.size(), precision.c_str(),
                std::string(ag::device_name(options.device)).c_str(),
                static_cast<long long>(options.steps), static_cast<long long>(options.batch_size),
                static_cast<long long>(options.model.block_size));
    ag::utils::ProgressLine progress(options.steps, std::cout, {.every_steps = options.eval_every});
    const auto start = std::chrono::steady_clock::now();
    const double tokens_per_step = static_cast<double>(options.batch_size * options.model.block_size);
    int64_t first_step = -1;
    const char_gpt::TrainResult result =
        char_gpt::train(corpus, options, model, [&](int64_t step, double loss, double scale, double val) {
          ag::utils::ProgressFields fields{{"loss", loss}};
          if (amp) fields.emplace_back("scale", scale);
          if (first_step < 0) first_step = step;
          const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          fields.emplace_back("tok/s", static_cast<double>(step - first_step + 1) * tokens_per_step / elapsed);
          fields.emplace_back("peak_MiB",
                              static_cast<double>(ag::memory_stats(options.device).peak_bytes) / (1 << 20));
          if (std::isnan(val)) {
            // On CUDA a step's loss arrives only at the next evaluation (one read-back for all of
            // them), so only the evaluations' lines would be on time.
            if (options.device == ag::Device::kCPU) progress.update(step, fields);
            return;
          }
          fields.emplace_back("val", val);
          progress.keep(step, fields);  // every evaluation gets its line
        });
    progress.finish();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto steps = static_cast<double>(result.train_loss.size());
    std::printf("model: %lld parameters\n", static_cast<long long>(result.parameters));
    if (result.memory_step > 0) {
      std::printf("memory at step %lld: %s\n", static_cast<long long>(result.memory_step),
                  result.memory.to_string().c_str());
    }
    std::printf("trained in %.1f s (%.2f ms per step, evaluations included)\n", seconds,
                steps > 0 ? seconds * 1e3 / steps : 0.0);
    if (result.val_loss.empty()) {  // a resume at or past --steps
      std::printf("no step to take: the checkpoint is at step %lld of %lld\n",
                  static_cast<long long>(result.first_step), static_cast<long long>(options.steps));
    } else {
      std::printf("validation loss %.4f after %lld steps (unigram model: %.4f)", result.val_loss.back().second,
                  static_cast<long long>(result.val_loss.back().first), result.unigram_loss);
      if (amp) {
        std::printf(", %lld steps skipped, final scale %.0f", static_cast<long long>(result.skipped),
                    result.scale.back());
      }
      std::printf("\n");
    }
    if (!options.save_path.empty()) std::printf("checkpoint: %s\n", options.save_path.c_str());
    if (!plot_dir.empty()) {
      const training_plots::Curves curves{.title = std::string("char_gpt, ") + char_gpt::precision_name(options.precision),
                                          .first_step = result.first_step,
                                          .train_loss = result.train_loss,
                                          .val_loss = result.val_loss,
                                          .scale = amp ? result.scale : std::vector<double>{}};
      for (const std::string& path : training_plots::write(curves, plot_dir)) std::printf("wrote %s\n", path.c_str());
    }
    if (sample_length > 0) {
      std::printf("sample:\n%s\n", char_gpt::sample(model, corpus, "\n", sample_length, options.seed).c_str());
    }
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "char_gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
