// Convolution moves on the CPU: im2col / col2im one (row, sample) or (sample, channel) plane per
// task, and the channel-major <-> sample-major transposes one L-long run at a time.
#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/parallel.h"
#include "ops/conv/conv_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

int64_t grain_for(int64_t work_per_item) { return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work_per_item, 1)); }

}  // namespace

void im2col(const Tensor& x, int64_t n0, const ConvGeometry& g, Tensor& cols) {
  const int64_t channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t n = cols.size(1), out_l = g.out_h * g.out_w, taps = g.kh * g.kw;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* src = x.data<T>();
    T* dst = cols.data<T>();
    // One task per (row (c, i, j), sample): a row of the output plane at a time, copied in
    // one run where stride 1 makes it contiguous.
    parallel_range(channels * taps * n, grain_for(out_l), [&](int64_t lo, int64_t hi) {
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t row = item / n, s = item % n;
        const int64_t c = row / taps, i = (row % taps) / g.kw, j = row % g.kw;
        const T* plane = src + ((n0 + s) * channels + c) * height * width;
        T* out = dst + (row * n + s) * out_l;
        const ValidRange rows = valid_range(g.out_h, g.stride_h, g.pad_h, i * g.dilation_h, height);
        const ValidRange cols_in = valid_range(g.out_w, g.stride_w, g.pad_w, j * g.dilation_w, width);
        std::fill(out, out + rows.lo * g.out_w, T{});
        for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
          T* line = out + oh * g.out_w;
          const T* in = plane + (oh * g.stride_h - g.pad_h + i * g.dilation_h) * width - g.pad_w + j * g.dilation_w;
          std::fill(line, line + cols_in.lo, T{});
          if (g.stride_w == 1) {
            std::memcpy(line + cols_in.lo, in + cols_in.lo, static_cast<size_t>(cols_in.hi - cols_in.lo) * sizeof(T));
          } else {
            for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) line[ow] = in[ow * g.stride_w];
          }
          std::fill(line + cols_in.hi, line + g.out_w, T{});
        }
        std::fill(out + rows.hi * g.out_w, out + out_l, T{});
      }
    });
  });
}

void col2im(const Tensor& cols, const ConvGeometry& g, int64_t n0, Tensor& dx) {
  const int64_t channels = dx.size(1), height = dx.size(2), width = dx.size(3);
  const int64_t n = cols.size(1), out_l = g.out_h * g.out_w, taps = g.kh * g.kw;
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = cols.data<T>();
    T* dst = dx.data<T>();
    // One task per (sample, channel) plane: only its own taps write there, so no two tasks meet.
    parallel_range(n * channels, grain_for(taps * out_l), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(height * width));
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t s = item / channels, c = item % channels;
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t i = 0; i < g.kh; ++i) {
          const ValidRange rows = valid_range(g.out_h, g.stride_h, g.pad_h, i * g.dilation_h, height);
          for (int64_t j = 0; j < g.kw; ++j) {
            const ValidRange cols_in = valid_range(g.out_w, g.stride_w, g.pad_w, j * g.dilation_w, width);
            const T* in = src + ((c * taps + i * g.kw + j) * n + s) * out_l;
            for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
              C* line = acc.data() + (oh * g.stride_h - g.pad_h + i * g.dilation_h) * width - g.pad_w + j * g.dilation_w;
              const T* col = in + oh * g.out_w;
              if (g.stride_w == 1) {  // contiguous both sides: a loop the compiler vectorises
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) line[ow] += load(col[ow]);
              } else {
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) line[ow * g.stride_w] += load(col[ow]);
              }
            }
          }
        }
        T* out = dst + ((n0 + s) * channels + c) * height * width;
        for (int64_t k = 0; k < height * width; ++k) out[k] = store<T>(acc[static_cast<size_t>(k)]);
      }
    });
  });
}

void samples_from_channels(const Tensor& ct, const Tensor& b, int64_t n0, Tensor& out) {
  const int64_t channels = ct.size(0), n = ct.size(1), len = ct.size(2);
  visit_floating_dtype(out.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* src = ct.data<T>();
    const T* bias = b.defined() ? b.data<T>() : nullptr;
    T* dst = out.data<T>();
    parallel_range(n * channels, grain_for(len), [&](int64_t lo, int64_t hi) {
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t s = item / channels, o = item % channels;
        const T* in = src + (o * n + s) * len;
        T* line = dst + ((n0 + s) * channels + o) * len;
        if (bias == nullptr) {
          std::memcpy(line, in, static_cast<size_t>(len) * sizeof(T));
        } else {
          const ComputeType<T> add = load(bias[o]);
          for (int64_t l = 0; l < len; ++l) line[l] = store<T>(load(in[l]) + add);
        }
      }
    });
  });
}

void channels_from_samples(const Tensor& y, int64_t n0, Tensor& ct) {
  const int64_t channels = ct.size(0), n = ct.size(1), len = ct.size(2);
  const size_t elem = element_size(ct.dtype());
  const char* src = static_cast<const char*>(y.data_ptr());
  char* dst = static_cast<char*>(ct.data_ptr());
  parallel_range(n * channels, grain_for(len), [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t o = item / n, s = item % n;
      std::memcpy(dst + static_cast<size_t>(item * len) * elem,
                  src + static_cast<size_t>(((n0 + s) * channels + o) * len) * elem, static_cast<size_t>(len) * elem);
    }
  });
}

}  // namespace ampgrad::kernels::cpu
