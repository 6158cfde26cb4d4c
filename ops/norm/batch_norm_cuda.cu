// Batch norm on CUDA: one block per channel for the statistics and the backward (block reductions
// in double over the channel's N x S elements, as the CPU's), one thread per channel for the
// finalize, and an element-wise apply.
#include <cub/block/block_reduce.cuh>

#include <type_traits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/norm/norm_kernels.h"
#include "ops/reduce/reduce_cuda.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// The offset in x (N, C, S) of element e of channel c's N x S elements (sample e / S, position e % S).
__device__ __forceinline__ int64_t channel_offset(int64_t e, int64_t c, int64_t channels, int64_t inner) {
  return ((e / inner) * channels + c) * inner + e % inner;
}

// x is (N, C, S); mean, var are (C). Block c: mean, then the biased variance about it.
template <typename T>
__global__ void batch_norm_stats_kernel(const T* x, int64_t batch, int64_t channels, int64_t inner,
                                        Stat<Compute<T>>* mean, Stat<Compute<T>>* var) {
  const int64_t c = blockIdx.x, count = batch * inner;
  double sum = 0.0, unused = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    sum += static_cast<double>(dload(x[channel_offset(e, c, channels, inner)]));
  }
  block_sums(sum, unused);
  const double mu = sum / static_cast<double>(count);
  double sq = 0.0;
  unused = 0.0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const double d = static_cast<double>(dload(x[channel_offset(e, c, channels, inner)])) - mu;
    sq += d * d;
  }
  block_sums(sq, unused);
  if (threadIdx.x == 0) {
    mean[c] = static_cast<Stat<Compute<T>>>(mu);
    var[c] = static_cast<Stat<Compute<T>>>(sq / static_cast<double>(count));
  }
}

// var, rstd are (C): rstd = 1 / sqrt(var + eps), in double.
template <typename S>
__global__ void batch_norm_rstd_kernel(const S* var, double eps, int64_t channels, S* rstd) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    rstd[c] = static_cast<S>(1.0 / ::sqrt(static_cast<double>(var[c]) + eps));
  }
}

// batch, running are (C): running = (1 - momentum) running + momentum factor batch, in double,
// rounded once to running's dtype.
template <typename S, typename R>
__global__ void running_update_kernel(const S* batch, double momentum, double factor, int64_t channels, R* running) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    const double old = static_cast<double>(dload(running[c]));
    running[c] = dconvert<R>((1.0 - momentum) * old + momentum * factor * static_cast<double>(batch[c]));
  }
}

// x, y are (N, C, S), n elements; mean, rstd are (C); w, b are (C) or null. As the CPU, one
// multiply-add per value: y = x scale + shift, scale = rstd w and shift = b - mean scale (in double,
// rounded to the compute type).
template <typename T>
__global__ void batch_norm_apply_kernel(const T* x, const Stat<Compute<T>>* mean, const Stat<Compute<T>>* rstd,
                                        const T* w, const T* b, int64_t n, int64_t channels, int64_t inner, T* y) {
  using C = Compute<T>;
  unrolled_loop<T>(n, [&](int64_t i) { return x[i]; },
                   [&](int64_t i, T v) {
                     const int64_t c = (i / inner) % channels;
                     const double wc = w != nullptr ? static_cast<double>(dload(w[c])) : 1.0;
                     const double bc = b != nullptr ? static_cast<double>(dload(b[c])) : 0.0;
                     const C scale = static_cast<C>(static_cast<double>(rstd[c]) * wc);
                     const C shift = static_cast<C>(bc - static_cast<double>(mean[c]) * static_cast<double>(scale));
                     y[i] = dstore<T>(dload(v) * scale + shift);
                   });
}

// x, dy, dx are (N, C, S); mean, rstd are (C); w, dw, db are (C) or null. Block c sums dy and
// dy xhat over its channel in double (when an output needs them), writes dw and db, then dx as the
// CPU: dx = a dy + b (x - mean) + k with a = rstd w, and for batch statistics
// b = -a rstd sum(dy xhat) / count, k = -a sum(dy) / count ((x - mean) first, so a large mean
// does not cancel).
template <typename T>
__global__ void batch_norm_backward_kernel(const T* x, const T* dy, const Stat<Compute<T>>* mean,
                                           const Stat<Compute<T>>* rstd, const T* w, bool batch_stats, bool need_sums,
                                           int64_t batch, int64_t channels, int64_t inner, T* dx, T* dw, T* db) {
  using C = Compute<T>;
  const int64_t c = blockIdx.x, count = batch * inner;
  const double mu = static_cast<double>(mean[c]), inv = static_cast<double>(rstd[c]);
  double dy_sum = 0.0, dy_xhat_sum = 0.0;
  if (need_sums) {  // the same for every block
    for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
      const int64_t at = channel_offset(e, c, channels, inner);
      const double d = static_cast<double>(dload(dy[at]));
      dy_sum += d;
      dy_xhat_sum += d * (static_cast<double>(dload(x[at])) - mu) * inv;
    }
    block_sums(dy_sum, dy_xhat_sum);
    if (threadIdx.x == 0) {
      if (dw != nullptr) dw[c] = dstore<T>(static_cast<C>(dy_xhat_sum));
      if (db != nullptr) db[c] = dstore<T>(static_cast<C>(dy_sum));
    }
  }
  if (dx == nullptr) return;
  const double a = inv * (w != nullptr ? static_cast<double>(dload(w[c])) : 1.0);
  double bx = 0.0, k0 = 0.0;
  if (batch_stats) {
    bx = -a * inv * dy_xhat_sum / static_cast<double>(count);
    k0 = -a * dy_sum / static_cast<double>(count);
  }
  const C ca = static_cast<C>(a), cb = static_cast<C>(bx), ck = static_cast<C>(k0), cm = static_cast<C>(mu);
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t at = channel_offset(e, c, channels, inner);
    // Running statistics: dx = rstd w dy alone (x does not enter, so a NaN in x stays out of dx).
    dx[at] = batch_stats ? dstore<T>(ca * dload(dy[at]) + cb * (dload(x[at]) - cm) + ck) : dstore<T>(ca * dload(dy[at]));
  }
}

template <typename T>
const T* maybe(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

template <typename T>
T* maybe_mut(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// x viewed as [N, C, S].
struct Dims {
  int64_t batch, channels, inner;
};

Dims dims_of(const Tensor& x) {
  const int64_t batch = x.size(0), channels = x.size(1);
  const int64_t inner = batch * channels == 0 ? 0 : x.numel() / (batch * channels);
  return {batch, channels, inner};
}

// fn(S{}) for the statistics' dtype (float32 or float64).
template <typename Fn>
void visit_stat_dtype(DType dtype, const char* op, Fn&& fn) {
  if (dtype == DType::kFloat64) {
    fn(double{});
  } else {
    AG_CHECK(dtype == DType::kFloat32, op, " (CUDA): statistics must be float32 or float64, got ",
             dtype_name(dtype));
    fn(float{});
  }
}

// running ([C], any floating dtype), when defined, updated from batch ([C], the statistics' S).
template <typename S>
void update_running(const S* batch, double momentum, double factor, int64_t channels, Tensor& running) {
  if (!running.defined()) return;
  visit_floating_dtype(running.dtype(), [&](auto t) {
    using R = DeviceType<decltype(t)>;
    running_update_kernel<S, R><<<blocks_for(channels), kThreads>>>(batch, momentum, factor, channels,
                                                                      static_cast<R*>(running.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("running_update_kernel");
  });
}

}  // namespace

void batch_norm_stats(const Tensor& x, Tensor& mean, Tensor& var) {
  const Dims d = dims_of(x);
  if (d.channels == 0) return;  // (no samples: 0 / 0, NaN statistics, as the CPU)
  AG_CHECK(d.channels <= 0x7fffffff, "batch_norm (CUDA): ", d.channels, " channels exceed the grid limit");
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using S = Stat<Compute<T>>;
    batch_norm_stats_kernel<T><<<static_cast<unsigned>(d.channels), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), d.batch, d.channels, d.inner, static_cast<S*>(mean.data_ptr()),
        static_cast<S*>(var.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("batch_norm_stats_kernel");
  });
}

void batch_norm_finalize(const Tensor& mean, const Tensor& var, double eps, RunningUpdate update,
                         Tensor& running_mean, Tensor& running_var, Tensor& rstd) {
  const int64_t channels = rstd.numel();
  if (channels == 0) return;
  visit_stat_dtype(var.dtype(), "batch_norm_finalize", [&](auto t) {
    using S = decltype(t);
    const S* pvar = static_cast<const S*>(var.data_ptr());
    batch_norm_rstd_kernel<S><<<blocks_for(channels), kThreads>>>(pvar, eps, channels,
                                                                   static_cast<S*>(rstd.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("batch_norm_rstd_kernel");
    update_running(static_cast<const S*>(mean.data_ptr()), update.momentum, 1.0, channels, running_mean);
    update_running(pvar, update.momentum, update.unbias, channels, running_var);
  });
}

void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w, const Tensor& b,
                      Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const Dims d = dims_of(x);
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using S = Stat<Compute<T>>;
    batch_norm_apply_kernel<T><<<blocks_for(n, kUnroll), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const S*>(mean.data_ptr()),
        static_cast<const S*>(rstd.data_ptr()), maybe<T>(w), maybe<T>(b), n, d.channels, d.inner,
        static_cast<T*>(y.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("batch_norm_apply_kernel");
  });
}

void batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                         BatchStatistics stats, Tensor& dx, Tensor& dw, Tensor& db) {
  if (x.numel() == 0) {  // no terms: the parameters' gradients are zero
    for (Tensor* grad : {&dw, &db}) {
      if (grad->defined() && grad->numel() > 0) {
        const size_t nbytes = static_cast<size_t>(grad->numel()) * element_size(grad->dtype());
        AG_CUDA_CHECK(cudaMemsetAsync(grad->data_ptr(), 0, nbytes, cudaStreamLegacy));
      }
    }
    return;
  }
  const bool batch_stats = stats == BatchStatistics::kBatch;
  const bool need_sums = dw.defined() || db.defined() || (dx.defined() && batch_stats);
  if (!need_sums && !dx.defined()) return;
  const Dims d = dims_of(x);
  AG_CHECK(d.channels <= 0x7fffffff, "batch_norm backward (CUDA): ", d.channels, " channels exceed the grid limit");
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using S = Stat<Compute<T>>;
    batch_norm_backward_kernel<T><<<static_cast<unsigned>(d.channels), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(dy.data_ptr()),
        static_cast<const S*>(mean.data_ptr()), static_cast<const S*>(rstd.data_ptr()), maybe<T>(w), batch_stats,
        need_sums, d.batch, d.channels, d.inner, maybe_mut<T>(dx), maybe_mut<T>(dw), maybe_mut<T>(db));
    AG_CUDA_CHECK_LAUNCH("batch_norm_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
