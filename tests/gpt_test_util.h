// What gpt_test and gpt_cuda_test share: a tiny text and model to train char_gpt on, and the check
// that a run saved part-way and resumed continues bit for bit (on whichever device it trains).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "examples/char_gpt_train.h"
#include "examples/gpt.h"
#include "test_util.h"

namespace ampgrad::test {

inline constexpr char_gpt::Precision kGptPrecisions[] = {
    char_gpt::Precision::kFloat32, char_gpt::Precision::kFloat16Amp, char_gpt::Precision::kBFloat16Amp};

/// |actual - expected| <= rtol (max |expected| + |expected|) everywhere: an absolute tolerance
/// relative to the reference's largest magnitude, for results summed in another order or precision.
/// `reference` names what `expected` came from in the failure message.
inline ::testing::AssertionResult close_to_reference(const std::vector<double>& actual,
                                                     const std::vector<double>& expected, double rtol,
                                                     const std::string& what, const std::string& reference) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << what << ": " << actual.size() << " values vs " << expected.size();
  }
  double scale = 0;
  for (double v : expected) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!(std::abs(actual[i] - expected[i]) <= rtol * (scale + std::abs(expected[i])))) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: " << actual[i] << " vs " << reference << " "
                                           << expected[i] << " (largest |value| " << scale << ", rtol " << rtol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

/// A text of a few repeated sentences: enough for the loss to fall within tens of steps.
// "Suite_Name" of the running test, for temporary files that concurrent test binaries must not share.
inline std::string test_file_stem() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string stem = info == nullptr ? std::string("gpt") : std::string(info->test_suite_name()) + "_" + info->name();
  std::replace(stem.begin(), stem.end(), '/', '_');  // parameterised names hold slashes
  return stem;
}

inline char_gpt::Corpus tiny_corpus() {
  // Named after the running test: gpt_test and gpt_cuda_test may run at once on one TempDir().
  const std::string path = ::testing::TempDir() + "/" + test_file_stem() + "_tiny.txt";
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. pack my box with five dozen jugs.\n";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  return char_gpt::load_corpus(path, 16);
}

/// A 2-layer, width-32 model over `corpus`, batch 8 of 16 characters, 60 steps of lr 3e-3.
inline char_gpt::TrainOptions tiny_options(const char_gpt::Corpus& corpus, char_gpt::Precision precision,
                                           Device device = Device::kCPU) {
  char_gpt::TrainOptions o;
  o.model = {.vocab_size = static_cast<int64_t>(corpus.vocab.size()), .block_size = 16, .n_layer = 2, .n_head = 2,
             .n_embd = 32, .dropout = 0.0};
  o.batch_size = 8;
  o.steps = 60;
  o.lr = 3e-3;
  o.warmup_steps = 5;
  o.eval_every = 60;
  o.eval_batches = 2;
  o.precision = precision;
  o.device = device;
  return o;
}

/// 12 steps of `o` straight, against 5 saved to a checkpoint and the rest resumed from it into fresh
/// weights: the same losses and parameter bytes. `check_file(saved, path)` may look at the
/// checkpoint and the model that wrote it.
inline void expect_resume_is_bit_exact(
    const char_gpt::Corpus& corpus, char_gpt::TrainOptions o,
    const std::function<void(const gpt::GPT& saved, const std::string& path)>& check_file = {}) {
  o.steps = 12;
  o.eval_every = 100;
  manual_seed(o.seed);
  gpt::GPT straight(o.model);
  const char_gpt::TrainResult all = char_gpt::train(corpus, o, straight);

  const std::string path = ::testing::TempDir() + "/" + test_file_stem() + "_resume.safetensors";
  manual_seed(o.seed);
  gpt::GPT first(o.model);
  char_gpt::TrainOptions half = o;
  half.stop_after = 5;
  half.save_path = path;
  char_gpt::train(corpus, half, first);
  if (check_file) check_file(first, path);

  gpt::GPT resumed(o.model);  // fresh weights: the checkpoint must bring everything back
  char_gpt::TrainOptions rest = o;
  rest.resume_path = path;
  const char_gpt::TrainResult tail = char_gpt::train(corpus, rest, resumed);
  EXPECT_EQ(tail.first_step, 5);
  EXPECT_EQ(tail.train_loss, std::vector<double>(all.train_loss.begin() + 5, all.train_loss.end()));
  const auto a = straight.named_parameters(), b = resumed.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].second.device(), o.device) << a[i].first;
    EXPECT_EQ(bytes_of(a[i].second), bytes_of(b[i].second)) << a[i].first;
  }
}

}  // namespace ampgrad::test
