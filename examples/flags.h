// Command-line values the examples share: counts, rates and seeds, each checked, so that a bad
// value is refused with a message naming the flag (never a run that trains on nothing).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ampgrad::examples {

/// `value` of `flag` as a whole number >= `min`. Throws std::invalid_argument, whose message
/// reads "--batch must be a whole number >= 1, got '0'", for anything else.
int64_t parse_count(std::string_view flag, const std::string& value, int64_t min = 1);

/// `value` of `flag` as a finite number > 0 (a learning rate); throws std::invalid_argument.
double parse_positive(std::string_view flag, const std::string& value);

/// `value` of `flag` as a seed (a whole number >= 0); throws std::invalid_argument.
uint64_t parse_seed(std::string_view flag, const std::string& value);

}  // namespace ampgrad::examples
