// Checkpoint contents: every optimizer option per group is saved and restored (as PyTorch's
// load_state_dict), format "1" files still load, tied and nested modules are saved under every
// PyTorch state_dict name, and mismatches are refused without changing anything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace ck = ampgrad::checkpoint;
namespace nn = ampgrad::nn;
namespace optim = ampgrad::optim;
namespace fs = std::filesystem;
using ag::Tensor;
using ag::test::throws_error;

namespace {

class CheckpointFormat : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }
  ag::test::ScratchDir scratch_{"checkpoint_format"};
};

std::vector<std::string> keys_of(const ck::NamedTensors& file) {
  std::vector<std::string> out;
  for (const auto& [name, t] : file.tensors) out.push_back(name);
  return out;
}

void train_steps(nn::Module& model, optim::Optimizer& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    ag::ops::mse_loss(model(ag::randn({4, 3})), ag::randn({4, 2})).backward();
    opt.step();
  }
}

TEST_F(CheckpointFormat, OptimizerOptionsComeFromTheFile) {
  ag::manual_seed(1);
  nn::Sequential model{nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2)};
  optim::SGD source(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  train_steps(model, source, 2);
  source.set_lr(0.02);
  ck::save_checkpoint(path("sgd.safetensors"), {.model = &model, .optimizer = &source});

  nn::Sequential other{nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2)};
  optim::SGD target(other.parameters(), {.lr = 0.5});  // momentum 0, as PyTorch's test case
  ck::TrainingState state{.model = &other, .optimizer = &target};
  ck::load_checkpoint(path("sgd.safetensors"), state);
  EXPECT_EQ(target.options().momentum, 0.9);
  EXPECT_EQ(target.options().weight_decay, 1e-3);
  EXPECT_EQ(target.lr(), 0.02);
  // Both continue identically.
  ag::manual_seed(2);
  train_steps(model, source, 2);
  ag::manual_seed(2);
  train_steps(other, target, 2);
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    EXPECT_EQ(other.parameters()[i].to_vector(), model.parameters()[i].to_vector()) << i;
  }
}

TEST_F(CheckpointFormat, GroupMismatchesAreRefusedAndChangeNothing) {
  ag::manual_seed(3);
  nn::Sequential model{nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2)};
  const std::vector<Tensor> ps = model.parameters();
  optim::Adam two({{.params = {ps[0], ps[1]}}, {.params = {ps[2], ps[3]}}}, {.lr = 0.01});
  ck::save_checkpoint(path("two.safetensors"), {.model = &model, .optimizer = &two});

  nn::Sequential other{nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2)};
  const std::vector<double> before = other.parameters()[0].to_double_vector();
  optim::Adam one(other.parameters(), {.lr = 0.3});
  ck::TrainingState state{.model = &other, .optimizer = &one};
  EXPECT_TRUE(throws_error([&] { ck::load_checkpoint(path("two.safetensors"), state); },
                           {"2 parameter groups", "has 1", "add_param_group"}));
  const std::vector<Tensor> qs = other.parameters();
  optim::Adam uneven({{.params = {qs[0]}}, {.params = {qs[1], qs[2], qs[3]}}}, {.lr = 0.3});
  state.optimizer = &uneven;
  EXPECT_TRUE(throws_error([&] { ck::load_checkpoint(path("two.safetensors"), state); }, {"group 0", "2 parameters"}));
  EXPECT_EQ(other.parameters()[0].to_double_vector(), before);
  EXPECT_EQ(uneven.lr(0), 0.3);

  // A scheduler asked for but not in the file.
  optim::Adam same({{.params = {qs[0], qs[1]}}, {.params = {qs[2], qs[3]}}}, {.lr = 0.3});
  optim::StepLR scheduler(same, 10);
  ck::TrainingState with_scheduler{.model = &other, .optimizer = &same, .scheduler = &scheduler};
  EXPECT_TRUE(throws_error([&] { ck::load_checkpoint(path("two.safetensors"), with_scheduler); },
                           {"ampgrad.scheduler"}));
  EXPECT_EQ(same.lr(1), 0.3);
}

TEST_F(CheckpointFormat, FormatOneFilesStillLoad) {
  // tests/data/checkpoint_v1.safetensors was written by format 1's save_checkpoint: seed 7,
  // Sequential{Linear(3, 4), ReLU(), Linear(4, 2)}, SGD(lr 0.05, momentum 0.9), a GradScaler
  // (init_scale 256, growth_interval 5), two steps, then set_lr(0.025), user metadata step=2.
  const std::string file = "tests/data/checkpoint_v1.safetensors";
  const ck::NamedTensors raw = ck::load_safetensors(file);
  ASSERT_EQ(raw.metadata.at("ampgrad.format_version"), "1");
  nn::Sequential model{nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2)};
  optim::SGD sgd(model.parameters(), {.lr = 0.5, .momentum = 0.9, .weight_decay = 0.25});
  ag::amp::GradScaler scaler;
  ck::TrainingState state{.model = &model, .optimizer = &sgd, .scaler = &scaler};
  ck::load_checkpoint(file, state);
  EXPECT_EQ(state.user_metadata.at("step"), "2");
  EXPECT_EQ(sgd.lr(), 0.025);                   // format 1 saved the lr ...
  EXPECT_EQ(sgd.options().weight_decay, 0.25);  // ... and no other option: those stay as built
  EXPECT_EQ(scaler.get_scale(), 256);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  int checked = 0;
  for (const auto& [name, t] : raw.tensors) {
    if (name == "0.weight") {
      EXPECT_EQ(model.parameters()[0].to_vector(), t.to_vector());
      ++checked;
    } else if (name == "optimizer.3.momentum_buffer") {
      EXPECT_EQ(sgd.momentum_buffer(3).to_vector(), t.to_vector());
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
  // A format this build does not know is refused clearly.
  ck::NamedTensors future = raw;
  future.metadata["ampgrad.format_version"] = "3";
  ck::save_safetensors(path("future.safetensors"), future);
  EXPECT_TRUE(throws_error([&] { ck::load_checkpoint(path("future.safetensors"), state); },
                           {"format 1 or 2", "says format 3"}));
}

TEST_F(CheckpointFormat, TiedAndNestedModulesUseEveryStateDictName) {
  ag::manual_seed(4);
  nn::Linear shared(3, 3);
  nn::Sequential tied{shared, nn::ReLU(), shared};
  ck::save_model(path("tied.safetensors"), tied);
  // As PyTorch's state_dict: the tied parameter under both names, so load_state_dict of the
  // equivalent nn.Module (whose state_dict also has both) accepts the file.
  EXPECT_EQ(keys_of(ck::load_safetensors(path("tied.safetensors"))),
            (std::vector<std::string>{"0.bias", "0.weight", "2.bias", "2.weight"}));  // sorted by the format
  nn::Linear fresh(3, 3);
  nn::Sequential loaded{fresh, nn::ReLU(), fresh};
  ck::load_model(path("tied.safetensors"), loaded);
  EXPECT_EQ(fresh.weight.to_vector(), shared.weight.to_vector());
  EXPECT_TRUE(loaded.at<nn::Linear>(2).weight.is_same(fresh.weight));  // still tied
  // An untied model of the same architecture loads it too.
  nn::Sequential untied{nn::Linear(3, 3), nn::ReLU(), nn::Linear(3, 3)};
  ck::load_model(path("tied.safetensors"), untied);
  EXPECT_EQ(untied.at<nn::Linear>(2).weight.to_vector(), shared.weight.to_vector());

  // Nested children and buffers, through a checkpoint with an optimizer over the deduped parameters.
  struct Block : nn::Module {
    Block() : fc(register_module("fc", nn::Linear(3, 3))), mask(register_buffer("mask", ag::ones({3}))) {}
    Tensor forward(const Tensor& x) override { return fc(x); }
    nn::Linear fc;
    Tensor& mask;
  };
  struct Net : nn::Module {
    Net() : blocks(register_module("blocks", nn::ModuleList{Block(), Block()})) {}
    nn::ModuleList blocks;
  };
  Net net;
  net.blocks.at<Block>(1).fc.weight = net.blocks.at<Block>(0).fc.weight;  // tie by assignment
  optim::AdamW opt(net.parameters(), {});
  EXPECT_EQ(opt.parameters().size(), 3u);
  ck::save_checkpoint(path("net.safetensors"), {.model = &net, .optimizer = &opt});
  const std::vector<std::string> keys = keys_of(ck::load_safetensors(path("net.safetensors")));
  for (const char* key : {"blocks.0.mask", "blocks.0.fc.weight", "blocks.0.fc.bias", "blocks.1.mask",
                          "blocks.1.fc.weight", "blocks.1.fc.bias"}) {
    EXPECT_EQ(std::count(keys.begin(), keys.end(), key), 1) << key;
  }
  Net other;
  other.blocks.at<Block>(1).fc.weight = other.blocks.at<Block>(0).fc.weight;
  optim::AdamW other_opt(other.parameters(), {});
  net.blocks.at<Block>(0).mask = ag::zeros({3});
  ck::save_checkpoint(path("net.safetensors"), {.model = &net, .optimizer = &opt});
  ck::TrainingState state{.model = &other, .optimizer = &other_opt};
  ck::load_checkpoint(path("net.safetensors"), state);
  EXPECT_EQ(other.blocks.at<Block>(0).mask.to_vector(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(other.blocks.at<Block>(1).fc.weight.to_vector(), net.blocks.at<Block>(0).fc.weight.to_vector());
}

}  // namespace
