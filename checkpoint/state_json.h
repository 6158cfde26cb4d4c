// The JSON a checkpoint keeps in its safetensors metadata for the optimizer, the GradScaler and
// the lr scheduler. Doubles travel as hexadecimal text ("%a"): exact, and inf is allowed.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/scheduler.h"

namespace ampgrad::checkpoint::detail {

using nlohmann::json;

/// What the optimizer metadata holds: its kind, each group's size and options, and each
/// parameter's counters. Format "1" files saved only one lr and no groups: then `groups` is
/// empty and `v1_lr` holds that lr.
struct OptimizerMeta {
  std::string name;
  std::vector<optim::GroupState> groups;
  double v1_lr = 0.0;
  std::vector<std::map<std::string, int64_t>> counters;
};

json optimizer_to_json(const optim::Optimizer& optimizer);
/// Decodes and checks the shape of the metadata (the optimizer checks the values when loading).
OptimizerMeta optimizer_from_json(const json& j, const std::string& format_version, const std::string& path);

json scaler_to_json(const amp::GradScalerState& s);
amp::GradScalerState scaler_from_json(const json& j, const std::string& path);

json scheduler_to_json(const optim::LRSchedulerState& s);
optim::LRSchedulerState scheduler_from_json(const json& j, const std::string& path);

}  // namespace ampgrad::checkpoint::detail
