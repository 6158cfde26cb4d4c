// Multi-tensor apply on CUDA (see multi_tensor.h): the host uploads the chunk table once (through
// pinned memory, no host wait) and ONE launch walks it, block b taking chunks b, b + gridDim.x, ...,
// whatever the number and sizes of the tensors. A pass is a functor with a __device__
// operator()(const Chunk<Lists>&) that all threads of the block call together (so it may use
// shared memory and __syncthreads), each thread taking elements threadIdx.x, + blockDim.x, ...;
// a functor with a finish() gets that call once per block after its last chunk (a block's partial
// of a reduction; the grid is fixed by the table's size, so the order of the sum is too).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "framework/cuda_check.h"
#include "framework/cuda_helpers.h"
#include "framework/device_cuda.h"
#include "framework/multi_tensor.h"

namespace ampgrad::multi_tensor {

/// Blocks of a launch: one per chunk up to this cap (about 8 per SM of an H200, enough to fill
/// it); a larger table is walked with a grid-stride loop over chunks.
inline constexpr int64_t kMaxBlocks = 1024;
/// The blocks of a launch over `chunks` chunks (see kMaxBlocks).
inline unsigned int launch_blocks(size_t chunks) {
  return static_cast<unsigned int>(std::clamp<int64_t>(static_cast<int64_t>(chunks), 1, kMaxBlocks));
}

/// A device storage type as a value, for the dtype visitors' callbacks.
template <typename T>
struct TypeTag {
  using type = T;  ///< the CUDA storage type (float, __half, __nv_bfloat16, double)
};

/// In device code: fn(TypeTag<T>{}) with T the CUDA storage type of `dtype` when it is one of
/// kDTypes (a list derived from the dtype table, such as kFloatingDTypes); nothing otherwise
/// (the host refuses other dtypes first). fn is instantiated for those rows only.
template <const auto& kDTypes, size_t I = 0, typename Fn>
__device__ __forceinline__ void visit_dtype_in(DType dtype, Fn&& fn) {
  if constexpr (I < kDTypes.size()) {
    constexpr DType row = kDTypes[I];
    if (dtype == row) {
      fn(TypeTag<cuda::DeviceType<StorageType<row>>>{});
    } else {
      visit_dtype_in<kDTypes, I + 1>(dtype, fn);
    }
  }
}

/// visit_dtype_in over the floating rows (float, __half, __nv_bfloat16, double).
template <typename Fn>
__device__ __forceinline__ void visit_floating(DType dtype, Fn&& fn) {
  visit_dtype_in<kFloatingDTypes>(dtype, fn);
}

/// The kernel of apply_cuda: block b runs fn on chunks b, b + gridDim.x, ... fn may keep
/// per-thread state across its block's chunks (a partial sum) and end with finish(), which all
/// threads of the block call once after their last chunk.
template <size_t Lists, typename Fn>
__global__ void chunks_kernel(const Chunk<Lists>* chunks, int64_t count, Fn fn) {
  for (int64_t c = blockIdx.x; c < count; c += gridDim.x) {
    const Chunk<Lists> chunk = chunks[c];  // one read of the table entry, into registers
    fn(chunk);
  }
  if constexpr (requires { fn.finish(); }) fn.finish();
}

/// Per-tensor arguments beside a functor: fn(chunk, args[chunk.tensor]), the argument copied
/// into registers first (the pass's stores could alias it in global memory, so the compiler
/// would otherwise read it again for every element).
template <typename Fn, typename Arg>
struct WithArgs {
  Fn fn;            ///< the pass
  const Arg* args;  ///< one per tensor, on the device
  /// Runs the pass on one chunk with its tensor's argument.
  template <size_t Lists>
  __device__ void operator()(const Chunk<Lists>& c) const {
    const Arg arg = args[c.tensor];
    fn(c, arg);
  }
};

/// Runs fn over every chunk in one launch of `blocks` blocks (0: launch_blocks(chunks.size()))
/// on the legacy default stream; `name` names the kernel in launch errors. Does not wait.
template <size_t Lists, typename Fn>
void apply_cuda(const std::vector<Chunk<Lists>>& chunks, Fn fn, const char* name, unsigned int blocks = 0) {
  if (chunks.empty()) return;
  const size_t nbytes = chunks.size() * sizeof(Chunk<Lists>);
  auto* table = static_cast<Chunk<Lists>*>(cuda::upload_async(chunks.data(), nbytes));
  chunks_kernel<Lists><<<blocks != 0 ? blocks : launch_blocks(chunks.size()), cuda::kThreads>>>(
      table, static_cast<int64_t>(chunks.size()), fn);
  cuda::caching_allocator().deallocate(table, nbytes);  // stream-ordered: reused only after the kernel
  AG_CUDA_CHECK_LAUNCH(name);
}

/// As above with one argument per tensor (args[k] for tensor k of the lists), uploaded with the
/// table: fn(chunk, args[chunk.tensor]).
template <size_t Lists, typename Arg, typename Fn>
void apply_cuda(const std::vector<Chunk<Lists>>& chunks, const std::vector<Arg>& args, Fn fn, const char* name) {
  static_assert(!requires { fn.finish(); }, "apply_cuda: a pass with per-tensor arguments has no finish()");
  check_args(chunks, args.size());
  if (chunks.empty()) return;
  const size_t nbytes = args.size() * sizeof(Arg);
  auto* device_args = static_cast<Arg*>(cuda::upload_async(args.data(), nbytes));
  try {
    apply_cuda(chunks, WithArgs<Fn, Arg>{fn, device_args}, name);
  } catch (...) {
    cuda::caching_allocator().deallocate(device_args, nbytes);
    throw;
  }
  cuda::caching_allocator().deallocate(device_args, nbytes);  // stream-ordered, as above
}

}  // namespace ampgrad::multi_tensor
