// Errors: every failure a user can cause throws ampgrad::Error with the place, the
// failed condition and the values involved. Library code never exits or aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ampgrad {

/// The one exception type ampgrad throws for bad input, misuse and backend failures.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const char* condition, const std::string& message);

// Streams any number of values into one string (the message of a failed check).
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace ampgrad

/// AG_CHECK(cond, values...): throws ampgrad::Error "file:line: check `cond` failed: values..." when cond is false.
#define AG_CHECK(cond, ...)                                                                          \
  do {                                                                                               \
    if (!(cond)) [[unlikely]]                                                                        \
      ::ampgrad::detail::throw_error(__FILE__, __LINE__, #cond, ::ampgrad::detail::str_cat(__VA_ARGS__)); \
  } while (false)

/// AG_FAIL(values...): throws unconditionally (for switch defaults and unsupported paths).
#define AG_FAIL(...) ::ampgrad::detail::throw_error(__FILE__, __LINE__, nullptr, ::ampgrad::detail::str_cat(__VA_ARGS__))
