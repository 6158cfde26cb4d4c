// Softmax, log_softmax and the fused cross-entropy on CUDA: one block per row, block reductions
// (CUB) for the maximum and the sum (the sum in double, as on the CPU). An out-of-range target is
// recorded on the device and read back once per call, so the error names the sample.
#include <cub/block/block_reduce.cuh>

#include <limits>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/storage_kernels.h"
#include "ops/math.h"
#include "ops/softmax/softmax_kernels.h"
#include "ops/strided.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

template <typename C>
__device__ C block_max(C v) {
  using Reduce = cub::BlockReduce<C, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ C result;
  const C m = Reduce(temp).Reduce(v, [](C a, C b) { return a > b ? a : b; });
  if (threadIdx.x == 0) result = m;
  __syncthreads();
  return result;
}

__device__ double block_sum(double v) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ double result;
  const double s = Reduce(temp).Sum(v);
  if (threadIdx.x == 0) result = s;
  __syncthreads();
  return result;
}

// x, y are (outer, size, inner): block b handles row (b / inner, :, b % inner). valid(b) columns
// take part (causal masking); the rest get 0.
template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t size, int64_t inner, bool log_kind, bool causal, int64_t tq,
                               bool zero_empty_rows) {
  using C = Compute<T>;
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * size * inner + row % inner;
  const int64_t valid = causal ? min(size, row % tq + 1) : size;
  C local_max = -std::numeric_limits<C>::infinity();
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    const C v = dload(x[base + j * inner]);
    local_max = v > local_max ? v : local_max;
  }
  const C max = block_max(local_max);
  const C shift = max == -std::numeric_limits<C>::infinity() ? C(0) : max;
  double local_sum = 0.0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
    local_sum += static_cast<double>(math::exp(dload(x[base + j * inner]) - shift));
  }
  const double sum = block_sum(local_sum);
  const C log_sum = static_cast<C>(::log(sum));
  // The sum is 0 only where every term is -inf (the maximum's own term is exp(0) = 1 otherwise).
  const C inv = zero_empty_rows && sum == 0.0 ? C(0) : static_cast<C>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
    const C v = dload(x[base + j * inner]) - shift;
    C out;
    if (log_kind) {
      out = v - log_sum;
    } else {
      out = j < valid ? math::exp(v) * inv : C(0);
    }
    y[base + j * inner] = dstore<T>(out);
  }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t size, int64_t inner, bool log_kind) {
  using C = Compute<T>;
  const int64_t row = blockIdx.x;
  const int64_t base = (row / inner) * size * inner + row % inner;
  double local = 0.0;
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
    const double g = static_cast<double>(dload(dy[base + j * inner]));
    local += log_kind ? g : g * static_cast<double>(dload(y[base + j * inner]));
  }
  const C s = static_cast<C>(block_sum(local));
  for (int64_t j = threadIdx.x; j < size; j += blockDim.x) {
    const C yj = dload(y[base + j * inner]), gj = dload(dy[base + j * inner]);
    dx[base + j * inner] = dstore<T>(log_kind ? gj - math::exp(yj) * s : yj * (gj - s));
  }
}

// One block per sample: the log-normaliser of its row (0 and 0 for log-probabilities).
template <typename T>
__device__ LogNormalizer<Compute<T>> row_log_normalizer(const T* row, int64_t classes, bool logits) {
  using C = Compute<T>;
  if (!logits) return {C(0), 0.0};
  C local_max = -std::numeric_limits<C>::infinity();
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const C v = dload(row[c]);
    local_max = v > local_max ? v : local_max;
  }
  const C max = block_max(local_max);
  const C shift = max == -std::numeric_limits<C>::infinity() ? C(0) : max;
  double local = 0.0;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) local += static_cast<double>(math::exp(dload(row[c]) - shift));
  return {shift, ::log(block_sum(local))};
}

// input is (n, classes), target/losses/valid are (n), row_lse (n, 2); bad: the first bad sample.
template <typename T>
__global__ void cross_entropy_kernel(const T* input, const int64_t* target, int64_t classes, bool logits,
                                     int64_t ignore_index, double eps, Compute<T>* losses, Compute<T>* valid,
                                     double* row_lse, unsigned long long* bad) {
  using C = Compute<T>;
  const int64_t i = blockIdx.x;
  const int64_t t = target[i];
  if (t == ignore_index || t < 0 || t >= classes) {
    if (threadIdx.x == 0) {
      losses[i] = valid[i] = C(0);
      row_lse[2 * i] = row_lse[2 * i + 1] = 0.0;
      if (t != ignore_index) atomicMin(bad, static_cast<unsigned long long>(i));
    }
    return;
  }
  const T* row = input + i * classes;
  const LogNormalizer<C> lse = row_log_normalizer(row, classes, logits);
  double local = 0.0;
  if (eps > 0) {
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) local += lse.log_prob_wide(dload(row[c]));
  }
  const double mean_log_p = block_sum(local) / static_cast<double>(classes);
  if (threadIdx.x == 0) {
    const double loss = -(1.0 - eps) * lse.log_prob_wide(dload(row[t])) - eps * mean_log_p;
    losses[i] = static_cast<C>(loss);
    valid[i] = C(1);
    row_lse[2 * i] = static_cast<double>(lse.shift);
    row_lse[2 * i + 1] = lse.log_sum;
  }
}

// One pass over each row: the forward's (shift, log_sum) give p_c without a new max and sum.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* input, const int64_t* target, int64_t classes, bool logits,
                                              int64_t ignore_index, Compute<T> eps, const double* row_lse,
                                              const Compute<T>* dlosses, T* dinput) {
  using C = Compute<T>;
  const int64_t i = blockIdx.x;
  const int64_t t = target[i];
  T* out = dinput + i * classes;
  if (t == ignore_index) {
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) out[c] = dstore<T>(C(0));
    return;
  }
  const T* row = input + i * classes;
  const LogNormalizer<C> lse{static_cast<C>(row_lse[2 * i]), row_lse[2 * i + 1]};
  const C g = dlosses[i];
  const C uniform = eps / static_cast<C>(classes);
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    C d = (logits ? math::exp(lse.log_prob(dload(row[c]))) : C(0)) - uniform;
    if (c == t) d -= C(1) - eps;
    out[c] = dstore<T>(g * d);
  }
}

unsigned grid_of(int64_t rows, const char* what) {
  AG_CHECK(rows <= 0x7fffffff, what, " (CUDA): ", rows, " rows exceed the grid limit");
  return static_cast<unsigned>(rows);
}

}  // namespace

void softmax(const Tensor& x, int64_t dim, SoftmaxKind kind, Causal causal, EmptyRows empty_rows, Tensor& y) {
  const AlongDim v = along_dim(x.shape(), dim);
  const int64_t rows = v.outer * v.inner;
  if (rows == 0 || v.size == 0) return;
  const int64_t tq = causal == Causal::kYes && x.dim() >= 2 ? x.size(-2) : 1;
  visit_floating_dtype(x.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    softmax_kernel<T><<<grid_of(rows, "softmax"), kThreads>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), v.size, v.inner,
        kind == SoftmaxKind::kLogSoftmax, causal == Causal::kYes, tq, empty_rows == EmptyRows::kZero);
    AG_CUDA_CHECK_LAUNCH("softmax_kernel");
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, SoftmaxKind kind, Tensor& dx) {
  const AlongDim v = along_dim(y.shape(), dim);
  const int64_t rows = v.outer * v.inner;
  if (rows == 0 || v.size == 0) return;
  visit_floating_dtype(y.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    softmax_backward_kernel<T><<<grid_of(rows, "softmax backward"), kThreads>>>(
        static_cast<const T*>(y.data_ptr()), static_cast<const T*>(dy.data_ptr()), static_cast<T*>(dx.data_ptr()), v.size,
        v.inner, kind == SoftmaxKind::kLogSoftmax);
    AG_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
  });
}

void cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args, Tensor& losses,
                   Tensor& valid, Tensor& row_lse) {
  const int64_t n = input.size(0), classes = input.size(1);
  if (n == 0) return;
  Allocator& alloc = caching_allocator();
  auto* bad = static_cast<unsigned long long*>(alloc.allocate(sizeof(unsigned long long)));
  AG_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), cudaStreamLegacy));  // "none": all ones
  visit_floating_dtype(input.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using C = Compute<T>;
    cross_entropy_kernel<T><<<grid_of(n, "cross_entropy"), kThreads>>>(
        static_cast<const T*>(input.data_ptr()), static_cast<const int64_t*>(target.data_ptr()), classes,
        args.scores == ClassScores::kLogits, args.ignore_index, args.label_smoothing,
        static_cast<C*>(losses.data_ptr()), static_cast<C*>(valid.data_ptr()), static_cast<double*>(row_lse.data_ptr()),
        bad);
    AG_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
  });
  // The one wait of this op: an out-of-range target must be an error, not a silent wrong loss.
  unsigned long long first_bad = 0;
  storage::copy(&first_bad, DType::kInt64, Device::kCPU, bad, DType::kInt64, Device::kCUDA, 1);
  alloc.deallocate(bad, sizeof(unsigned long long));
  if (first_bad != ~0ull) {
    int64_t value = 0;
    storage::copy(&value, DType::kInt64, Device::kCPU, static_cast<const int64_t*>(target.data_ptr()) + first_bad,
                  DType::kInt64, Device::kCUDA, 1);
    AG_FAIL("cross_entropy: target ", value, " of sample ", first_bad, " is outside [0, ", classes,
            ") and is not ignore_index (", args.ignore_index, "); hint: class indices count from 0");
  }
}

void cross_entropy_backward(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args,
                            const Tensor& row_lse, const Tensor& dlosses, Tensor& dinput) {
  const int64_t n = input.size(0), classes = input.size(1);
  if (n == 0) return;
  visit_floating_dtype(input.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using C = Compute<T>;
    cross_entropy_backward_kernel<T><<<grid_of(n, "cross_entropy backward"), kThreads>>>(
        static_cast<const T*>(input.data_ptr()), static_cast<const int64_t*>(target.data_ptr()), classes,
        args.scores == ClassScores::kLogits, args.ignore_index, static_cast<C>(args.label_smoothing),
        static_cast<const double*>(row_lse.data_ptr()), static_cast<const C*>(dlosses.data_ptr()),
        static_cast<T*>(dinput.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
  });
}

}  // namespace ampgrad::kernels::cuda
