// FP8 scaling: the recipe (which 8-bit format each tensor takes and how its scale is chosen), one
// tensor's scaling state, and this thread's FP8 region, read by the FP8 GEMMs of linear and conv2d. The
// user-facing names are amp::Float8Recipe and amp::Float8Guard (amp/float8.h).
//
// A tensor x goes to FP8 as saturate(x * scale) and its products are descaled by 1 / scale, so
// the scale maps the tensor's largest magnitude (amax) onto the format's largest value:
//   scale = (fp8_max / amax) * 2^-margin          (Transformer Engine's _default_sf_compute)
// kept as it was when amax is 0, inf or NaN (nothing to learn from it). Two guards TE's PyTorch
// formula lacks: a quotient that overflows gives FLT_MAX (as TE's C++ current scaling does), and a
// scale below FLT_MIN (a huge amax and margin) gives FLT_MIN rather than 0. Rounded down to a
// power of two when asked (then scaling changes no mantissa).
// Delayed scaling, Transformer Engine's default, takes amax from a history of the amaxes the
// tensor had in past steps (their max, or the most recent), so the cast needs one pass over the
// tensor instead of two; current scaling takes this step's amax.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "framework/device.h"
#include "framework/dtype.h"

namespace ampgrad {

/// Which 8-bit format each tensor of an FP8 linear or conv2d takes.
enum class Float8Format : uint8_t {
  kHybrid,  ///< E4M3 for the forward's inputs and weights, E5M2 (wider range) for the gradients
  kE4M3,    ///< E4M3 everywhere
};
/// Where a tensor's amax comes from.
enum class Float8Scaling : uint8_t {
  kDelayed,  ///< from the amax history of past steps
  kCurrent,  ///< from this tensor, now (one more pass over it)
  kNone,     ///< scale 1: the plain saturating cast, to show what scaling is for (amax still recorded)
};
/// How delayed scaling reduces the history to one amax.
enum class Float8AmaxCompute : uint8_t {
  kMax,         ///< the largest in the window (Transformer Engine's default)
  kMostRecent,  ///< the step just finished
};

/// Transformer Engine's DelayedScaling / Float8CurrentScaling recipe, with its defaults.
struct Float8Recipe {
  Float8Format format = Float8Format::kHybrid;
  Float8Scaling scaling = Float8Scaling::kDelayed;
  int amax_history_len = 1024;  ///< steps in the window (>= 1)
  int margin = 0;               ///< scale down by 2^margin below the format's largest value (>= 0)
  Float8AmaxCompute amax_compute = Float8AmaxCompute::kMax;
  bool power_of_two_scales = false;

  /// The forward's format (inputs and weights): always E4M3.
  DType forward_dtype() const { return DType::kFloat8E4M3; }
  /// The backward's format (output gradients): E5M2 under kHybrid.
  DType backward_dtype() const { return format == Float8Format::kHybrid ? DType::kFloat8E5M2 : DType::kFloat8E4M3; }
  /// Throws an Error naming `where` and the field if a field is out of range.
  void validate(const char* where) const;
};

/// (fp8_max(format) / amax) * 2^-margin, with the rules above; `previous` when amax is 0, inf or NaN.
float float8_scale(float amax, DType format, int margin, bool power_of_two, float previous);

/// What scaled casts x -> saturate(x * scale) saw: what one cast returns (the FP8 kernels), and
/// what a tensor's casts of a step add up to (its scaling state; the FP8 diagnostics read it).
struct Float8CastCounts {
  DType format = DType::kFloat8E4M3;  ///< the 8-bit format (a step's: of its latest cast)
  float scale = 1.0f;     ///< the scale (a step's: of its latest cast)
  float amax = 0.0f;      ///< the largest |x| (NaN if one was NaN; 0 for none); this process's alone
  int64_t numel = 0;      ///< elements cast
  /// with |x * scale| rounding past the format's largest value, so that the clamp changed them
  /// (above 464 in E4M3, from 61440 in E5M2: half an ulp past the top; infs too)
  int64_t saturated = 0;
  int64_t flushed = 0;    ///< nonzero, cast to +-0 (at or below half the format's smallest subnormal)
};

/// One tensor's scaling state: its scale and amax history. history[0] collects the amax of the
/// step in progress (record_amax); update() closes the step as Transformer Engine's
/// amax_and_scale_update does: amax from the whole window (kMax) or history[0] (kMostRecent), the
/// window rolled one place (history[0] moves to the end, the oldest drops out, history[0] restarts
/// at 0), and a new scale from that amax. Not thread-safe: one training thread uses it.
class Float8ScalingState {
 public:
  explicit Float8ScalingState(int history_len = 1);

  float scale() const { return scale_; }
  const std::vector<float>& amax_history() const { return history_; }
  /// history[0] = max(history[0], amax); a NaN amax stays NaN until the step is closed.
  void record_amax(float amax);
  /// Closes the step with delayed scaling (see above). A window of another length than the
  /// recipe's is resized first, keeping history[0] and the newest entries (the last ones).
  void update(const Float8Recipe& recipe, DType format);
  /// Starts a step without scaling (Float8Scaling::kNone): history[0] = 0, the rest kept.
  void clear_step_amax() { history_[0] = 0.0f; }
  /// history[0] = amax: the step's amax as reduced across data-parallel ranks.
  void set_step_amax(float amax) { history_[0] = amax; }
  /// Current scaling: records amax and sets the scale from it at once.
  void set_from_amax(float amax, const Float8Recipe& recipe, DType format);
  /// For checkpoints: the state exactly as saved.
  void restore(float scale, std::vector<float> history);
  /// Keeps the scale of the step in progress (`step`) before a new step replaces it, for
  /// scale_of_closed_step. The last kKeptSteps closed steps are kept.
  void keep_step_scale();
  /// The scale the casts of `past` used if it is one of the last kKeptSteps steps this state
  /// closed, else nothing: a cast that comes back to a closed step (an activation checkpoint's
  /// recompute after a later step's forward) casts as that step did, as Transformer Engine does.
  std::optional<float> scale_of_closed_step(uint64_t past) const;
  static constexpr size_t kKeptSteps = 4;
  /// This step's casts so far: start_step_counts starts a step's afresh (none cast yet, in
  /// `format`), record_cast adds one cast's.
  const Float8CastCounts& step_counts() const { return counts_; }
  void start_step_counts(DType format) { counts_ = {.format = format}; }
  void record_cast(const Float8CastCounts& cast);

  /// The latest step that used this state (Float8Guard regions count steps); an older step (a
  /// second micro-batch's backward after the next forward) records into the current one.
  uint64_t step = 0;

 private:
  float scale_ = 1.0f;
  std::vector<float> history_;
  Float8CastCounts counts_;
  std::array<std::pair<uint64_t, float>, kKeptSteps> closed_{};  // (step, its scale), step 0: empty
  size_t next_closed_ = 0;
};

/// Which tensor of an FP8 linear a scaling state belongs to (Transformer Engine's fp8_meta roles).
enum class Float8Role : uint8_t { kInput, kWeight, kGradOutput };
/// The three, in the order checkpoints and the diagnostics list them.
inline constexpr std::array<Float8Role, 3> kFloat8Roles{Float8Role::kInput, Float8Role::kWeight,
                                                        Float8Role::kGradOutput};
/// "input", "weight" or "grad_output" (checkpoint keys and diagnostics use them).
std::string_view float8_role_name(Float8Role role);

/// The scaling states of one linear's or convolution's weight (Transformer Engine's fp8_meta of a
/// Linear): its input, itself, and its output's gradient. Lives with the weight
/// (TensorImpl::float8). `mutex` guards the three: backward passes may run on several threads at
/// once.
struct Float8LinearState {
  Float8ScalingState input, weight, grad_output;
  std::mutex mutex;

  /// The state of `role`.
  Float8ScalingState& of(Float8Role role) {
    return role == Float8Role::kInput ? input : role == Float8Role::kWeight ? weight : grad_output;
  }
};

namespace fp8 {

/// This thread's FP8 region on one device.
struct Region {
  bool enabled = false;
  Float8Recipe recipe;
  /// The step the region belongs to, 0 outside any enabled guard: an enabled guard that no enabled
  /// guard encloses starts a new one (a disabled guard nested inside keeps it).
  uint64_t step = 0;
};

Region region(Device device);
/// Enters a region, enabled or not (see Region::step). Returns the previous state, for the guard
/// to restore.
Region enter(Device device, bool enabled, const Float8Recipe& recipe);
void restore(Device device, const Region& previous);

}  // namespace fp8
}  // namespace ampgrad
