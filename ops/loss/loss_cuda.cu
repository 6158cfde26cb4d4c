// Fused MSE on CUDA: the forward reduces (pred - target)^2 without a temporary; the backward
// writes dpred and dtarget in one pass, reading dloss on the device (no host sync).
#include <limits>

#include "ops/loss/loss_kernels.h"
#include "ops/reduce/reduce_cuda.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// Each squared difference in the compute type (as the CPU), summed in double.
template <typename T>
struct SquaredDiff {
  const T* p;
  const T* y;
  __device__ double operator()(int64_t i) const {
    const Compute<T> d = dload(p[i]) - dload(y[i]);
    return static_cast<double>(d * d);
  }
};

// The mean, divided in double and rounded once; the mean of nothing is NaN, as on the CPU.
template <typename T>
struct MeanFinish {
  int64_t n;
  __device__ T operator()(double total) const {
    return dconvert<T>(n == 0 ? std::numeric_limits<double>::quiet_NaN() : total / static_cast<double>(n));
  }
};

// pred, target, dpred, dtarget are (n), dloss is (1): dpred = 2 (pred - target) / n * dloss,
// dtarget = -dpred (skipped when null).
template <typename T>
__global__ void mse_backward_kernel(const T* p, const T* y, const T* dloss, T* dp, T* dt, int64_t n) {
  using C = Compute<T>;
  const C coeff = C(2) * dload(dloss[0]) / static_cast<C>(n);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const C g = coeff * (dload(p[i]) - dload(y[i]));
    dp[i] = dstore<T>(g);
    if (dt != nullptr) dt[i] = dstore<T>(-g);
  }
}

}  // namespace

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  visit_floating_dtype(loss.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    const int64_t n = pred.numel();
    reduce_to_one<double>(n, SquaredDiff<T>{static_cast<const T*>(pred.data_ptr()),
                                                static_cast<const T*>(target.data_ptr())},
                              MeanFinish<T>{n}, static_cast<T*>(loss.data_ptr()));
  });
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred, Tensor& dtarget) {
  const int64_t n = pred.numel();
  if (n == 0) return;
  visit_floating_dtype(dpred.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    T* dt = dtarget.defined() ? static_cast<T*>(dtarget.data_ptr()) : nullptr;
    mse_backward_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<const T*>(pred.data_ptr()),
                                                        static_cast<const T*>(target.data_ptr()),
                                                        static_cast<const T*>(dloss.data_ptr()),
                                                        static_cast<T*>(dpred.data_ptr()), dt, n);
    AG_CUDA_CHECK_LAUNCH("mse_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
