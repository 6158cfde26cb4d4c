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
  if (value.empty() || *end != '\0' || errno == ERANGE || n < min) {
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
  return static_cast<uint64_t>(parse_count(flag, value, 0));
}

}  // namespace ampgrad::examples
