// FP8 diagnostics made visible: per-tensor scalars for TensorBoard and a chart of a tensor's amax
// history against the amax its scale was chosen for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amp/diagnostics/float8_stats.h"
#include "framework/float8_scaling.h"
#include "utils/plot.h"
#include "utils/summary_writer.h"

namespace ampgrad::amp {

/// Writes `stats` (float8_stats) at `step`, for each tensor under fp8/{name}/{role}/:
///   amax, scale_log2, saturated and flushed (fractions of the values cast), headroom_log2 (when finite)
void add_float8_stats(utils::SummaryWriter& writer, const std::vector<Float8TensorStats>& stats, int64_t step);

/// `state`'s amax history as a chart: one point a step, oldest first and the step in progress
/// last at x = 0 (the window's leading places that no step has filled are left out, later steps
/// with amax 0 are gaps on the log scale), beside
/// the amax its scale maps onto `format`'s largest value (format max / scale). Under delayed
/// scaling an amax above that line saturated in its step: the scale follows a jump a step late.
utils::Chart float8_amax_history_chart(const Float8ScalingState& state, DType format, const std::string& title);

}  // namespace ampgrad::amp
