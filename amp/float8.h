// Float8Guard: the user's switch for FP8 GEMMs over a scope, and the recipe that says how each
// tensor is scaled into its 8-bit format (framework/float8_scaling.h has the arithmetic).
#pragma once

#include "framework/device.h"
#include "framework/float8_scaling.h"
#include "framework/tensor.h"

namespace ampgrad::amp {

using ampgrad::Float8AmaxCompute;
using ampgrad::Float8Format;
using ampgrad::Float8LinearState;
using ampgrad::Float8Recipe;
using ampgrad::Float8Scaling;
using ampgrad::Float8ScalingState;

/// While it lives, every linear and conv2d (and nn::Linear, nn::Conv2d) on `device` in this thread
/// runs its three GEMMs (y, dx, dw; a convolution's over its im2col columns) with FP8 operands and
/// FP32 accumulation, scaled per `recipe`, as Transformer Engine's fp8_autocast does for linears;
/// every other op follows the enclosing AutocastGuard (BF16 usually; their outputs take the
/// autocast dtype too), and so does a depthwise convolution, which has no GEMM. The backward of an
/// op recorded inside the guard runs in FP8 wherever it is called. Each outermost guard is one
/// step of delayed scaling: enter it once per forward. Each leaf weight (a parameter) keeps its own
/// scaling states (its input's, its own and its output gradient's); a weight computed in the
/// forward is new every step, so its op scales by current amaxes. To keep one op out of FP8 (a
/// CNN's stem, say), call it inside a nested Float8Guard with enabled = false. A non-finite operand makes the product NaN (the
/// saturating cast would hide an inf from GradScaler). RAII and thread-local; nests; enabled = false turns FP8 off
/// inside an enclosing guard. On CUDA the GEMMs run on FP8 tensor cores (cuBLASLt) where the GPU
/// has them (compute capability 8.9+), else as bfloat16 GEMMs of the same FP8 values (said once).
class Float8Guard {
 public:
  /// Turns FP8 GEMMs on for `device` with `recipe` (validated), or off when enabled is false.
  explicit Float8Guard(Device device, const Float8Recipe& recipe = {}, bool enabled = true);
  /// Restores the FP8 region that was in place before.
  ~Float8Guard();
  Float8Guard(const Float8Guard&) = delete;
  Float8Guard& operator=(const Float8Guard&) = delete;

 private:
  Device device_;
  fp8::Region previous_;
};

/// Whether a Float8Guard is on for `device` in this thread right now.
bool is_float8_enabled(Device device);

/// The FP8 scaling states that live with `weight` (its op's input, itself, its output's
/// gradient), or null before a linear or conv2d inside a Float8Guard has used it.
const Float8LinearState* float8_state(const Tensor& weight);

}  // namespace ampgrad::amp
