// Layer norm on the CPU: one row at a time (widened to the compute type), rows spread over the pool.
#include <algorithm>
#include <cmath>
#include <vector>

#include "framework/parallel.h"
#include "ops/lane_sum_cpu.h"
#include "ops/norm/norm_kernels.h"

namespace ampgrad::kernels::cpu {

namespace {

template <typename T, typename C>
void widen(const T* src, int64_t n, C* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = load(src[j]);
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    using S = Stat<C>;
    const T* in = x.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const T* pb = b.defined() ? b.data<T>() : nullptr;
    T* out = y.data<T>();
    S* pmean = mean.data<S>();
    S* prstd = rstd.data<S>();
    parallel_range(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<C> row(static_cast<size_t>(cols)), weight(static_cast<size_t>(cols), C(1)), bias(static_cast<size_t>(cols), C(0));
      if (pw != nullptr) widen(pw, cols, weight.data());
      if (pb != nullptr) widen(pb, cols, bias.data());
      for (int64_t r = lo; r < hi; ++r) {
        widen(in + r * cols, cols, row.data());
        const C* v = row.data();
        const double sum = lane_sum<8>(cols, [v](int64_t j) { return static_cast<double>(v[j]); });
        const double mu = sum / static_cast<double>(cols);
        const double sq = lane_sum<8>(cols, [v, mu](int64_t j) {
          const double d = static_cast<double>(v[j]) - mu;
          return d * d;
        });
        const double inv = 1.0 / std::sqrt(sq / static_cast<double>(cols) + eps);
        const C m = static_cast<C>(mu), s = static_cast<C>(inv);
        for (int64_t j = 0; j < cols; ++j) {
          const size_t k = static_cast<size_t>(j);
          out[r * cols + j] = store<T>((row[k] - m) * s * weight[k] + bias[k]);
        }
        pmean[r] = static_cast<S>(mu);
        prstd[r] = static_cast<S>(inv);
      }
    });
  });
}

void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         Tensor& dx, Tensor& dy_xhat) {
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    using C = ComputeType<T>;
    using S = Stat<C>;
    const T* in = x.data<T>();
    const T* pdy = dy.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const S* pmean = mean.data<S>();
    const S* prstd = rstd.data<S>();
    T* pdx = dx.defined() ? dx.data<T>() : nullptr;
    T* pdyx = dy_xhat.defined() ? dy_xhat.data<T>() : nullptr;
    parallel_range(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(cols, 1)), [&](int64_t lo, int64_t hi) {
      std::vector<C> xhat(static_cast<size_t>(cols)), g(static_cast<size_t>(cols)), weight(static_cast<size_t>(cols), C(1));
      if (pw != nullptr) widen(pw, cols, weight.data());
      for (int64_t r = lo; r < hi; ++r) {
        const C m = static_cast<C>(pmean[r]), s = static_cast<C>(prstd[r]);
        for (int64_t j = 0; j < cols; ++j) {
          const size_t k = static_cast<size_t>(j);
          xhat[k] = (load(in[r * cols + j]) - m) * s;
          const C d = load(pdy[r * cols + j]);
          g[k] = d * weight[k];
          if (pdyx != nullptr) pdyx[r * cols + j] = store<T>(d * xhat[k]);
        }
        if (pdx == nullptr) continue;
        const C *pg = g.data(), *px = xhat.data();
        const double g_sum = lane_sum<8>(cols, [pg](int64_t j) { return static_cast<double>(pg[j]); });
        const double gx_sum =
            lane_sum<8>(cols, [pg, px](int64_t j) { return static_cast<double>(pg[j]) * static_cast<double>(px[j]); });
        const C g_mean = static_cast<C>(g_sum / static_cast<double>(cols));
        const C gx_mean = static_cast<C>(gx_sum / static_cast<double>(cols));
        for (int64_t j = 0; j < cols; ++j) {
          const size_t k = static_cast<size_t>(j);
          pdx[r * cols + j] = store<T>(s * (g[k] - g_mean - xhat[k] * gx_mean));
        }
      }
    });
  });
}

}  // namespace ampgrad::kernels::cpu
