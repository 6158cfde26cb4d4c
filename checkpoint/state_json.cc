// JSON encodings of the optimizer, scaler and scheduler states, with shape checks on decoding.
#include "checkpoint/state_json.h"

#include <cstdio>
#include <cstdlib>

#include "framework/error.h"

namespace ampgrad::checkpoint::detail {

namespace {

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

// The field `key` of object `j`, which must exist.
const json& field(const json& j, const char* key, const std::string& what, const std::string& path) {
  AG_CHECK(j.is_object() && j.contains(key), "load_checkpoint(", path, "): the ", what, " has no '", key, "'");
  return j.at(key);
}

}  // namespace

json optimizer_to_json(const optim::Optimizer& optimizer) {
  json groups = json::array();
  for (const optim::GroupState& g : optimizer.param_group_state()) {
    json options = json::object();
    for (const auto& [key, value] : g.options) options[key] = exact(value);
    groups.push_back({{"num_params", g.num_params}, {"options", options}});
  }
  json counters = json::array();
  for (const optim::ParamState& p : optimizer.state()) counters.push_back(p.counters);
  return {{"name", optimizer.name()}, {"param_groups", groups}, {"counters", counters}};
}

OptimizerMeta optimizer_from_json(const json& j, const std::string& format_version, const std::string& path) {
  const std::string what = "optimizer metadata";
  OptimizerMeta meta;
  const json& name = field(j, "name", what, path);
  AG_CHECK(name.is_string(), "load_checkpoint(", path, "): the optimizer name is not a string");
  meta.name = name.get<std::string>();
  if (format_version == "1") {
    meta.v1_lr = parse_exact(field(j, "lr", what, path), "optimizer lr", path);
  } else {
    const json& groups = field(j, "param_groups", what, path);
    AG_CHECK(groups.is_array(), "load_checkpoint(", path, "): param_groups is not an array");
    for (const json& g : groups) {
      const json& n = field(g, "num_params", "parameter group", path);
      const json& options = field(g, "options", "parameter group", path);
      AG_CHECK(n.is_number_unsigned() && options.is_object(), "load_checkpoint(", path,
               "): a parameter group has fields of the wrong type");
      optim::GroupState state{.num_params = n.get<size_t>()};
      for (const auto& [key, value] : options.items()) state.options[key] = parse_exact(value, "option " + key, path);
      meta.groups.push_back(state);
    }
  }
  const json& counters = field(j, "counters", what, path);
  AG_CHECK(counters.is_array(), "load_checkpoint(", path, "): the optimizer counters are not an array");
  for (const json& c : counters) {
    AG_CHECK(c.is_object(), "load_checkpoint(", path, "): an optimizer counter set is not an object");
    std::map<std::string, int64_t> out;
    for (const auto& [key, value] : c.items()) {
      AG_CHECK(value.is_number_integer(), "load_checkpoint(", path, "): counter '", key, "' is not an integer");
      out[key] = value.get<int64_t>();
    }
    meta.counters.push_back(out);
  }
  return meta;
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
  auto get = [&](const char* key) -> const json& { return field(j, key, "scaler state", path); };
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

json scheduler_to_json(const optim::LRSchedulerState& s) {
  json base = json::array();
  for (double lr : s.base_lrs) base.push_back(exact(lr));
  return {{"last_epoch", s.last_epoch}, {"base_lrs", base}};
}

optim::LRSchedulerState scheduler_from_json(const json& j, const std::string& path) {
  const json& epoch = field(j, "last_epoch", "scheduler state", path);
  const json& base = field(j, "base_lrs", "scheduler state", path);
  AG_CHECK(epoch.is_number_integer() && base.is_array(), "load_checkpoint(", path,
           "): the scheduler state has fields of the wrong type");
  optim::LRSchedulerState s{.last_epoch = epoch.get<int64_t>()};
  for (const json& lr : base) s.base_lrs.push_back(parse_exact(lr, "scheduler base lr", path));
  return s;
}

}  // namespace ampgrad::checkpoint::detail
