// Element types: every fact about a dtype (name, size, file-format name, precision class,
// promotion rank, range, storage and compute types) lives in its DTypeTraits row below, and nowhere else.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "framework/bfloat16.h"
#include "framework/device.h"
#include "framework/half.h"

namespace ampgrad {

enum class DType : uint8_t { kFloat32, kFloat16, kFloat64, kInt64, kBFloat16 };
inline constexpr size_t kNumDTypes = 5;

/// The value facts of a dtype (the type facts, Storage and Compute, are in DTypeTraits).
struct DTypeInfo {
  std::string_view name;              // "float32", as PyTorch prints it
  std::string_view safetensors_name;  // "F32": the dtype string of the safetensors format
  size_t size;                        // bytes per element
  bool is_floating;
  bool is_low_precision;  // a 16-bit float: autocast's compute dtype, kept with an FP32 master copy
  int promotion_rank;     // binary ops promote to the input of highest rank (see promote_types)
  double eps;             // gap between 1 and the next value (2^-23 for float32): the precision unit
  // The range, for floating dtypes (what underflows and overflows, e.g. in gradient statistics);
  // an integer row holds its largest value (rounded to a double) and 1.
  double max;            // largest finite value: 65504 for float16
  double min_normal;     // smallest positive normal value: 2^-14 for float16
  double min_subnormal;  // smallest positive value, min_normal * eps: 2^-24 for float16
};

/// One row per dtype: Storage is the C++ type kernels read and write, Compute the one they
/// compute in (float for 16-bit storage, as tensor cores do).
template <DType D> struct DTypeTraits;
template <> struct DTypeTraits<DType::kFloat32> {
  using Storage = float;
  using Compute = float;
  static constexpr DTypeInfo info{"float32", "F32", 4, true, false, 2, 0x1p-23,
                                  0x1.fffffep+127, 0x1p-126, 0x1p-149};
};
template <> struct DTypeTraits<DType::kFloat16> {
  using Storage = Half;
  using Compute = float;
  static constexpr DTypeInfo info{"float16", "F16", 2, true, true, 1, 0x1p-10, 65504.0, 0x1p-14, 0x1p-24};
};
/// float32's exponent range with 8 significand bits: no underflow trouble, coarse steps.
template <> struct DTypeTraits<DType::kBFloat16> {
  using Storage = BFloat16;
  using Compute = float;
  static constexpr DTypeInfo info{"bfloat16", "BF16", 2, true, true, 1, 0x1p-7, 0x1.fep+127, 0x1p-126, 0x1p-133};
};
template <> struct DTypeTraits<DType::kFloat64> {
  using Storage = double;
  using Compute = double;
  static constexpr DTypeInfo info{"float64", "F64", 8, true, false, 3, 0x1p-52,
                                  0x1.fffffffffffffp+1023, 0x1p-1022, 0x1p-1074};
};
/// Labels, token ids and indices: never differentiable, never autocast.
template <> struct DTypeTraits<DType::kInt64> {
  using Storage = int64_t;
  using Compute = int64_t;
  static constexpr DTypeInfo info{"int64", "I64", 8, false, false, 0, 1.0, 0x1p63, 1.0, 1.0};
};

inline constexpr std::array<DTypeInfo, kNumDTypes> kDTypeTable = {
    DTypeTraits<DType::kFloat32>::info, DTypeTraits<DType::kFloat16>::info, DTypeTraits<DType::kFloat64>::info,
    DTypeTraits<DType::kInt64>::info, DTypeTraits<DType::kBFloat16>::info};
inline constexpr std::array<DType, kNumDTypes> kAllDTypes = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                                                             DType::kInt64, DType::kBFloat16};
/// The dtypes ops compute in (every op runs in each of them): what the op tests iterate.
inline constexpr std::array<DType, 4> kFloatingDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                                         DType::kFloat64};
/// The 16-bit floats: autocast dtypes, stored with FP32 masters.
inline constexpr std::array<DType, 2> kLowPrecisionDTypes = {DType::kFloat16, DType::kBFloat16};

constexpr const DTypeInfo& dtype_info(DType dtype) { return kDTypeTable[static_cast<size_t>(dtype)]; }

/// Every floating row states its range: a row added without it (zeros) fails to compile here.
constexpr bool floating_ranges_are_set() {
  for (const DTypeInfo& info : kDTypeTable) {
    if (info.is_floating && !(info.min_subnormal > 0 && info.min_subnormal == info.min_normal * info.eps &&
                              info.min_normal < info.max)) {
      return false;
    }
  }
  return true;
}
static_assert(floating_ranges_are_set(), "a floating dtype row needs max, min_normal and min_subnormal");
constexpr std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }
constexpr size_t element_size(DType dtype) { return dtype_info(dtype).size; }
constexpr bool is_low_precision(DType dtype) { return dtype_info(dtype).is_low_precision; }
constexpr bool is_floating(DType dtype) { return dtype_info(dtype).is_floating; }
/// What binary ops promote to: the input of higher rank; two different dtypes of the same rank
/// (float16 and bfloat16: neither holds the other's values) give float32, as in PyTorch.
constexpr DType promote_types(DType a, DType b) {
  const int rank_a = dtype_info(a).promotion_rank, rank_b = dtype_info(b).promotion_rank;
  if (a != b && rank_a == rank_b) return DType::kFloat32;
  return rank_a >= rank_b ? a : b;
}
/// The dtype whose safetensors name is `name` ("F16" -> float16), if ampgrad has it.
std::optional<DType> dtype_from_safetensors_name(std::string_view name);

std::ostream& operator<<(std::ostream& out, DType dtype);

template <DType D> using StorageType = typename DTypeTraits<D>::Storage;

/// Calls fn(T{}) with T the storage type of `dtype`, for every dtype (copies, conversions, fills).
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(StorageType<DType::kFloat32>{});
    case DType::kFloat16: return fn(StorageType<DType::kFloat16>{});
    case DType::kFloat64: return fn(StorageType<DType::kFloat64>{});
    case DType::kInt64: return fn(StorageType<DType::kInt64>{});
    case DType::kBFloat16: return fn(StorageType<DType::kBFloat16>{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

/// Calls fn(T{}) for a floating dtype (math kernels); an integer dtype never reaches a math kernel
/// (the dispatcher refuses it first), so it falls back to float rather than instantiating the
/// kernel for integers.
template <typename Fn>
decltype(auto) visit_floating_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: return fn(StorageType<DType::kFloat16>{});
    case DType::kBFloat16: return fn(StorageType<DType::kBFloat16>{});
    case DType::kFloat64: return fn(StorageType<DType::kFloat64>{});
    default: return fn(StorageType<DType::kFloat32>{});
  }
}

/// The dtype and compute type of a storage type: DTypeOf<Half> is kFloat16, ComputeType<Half> float.
template <typename T> struct StorageTraits;
template <> struct StorageTraits<float> : DTypeTraits<DType::kFloat32> { static constexpr DType kDType = DType::kFloat32; };
template <> struct StorageTraits<Half> : DTypeTraits<DType::kFloat16> { static constexpr DType kDType = DType::kFloat16; };
template <> struct StorageTraits<BFloat16> : DTypeTraits<DType::kBFloat16> {
  static constexpr DType kDType = DType::kBFloat16;
};
template <> struct StorageTraits<double> : DTypeTraits<DType::kFloat64> { static constexpr DType kDType = DType::kFloat64; };
template <> struct StorageTraits<int64_t> : DTypeTraits<DType::kInt64> { static constexpr DType kDType = DType::kInt64; };
template <typename T> inline constexpr DType kDTypeOf = StorageTraits<T>::kDType;
template <typename T> using ComputeType = typename StorageTraits<T>::Compute;
/// Whether T is a 16-bit float storage type (Half, BFloat16): kernels widen it to float in blocks.
template <typename T> inline constexpr bool kIsLowPrecision = StorageTraits<T>::info.is_low_precision;

/// Storage <-> compute conversions for kernels: store(op(load(a), load(b))).
template <typename T> inline ComputeType<T> load(T v) { return v; }
inline float load(Half v) { return half_to_float(v); }
inline float load(BFloat16 v) { return bfloat16_to_float(v); }
template <typename T> inline T store(ComputeType<T> v) { return v; }
template <> inline Half store<Half>(float v) { return float_to_half(v); }
template <> inline BFloat16 store<BFloat16>(float v) { return float_to_bfloat16(v); }

/// Bulk 16-bit float <-> float conversions (vectorised): kernels widen a block, loop on floats,
/// and round the block back.
inline void widen(const Half* src, float* dst, size_t n) { half_to_float(src, dst, n); }
inline void widen(const BFloat16* src, float* dst, size_t n) { bfloat16_to_float(src, dst, n); }
inline void narrow(const float* src, Half* dst, size_t n) { float_to_half(src, dst, n); }
inline void narrow(const float* src, BFloat16* dst, size_t n) { float_to_bfloat16(src, dst, n); }

/// A floating value as int64, as PyTorch on x86: truncated toward zero; NaN and values outside
/// int64's range give INT64_MIN (never undefined behaviour).
constexpr int64_t float_to_int64(double v) {
  return v >= -0x1p63 && v < 0x1p63 ? static_cast<int64_t>(v) : INT64_MIN;
}

/// One element converted between storage types, rounded once (double -> half directly, int64 ->
/// half through double, which is exact below 2^53 while larger values overflow half anyway;
/// double and int64 -> bfloat16 directly, since int64 values above 2^53 are in bfloat16's range).
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, int64_t>) {
    return float_to_int64(static_cast<double>(load(v)));
  } else if constexpr (std::is_same_v<To, BFloat16> && std::is_same_v<From, int64_t>) {
    return int64_to_bfloat16(v);
  } else if constexpr (std::is_same_v<To, BFloat16> && !std::is_same_v<From, float>) {
    return double_to_bfloat16(static_cast<double>(load(v)));  // double, or half/bfloat16 widened exactly
  } else if constexpr (std::is_same_v<To, Half> && !std::is_same_v<From, float>) {
    return double_to_half(static_cast<double>(load(v)));
  } else {
    return store<To>(static_cast<ComputeType<To>>(load(v)));
  }
}

}  // namespace ampgrad
