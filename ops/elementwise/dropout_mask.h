// Dropout's random numbers: a counter-based hash of (seed, element index), so the mask of an
// element depends on nothing else (not the thread, not the backend, not the order), and the
// backward regenerates the forward's mask instead of storing it.
#pragma once

#include <cstdint>

#include "framework/device.h"

namespace ampgrad::kernels {

/// A uniform float in [0, 1) with 24 random bits from splitmix64 of (seed, index).
AG_HOST_DEVICE inline float dropout_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 0x1p-24f;
}

}  // namespace ampgrad::kernels
