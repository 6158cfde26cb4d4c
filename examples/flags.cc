// Checked command-line values (see flags.h).
#include "examples/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace ampgrad::examples {

namespace {

[[noreturn]] void refuse(std::string_view flag, const std::string& what, const std::string& value) {
  throw std::invalid_argument(std::string(flag) + " must be " + what + ", got '" + value + "'");
}

}  // namespace

int64_t parse_count(std::string_view flag, const std::string& value, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  const bool digits = !value.empty() && (value[0] == '-' || (value[0] >= '0' && value[0] <= '9'));
  if (!digits || *end != '\0' || errno == ERANGE || n < min) {
    refuse(flag, "a whole number >= " + std::to_string(min), value);
  }
  return n;
}

double parse_positive(std::string_view flag, const std::string& value) {
  char* end = nullptr;
  const double x = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(x) || x <= 0) refuse(flag, "a finite number > 0", value);
  return x;
}

uint64_t parse_seed(std::string_view flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(value.c_str(), &end, 10);
  // strtoull would wrap "-1" around to 2^64 - 1: only plain digits are a seed.
  if (value.empty() || value[0] < '0' || value[0] > '9' || *end != '\0' || errno == ERANGE) {
    refuse(flag, "a whole number >= 0", value);
  }
  return n;
}

}  // namespace ampgrad::examples
