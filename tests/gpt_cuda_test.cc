// examples/char_gpt's training on a CUDA GPU: --device=cuda without a usable GPU fails at once with
// CUDA's reason (checked everywhere); with one, a step's gradients and a short run's losses match
// the CPU's in FP32 (and within 16-bit rounding under autocast), a checkpoint saved from the GPU
// resumes there bit for bit and loads on the CPU, and a step waits for the GPU only where it must.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "examples/char_gpt_train.h"
#include "examples/gpt.h"
#include "gpt_test_util.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::Device;
using ag::Tensor;
using char_gpt::Precision;

namespace {

using ag::test::kGptPrecisions;
using ag::test::tiny_corpus;

// tiny_options, 8 steps with an evaluation every 4.
char_gpt::TrainOptions short_options(const char_gpt::Corpus& corpus, Precision precision, Device device) {
  char_gpt::TrainOptions o = ag::test::tiny_options(corpus, precision, device);
  o.steps = 8;
  o.eval_every = 4;
  return o;
}

// The two backends add in different orders.
::testing::AssertionResult close(const std::vector<double>& cuda, const std::vector<double>& cpu, double rtol,
                                 const std::string& what) {
  return ag::test::close_to_reference(cuda, cpu, rtol, what + " on CUDA", "CPU");
}

// The losses' tolerance: FP32's for summation order over a few steps; under autocast a 16-bit
// rounding that differs by one ulp somewhere, a few ulps of the autocast dtype.
double loss_rtol(Precision precision) {
  return precision == Precision::kFloat32 ? 1e-4 : 4 * ag::dtype_info(char_gpt::autocast_dtype(precision)).eps;
}

TEST(GptDevice, CudaWithoutAGpuFailsAtOnceWithTheReason) {
  const char_gpt::Corpus corpus = tiny_corpus();
  char_gpt::TrainOptions o = short_options(corpus, Precision::kFloat32, Device::kCUDA);
  if (ag::cuda_is_available()) {
    EXPECT_NO_THROW(char_gpt::check_device(o));  // the GPU machine: nothing to refuse
    return;
  }
  const std::string reason = ag::cuda::unavailable_reason();
  ASSERT_FALSE(reason.empty());
  EXPECT_ERROR([&] { char_gpt::check_device(o); }, "--device=cuda", reason);
  ag::manual_seed(o.seed);
  gpt::GPT model(o.model);
  EXPECT_ERROR([&] { char_gpt::train(corpus, o, model); }, "--device=cuda", reason);
  for (const Tensor& p : model.parameters()) EXPECT_EQ(p.device(), Device::kCPU);  // refused before anything moved
  o.device = Device::kCPU;
  EXPECT_NO_THROW(char_gpt::check_device(o));
}

// The first step's loss and every gradient, from the same weights and batch, on both devices.
TEST(GptCuda, GradientsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  const char_gpt::Corpus corpus = tiny_corpus();
  for (Precision precision : kGptPrecisions) {
    SCOPED_TRACE(char_gpt::precision_name(precision));
    std::map<Device, std::map<std::string, std::vector<double>>> grads;
    std::map<Device, double> loss;
    for (Device device : {Device::kCPU, Device::kCUDA}) {
      const char_gpt::TrainOptions o = short_options(corpus, precision, device);
      ag::manual_seed(o.seed);
      gpt::GPT model(o.model);
      model.to(device);
      const auto [x, y] = char_gpt::to_device(char_gpt::batch_for_step(corpus.train, o, 0), device);
      ag::Tensor l;
      {
        const bool amp = precision != Precision::kFloat32;
        ag::amp::AutocastGuard autocast(device, amp ? char_gpt::autocast_dtype(precision) : ag::DType::kFloat16, amp);
        const Tensor logits = model(x);
        l = ag::ops::cross_entropy(ag::ops::reshape(logits, {-1, logits.size(-1)}), y);
      }
      l.backward();
      loss[device] = l.item<double>();
      for (auto& [name, p] : model.named_parameters()) {
        ASSERT_EQ(p.device(), device) << name;
        grads[device][name] = p.grad().to_double_vector();
      }
    }
    // Gradients: FP32 differs by summation order; under autocast every product is rounded to 16
    // bits, so a few of that dtype's eps.
    const double rtol = precision == Precision::kFloat32 ? 1e-4 : 8 * ag::dtype_info(char_gpt::autocast_dtype(precision)).eps;
    EXPECT_TRUE(close({loss[Device::kCUDA]}, {loss[Device::kCPU]}, loss_rtol(precision), "loss"));
    for (const auto& [name, g] : grads[Device::kCPU]) EXPECT_TRUE(close(grads[Device::kCUDA][name], g, rtol, name));
  }
}

// A few steps of char_gpt::train (same seed, same batches): the losses follow the CPU's.
TEST(GptCuda, TrainingFollowsTheCpu) {
  SKIP_WITHOUT_CUDA();
  const char_gpt::Corpus corpus = tiny_corpus();
  for (Precision precision : kGptPrecisions) {
    SCOPED_TRACE(char_gpt::precision_name(precision));
    std::map<Device, char_gpt::TrainResult> runs;
    for (Device device : {Device::kCPU, Device::kCUDA}) {
      const char_gpt::TrainOptions o = short_options(corpus, precision, device);
      ag::manual_seed(o.seed);
      gpt::GPT model(o.model);
      std::vector<int64_t> called;
      runs[device] = char_gpt::train(corpus, o, model, [&](int64_t step, double, double, double) { called.push_back(step); });
      for (const Tensor& p : model.parameters()) EXPECT_EQ(p.device(), device);
      EXPECT_EQ(called, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8})) << "every step reported, in order";
    }
    const char_gpt::TrainResult &cpu = runs[Device::kCPU], &gpu = runs[Device::kCUDA];
    EXPECT_TRUE(close(gpu.train_loss, cpu.train_loss, loss_rtol(precision), "train loss"));
    ASSERT_EQ(gpu.val_loss.size(), 2u);
    for (size_t i = 0; i < cpu.val_loss.size(); ++i) {
      EXPECT_EQ(gpu.val_loss[i].first, cpu.val_loss[i].first);
      EXPECT_TRUE(close({gpu.val_loss[i].second}, {cpu.val_loss[i].second}, loss_rtol(precision), "val loss"));
    }
    EXPECT_EQ(gpu.scale, cpu.scale);  // no overflow at this size on either: the same schedule
    EXPECT_LT(gpu.train_loss.back(), gpu.train_loss.front());
  }
}

// Saved on the GPU after 5 of 12 steps, resumed on the GPU into fresh weights: the same losses and
// bytes as 12 steps straight. The file (host copies) also loads into a CPU model, with the GPU
// model's bytes.
TEST(GptCuda, ResumeIsBitExact) {
  SKIP_WITHOUT_CUDA();
  const char_gpt::Corpus corpus = tiny_corpus();
  for (Precision precision : kGptPrecisions) {
    SCOPED_TRACE(char_gpt::precision_name(precision));
    const auto loads_on_cpu = [&](const gpt::GPT& saved, const std::string& path) {
      gpt::GPT on_cpu(saved.config);
      ag::checkpoint::TrainingState weights_only{.model = &on_cpu};
      ag::checkpoint::load_checkpoint(path, weights_only);
      const auto a = saved.named_parameters(), b = on_cpu.named_parameters();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].second.device(), Device::kCUDA) << a[i].first;
        EXPECT_EQ(ag::test::bytes_of(a[i].second), ag::test::bytes_of(b[i].second)) << a[i].first;
      }
    };
    ag::test::expect_resume_is_bit_exact(corpus, ag::test::tiny_options(corpus, precision, Device::kCUDA), loads_on_cpu);
  }
}

// A training step on the GPU waits for it only in the two ops that check ids on the host
// (embedding, cross_entropy) and, with FP16's GradScaler, to read the found-inf flag: the batch
// goes up from page-locked memory, the positions are a narrow, the clipping norm and the loss
// stay on the device.
TEST(GptCuda, StepWaitsOnlyWhereItMust) {
  SKIP_WITHOUT_CUDA();
  const char_gpt::Corpus corpus = tiny_corpus();
  for (Precision precision : kGptPrecisions) {
    SCOPED_TRACE(char_gpt::precision_name(precision));
    const char_gpt::TrainOptions o = short_options(corpus, precision, Device::kCUDA);
    ag::manual_seed(o.seed);
    gpt::GPT model(o.model);
    model.to(Device::kCUDA);
    ag::optim::AdamW opt = char_gpt::make_optimizer(model, o);
    ag::amp::GradScaler scaler({.enabled = char_gpt::uses_grad_scaler(precision)});
    bool stepped = false;
    const auto step = [&](int64_t i) {
      const auto [x, y] = char_gpt::to_device(char_gpt::batch_for_step(corpus.train, o, i), Device::kCUDA);
      return char_gpt::train_step(model, opt, scaler, x, y, o, stepped);
    };
    step(0);  // the first step allocates the optimizer's state
    ag::synchronize(Device::kCUDA);
    const int64_t before = ag::cuda_host_sync_count();
    for (int64_t i = 1; i <= 3; ++i) step(i);
    const int64_t per_step = char_gpt::uses_grad_scaler(precision) ? 3 : 2;
    EXPECT_EQ(ag::cuda_host_sync_count() - before, 3 * per_step);
  }
}

}  // namespace
