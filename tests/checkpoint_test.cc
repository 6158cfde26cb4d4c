// Training-state checkpoints: a stopped, saved, reloaded and resumed run is bit-identical to an
// uninterrupted one (FP32, FP16 and BF16 autocast, FP16 and BF16 parameters; parameter groups and
// an lr schedule); files follow the safetensors format (read back with Python's standard library);
// bad files throw and leave the run untouched. More in checkpoint_format_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/utils.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace ck = ampgrad::checkpoint;
namespace fs = std::filesystem;

namespace {

enum class Setup { kFp32Sgd, kAmpAdam, kFp16ParamsAdamW, kBf16AutocastAdam, kBf16ParamsAdamW };

// The 16-bit dtype a setup computes in (float32 for kFp32Sgd).
ag::DType compute_dtype(Setup setup) {
  switch (setup) {
    case Setup::kFp32Sgd: return ag::DType::kFloat32;
    case Setup::kAmpAdam:
    case Setup::kFp16ParamsAdamW: return ag::DType::kFloat16;
    case Setup::kBf16AutocastAdam:
    case Setup::kBf16ParamsAdamW: return ag::DType::kBFloat16;
  }
  return ag::DType::kFloat32;
}

bool low_precision_parameters(Setup setup) {
  return setup == Setup::kFp16ParamsAdamW || setup == Setup::kBf16ParamsAdamW;
}
bool autocast(Setup setup) { return setup == Setup::kAmpAdam || setup == Setup::kBf16AutocastAdam; }

// One training run: model, optimizer, scaler; every step draws a fresh batch from the global
// generator, so resuming also needs the generator's state.
struct TrainingRun {
  explicit TrainingRun(Setup setup_in) : setup(setup_in) {
    model = std::make_unique<ag::nn::Sequential>(ag::nn::Linear(6, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1));
    if (low_precision_parameters(setup)) model->to(compute_dtype(setup));
    if (setup == Setup::kFp32Sgd) {
      opt = std::make_unique<ag::optim::SGD>(model->parameters(), ag::optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    } else if (autocast(setup)) {
      opt = std::make_unique<ag::optim::Adam>(model->parameters(), ag::optim::AdamOptions{.lr = 1e-2});
    } else {
      // Weight decay on the weights only, in two groups (the transformer recipe).
      std::vector<ag::Tensor> weights, biases;
      for (const auto& [name, p] : model->named_parameters()) (p.dim() == 2 ? weights : biases).push_back(p);
      const ag::optim::AdamWOptions decay{.lr = 1e-2, .weight_decay = 0.1};
      ag::optim::AdamWOptions no_decay = decay;
      no_decay.weight_decay = 0;
      opt = std::make_unique<ag::optim::AdamW>(
          std::vector<ag::optim::ParamGroup<ag::optim::AdamWOptions>>{{.params = weights}, {.params = biases, .options = no_decay}},
          decay);
    }
    scheduler = std::make_unique<ag::optim::CosineWithWarmupLR>(
        *opt, ag::optim::CosineWithWarmupOptions{.warmup_steps = 5, .total_steps = 30, .min_lr_factor = 0.1});
    // A small growth interval and a huge initial scale make the schedule move within a few steps.
    // The BF16 setups follow the recommended recipe: no scaler.
    scaler = std::make_unique<ag::amp::GradScaler>(ag::amp::GradScalerOptions{
        .init_scale = 1e9, .growth_interval = 3, .enabled = compute_dtype(setup) == ag::DType::kFloat16});
  }

  float step() {
    ag::Tensor x = ag::randn({32, 6});
    if (low_precision_parameters(setup)) x = x.to(compute_dtype(setup));
    const ag::Tensor y = ag::randn({32, 1});
    opt->zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard guard(ag::Device::kCPU, autocast(setup) ? compute_dtype(setup) : ag::DType::kFloat16,
                                   autocast(setup));
      loss = ag::ops::mse_loss((*model)(x).to(ag::DType::kFloat32), y);
    }
    scaler->scale(loss).backward();
    if (scaler->step(*opt)) scheduler->step();
    scaler->update();
    return loss.item();
  }

  ck::TrainingState state() {
    return {.model = model.get(), .optimizer = opt.get(), .scaler = scaler.get(), .scheduler = scheduler.get()};
  }

  std::vector<double> parameter_values() const {
    std::vector<double> all;
    for (const ag::Tensor& p : model->parameters()) {
      for (double v : p.to_double_vector()) all.push_back(v);
    }
    return all;
  }

  Setup setup;
  std::unique_ptr<ag::nn::Sequential> model;
  std::unique_ptr<ag::optim::Optimizer> opt;
  std::unique_ptr<ag::amp::GradScaler> scaler;
  std::unique_ptr<ag::optim::LRScheduler> scheduler;
};

class CheckpointTest : public ::testing::TestWithParam<Setup> {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }
  ag::test::ScratchDir scratch_{"checkpoint"};
};

TEST_P(CheckpointTest, ResumedRunIsBitIdenticalToAnUninterruptedOne) {
  ag::manual_seed(11);
  TrainingRun straight(GetParam());
  std::vector<float> straight_losses;
  for (int i = 0; i < 24; ++i) straight_losses.push_back(straight.step());

  ag::manual_seed(11);
  std::vector<float> resumed_losses;
  {
    TrainingRun first(GetParam());
    for (int i = 0; i < 12; ++i) resumed_losses.push_back(first.step());
    ck::TrainingState state = first.state();
    state.user_metadata["step"] = "12";
    ck::save_checkpoint(path("run.safetensors"), state);
  }
  ag::manual_seed(999);  // a different process would start from anywhere
  TrainingRun second(GetParam());  // fresh weights, optimizer and scaler, all overwritten by the load
  ck::TrainingState state = second.state();
  ck::load_checkpoint(path("run.safetensors"), state);
  EXPECT_EQ(state.user_metadata.at("step"), "12");
  for (int i = 0; i < 12; ++i) resumed_losses.push_back(second.step());

  EXPECT_EQ(resumed_losses, straight_losses);  // exact, float for float
  EXPECT_EQ(second.parameter_values(), straight.parameter_values());
  EXPECT_EQ(second.scaler->get_scale(), straight.scaler->get_scale());
  EXPECT_EQ(second.scaler->growth_tracker(), straight.scaler->growth_tracker());
  EXPECT_EQ(second.scheduler->last_epoch(), straight.scheduler->last_epoch());
  EXPECT_GT(straight.scheduler->last_epoch(), 5);  // the schedule moved past warmup (skipped steps do not count)
  for (size_t g = 0; g < straight.opt->num_param_groups(); ++g) EXPECT_EQ(second.opt->lr(g), straight.opt->lr(g));
}

INSTANTIATE_TEST_SUITE_P(Setups, CheckpointTest,
                         ::testing::Values(Setup::kFp32Sgd, Setup::kAmpAdam, Setup::kFp16ParamsAdamW,
                                           Setup::kBf16AutocastAdam, Setup::kBf16ParamsAdamW));

class CheckpointFileTest : public CheckpointTest {};

// The Python reader decodes F16 and BF16 itself (safetensors.torch loads "BF16" as torch.bfloat16).
TEST_F(CheckpointFileTest, ModelFileReadsBackWithPythonStandardLibrary) {
  if (std::system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 here";
  for (ag::DType dtype : ag::kLowPrecisionDTypes) {
    const std::string name(ag::dtype_info(dtype).safetensors_name);
    SCOPED_TRACE(name);
    ag::manual_seed(5);
    ag::nn::Sequential model{ag::nn::Linear(3, 2), ag::nn::ReLU(), ag::nn::Linear(2, 1)};
    model.to(dtype);
    ck::save_model(path("model.safetensors"), model);
    const std::string command = "python3 tests/read_safetensors.py " + path("model.safetensors");
    FILE* pipe = ::popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
    ASSERT_EQ(::pclose(pipe), 0) << out;
    // PyTorch's state_dict names for nn.Sequential(Linear, ReLU, Linear), in the 16-bit dtype.
    const float w00 = model.parameters()[0].to_vector()[0];
    EXPECT_NE(out.find("0.bias " + name + " [2]"), std::string::npos) << out;
    EXPECT_NE(out.find("0.weight " + name + " [2, 3]"), std::string::npos) << out;
    EXPECT_NE(out.find("2.bias " + name + " [1]"), std::string::npos) << out;
    EXPECT_NE(out.find("2.weight " + name + " [1, 2]"), std::string::npos) << out;
    // Python's float repr of the first weight equals ours (16-bit values are exact in float).
    const std::string prefix = "0.weight " + name + " [2, 3] ";
    const size_t at = out.find(prefix);
    ASSERT_NE(at, std::string::npos);
    EXPECT_FLOAT_EQ(std::stof(out.substr(at + prefix.size())), w00) << out;
  }
}

// Loading `file` into a fresh FP32-SGD run throws an Error containing `expected` and the file
// name, and leaves the run's parameters as they were.
void expect_refused(TrainingRun& run, const std::string& file, const std::string& expected) {
  const std::vector<double> before = run.parameter_values();
  ck::TrainingState state = run.state();
  try {
    ck::load_checkpoint(file, state);
    ADD_FAILURE() << "loading " << file << " should fail with: " << expected;
  } catch (const ag::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fs::path(file).filename().string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(run.parameter_values(), before);
}

TEST_F(CheckpointFileTest, BadCheckpointsAreRefusedAndChangeNothing) {
  ag::manual_seed(2);
  TrainingRun source(Setup::kFp32Sgd);
  for (int i = 0; i < 3; ++i) source.step();
  ck::save_checkpoint(path("good.safetensors"), source.state());

  TrainingRun target(Setup::kFp32Sgd);
  expect_refused(target, path("missing.safetensors"), "cannot open");

  // Another architecture: 6-8-1 instead of 6-16-1.
  ag::nn::Sequential other{ag::nn::Linear(6, 8), ag::nn::ReLU(), ag::nn::Linear(8, 1)};
  ck::save_checkpoint(path("shape.safetensors"), {.model = &other});
  expect_refused(target, path("shape.safetensors"), "[8, 6]");

  // Same architecture in FP16.
  TrainingRun half(Setup::kFp16ParamsAdamW);
  ck::save_checkpoint(path("dtype.safetensors"), half.state());
  expect_refused(target, path("dtype.safetensors"), "float16");

  // An Adam state cannot go into SGD.
  TrainingRun adam(Setup::kAmpAdam);
  ck::save_checkpoint(path("adam.safetensors"), adam.state());
  expect_refused(target, path("adam.safetensors"), "\"Adam\" state but the optimizer is SGD");

  // A weights-only file is not a checkpoint.
  ck::save_model(path("weights.safetensors"), *source.model);
  expect_refused(target, path("weights.safetensors"), "not an ampgrad checkpoint");

  // Truncated in the middle of the data.
  const auto size = fs::file_size(path("good.safetensors"));
  fs::copy_file(path("good.safetensors"), path("cut.safetensors"));
  fs::resize_file(path("cut.safetensors"), size - 7);
  expect_refused(target, path("cut.safetensors"), "outside");

  // And the good file still loads.
  ck::TrainingState state = target.state();
  EXPECT_NO_THROW(ck::load_checkpoint(path("good.safetensors"), state));
  EXPECT_EQ(target.parameter_values(), source.parameter_values());
}

TEST_F(CheckpointFileTest, ScalerEnabledIsNeverTakenFromTheFile) {
  ag::manual_seed(3);
  TrainingRun unscaled(Setup::kFp32Sgd);  // its scaler is disabled
  unscaled.step();
  ck::save_checkpoint(path("unscaled.safetensors"), unscaled.state());

  // Resuming an FP16 run from it would silently stop scaling: refused, and nothing changes.
  TrainingRun target(Setup::kFp32Sgd);
  target.scaler = std::make_unique<ag::amp::GradScaler>(ag::amp::GradScalerOptions{.init_scale = 4096});
  expect_refused(target, path("unscaled.safetensors"), "disabled GradScaler");
  EXPECT_TRUE(target.scaler->is_enabled());
  EXPECT_EQ(target.scaler->get_scale(), 4096.0);

  // A disabled scaler ignores a saved schedule, as in PyTorch: it stays a pass-through.
  TrainingRun scaled(Setup::kFp32Sgd);
  scaled.scaler = std::make_unique<ag::amp::GradScaler>(ag::amp::GradScalerOptions{.init_scale = 4096});
  ck::save_checkpoint(path("scaled.safetensors"), scaled.state());
  ck::TrainingState state = unscaled.state();
  ck::load_checkpoint(path("scaled.safetensors"), state);
  EXPECT_FALSE(unscaled.scaler->is_enabled());
  EXPECT_EQ(unscaled.scaler->get_scale(), 1.0);
}

TEST_F(CheckpointFileTest, LoadModelFillsTheSameHandles) {
  ag::manual_seed(8);
  ag::nn::Linear a(4, 3), b(4, 3);
  const ag::Tensor handle = b.weight;
  ck::save_model(path("a.safetensors"), a);
  ck::load_model(path("a.safetensors"), b);
  EXPECT_TRUE(handle.is_same(b.weight));
  EXPECT_EQ(b.weight.to_vector(), a.weight.to_vector());
  EXPECT_EQ(b.bias.to_vector(), a.bias.to_vector());
}

}  // namespace
