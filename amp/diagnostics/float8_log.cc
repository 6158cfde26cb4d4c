// FP8 scalars for TensorBoard and the amax-history chart (see float8_log.h).
#include "amp/diagnostics/float8_log.h"

#include <cmath>
#include <limits>

namespace ampgrad::amp {

void add_float8_stats(utils::SummaryWriter& writer, const std::vector<Float8TensorStats>& stats, int64_t step) {
  for (const Float8TensorStats& s : stats) {
    const std::string prefix = "fp8/" + s.name + "/" + std::string(role_name(s.role)) + "/";
    writer.add_scalar(prefix + "amax", s.amax, step);
    writer.add_scalar(prefix + "scale_log2", std::log2(s.scale), step);
    writer.add_scalar(prefix + "saturated", s.saturated_fraction(), step);
    writer.add_scalar(prefix + "flushed", s.flushed_fraction(), step);
    const double headroom = s.headroom_log2();
    if (std::isfinite(headroom)) writer.add_scalar(prefix + "headroom_log2", headroom, step);
  }
}

utils::Chart float8_amax_history_chart(const Float8ScalingState& state, DType format, const std::string& title) {
  // history[0] is the step in progress, history[1] the oldest closed one (update() rolls left).
  const std::vector<float>& history = state.amax_history();
  const size_t n = history.size();
  utils::Series amax{.name = "amax", .style = utils::SeriesStyle::kLinesPoints, .color = "#1f77b4"};
  for (size_t k = 0; k < n; ++k) {
    const float a = history[(k + 1) % n];
    if (amax.x.empty() && a == 0.0f && k + 1 < n) continue;  // places no step has filled yet
    amax.x.push_back(static_cast<double>(k) - static_cast<double>(n - 1));
    amax.y.push_back(a > 0.0f ? static_cast<double>(a) : std::numeric_limits<double>::quiet_NaN());
  }
  const double covered = dtype_info(format).max / static_cast<double>(state.scale());
  utils::Series line{.name = "amax the scale maps to " + std::string(dtype_name(format)) + "'s max",
                     .x = {amax.x.front(), amax.x.back()},
                     .y = {covered, covered},
                     .color = "#d62728"};
  return utils::Chart{.title = title,
                      .xlabel = "step (0: the step in progress)",
                      .ylabel = "amax (log scale)",
                      .log_y = true,
                      .series = {amax, line}};
}

}  // namespace ampgrad::amp
