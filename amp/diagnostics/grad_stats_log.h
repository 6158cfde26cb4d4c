// Gradient statistics and skip reports into TensorBoard event files (utils::SummaryWriter):
// per-parameter fractions and exponent histograms, the loss scale beside the recommended one.
#pragma once

#include <cstdint>

#include "amp/diagnostics/grad_stats.h"
#include "amp/grad_scaler.h"
#include "framework/dtype.h"
#include "utils/event.h"
#include "utils/summary_writer.h"

namespace ampgrad::amp {

/// TensorBoard's view of an exponent histogram: the values are log2 |v|, one bucket [e, e+1) per
/// binary exponent e from the smallest to the largest one counted (plus the empty bucket
/// TensorBoard needs on the left); sum and sum_squares take each value at its bin's middle.
/// Zeros and inf/NaN are left out. An empty histogram gives num = 0 and no buckets.
utils::Histogram exponent_histogram_proto(const ExponentHistogram& histogram);

/// What add_grad_stats writes.
struct GradStatsLogOptions {
  DType dtype = DType::kFloat16;  ///< the format the fractions are counted against
  bool per_parameter = true;      ///< false: only the totals ("all")
  RecommendScaleOptions recommend{};  ///< what recommend_scale decides from, for amp/recommended_*
};

/// Writes `report` at `step` (tags use the parameter names; the total is "all"):
///   grad/{name}/zero, subnormal, underflow, overflow, underflow_unscaled   fractions of numel
///   grad/{name}/max_abs (scaled, as stored), grad/{name}/headroom_log2 (when finite)
///   grad_exponent/{name}   histogram of log2 |g / scale| (exponent_histogram_proto)
///   amp/scale_log2, amp/recommended_scale_log2, amp/recommended_underflow   from the total's histogram
void add_grad_stats(utils::SummaryWriter& writer, const GradStatsReport& report, int64_t step,
                    const GradStatsLogOptions& options = {});

/// The scaler after a step: amp/scale (get_scale()) and amp/skipped (1 when `stepped` is false).
void add_scaler_state(utils::SummaryWriter& writer, const GradScaler& scaler, bool stepped, int64_t step);

}  // namespace ampgrad::amp
