// Why GradScaler skipped a step: where the inf/NaN came from (the forward or the backward) and
// which parameters' gradients held one, in the order the backward wrote them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "amp/diagnostics/float8_stats.h"

namespace ampgrad::amp {

/// Where the inf/NaN of a skipped step came from, decided in this order (the first that applies):
enum class InfOrigin {
  kForwardActivation,  // a watched module's output held one (GradScaler::watch_forward)
  kForwardLoss,        // the loss given to scale() was already inf/NaN
  kScaledLoss,         // the loss was finite, but loss * scale overflowed float32
  kBackward,           // the forward was finite: a gradient overflowed (or became NaN) in the backward
};
std::string_view origin_name(InfOrigin origin);  ///< "forward activation", "forward loss", "scaled loss" or "backward"

/// One parameter whose gradient held inf/NaN values.
struct NonfiniteGrad {
  std::string name;  ///< the parameter's name (GradScaler::set_parameter_names)
  int64_t infs = 0;  ///< elements that are +-inf
  int64_t nans = 0;  ///< elements that are NaN
  int64_t numel = 0;  ///< the gradient's number of elements
  /// When the backward from the latest scaled loss to reach it first wrote it (smaller: earlier);
  /// 0 when no loss given to GradScaler::scale() this iteration reaches it (listed last).
  uint64_t backward_order = 0;
};

/// Why GradScaler skipped a step: where the first inf/NaN came from, and which gradients held one.
struct SkipReport {
  int64_t iteration = 0;  ///< the scaler's iteration (its update() count)
  double scale = 1.0;     ///< the scale the step ran at
  InfOrigin origin = InfOrigin::kBackward;  ///< where the non-finite values started
  std::string module{};   ///< kForwardActivation: the module's name in named_modules() ("" is the model)
  double loss = 0.0;      ///< the first loss given to scale() in the iteration
  /// Every parameter whose gradient held inf/NaN, in the order the backward first wrote them:
  /// an inf flows from where it arose toward the inputs, so the first is nearest its origin.
  /// Empty when no gradient of this process held one (another process's did).
  std::vector<NonfiniteGrad> grads{};
  /// The FP8 tensors of the optimizer's parameters (see float8_stats) whose casts in the latest
  /// Float8Guard step met an inf/NaN or saturated: under FP8 an overflow shows here first. With
  /// gradient accumulation that is the last micro-batch's casts only. Empty outside FP8.
  std::vector<Float8TensorStats> float8{};

  /// The first parameter (grads.front().name), or "" when grads is empty.
  std::string culprit() const;
  /// One paragraph: "step skipped at iteration 12, scale 2^16: the inf/NaN arose in the backward; ...".
  std::string to_string() const;
};

}  // namespace ampgrad::amp
