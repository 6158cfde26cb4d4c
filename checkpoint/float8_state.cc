// FP8 scaling states in checkpoints (see float8_state.h).
#include "checkpoint/float8_state.h"

#include <array>
#include <mutex>
#include <set>

#include "framework/error.h"
#include "framework/tensor_impl.h"

namespace ampgrad::checkpoint::detail {

namespace {



bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One state's two tensors as read, before they are checked together.
struct Parts {
  std::array<Tensor, 3> scale, history;
};

}  // namespace

std::vector<std::pair<std::string, Tensor>> float8_tensors(const nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, p] : model.named_parameters()) {
    Float8LinearState* state = p.impl()->float8.get();
    if (state == nullptr) continue;
    const std::lock_guard<std::mutex> lock(state->mutex);  // a backward on another thread may be casting
    for (Float8Role role : kFloat8Roles) {
      const Float8ScalingState& s = state->of(role);
      const std::string key = kFloat8Prefix + name + "." + std::string(float8_role_name(role));
      out.emplace_back(key + ".scale", Tensor::from_vector(std::vector<float>{s.scale()}, {1}));
      out.emplace_back(key + ".amax_history",
                       Tensor::from_vector(s.amax_history(), {static_cast<int64_t>(s.amax_history().size())}));
    }
  }
  return out;
}

std::map<std::string, std::shared_ptr<Float8LinearState>> float8_states_from(
    const std::vector<std::pair<std::string, Tensor>>& tensors, const nn::Module& model, const std::string& path) {
  std::set<std::string> parameters, model_keys;
  for (const auto& [name, p] : model.named_parameters()) parameters.insert(name);
  for (const auto& [name, t] : model.state_dict()) model_keys.insert(name);
  std::map<std::string, Parts> parts;
  const std::string prefix = kFloat8Prefix;
  for (const auto& [key, t] : tensors) {
    if (key.rfind(prefix, 0) != 0 || model_keys.count(key) != 0) continue;  // a module named "fp8" has its own
    bool matched = false;
    for (size_t r = 0; r < kFloat8Roles.size() && !matched; ++r) {
      for (const bool is_scale : {true, false}) {
        const std::string tail =
            "." + std::string(float8_role_name(kFloat8Roles[r])) + (is_scale ? ".scale" : ".amax_history");
        if (!ends_with(key, tail) || key.size() <= prefix.size() + tail.size()) continue;
        const std::string parameter = key.substr(prefix.size(), key.size() - prefix.size() - tail.size());
        AG_CHECK(parameters.count(parameter) != 0, "load_checkpoint(", path, "): FP8 state '", key,
                 "' names no parameter of the model ('", parameter, "'); hint: the file was saved from a different "
                 "architecture");
        AG_CHECK(t.dtype() == DType::kFloat32 && t.dim() == 1 && t.numel() >= 1 && (!is_scale || t.numel() == 1),
                 "load_checkpoint(", path, "): FP8 state '", key, "' is ", t.to_string(), " but must be float32 [",
                 is_scale ? "1" : "L >= 1", "]");
        (is_scale ? parts[parameter].scale : parts[parameter].history)[r] = t;
        matched = true;
        break;
      }
    }
    AG_CHECK(matched, "load_checkpoint(", path, "): '", key, "' is not an FP8 state tensor (",
             "fp8.<parameter>.<input|weight|grad_output>.<scale|amax_history>)");
  }
  std::map<std::string, std::shared_ptr<Float8LinearState>> out;
  for (const auto& [parameter, p] : parts) {
    auto state = std::make_shared<Float8LinearState>();
    for (size_t r = 0; r < kFloat8Roles.size(); ++r) {
      AG_CHECK(p.scale[r].defined() && p.history[r].defined(), "load_checkpoint(", path, "): the FP8 state of '",
               parameter, "' lacks its ", float8_role_name(kFloat8Roles[r]), " scale or amax history");
      try {
        state->of(kFloat8Roles[r]).restore(p.scale[r].item<float>(), p.history[r].to_vector());
      } catch (const Error& e) {
        AG_FAIL("load_checkpoint(", path, "): the FP8 ", float8_role_name(kFloat8Roles[r]), " state of '", parameter,
                "': ", e.what());
      }
    }
    out[parameter] = std::move(state);
  }
  return out;
}

std::map<std::string, std::shared_ptr<Float8LinearState>> set_float8_states(
    nn::Module& model, const std::map<std::string, std::shared_ptr<Float8LinearState>>& states) {
  std::map<std::string, std::shared_ptr<Float8LinearState>> previous;
  for (const auto& [name, p] : model.named_parameters()) {
    previous[name] = p.impl()->float8;
    auto it = states.find(name);
    p.impl()->float8 = it == states.end() ? nullptr : it->second;
  }
  return previous;
}

}  // namespace ampgrad::checkpoint::detail
