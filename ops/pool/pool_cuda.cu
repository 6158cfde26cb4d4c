// Pooling on CUDA: one thread per output for the forwards; the average poolings' gradients are
// gathers (one thread per dx element over the windows covering it), and max pooling's is a warp per
// plane walking the outputs in order, so every gradient is summed in the CPU's order, no atomics.
#include <cmath>
#include <type_traits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "ops/pool/pool_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

constexpr int kWarp = 32;

// x is (planes, H, W); y and indices are (planes, Ho, Wo).
template <typename T>
__global__ void max_pool2d_kernel(const T* x, int64_t planes, int64_t height, int64_t width, ConvGeometry g, T* y,
                                  int64_t* indices) {
  using C = Compute<T>;
  const int64_t out_len = g.out_h * g.out_w, total = planes * out_len;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = k % g.out_w, oh = (k / g.out_w) % g.out_h, p = k / out_len;
    const T* in = x + p * height * width;
    const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
    C best = static_cast<C>(-INFINITY);
    int64_t index = -1;
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t h = h0 + i * g.dilation_h;
      if (h < 0 || h >= height) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t w = w0 + j * g.dilation_w;
        if (w < 0 || w >= width) continue;
        const int64_t at = h * width + w;
        const C v = dload(in[at]);
        // The first tap inside x, then the first maximum; a NaN replaces anything (PyTorch's
        // `val > maxval || isnan(val)`: the last NaN wins).
        if (index < 0 || v > best || v != v) {
          best = v;
          index = at;
        }
      }
    }
    y[k] = dstore<T>(best);
    indices[k] = index;
  }
}

// dy and indices are (planes, Ho Wo); acc is (planes, H W) in the compute type, zeroed before.
// Warp p owns plane p: it takes the outputs 32 at a time, in order; the lanes pointing at the same
// element are grouped and the lowest adds their values in lane order, so every element sums its
// gradients in output order, as the CPU, and no two lanes write one element at once.
template <typename T>
__global__ void max_pool2d_backward_kernel(const T* dy, const int64_t* indices, int64_t planes, int64_t out_len,
                                           int64_t plane, Compute<T>* acc) {
  using C = Compute<T>;
  __shared__ C values[kThreads];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  C* const warp_values = values + (threadIdx.x - lane);
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / kWarp);
  // p is the same on every lane of a warp, so the whole warp stays converged for the match below.
  for (int64_t p = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kWarp; p < planes; p += warps) {
    C* const dst = acc + p * plane;
    for (int64_t base = 0; base < out_len; base += kWarp) {
      const int64_t o = base + lane;
      int64_t index = -1;  // none: a lane past the end (or an index outside the plane)
      if (o < out_len) {
        index = indices[p * out_len + o];
        if (index >= plane) index = -1;
        warp_values[lane] = dload(dy[p * out_len + o]);
      }
      const unsigned same = __match_any_sync(0xffffffffu, static_cast<unsigned long long>(index));
      __syncwarp();
      if (index >= 0 && lane == __ffs(same) - 1) {
        C sum = dst[index];
        for (unsigned m = same; m != 0; m &= m - 1) sum += warp_values[__ffs(m) - 1];
        dst[index] = sum;
      }
      __syncwarp();  // the sums are visible to the next turn's lanes, and values may be overwritten
    }
  }
}

// acc and dx are (count): dx = acc, rounded once.
template <typename T>
__global__ void round_kernel(const Compute<T>* acc, int64_t count, T* dx) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < count; k += int64_t{gridDim.x} * blockDim.x) {
    dx[k] = dstore<T>(acc[k]);
  }
}

// Output (oh, ow)'s window of avg_pool2d, clipped to the input, and its divisor.
struct AvgWindow {
  int64_t h0, h1, w0, w1;  // rows [h0, h1), columns [w0, w1)
  int64_t divisor;
};

__device__ __forceinline__ AvgWindow avg_window(int64_t oh, int64_t ow, int64_t height, int64_t width,
                                                const ConvGeometry& g, const AvgPoolDivisor& d) {
  AvgWindow win;
  win.h0 = oh * g.stride_h - g.pad_h;
  win.w0 = ow * g.stride_w - g.pad_w;
  win.h1 = min(win.h0 + g.kh, height + g.pad_h);
  win.w1 = min(win.w0 + g.kw, width + g.pad_w);
  const int64_t padded = (win.h1 - win.h0) * (win.w1 - win.w0);
  win.h0 = max(win.h0, int64_t{0});
  win.w0 = max(win.w0, int64_t{0});
  win.h1 = min(win.h1, height);
  win.w1 = min(win.w1, width);
  win.divisor = d.divisor_override > 0   ? d.divisor_override
                : d.count_include_pad ? padded
                                      : (win.h1 - win.h0) * (win.w1 - win.w0);
  return win;
}

// x is (planes, H, W); y is (planes, Ho, Wo).
template <typename T>
__global__ void avg_pool2d_kernel(const T* x, int64_t planes, int64_t height, int64_t width, ConvGeometry g,
                                  AvgPoolDivisor d, T* y) {
  using C = Compute<T>;
  const int64_t out_len = g.out_h * g.out_w, total = planes * out_len;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = k % g.out_w, oh = (k / g.out_w) % g.out_h, p = k / out_len;
    const T* in = x + p * height * width;
    const AvgWindow win = avg_window(oh, ow, height, width, g, d);  // never empty, by the op's checks
    C sum = C(0);
    for (int64_t h = win.h0; h < win.h1; ++h) {
      for (int64_t w = win.w0; w < win.w1; ++w) sum += dload(in[h * width + w]);
    }
    y[k] = dstore<T>(static_cast<C>(static_cast<double>(sum) / static_cast<double>(win.divisor)));  // as the CPU
  }
}

// dy is (planes, Ho, Wo); dx is (planes, H, W): each element sums dy / divisor over the windows
// that cover it, outputs in order. Window oh covers row h when oh sh - ph <= h < oh sh - ph + kh.
template <typename T>
__global__ void avg_pool2d_backward_kernel(const T* dy, int64_t planes, int64_t height, int64_t width, ConvGeometry g,
                                           AvgPoolDivisor d, T* dx) {
  using C = Compute<T>;
  const int64_t plane = height * width, total = planes * plane;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t w = k % width, h = (k / width) % height, p = k / plane;
    const T* grad = dy + p * g.out_h * g.out_w;
    const int64_t oh_begin = h + g.pad_h < g.kh ? 0 : (h + g.pad_h - g.kh) / g.stride_h + 1;
    const int64_t oh_end = min((h + g.pad_h) / g.stride_h + 1, g.out_h);
    const int64_t ow_begin = w + g.pad_w < g.kw ? 0 : (w + g.pad_w - g.kw) / g.stride_w + 1;
    const int64_t ow_end = min((w + g.pad_w) / g.stride_w + 1, g.out_w);
    C sum = C(0);
    for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
      for (int64_t ow = ow_begin; ow < ow_end; ++ow) {
        const AvgWindow win = avg_window(oh, ow, height, width, g, d);
        sum += static_cast<C>(static_cast<double>(dload(grad[oh * g.out_w + ow])) / static_cast<double>(win.divisor));
      }
    }
    dx[k] = dstore<T>(sum);
  }
}

// Adaptive window i of n over size: [floor(i size / n), ceil((i + 1) size / n)).
__device__ __forceinline__ int64_t adaptive_begin(int64_t i, int64_t size, int64_t n) { return i * size / n; }
__device__ __forceinline__ int64_t adaptive_end(int64_t i, int64_t size, int64_t n) {
  return ((i + 1) * size + n - 1) / n;
}

// x is (planes, H, W); y is (planes, Ho, Wo).
template <typename T>
__global__ void adaptive_avg_pool2d_kernel(const T* x, int64_t planes, int64_t height, int64_t width, int64_t out_h,
                                           int64_t out_w, T* y) {
  using C = Compute<T>;
  const int64_t out_len = out_h * out_w, total = planes * out_len;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = k % out_w, oh = (k / out_w) % out_h, p = k / out_len;
    const T* in = x + p * height * width;
    const int64_t h0 = adaptive_begin(oh, height, out_h), h1 = adaptive_end(oh, height, out_h);
    const int64_t w0 = adaptive_begin(ow, width, out_w), w1 = adaptive_end(ow, width, out_w);
    C sum = C(0);
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t w = w0; w < w1; ++w) sum += dload(in[h * width + w]);
    }
    y[k] = dstore<T>(sum / static_cast<C>((h1 - h0) * (w1 - w0)));
  }
}

// dy is (planes, Ho, Wo); dx is (planes, H, W): each element sums dy / window size over the windows
// that cover it, outputs in order. Window i covers row h exactly when
// floor(h Ho / H) <= i < ceil((h + 1) Ho / H) (the adaptive bounds with the sizes swapped).
template <typename T>
__global__ void adaptive_avg_pool2d_backward_kernel(const T* dy, int64_t planes, int64_t height, int64_t width,
                                                    int64_t out_h, int64_t out_w, T* dx) {
  using C = Compute<T>;
  const int64_t plane = height * width, total = planes * plane;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t w = k % width, h = (k / width) % height, p = k / plane;
    const T* grad = dy + p * out_h * out_w;
    const int64_t oh_begin = adaptive_begin(h, out_h, height), oh_end = adaptive_end(h, out_h, height);
    const int64_t ow_begin = adaptive_begin(w, out_w, width), ow_end = adaptive_end(w, out_w, width);
    C sum = C(0);
    for (int64_t oh = oh_begin; oh < oh_end; ++oh) {
      const int64_t rows = adaptive_end(oh, height, out_h) - adaptive_begin(oh, height, out_h);
      for (int64_t ow = ow_begin; ow < ow_end; ++ow) {
        const int64_t cols = adaptive_end(ow, width, out_w) - adaptive_begin(ow, width, out_w);
        sum += dload(grad[oh * out_w + ow]) / static_cast<C>(rows * cols);
      }
    }
    dx[k] = dstore<T>(sum);
  }
}

}  // namespace

void max_pool2d(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& indices) {
  const int64_t total = y.numel(), height = x.size(-2), width = x.size(-1);
  if (total == 0 || x.numel() == 0) return;
  const int64_t planes = x.numel() / (height * width);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    max_pool2d_kernel<T><<<blocks_for(total), kThreads>>>(static_cast<const T*>(x.data_ptr()), planes, height, width,
                                                           g, static_cast<T*>(y.data_ptr()),
                                                           static_cast<int64_t*>(indices.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("max_pool2d_kernel");
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx) {
  const int64_t count = dx.numel(), plane = dx.size(-2) * dx.size(-1);
  if (count == 0) return;
  const int64_t planes = count / plane, out_len = dy.numel() / planes;
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using C = Compute<T>;
    constexpr bool kDirect = std::is_same_v<T, C>;  // float and double sum in dx itself
    Allocator& alloc = caching_allocator();
    const size_t nbytes = sizeof(C) * static_cast<size_t>(count);
    C* acc = kDirect ? static_cast<C*>(dx.data_ptr()) : static_cast<C*>(alloc.allocate(nbytes));
    AG_CUDA_CHECK(cudaMemsetAsync(acc, 0, nbytes, cudaStreamLegacy));
    if (out_len > 0) {
      max_pool2d_backward_kernel<T><<<blocks_for(planes * kWarp), kThreads>>>(
          static_cast<const T*>(dy.data_ptr()), static_cast<const int64_t*>(indices.data_ptr()), planes, out_len, plane,
          acc);
      AG_CUDA_CHECK_LAUNCH("max_pool2d_backward_kernel");
    }
    if constexpr (!kDirect) {
      round_kernel<T><<<blocks_for(count), kThreads>>>(acc, count, static_cast<T*>(dx.data_ptr()));
      AG_CUDA_CHECK_LAUNCH("round_kernel");
      alloc.deallocate(acc, nbytes);  // stream-ordered: a later user of the block runs after us
    }
  });
}

void avg_pool2d(const Tensor& x, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& y) {
  const int64_t total = y.numel(), height = x.size(-2), width = x.size(-1);
  if (total == 0 || x.numel() == 0) return;
  const int64_t planes = x.numel() / (height * width);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    avg_pool2d_kernel<T><<<blocks_for(total), kThreads>>>(static_cast<const T*>(x.data_ptr()), planes, height, width,
                                                           g, divisor, static_cast<T*>(y.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("avg_pool2d_kernel");
  });
}

void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& dx) {
  const int64_t total = dx.numel(), height = dx.size(-2), width = dx.size(-1);
  if (total == 0) return;
  const int64_t planes = total / (height * width);
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    avg_pool2d_backward_kernel<T><<<blocks_for(total), kThreads>>>(static_cast<const T*>(dy.data_ptr()), planes,
                                                                    height, width, g, divisor,
                                                                    static_cast<T*>(dx.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("avg_pool2d_backward_kernel");
  });
}

void adaptive_avg_pool2d(const Tensor& x, Tensor& y) {
  const int64_t total = y.numel(), height = x.size(-2), width = x.size(-1);
  if (total == 0 || x.numel() == 0) return;
  const int64_t planes = x.numel() / (height * width), out_h = y.size(-2), out_w = y.size(-1);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    adaptive_avg_pool2d_kernel<T><<<blocks_for(total), kThreads>>>(static_cast<const T*>(x.data_ptr()), planes,
                                                                    height, width, out_h, out_w,
                                                                    static_cast<T*>(y.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("adaptive_avg_pool2d_kernel");
  });
}

void adaptive_avg_pool2d_backward(const Tensor& dy, Tensor& dx) {
  const int64_t total = dx.numel(), height = dx.size(-2), width = dx.size(-1);
  if (total == 0) return;
  const int64_t planes = total / (height * width), out_h = dy.size(-2), out_w = dy.size(-1);
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    adaptive_avg_pool2d_backward_kernel<T><<<blocks_for(total), kThreads>>>(static_cast<const T*>(dy.data_ptr()),
                                                                             planes, height, width, out_h, out_w,
                                                                             static_cast<T*>(dx.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("adaptive_avg_pool2d_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
