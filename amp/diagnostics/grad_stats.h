// Gradient statistics for mixed precision: per named parameter, where its gradient values sit
// against each low-precision format's ranges at the current loss scale, an exponent histogram of
// the true (unscaled) values, and the loss scale that histogram recommends.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "amp/diagnostics/grad_counts.h"
#include "framework/dtype.h"
#include "framework/tensor.h"

namespace ampgrad::amp {

/// The low-precision dtypes, in DType order (those whose row says is_low_precision): the formats
/// the statistics measure against.
std::vector<DType> low_precision_dtypes();

/// Where `dtype`'s round-to-nearest-even puts magnitudes (from its dtype.h row); floating only.
FormatLimits format_limits(DType dtype);

/// Counts of the true gradient values v = g / scale by binary exponent: bin e holds the v with
/// 2^e <= |v| < 2^(e+1), for e in [kMinExponent, kMaxExponent] (float32's finite range).
struct ExponentHistogram {
  std::array<int64_t, kNumExponentBins> counts{};  ///< counts[e - kMinExponent]: the values with exponent e
  int64_t zeros = 0;      ///< v == 0
  int64_t nonfinite = 0;  ///< v inf or NaN
  double max_abs = 0;     ///< the largest finite |v| (exact, where the bins only bound it)

  int64_t count(int exponent) const;  ///< 0 outside the range
  /// The values counted in the bins: neither zero nor inf/NaN.
  int64_t nonzero_finite() const;
  /// The smallest and largest exponent with a count (min > max when there is none).
  int min_exponent() const;
  /// See min_exponent().
  int max_exponent() const;
  /// Adds other's counts (and keeps the larger max_abs).
  ExponentHistogram& operator+=(const ExponentHistogram& other);
};

/// How one gradient's values sit against one low-precision format F (counts of values).
struct FormatStats {
  DType dtype = DType::kFloat16;  ///< the format the counts are against
  // At the current scale, the gradient as stored (g, scaled):
  int64_t subnormal = 0;  ///< in F's subnormal range: kept with fewer significant bits
  int64_t underflow = 0;  ///< nonzero, but F rounds them to 0 (|g| <= F's smallest subnormal / 2)
  int64_t overflow = 0;   ///< F rounds them to inf (|g| >= F's max + half an ulp), infs included
  // Without loss scaling (v = g / scale):
  int64_t underflow_unscaled = 0;  ///< nonzero, but F would round them to 0: lost without the scale
};

/// One parameter's gradient statistics.
struct ParamGradStats {
  std::string name;  ///< from GradScaler::set_parameter_names, else "param<i>"
  DType grad_dtype = DType::kFloat32;  ///< the dtype the gradient is stored in
  int64_t numel = 0;  ///< its number of elements
  int64_t zeros = 0;   ///< g exactly 0: flushed in the backward, or truly zero (a dead ReLU)
  int64_t infs = 0;    ///< g is +-inf
  int64_t nans = 0;    ///< g is NaN
  double max_abs = 0;  ///< the largest finite |g| (scaled)
  std::vector<FormatStats> formats{};  ///< one per low_precision_dtypes() entry
  ExponentHistogram histogram{};       ///< of the unscaled values

  /// count / numel (0 for an empty gradient).
  double fraction(int64_t count) const;
  /// The entry for `dtype`; throws if it was not measured.
  const FormatStats& format(DType dtype) const;
  /// log2(max of `dtype` / max_abs): how many doublings of the scale the largest gradient value
  /// can still take before it overflows `dtype` (negative: it already does; inf when all zero).
  double headroom_log2(DType dtype = DType::kFloat16) const;
  /// Adds another parameter's counts (for totals); the name and dtype stay.
  ParamGradStats& operator+=(const ParamGradStats& other);
};

/// Converts raw counts (from the unscale pass, against `formats` in that order) into a
/// ParamGradStats; `scale` is the loss scale the gradient carries.
ParamGradStats make_param_stats(const std::string& name, DType grad_dtype, int64_t numel, double scale,
                                const GradCounts& counts, const std::vector<DType>& formats);

/// The FormatTable the unscale pass measures `formats` with (at most kMaxFormats).
FormatTable make_format_table(const std::vector<DType>& formats);

/// The statistics of one iteration's gradients.
struct GradStatsReport {
  int64_t iteration = 0;  ///< the scaler's iteration (its update() count) when measured
  double scale = 1.0;     ///< the loss scale the gradients carry
  std::vector<ParamGradStats> params{};  ///< one per parameter, in the optimizers' order
  /// Everything summed, named "(all)".
  ParamGradStats total() const;
  /// A table, one row per parameter and a total: zero / subnormal / underflow fractions, max |g|,
  /// headroom and underflow without scaling, against `dtype`.
  std::string to_string(DType dtype = DType::kFloat16) const;
};

/// The statistics of named tensors' current gradients (those without one are left out), which
/// carry the loss scale `scale` (1 without scaling): for runs without an enabled GradScaler.
GradStatsReport measure_grad_stats(const std::vector<std::pair<std::string, Tensor>>& named, double scale = 1.0,
                                   int64_t iteration = 0);

/// What recommend_scale decides from.
struct RecommendScaleOptions {
  DType dtype = DType::kFloat16;          ///< the format the scaled gradients must fit
  double max_underflow_fraction = 1e-3;   ///< of the nonzero finite values, allowed to round to 0
  int margin_log2 = 0;                    ///< doublings kept free below the overflow bound
};

/// The recommendation: the largest power of two 2^k with max|v| * 2^k <= the format's max
/// (halved margin_log2 times), within the normal float32 scales [2^-126, 2^127], and the fraction
/// of the nonzero finite values v that round to 0 at that scale (|v| * 2^k at most half the
/// format's smallest subnormal, judged per exponent bin: a bin counts when all of it is).
/// Lowering the scale only adds underflows, so when that fraction is above the threshold no
/// power of two meets both conditions: the format's range is too narrow for these gradients.
struct ScaleRecommendation {
  double scale = 1.0;              ///< 2^k
  int log2_scale = 0;              ///< k
  double underflow_fraction = 0;   ///< at 2^k
  bool meets_underflow = true;     ///< underflow_fraction <= max_underflow_fraction
  bool saw_nonfinite = false;      ///< the histogram had inf/NaN values: the bound comes from the finite ones
  bool empty = false;              ///< no nonzero finite value: scale 1, nothing to go by
};

/// Recommends a loss scale from a histogram of true gradient values (see ScaleRecommendation).
/// The histogram sees only values that survived the backward at the scale it was measured at:
/// values flushed to zero there are counted as zeros, not as underflows.
ScaleRecommendation recommend_scale(const ExponentHistogram& histogram, const RecommendScaleOptions& options = {});

/// "2^17" for powers of two, else the value with 5 significant digits.
std::string format_scale(double scale);

}  // namespace ampgrad::amp
