// FP8 scaling arithmetic and this thread's FP8 regions (see float8_scaling.h).
#include "framework/float8_scaling.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstddef>

#include "framework/error.h"

namespace ampgrad {

void Float8Recipe::validate(const char* where) const {
  AG_CHECK(amax_history_len >= 1, where, ": Float8Recipe.amax_history_len must be at least 1, got ", amax_history_len);
  AG_CHECK(margin >= 0 && margin <= 64, where, ": Float8Recipe.margin must be in [0, 64], got ", margin,
           "; hint: the margin is a power of two below the format's largest value (0 to 2 are usual)");
}

float float8_scale(float amax, DType format, int margin, bool power_of_two, float previous) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;  // NaN fails amax > 0
  float scale = static_cast<float>(dtype_info(format).max) / amax;
  if (std::isinf(scale)) scale = FLT_MAX;  // amax so small that its reciprocal overflows
  scale = std::max(std::ldexp(scale, -margin), FLT_MIN);
  if (power_of_two) {
    int exponent = 0;
    std::frexp(scale, &exponent);  // scale = f * 2^exponent, f in [0.5, 1)
    scale = std::ldexp(1.0f, exponent - 1);
  }
  return scale;
}

Float8ScalingState::Float8ScalingState(int history_len) : history_(static_cast<size_t>(std::max(history_len, 1))) {}

void Float8ScalingState::record_amax(float amax) {
  float& slot = history_[0];
  if (std::isnan(amax) || std::isnan(slot)) {
    slot = std::isnan(slot) ? slot : amax;
  } else {
    slot = std::max(slot, amax);
  }
}

void Float8ScalingState::update(const Float8Recipe& recipe, DType format) {
  const size_t length = static_cast<size_t>(recipe.amax_history_len);
  if (history_.size() > length) {  // keep history[0] and the newest length - 1
    history_.erase(history_.begin() + 1, history_.end() - static_cast<std::ptrdiff_t>(length - 1));
  } else if (history_.size() < length) {  // the new, older places are empty
    history_.insert(history_.begin() + 1, length - history_.size(), 0.0f);
  }
  float amax = history_[0];
  if (recipe.amax_compute == Float8AmaxCompute::kMax) {
    for (float a : history_) amax = std::isnan(amax) || std::isnan(a) ? NAN : std::max(amax, a);
  }
  std::rotate(history_.begin(), history_.begin() + 1, history_.end());
  history_[0] = 0.0f;
  scale_ = float8_scale(amax, format, recipe.margin, recipe.power_of_two_scales, scale_);
}

void Float8ScalingState::set_from_amax(float amax, const Float8Recipe& recipe, DType format) {
  history_[0] = amax;
  scale_ = float8_scale(amax, format, recipe.margin, recipe.power_of_two_scales, scale_);
}

void Float8ScalingState::restore(float scale, std::vector<float> history) {
  AG_CHECK(!history.empty(), "Float8ScalingState::restore: the amax history is empty");
  AG_CHECK(std::isfinite(scale) && scale > 0.0f, "Float8ScalingState::restore: the scale must be finite and positive, got ",
           scale);
  scale_ = scale;
  history_ = std::move(history);
}

void Float8ScalingState::keep_step_scale() {
  if (step == 0) return;  // never used: nothing to come back to
  closed_[next_closed_] = {step, scale_};
  next_closed_ = (next_closed_ + 1) % kKeptSteps;
}

std::optional<float> Float8ScalingState::scale_of_closed_step(uint64_t past) const {
  for (const auto& [closed_step, scale] : closed_) {
    if (closed_step != 0 && closed_step == past) return scale;
  }
  return std::nullopt;
}

void Float8ScalingState::record_cast(const Float8CastCounts& cast) {
  counts_.format = cast.format;
  counts_.scale = cast.scale;
  counts_.amax = std::isnan(counts_.amax) || std::isnan(cast.amax) ? NAN : std::max(counts_.amax, cast.amax);
  counts_.numel += cast.numel;
  counts_.saturated += cast.saturated;
  counts_.flushed += cast.flushed;
}

std::string_view float8_role_name(Float8Role role) {
  switch (role) {
    case Float8Role::kInput: return "input";
    case Float8Role::kWeight: return "weight";
    case Float8Role::kGradOutput: return "grad_output";
  }
  return "?";
}

namespace fp8 {
namespace {

std::atomic<uint64_t> last_step{0};
thread_local std::array<Region, kNumDevices> regions;

}  // namespace

Region region(Device device) { return regions[device_index(device)]; }

Region enter(Device device, bool enabled, const Float8Recipe& recipe) {
  if (enabled) recipe.validate("Float8Guard");
  Region& now = regions[device_index(device)];
  const Region previous = now;
  now.enabled = enabled;
  if (enabled) now.recipe = recipe;
  if (enabled && previous.step == 0) now.step = last_step.fetch_add(1) + 1;
  return previous;
}

void restore(Device device, const Region& previous) { regions[device_index(device)] = previous; }

}  // namespace fp8
}  // namespace ampgrad
