// Pooling on the CPU: one plane per task (a plane's gradient is written by its own task only), in
// the compute type, rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "framework/parallel.h"
#include "ops/pool/pool_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

int64_t planes_of(const Tensor& t) { return t.numel() / (t.size(-2) * t.size(-1)); }
int64_t grain_for(int64_t work) { return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work, 1)); }

// avg_pool2d's window along one axis: [start, end) clipped to the input, and its span in the
// padded input (what count_include_pad divides by).
struct Span {
  int64_t start, end, padded;
};
Span avg_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t size) {
  const int64_t start = o * stride - pad, end = std::min(start + k, size + pad);
  return {std::max<int64_t>(start, 0), std::min(end, size), end - start};
}

double avg_divisor(const Span& h, const Span& w, AvgPoolDivisor d) {
  if (d.divisor_override > 0) return static_cast<double>(d.divisor_override);
  return d.count_include_pad ? static_cast<double>(h.padded * w.padded)
                             : static_cast<double>((h.end - h.start) * (w.end - w.start));
}

// adaptive window [floor(i in / out), ceil((i + 1) in / out))
int64_t adaptive_start(int64_t i, int64_t out, int64_t in) { return (i * in) / out; }
int64_t adaptive_end(int64_t i, int64_t out, int64_t in) { return ((i + 1) * in + out - 1) / out; }

}  // namespace

void max_pool2d(const Tensor& x, const ConvGeometry& g, Tensor& y, Tensor& indices) {
  const int64_t height = x.size(-2), width = x.size(-1), out_l = g.out_h * g.out_w;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    int64_t* idx = indices.data<int64_t>();
    std::vector<ValidRange> tap_cols;  // per tap column j: the outputs whose tap lies inside x
    for (int64_t j = 0; j < g.kw; ++j) tap_cols.push_back(valid_range(g.out_w, g.stride_w, g.pad_w, j * g.dilation_w, width));
    parallel_range(planes_of(x), grain_for(out_l * g.kh * g.kw), [&](int64_t lo, int64_t hi) {
      std::vector<C> best(static_cast<size_t>(g.out_w));
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = src + p * height * width;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          // One output row at a time, tap by tap across the row: the outputs of a row are
          // independent, so the loop over them pipelines (a loop over one window's taps is a
          // chain of dependent compares). Taps go in (i, j) order, so the first maximum wins; a
          // NaN replaces anything (PyTorch's `val > maxval || isnan(val)`). A window whose taps
          // all fall in the padding (dilation) keeps -inf and index -1.
          C* row_best = best.data();
          int64_t* where = idx + p * out_l + oh * g.out_w;
          std::fill(best.begin(), best.end(), -std::numeric_limits<C>::infinity());
          std::fill(where, where + g.out_w, int64_t{-1});
          for (int64_t i = 0; i < g.kh; ++i) {
            const int64_t h = oh * g.stride_h - g.pad_h + i * g.dilation_h;
            if (h < 0 || h >= height) continue;
            for (int64_t j = 0; j < g.kw; ++j) {
              const ValidRange cols = tap_cols[static_cast<size_t>(j)];
              const int64_t base = h * width - g.pad_w + j * g.dilation_w;
              const T* in = plane + base;
              const int64_t sw = g.stride_w;
              for (int64_t ow = cols.lo; ow < cols.hi; ++ow) {
                const C v = load(in[ow * sw]);
                const bool take = (v > row_best[ow]) | (v != v);
                row_best[ow] = take ? v : row_best[ow];
                where[ow] = take ? base + ow * sw : where[ow];
              }
            }
          }
          // A window of -inf values took no tap above: its index is its first tap's, as PyTorch's.
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            if (where[ow] >= 0) continue;
            for (int64_t i = 0; i < g.kh && where[ow] < 0; ++i) {
              const int64_t h = oh * g.stride_h - g.pad_h + i * g.dilation_h;
              if (h < 0 || h >= height) continue;
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t w = ow * g.stride_w - g.pad_w + j * g.dilation_w;
                if (w >= 0 && w < width) {
                  where[ow] = h * width + w;
                  break;
                }
              }
            }
          }
          T* out = dst + p * out_l + oh * g.out_w;
          for (int64_t ow = 0; ow < g.out_w; ++ow) out[ow] = store<T>(row_best[ow]);
        }
      }
    });
  });
}

void max_pool2d_backward(const Tensor& dy, const Tensor& indices, Tensor& dx) {
  const int64_t in_l = dx.size(-2) * dx.size(-1), out_l = dy.size(-2) * dy.size(-1);
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = dy.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    T* dst = dx.data<T>();
    parallel_range(planes_of(dx), grain_for(in_l + out_l), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(in_l));
      for (int64_t p = lo; p < hi; ++p) {
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t o = 0; o < out_l; ++o) {
          const int64_t at = idx[p * out_l + o];
          if (at >= 0) acc[static_cast<size_t>(at)] += load(src[p * out_l + o]);  // -1: a window with no tap
        }
        for (int64_t k = 0; k < in_l; ++k) dst[p * in_l + k] = store<T>(acc[static_cast<size_t>(k)]);
      }
    });
  });
}

void avg_pool2d(const Tensor& x, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& y) {
  const int64_t height = x.size(-2), width = x.size(-1), out_l = g.out_h * g.out_w;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    parallel_range(planes_of(x), grain_for(out_l * g.kh * g.kw), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = src + p * height * width;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Span hs = avg_span(oh, g.stride_h, g.pad_h, g.kh, height);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Span ws = avg_span(ow, g.stride_w, g.pad_w, g.kw, width);
            C sum = 0;
            for (int64_t h = hs.start; h < hs.end; ++h) {
              for (int64_t w = ws.start; w < ws.end; ++w) sum += load(plane[h * width + w]);
            }
            dst[p * out_l + oh * g.out_w + ow] = store<T>(static_cast<C>(sum / avg_divisor(hs, ws, divisor)));
          }
        }
      }
    });
  });
}

void avg_pool2d_backward(const Tensor& dy, const ConvGeometry& g, AvgPoolDivisor divisor, Tensor& dx) {
  const int64_t height = dx.size(-2), width = dx.size(-1), out_l = g.out_h * g.out_w;
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = dy.data<T>();
    T* dst = dx.data<T>();
    parallel_range(planes_of(dx), grain_for(out_l * g.kh * g.kw), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(height * width));
      for (int64_t p = lo; p < hi; ++p) {
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const Span hs = avg_span(oh, g.stride_h, g.pad_h, g.kh, height);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const Span ws = avg_span(ow, g.stride_w, g.pad_w, g.kw, width);
            const C share = static_cast<C>(load(src[p * out_l + oh * g.out_w + ow]) / avg_divisor(hs, ws, divisor));
            for (int64_t h = hs.start; h < hs.end; ++h) {
              for (int64_t w = ws.start; w < ws.end; ++w) acc[static_cast<size_t>(h * width + w)] += share;
            }
          }
        }
        for (int64_t k = 0; k < height * width; ++k) dst[p * height * width + k] = store<T>(acc[static_cast<size_t>(k)]);
      }
    });
  });
}

void adaptive_avg_pool2d(const Tensor& x, Tensor& y) {
  const int64_t height = x.size(-2), width = x.size(-1), out_h = y.size(-2), out_w = y.size(-1);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    parallel_range(planes_of(x), grain_for(height * width), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const T* plane = src + p * height * width;
        for (int64_t i = 0; i < out_h; ++i) {
          const int64_t h0 = adaptive_start(i, out_h, height), h1 = adaptive_end(i, out_h, height);
          for (int64_t j = 0; j < out_w; ++j) {
            const int64_t w0 = adaptive_start(j, out_w, width), w1 = adaptive_end(j, out_w, width);
            C sum = 0;
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) sum += load(plane[h * width + w]);
            }
            dst[(p * out_h + i) * out_w + j] = store<T>(sum / static_cast<C>((h1 - h0) * (w1 - w0)));
          }
        }
      }
    });
  });
}

void adaptive_avg_pool2d_backward(const Tensor& dy, Tensor& dx) {
  const int64_t height = dx.size(-2), width = dx.size(-1), out_h = dy.size(-2), out_w = dy.size(-1);
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* src = dy.data<T>();
    T* dst = dx.data<T>();
    parallel_range(planes_of(dx), grain_for(height * width), [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(height * width));
      for (int64_t p = lo; p < hi; ++p) {
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t i = 0; i < out_h; ++i) {
          const int64_t h0 = adaptive_start(i, out_h, height), h1 = adaptive_end(i, out_h, height);
          for (int64_t j = 0; j < out_w; ++j) {
            const int64_t w0 = adaptive_start(j, out_w, width), w1 = adaptive_end(j, out_w, width);
            const C share = load(src[(p * out_h + i) * out_w + j]) / static_cast<C>((h1 - h0) * (w1 - w0));
            for (int64_t h = h0; h < h1; ++h) {
              for (int64_t w = w0; w < w1; ++w) acc[static_cast<size_t>(h * width + w)] += share;
            }
          }
        }
        for (int64_t k = 0; k < height * width; ++k) dst[p * height * width + k] = store<T>(acc[static_cast<size_t>(k)]);
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
