// Lookups over the dtype table.
#include "framework/dtype.h"

namespace ampgrad {

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (dtype_info(dtype).safetensors_name == name) return dtype;
  }
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

}  // namespace ampgrad
