// The training-memory breakdown: the bytes of parameters, gradients, masters and optimizer state
// for each recipe (exact, from the element sizes), a storage shared by two roles counted once, and
// the activations and peak the allocator saw during a step.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "framework/allocator.h"
#include "framework/dtype.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/linear.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/training_memory.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Device;
using ag::Tensor;
using ag::optim::MasterWeights;
using ag::optim::TrainingMemory;

namespace {

constexpr int64_t kIn = 64, kOut = 32, kBatch = 16;
constexpr int64_t kParams = kIn * kOut + kOut;

enum class Recipe { kFp32, kAutocastBf16, kBf16Masters, kBf16StochasticRounding, kBf16NoMasters };

// One Adam step of a Linear layer under `recipe`, metered.
TrainingMemory adam_step(Recipe recipe) {
  ag::manual_seed(3);
  ag::nn::Linear layer(kIn, kOut);
  const bool bf16_params = recipe != Recipe::kFp32 && recipe != Recipe::kAutocastBf16;
  if (bf16_params) layer.to(DType::kBFloat16);
  ag::optim::Adam opt(layer.parameters(), {.lr = 1e-3});
  if (recipe == Recipe::kBf16StochasticRounding) opt.set_master_weights(MasterWeights::kStochasticRounding);
  if (recipe == Recipe::kBf16NoMasters) opt.set_master_weights(MasterWeights::kNone);
  const DType input = bf16_params ? DType::kBFloat16 : DType::kFloat32;
  const Tensor x = ag::randn({kBatch, kIn}, input), target = ag::randn({kBatch, kOut}, input);

  ag::optim::MemoryMeter meter(Device::kCPU);
  Tensor loss;
  {
    ag::amp::AutocastGuard autocast(Device::kCPU, DType::kBFloat16, recipe == Recipe::kAutocastBf16);
    loss = ag::ops::mse_loss(layer(x), target);
  }
  meter.forward_done();
  loss.backward();
  opt.step();
  return meter.read(layer.parameters(), opt);
}

TEST(TrainingMemory, BytesPerParameterOfEachRecipe) {
  struct Expected {
    Recipe recipe;
    const char* name;
    int64_t params, grads, masters, state;  // bytes per parameter
  };
  for (const Expected& e : {Expected{Recipe::kFp32, "fp32", 4, 4, 0, 8},
                            Expected{Recipe::kAutocastBf16, "bf16 autocast", 4, 4, 0, 8},
                            Expected{Recipe::kBf16Masters, "bf16 + fp32 masters", 2, 2, 4, 8},
                            Expected{Recipe::kBf16StochasticRounding, "bf16 + stochastic rounding", 2, 2, 0, 8},
                            Expected{Recipe::kBf16NoMasters, "bf16, no masters", 2, 2, 0, 8}}) {
    SCOPED_TRACE(e.name);
    const TrainingMemory m = adam_step(e.recipe);
    std::printf("%-27s %s\n", e.name, m.to_string().c_str());
    EXPECT_EQ(m.num_parameters, kParams);
    EXPECT_EQ(m.parameters, e.params * kParams);
    EXPECT_EQ(m.gradients, e.grads * kParams);
    EXPECT_EQ(m.masters, e.masters * kParams);
    EXPECT_EQ(m.optimizer_state, e.state * kParams);
    EXPECT_EQ(m.training_state(), (e.params + e.grads + e.masters + e.state) * kParams);
    EXPECT_DOUBLE_EQ(m.per_parameter(m.training_state()), static_cast<double>(e.params + e.grads + e.masters + e.state));
    // The forward keeps at least its output for the backward, and the step's peak held the
    // whole training state at once (after the step's update, everything above is live).
    const int64_t out_bytes = kBatch * kOut * static_cast<int64_t>(ag::element_size(m.parameters == 4 * kParams
                                                                                         ? DType::kFloat32
                                                                                         : DType::kBFloat16));
    EXPECT_GE(m.activations, out_bytes);
    EXPECT_LT(m.activations, 8 * kBatch * kOut * 4 + 4096) << "a few tensors of the output's size at most";
    EXPECT_GE(m.peak, m.training_state());
    EXPECT_GE(m.peak, m.activations);
  }
}

TEST(TrainingMemory, SgdMomentumAndSharedStorageCountedOnce) {
  ag::manual_seed(4);
  ag::nn::Linear layer(kIn, kOut);
  ag::optim::SGD opt(layer.parameters(), {.lr = 0.1, .momentum = 0.9});
  ag::ops::mse_loss(layer(ag::randn({kBatch, kIn})), ag::randn({kBatch, kOut})).backward();
  opt.step();
  // The model's parameters are the optimizer's: listed twice, counted once.
  const TrainingMemory m = ag::optim::training_state_bytes(layer.parameters(), opt, Device::kCPU);
  EXPECT_EQ(m.parameters, 4 * kParams);
  EXPECT_EQ(m.gradients, 4 * kParams);
  EXPECT_EQ(m.masters, 0);
  EXPECT_EQ(m.optimizer_state, 4 * kParams) << "one momentum buffer";
  EXPECT_EQ(m.activations, 0) << "training_state_bytes meters no step";
  EXPECT_EQ(m.peak, 0);
  // Another device holds none of it.
  EXPECT_EQ(ag::optim::training_state_bytes(layer.parameters(), opt, Device::kCUDA).training_state(), 0);
}

TEST(TrainingMemory, OptimizerParametersThatAreNotTheModelsCountToo) {
  // As ZeRO's shards: the optimizer steps a tensor of its own in place of the model's.
  ag::manual_seed(5);
  Tensor model_weight = ag::randn({100}, DType::kBFloat16);
  model_weight.set_requires_grad(true);
  Tensor shard = ag::randn({50}, DType::kBFloat16);
  shard.set_requires_grad(true);
  ag::optim::Adam opt({shard}, {.lr = 1e-3});
  shard.set_grad(ag::randn({50}, DType::kBFloat16));
  opt.step();
  const TrainingMemory m = ag::optim::training_state_bytes({model_weight}, opt, Device::kCPU);
  EXPECT_EQ(m.num_parameters, 100) << "per parameter divides by the model's";
  EXPECT_EQ(m.parameters, 2 * 100 + 2 * 50);
  EXPECT_EQ(m.gradients, 2 * 50);
  EXPECT_EQ(m.masters, 4 * 50);
  EXPECT_EQ(m.optimizer_state, 8 * 50);
  EXPECT_NE(m.to_string().find("masters 0.0 MiB (2.00 B/param)"), std::string::npos) << m.to_string();
}

TEST(TrainingMemory, ActivationsAreZeroWithoutForwardDone) {
  ag::manual_seed(6);
  ag::nn::Linear layer(kIn, kOut);
  ag::optim::Adam opt(layer.parameters(), {.lr = 1e-3});
  ag::optim::MemoryMeter meter(Device::kCPU);
  ag::ops::mse_loss(layer(ag::randn({kBatch, kIn})), ag::randn({kBatch, kOut})).backward();
  opt.step();
  const TrainingMemory m = meter.read(layer.parameters(), opt);
  EXPECT_EQ(m.activations, 0);
  EXPECT_GE(m.peak, m.training_state());
  EXPECT_GE(ag::memory_stats(Device::kCPU).peak_bytes, m.peak) << "the meter reads the allocator's peak";
}

TEST(TrainingMemory, TheStepsPeakIsItsOwnAndTheProcessPeakIsGivenBack) {
  ag::manual_seed(7);
  ag::nn::Linear layer(kIn, kOut);
  ag::optim::SGD opt(layer.parameters(), {.lr = 0.1});
  { const Tensor big = ag::zeros({1 << 22}); }  // 16 MiB, freed before the step
  const int64_t peak_before = ag::memory_stats(Device::kCPU).peak_bytes;
  ASSERT_GE(peak_before, int64_t{4} << 22);
  ag::optim::MemoryMeter meter(Device::kCPU);
  ag::ops::mse_loss(layer(ag::randn({kBatch, kIn})), ag::randn({kBatch, kOut})).backward();
  opt.step();
  const TrainingMemory m = meter.read(layer.parameters(), opt);
  EXPECT_LT(m.peak, int64_t{4} << 22) << "the step's peak, not the earlier one";
  EXPECT_EQ(ag::memory_stats(Device::kCPU).peak_bytes, peak_before) << "memory_stats' peak as if never reset";
}

TEST(TrainingMemory, AMeterLeftWithoutReadingStillGivesThePeakBack) {
  { const Tensor big = ag::zeros({1 << 22}); }  // 16 MiB, freed before the meter starts
  const int64_t peak_before = ag::memory_stats(Device::kCPU).peak_bytes;
  ASSERT_GE(peak_before, int64_t{4} << 22);
  try {
    ag::optim::MemoryMeter meter(Device::kCPU);
    EXPECT_LT(ag::memory_stats(Device::kCPU).peak_bytes, peak_before) << "the meter starts the peak over";
    throw std::runtime_error("a step that failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(ag::memory_stats(Device::kCPU).peak_bytes, peak_before);
}

}  // namespace
