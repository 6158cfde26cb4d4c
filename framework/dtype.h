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
#include <utility>

#include "framework/bfloat16.h"
#include "framework/device.h"
#include "framework/float8.h"
#include "framework/half.h"

namespace ampgrad {

/// The element types: PyTorch's float32, float16, float64, int64, bfloat16, float8_e4m3fn and
/// float8_e5m2.
enum class DType : uint8_t { kFloat32, kFloat16, kFloat64, kInt64, kBFloat16, kFloat8E4M3, kFloat8E5M2 };
inline constexpr size_t kNumDTypes = 7;  ///< rows of the table (checked against it below)

/// The value facts of a dtype (the type facts, Storage and Compute, are in DTypeTraits).
struct DTypeInfo {
  DType dtype;                        ///< the row's own enumerator: the table follows the enum
  std::string_view name;              ///< "float32", as PyTorch prints it
  std::string_view safetensors_name;  ///< "F32": the dtype string of the safetensors format
  size_t size;                        ///< bytes per element
  bool is_floating;  ///< a floating-point dtype (everything but int64): differentiable
  /// Ops compute in it: every floating dtype but the 8-bit ones, which (as in PyTorch) are a
  /// storage format that tensors are cast to and from, copied and viewed, and GEMM operands.
  bool is_compute;
  bool is_low_precision;  ///< a 16-bit float: autocast's compute dtype, kept with an FP32 master copy
  int promotion_rank;     ///< binary ops promote to the input of highest rank (see promote_types)
  double eps;             ///< gap between 1 and the next value (2^-23 for float32): the precision unit
  // The range, for floating dtypes (what underflows and overflows, e.g. in gradient statistics);
  // an integer row holds its largest value (rounded to a double) and 1.
  double max;            ///< largest finite value: 65504 for float16
  double min_normal;     ///< smallest positive normal value: 2^-14 for float16
  double min_subnormal;  ///< smallest positive value, min_normal * eps: 2^-24 for float16
};

/// One row per dtype: Storage is the C++ type kernels read and write, Compute the one they
/// compute in (float for 16-bit storage, as tensor cores do). A new dtype is a row here, its
/// enumerator and its storage type; the lists below and the visitors derive from the rows.
template <DType D> struct DTypeTraits;
/// float32: the default dtype, and that of the FP32 master weights.
template <> struct DTypeTraits<DType::kFloat32> {
  using Storage = float;  ///< kernels read and write float
  using Compute = float;  ///< and compute in float
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kFloat32, .name = "float32", .safetensors_name = "F32", .size = 4,
                                  .is_floating = true, .is_compute = true, .is_low_precision = false, .promotion_rank = 2,
                                  .eps = 0x1p-23, .max = 0x1.fffffep+127, .min_normal = 0x1p-126,
                                  .min_subnormal = 0x1p-149};
};
/// float16: 5 exponent bits, 11 significand bits (10 stored); small gradients underflow without
/// loss scaling.
template <> struct DTypeTraits<DType::kFloat16> {
  using Storage = Half;  ///< stored as IEEE binary16
  using Compute = float;  ///< computed in float
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kFloat16, .name = "float16", .safetensors_name = "F16", .size = 2,
                                  .is_floating = true, .is_compute = true, .is_low_precision = true, .promotion_rank = 1,
                                  .eps = 0x1p-10, .max = 65504.0, .min_normal = 0x1p-14, .min_subnormal = 0x1p-24};
};
/// float64: the reference precision of the tests.
template <> struct DTypeTraits<DType::kFloat64> {
  using Storage = double;  ///< kernels read and write double
  using Compute = double;  ///< and compute in double
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kFloat64, .name = "float64", .safetensors_name = "F64", .size = 8,
                                  .is_floating = true, .is_compute = true, .is_low_precision = false, .promotion_rank = 3,
                                  .eps = 0x1p-52, .max = 0x1.fffffffffffffp+1023, .min_normal = 0x1p-1022,
                                  .min_subnormal = 0x1p-1074};
};
/// Labels, token ids and indices: never differentiable, never autocast.
template <> struct DTypeTraits<DType::kInt64> {
  using Storage = int64_t;  ///< stored as int64_t
  using Compute = int64_t;  ///< and computed in it
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kInt64, .name = "int64", .safetensors_name = "I64", .size = 8,
                                  .is_floating = false, .is_compute = false, .is_low_precision = false, .promotion_rank = 0, .eps = 1.0,
                                  .max = 0x1p63, .min_normal = 1.0, .min_subnormal = 1.0};
};
/// float32's exponent range with 8 significand bits: no underflow trouble, coarse steps.
template <> struct DTypeTraits<DType::kBFloat16> {
  using Storage = BFloat16;  ///< stored as the top 16 bits of a float
  using Compute = float;  ///< computed in float
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kBFloat16, .name = "bfloat16", .safetensors_name = "BF16", .size = 2,
                                  .is_floating = true, .is_compute = true, .is_low_precision = true, .promotion_rank = 1,
                                  .eps = 0x1p-7, .max = 0x1.fep+127, .min_normal = 0x1p-126, .min_subnormal = 0x1p-133};
};

/// float8_e4m3fn: 4 exponent bits, 3 mantissa bits, no inf; the forward format of FP8 training.
/// Storage only: ops refuse it, casts and views take it (see is_compute).
template <> struct DTypeTraits<DType::kFloat8E4M3> {
  using Storage = Float8E4M3;  ///< one byte
  using Compute = float;       ///< widened to float
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kFloat8E4M3, .name = "float8_e4m3fn", .safetensors_name = "F8_E4M3",
                                  .size = 1, .is_floating = true, .is_compute = false, .is_low_precision = false,
                                  .promotion_rank = 1, .eps = 0x1p-3, .max = 448.0, .min_normal = 0x1p-6,
                                  .min_subnormal = 0x1p-9};
};
/// float8_e5m2: 5 exponent bits, 2 mantissa bits, IEEE inf and NaN; the gradient format of FP8
/// training (float16's range at a quarter of its precision).
template <> struct DTypeTraits<DType::kFloat8E5M2> {
  using Storage = Float8E5M2;  ///< one byte
  using Compute = float;       ///< widened to float
  /// Its value facts.
  static constexpr DTypeInfo info{.dtype = DType::kFloat8E5M2, .name = "float8_e5m2", .safetensors_name = "F8_E5M2",
                                  .size = 1, .is_floating = true, .is_compute = false, .is_low_precision = false,
                                  .promotion_rank = 1, .eps = 0x1p-2, .max = 57344.0, .min_normal = 0x1p-14,
                                  .min_subnormal = 0x1p-16};
};

namespace detail {
template <size_t I>
constexpr DTypeInfo row_of() {
  return DTypeTraits<static_cast<DType>(I)>::info;
}
template <size_t... I>
constexpr std::array<DTypeInfo, kNumDTypes> make_dtype_table(std::index_sequence<I...>) {
  return {row_of<I>()...};
}
// Whether the enumerator with value kNumDTypes has a row: then kNumDTypes was not raised with it.
template <DType D, typename = void> inline constexpr bool kHasRow = false;
template <DType D> inline constexpr bool kHasRow<D, std::void_t<decltype(DTypeTraits<D>::info)>> = true;
}  // namespace detail
static_assert(!detail::kHasRow<static_cast<DType>(kNumDTypes)>, "a DTypeTraits row past kNumDTypes: raise kNumDTypes");

/// Every row, indexed by the enumerator.
inline constexpr std::array<DTypeInfo, kNumDTypes> kDTypeTable =
    detail::make_dtype_table(std::make_index_sequence<kNumDTypes>{});

namespace detail {
constexpr bool table_follows_enum() {
  for (size_t i = 0; i < kNumDTypes; ++i) {
    if (static_cast<size_t>(kDTypeTable[i].dtype) != i) return false;
  }
  return true;
}
// Whether row `info` has the flag kFlag (every row has the null flag).
template <bool DTypeInfo::*kFlag>
constexpr bool has_flag(const DTypeInfo& info) {
  if constexpr (kFlag == nullptr) {
    return true;
  } else {
    return info.*kFlag;
  }
}
// The dtypes whose row has the flag kFlag (all of them for nullptr), in table order.
template <bool DTypeInfo::*kFlag = nullptr>
constexpr auto dtypes_where() {
  constexpr size_t kCount = [] {
    size_t n = 0;
    for (const DTypeInfo& info : kDTypeTable) n += has_flag<kFlag>(info) ? 1 : 0;
    return n;
  }();
  std::array<DType, kCount> out{};
  size_t n = 0;
  for (const DTypeInfo& info : kDTypeTable) {
    if (has_flag<kFlag>(info)) out[n++] = info.dtype;
  }
  return out;
}
}  // namespace detail
static_assert(detail::table_follows_enum(), "each DTypeTraits row must name its own enumerator");

/// Every dtype, in enum order.
inline constexpr auto kAllDTypes = detail::dtypes_where();
/// The dtypes ops compute in (every op runs in each of them): what the op tests iterate. The
/// 8-bit floats are floating but not among them (DTypeInfo::is_compute).
inline constexpr auto kFloatingDTypes = detail::dtypes_where<&DTypeInfo::is_compute>();
/// The 8-bit floats: storage and GEMM operands of FP8 training.
inline constexpr std::array<DType, 2> kFloat8DTypes{DType::kFloat8E4M3, DType::kFloat8E5M2};
/// The 16-bit floats: autocast dtypes, stored with FP32 masters.
inline constexpr auto kLowPrecisionDTypes = detail::dtypes_where<&DTypeInfo::is_low_precision>();

/// The row of `dtype` in the table.
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
constexpr std::string_view dtype_name(DType dtype) { return dtype_info(dtype).name; }  ///< "float32", ...
constexpr size_t element_size(DType dtype) { return dtype_info(dtype).size; }  ///< bytes per element
/// A 16-bit float (autocast's compute dtypes).
constexpr bool is_low_precision(DType dtype) { return dtype_info(dtype).is_low_precision; }
constexpr bool is_floating(DType dtype) { return dtype_info(dtype).is_floating; }  ///< floating point (differentiable)
/// A dtype ops compute in (kFloatingDTypes): floating and not 8-bit.
constexpr bool is_compute(DType dtype) { return dtype_info(dtype).is_compute; }
/// One of the 8-bit floats.
constexpr bool is_float8(DType dtype) { return dtype_info(dtype).is_floating && dtype_info(dtype).size == 1; }
/// What binary ops promote to: the input of higher rank; two different dtypes of the same rank
/// (float16 and bfloat16: neither holds the other's values) give float32, as in PyTorch.
constexpr DType promote_types(DType a, DType b) {
  const int rank_a = dtype_info(a).promotion_rank, rank_b = dtype_info(b).promotion_rank;
  if (a != b && rank_a == rank_b) return DType::kFloat32;
  return rank_a >= rank_b ? a : b;
}
/// The dtype whose safetensors name is `name` ("F16" -> float16), if ampgrad has it.
std::optional<DType> dtype_from_safetensors_name(std::string_view name);

/// Prints dtype_name(dtype).
std::ostream& operator<<(std::ostream& out, DType dtype);

/// The C++ type a dtype is stored as: StorageType<DType::kFloat16> is Half.
template <DType D> using StorageType = typename DTypeTraits<D>::Storage;

namespace detail {
// fn(StorageType<D>{}) for the row D == dtype among rows I.. of the table that have the flag
// kFlag, else for kFallback's (whose own row is left to this fallback, so fn is instantiated
// once for it). fn is instantiated only for those rows and the fallback.
template <size_t I, DType kFallback, bool DTypeInfo::*kFlag, typename Fn>
decltype(auto) visit_rows(DType dtype, Fn&& fn) {
  if constexpr (I == kNumDTypes) {
    return fn(StorageType<kFallback>{});
  } else if constexpr (!has_flag<kFlag>(kDTypeTable[I]) || kDTypeTable[I].dtype == kFallback) {
    return visit_rows<I + 1, kFallback, kFlag>(dtype, std::forward<Fn>(fn));
  } else {
    constexpr DType row = kDTypeTable[I].dtype;
    if (dtype == row) return fn(StorageType<row>{});
    return visit_rows<I + 1, kFallback, kFlag>(dtype, std::forward<Fn>(fn));
  }
}
// How many rows store T, and (where one does) which.
template <typename T, size_t I = 0>
constexpr size_t rows_storing() {
  if constexpr (I == kNumDTypes) {
    return 0;
  } else {
    return (std::is_same_v<StorageType<static_cast<DType>(I)>, T> ? 1 : 0) + rows_storing<T, I + 1>();
  }
}
template <typename T, size_t I = 0>
constexpr DType dtype_storing() {
  if constexpr (I + 1 == kNumDTypes || std::is_same_v<StorageType<static_cast<DType>(I)>, T>) {
    return static_cast<DType>(I);
  } else {
    return dtype_storing<T, I + 1>();
  }
}
// Each row's storage type is its own (kDTypeOf could not tell two rows apart otherwise).
template <size_t I = 0>
constexpr bool storage_types_are_distinct() {
  if constexpr (I == kNumDTypes) {
    return true;
  } else {
    return rows_storing<StorageType<static_cast<DType>(I)>>() == 1 && storage_types_are_distinct<I + 1>();
  }
}
}  // namespace detail
static_assert(detail::storage_types_are_distinct(), "two dtype rows share a storage type");

/// Calls fn(T{}) with T the storage type of `dtype`, for every dtype (copies, conversions, fills).
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  return detail::visit_rows<0, DType::kFloat32, nullptr>(dtype, std::forward<Fn>(fn));
}

/// Calls fn(T{}) for a dtype ops compute in (math kernels); an integer or 8-bit dtype never reaches
/// a math kernel (the dispatcher refuses it first), so it falls back to float rather than
/// instantiating the kernel for it.
template <typename Fn>
decltype(auto) visit_floating_dtype(DType dtype, Fn&& fn) {
  return detail::visit_rows<0, DType::kFloat32, &DTypeInfo::is_compute>(dtype, std::forward<Fn>(fn));
}

/// The dtype and compute type of a storage type: DTypeOf<Half> is kFloat16, ComputeType<Half> float.
/// Incomplete for a type no row stores, so overloads on ComputeType<T> drop out for it.
template <typename T> struct StorageTraits;
/// The row whose Storage is T.
template <typename T>
  requires(detail::rows_storing<T>() == 1)
struct StorageTraits<T> : DTypeTraits<detail::dtype_storing<T>()> {
  static constexpr DType kDType = detail::dtype_storing<T>();  ///< the dtype storing T
};
/// The dtype a storage type stores: kDTypeOf<Half> is DType::kFloat16.
template <typename T> inline constexpr DType kDTypeOf = StorageTraits<T>::kDType;
/// The type a storage type computes in: float for Half and BFloat16.
template <typename T> using ComputeType = typename StorageTraits<T>::Compute;
/// Whether T is a 16-bit float storage type (Half, BFloat16): kernels widen it to float in blocks.
template <typename T> inline constexpr bool kIsLowPrecision = StorageTraits<T>::info.is_low_precision;
/// Whether T is stored narrower than the float it computes in (Half, BFloat16, the 8-bit floats):
/// widen and narrow below convert whole blocks of it.
template <typename T> inline constexpr bool kWidensToFloat = std::is_same_v<ComputeType<T>, float> && sizeof(T) < 4;

/// Storage <-> compute conversions for kernels: store(op(load(a), load(b))).
template <typename T> inline ComputeType<T> load(T v) { return v; }
inline float load(Half v) { return half_to_float(v); }  ///< a float16 widened to float (exact)
inline float load(BFloat16 v) { return bfloat16_to_float(v); }  ///< a bfloat16 widened to float (exact)
inline float load(Float8E4M3 v) { return float8_to_float(v); }  ///< an 8-bit float widened to float (exact)
inline float load(Float8E5M2 v) { return float8_to_float(v); }  ///< an 8-bit float widened to float (exact)
template <typename T> inline T store(ComputeType<T> v) { return v; }  ///< identity for types that compute as they store
/// Float rounded to float16 (to nearest even).
template <> inline Half store<Half>(float v) { return float_to_half(v); }
/// Float rounded to bfloat16 (to nearest even).
template <> inline BFloat16 store<BFloat16>(float v) { return float_to_bfloat16(v); }
/// Float rounded to float8_e4m3fn (nearest even; saturates past 448, as PyTorch).
template <> inline Float8E4M3 store<Float8E4M3>(float v) { return float_to_float8_e4m3(v); }
/// Float rounded to float8_e5m2 (nearest even; inf past 57344, as PyTorch).
template <> inline Float8E5M2 store<Float8E5M2>(float v) { return float_to_float8_e5m2(v); }

/// Bulk 16-bit float <-> float conversions (vectorised): kernels widen a block, loop on floats,
/// and round the block back.
inline void widen(const Half* src, float* dst, size_t n) { half_to_float(src, dst, n); }
/// N bfloat16 values widened to float.
inline void widen(const BFloat16* src, float* dst, size_t n) { bfloat16_to_float(src, dst, n); }
/// N floats rounded to float16.
inline void narrow(const float* src, Half* dst, size_t n) { float_to_half(src, dst, n); }
/// N floats rounded to bfloat16.
inline void narrow(const float* src, BFloat16* dst, size_t n) { float_to_bfloat16(src, dst, n); }
/// N 8-bit floats widened to float.
inline void widen(const Float8E4M3* src, float* dst, size_t n) { float8_to_float(src, dst, n); }
/// N 8-bit floats widened to float.
inline void widen(const Float8E5M2* src, float* dst, size_t n) { float8_to_float(src, dst, n); }
/// N floats rounded to float8_e4m3fn.
inline void narrow(const float* src, Float8E4M3* dst, size_t n) { float_to_float8(src, dst, n); }
/// N floats rounded to float8_e5m2.
inline void narrow(const float* src, Float8E5M2* dst, size_t n) { float_to_float8(src, dst, n); }

/// A floating value as int64, as PyTorch on x86: truncated toward zero; NaN and values outside
/// int64's range give INT64_MIN (never undefined behaviour).
constexpr int64_t float_to_int64(double v) {
  return v >= -0x1p63 && v < 0x1p63 ? static_cast<int64_t>(v) : INT64_MIN;
}

/// One element converted between storage types, rounded once (double -> half directly, int64 ->
/// half through double, which is exact below 2^53 while larger values overflow half anyway;
/// double and int64 -> bfloat16 directly, since int64 values above 2^53 are in bfloat16's range),
/// except that double -> an 8-bit float rounds through float, as PyTorch does (int64 -> 8-bit
/// through float is exact wherever the 8-bit float does not overflow).
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
