// The user-defined MPI ops for 16-bit floats and the dtype -> MPI mapping (see mpi_reduce.h).
#include "distributed/mpi_reduce.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "distributed/mpi_runtime.h"
#include "framework/error.h"
#include "framework/bfloat16.h"
#include "framework/half.h"

namespace ampgrad::distributed::detail {

namespace {

// A 16-bit float (float16, bfloat16): stored narrow, computed in float32, through the dtype table's
// Storage/Compute types; only the bulk conversions below are specific to each, for speed.
template <typename T>
constexpr bool kIsNarrowFloat = !std::is_same_v<T, ComputeType<T>> && std::is_same_v<ComputeType<T>, float>;

constexpr int kChunk = 512;  // elements widened at a time (two float buffers on the stack)

template <typename T>
void widen(const T* src, float* dst, int n) {
  if constexpr (std::is_same_v<T, Half>) {
    half_to_float(src, dst, static_cast<size_t>(n));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    bfloat16_to_float(src, dst, static_cast<size_t>(n));
  } else {
    for (int i = 0; i < n; ++i) dst[i] = load(src[i]);
  }
}

template <typename T>
void narrow(const float* src, T* dst, int n) {
  if constexpr (std::is_same_v<T, Half>) {
    float_to_half(src, dst, static_cast<size_t>(n));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    float_to_bfloat16(src, dst, static_cast<size_t>(n));
  } else {
    for (int i = 0; i < n; ++i) dst[i] = store<T>(src[i]);
  }
}

// MPI's signature for user-defined ops: inout[i] = in[i] (op) inout[i]. Both are commutative
// bit for bit (a + b == b + a in IEEE arithmetic), so every rank gets the same result whatever
// order MPI's algorithm combines ranks in.
template <typename T, bool kMax>
void combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  float fa[kChunk], fb[kChunk];
  for (int start = 0; start < *len; start += kChunk) {
    const int n = std::min(kChunk, *len - start);
    widen(a + start, fa, n);
    widen(b + start, fb, n);
    for (int i = 0; i < n; ++i) {
      if constexpr (kMax) {
        fb[i] = (std::isnan(fa[i]) || fa[i] > fb[i]) ? fa[i] : fb[i];  // NaN wins, as in torch.max
      } else {
        fb[i] += fa[i];
      }
    }
    narrow(fb, b + start, n);
  }
}

// NaN-propagating max for float32/float64 (MPI_MAX's NaN handling is unspecified; torch.max and
// the 16-bit op above let NaN win).
template <typename T>
void max_wide(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = (std::isnan(a[i]) || a[i] > b[i]) ? a[i] : b[i];
}

template <typename T>
constexpr bool kIsBuiltin = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int64_t>;

// Per dtype, made on first use by the communication thread (the only one that calls MPI).
struct DTypeOps {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
  MPI_Op max = MPI_OP_NULL;
};
std::array<DTypeOps, kNumDTypes> dtype_ops;

template <typename T>
const DTypeOps& ops_for() {
  DTypeOps& t = dtype_ops[static_cast<size_t>(kDTypeOf<T>)];
  if (t.type != MPI_DATATYPE_NULL) return t;
  if constexpr (kIsNarrowFloat<T>) {
    mpi_check(MPI_Type_contiguous(sizeof(T), MPI_BYTE, &t.type), "MPI_Type_contiguous");
    mpi_check(MPI_Type_commit(&t.type), "MPI_Type_commit");
    mpi_check(MPI_Op_create(&combine<T, false>, /*commute=*/1, &t.sum), "MPI_Op_create");
    mpi_check(MPI_Op_create(&combine<T, true>, /*commute=*/1, &t.max), "MPI_Op_create");
  } else if constexpr (std::is_same_v<T, int64_t>) {
    t.type = MPI_INT64_T;
    t.sum = MPI_SUM;
    t.max = MPI_MAX;
  } else {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
    t.type = std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
    t.sum = MPI_SUM;
    mpi_check(MPI_Op_create(&max_wide<T>, /*commute=*/1, &t.max), "MPI_Op_create");
  }
  return t;
}

}  // namespace

bool mpi_supports(DType dtype) {
  return visit_dtype(dtype, [](auto t) {
    using T = decltype(t);
    return kIsBuiltin<T> || kIsNarrowFloat<T>;
  });
}

MPI_Datatype mpi_datatype(DType dtype) { return mpi_reduction(dtype, ReduceOp::kSum).type; }

bool mpi_reduction_divides_before(DType dtype, ReduceOp op) {
  return op == ReduceOp::kAvg && visit_dtype(dtype, [](auto t) { return kIsNarrowFloat<decltype(t)>; });
}

MpiReduction mpi_reduction(DType dtype, ReduceOp op) {
  return visit_dtype(dtype, [&](auto t) -> MpiReduction {
    using T = decltype(t);
    if constexpr (kIsBuiltin<T> || kIsNarrowFloat<T>) {
      const DTypeOps& ops = ops_for<T>();
      const bool avg = op == ReduceOp::kAvg;
      return {.type = ops.type, .op = op == ReduceOp::kMax ? ops.max : ops.sum,
              .divide_before = avg && kIsNarrowFloat<T>, .divide_after = avg && !kIsNarrowFloat<T>};
    } else {
      AG_FAIL("ampgrad.distributed: MPI groups do not handle dtype ", dtype);
    }
  });
}

void divide_in_place(void* data, DType dtype, int64_t n, int divisor) {
  if (divisor == 1) return;
  visit_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    T* p = static_cast<T*>(data);
    if constexpr (kIsNarrowFloat<T>) {
      float wide[kChunk];
      for (int64_t start = 0; start < n; start += kChunk) {
        const int m = static_cast<int>(std::min<int64_t>(kChunk, n - start));
        widen(p + start, wide, m);
        for (int i = 0; i < m; ++i) wide[i] /= static_cast<float>(divisor);
        narrow(wide, p + start, m);
      }
    } else {
      const ComputeType<T> d = static_cast<ComputeType<T>>(divisor);
      for (int64_t i = 0; i < n; ++i) p[i] = store<T>(load(p[i]) / d);
    }
  });
}

}  // namespace ampgrad::distributed::detail
