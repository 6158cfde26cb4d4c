// Float8Guard over the framework's per-thread FP8 regions.
#include "amp/float8.h"

#include "framework/tensor_impl.h"

namespace ampgrad::amp {

Float8Guard::Float8Guard(Device device, const Float8Recipe& recipe, bool enabled)
    : device_(device), previous_(fp8::enter(device, enabled, recipe)) {}

Float8Guard::~Float8Guard() { fp8::restore(device_, previous_); }

bool is_float8_enabled(Device device) { return fp8::region(device).enabled; }

const Float8LinearState* float8_state(const Tensor& weight) {
  return weight.defined() ? weight.impl()->float8.get() : nullptr;
}

}  // namespace ampgrad::amp
