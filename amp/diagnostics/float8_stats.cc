// FP8 diagnostics read from the scaling states that live with each weight (see float8_stats.h).
#include "amp/diagnostics/float8_stats.h"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "amp/diagnostics/grad_stats.h"
#include "framework/tensor_impl.h"

namespace ampgrad::amp {

namespace {

double fraction(int64_t count, int64_t numel) {
  return numel > 0 ? static_cast<double>(count) / static_cast<double>(numel) : 0.0;
}

std::string percent(double f) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g%%", 100.0 * f);
  return text;
}

}  // namespace

double Float8TensorStats::saturated_fraction() const { return fraction(saturated, numel); }
double Float8TensorStats::flushed_fraction() const { return fraction(flushed, numel); }

double Float8TensorStats::headroom_log2() const {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return std::nan("");
  return std::log2(dtype_info(format).max / (static_cast<double>(amax) * scale));
}

std::string Float8TensorStats::to_string() const {
  std::ostringstream out;
  out << name << ' ' << role_name(role) << " (" << dtype_name(format) << ", scale " << format_scale(scale)
      << "): amax " << amax << ", " << percent(saturated_fraction()) << " saturated, " << percent(flushed_fraction())
      << " flushed to zero";
  return out.str();
}

std::vector<Float8TensorStats> float8_stats(const std::vector<std::pair<std::string, Tensor>>& named_parameters) {
  std::vector<Float8TensorStats> out;
  for (const auto& [name, p] : named_parameters) {
    if (!p.defined()) continue;
    Float8LinearState* state = p.impl()->float8.get();
    if (state == nullptr) continue;
    const std::lock_guard<std::mutex> lock(state->mutex);  // a backward may be casting on another thread
    for (Float8Role role : kFloat8Roles) {
      const Float8ScalingState& s = state->of(role);
      const Float8CastCounts& c = s.step_counts();
      if (c.numel == 0 && s.step == 0) continue;  // never cast (a linear without input gradient)
      out.push_back({.name = name,
                     .role = role,
                     .format = c.format,
                     .step = s.step,
                     .scale = c.scale,
                     .amax = c.amax,
                     .numel = c.numel,
                     .saturated = c.saturated,
                     .flushed = c.flushed});
    }
  }
  return out;
}

std::string float8_stats_table(const std::vector<Float8TensorStats>& stats) {
  std::ostringstream out;
  out << "FP8 casts of the latest step (" << stats.size() << " tensor" << (stats.size() == 1 ? "" : "s") << "):\n";
  for (const Float8TensorStats& s : stats) out << "  " << s.to_string() << '\n';
  return out.str();
}

}  // namespace ampgrad::amp
