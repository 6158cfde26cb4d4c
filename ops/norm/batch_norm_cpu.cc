// Batch norm on the CPU: statistics and gradient sums one channel per task (double sums over the
// channel's N x S values), the element-wise passes one [S] run of a (sample, channel) per task.
#include <algorithm>
#include <cmath>
#include <vector>

#include "framework/parallel.h"
#include "ops/lane_sum_cpu.h"
#include "ops/norm/norm_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

// x [N, C, S]: N, C and S.
struct Layout {
  int64_t n, c, s;
};
Layout layout_of(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

int64_t grain_for(int64_t work) { return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(work, 1)); }

// sum_k f(v[k], k) over k < n in double, the values widened (lane_sum_cpu.h).
template <typename T, typename F>
double sum_over(const T* v, int64_t n, F&& f) {
  return lane_sum<8>(n, [v, &f](int64_t k) { return f(static_cast<double>(load(v[k])), k); });
}

// The channel's values widened, one value of w (1 when undefined).
template <typename T>
double weight_at(const T* w, int64_t c) {
  return w == nullptr ? 1.0 : static_cast<double>(load(w[c]));
}

}  // namespace

void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) {
  const Layout l = layout_of(x);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using S = Stat<ComputeType<T>>;
    const T* in = x.data<T>();
    S* pmean = mean.data<S>();
    S* pvar = var.data<S>();
    parallel_range(l.c, grain_for(l.n * l.s), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        double sum = 0.0;
        for (int64_t n = 0; n < l.n; ++n) {
          sum += sum_over(in + (n * l.c + c) * l.s, l.s, [](double v, int64_t) { return v; });
        }
        const double count = static_cast<double>(l.n * l.s), mu = sum / count;
        double sq = 0.0;
        for (int64_t n = 0; n < l.n; ++n) {
          sq += sum_over(in + (n * l.c + c) * l.s, l.s, [mu](double v, int64_t) { return (v - mu) * (v - mu); });
        }
        pmean[c] = static_cast<S>(mu);
        pvar[c] = static_cast<S>(sq / count);
      }
    });
  });
}

void batch_norm_finalize(const Tensor& mean, const Tensor& var, double eps, RunningUpdate update,
                         Tensor& running_mean, Tensor& running_var, Tensor& rstd) {
  const int64_t channels = rstd.numel();
  const std::vector<double> mu = mean.to_double_vector(), v = var.to_double_vector();
  visit_floating_dtype(rstd.dtype(), [&](auto t) {
    using S = decltype(t);
    S* out = rstd.data<S>();
    for (int64_t c = 0; c < channels; ++c) out[c] = static_cast<S>(1.0 / std::sqrt(v[static_cast<size_t>(c)] + eps));
  });
  const auto blend = [&](Tensor& running, const std::vector<double>& batch, double factor) {
    if (!running.defined()) return;
    visit_floating_dtype(running.dtype(), [&](auto t) {
      using T = decltype(t);
      T* r = running.data<T>();
      for (int64_t c = 0; c < channels; ++c) {
        const double old = static_cast<double>(load(r[c]));
        r[c] = convert<T>((1.0 - update.momentum) * old + update.momentum * factor * batch[static_cast<size_t>(c)]);
      }
    });
  };
  blend(running_mean, mu, 1.0);
  blend(running_var, v, update.unbias);
}

void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w, const Tensor& b,
                      Tensor& y) {
  const Layout l = layout_of(x);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    using S = Stat<C>;
    const T* in = x.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const T* pb = b.defined() ? b.data<T>() : nullptr;
    const S* pmean = mean.data<S>();
    const S* prstd = rstd.data<S>();
    T* out = y.data<T>();
    parallel_range(l.n * l.c, grain_for(l.s), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t c = row % l.c;
        // y = (x - mean) rstd w + b as one multiply-add per value: x scale + shift.
        const C scale = static_cast<C>(static_cast<double>(prstd[c]) * weight_at(pw, c));
        const C shift = static_cast<C>((pb == nullptr ? 0.0 : static_cast<double>(load(pb[c]))) -
                                       static_cast<double>(pmean[c]) * static_cast<double>(scale));
        const T* src = in + row * l.s;
        T* dst = out + row * l.s;
        for (int64_t k = 0; k < l.s; ++k) dst[k] = store<T>(load(src[k]) * scale + shift);
      }
    });
  });
}

void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         BatchStatistics stats, Tensor& dx, Tensor& dw, Tensor& db) {
  const Layout l = layout_of(x);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    using S = Stat<C>;
    const T* in = x.data<T>();
    const T* grad = dy.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const S* pmean = mean.data<S>();
    const S* prstd = rstd.data<S>();
    std::vector<double> sum_dy(static_cast<size_t>(l.c)), sum_dy_xhat(static_cast<size_t>(l.c));
    parallel_range(l.c, grain_for(l.n * l.s), [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const double mu = static_cast<double>(pmean[c]), inv = static_cast<double>(prstd[c]);
        double s1 = 0.0, s2 = 0.0;
        for (int64_t n = 0; n < l.n; ++n) {
          const int64_t base = (n * l.c + c) * l.s;
          const T* x_row = in + base;
          s1 += sum_over(grad + base, l.s, [](double d, int64_t) { return d; });
          s2 += sum_over(grad + base, l.s, [&](double d, int64_t k) {
            return d * (static_cast<double>(load(x_row[k])) - mu) * inv;
          });
        }
        sum_dy[static_cast<size_t>(c)] = s1;
        sum_dy_xhat[static_cast<size_t>(c)] = s2;
      }
    });
    for (int64_t c = 0; c < l.c; ++c) {
      if (dw.defined()) dw.data<T>()[c] = store<T>(static_cast<C>(sum_dy_xhat[static_cast<size_t>(c)]));
      if (db.defined()) db.data<T>()[c] = store<T>(static_cast<C>(sum_dy[static_cast<size_t>(c)]));
    }
    if (!dx.defined()) return;
    T* out = dx.data<T>();
    const double count = static_cast<double>(l.n * l.s);
    parallel_range(l.n * l.c, grain_for(l.s), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t c = row % l.c;
        const double inv = static_cast<double>(prstd[c]), wc = weight_at(pw, c);
        // dx = rstd w (dy - mean(dy) - xhat mean(dy xhat)) = a dy + b (x - mean) + k for kBatch,
        // rstd w dy for kRunning; (x - mean) first, so a large mean does not cancel.
        const double a = inv * wc;
        double bx = 0.0, k0 = 0.0;
        if (stats == BatchStatistics::kBatch) {
          bx = -a * inv * sum_dy_xhat[static_cast<size_t>(c)] / count;
          k0 = -a * sum_dy[static_cast<size_t>(c)] / count;
        }
        const C ca = static_cast<C>(a), cb = static_cast<C>(bx), ck = static_cast<C>(k0), mu = static_cast<C>(pmean[c]);
        const int64_t base = row * l.s;
        if (stats == BatchStatistics::kRunning) {  // x does not enter, so a NaN in x stays out of dx
          for (int64_t k = 0; k < l.s; ++k) out[base + k] = store<T>(ca * load(grad[base + k]));
          continue;
        }
        for (int64_t k = 0; k < l.s; ++k) {
          out[base + k] = store<T>(ca * load(grad[base + k]) + cb * (load(in[base + k]) - mu) + ck);
        }
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
