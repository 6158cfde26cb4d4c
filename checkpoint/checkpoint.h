// Whole training states in one safetensors file: the model's state_dict() under its PyTorch
// names, the optimizer's tensors under "optimizer.<index>.<name>", and in the header's
// __metadata__ (JSON) the optimizer's kind, its groups' options and its counters, the
// GradScaler's, the lr scheduler's and the random generator's states. Saving is atomic; loading
// validates the whole file before it changes anything.
#pragma once

#include <map>
#include <string>

#include "amp/grad_scaler.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

namespace ampgrad::checkpoint {

/// What a checkpoint holds. The model is required; the rest is optional.
struct TrainingState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  amp::GradScaler* scaler = nullptr;
  std::map<std::string, std::string> user_metadata = {};  // saved as given, returned by load
  optim::LRScheduler* scheduler = nullptr;
};

/// Saves the state and the global random generator's state to `path` (atomically).
void save_checkpoint(const std::string& path, const TrainingState& state);
/// Restores everything save_checkpoint saved into the given objects, which must match the saved
/// ones (same architecture, dtypes, optimizer kind and group sizes). The optimizer's options come
/// from the file, lr included (PyTorch's load_state_dict); a format "1" file restores the lr
/// alone. Fills state.user_metadata. Resuming then continues bit-for-bit as the uninterrupted
/// run would have.
void load_checkpoint(const std::string& path, TrainingState& state);

/// The model's state_dict() alone: a file PyTorch loads with safetensors.torch.load_file into the
/// state_dict of the same architecture (a tied parameter is stored under each name, as there).
void save_model(const std::string& path, const nn::Module& model);
void load_model(const std::string& path, nn::Module& model);

}  // namespace ampgrad::checkpoint
