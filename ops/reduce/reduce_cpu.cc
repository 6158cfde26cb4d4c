// Reductions on the CPU. Sums accumulate in double in a fixed order, so their error does not grow
// with the number of terms and their bits do not depend on the thread count; max and argmax scan
// along one dimension.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "framework/multi_tensor.h"
#include "framework/parallel.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/lane_sum_cpu.h"
#include "ops/reduce/reduce_kernels.h"
#include "ops/strided.h"

namespace ampgrad::kernels::cpu {

namespace {

constexpr int64_t kWiden = 512;  // 16-bit values widened per block

// acc[j * acc_stride] += x[j] for j < n (acc_stride 1: a kept inner dimension), or acc[0] +=
// sum_j x[j] (acc_stride 0: the inner dimension is reduced), in double.
template <typename T>
void accumulate_row(const T* x, int64_t n, double* acc, int64_t acc_stride) {
  if constexpr (kIsLowPrecision<T>) {
    float wide[kWiden];
    for (int64_t start = 0; start < n; start += kWiden) {
      const int64_t len = std::min(kWiden, n - start);
      widen(x + start, wide, static_cast<size_t>(len));
      accumulate_row(wide, len, acc + start * acc_stride, acc_stride);
    }
  } else if (acc_stride == 1) {
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(x[j]);
  } else {
    acc[0] += lane_sum<4>(n, [x](int64_t j) { return static_cast<double>(x[j]); });
  }
}

// Adds the rows [row_begin, row_end) of the plan (operand 0: x, contiguous; operand 1: out, with
// stride 0 along reduced dimensions) into acc, which is indexed like out.
template <typename T>
void accumulate_rows(const T* x, const StridedPlan<2>& plan, int64_t row_begin, int64_t row_end, double* acc) {
  const int64_t acc_stride = plan.rank > 0 ? plan.strides[1][plan.rank - 1] : 0;
  for_each_row(plan, row_begin, row_end, [&](const int64_t* offsets, int64_t inner) {
    accumulate_row(x + offsets[0], inner, acc + offsets[1], acc_stride);
  });
}

}  // namespace

void sum_to(const Tensor& x, double alpha, Tensor& out) {
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  std::vector<double> acc(static_cast<size_t>(n_out), 0.0);
  if (x.numel() == 0) {  // a sum of nothing is 0
    visit_floating_dtype(out.dtype(), [&](auto t) { std::fill_n(out.data<decltype(t)>(), n_out, decltype(t){}); });
    return;
  }
  StridedPlan<2> plan =
      make_plan<2>(x.shape(), {contiguous_strides(x.shape()), broadcast_strides(out.shape(), x.shape())});
  // Everything summed to one value: cut the flat data into rows of 4096 (with a shorter last
  // row), so that the pieces below have rows to share.
  if (n_out == 1 && plan.numel > 4096) {
    constexpr int64_t kRow = 4096;
    const int64_t rows = plan.numel / kRow;
    plan = make_plan<2>({rows, kRow}, {Shape{kRow, 1}, Shape{0, 0}});
    const int64_t tail = x.numel() - rows * kRow;
    if (tail > 0) {
      visit_floating_dtype(x.dtype(), [&](auto t) {
        accumulate_row(x.data<decltype(t)>() + rows * kRow, tail, acc.data(), 0);
      });
    }
  }
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* in = x.data<T>();
    const int64_t rows = plan_rows(plan);
    const int64_t inner = rows > 0 ? plan.numel / rows : 0;
    // Pieces of at least 64K elements, cut by the shape alone (never by the thread count), so every
    // output is summed in the same order whatever the number of threads.
    // Partials stay under 32 MB: a huge output reduced over few rows takes fewer, longer pieces.
    const int64_t max_pieces = std::max<int64_t>(1, (int64_t{1} << 22) / n_out);
    int64_t piece_rows = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(inner, 1));
    piece_rows = std::max(piece_rows, (rows + max_pieces - 1) / max_pieces);
    const int64_t pieces = (rows + piece_rows - 1) / piece_rows;
    if (pieces <= 1) {
      accumulate_rows(in, plan, 0, rows, acc.data());
    } else if (plan.strides[1][0] != 0) {
      // The outermost dimension is kept: its indices write disjoint outputs, so pieces of it share
      // one accumulator.
      const int64_t rows_per_outer = rows / plan.sizes[0];
      parallel_range(plan.sizes[0], std::max<int64_t>(1, piece_rows / rows_per_outer), [&](int64_t lo, int64_t hi) {
        accumulate_rows(in, plan, lo * rows_per_outer, hi * rows_per_outer, acc.data());
      });
    } else {
      // The outermost dimension is reduced: each piece sums into its own partial, and the partials
      // are added in piece order.
      std::vector<double> partials(static_cast<size_t>(pieces * n_out), 0.0);
      parallel_for(pieces, [&](int64_t piece) {
        accumulate_rows(in, plan, piece * piece_rows, std::min(rows, (piece + 1) * piece_rows),
                        partials.data() + piece * n_out);
      });
      for (int64_t piece = 0; piece < pieces; ++piece) {
        const double* p = partials.data() + piece * n_out;
        for (int64_t j = 0; j < n_out; ++j) acc[static_cast<size_t>(j)] += p[j];
      }
    }
    T* o = out.data<T>();
    for (int64_t j = 0; j < n_out; ++j) o[j] = convert<T>(alpha * acc[static_cast<size_t>(j)]);
  });
}

void max_along(const Tensor& x, int64_t dim, Tensor& values, Tensor& indices) {
  const AlongDim v = along_dim(x.shape(), dim);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* out_values = values.defined() ? values.data<T>() : nullptr;
    int64_t* out_indices = indices.data<int64_t>();
    parallel_range(v.outer, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(v.size * v.inner, 1)),
                   [&](int64_t lo, int64_t hi) {
      std::vector<C> best(static_cast<size_t>(v.inner));
      for (int64_t o = lo; o < hi; ++o) {
        const T* base = in + o * v.size * v.inner;
        int64_t* idx = out_indices + o * v.inner;
        for (int64_t i = 0; i < v.inner; ++i) {
          best[static_cast<size_t>(i)] = load(base[i]);
          idx[i] = 0;
        }
        for (int64_t r = 1; r < v.size; ++r) {
          for (int64_t i = 0; i < v.inner; ++i) {
            const C value = load(base[r * v.inner + i]);
            C& b = best[static_cast<size_t>(i)];
            // Strictly greater keeps the first maximum; a NaN is the maximum, and the first NaN stays.
            if (value > b || (value != value && b == b)) {
              b = value;
              idx[i] = r;
            }
          }
        }
        if (out_values != nullptr) {
          for (int64_t i = 0; i < v.inner; ++i) out_values[o * v.inner + i] = store<T>(best[static_cast<size_t>(i)]);
        }
      }
    });
  });
}

void max_backward(const Tensor& dy, const Tensor& indices, int64_t dim, Tensor& dx) {
  const AlongDim v = along_dim(dx.shape(), dim);
  visit_floating_dtype(dx.dtype(), [&](auto t) {
    using T = decltype(t);
    T* out = dx.data<T>();
    const T* g = dy.data<T>();
    const int64_t* idx = indices.data<int64_t>();
    std::fill_n(out, dx.numel(), store<T>(ComputeType<T>(0)));
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t i = 0; i < v.inner; ++i) {
        const int64_t k = o * v.inner + i;
        out[(o * v.size + idx[k]) * v.inner + i] = g[k];
      }
    }
  });
}

namespace {

// sum_j double(x[j])^2 over n values, in four lanes (lane_sum_cpu.h).
template <typename T>
double squares(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    float wide[kWiden];
    double total = 0.0;
    for (int64_t start = 0; start < n; start += kWiden) {
      const int64_t len = std::min(kWiden, n - start);
      if constexpr (std::is_same_v<T, Half>) {
        half_to_float(x + start, wide, static_cast<size_t>(len));
      } else {
        bfloat16_to_float(x + start, wide, static_cast<size_t>(len));
      }
      total += squares(wide, len);
    }
    return total;
  } else {
    return lane_sum<4>(n, [x](int64_t j) { return static_cast<double>(x[j]) * static_cast<double>(x[j]); });
  }
}

using multi_tensor::Chunk;

}  // namespace

void sum_of_squares(const SquaresChunks& chunks, Tensor& out) {
  std::vector<double> partials(chunks.size(), 0.0);
  multi_tensor::apply_cpu(chunks, [&](const Chunk<1>& c) {
    visit_floating_dtype(c.dtype[0], [&](auto t) {
      using T = decltype(t);
      partials[static_cast<size_t>(&c - chunks.data())] = squares(multi_tensor::chunk_data<const T>(c, 0), c.n);
    });
  });
  double total = 0.0;
  for (double p : partials) total += p;  // in table order
  out.data<double>()[0] = total;
}

void clip_by_norm_(const SquaresChunks& chunks, const Tensor& sum_sq, double max_norm, Tensor& norm) {
  const double total_norm = std::sqrt(sum_sq.data<double>()[0]);
  norm.data<double>()[0] = total_norm;
  const double coeff = max_norm / (total_norm + 1e-6);  // PyTorch's epsilon
  if (!std::isfinite(total_norm) || !(coeff < 1.0)) return;
  multi_tensor::apply_cpu(chunks, [&](const Chunk<1>& c) {
    visit_floating_dtype(c.dtype[0], [&](auto t) {
      using T = decltype(t);
      using C = ComputeType<T>;
      T* x = multi_tensor::chunk_data<T>(c, 0);
      const C scale = static_cast<C>(coeff);
      if constexpr (std::is_same_v<T, C>) {
        for (int64_t i = 0; i < c.n; ++i) x[i] = scale * x[i] + C(0);  // + 0 as affine: -0 becomes +0
      } else {
        C wide[kWiden];  // 16-bit values in float a block at a time, rounded back as affine rounds them
        for (int64_t start = 0; start < c.n; start += kWiden) {
          const int64_t len = std::min(kWiden, c.n - start);
          widen(x + start, wide, static_cast<size_t>(len));
          for (int64_t j = 0; j < len; ++j) wide[j] = scale * wide[j] + C(0);
          narrow(wide, x + start, static_cast<size_t>(len));
        }
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
