// Whole training states in one safetensors file: the model's state_dict() under its PyTorch
// names, the optimizer's tensors under "optimizer.<index>.<name>", the FP8 scaling states of
// the weights that have them under "fp8.<parameter>.<role>.<scale|amax_history>"
// (float8_state.h), and in the header's
// __metadata__ (JSON) the optimizer's kind, its groups' options and its counters, the
// GradScaler's, the lr scheduler's and the random generator's states. Saving is atomic; loading
// validates the whole file before it changes anything.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

namespace ampgrad::checkpoint {

/// What a checkpoint holds. The model is required; the rest is optional.
struct TrainingState {
  nn::Module* model = nullptr;  ///< its state_dict (required)
  optim::Optimizer* optimizer = nullptr;  ///< its parameter groups, masters and state (optional)
  amp::GradScaler* scaler = nullptr;  ///< the loss scale and schedule (optional)
  std::map<std::string, std::string> user_metadata = {};  ///< saved as given, returned by load
  optim::LRScheduler* scheduler = nullptr;  ///< its epoch and learning rates (optional)
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

/// How load_model matches the file's names to the model's state_dict() (PyTorch's `strict`).
enum class KeyMatching {
  kStrict,     // every name of the model in the file and no other: else an Error listing them all
  kNonStrict,  // load the names both have; report the others
};

/// The names load_model did not load (PyTorch's load_state_dict result).
struct LoadReport {
  std::vector<std::string> missing_keys;     ///< in the model's state_dict(), not in the file
  std::vector<std::string> unexpected_keys;  ///< in the file (read or not), not in the model
};

/// Loads a state_dict file (save_model's, or PyTorch's safetensors.torch.save_file of a
/// state_dict) into `model`, as PyTorch's load_state_dict: each tensor needs the model's shape; a
/// floating one is converted to the model's floating dtype (an F16 or BF16 file into an FP32
/// model: widening is exact, narrowing rounds once), an integer one loads into an int64 tensor.
/// A floating value for an int64 tensor, or the reverse, is an Error, as is a name the model has
/// but whose dtype the reader could not hold (NamedTensors::unread). Names the two do not share
/// are an Error under kStrict and returned under kNonStrict. Nothing changes unless it all loads.
LoadReport load_model(const std::string& path, nn::Module& model, KeyMatching keys = KeyMatching::kStrict);

}  // namespace ampgrad::checkpoint
