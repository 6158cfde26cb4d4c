// Training-state checkpoints over safetensors: layout, validation, loading with rollback.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <map>

#include "checkpoint/float8_state.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_json.h"
#include "framework/copy.h"
#include "framework/error.h"
#include "framework/random.h"

namespace ampgrad::checkpoint {

namespace {

using detail::json;

// "2" saves every option of every parameter group and the scheduler; "1" (one lr, no groups) loads too.
constexpr const char* kFormatVersion = "2";

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

// A model tensor and the file's value for it.
struct Assignment {
  Tensor target;
  Tensor value;
};

// Which dtypes a file's tensor may have: a checkpoint resumes bit for bit, so its dtypes are the
// model's; a weights file converts, as PyTorch's load_state_dict (whose copy_ converts).
enum class DTypeRule { kExact, kConvertFloating };

// The name list of an error message: the first few, then how many more.
std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i == 0 ? "'" : ", '") + names[i] + "'";
  if (names.size() > 8) out += " and " + std::to_string(names.size() - 8) + " more";
  return out;
}

// Matches the file's tensors to the model's state_dict() (a tied parameter under each of its
// names, as PyTorch saves it) and checks each pair's shape and dtype. Keys starting with one of
// `ignored_prefixes` belong to others. Under kStrict a name the two do not share is an error, as in
// PyTorch's strict loading; under kNonStrict it goes to `report`.
std::vector<Assignment> model_tensors(const NamedTensors& file, const nn::Module& model, const std::string& path,
                                      const std::vector<std::string>& ignored_prefixes, KeyMatching keys,
                                      DTypeRule dtypes, LoadReport& report) {
  std::map<std::string, Tensor> by_name(file.tensors.begin(), file.tensors.end());
  std::map<std::string, std::string> unread = file.unread;
  std::vector<Assignment> out;
  for (const auto& [name, p] : model.state_dict()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      auto why = unread.find(name);
      AG_CHECK(why == unread.end(), "load(", path, "): tensor '", name, "' for the model's ", p.to_string(),
               " is stored as ", why->second, ", which ampgrad cannot read");
      report.missing_keys.push_back(name);
      continue;
    }
    const Tensor& t = it->second;
    auto widened = file.widened_from.find(name);
    const std::string stored = widened == file.widened_from.end() ? "" : " (" + widened->second + " in the file)";
    const bool dtype_ok = dtypes == DTypeRule::kExact ? t.dtype() == p.dtype() : is_floating(t.dtype()) == is_floating(p.dtype());
    AG_CHECK(t.shape() == p.shape() && dtype_ok, "load(", path, "): tensor '", name, "' is ", t.to_string(), stored,
             " but the model's is ", p.to_string(),
             dtypes == DTypeRule::kExact
                 ? "; hint: build the same architecture and model.to() the saved dtype before loading"
                 : "; hint: build the same architecture (floating tensors convert, integer ones load into int64)");
    out.push_back({p, t});
    by_name.erase(it);
  }
  const auto others = [&](const std::string& name) {
    return std::none_of(ignored_prefixes.begin(), ignored_prefixes.end(),
                        [&](const std::string& prefix) { return name.rfind(prefix, 0) == 0; });
  };
  for (const auto& [name, t] : by_name) {
    if (others(name)) report.unexpected_keys.push_back(name);
  }
  for (const auto& [name, why] : unread) {
    if (others(name)) report.unexpected_keys.push_back(name);
  }
  std::sort(report.unexpected_keys.begin(), report.unexpected_keys.end());
  if (keys == KeyMatching::kStrict && !(report.missing_keys.empty() && report.unexpected_keys.empty())) {
    std::string problems;
    if (!report.missing_keys.empty()) {
      problems = "the file has no tensor " + list_names(report.missing_keys) + " of the model's";
    }
    if (!report.unexpected_keys.empty()) {
      problems += (problems.empty() ? "" : "; ") + std::string("unexpected tensor ") +
                  list_names(report.unexpected_keys) + " that the model has no parameter or buffer for";
    }
    AG_FAIL("load(", path, "): ", problems, "; hint: the file was saved from a different architecture",
            ignored_prefixes.empty() ? " (KeyMatching::kNonStrict loads the names both have)" : "");
  }
  return out;
}

void assign(const std::vector<Assignment>& assignments) {
  for (const Assignment& a : assignments) {
    Tensor target = a.target;
    copy_(target, a.value);
  }
}

// The optimizer's per-parameter state from the file: counters from the metadata, tensors from
// the "optimizer.<index>.<name>" entries.
std::vector<optim::ParamState> optimizer_param_state(const NamedTensors& file, const detail::OptimizerMeta& meta,
                                                     size_t n, const std::string& path) {
  AG_CHECK(meta.counters.size() == n, "load_checkpoint(", path, "): the file has optimizer state for ",
           meta.counters.size(), " parameters, the optimizer has ", n);
  std::vector<optim::ParamState> out(n);
  for (size_t i = 0; i < n; ++i) out[i].counters = meta.counters[i];
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind("optimizer.", 0) != 0) continue;
    const size_t dot = name.find('.', 10);
    AG_CHECK(dot != std::string::npos, "load_checkpoint(", path, "): malformed optimizer tensor name '", name, "'");
    const std::string index_text = name.substr(10, dot - 10);
    const bool numeric = !index_text.empty() && index_text.size() < 10 &&
                         index_text.find_first_not_of("0123456789") == std::string::npos;
    AG_CHECK(numeric && std::stoul(index_text) < n, "load_checkpoint(", path, "): optimizer tensor '", name,
             "' names no parameter of this optimizer");
    out[std::stoul(index_text)].tensors[name.substr(dot + 1)] = t;
  }
  return out;
}

}  // namespace

void save_model(const std::string& path, const nn::Module& model) {
  NamedTensors file;
  file.tensors = model.state_dict();
  file.metadata["format"] = "pt";
  save_safetensors(path, file);
}

LoadReport load_model(const std::string& path, nn::Module& model, KeyMatching keys) {
  const NamedTensors file = load_safetensors(path);
  LoadReport report;
  assign(model_tensors(file, model, path, {}, keys, DTypeRule::kConvertFloating, report));
  return report;
}

void save_checkpoint(const std::string& path, const TrainingState& state) {
  AG_CHECK(state.model != nullptr, "save_checkpoint(", path, "): TrainingState::model is required");
  NamedTensors file;
  file.tensors = state.model->state_dict();
  for (auto& entry : detail::float8_tensors(*state.model)) file.tensors.push_back(std::move(entry));
  file.metadata["format"] = "pt";
  file.metadata["ampgrad.format_version"] = kFormatVersion;
  file.metadata["ampgrad.random"] = random::get_state();
  if (state.optimizer != nullptr) {
    const std::vector<optim::ParamState> params = state.optimizer->state();
    for (size_t i = 0; i < params.size(); ++i) {
      for (const auto& [name, t] : params[i].tensors) file.tensors.emplace_back(optimizer_key(i, name), t);
    }
    file.metadata["ampgrad.optimizer"] = detail::optimizer_to_json(*state.optimizer).dump();
  }
  if (state.scaler != nullptr) file.metadata["ampgrad.scaler"] = detail::scaler_to_json(state.scaler->state()).dump();
  if (state.scheduler != nullptr) {
    file.metadata["ampgrad.scheduler"] = detail::scheduler_to_json(state.scheduler->state()).dump();
  }
  for (const auto& [key, value] : state.user_metadata) file.metadata["user." + key] = value;
  save_safetensors(path, file);
}

void load_checkpoint(const std::string& path, TrainingState& state) {
  AG_CHECK(state.model != nullptr, "load_checkpoint(", path, "): TrainingState::model is required");
  const NamedTensors file = load_safetensors(path);
  auto version_it = file.metadata.find("ampgrad.format_version");
  const std::string version = version_it != file.metadata.end() ? version_it->second : "";
  AG_CHECK(version == "1" || version == kFormatVersion, "load_checkpoint(", path, "): not an ampgrad checkpoint of ",
           "format 1 or ", kFormatVersion, version.empty() ? "" : " (it says format " + version + ")",
           "; hint: use load_model for weights-only files");

  // Validate and decode everything first, so a bad file changes nothing.
  for (const auto& [name, why] : file.unread) {
    AG_CHECK(name.rfind("optimizer.", 0) != 0, "load_checkpoint(", path, "): optimizer tensor '", name,
             "' is stored as ", why, ", which ampgrad cannot read");
  }
  LoadReport unused;  // strict: any difference throws
  const std::vector<Assignment> model_values =
      model_tensors(file, *state.model, path, {"optimizer.", detail::kFloat8Prefix}, KeyMatching::kStrict,
                    DTypeRule::kExact, unused);
  const auto float8_states = detail::float8_states_from(file.tensors, *state.model, path);
  detail::OptimizerMeta optimizer_meta;
  std::vector<optim::ParamState> optimizer_state;
  if (state.optimizer != nullptr) {
    optimizer_meta = detail::optimizer_from_json(parse_metadata_json(file, "ampgrad.optimizer", path), version, path);
    AG_CHECK(optimizer_meta.name == state.optimizer->name(), "load_checkpoint(", path, "): the file holds a \"",
             optimizer_meta.name, "\" state but the optimizer is ", state.optimizer->name());
    optimizer_state = optimizer_param_state(file, optimizer_meta, state.optimizer->parameters().size(), path);
  }
  amp::GradScalerState scaler_state;
  if (state.scaler != nullptr) {
    scaler_state = detail::scaler_from_json(parse_metadata_json(file, "ampgrad.scaler", path), path);
    // `enabled` is the user's choice, never the file's (GradScaler::load_state enforces it too).
    AG_CHECK(scaler_state.options.enabled || !state.scaler->is_enabled(), "load_checkpoint(", path,
             "): the file was saved with a disabled GradScaler, which has no scale to resume, but this scaler ",
             "is enabled; resuming would silently stop loss scaling; hint: pass TrainingState::scaler = nullptr ",
             "to keep this scaler's own schedule");
  }
  optim::LRSchedulerState scheduler_state;
  if (state.scheduler != nullptr) {
    scheduler_state = detail::scheduler_from_json(parse_metadata_json(file, "ampgrad.scheduler", path), path);
  }
  auto rng = file.metadata.find("ampgrad.random");
  AG_CHECK(rng != file.metadata.end(), "load_checkpoint(", path, "): no random generator state in the metadata");

  // Apply: parameters first, so the optimizer keeps its exact FP32 masters (see load_state). The
  // optimizer's, scaler's and scheduler's own checks can still refuse their part; then everything
  // is rolled back, so a bad file never leaves a half-loaded run.
  std::vector<Assignment> saved_model;
  for (const Assignment& a : model_values) {
    Tensor copy = Tensor::empty(a.target.shape(), a.target.dtype(), a.target.device());
    copy_(copy, a.target);
    saved_model.push_back({a.target, copy});
  }
  optim::Optimizer* opt = state.optimizer;
  const std::vector<optim::ParamState> saved_optimizer =
      opt != nullptr ? opt->state() : std::vector<optim::ParamState>();
  const std::vector<optim::GroupState> saved_groups =
      opt != nullptr ? opt->param_group_state() : std::vector<optim::GroupState>();
  const amp::GradScalerState saved_scaler = state.scaler != nullptr ? state.scaler->state() : amp::GradScalerState();
  const optim::LRSchedulerState saved_scheduler =
      state.scheduler != nullptr ? state.scheduler->state() : optim::LRSchedulerState();
  std::map<std::string, std::shared_ptr<Float8LinearState>> saved_float8;
  bool float8_set = false;
  try {
    assign(model_values);
    saved_float8 = detail::set_float8_states(*state.model, float8_states);
    float8_set = true;
    if (opt != nullptr) {
      opt->load_state(optimizer_state);
      if (version == "1") {
        opt->set_lr(optimizer_meta.v1_lr);  // format 1 saved the lr alone; the other options stay as built
      } else {
        opt->load_param_group_state(optimizer_meta.groups);
      }
    }
    if (state.scaler != nullptr) state.scaler->load_state(scaler_state);
    if (state.scheduler != nullptr) state.scheduler->load_state(scheduler_state);
    random::set_state(rng->second);
  } catch (...) {
    assign(saved_model);
    if (float8_set) detail::set_float8_states(*state.model, saved_float8);
    if (opt != nullptr) {
      opt->load_state(saved_optimizer);
      opt->load_param_group_state(saved_groups);
    }
    if (state.scaler != nullptr) state.scaler->load_state(saved_scaler);
    if (state.scheduler != nullptr) state.scheduler->load_state(saved_scheduler);
    throw;
  }
  state.user_metadata.clear();
  for (const auto& [key, value] : file.metadata) {
    if (key.rfind("user.", 0) == 0) state.user_metadata[key.substr(5)] = value;
  }
}

}  // namespace ampgrad::checkpoint
