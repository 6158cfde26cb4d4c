// Multi-tensor apply (the design of PyTorch's foreach kernels and Apex's multi_tensor_apply): a
// pass over many tensors at once, e.g. every gradient of a model, is cut into chunks of equal size
// across lists of tensor lists, and one call walks the chunk table: on the CPU the pool takes one
// chunk at a time, on CUDA one launch walks the uploaded table (multi_tensor_cuda.h). A pass
// (unscale, the squared norm and the clipping of gradients, an optimizer update) is a functor over
// one chunk; `tensor` in the chunk says which tensor it belongs to, so per-tensor arguments (a
// parameter's step count, its group's learning rate) and per-tensor results (gradient counts) are
// found by index. The chunk size is fixed by the backend alone, so a pass's result does not depend
// on the thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/tensor.h"

namespace ampgrad::multi_tensor {

/// Lists[l][k] is tensor k of list l (a gradient list, its output list, ...). Every list has one
/// entry per tensor; an undefined entry means the pass has no such tensor there (a parameter
/// without a momentum buffer, or without a rounded copy).
template <size_t Lists>
using TensorLists = std::array<std::vector<Tensor>, Lists>;

/// One piece of a pass: n consecutive elements of tensor `tensor` in every list, at data[l]
/// (already offset to the chunk's first element; null where list l has no tensor) of dtype[l].
/// A plain struct, so CUDA kernels read it from the uploaded table as the CPU does from the vector.
template <size_t Lists>
struct Chunk {
  void* data[Lists];   ///< list l's tensor at the chunk's first element, or null where there is none
  DType dtype[Lists];  ///< list l's dtype (float32 where there is no tensor)
  int64_t n;           ///< elements in the chunk
  int64_t start;       ///< its first element's index in the tensor (keys counter-based random bits)
  int32_t tensor;      ///< the tensor's position in the lists
};

/// Elements per chunk. On the CPU a chunk is one task of the pool, so it is the element-wise grain
/// (below it waking a helper costs more than it saves); on CUDA it is one block's work (64 per
/// thread of a 256-thread block, kCudaChunkElements).
inline constexpr int64_t kCpuChunkElements = kElementwiseGrain;
inline constexpr int64_t kCudaChunkElements = 16384;  ///< the CUDA chunk: one block's work
/// The chunk size of a pass on `device`.
inline int64_t chunk_elements(Device device) {
  return device == Device::kCUDA ? kCudaChunkElements : kCpuChunkElements;
}

/// The chunk table of `lists` for a pass on `device`, in tensor order. Checked: every list has one
/// entry per tensor, list 0 has every tensor, and each tensor has list 0's element count and
/// device in every list that has it. `who` names the pass in errors.
template <size_t Lists>
std::vector<Chunk<Lists>> make_chunks(const char* who, const TensorLists<Lists>& lists, Device device) {
  const size_t count = lists[0].size();
  for (size_t l = 1; l < Lists; ++l) {
    AG_CHECK(lists[l].size() == count, who, ": list ", l, " has ", lists[l].size(), " tensors, list 0 has ", count);
  }
  AG_CHECK(count <= size_t{INT32_MAX}, who, ": ", count, " tensors in one pass (at most ", INT32_MAX, ")");
  const int64_t per_chunk = chunk_elements(device);
  std::vector<Chunk<Lists>> chunks;
  for (size_t k = 0; k < count; ++k) {
    const Tensor& first = lists[0][k];
    AG_CHECK(first.defined(), who, ": tensor ", k, " of list 0 is undefined");
    const int64_t n = first.numel();
    Chunk<Lists> base{};
    base.tensor = static_cast<int32_t>(k);
    for (size_t l = 0; l < Lists; ++l) {
      const Tensor& t = lists[l][k];
      base.dtype[l] = t.defined() ? t.dtype() : DType::kFloat32;
      if (!t.defined()) continue;
      AG_CHECK(t.numel() == n && t.device() == device, who, ": tensor ", k, " is ", t.to_string(), " in list ", l,
               l == 0 ? "" : " but " + first.to_string() + " in list 0",
               "; hint: every list needs the same sizes, all on ", device);
      base.data[l] = const_cast<void*>(t.data_ptr());  // the pass writes the lists it was given to write
    }
    for (int64_t start = 0; start < n; start += per_chunk) {
      Chunk<Lists> c = base;
      c.n = std::min(per_chunk, n - start);
      c.start = start;
      for (size_t l = 0; l < Lists; ++l) {
        if (c.data[l] != nullptr) c.data[l] = static_cast<char*>(c.data[l]) + start * element_size(c.dtype[l]);
      }
      chunks.push_back(c);
    }
  }
  return chunks;
}

/// Throws unless there is an argument for every tensor the chunks name (their tensors ascend).
template <size_t Lists>
void check_args(const std::vector<Chunk<Lists>>& chunks, size_t args) {
  AG_CHECK(chunks.empty() || static_cast<size_t>(chunks.back().tensor) < args, "multi-tensor apply: ", args,
           " per-tensor arguments for ", chunks.back().tensor + 1, " tensors");
}

/// Element l of a chunk as a T* (T the storage type of the chunk's dtype[l]).
template <typename T, size_t Lists>
T* chunk_data(const Chunk<Lists>& c, size_t l) {
  return static_cast<T*>(c.data[l]);
}

/// Runs fn(chunk) for every chunk on the CPU pool, one chunk per task; on the calling thread alone
/// when the whole table is less than two chunks' worth of elements (as parallel_range does). fn
/// must be safe to run concurrently on different chunks; it gets a reference into `chunks`, so
/// `&chunk - chunks.data()` is the chunk's position (where it may store a partial result).
template <size_t Lists, typename Fn>
void apply_cpu(const std::vector<Chunk<Lists>>& chunks, Fn&& fn) {
  int64_t total = 0;
  for (const Chunk<Lists>& c : chunks) total += c.n;
  if (chunks.size() < 2 || total < 2 * kCpuChunkElements || num_threads() == 1) {
    for (const Chunk<Lists>& c : chunks) fn(c);
    return;
  }
  parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t i) { fn(chunks[static_cast<size_t>(i)]); });
}

/// As above with one argument per tensor (args[k] for tensor k of the lists): fn(chunk, args[chunk.tensor]).
template <size_t Lists, typename Arg, typename Fn>
void apply_cpu(const std::vector<Chunk<Lists>>& chunks, const std::vector<Arg>& args, Fn&& fn) {
  check_args(chunks, args.size());
  apply_cpu(chunks, [&](const Chunk<Lists>& c) { fn(c, args[static_cast<size_t>(c.tensor)]); });
}

}  // namespace ampgrad::multi_tensor
