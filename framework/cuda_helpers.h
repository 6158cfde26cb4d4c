// Device-side helpers shared by every .cu file: the CUDA storage type of each dtype (Half is
// layout-compatible with __half), load/store to the compute type, and launch geometry.
// Store T, compute float (double for float64).
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "framework/dtype.h"

namespace ampgrad::cuda {

static_assert(sizeof(Half) == sizeof(__half) && alignof(Half) == alignof(__half),
              "ampgrad::Half must be layout-compatible with __half");

/// DeviceType<float> = float, DeviceType<Half> = __half, DeviceType<double> = double.
template <typename T> struct DeviceTypeOf { using type = T; };
template <> struct DeviceTypeOf<Half> { using type = __half; };
template <typename T> using DeviceType = typename DeviceTypeOf<T>::type;

/// The compute type of a device storage type: float for __half and float, double for double.
template <typename T> struct DeviceComputeOf { using type = T; };
template <> struct DeviceComputeOf<__half> { using type = float; };
template <typename T> using Compute = typename DeviceComputeOf<T>::type;

template <typename T> __host__ __device__ __forceinline__ Compute<T> dload(T v) { return v; }
__host__ __device__ __forceinline__ float dload(__half v) { return __half2float(v); }

template <typename T> __host__ __device__ __forceinline__ T dstore(Compute<T> v) { return v; }
template <> __host__ __device__ __forceinline__ __half dstore<__half>(float v) { return __float2half_rn(v); }

/// Element conversion with the CPU's rounding (see ampgrad::convert in dtype.h): half<->float
/// exact/RNE, double and int64 -> half rounded once (through double), float -> int64 truncated with
/// NaN and out-of-range values giving INT64_MIN.
template <typename To, typename From>
__host__ __device__ __forceinline__ To dconvert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, int64_t>) {
    return ::ampgrad::float_to_int64(static_cast<double>(dload(x)));
  } else if constexpr (std::is_same_v<To, __half>) {
    if constexpr (std::is_same_v<From, float>) {
      return __float2half_rn(x);
    } else {
      return __double2half(static_cast<double>(x));
    }
  } else if constexpr (std::is_same_v<From, __half>) {
    return static_cast<To>(__half2float(x));
  } else {
    return static_cast<To>(x);
  }
}

/// Typed device pointer of raw storage (Half* -> __half*).
template <typename T> inline DeviceType<T>* dptr(void* p) { return static_cast<DeviceType<T>*>(p); }
template <typename T> inline const DeviceType<T>* dptr(const void* p) { return static_cast<const DeviceType<T>*>(p); }

inline constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill the GPU, capped so huge n loop.
inline unsigned int blocks_for(int64_t n, int per_thread = 1) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * per_thread;
  return static_cast<unsigned int>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 65536));
}

}  // namespace ampgrad::cuda
