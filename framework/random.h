// The global random generator behind randn/uniform and nn initialisation. manual_seed makes
// whole runs bit-for-bit reproducible (the engine and the transforms are fully specified here,
// not left to the standard library's distributions).
#pragma once

#include <cstdint>
#include <string>

namespace ampgrad {

/// Reseeds the global generator.
void manual_seed(uint64_t seed);

namespace random {
/// Uniform in [0, 1) with 53 random bits.
double next_uniform();
/// Standard normal (Box-Muller over next_uniform).
double next_normal();
/// 64 random bits (seeds for counter-based generators such as dropout's).
uint64_t next_u64();
/// The generator's full state as text, and back (for checkpoints).
std::string get_state();
/// Restores a get_state() (an Error for text that is not one).
void set_state(const std::string& state);
}  // namespace random

}  // namespace ampgrad
