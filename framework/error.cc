// Builds the text of an ampgrad::Error.
#include "framework/error.h"

namespace ampgrad::detail {

void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  std::string text = std::string(file) + ":" + std::to_string(line) + ": ";
  if (condition != nullptr) text += std::string("check `") + condition + "` failed: ";
  throw Error(text + message);
}

}  // namespace ampgrad::detail
