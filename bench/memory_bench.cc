// Training state per parameter, measured, for each precision recipe on one process: the bytes of
// parameters, gradients, FP32 masters and optimizer state that char_gpt's step holds
// (optim::MemoryMeter), with the activations the forward kept and the step's peak.
//   bazel-bin/bench/memory_bench [--layers=4] [--width=128] [--batch=16] [--block=64] [--device=cpu|cuda]
// Each recipe trains two steps of AdamW from the same initialisation on random characters (what
// the bytes are does not depend on the text) and is measured at the second, when the optimizer
// state exists. bench/zero_bench gives the same breakdown per rank under ZeRO.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "examples/char_gpt_train.h"

namespace ag = ampgrad;

namespace {

struct Recipe {
  const char* name;
  char_gpt::Precision precision;
  ag::optim::MasterWeights master_weights;
  double expected;  // bytes of training state per parameter: 16-bit or FP32 weights and gradients + masters + 8 of moments
};

const Recipe kRecipes[] = {
    {"FP32", char_gpt::Precision::kFloat32, ag::optim::MasterWeights::kFp32, 4 + 4 + 8},
    {"FP16 AMP", char_gpt::Precision::kFloat16Amp, ag::optim::MasterWeights::kFp32, 4 + 4 + 8},
    {"BF16 AMP", char_gpt::Precision::kBFloat16Amp, ag::optim::MasterWeights::kFp32, 4 + 4 + 8},
    {"FP8 linears", char_gpt::Precision::kFp8, ag::optim::MasterWeights::kFp32, 4 + 4 + 8},
    {"BF16 + FP32 masters", char_gpt::Precision::kBf16Params, ag::optim::MasterWeights::kFp32, 2 + 2 + 4 + 8},
    {"BF16 + stochastic", char_gpt::Precision::kBf16Params, ag::optim::MasterWeights::kStochasticRounding, 2 + 2 + 8},
    {"BF16, no masters", char_gpt::Precision::kBf16Params, ag::optim::MasterWeights::kNone, 2 + 2 + 8},
};

char_gpt::Corpus random_corpus(int64_t vocab, int64_t length) {
  char_gpt::Corpus corpus;
  for (int64_t c = 0; c < vocab; ++c) corpus.vocab.push_back(static_cast<char>(32 + c));
  std::mt19937_64 rng(7);
  for (int64_t i = 0; i < length; ++i) {
    (i < length * 9 / 10 ? corpus.train : corpus.val).push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
  }
  return corpus;
}

}  // namespace

int main(int argc, char** argv) {
  char_gpt::TrainOptions o;
  o.model = {.vocab_size = 96, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--layers=")) o.model.n_layer = std::atoll(v);
    else if (const char* v = value("--width=")) o.model.n_embd = std::atoll(v);
    else if (const char* v = value("--batch=")) o.batch_size = std::atoll(v);
    else if (const char* v = value("--block=")) o.model.block_size = std::atoll(v);
    else if (arg == "--device=cpu") o.device = ag::Device::kCPU;
    else if (arg == "--device=cuda") o.device = ag::Device::kCUDA;
    else {
      std::fprintf(stderr, "memory_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  o.steps = 2;
  o.eval_every = 2;
  o.eval_batches = 1;
  try {
    const char_gpt::Corpus corpus = random_corpus(o.model.vocab_size, 64 * 1024 + 20 * o.model.block_size);
    std::printf("char GPT %lld layers, width %lld, batch %lld x %lld on %s, AdamW; bytes per parameter at step 2\n",
                static_cast<long long>(o.model.n_layer), static_cast<long long>(o.model.n_embd),
                static_cast<long long>(o.batch_size), static_cast<long long>(o.model.block_size),
                std::string(ag::device_name(o.device)).c_str());
    std::printf("%-20s %7s %6s %8s %9s %6s %9s %12s %9s\n", "recipe", "params", "grads", "masters", "optimizer",
                "state", "expected", "activ. MiB", "peak MiB");
    for (const Recipe& r : kRecipes) {
      o.precision = r.precision;
      o.master_weights = r.master_weights;
      ag::manual_seed(o.seed);
      gpt::GPT model(o.model);
      const char_gpt::TrainResult result = char_gpt::train(corpus, o, model);
      const ag::optim::TrainingMemory& m = result.memory;
      std::printf("%-20s %7.2f %6.2f %8.2f %9.2f %6.2f %9.2f %12.1f %9.1f\n", r.name, m.per_parameter(m.parameters),
                  m.per_parameter(m.gradients), m.per_parameter(m.masters), m.per_parameter(m.optimizer_state),
                  m.per_parameter(m.training_state()), r.expected, static_cast<double>(m.activations) / (1 << 20),
                  static_cast<double>(m.peak) / (1 << 20));
    }
  } catch (const ag::Error& e) {
    std::fprintf(stderr, "memory_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
