// The FP8 scaling states of a model's weights in a checkpoint: for each parameter that has them
// (amp::float8_state), "fp8.<parameter name>.<input|weight|grad_output>.scale" [1] and
// ".amax_history" [L], float32. Restored states close their step at the next Float8Guard's first
// use, as they would have uninterrupted, so delayed scaling resumes bit for bit.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/float8_scaling.h"
#include "nn/module.h"

namespace ampgrad::checkpoint::detail {

inline constexpr const char* kFloat8Prefix = "fp8.";

/// The tensors that save `model`'s weights' FP8 states.
std::vector<std::pair<std::string, Tensor>> float8_tensors(const nn::Module& model);

/// Each parameter's FP8 state as the file has it (null: none), validated; by parameter name.
/// Throws naming `path` and the tensor when an entry is malformed or names no parameter.
std::map<std::string, std::shared_ptr<Float8LinearState>> float8_states_from(
    const std::vector<std::pair<std::string, Tensor>>& tensors, const nn::Module& model, const std::string& path);

/// Sets every parameter's FP8 state to `states`' (none where it has none); returns the states the
/// parameters had, for a rollback.
std::map<std::string, std::shared_ptr<Float8LinearState>> set_float8_states(
    nn::Module& model, const std::map<std::string, std::shared_ptr<Float8LinearState>>& states);

}  // namespace ampgrad::checkpoint::detail
