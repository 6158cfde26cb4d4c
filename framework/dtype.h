// Element types and devices: the two coordinates every kernel is picked by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

#include "framework/half.h"

namespace ampgrad {

enum class DType : uint8_t { kFloat32, kFloat16, kFloat64 };
enum class Device : uint8_t { kCPU, kCUDA };

std::string_view dtype_name(DType dtype);    // "float32", "float16", "float64"
std::string_view device_name(Device device);  // "cpu", "cuda"
size_t element_size(DType dtype);
/// The wider of two dtypes (float16 < float32 < float64): what binary ops promote to.
DType promote_types(DType a, DType b);

std::ostream& operator<<(std::ostream& out, DType dtype);
std::ostream& operator<<(std::ostream& out, Device device);

/// The C++ storage type of each dtype, for kernels: StorageType<DType::kFloat16> is Half.
template <DType D> struct StorageTypeOf;
template <> struct StorageTypeOf<DType::kFloat32> { using type = float; };
template <> struct StorageTypeOf<DType::kFloat16> { using type = Half; };
template <> struct StorageTypeOf<DType::kFloat64> { using type = double; };
template <DType D> using StorageType = typename StorageTypeOf<D>::type;

/// Calls fn(T{}) with T the storage type of `dtype`: one switch instead of one per kernel.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat16: return fn(Half{});
    case DType::kFloat64: return fn(double{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

/// Converts between a storage type and its compute type (float for Half and float, double for double).
template <typename T> struct ComputeTypeOf { using type = T; };
template <> struct ComputeTypeOf<Half> { using type = float; };
template <typename T> using ComputeType = typename ComputeTypeOf<T>::type;

template <typename T> inline ComputeType<T> load(T v) { return v; }
inline float load(Half v) { return half_to_float(v); }
template <typename T> inline T store(ComputeType<T> v) { return v; }
template <> inline Half store<Half>(float v) { return float_to_half(v); }

/// True when the CUDA backend is compiled in and a usable GPU and driver are present.
bool cuda_is_available();

}  // namespace ampgrad
