// Dropout's random numbers: counter-based (framework/counter_random.h), so the backward
// regenerates the forward's mask instead of storing it.
#pragma once

#include <cstdint>

#include "framework/counter_random.h"
#include "framework/device.h"

namespace ampgrad::kernels {

/// A uniform float in [0, 1) with 24 random bits from splitmix64 of (seed, index).
AG_HOST_DEVICE inline float dropout_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(counter_random_bits(seed, index) >> 40) * 0x1p-24f;
}

}  // namespace ampgrad::kernels
