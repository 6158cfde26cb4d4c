// sum_to on CUDA: to one element with a deterministic CUB block reduction (ops/cuda/reduce_cuda.h),
// to a trailing row with one thread per column. Accumulates in float (double for float64).
#include "ops/reduce_kernels.h"
#include "ops/reduce_cuda.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

template <typename T>
struct LoadTerm {
  const T* x;
  __device__ Compute<T> operator()(int64_t i) const { return dload(x[i]); }
};

// alpha is applied in double and rounded once, as on the CPU.
template <typename T>
struct ScaleFinish {
  double alpha;
  __device__ T operator()(Compute<T> total) const { return dstore<T>(static_cast<Compute<T>>(alpha * total)); }
};

// x is (rows, cols), out is (cols): out[j] = alpha * sum_r x[r, j]; adjacent threads read adjacent columns.
template <typename T>
__global__ void sum_columns_kernel(const T* x, int64_t rows, int64_t cols, double alpha, T* out) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < cols; j += int64_t{gridDim.x} * blockDim.x) {
    Compute<T> acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += dload(x[r * cols + j]);
    out[j] = dstore<T>(static_cast<Compute<T>>(alpha * acc));
  }
}

}  // namespace

void sum_to(const Tensor& x, double alpha, Tensor& out) {
  const int64_t cols = out.numel();
  if (cols == 0) return;
  const int64_t rows = x.numel() / cols;
  visit_dtype(out.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    const T* in = static_cast<const T*>(x.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    if (cols == 1) {
      reduce_to_one<Compute<T>>(rows, LoadTerm<T>{in}, ScaleFinish<T>{alpha}, o);
    } else {
      sum_columns_kernel<T><<<blocks_for(cols), kThreads>>>(in, rows, cols, alpha, o);
      AG_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ampgrad::kernels::cuda
