// Training-state checkpoints over safetensors: layout, metadata encoding, validation.
#include "checkpoint/checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "framework/copy.h"
#include "framework/error.h"
#include "framework/random.h"

namespace ampgrad::checkpoint {

namespace {

using nlohmann::json;

constexpr const char* kFormatVersion = "1";

// Doubles travel as hexadecimal text: exact, and inf (an unbounded max_scale) is allowed.
std::string exact(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%a", v);
  return text;
}

double parse_exact(const json& v, const std::string& what, const std::string& path) {
  AG_CHECK(v.is_string(), "load_checkpoint(", path, "): ", what, " is not a number string");
  const std::string text = v.get<std::string>();
  char* end = nullptr;
  const double out = std::strtod(text.c_str(), &end);
  AG_CHECK(end != text.c_str() && *end == '\0', "load_checkpoint(", path, "): ", what, " '", text, "' is not a number");
  return out;
}

json scaler_to_json(const amp::GradScalerState& s) {
  const amp::GradScalerOptions& o = s.options;
  return {{"scale", exact(s.scale)},
          {"growth_tracker", s.growth_tracker},
          {"init_scale", exact(o.init_scale)},
          {"growth_factor", exact(o.growth_factor)},
          {"backoff_factor", exact(o.backoff_factor)},
          {"growth_interval", o.growth_interval},
          {"enabled", o.enabled},
          {"min_scale", exact(o.min_scale)},
          {"max_scale", exact(o.max_scale)}};
}

amp::GradScalerState scaler_from_json(const json& j, const std::string& path) {
  auto get = [&](const char* key) -> const json& {
    AG_CHECK(j.contains(key), "load_checkpoint(", path, "): the scaler state has no '", key, "'");
    return j.at(key);
  };
  AG_CHECK(get("growth_tracker").is_number_integer() && get("growth_interval").is_number_integer() &&
               get("enabled").is_boolean(),
           "load_checkpoint(", path, "): the scaler state has fields of the wrong type");
  amp::GradScalerState s;
  s.scale = parse_exact(get("scale"), "scaler scale", path);
  s.growth_tracker = get("growth_tracker").get<int64_t>();
  s.options.init_scale = parse_exact(get("init_scale"), "scaler init_scale", path);
  s.options.growth_factor = parse_exact(get("growth_factor"), "scaler growth_factor", path);
  s.options.backoff_factor = parse_exact(get("backoff_factor"), "scaler backoff_factor", path);
  s.options.growth_interval = get("growth_interval").get<int64_t>();
  s.options.enabled = get("enabled").get<bool>();
  s.options.min_scale = parse_exact(get("min_scale"), "scaler min_scale", path);
  s.options.max_scale = parse_exact(get("max_scale"), "scaler max_scale", path);
  return s;
}

json parse_metadata_json(const NamedTensors& file, const std::string& key, const std::string& path) {
  auto it = file.metadata.find(key);
  AG_CHECK(it != file.metadata.end(), "load_checkpoint(", path, "): no '", key, "' in the file's metadata; ",
           "hint: was it written by save_checkpoint with that part of the state?");
  try {
    return json::parse(it->second);
  } catch (const json::exception& e) {
    AG_FAIL("load_checkpoint(", path, "): metadata '", key, "' is not valid JSON: ", e.what());
  }
}

std::string optimizer_key(size_t index, const std::string& name) {
  return "optimizer." + std::to_string(index) + "." + name;
}

// Checks that `file` holds every parameter of `model` with its shape and dtype, and returns them
// in the model's order. Keys starting with `ignored_prefix` belong to others; any other key is
// unexpected (a different architecture) and an error, as in PyTorch's strict loading.
std::vector<Tensor> model_tensors(const NamedTensors& file, const nn::Module& model, const std::string& path,
                                  const std::string& ignored_prefix) {
  std::map<std::string, Tensor> by_name(file.tensors.begin(), file.tensors.end());
  std::vector<Tensor> out;
  for (const auto& [name, p] : model.named_parameters()) {
    auto it = by_name.find(name);
    AG_CHECK(it != by_name.end(), "load(", path, "): the file has no tensor '", name, "' for the model's parameter ",
             p.to_string(), "; hint: the file was saved from a different architecture");
    const Tensor& t = it->second;
    AG_CHECK(t.shape() == p.shape() && t.dtype() == p.dtype(), "load(", path, "): tensor '", name, "' is ",
             t.to_string(), " but the model's parameter is ", p.to_string(),
             "; hint: build the same architecture and model.to() the saved dtype before loading");
    out.push_back(t);
    by_name.erase(it);
  }
  for (const auto& [name, t] : by_name) {
    AG_CHECK(!ignored_prefix.empty() && name.rfind(ignored_prefix, 0) == 0, "load(", path, "): unexpected tensor '",
             name, "' ", t.to_string(), " that the model has no parameter for");
  }
  return out;
}

void copy_into(const nn::Module& model, const std::vector<Tensor>& values) {
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    copy_(p, values[i]);
  }
}

}  // namespace

void save_model(const std::string& path, const nn::Module& model) {
  NamedTensors file;
  file.tensors = model.named_parameters();
  file.metadata["format"] = "pt";
  save_safetensors(path, file);
}

void load_model(const std::string& path, nn::Module& model) {
  const NamedTensors file = load_safetensors(path);
  copy_into(model, model_tensors(file, model, path, ""));
}

void save_checkpoint(const std::string& path, const TrainingState& state) {
  AG_CHECK(state.model != nullptr, "save_checkpoint(", path, "): TrainingState::model is required");
  NamedTensors file;
  file.tensors = state.model->named_parameters();
  file.metadata["format"] = "pt";
  file.metadata["ampgrad.format_version"] = kFormatVersion;
  file.metadata["ampgrad.random"] = random::get_state();
  if (state.optimizer != nullptr) {
    json counters = json::array();
    const std::vector<optim::ParamState> params = state.optimizer->state();
    for (size_t i = 0; i < params.size(); ++i) {
      for (const auto& [name, t] : params[i].tensors) file.tensors.emplace_back(optimizer_key(i, name), t);
      counters.push_back(params[i].counters);
    }
    file.metadata["ampgrad.optimizer"] =
        json{{"name", state.optimizer->name()}, {"lr", exact(state.optimizer->lr())}, {"counters", counters}}.dump();
  }
  if (state.scaler != nullptr) file.metadata["ampgrad.scaler"] = scaler_to_json(state.scaler->state()).dump();
  for (const auto& [key, value] : state.user_metadata) file.metadata["user." + key] = value;
  save_safetensors(path, file);
}

void load_checkpoint(const std::string& path, TrainingState& state) {
  AG_CHECK(state.model != nullptr, "load_checkpoint(", path, "): TrainingState::model is required");
  const NamedTensors file = load_safetensors(path);
  auto version = file.metadata.find("ampgrad.format_version");
  AG_CHECK(version != file.metadata.end() && version->second == kFormatVersion, "load_checkpoint(", path,
           "): not an ampgrad checkpoint of format ", kFormatVersion, "; hint: use load_model for weights-only files");

  // Validate and decode everything first, so a bad file changes nothing.
  const std::vector<Tensor> model_values = model_tensors(file, *state.model, path, "optimizer.");
  std::vector<optim::ParamState> optimizer_state;
  double lr = 0.0;
  if (state.optimizer != nullptr) {
    const json meta = parse_metadata_json(file, "ampgrad.optimizer", path);
    AG_CHECK(meta.is_object() && meta.contains("name") && meta.contains("lr") && meta.contains("counters") &&
                 meta["counters"].is_array(),
             "load_checkpoint(", path, "): malformed optimizer metadata");
    AG_CHECK(meta["name"] == state.optimizer->name(), "load_checkpoint(", path, "): the file holds a ",
             meta["name"].dump(), " state but the optimizer is ", state.optimizer->name());
    lr = parse_exact(meta["lr"], "optimizer lr", path);
    const size_t n = state.optimizer->parameters().size();
    AG_CHECK(meta["counters"].size() == n, "load_checkpoint(", path, "): the file has optimizer state for ",
             meta["counters"].size(), " parameters, the optimizer has ", n);
    optimizer_state.resize(n);
    for (size_t i = 0; i < n; ++i) {
      for (const auto& [key, value] : meta["counters"][i].items()) {
        AG_CHECK(value.is_number_integer(), "load_checkpoint(", path, "): counter '", key, "' is not an integer");
        optimizer_state[i].counters[key] = value.get<int64_t>();
      }
    }
    for (const auto& [name, t] : file.tensors) {
      if (name.rfind("optimizer.", 0) != 0) continue;
      const size_t dot = name.find('.', 10);
      AG_CHECK(dot != std::string::npos, "load_checkpoint(", path, "): malformed optimizer tensor name '", name, "'");
      const std::string index_text = name.substr(10, dot - 10);
      const bool numeric = !index_text.empty() && index_text.size() < 10 &&
                           index_text.find_first_not_of("0123456789") == std::string::npos;
      AG_CHECK(numeric && std::stoul(index_text) < n, "load_checkpoint(", path, "): optimizer tensor '", name,
               "' names no parameter of this optimizer");
      optimizer_state[std::stoul(index_text)].tensors[name.substr(dot + 1)] = t;
    }
  }
  amp::GradScalerState scaler_state;
  if (state.scaler != nullptr) scaler_state = scaler_from_json(parse_metadata_json(file, "ampgrad.scaler", path), path);
  auto rng = file.metadata.find("ampgrad.random");
  AG_CHECK(rng != file.metadata.end(), "load_checkpoint(", path, "): no random generator state in the metadata");

  // Apply: parameters first, so the optimizer keeps its exact FP32 masters (see load_state). The
  // optimizer's and the scaler's own checks can still refuse their part; then everything is
  // rolled back, so a bad file never leaves a half-loaded run.
  std::vector<Tensor> saved_params;
  for (const Tensor& p : state.model->parameters()) {
    Tensor copy = Tensor::empty(p.shape(), p.dtype(), p.device());
    copy_(copy, p);
    saved_params.push_back(copy);
  }
  const std::vector<optim::ParamState> saved_optimizer =
      state.optimizer != nullptr ? state.optimizer->state() : std::vector<optim::ParamState>();
  const double saved_lr = state.optimizer != nullptr ? state.optimizer->lr() : 0.0;
  const amp::GradScalerState saved_scaler = state.scaler != nullptr ? state.scaler->state() : amp::GradScalerState();
  try {
    copy_into(*state.model, model_values);
    if (state.optimizer != nullptr) {
      state.optimizer->load_state(optimizer_state);
      state.optimizer->set_lr(lr);
    }
    if (state.scaler != nullptr) state.scaler->load_state(scaler_state);
    random::set_state(rng->second);
  } catch (...) {
    copy_into(*state.model, saved_params);
    if (state.optimizer != nullptr) {
      state.optimizer->load_state(saved_optimizer);
      state.optimizer->set_lr(saved_lr);
    }
    if (state.scaler != nullptr) state.scaler->load_state(saved_scaler);
    throw;
  }
  state.user_metadata.clear();
  for (const auto& [key, value] : file.metadata) {
    if (key.rfind("user.", 0) == 0) state.user_metadata[key.substr(5)] = value;
  }
}

}  // namespace ampgrad::checkpoint
