// Layer norm on CUDA: one block per row; the row's sums are block reductions in double, as the
// CPU's, so both backends agree to the rounding of the output.
#include <cub/block/block_reduce.cuh>

#include <type_traits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "ops/norm/norm_kernels.h"
#include "ops/reduce/reduce_cuda.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// x, y are (rows, cols); w, b are (cols) or null; mean, rstd are (rows).
template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, double eps, int64_t cols, T* y,
                                  Stat<Compute<T>>* mean, Stat<Compute<T>>* rstd) {
  using C = Compute<T>;
  const int64_t r = blockIdx.x;
  const T* row = x + r * cols;
  double sum = 0.0, unused = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += static_cast<double>(dload(row[j]));
  block_sums(sum, unused);
  const double mu = sum / static_cast<double>(cols);
  double sq = 0.0;
  unused = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double d = static_cast<double>(dload(row[j])) - mu;
    sq += d * d;
  }
  block_sums(sq, unused);
  const double inv = 1.0 / ::sqrt(sq / static_cast<double>(cols) + eps);
  const C m = static_cast<C>(mu), s = static_cast<C>(inv);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const C wj = w != nullptr ? dload(w[j]) : C(1), bj = b != nullptr ? dload(b[j]) : C(0);
    y[r * cols + j] = dstore<T>((dload(row[j]) - m) * s * wj + bj);
  }
  if (threadIdx.x == 0) {
    mean[r] = static_cast<Stat<C>>(mu);
    rstd[r] = static_cast<Stat<C>>(inv);
  }
}

template <typename T>
__global__ void layer_norm_backward_kernel(const T* x, const T* w, const Stat<Compute<T>>* mean,
                                           const Stat<Compute<T>>* rstd, const T* dy, int64_t cols, T* dx,
                                           T* dy_xhat) {
  using C = Compute<T>;
  const int64_t r = blockIdx.x;
  const C m = static_cast<C>(mean[r]), s = static_cast<C>(rstd[r]);
  double g_sum = 0.0, gx_sum = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const C xhat = (dload(x[r * cols + j]) - m) * s;
    const C d = dload(dy[r * cols + j]);
    const C g = d * (w != nullptr ? dload(w[j]) : C(1));
    g_sum += static_cast<double>(g);
    gx_sum += static_cast<double>(g) * static_cast<double>(xhat);
    if (dy_xhat != nullptr) dy_xhat[r * cols + j] = dstore<T>(d * xhat);
  }
  if (dx == nullptr) return;
  block_sums(g_sum, gx_sum);
  const C g_mean = static_cast<C>(g_sum / static_cast<double>(cols));
  const C gx_mean = static_cast<C>(gx_sum / static_cast<double>(cols));
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const C xhat = (dload(x[r * cols + j]) - m) * s;
    const C g = dload(dy[r * cols + j]) * (w != nullptr ? dload(w[j]) : C(1));
    dx[r * cols + j] = dstore<T>(s * (g - g_mean - xhat * gx_mean));
  }
}

template <typename T>
const T* maybe(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  if (rows == 0) return;
  AG_CHECK(rows <= 0x7fffffff, "layer_norm (CUDA): ", rows, " rows exceed the grid limit");
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using S = Stat<Compute<T>>;
    layer_norm_kernel<T><<<static_cast<unsigned>(rows), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), maybe<T>(w), maybe<T>(b), eps, cols, static_cast<T*>(y.data_ptr()),
        static_cast<S*>(mean.data_ptr()), static_cast<S*>(rstd.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("layer_norm_kernel");
  });
}

void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                         Tensor& dx, Tensor& dy_xhat) {
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  if (rows == 0) return;
  AG_CHECK(rows <= 0x7fffffff, "layer_norm backward (CUDA): ", rows, " rows exceed the grid limit");
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using S = Stat<Compute<T>>;
    layer_norm_backward_kernel<T><<<static_cast<unsigned>(rows), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), maybe<T>(w), static_cast<const S*>(mean.data_ptr()),
        static_cast<const S*>(rstd.data_ptr()), static_cast<const T*>(dy.data_ptr()), cols,
        dx.defined() ? static_cast<T*>(dx.data_ptr()) : nullptr,
        dy_xhat.defined() ? static_cast<T*>(dy_xhat.data_ptr()) : nullptr);
    AG_CUDA_CHECK_LAUNCH("layer_norm_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
