// The small GPT of examples/gpt.h against PyTorch (tests/data/gpt_reference.safetensors, written by
// tests/data/make_gpt_reference.py): logits, loss and every gradient in float64, float32, FP16
// autocast and BF16 autocast. Then short training runs in FP32, FP16 AMP and BF16 AMP whose loss
// must fall, and a resume from a checkpoint that continues bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "examples/char_gpt_train.h"
#include "examples/gpt.h"
#include "gpt_test_util.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;

namespace {

gpt::Config reference_config() {
  return {.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.0};
}

std::map<std::string, Tensor> load_reference() {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : ag::checkpoint::load_safetensors("tests/data/gpt_reference.safetensors").tensors) out[name] = t;
  return out;
}

struct ModelRun {
  Tensor logits, loss;
  std::map<std::string, Tensor> grads;
};

// The reference model in `dtype`, run on the reference batch (under autocast to `autocast_dtype`
// when asked).
ModelRun run(DType dtype, bool autocast, DType autocast_dtype = DType::kFloat16) {
  const std::map<std::string, Tensor> ref = load_reference();
  gpt::GPT model(reference_config());
  for (auto& [name, p] : model.named_parameters()) {
    EXPECT_TRUE(ref.count(name)) << name;
    p.set_data(ref.at(name).to(dtype));
  }
  ModelRun r;
  {
    ag::amp::AutocastGuard guard(ag::Device::kCPU, autocast_dtype, autocast);
    r.logits = model(ref.at("input.ids"));
    r.loss = ag::ops::cross_entropy(ag::ops::reshape(r.logits, {-1, 11}), ref.at("input.targets"));
  }
  r.loss.backward();
  for (auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad();
  return r;
}

::testing::AssertionResult close(const Tensor& actual, const Tensor& expected, double rtol, const std::string& what) {
  return ag::test::close_to_reference(actual.to_double_vector(), expected.to_double_vector(), rtol, what, "PyTorch");
}

void expect_matches(const ModelRun& r, double rtol) {
  const std::map<std::string, Tensor> ref = load_reference();
  EXPECT_TRUE(close(r.logits, ag::ops::reshape(ref.at("output.logits"), r.logits.shape()), rtol, "logits"));
  EXPECT_TRUE(close(ag::ops::reshape(r.loss, {1}), ref.at("output.loss"), rtol, "loss"));
  EXPECT_EQ(r.grads.size(), 28u);  // wte, wpe, 12 per block, ln_f weight and bias (the head is tied to wte)
  for (const auto& [name, g] : r.grads) {
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_TRUE(close(g, ref.at("grad." + name), rtol, "grad " + name));
  }
}

TEST(GptReference, Float64MatchesPyTorch) { expect_matches(run(DType::kFloat64, false), 1e-10); }

TEST(GptReference, Float32MatchesPyTorch) { expect_matches(run(DType::kFloat32, false), 2e-5); }

TEST(GptReference, Fp16AutocastMatchesPyTorch) {
  const ModelRun r = run(DType::kFloat32, true);
  EXPECT_EQ(r.logits.dtype(), DType::kFloat16);
  EXPECT_EQ(r.loss.dtype(), DType::kFloat32);
  expect_matches(r, 2e-2);
}

// The same run under BF16 autocast, with the FP16 tolerance scaled by the ratio of the two dtypes'
// eps (2^-7 / 2^-10 = 8, from the dtype table): the same casts, three significand bits fewer.
TEST(GptReference, Bf16AutocastMatchesPyTorch) {
  const ModelRun r = run(DType::kFloat32, true, DType::kBFloat16);
  EXPECT_EQ(r.logits.dtype(), DType::kBFloat16);
  EXPECT_EQ(r.loss.dtype(), DType::kFloat32);
  for (const auto& [name, g] : r.grads) EXPECT_EQ(g.dtype(), DType::kFloat32) << name;  // FP32 parameters
  const double ratio = ag::dtype_info(DType::kBFloat16).eps / ag::dtype_info(DType::kFloat16).eps;
  expect_matches(r, 2e-2 * ratio);
}

TEST(GptReference, CheckpointNamesAreNanoGpts) {
  gpt::GPT model(reference_config());
  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  const std::map<std::string, Tensor> ref = load_reference();
  size_t from_pytorch = 0;
  for (const auto& [name, t] : ref) from_pytorch += name.find('.') != std::string::npos && name.rfind("input.", 0) &&
                                                    name.rfind("output.", 0) && name.rfind("grad.", 0);
  EXPECT_EQ(names.size(), from_pytorch);  // every state_dict key, the tied lm_head.weight included
  for (const std::string& name : names) EXPECT_TRUE(ref.count(name)) << name << " is not in PyTorch's state_dict";
}

TEST(GptTraining, LossFallsInFp32AndAmp) {
  const char_gpt::Corpus corpus = ag::test::tiny_corpus();
  for (auto precision : ag::test::kGptPrecisions) {
    const char_gpt::TrainOptions o = ag::test::tiny_options(corpus, precision);
    ag::manual_seed(o.seed);
    gpt::GPT model(o.model);
    const char_gpt::TrainResult r = char_gpt::train(corpus, o, model);
    ASSERT_EQ(r.train_loss.size(), 60u);
    const double first = r.train_loss.front(), last = r.train_loss.back();
    EXPECT_LT(last, 0.6 * first) << char_gpt::precision_name(precision);
    EXPECT_LT(r.val_loss.back().second, r.unigram_loss) << char_gpt::precision_name(precision) << ": no better than unigram";
    if (!char_gpt::uses_grad_scaler(precision)) {
      EXPECT_EQ(r.skipped, 0) << "no scaler: no step is skipped";
    }
    // The breakdown of step 2 that char_gpt prints: 16 bytes of AdamW state per parameter.
    const ag::optim::TrainingMemory& m = r.memory;
    EXPECT_EQ(r.memory_step, 2);
    EXPECT_EQ(m.num_parameters, r.parameters);
    EXPECT_EQ(m.training_state(), 16 * r.parameters) << char_gpt::precision_name(precision);
    EXPECT_GT(m.activations, 0);
    // When the loss was computed the device held the state without gradients (zero_grad dropped
    // them) and the activations; the gradients arrive as backward frees activations.
    EXPECT_GE(m.peak, m.training_state() - m.gradients + m.activations);
    EXPECT_GE(m.peak, m.training_state());
  }
}

TEST(GptTraining, TheMeteredStepIsTheSameWhicheverStepItIs) {
  // One step is metered at its start, three at the second (after the first made the state): the
  // same bytes, since the gradients of the step before are not counted as activations.
  const char_gpt::Corpus corpus = ag::test::tiny_corpus();
  std::vector<ag::optim::TrainingMemory> memory;
  for (int64_t steps : {1, 3}) {
    char_gpt::TrainOptions o = ag::test::tiny_options(corpus, char_gpt::Precision::kFloat32);
    o.steps = steps;
    o.eval_every = steps;
    ag::manual_seed(o.seed);
    gpt::GPT model(o.model);
    const char_gpt::TrainResult r = char_gpt::train(corpus, o, model);
    EXPECT_EQ(r.memory_step, steps == 1 ? 1 : 2);
    EXPECT_EQ(r.memory.training_state(), 16 * r.parameters);
    memory.push_back(r.memory);
  }
  EXPECT_EQ(memory[0].activations, memory[1].activations);
}

TEST(GptTraining, ResumeIsBitExact) {
  const char_gpt::Corpus corpus = ag::test::tiny_corpus();
  for (auto precision : ag::test::kGptPrecisions) {
    SCOPED_TRACE(char_gpt::precision_name(precision));
    ag::test::expect_resume_is_bit_exact(corpus, ag::test::tiny_options(corpus, precision));
  }
}

TEST(GptTraining, ABatchFromTooFewTokensIsAnError) {
  // batch() draws a window of T + 1 ids from all but the last id, so it needs one id to spare:
  // fewer is a clear error, not a division by zero.
  char_gpt::TrainOptions o;
  o.batch_size = 1;
  o.model.block_size = 8;
  EXPECT_THROW(char_gpt::batch_for_step(std::vector<int64_t>(9, 0), o, 0), ag::Error);
  EXPECT_THROW(char_gpt::batch_for_step(std::vector<int64_t>(3, 0), o, 0), ag::Error);
  const auto [x, y] = char_gpt::batch_for_step(std::vector<int64_t>(10, 0), o, 0);
  EXPECT_EQ(x.shape(), (ag::Shape{1, 8}));
  EXPECT_EQ(y.shape(), (ag::Shape{8}));
}

}  // namespace
