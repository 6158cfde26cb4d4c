// Convolution moves on the CPU: im2col / col2im one (row, sample) or (sample, channel) plane per
// task, and the channel-major <-> sample-major transposes one L-long run at a time. Also the
// column budget of conv2d's chunks, for every device.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "framework/parallel.h"
#include "ops/conv/conv_kernels.h"

namespace ampgrad::kernels {

namespace {
std::atomic<int64_t> column_budget_for_testing{0};
}  // namespace

int64_t im2col_column_budget(Device device) {
  const int64_t forced = column_budget_for_testing.load(std::memory_order_relaxed);
  if (forced > 0) return forced;
  return device == Device::kCUDA ? int64_t{1} << 26 : int64_t{1} << 23;
}

void set_im2col_column_budget_for_testing(int64_t values) {
  column_budget_for_testing.store(values, std::memory_order_relaxed);
}

}  // namespace ampgrad::kernels

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
  visit_dtype(x.dtype(), [&](auto t) {
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

namespace {

// The depthwise convolution at stride 1, undilated, with padding below the kernel (a ResNet or
// MobileNet 3 x 3), as long vector loops. Each plane is copied zero-padded in the compute type and
// the outputs are computed over the padded-width grid, q = oh Wp + ow (the columns from Wo on are
// computed and dropped), where tap (i, j) reads the run of memory from i Wp + j. Row by row, each
// tap's loop at a 56 x 56 plane was 56 long; here it is Ho Wp.
// The input gradient is the same over dy padded by the kernel less 1 less the padding, with the
// taps turned; the weight gradient reduces dy on the grid (zeros in the dropped columns) against
// the padded x. Each output sums the same taps in the same order as the row-by-row loops (whose
// multiply-adds the optimised build fuses), the padding's taps adding zeros: the forward and input
// gradient give their bits for finite values, but for the sign of an exact zero (a bias of -0).
// The grid multiplies padding and dropped columns by real values: an infinite weight or x can give
// NaN where the row-by-row loops, which skip them, give an infinity. The weight gradient then
// reports it and is recomputed by those loops (as the direct convolution's is by im2col); the
// forward and input gradient keep the grid's result.
bool depthwise_grid_applies(const ConvGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.pad_h < g.kh &&
         g.pad_w < g.kw;
}

// dst[0, n) = src[0, n): in fixed 8-value blocks, which the compiler turns into vector moves (a
// memmove call per row of a small plane cost more than the convolution's arithmetic), then the tail.
template <typename C>
void copy_row(const C* src, int64_t n, C* dst) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) std::memcpy(dst + k, src + k, 8 * sizeof(C));
  for (; k < n; ++k) dst[k] = src[k];
}

// A plane of `rows` x `cols` copied into a zero-padded `row_len`-wide buffer, `top` rows and
// `left` columns in, in the compute type; `size` values in all (the grid's last taps read up to
// kw - 1 values past the padded rows). Only the padding is zeroed, a run between rows at a time.
template <typename T, typename C>
void pad_plane(const T* src, int64_t rows, int64_t cols, int64_t top, int64_t left, int64_t row_len, int64_t size,
               C* dst) {
  int64_t done = 0;  // dst[0, done) is written
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = (top + r) * row_len + left;
    for (; done < start; ++done) dst[done] = C(0);
    if constexpr (std::is_same_v<T, C>) {
      copy_row(src + r * cols, cols, dst + start);
    } else {
      widen(src + r * cols, dst + start, static_cast<size_t>(cols));
    }
    done = start + cols;
  }
  std::fill(dst + done, dst + size, C(0));
}

// The first `cols` of each of `rows` grid rows (row_len apart), rounded once into dst.
template <typename T, typename C>
void crop_grid(const C* grid, int64_t rows, int64_t cols, int64_t row_len, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, C>) {
      copy_row(grid + r * row_len, cols, dst + r * cols);
    } else {
      narrow(grid + r * row_len, dst + r * cols, static_cast<size_t>(cols));
    }
  }
}

// grid[q] = init + sum over taps t, in order, of w[t] in[q + off[t]] for q < len: each output
// is init, then one FMA per tap. AVX2 keeps 32 outputs in registers over all the taps and stores
// them once; tap by tap over the whole grid, every output was loaded and stored again per tap.
template <typename C>
void grid_taps(const C* w, const int64_t* off, int64_t taps, const C* in, int64_t len, C init, C* grid) {
  int64_t q = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<C, float>) {
    const __m256 start = _mm256_set1_ps(init);
    for (; q + 32 <= len; q += 32) {
      __m256 acc[4] = {start, start, start, start};
      for (int64_t t = 0; t < taps; ++t) {
        const __m256 tap = _mm256_set1_ps(w[t]);
        const float* src = in + off[t] + q;
        for (int v = 0; v < 4; ++v) acc[v] = _mm256_fmadd_ps(tap, _mm256_loadu_ps(src + 8 * v), acc[v]);
      }
      for (int v = 0; v < 4; ++v) _mm256_storeu_ps(grid + q + 8 * v, acc[v]);
    }
  }
#endif
  for (; q < len; ++q) {
    C acc = init;
    for (int64_t t = 0; t < taps; ++t) acc = std::fma(w[t], in[off[t] + q], acc);
    grid[q] = acc;
  }
}

// Where each tap (i, j), in order, reads the padded grid: i row_len + j, or turned (the input
// gradient's), (kh - 1 - i) row_len + (kw - 1 - j). The same for every plane of a call.
std::vector<int64_t> tap_offsets(const ConvGeometry& g, int64_t row_len, bool turned) {
  std::vector<int64_t> off;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      off.push_back(turned ? (g.kh - 1 - i) * row_len + (g.kw - 1 - j) : i * row_len + j);
    }
  }
  return off;
}

// Each (sample, channel) plane of src ([planes, rows, cols]) convolved on the grid into dst
// ([planes, out_rows, out_cols]): padded by `top` rows and `left` columns on both sides, its
// channel's taps (turned or not) starting from bias[c] (or zero). The forward runs it on x, the
// input gradient on dy with the turned taps.
template <typename T>
void convolve_planes(const T* src, int64_t planes, int64_t channels, int64_t rows, int64_t cols, int64_t top,
                     int64_t left, const T* w, bool turned, const T* bias, const ConvGeometry& g, int64_t out_rows,
                     int64_t out_cols, T* dst) {
  using C = ComputeType<T>;
  const int64_t row_len = cols + 2 * left, padded = (rows + 2 * top) * row_len + g.kw, len = out_rows * row_len;
  const int64_t taps = g.kh * g.kw;
  const std::vector<int64_t> off = tap_offsets(g, row_len, turned);
  parallel_range(planes, grain_for(len * taps), [&](int64_t lo, int64_t hi) {
    std::vector<C> in(static_cast<size_t>(padded)), acc(static_cast<size_t>(len)), w_c(static_cast<size_t>(taps));
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t c = item % channels;
      pad_plane(src + item * rows * cols, rows, cols, top, left, row_len, padded, in.data());
      for (int64_t t = 0; t < taps; ++t) w_c[static_cast<size_t>(t)] = load(w[c * taps + t]);
      grid_taps(w_c.data(), off.data(), taps, in.data(), len, bias == nullptr ? C(0) : load(bias[c]), acc.data());
      crop_grid(acc.data(), out_rows, out_cols, row_len, dst + item * out_rows * out_cols);
    }
  });
}

template <typename T>
void depthwise_grid_forward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  convolve_planes(x.data<T>(), x.size(0) * x.size(1), x.size(1), x.size(2), x.size(3), g.pad_h, g.pad_w, w.data<T>(),
                  false, b.defined() ? b.data<T>() : nullptr, g, g.out_h, g.out_w, y.data<T>());
}

// dx is the stride-1 convolution of dy padded by the kernel less 1 less the padding, taps turned.
template <typename T>
void depthwise_grid_input_grad(const Tensor& w, const Tensor& dy, const ConvGeometry& g, Tensor& dx) {
  convolve_planes(dy.data<T>(), dx.size(0) * dx.size(1), dx.size(1), g.out_h, g.out_w, g.kh - 1 - g.pad_h,
                  g.kw - 1 - g.pad_w, w.data<T>(), true, static_cast<const T*>(nullptr), g, dx.size(2), dx.size(3),
                  dx.data<T>());
}

// total[t] += sum over q < len of d[q] x[q + off[t]], for the n taps from off: the products in
// float vector lanes over blocks of kSumBlock positions, each block's lanes added into the double
// totals. AVX2 loads each d vector once for all the taps (up to kTapGroup, one register each); the
// plain loop (other types, the tail) sums each product in double.
constexpr int64_t kTapGroup = 9, kSumBlock = 512;

template <typename C>
void tap_sums_plain(const C* d, const C* x, const int64_t* off, int64_t n, int64_t from, int64_t len, double* total) {
  for (int64_t t = 0; t < n; ++t) {
    double sum = 0.0;
    for (int64_t q = from; q < len; ++q) sum += static_cast<double>(d[q]) * static_cast<double>(x[off[t] + q]);
    total[t] += sum;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The 8 lanes of v added in double.
inline double horizontal_sum(__m256 v) {
  const __m256d wide =
      _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  const __m128d half = _mm_add_pd(_mm256_castpd256_pd128(wide), _mm256_extractf128_pd(wide, 1));
  return _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)));
}

template <int kN>
void tap_sums_avx2(const float* d, const float* x, const int64_t* off, int64_t len, double* total) {
  const int64_t whole = len / 8 * 8;
  for (int64_t q0 = 0; q0 < whole; q0 += kSumBlock) {
    const int64_t q1 = std::min(whole, q0 + kSumBlock);
    __m256 acc[kN];
    for (int t = 0; t < kN; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t q = q0; q < q1; q += 8) {
      const __m256 dv = _mm256_loadu_ps(d + q);
      for (int t = 0; t < kN; ++t) acc[t] = _mm256_fmadd_ps(dv, _mm256_loadu_ps(x + off[t] + q), acc[t]);
    }
    for (int t = 0; t < kN; ++t) total[t] += horizontal_sum(acc[t]);
  }
  tap_sums_plain(d, x, off, kN, whole, len, total);
}

template <int... kI>
constexpr auto tap_sums_table(std::integer_sequence<int, kI...>) {
  return std::array<void (*)(const float*, const float*, const int64_t*, int64_t, double*), sizeof...(kI)>{
      &tap_sums_avx2<kI + 1>...};
}
#endif

template <typename C>
void tap_sums(const C* d, const C* x, const int64_t* off, int64_t n, int64_t len, double* total) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<C, float>) {
    static constexpr auto kTable = tap_sums_table(std::make_integer_sequence<int, kTapGroup>{});
    for (int64_t t = 0; t < n; t += kTapGroup) kTable[std::min(kTapGroup, n - t) - 1](d, x, off + t, len, total + t);
    return;
  }
#endif
  tap_sums_plain(d, x, off, n, 0, len, total);
}

// dw[c, i, j] = sum over samples and grid positions of dy x at the tap (dy on the grid, zeros in
// the dropped columns): tap_sums per sample, the totals in double. Returns false when a total is
// NaN (the caller then takes the row-by-row loops: an infinite x meets a dy of 0 in the dropped
// columns, which those loops skip).
template <typename T>
bool depthwise_grid_weight_grad(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw) {
  using C = ComputeType<T>;
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t wp = width + 2 * g.pad_w, padded = (height + 2 * g.pad_h) * wp + g.kw, len = g.out_h * wp;
  const int64_t taps = g.kh * g.kw;
  const T* src = x.data<T>();
  const T* grad = dy.data<T>();
  T* out = dw.data<T>();
  const std::vector<int64_t> off = tap_offsets(g, wp, false);
  std::atomic<bool> nan{false};
  parallel_range(channels, 1, [&](int64_t lo, int64_t hi) {
    std::vector<C> in(static_cast<size_t>(padded)), d(static_cast<size_t>(len));
    std::vector<double> total(static_cast<size_t>(taps));
    for (int64_t c = lo; c < hi; ++c) {
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t n = 0; n < batch; ++n) {
        const int64_t plane = n * channels + c;
        pad_plane(src + plane * height * width, height, width, g.pad_h, g.pad_w, wp, padded, in.data());
        pad_plane(grad + plane * g.out_h * g.out_w, g.out_h, g.out_w, 0, 0, wp, len, d.data());
        tap_sums(d.data(), in.data(), off.data(), taps, len, total.data());
      }
      for (int64_t k = 0; k < taps; ++k) out[c * taps + k] = convert<T>(total[static_cast<size_t>(k)]);
      if (std::any_of(total.begin(), total.end(), [](double v) { return std::isnan(v); })) nan = true;
    }
  });
  return !nan;
}

}  // namespace

void depthwise_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  if (depthwise_grid_applies(g)) {
    return visit_floating_dtype(x.dtype(), [&](auto t) { depthwise_grid_forward<decltype(t)>(x, w, b, g, y); });
  }
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
    bool need_dx = dx.defined(), need_dw = dw.defined();
    if (depthwise_grid_applies(g)) {
      if (need_dx && dx.numel() > 0) depthwise_grid_input_grad<T>(w, dy, g, dx);
      need_dx = false;
      // A NaN sum: dw again by the row-by-row loops below, which meet only the real taps.
      need_dw = need_dw && dw.numel() > 0 && !depthwise_grid_weight_grad<T>(x, dy, g, dw);
      if (!need_dw) return;
    }
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
    if (need_dx) {
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
    if (need_dw) {
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
