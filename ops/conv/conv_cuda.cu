// Convolution moves on CUDA: im2col and the transposes between [O, n, L] and [N, O, L] are one
// thread per output element (kUnroll loads in flight); col2im is a gather (one thread per dx
// element summing the taps that read it, in the compute type), so it needs no atomics and is
// deterministic. Their index math is conv_index.h's, tested on the host.
#include <cub/block/block_reduce.cuh>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/conv/conv_index.h"
#include "ops/conv/conv_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// Calls launch(Map<FastDivmod>(args...)) when the values the map divides fit in 32 bits, else
// launch(Map<WideDivmod>(args...)): the maps of conv_index.h, one kernel body for both.
template <template <typename> class Map, typename Launch, typename... Args>
void with_index_map(bool fits_32_bits, Launch&& launch, const Args&... args) {
  if (fits_32_bits && !wide_index_maps_for_testing.load(std::memory_order_relaxed)) {
    launch(Map<FastDivmod>(args...));
  } else {
    launch(Map<WideDivmod>(args...));
  }
}

// cols is (C kh kw, n, Ho Wo), its `total` entries read from x (N, C, H, W) through the map.
template <typename T, typename Map>
__global__ void im2col_kernel(const T* x, Map map, int64_t total, T* cols) {
  using Index = typename Map::Index;
  unrolled_loop<T>(
      total,
      [&](int64_t k) {
        const int64_t at = map.source(static_cast<Index>(k));
        return at >= 0 ? x[at] : dstore<T>(Compute<T>(0));
      },
      [&](int64_t k, T v) { cols[k] = v; });
}

// dx (N, C, H, W): its `total` elements from sample n0 on each overwritten with the sum, in the
// compute type, of the cols (C kh kw, n, Ho Wo) entries im2col read from it.
template <typename T, typename Map>
__global__ void col2im_kernel(const T* cols, Map map, int64_t total, T* dx) {
  using Index = typename Map::Index;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    Compute<T> acc = Compute<T>(0);
    map.for_each_source(static_cast<Index>(k), [&](int64_t at) { acc += dload(cols[at]); });
    dx[k] = dstore<T>(acc);
  }
}

// out (n, O, L), from ct (O, n, L) through the map, plus b (O) or nothing where b is null.
template <typename T, typename Map>
__global__ void samples_from_channels_kernel(const T* ct, const T* b, Map map, int64_t total, T* out) {
  using Index = typename Map::Index;
  unrolled_loop<T>(
      total,
      [&](int64_t k) {
        int64_t o = 0;
        const T v = ct[map.source(static_cast<Index>(k), o)];
        return b != nullptr ? dstore<T>(dload(v) + dload(b[o])) : v;
      },
      [&](int64_t k, T v) { out[k] = v; });
}

// ct (O, n, L), from y (N, O, L) through the map.
template <typename T, typename Map>
__global__ void channels_from_samples_kernel(const T* y, Map map, int64_t total, T* ct) {
  using Index = typename Map::Index;
  unrolled_loop<T>(
      total, [&](int64_t k) { return y[map.source(static_cast<Index>(k))]; }, [&](int64_t k, T v) { ct[k] = v; });
}

// x is (N, C, H, W), w (C, 1, kh, kw), b (C) or null, y (N, C, Ho, Wo): one thread per output.
template <typename T>
__global__ void depthwise_kernel(const T* x, const T* w, const T* b, int64_t batch, int64_t channels, int64_t height,
                                 int64_t width, ConvGeometry g, T* y) {
  using C = Compute<T>;
  const int64_t out_len = g.out_h * g.out_w, total = batch * channels * out_len;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = k % g.out_w, oh = (k / g.out_w) % g.out_h, plane = k / out_len, c = plane % channels;
    C acc = b != nullptr ? dload(b[c]) : C(0);
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t h = oh * g.stride_h - g.pad_h + i * g.dilation_h;
      if (h < 0 || h >= height) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t xw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
        if (xw < 0 || xw >= width) continue;
        acc += dload(w[(c * g.kh + i) * g.kw + j]) * dload(x[(plane * height + h) * width + xw]);
      }
    }
    y[k] = dstore<T>(acc);
  }
}

// dy is (N, C, Ho, Wo); dx (N, C, H, W): one thread per dx element, gathering dy w over the taps
// whose window reads it, in the compute type.
template <typename T>
__global__ void depthwise_dx_kernel(const T* w, const T* dy, int64_t batch, int64_t channels, int64_t height,
                                    int64_t width, ConvGeometry g, T* dx) {
  using C = Compute<T>;
  const int64_t plane_len = height * width, total = batch * channels * plane_len;
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t xw = k % width, y = (k / width) % height, plane = k / plane_len, c = plane % channels;
    C acc = C(0);
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t th = y + g.pad_h - i * g.dilation_h;
      if (th < 0 || th % g.stride_h != 0 || th / g.stride_h >= g.out_h) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t tw = xw + g.pad_w - j * g.dilation_w;
        if (tw < 0 || tw % g.stride_w != 0 || tw / g.stride_w >= g.out_w) continue;
        acc += dload(w[(c * g.kh + i) * g.kw + j]) *
               dload(dy[(plane * g.out_h + th / g.stride_h) * g.out_w + tw / g.stride_w]);
      }
    }
    dx[k] = dstore<T>(acc);
  }
}

// x (N, C, H, W), dy (N, C, Ho, Wo), dw (C, 1, kh, kw): block (c, i, j) sums dy x at that tap over
// every sample and output, in double.
template <typename T>
__global__ void depthwise_dw_kernel(const T* x, const T* dy, int64_t batch, int64_t channels, int64_t height,
                                    int64_t width, ConvGeometry g, T* dw) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int64_t taps = g.kh * g.kw, c = blockIdx.x / taps, i = (blockIdx.x % taps) / g.kw, j = blockIdx.x % g.kw;
  const int64_t out_len = g.out_h * g.out_w, count = batch * out_len;
  double sum = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t n = e / out_len, l = e % out_len, oh = l / g.out_w, ow = l % g.out_w;
    const int64_t h = oh * g.stride_h - g.pad_h + i * g.dilation_h, xw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
    if (h < 0 || h >= height || xw < 0 || xw >= width) continue;
    const int64_t plane = n * channels + c;
    sum += static_cast<double>(dload(dy[plane * out_len + l])) *
           static_cast<double>(dload(x[(plane * height + h) * width + xw]));
  }
  const double total = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) dw[blockIdx.x] = dconvert<T>(total);  // double to T, rounded once as the CPU
}

}  // namespace

void im2col(const Tensor& x, int64_t n0, const ConvGeometry& g, Tensor& cols) {
  const int64_t total = cols.numel();
  if (total == 0) return;
  const int64_t n = cols.size(1), channels = x.size(-3), height = x.size(-2), width = x.size(-1);
  visit_dtype(cols.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    with_index_map<Im2colIndex>(
        fits_fast_divmod(total),
        [&](const auto& map) {
          im2col_kernel<<<blocks_for(total, kUnroll), kThreads>>>(static_cast<const T*>(x.data_ptr()), map, total,
                                                                   static_cast<T*>(cols.data_ptr()));
        },
        n0, n, channels, height, width, g);
    AG_CUDA_CHECK_LAUNCH("im2col_kernel");
  });
}

void col2im(const Tensor& cols, const ConvGeometry& g, int64_t n0, Tensor& dx) {
  const int64_t n = cols.size(1), channels = dx.size(-3), height = dx.size(-2), width = dx.size(-1);
  const int64_t total = n * channels * height * width;
  if (total == 0) return;
  // The map divides the element index, and each row and column plus its padding, by the strides.
  const bool fits = fits_fast_divmod(total) && fits_fast_divmod(height + g.pad_h) &&
                    fits_fast_divmod(width + g.pad_w) && fits_fast_divmod(g.stride_h) && fits_fast_divmod(g.stride_w);
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    T* const out = static_cast<T*>(dx.data_ptr()) + n0 * channels * height * width;
    with_index_map<Col2imIndex>(
        fits,
        [&](const auto& map) {
          col2im_kernel<<<blocks_for(total), kThreads>>>(static_cast<const T*>(cols.data_ptr()), map, total, out);
        },
        n, channels, height, width, g);
    AG_CUDA_CHECK_LAUNCH("col2im_kernel");
  });
}

void samples_from_channels(const Tensor& ct, const Tensor& b, int64_t n0, Tensor& out) {
  const int64_t total = ct.numel();
  if (total == 0) return;
  const int64_t channels = ct.size(0), n = ct.size(1), len = ct.size(2);
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    const T* const bias = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    T* const chunk = static_cast<T*>(out.data_ptr()) + n0 * channels * len;
    with_index_map<SamplesFromChannelsIndex>(
        fits_fast_divmod(total),
        [&](const auto& map) {
          samples_from_channels_kernel<<<blocks_for(total, kUnroll), kThreads>>>(static_cast<const T*>(ct.data_ptr()),
                                                                                  bias, map, total, chunk);
        },
        n, channels, len);
    AG_CUDA_CHECK_LAUNCH("samples_from_channels_kernel");
  });
}

void channels_from_samples(const Tensor& y, int64_t n0, Tensor& ct) {
  const int64_t total = ct.numel();
  if (total == 0) return;
  const int64_t channels = ct.size(0), n = ct.size(1), len = ct.size(2);
  visit_dtype(ct.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    with_index_map<ChannelsFromSamplesIndex>(
        fits_fast_divmod(total),
        [&](const auto& map) {
          channels_from_samples_kernel<<<blocks_for(total, kUnroll), kThreads>>>(static_cast<const T*>(y.data_ptr()),
                                                                                  map, total,
                                                                                  static_cast<T*>(ct.data_ptr()));
        },
        n0, n, channels, len);
    AG_CUDA_CHECK_LAUNCH("channels_from_samples_kernel");
  });
}

void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  const int64_t total = y.numel();
  if (total == 0) return;
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    depthwise_kernel<T><<<blocks_for(total), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()),
        b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr, x.size(0), x.size(1), x.size(2), x.size(3), g,
        static_cast<T*>(y.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("depthwise_kernel");
  });
}

void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g, Tensor& dx,
                               Tensor& dw) {
  visit_floating_dtype(dy.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    if (dx.defined() && dx.numel() > 0) {
      depthwise_dx_kernel<T><<<blocks_for(dx.numel()), kThreads>>>(
          static_cast<const T*>(w.data_ptr()), static_cast<const T*>(dy.data_ptr()), x.size(0), x.size(1), x.size(2),
          x.size(3), g, static_cast<T*>(dx.data_ptr()));
      AG_CUDA_CHECK_LAUNCH("depthwise_dx_kernel");
    }
    if (dw.defined() && dw.numel() > 0) {
      depthwise_dw_kernel<T><<<static_cast<unsigned>(dw.numel()), kThreads>>>(
          static_cast<const T*>(x.data_ptr()), static_cast<const T*>(dy.data_ptr()), x.size(0), x.size(1), x.size(2),
          x.size(3), g, static_cast<T*>(dw.data_ptr()));
      AG_CUDA_CHECK_LAUNCH("depthwise_dw_kernel");
    }
  });
}

}  // namespace ampgrad::kernels::cuda
