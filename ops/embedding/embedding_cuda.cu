// Embedding on CUDA: a gather, one thread per element; the gradient with one thread per column
// walking the ids in order (no atomics, so it is deterministic), summed in the compute type.
#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/storage_kernels.h"
#include "framework/error.h"
#include "ops/embedding/embedding_kernels.h"

namespace ampgrad::kernels::cuda {

namespace {

using namespace ::ampgrad::cuda;  // the device helpers of framework/cuda_helpers.h

// ids is (n), weight is (vocab, dim), out is (n, dim); bad is (1): the first bad position.
template <typename T>
__global__ void embedding_kernel(const int64_t* ids, const T* weight, int64_t n, int64_t vocab, int64_t dim, T* out,
                                 unsigned long long* bad) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n * dim; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = k / dim, j = k % dim, id = ids[i];
    if (id < 0 || id >= vocab) {
      atomicMin(bad, static_cast<unsigned long long>(i));
      out[k] = dstore<T>(Compute<T>(0));
    } else {
      out[k] = weight[id * dim + j];
    }
  }
}

// acc is (vocab, dim) in the compute type, zeroed before; thread j owns column j and adds every
// row in order.
template <typename T>
__global__ void embedding_backward_kernel(const int64_t* ids, const T* dout, int64_t n, int64_t dim, Compute<T>* acc) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < dim; j += int64_t{gridDim.x} * blockDim.x) {
    for (int64_t i = 0; i < n; ++i) acc[ids[i] * dim + j] += dload(dout[i * dim + j]);
  }
}

// acc and dweight are (count): dweight = acc, rounded once.
template <typename T>
__global__ void round_kernel(const Compute<T>* acc, int64_t count, T* dweight) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < count; k += int64_t{gridDim.x} * blockDim.x) {
    dweight[k] = dstore<T>(acc[k]);
  }
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& weight, Tensor& out) {
  const int64_t n = ids.numel(), vocab = weight.size(0), dim = weight.size(1);
  if (n * dim == 0) return;
  Allocator& alloc = caching_allocator();
  auto* bad = static_cast<unsigned long long*>(alloc.allocate(sizeof(unsigned long long)));
  AG_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), cudaStreamLegacy));  // "none": all ones
  visit_floating_dtype(weight.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    embedding_kernel<T><<<blocks_for(n * dim), kThreads>>>(static_cast<const int64_t*>(ids.data_ptr()),
                                                            static_cast<const T*>(weight.data_ptr()), n, vocab, dim,
                                                            static_cast<T*>(out.data_ptr()), bad);
    AG_CUDA_CHECK_LAUNCH("embedding_kernel");
  });
  // The one wait of this op: an out-of-range id must be an error, not a silent zero row.
  unsigned long long first_bad = 0;
  storage::copy(&first_bad, DType::kInt64, Device::kCPU, bad, DType::kInt64, Device::kCUDA, 1);
  alloc.deallocate(bad, sizeof(unsigned long long));
  if (first_bad != ~0ull) {
    int64_t value = 0;
    storage::copy(&value, DType::kInt64, Device::kCPU, static_cast<const int64_t*>(ids.data_ptr()) + first_bad,
                  DType::kInt64, Device::kCUDA, 1);
    AG_FAIL("embedding: id ", value, " at position ", first_bad, " is outside [0, ", vocab, ") for weight ",
            weight.to_string());
  }
  out.bump_version();
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  const int64_t n = ids.numel(), dim = dweight.size(1), count = dweight.numel();
  if (count == 0) return;
  visit_floating_dtype(dweight.dtype(), [&](auto t) {
    using T = DeviceType<decltype(t)>;
    using C = Compute<T>;
    Allocator& alloc = caching_allocator();
    const size_t nbytes = sizeof(C) * static_cast<size_t>(count);
    C* acc = static_cast<C*>(alloc.allocate(nbytes));
    AG_CUDA_CHECK(cudaMemsetAsync(acc, 0, nbytes, cudaStreamLegacy));
    if (n * dim > 0) {
      embedding_backward_kernel<T><<<blocks_for(dim), kThreads>>>(static_cast<const int64_t*>(ids.data_ptr()),
                                                                   static_cast<const T*>(dout.data_ptr()), n, dim, acc);
      AG_CUDA_CHECK_LAUNCH("embedding_backward_kernel");
    }
    round_kernel<T><<<blocks_for(count), kThreads>>>(acc, count, static_cast<T*>(dweight.data_ptr()));
    AG_CUDA_CHECK_LAUNCH("round_kernel");
    alloc.deallocate(acc, nbytes);  // stream-ordered: a later user of the block runs after us
  });
  dweight.bump_version();
}

}  // namespace ampgrad::kernels::cuda
