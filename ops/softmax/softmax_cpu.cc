// Softmax, log_softmax and the fused cross-entropy on the CPU: each row is gathered into a float
// (double for float64) buffer, so strided rows and float16 cost one conversion, then the max,
// the exponentials (math::exp, vectorised) and the sum run over a contiguous array.
#include <algorithm>
#include <limits>
#include <vector>

#include "framework/error.h"
#include "framework/parallel.h"
#include "ops/math.h"
#include "ops/softmax/softmax_kernels.h"
#include "ops/softmax/softmax_rows_cpu.h"
#include "ops/strided.h"

namespace ampgrad::kernels::cpu {

namespace {

using rows::finite_shift;
using rows::row_max;
using rows::sum_exp;

// Runs fn(row, base, buffer) for every row (o, i) of the view, on the pool; base is the offset
// of the row's first element and its elements are inner apart.
template <typename C, typename Fn>
void for_rows(const AlongDim& v, Fn&& fn) {
  const int64_t rows = v.outer * v.inner;
  parallel_range(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(v.size, 1)),
                 [&](int64_t lo, int64_t hi) {
    std::vector<C> buffer(static_cast<size_t>(v.size));
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t o = row / v.inner, i = row % v.inner;
      fn(row, o * v.size * v.inner + i, buffer.data());
    }
  });
}

template <typename T, typename C>
void gather(const T* src, int64_t base, int64_t stride, int64_t n, C* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = load(src[base + j * stride]);
}

template <typename T, typename C>
void scatter(const C* src, int64_t n, T* dst, int64_t base, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) dst[base + j * stride] = store<T>(src[j]);
}

// softmax in place over n values, of which the first `valid` take part (the rest are masked: 0).
// The sum is 0 only where every term is -inf (the maximum's own term is exp(0) = 1 otherwise).
template <typename C>
void softmax_row(C* v, int64_t n, int64_t valid, EmptyRows empty_rows) {
  const double sum = sum_exp<true>(v, valid, finite_shift(row_max(v, valid)), v);
  const C inv = empty_rows == EmptyRows::kZero && sum == 0.0 ? C(0) : static_cast<C>(1.0 / sum);
  for (int64_t j = 0; j < valid; ++j) v[j] *= inv;
  for (int64_t j = valid; j < n; ++j) v[j] = C(0);
}

// log_softmax in place: x - max - log(sum exp(x - max)), from the inputs (no log of a rounded exp).
template <typename C>
void log_softmax_row(C* v, int64_t n) {
  const C shift = finite_shift(row_max(v, n));
  const C log_sum = static_cast<C>(std::log(sum_exp<false>(v, n, shift)));
  for (int64_t j = 0; j < n; ++j) v[j] = v[j] - shift - log_sum;
}

}  // namespace

void softmax(const Tensor& x, int64_t dim, SoftmaxKind kind, Causal causal, EmptyRows empty_rows, Tensor& y) {
  const AlongDim v = along_dim(x.shape(), dim);
  const int64_t tq = causal == Causal::kYes && x.dim() >= 2 ? x.size(-2) : 1;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    for_rows<C>(v, [&](int64_t row, int64_t base, C* buf) {
      gather(in, base, v.inner, v.size, buf);
      if (kind == SoftmaxKind::kLogSoftmax) {
        log_softmax_row(buf, v.size);
      } else {
        // Causal: the row's index within the trailing [Tq, Tk] matrix decides how many columns it sees.
        const int64_t valid = causal == Causal::kYes ? std::min(v.size, row % tq + 1) : v.size;
        softmax_row(buf, v.size, valid, empty_rows);
      }
      scatter(buf, v.size, out, base, v.inner);
    });
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, SoftmaxKind kind, Tensor& dx) {
  const AlongDim v = along_dim(y.shape(), dim);
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* out = dx.data<T>();
    const int64_t rows = v.outer * v.inner;
    parallel_range(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(v.size, 1)),
                   [&](int64_t lo, int64_t hi) {
      std::vector<C> yb(static_cast<size_t>(v.size)), gb(static_cast<size_t>(v.size));
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t base = (row / v.inner) * v.size * v.inner + row % v.inner;
        gather(py, base, v.inner, v.size, yb.data());
        gather(pdy, base, v.inner, v.size, gb.data());
        double dot = 0.0;
        if (kind == SoftmaxKind::kSoftmax) {
          for (int64_t j = 0; j < v.size; ++j) dot += static_cast<double>(gb[j]) * static_cast<double>(yb[j]);
          const C s = static_cast<C>(dot);
          for (int64_t j = 0; j < v.size; ++j) gb[j] = yb[j] * (gb[j] - s);
        } else {
          for (int64_t j = 0; j < v.size; ++j) dot += static_cast<double>(gb[j]);
          const C s = static_cast<C>(dot);
          for (int64_t j = 0; j < v.size; ++j) gb[j] = gb[j] - math::exp(yb[j]) * s;
        }
        scatter(gb.data(), v.size, out, base, v.inner);
      }
    });
  });
}

namespace {

// The log-normaliser of a row of C scores (0 and 0 for log-probabilities: already normalised).
template <typename C>
LogNormalizer<C> row_log_normalizer(const C* scores, int64_t classes, ClassScores kind) {
  if (kind == ClassScores::kLogProbs) return {};
  const C shift = finite_shift(row_max(scores, classes));
  return {.shift = shift, .log_sum = std::log(sum_exp<false>(scores, classes, shift))};
}

void check_target(int64_t t, int64_t classes, const CrossEntropyArgs& args, int64_t sample) {
  AG_CHECK(t == args.ignore_index || (t >= 0 && t < classes), "cross_entropy: target ", t, " of sample ", sample,
           " is outside [0, ", classes, ") and is not ignore_index (", args.ignore_index,
           "); hint: class indices count from 0");
}

}  // namespace

void cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args, Tensor& losses,
                   Tensor& valid, Tensor& row_lse) {
  const int64_t n = input.size(0), classes = input.size(1);
  const int64_t* tgt = target.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) check_target(tgt[i], classes, args, i);
  visit_floating_dtype(input.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* in = input.data<T>();
    C* out = losses.data<C>();
    C* ok = valid.data<C>();
    double* lse_out = row_lse.data<double>();
    const double eps = args.label_smoothing;
    parallel_range(n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(classes, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<C> row(static_cast<size_t>(classes));
      for (int64_t i = lo; i < hi; ++i) {
        if (tgt[i] == args.ignore_index) {
          out[i] = ok[i] = C(0);
          lse_out[2 * i] = lse_out[2 * i + 1] = 0.0;
          continue;
        }
        gather(in, i * classes, 1, classes, row.data());
        const LogNormalizer<C> lse = row_log_normalizer(row.data(), classes, args.scores);
        double loss = -(1.0 - eps) * lse.log_prob_wide(row[static_cast<size_t>(tgt[i])]);
        if (eps > 0) {
          double mean_log_p = 0.0;
          for (int64_t c = 0; c < classes; ++c) mean_log_p += lse.log_prob_wide(row[static_cast<size_t>(c)]);
          loss -= eps * mean_log_p / static_cast<double>(classes);
        }
        out[i] = static_cast<C>(loss);
        ok[i] = C(1);
        lse_out[2 * i] = static_cast<double>(lse.shift);  // exact: shift is a C value
        lse_out[2 * i + 1] = lse.log_sum;
      }
    });
  });
}

void cross_entropy_backward(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args,
                            const Tensor& row_lse, const Tensor& dlosses, Tensor& dinput) {
  const int64_t n = input.size(0), classes = input.size(1);
  const int64_t* tgt = target.data<int64_t>();
  visit_floating_dtype(input.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    const T* in = input.data<T>();
    const C* dl = dlosses.data<C>();
    const double* lse_in = row_lse.data<double>();
    T* out = dinput.data<T>();
    const C eps = static_cast<C>(args.label_smoothing);
    const C uniform = eps / static_cast<C>(classes);
    parallel_range(n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(classes, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<C> row(static_cast<size_t>(classes));
      for (int64_t i = lo; i < hi; ++i) {
        if (tgt[i] == args.ignore_index) {
          std::fill_n(out + i * classes, classes, store<T>(C(0)));
          continue;
        }
        const C g = dl[i];
        if (args.scores == ClassScores::kLogits) {
          const LogNormalizer<C> lse{.shift = static_cast<C>(lse_in[2 * i]), .log_sum = lse_in[2 * i + 1]};
          gather(in, i * classes, 1, classes, row.data());
          for (int64_t c = 0; c < classes; ++c) {
            row[static_cast<size_t>(c)] = math::exp(lse.log_prob(row[static_cast<size_t>(c)])) - uniform;
          }
        } else {
          std::fill(row.begin(), row.end(), -uniform);
        }
        // The target's share: p_t - (1 - eps) - eps / C, or -(1 - eps) - eps / C for log-probabilities.
        row[static_cast<size_t>(tgt[i])] -= C(1) - eps;
        for (int64_t c = 0; c < classes; ++c) out[i * classes + c] = store<T>(g * row[static_cast<size_t>(c)]);
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
