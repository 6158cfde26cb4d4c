// The loss-scaling experiment behind examples/underflow_demo (and its test): one model, data and
// optimizer trained eleven ways, on a task whose true gradients are tiny (1e-5 to 1e-8): FP16's
// failure (gradients underflow), BF16's (updates below its resolution are lost) and FP8's (both,
// unless every tensor is scaled into its narrow range) side by side.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad.h"

namespace underflow {

enum class Mode {
  kFp32,
  kFp16NoScaling,
  kFp16StaticScale,
  kFp16DynamicScale,
  kBf16NoScaling,        // BF16 autocast over FP32 parameters, no scaler: the recommended recipe
  kBf16ParamsNoMasters,  // BF16 parameters updated in place (MasterWeights::kNone), no scaler
  kBf16ParamsMasters,    // BF16 parameters with FP32 masters, no scaler
  kBf16ParamsStochastic,  // BF16 parameters without masters, rounded stochastically, no scaler
  // linear's GEMMs in FP8 (E4M3 forward, E5M2 gradients) inside BF16 autocast, no scaler:
  kFp8NoScaling,         // every tensor cast as it is (scale 1)
  kFp8CurrentScaling,    // each tensor scaled by its own amax, now
  kFp8DelayedScaling,    // each tensor scaled by its amax history (Transformer Engine's default)
};

std::string mode_name(Mode mode);

struct Result {
  double final_loss = 0.0;            // unweighted MSE on the training batch, in FP32
  double zero_grad_fraction = 0.0;    // share of weight-gradient values exactly 0, over all steps
  double median_abs_fp32_grad = 0.0;  // typical true gradient magnitude (FP32 run), for the table
  // Share of weight values a step left exactly unchanged, over all steps: the weights the
  // optimizer updates (FP32 parameters or masters; BF16 parameters when there are no masters).
  double lost_update_fraction = 0.0;
  int64_t skipped_steps = 0;          // steps an inf/NaN skipped (the scale backed off each time)
  int64_t scale_growths = 0;          // updates that raised the scale
  double final_scale = 1.0;           // 1 when no scaling is used
  // Per step, for the plots:
  std::vector<double> losses;         // the unweighted training loss of that step's forward
  std::vector<double> scales;         // the loss scale that step ran at (1 without scaling)
  std::vector<int64_t> skipped;       // the steps GradScaler skipped
  // The true (unscaled) gradients' exponents at step 0, and, for the dynamic scaler, what its
  // gradient statistics recommend at the last step they were measured.
  ampgrad::amp::ExponentHistogram histogram;
  ampgrad::amp::ScaleRecommendation recommended;
  double scale_at_recommendation = 1.0;  // GradScaler's actual scale at that step
  // FP8 modes: what each linear's casts lost over all steps (amp::float8_stats each step), as
  // shares of the values cast: its input and weight (E4M3) together, its output gradient (E5M2).
  struct Float8Casts {
    std::string weight;  // the linear's weight, named as in named_parameters()
    double forward_saturated = 0.0, forward_flushed = 0.0, grad_saturated = 0.0, grad_flushed = 0.0;
  };
  std::vector<Float8Casts> fp8_casts;
  // Per step, the output layer's gradient (the first the backward casts): its amax and its scale.
  // amax * scale is where the cast put the largest value: at most E5M2's 57344; scaled values at
  // or below 2^-17 flush to zero.
  std::vector<double> fp8_grad_amax, fp8_grad_scale;
};

struct Config {
  int64_t steps = 400;
  double loss_weight = 1e-4;   // a small loss weight, as in multi-task training: makes gradients tiny
  double static_scale = 1048576.0;  // 2^20
  // The dynamic scaler starts at PyTorch's 65536 but grows every 10 clean steps instead of 2000,
  // so that within 400 steps it climbs until FP16 gradients overflow and has to back off.
  int64_t dynamic_growth_interval = 10;
  ampgrad::Device device = ampgrad::Device::kCPU;
  int64_t stats_every = 100;   // the dynamic scaler's gradient statistics: every this many steps
};

/// Trains the same seeded model on the same seeded data in `mode` and reports what happened.
Result train(Mode mode, const Config& config = {});

/// The modes, in the order the demo runs them.
std::vector<Mode> all_modes();

/// Draws the runs into `dir` (created): loss.png (every mode's loss, log scale), scale.png (the
/// dynamic scaler's scale and skipped steps), grad_exponents.png (the true gradients' exponent
/// histogram and the same scaled by the dynamic scaler's final scale, over FP16's ranges),
/// fp8_grad_scale.png (where each FP8 mode's scale puts the output layer's gradient in E5M2).
/// Returns the paths written. Needs gnuplot (utils::gnuplot_available()).
std::vector<std::string> write_plots(const std::vector<std::pair<Mode, Result>>& runs, const std::string& dir);

}  // namespace underflow
