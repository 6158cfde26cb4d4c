// Counter-based random bits: a hash of (key, index), so the bits of an element depend on nothing
// else (not the thread, the backend, the chunking or the order). Dropout's masks and stochastic
// rounding draw from it; the backward regenerates a forward's mask instead of storing it.
#pragma once

#include <cstdint>

#include "framework/device.h"

namespace ampgrad {

/// 64 random bits for element `index` under `key`: splitmix64's finaliser of key + (index + 1) * phi.
AG_HOST_DEVICE inline uint64_t counter_random_bits(uint64_t key, uint64_t index) {
  uint64_t z = key + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace ampgrad
