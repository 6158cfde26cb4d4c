// Embedding on CUDA: a gather, one thread per element. The gradient sorts the positions by id
// (CUB's radix sort, which is stable), then one block per distinct id sums that id's rows in
// position order in the compute type and rounds once: no atomics, and every element is summed in
// the CPU's order, so the bits are the CPU's. (Walking all ids per column instead gives only dim
// threads: 768 for GPT-2, 3.8 ms of an H200's time per step.)
#include <cub/device/device_radix_sort.cuh>

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

// positions[i] = i.
__global__ void iota_kernel(int64_t* positions, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    positions[i] = i;
  }
}

// sorted_ids and positions are (n): the ids in ascending order and where each came from, in
// ascending position within one id. Block k starts the run of its id when it is the run's first
// entry: its threads take columns and sum the run's rows of dout in order. dweight is zeroed
// before (rows no id names keep their zeros); ids outside [0, vocab) are left out.
template <typename T>
__global__ void embedding_backward_kernel(const int64_t* sorted_ids, const int64_t* positions, const T* dout,
                                          int64_t n, int64_t vocab, int64_t dim, T* dweight) {
  const int64_t k = blockIdx.x, id = sorted_ids[k];
  if ((k > 0 && sorted_ids[k - 1] == id) || id < 0 || id >= vocab) return;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    Compute<T> sum(0);
    for (int64_t m = k; m < n && sorted_ids[m] == id; ++m) sum += dload(dout[positions[m] * dim + j]);
    dweight[id * dim + j] = dstore<T>(sum);
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
  const int64_t n = ids.numel(), vocab = dweight.size(0), dim = dweight.size(1), count = dweight.numel();
  if (count == 0) return;
  AG_CUDA_CHECK(cudaMemsetAsync(dweight.data_ptr(), 0, static_cast<size_t>(count) * element_size(dweight.dtype()),
                                cudaStreamLegacy));  // all-zero bits: +0 in every floating dtype
  if (n * dim > 0) {
    AG_CHECK(n <= int64_t{0x7fffffff}, "embedding backward (CUDA): ", n, " ids are more than one grid holds (2^31 - 1)");
    Allocator& alloc = caching_allocator();
    // One allocation for the sort's outputs and scratch: sorted ids, their positions, the
    // positions in order, then CUB's temporary storage.
    const size_t ids_bytes = sizeof(int64_t) * static_cast<size_t>(n);
    size_t scratch = 0;
    AG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch, static_cast<const int64_t*>(nullptr),
                                                  static_cast<int64_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                                  static_cast<int64_t*>(nullptr), n, 0, 64, cudaStreamLegacy));
    const size_t nbytes = 3 * ids_bytes + scratch;
    auto* block = static_cast<unsigned char*>(alloc.allocate(nbytes));
    auto* sorted_ids = reinterpret_cast<int64_t*>(block);
    auto* positions = reinterpret_cast<int64_t*>(block + ids_bytes);
    auto* in_order = reinterpret_cast<int64_t*>(block + 2 * ids_bytes);
    iota_kernel<<<blocks_for(n), kThreads>>>(in_order, n);
    AG_CUDA_CHECK_LAUNCH("iota_kernel");
    AG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(block + 3 * ids_bytes, scratch, static_cast<const int64_t*>(ids.data_ptr()),
                                                  sorted_ids, in_order, positions, n, 0, 64, cudaStreamLegacy));
    visit_floating_dtype(dweight.dtype(), [&](auto t) {
      using T = DeviceType<decltype(t)>;
      embedding_backward_kernel<T><<<static_cast<unsigned>(n), kThreads>>>(
          sorted_ids, positions, static_cast<const T*>(dout.data_ptr()), n, vocab, dim, static_cast<T*>(dweight.data_ptr()));
      AG_CUDA_CHECK_LAUNCH("embedding_backward_kernel");
    });
    alloc.deallocate(block, nbytes);  // stream-ordered: a later user of the block runs after us
  }
  dweight.bump_version();
}

}  // namespace ampgrad::kernels::cuda
