// Convolution moves on the CPU: im2col / col2im one (row, sample) or (sample, channel) plane per
// task, and the channel-major <-> sample-major transposes one L-long run at a time.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "framework/parallel.h"
#include "ops/conv/conv_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

int64_t grain_for(int64_t work_per_item) { return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work_per_item, 1)); }

// Each tap row i's and tap column j's valid output ranges, computed once per call: the planes of
// a small layer (14 x 14) are short, and two divisions per plane and tap were a tenth of col2im.
struct TapRanges {
  std::vector<ValidRange> rows, cols;
  TapRanges(const ConvGeometry& g, int64_t height, int64_t width) {
    for (int64_t i = 0; i < g.kh; ++i) rows.push_back(valid_range(g.out_h, g.stride_h, g.pad_h, i * g.dilation_h, height));
    for (int64_t j = 0; j < g.kw; ++j) cols.push_back(valid_range(g.out_w, g.stride_w, g.pad_w, j * g.dilation_w, width));
  }
};

}  // namespace

void im2col(const Tensor& x, int64_t n0, const ConvGeometry& g, Tensor& cols) {
  const int64_t channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t n = cols.size(1), out_l = g.out_h * g.out_w, taps = g.kh * g.kw;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* src = x.data<T>();
    T* dst = cols.data<T>();
    const TapRanges ranges(g, height, width);
    // One task per (row (c, i, j), sample): a row of the output plane at a time, copied in
    // one run where stride 1 makes it contiguous.
    parallel_range(channels * taps * n, grain_for(out_l), [&](int64_t lo, int64_t hi) {
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t row = item / n, s = item % n;
        const int64_t c = row / taps, i = (row % taps) / g.kw, j = row % g.kw;
        const T* plane = src + ((n0 + s) * channels + c) * height * width;
        T* out = dst + (row * n + s) * out_l;
        const ValidRange rows = ranges.rows[static_cast<size_t>(i)], cols_in = ranges.cols[static_cast<size_t>(j)];
        std::fill(out, out + rows.lo * g.out_w, T{});
        for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
          T* line = out + oh * g.out_w;
          const T* in = plane + (oh * g.stride_h - g.pad_h + i * g.dilation_h) * width - g.pad_w + j * g.dilation_w;
          std::fill(line, line + cols_in.lo, T{});
          if (g.stride_w == 1) {
            for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) line[ow] = in[ow];
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
    const TapRanges ranges(g, height, width);
    // One task per (sample, channel) plane: only its own taps write there, so no two tasks meet.
    parallel_range(n * channels, grain_for(taps * out_l), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(height * width));
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t s = item / channels, c = item % channels;
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t i = 0; i < g.kh; ++i) {
          const ValidRange rows = ranges.rows[static_cast<size_t>(i)];
          for (int64_t j = 0; j < g.kw; ++j) {
            const ValidRange cols_in = ranges.cols[static_cast<size_t>(j)];
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

// A plane in the compute type: itself for float and double, else widened into `buffer` (one
// vectorised pass, so the tap loops below multiply floats, not 16-bit values one by one).
template <typename T, typename C = ComputeType<T>>
const C* plane_in_compute_type(const T* plane, int64_t n, std::vector<C>& buffer) {
  if constexpr (std::is_same_v<T, C>) {
    return plane;
  } else {
    buffer.resize(static_cast<size_t>(n));
    widen(plane, buffer.data(), static_cast<size_t>(n));
    return buffer.data();
  }
}

void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  const int64_t channels = x.size(1), height = x.size(2), width = x.size(3), out_l = g.out_h * g.out_w;
  const TapRanges ranges(g, height, width);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = x.data<T>();
    const T* filt = w.data<T>();
    const T* bias = b.defined() ? b.data<T>() : nullptr;
    T* dst = y.data<T>();
    // One (sample, channel) plane per task; tap by tap across each output row (a vector loop at
    // stride 1), in the compute type, rounded once.
    parallel_range(y.size(0) * channels, grain_for(out_l * g.kh * g.kw), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(out_l)), widened;
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t c = item % channels;
        const C* plane = plane_in_compute_type(src + item * height * width, height * width, widened);
        std::fill(acc.begin(), acc.end(), bias == nullptr ? C(0) : load(bias[c]));
        for (int64_t i = 0; i < g.kh; ++i) {
          const ValidRange rows = ranges.rows[static_cast<size_t>(i)];
          for (int64_t j = 0; j < g.kw; ++j) {
            const ValidRange cols_in = ranges.cols[static_cast<size_t>(j)];
            const C tap = load(filt[(c * g.kh + i) * g.kw + j]);
            for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
              const C* in = plane + (oh * g.stride_h - g.pad_h + i * g.dilation_h) * width - g.pad_w + j * g.dilation_w;
              C* out = acc.data() + oh * g.out_w;
              if (g.stride_w == 1) {
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) out[ow] += tap * in[ow];
              } else {
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) out[ow] += tap * in[ow * g.stride_w];
              }
            }
          }
        }
        T* line = dst + item * out_l;
        for (int64_t k = 0; k < out_l; ++k) line[k] = store<T>(acc[static_cast<size_t>(k)]);
      }
    });
  });
}

void depthwise_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g, Tensor& dx,
                               Tensor& dw) {
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t out_l = g.out_h * g.out_w, taps = g.kh * g.kw;
  const TapRanges ranges(g, height, width);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = x.data<T>();
    const T* filt = w.data<T>();
    const T* grad = dy.data<T>();
    // The tap loops of the forward, with the roles of input and output swapped.
    const auto for_each_tap = [&](int64_t c, auto&& fn) {
      for (int64_t i = 0; i < g.kh; ++i) {
        const ValidRange rows = ranges.rows[static_cast<size_t>(i)];
        for (int64_t j = 0; j < g.kw; ++j) {
          const ValidRange cols_in = ranges.cols[static_cast<size_t>(j)];
          for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
            const int64_t in_row = (oh * g.stride_h - g.pad_h + i * g.dilation_h) * width - g.pad_w + j * g.dilation_w;
            fn(c * taps + i * g.kw + j, in_row, oh * g.out_w, cols_in);
          }
        }
      }
    };
    if (dx.defined()) {
      T* out = dx.data<T>();
      parallel_range(batch * channels, grain_for(out_l * taps), [&](int64_t lo, int64_t hi) {
        std::vector<C> acc(static_cast<size_t>(height * width)), widened;
        for (int64_t item = lo; item < hi; ++item) {
          const int64_t c = item % channels;
          const C* d = plane_in_compute_type(grad + item * out_l, out_l, widened);
          std::fill(acc.begin(), acc.end(), C(0));
          for_each_tap(c, [&](int64_t tap_at, int64_t in_row, int64_t out_row, ValidRange cols_in) {
            const C tap = load(filt[tap_at]);
            C* line = acc.data() + in_row;
            const C* dline = d + out_row;
            if (g.stride_w == 1) {
              for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) line[ow] += tap * dline[ow];
            } else {
              for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) line[ow * g.stride_w] += tap * dline[ow];
            }
          });
          T* plane = out + item * height * width;
          for (int64_t k = 0; k < height * width; ++k) plane[k] = store<T>(acc[static_cast<size_t>(k)]);
        }
      });
    }
    if (dw.defined()) {
      T* out = dw.data<T>();
      // One channel per task: its taps' sums over every sample and output. Per sample, each output
      // column's products are summed over the rows in the compute type, elementwise (a vector
      // loop: a row's own sum would be a float reduction, which the compiler leaves scalar), and
      // the columns' sums are added to the tap's double total.
      parallel_range(channels, 1, [&](int64_t lo, int64_t hi) {
        std::vector<double> acc(static_cast<size_t>(taps));
        std::vector<C> columns(static_cast<size_t>(taps * g.out_w));
        std::vector<C> widened_x, widened_dy;
        for (int64_t c = lo; c < hi; ++c) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t n = 0; n < batch; ++n) {
            const C* plane = plane_in_compute_type(src + (n * channels + c) * height * width, height * width, widened_x);
            const C* d = plane_in_compute_type(grad + (n * channels + c) * out_l, out_l, widened_dy);
            std::fill(columns.begin(), columns.end(), C(0));
            for_each_tap(c, [&](int64_t tap_at, int64_t in_row, int64_t out_row, ValidRange cols_in) {
              C* __restrict column = columns.data() + (tap_at - c * taps) * g.out_w;
              const C* dline = d + out_row;
              const C* xline = plane + in_row;
              if (g.stride_w == 1) {
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) column[ow] += dline[ow] * xline[ow];
              } else {
                for (int64_t ow = cols_in.lo; ow < cols_in.hi; ++ow) column[ow] += dline[ow] * xline[ow * g.stride_w];
              }
            });
            for (int64_t k = 0; k < taps; ++k) {
              double sum = 0;
              for (int64_t ow = 0; ow < g.out_w; ++ow) sum += static_cast<double>(columns[static_cast<size_t>(k * g.out_w + ow)]);
              acc[static_cast<size_t>(k)] += sum;
            }
          }
          for (int64_t k = 0; k < taps; ++k) out[c * taps + k] = convert<T>(acc[static_cast<size_t>(k)]);
        }
      });
    }
  });
}

}  // namespace ampgrad::kernels::cpu
