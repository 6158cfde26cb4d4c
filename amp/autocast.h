// AutocastGuard: the user's switch for automatic mixed precision over a scope.
#pragma once

#include "framework/autocast.h"

namespace ampgrad::amp {

/// While it lives, ops on `device` run per their cast policy: linear/matmul in `dtype`
/// (float16 or bfloat16), losses and reductions in float32, element-wise ops at the widest input
/// dtype. RAII and thread-local; nests, restoring the previous state on exit (a guard of another
/// dtype nests too); enabled = false turns autocast off inside an enclosing region. The 16-bit
/// copies of FP32 parameters are cached, per dtype, until the outermost guard exits.
class AutocastGuard {
 public:
  /// Turns autocast on for `device` in `dtype` (float16 or bfloat16), or off when enabled is false.
  explicit AutocastGuard(Device device, DType dtype = DType::kFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Device device_;
  autocast::State previous_;
};

/// Whether autocast is on for `device` in this thread right now.
bool is_autocast_enabled(Device device);

}  // namespace ampgrad::amp
