// Whole training states in one safetensors file: the model's parameters under their PyTorch
// state_dict names, the optimizer's tensors under "optimizer.<index>.<name>", and in the header's
// __metadata__ (JSON) the optimizer's kind, lr and counters, the GradScaler's state and the
// random generator's state. Saving is atomic; loading validates the whole file before it
// changes anything.
#pragma once

#include <map>
#include <string>

#include "amp/grad_scaler.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace ampgrad::checkpoint {

/// What a checkpoint holds. The model is required; the optimizer and scaler are optional.
struct TrainingState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  amp::GradScaler* scaler = nullptr;
  std::map<std::string, std::string> user_metadata = {};  // saved as given, returned by load
};

/// Saves the state and the global random generator's state to `path` (atomically).
void save_checkpoint(const std::string& path, const TrainingState& state);
/// Restores everything save_checkpoint saved into the given objects, which must match the saved
/// ones (same architecture, dtypes, optimizer kind). Fills state.user_metadata. Resuming then
/// continues bit-for-bit as the uninterrupted run would have.
void load_checkpoint(const std::string& path, TrainingState& state);

/// The model's parameters alone: a file PyTorch loads with safetensors.torch.load_file into the
/// state_dict of the same architecture.
void save_model(const std::string& path, const nn::Module& model);
void load_model(const std::string& path, nn::Module& model);

}  // namespace ampgrad::checkpoint
