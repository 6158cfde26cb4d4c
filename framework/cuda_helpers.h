// Device-side helpers shared by every .cu file: the CUDA storage type of each dtype (Half is
// layout-compatible with __half, BFloat16 with __nv_bfloat16), load/store to the compute type with
// the CPU's rounding, and launch geometry (multi-tensor launches: multi_tensor_cuda.h). Store T,
// compute float (double for float64).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "framework/dtype.h"

namespace ampgrad::cuda {

static_assert(sizeof(Half) == sizeof(__half) && alignof(Half) == alignof(__half),
              "ampgrad::Half must be layout-compatible with __half");
static_assert(sizeof(BFloat16) == sizeof(__nv_bfloat16) && alignof(BFloat16) == alignof(__nv_bfloat16),
              "ampgrad::BFloat16 must be layout-compatible with __nv_bfloat16");

/// DeviceType<float> = float, DeviceType<Half> = __half, DeviceType<BFloat16> = __nv_bfloat16,
/// DeviceType<double> = double.
template <typename T> struct DeviceTypeOf { using type = T; };
template <> struct DeviceTypeOf<Half> { using type = __half; };
template <> struct DeviceTypeOf<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using DeviceType = typename DeviceTypeOf<T>::type;

/// The compute type of a device storage type: float for the 16-bit types and float, double for double.
template <typename T> struct DeviceComputeOf { using type = T; };
template <> struct DeviceComputeOf<__half> { using type = float; };
template <> struct DeviceComputeOf<__nv_bfloat16> { using type = float; };
template <> struct DeviceComputeOf<Float8E4M3> { using type = float; };  // the 8-bit floats are their
template <> struct DeviceComputeOf<Float8E5M2> { using type = float; };  // own device types
template <typename T>
inline constexpr bool kIsDeviceFloat8 = std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>;

template <typename T> using Compute = typename DeviceComputeOf<T>::type;

__host__ __device__ __forceinline__ uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ float float_of_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

__host__ __device__ __forceinline__ uint64_t double_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ __nv_bfloat16 bfloat16_of_bits(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __nv_bfloat16(raw);
}

__host__ __device__ __forceinline__ uint16_t bits_of(__nv_bfloat16 v) { return __nv_bfloat16_raw(v).x; }

template <typename T> __host__ __device__ __forceinline__ Compute<T> dload(T v) { return v; }
__host__ __device__ __forceinline__ float dload(__half v) { return __half2float(v); }
__host__ __device__ __forceinline__ float dload(__nv_bfloat16 v) {
  return float_of_bits(::ampgrad::bf16::to_float_bits(bits_of(v)));
}

// The 8-bit floats by the CPU's reference (float8.h), so both backends give PyTorch's bits.
__host__ __device__ __forceinline__ float dload(Float8E4M3 v) { return float_of_bits(fp8::to_float_bits<Float8E4M3>(v.bits)); }
__host__ __device__ __forceinline__ float dload(Float8E5M2 v) { return float_of_bits(fp8::to_float_bits<Float8E5M2>(v.bits)); }

template <typename T> __host__ __device__ __forceinline__ T dstore(Compute<T> v) { return v; }
template <> __host__ __device__ __forceinline__ Float8E4M3 dstore<Float8E4M3>(float v) {
  return Float8E4M3{fp8::from_float_bits<Float8E4M3>(float_bits(v), false)};
}
template <> __host__ __device__ __forceinline__ Float8E5M2 dstore<Float8E5M2>(float v) {
  return Float8E5M2{fp8::from_float_bits<Float8E5M2>(float_bits(v), false)};
}
template <> __host__ __device__ __forceinline__ __half dstore<__half>(float v) { return __float2half_rn(v); }
// The CPU's reference rounding (bfloat16.h), so both backends give the same bits:
// __float2bfloat16_rn's host version turns every NaN into 0x7fff (sign and payload lost).
template <> __host__ __device__ __forceinline__ __nv_bfloat16 dstore<__nv_bfloat16>(float v) {
  return bfloat16_of_bits(::ampgrad::bf16::from_float_bits(float_bits(v)));
}

/// A float16 widened to float as the CPU's F16C does it, NaNs too (sign and payload kept, quieted):
/// the GPU's conversion gives every NaN input its one canonical NaN, sign dropped.
__host__ __device__ __forceinline__ float half_to_float_keeping_nan(__half v) {
  const uint16_t b = __half_raw(v).x;
  if ((b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0) {
    return float_of_bits((static_cast<uint32_t>(b & 0x8000u) << 16) | 0x7fc00000u | (static_cast<uint32_t>(b & 0x03ffu) << 13));
  }
  return __half2float(v);
}

/// Element conversion with the CPU's rounding (see ampgrad::convert in dtype.h): half<->float
/// exact/RNE, double and int64 -> half rounded once (through double), double and int64 ->
/// bfloat16 rounded once (directly), float -> int64 truncated with NaN and out-of-range values
/// giving INT64_MIN.
template <typename To, typename From>
__host__ __device__ __forceinline__ To dconvert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, int64_t>) {
    return ::ampgrad::float_to_int64(static_cast<double>(dload(x)));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    if constexpr (std::is_same_v<From, int64_t>) {
      return bfloat16_of_bits(::ampgrad::bf16::from_int64(x));
    } else if constexpr (std::is_same_v<From, double>) {
      return bfloat16_of_bits(::ampgrad::bf16::from_double_bits(double_bits(x)));
    } else {
      return dstore<__nv_bfloat16>(dload(x));  // float, or half widened exactly
    }
  } else if constexpr (kIsDeviceFloat8<To> && std::is_same_v<From, __half>) {
    return dstore<To>(half_to_float_keeping_nan(x));  // the 8-bit NaN keeps the sign, as the CPU's
  } else if constexpr (kIsDeviceFloat8<To>) {
    return dstore<To>(static_cast<float>(dload(x)));  // through float, as the CPU and PyTorch
  } else if constexpr (std::is_same_v<To, __half>) {
    if constexpr (std::is_same_v<From, float>) {
      return __float2half_rn(x);
    } else {
      return __double2half(static_cast<double>(dload(x)));
    }
  } else if constexpr (std::is_same_v<From, __half> || std::is_same_v<From, __nv_bfloat16> || kIsDeviceFloat8<From>) {
    return static_cast<To>(dload(x));
  } else {
    return static_cast<To>(x);
  }
}

/// Typed device pointer of raw storage (Half* -> __half*, BFloat16* -> __nv_bfloat16*).
template <typename T> inline DeviceType<T>* dptr(void* p) { return static_cast<DeviceType<T>*>(p); }
template <typename T> inline const DeviceType<T>* dptr(const void* p) { return static_cast<const DeviceType<T>*>(p); }

inline constexpr int kThreads = 256;

/// The loop of an element-wise kernel over n elements: each thread takes kUnroll of them per turn
/// (i, i + G, ..., G the grid's thread count, so every load instruction stays coalesced) and issues
/// all their loads before any store. One 16-bit load in flight per thread leaves an H200 at about
/// a third of its memory bandwidth; the stores may alias the loads, so without this split the
/// compiler could not move a load above the previous store. load(i) returns a V; store(i, v).
/// Launch it with blocks_for(n, kUnroll) blocks of kThreads.
inline constexpr int kUnroll = 8;
template <typename V, typename Load, typename Store>
__device__ __forceinline__ void unrolled_loop(int64_t n, Load load, Store store) {
  const int64_t grid = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < n; base += grid * kUnroll) {
    V v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (base + k * grid < n) v[k] = load(base + k * grid);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (base + k * grid < n) store(base + k * grid, v[k]);
    }
  }
}

/// Blocks for a grid-stride loop over n items: enough to fill the GPU, capped so huge n loop.
inline unsigned int blocks_for(int64_t n, int per_thread = 1) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * per_thread;
  return static_cast<unsigned int>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 65536));
}

}  // namespace ampgrad::cuda
