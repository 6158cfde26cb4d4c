// AutocastGuard over the framework's per-thread autocast state.
#include "amp/autocast.h"

#include "framework/error.h"

namespace ampgrad::amp {

AutocastGuard::AutocastGuard(Device device, DType dtype, bool enabled)
    : device_(device), previous_(autocast::state(device)) {
  AG_CHECK(is_low_precision(dtype), "AutocastGuard: the autocast dtype must be a lower-precision float ",
           "(float16 or bfloat16), got ", dtype, "; hint: for float32 everywhere, pass enabled = false");
  autocast::set_state(device, {.enabled = enabled, .dtype = dtype});
  autocast::enter_region();
}

AutocastGuard::~AutocastGuard() {
  autocast::set_state(device_, previous_);
  autocast::exit_region();
}

bool is_autocast_enabled(Device device) { return autocast::state(device).enabled; }

}  // namespace ampgrad::amp
