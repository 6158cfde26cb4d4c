// Names and sizes of dtypes and devices.
#include "framework/dtype.h"

namespace ampgrad {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
  }
  return "unknown dtype";
}

std::string_view device_name(Device device) {
  switch (device) {
    case Device::kCPU: return "cpu";
    case Device::kCUDA: return "cuda";
  }
  return "unknown device";
}

size_t element_size(DType dtype) {
  return visit_dtype(dtype, [](auto t) { return sizeof(t); });
}

DType promote_types(DType a, DType b) {
  auto rank = [](DType d) { return d == DType::kFloat16 ? 0 : d == DType::kFloat32 ? 1 : 2; };
  return rank(a) >= rank(b) ? a : b;
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }
std::ostream& operator<<(std::ostream& out, Device device) { return out << device_name(device); }

}  // namespace ampgrad
