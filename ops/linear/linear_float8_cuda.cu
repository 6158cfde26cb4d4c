// The element-wise halves of the FP8 linear on CUDA (linear_float8_kernels.h): the scaled
// saturating cast with its amax and counts in one pass (alone, or fused with the transpose that
// the backward's K-contiguous GEMMs need), the amax alone (current scaling), and the epilogue that
// descales the float products and adds the bias. Each mirrors linear_float8_cpu.cc bit for bit:
// the cast is framework/float8.h's reference, run on the device; the amax is the largest |x| as
// bits (unsigned order is magnitude order and every NaN lies above inf, so a NaN wins, with the
// same payload the CPU's pass picks). The GEMMs are in linear_float8_gemm_cuda.cu.
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/float8.h"
#include "ops/linear/linear_float8_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// The slots of a pass's result: the amax's bits, the saturated count, the flushed count. 64 bits
// each, so that every block adds its share with one atomic per slot and one copy brings all back.
enum Slot { kAmaxBits, kSaturated, kFlushed, kSlots };

// A source element as the CPU's pass widens it: float16 NaNs keep their sign and payload (F16C
// does), float64 rounds once to float.
template <typename T>
__device__ __forceinline__ float widen(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return half_to_float_keeping_nan(v);
  } else {
    return static_cast<float>(dload(v));
  }
}

// One thread's share of a pass: the largest |src| as bits, and the cast's counts.
struct Partial {
  uint32_t amax = 0;
  unsigned long long saturated = 0, flushed = 0;
};

// The saturating cast of x * scale to F (one IEEE product, as the CPU's), folding |x| into p's
// amax and counting the product when the clamp changed it (from fp8::saturation_bits on, infs
// too, NaN not) and x when it is nonzero and its code +-0. Both cast kernels cast through here.
template <typename F>
__device__ __forceinline__ uint8_t cast_counting(float x, float scale, Partial& p) {
  constexpr uint32_t clamped_bits = fp8::saturation_bits<F>();
  const uint32_t a = float_bits(x) & 0x7fffffffu;
  const float v = __fmul_rn(x, scale);
  const uint32_t av = float_bits(v) & 0x7fffffffu;
  const uint8_t code = fp8::from_float_bits<F>(float_bits(v), /*saturate=*/true);
  p.amax = max(p.amax, a);
  p.saturated += av >= clamped_bits && av <= 0x7f800000u;
  p.flushed += (code & 0x7fu) == 0 && a != 0;
  return code;
}

// Folds each thread's partial result into the block's, then into result[] (kSlots values). A
// block is kThreads threads, 1-D or 2-D (threads are numbered x first, as warps are formed).
__device__ void add_block_partial(Partial p, unsigned long long* result) {
  __shared__ uint32_t amaxes[kThreads / 32];
  __shared__ unsigned long long saturateds[kThreads / 32], flusheds[kThreads / 32];
  uint32_t amax = p.amax;
  unsigned long long saturated = p.saturated, flushed = p.flushed;
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = max(amax, __shfl_down_sync(0xffffffffu, amax, offset));
    saturated += __shfl_down_sync(0xffffffffu, saturated, offset);
    flushed += __shfl_down_sync(0xffffffffu, flushed, offset);
  }
  const int thread = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  const int warp = thread / 32, lane = thread % 32;
  if (lane == 0) {
    amaxes[warp] = amax;
    saturateds[warp] = saturated;
    flusheds[warp] = flushed;
  }
  __syncthreads();
  if (thread != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) {
    amax = max(amax, amaxes[w]);
    saturated += saturateds[w];
    flushed += flusheds[w];
  }
  atomicMax(&result[kAmaxBits], static_cast<unsigned long long>(amax));
  if (saturated != 0) atomicAdd(&result[kSaturated], saturated);
  if (flushed != 0) atomicAdd(&result[kFlushed], flushed);
}

// src and dst are (n); result is (kSlots), zeroed. With kCast, dst[i] = cast_counting of src[i];
// without, only the amax (dst unused). unrolled_loop keeps kUnroll loads in flight per thread.
template <typename T, typename F, bool kCast>
__global__ void cast_kernel(const T* src, int64_t n, float scale, uint8_t* dst, unsigned long long* result) {
  Partial p;
  unrolled_loop<float>(
      n, [&](int64_t i) { return widen(src[i]); },
      [&](int64_t i, float x) {
        if constexpr (kCast) {
          dst[i] = cast_counting<F>(x, scale, p);
        } else {
          p.amax = max(p.amax, float_bits(x) & 0x7fffffffu);
        }
      });
  add_block_partial(p, result);
}

constexpr int kTile = 32;                     // a tile is 32x32 elements
constexpr int kTileRows = kThreads / kTile;   // a block is (32, 8) threads: 4 tile rows a thread
constexpr int kRowsPerThread = kTile / kTileRows;

// src and dst are (rows, cols), dst_t is (cols, rows); col_tiles = ceil(cols / 32), tiles the
// 32x32 tiles in all; result is (kSlots), zeroed. dst = cast_counting of src and dst_t = dst^T,
// from one read of src: a block takes tiles (grid-stride), reads a tile's rows (coalesced), casts
// and writes them to dst, stages the codes in shared memory and writes the tile's columns as rows
// of dst_t (coalesced too; the +1 column avoids bank conflicts), as transpose_bytes_kernel does.
template <typename T, typename F>
__global__ void cast_transpose_kernel(const T* __restrict__ src, int64_t rows, int64_t cols, int64_t col_tiles,
                                      int64_t tiles, float scale, uint8_t* __restrict__ dst,
                                      uint8_t* __restrict__ dst_t, unsigned long long* result) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  Partial p;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / col_tiles * kTile, c0 = t % col_tiles * kTile;
    const int64_t c = c0 + threadIdx.x;
    // Every load of the tile issued before any store, so that they are in flight together.
    float x[kRowsPerThread] = {};
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int64_t r = r0 + threadIdx.y + k * kTileRows;
      if (r < rows && c < cols) x[k] = widen(src[r * cols + c]);
    }
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int i = static_cast<int>(threadIdx.y) + k * kTileRows;
      const int64_t r = r0 + i;
      if (r < rows && c < cols) {
        const uint8_t code = cast_counting<F>(x[k], scale, p);
        dst[r * cols + c] = code;
        tile[i][threadIdx.x] = code;
      }
    }
    __syncthreads();
    const int64_t r = r0 + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int i = static_cast<int>(threadIdx.y) + k * kTileRows;
      if (r < rows && c0 + i < cols) dst_t[(c0 + i) * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // before the next tile overwrites this one
  }
  add_block_partial(p, result);
}

// One pass over src (cast to dst's format when kCast, and also transposed into dst_t when dst_t is
// given), its partials summed on the device and copied back once (counted as a host sync, as
// every device-to-host copy is).
template <bool kCast>
Float8CastCounts run_pass(const Tensor& src, float scale, Tensor* dst, Tensor* dst_t = nullptr) {
  const int64_t n = src.numel();
  if (n == 0) return {.format = dst != nullptr ? dst->dtype() : DType::kFloat8E4M3, .scale = scale};
  Tensor result = Tensor::empty({kSlots}, DType::kInt64, Device::kCUDA);
  AG_CUDA_CHECK(cudaMemsetAsync(result.data_ptr(), 0, kSlots * sizeof(int64_t), cudaStreamLegacy));
  auto* slots = static_cast<unsigned long long*>(result.data_ptr());
  uint8_t* out = dst != nullptr ? static_cast<uint8_t*>(dst->data_ptr()) : nullptr;
  const bool e4m3 = dst == nullptr || dst->dtype() == DType::kFloat8E4M3;
  visit_floating_dtype(src.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    const T* in = dptr<decltype(t)>(src.data_ptr());
    const auto launch = [&](auto format) {
      using F = decltype(format);
      if constexpr (kCast) {
        if (dst_t != nullptr) {
          const int64_t rows = src.size(0), cols = src.size(1);
          const int64_t col_tiles = (cols + kTile - 1) / kTile, tiles = (rows + kTile - 1) / kTile * col_tiles;
          // About two tiles a block (as many elements as cast_kernel's blocks take), so fewer
          // atomics; the grid-stride loop takes the rest past the cap.
          const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((tiles + 1) / 2, 1, 65536));
          cast_transpose_kernel<T, F><<<blocks, dim3(kTile, kTileRows)>>>(
              in, rows, cols, col_tiles, tiles, scale, out, static_cast<uint8_t*>(dst_t->data_ptr()), slots);
          return;
        }
      }
      // kUnroll elements a thread: fewer blocks, so fewer atomics, and still enough to fill the GPU.
      cast_kernel<T, F, kCast><<<blocks_for(n, kUnroll), kThreads>>>(in, n, scale, out, slots);
    };
    if (e4m3) {
      launch(Float8E4M3{});
    } else {
      launch(Float8E5M2{});
    }
    AG_CUDA_CHECK_LAUNCH(!kCast ? "fp8 amax" : dst_t != nullptr ? "fp8 scaled cast and transpose" : "fp8 scaled cast");
  });
  const Tensor host = result.to(Device::kCPU);
  const auto* got = static_cast<const uint64_t*>(host.data_ptr());
  return {.format = dst != nullptr ? dst->dtype() : DType::kFloat8E4M3,
          .scale = scale,
          .amax = float_of_bits(static_cast<uint32_t>(got[kAmaxBits])),
          .numel = n,
          .saturated = static_cast<int64_t>(got[kSaturated]),
          .flushed = static_cast<int64_t>(got[kFlushed])};
}

// products and out are (rows, n), bias is (n) or null. Where alpha is a normal float (in_float),
// out = fma(products, float(alpha), float(bias)) in float, else the same in double rounded once:
// fused as the CPU's loop is (std::fma), so both give the same bits.
template <typename T, typename B>
__global__ void descale_kernel(const float* products, int64_t total, int64_t n, double alpha, bool in_float,
                               const B* bias, T* out) {
  const float alpha_f = static_cast<float>(alpha);
  const int64_t grid = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += grid) {
    const double b = bias != nullptr ? static_cast<double>(dload(bias[i % n])) : 0.0;
    if constexpr (!std::is_same_v<T, double>) {
      if (in_float) {
        out[i] = dstore<T>(__fmaf_rn(products[i], alpha_f, static_cast<float>(b)));
        continue;
      }
    }
    out[i] = dconvert<T>(::fma(static_cast<double>(products[i]), alpha, b));
  }
}

}  // namespace

float amax(const Tensor& src) { return run_pass<false>(src, 1.0f, nullptr).amax; }

Float8CastCounts quantize_float8(const Tensor& src, float scale, Tensor& dst) {
  return run_pass<true>(src, scale, &dst);
}

Float8CastCounts quantize_float8_pair(const Tensor& src, float scale, Tensor& dst, Tensor& dst_t) {
  AG_CHECK(src.dim() == 2 && dst.shape() == src.shape(), "quantize_float8_pair (CUDA): src and dst must be one ",
           "(rows, cols) matrix; got ", src.to_string(), " and ", dst.to_string());
  // Any shape fits one launch: the grid is capped and strides over the tiles, indices are int64.
  const int64_t rows = src.size(0), cols = src.size(1);
  dst_t = Tensor::empty({cols, rows}, dst.dtype(), Device::kCUDA);
  return run_pass<true>(src, scale, &dst, &dst_t);
}

void descale(const Tensor& products, double alpha, const Tensor& bias, Tensor& out) {
  const int64_t n = products.size(-1), total = products.numel();
  if (total == 0) return;
  const bool in_float = alpha >= FLT_MIN && alpha <= FLT_MAX && out.dtype() != DType::kFloat64;
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    T* y = dptr<decltype(t)>(out.data_ptr());
    const auto launch = [&](const auto* b) {
      descale_kernel<<<blocks_for(total), kThreads>>>(products.data<float>(), total, n, alpha, in_float, b, y);
      AG_CUDA_CHECK_LAUNCH("fp8 descale");
    };
    if (!bias.defined()) {
      launch(static_cast<const T*>(nullptr));
    } else {
      visit_floating_dtype(bias.dtype(), [&](auto b) { launch(dptr<decltype(b)>(bias.data_ptr())); });
    }
  });
}

}  // namespace ampgrad::kernels::cuda
