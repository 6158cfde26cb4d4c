// FP8 diagnostics: for each tensor an FP8 linear or conv2d casts (its input, its weight, its output's
// gradient), the scale and amax of the latest step and the share of values that saturated (clamped
// to the format's largest value) or flushed to zero in the cast: what FP8 loses, and where.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "framework/dtype.h"
#include "framework/float8_scaling.h"
#include "framework/tensor.h"

namespace ampgrad::amp {

using ampgrad::Float8Role;
/// "input", "weight" or "grad_output" (the names checkpoints use too).
inline std::string_view role_name(Float8Role role) { return float8_role_name(role); }

/// One tensor of an FP8 linear or conv2d in its latest step: the casts since that step began (a forward's
/// input and weight, the backward's output gradient; every micro-batch is a step of its own).
struct Float8TensorStats {
  std::string name{};                 ///< the weight's parameter name
  Float8Role role = Float8Role::kInput;  ///< which of the op's tensors
  DType format = DType::kFloat8E4M3;  ///< the 8-bit format it was cast to
  uint64_t step = 0;                  ///< the Float8Guard step the casts belong to
  float scale = 1.0f;                 ///< the scale of the casts (current scaling: the latest's)
  float amax = 0.0f;                  ///< the largest |value| cast (NaN if one was NaN)
  int64_t numel = 0;                  ///< values cast
  int64_t saturated = 0;              ///< |value * scale| rounding past the format's largest value: clamped
  int64_t flushed = 0;                ///< nonzero values cast to +-0

  double saturated_fraction() const;  ///< saturated / numel (0 when nothing was cast)
  double flushed_fraction() const;    ///< flushed / numel (0 when nothing was cast)
  /// log2(format max / (amax * scale)): the binades between the largest scaled value and the
  /// format's largest (negative: past it; values saturate from half an ulp past it, a headroom
  /// below -0.05 in E4M3 and -0.1 in E5M2).
  /// NaN when amax is 0, inf or NaN.
  double headroom_log2() const;
  /// "fc1.weight grad_output (float8_e5m2, scale 2^20): amax 3.1e-08, 0% saturated, 12.5% flushed to zero".
  std::string to_string() const;
};

/// Every FP8 tensor of `named_parameters` (each weight a linear or conv2d used inside a
/// Float8Guard: its input, itself, its output's gradient, in that order) in the parameters' order,
/// with what its latest step's casts saw. Empty when no parameter has been through an FP8 op.
std::vector<Float8TensorStats> float8_stats(const std::vector<std::pair<std::string, Tensor>>& named_parameters);

/// float8_stats' lines, one tensor a line, under a heading.
std::string float8_stats_table(const std::vector<Float8TensorStats>& stats);

}  // namespace ampgrad::amp
