// Deterministic block reductions shared by sum_to and the losses: a fixed grid (a function of n
// only) writes one partial per block, then one block sums the partials in a fixed order. Sums are
// accumulated in double (C = double) so their error does not grow with n.
#pragma once

#include <cub/block/block_reduce.cuh>

#include "framework/allocator.h"
#include "framework/device_cuda.h"
#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"

namespace ampgrad::kernels::cuda {

inline constexpr int kReduceBlocksMax = 1024;

// Sums of each thread's a and b over a block of kThreads, returned to every thread (two
// reductions, one temp storage reused).
__device__ inline void block_sums(double& a, double& b) {
  using Reduce = cub::BlockReduce<double, ::ampgrad::cuda::kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ double result[2];
  const double sa = Reduce(temp).Sum(a);
  __syncthreads();
  const double sb = Reduce(temp).Sum(b);
  if (threadIdx.x == 0) {
    result[0] = sa;
    result[1] = sb;
  }
  __syncthreads();
  a = result[0];
  b = result[1];
}

// partials is (gridDim.x): partials[b] = sum over block b's grid-stride share of term(i), i < n.
template <typename C, typename Term>
__global__ void reduce_partials_kernel(int64_t n, Term term, C* partials) {
  using BlockReduce = cub::BlockReduce<C, ::ampgrad::cuda::kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  C acc = C(0);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    acc += term(i);
  }
  const C total = BlockReduce(temp).Sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// partials is (count), out is (1): out[0] = finish(sum of partials), one block.
template <typename C, typename T, typename Finish>
__global__ void reduce_finish_kernel(const C* partials, int count, Finish finish, T* out) {
  using BlockReduce = cub::BlockReduce<C, ::ampgrad::cuda::kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  C acc = C(0);
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const C total = BlockReduce(temp).Sum(acc);
  if (threadIdx.x == 0) out[0] = finish(total);
}

/// out[0] = finish(sum_{i<n} term(i)), accumulated in C; bit-reproducible run to run.
/// term: __device__ C operator()(int64_t i); finish: __device__ T operator()(C total).
template <typename C, typename T, typename Term, typename Finish>
void reduce_to_one(int64_t n, Term term, Finish finish, T* out) {
  using ::ampgrad::cuda::kThreads;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kReduceBlocksMax));
  const int grid = blocks < 1 ? 1 : blocks;
  Allocator& alloc = ::ampgrad::cuda::caching_allocator();
  const size_t nbytes = sizeof(C) * static_cast<size_t>(grid);
  C* partials = static_cast<C*>(alloc.allocate(nbytes));
  reduce_partials_kernel<C><<<grid, kThreads>>>(n, term, partials);
  AG_CUDA_CHECK_LAUNCH("reduce_partials_kernel");
  reduce_finish_kernel<C, T><<<1, kThreads>>>(partials, grid, finish, out);
  AG_CUDA_CHECK_LAUNCH("reduce_finish_kernel");
  alloc.deallocate(partials, nbytes);  // stream-ordered: a later user of the block runs after us
}

}  // namespace ampgrad::kernels::cuda
