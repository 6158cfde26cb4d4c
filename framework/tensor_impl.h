// What a Tensor handle points at: storage, shape, dtype and autograd metadata.
// Internal to ampgrad; users go through Tensor.
#pragma once

#include <memory>

#include "framework/allocator.h"
#include "framework/tensor.h"

namespace ampgrad {

/// Bytes on one device. `version` counts in-place writes, so caches and saved tensors
/// can tell when values changed under them.
struct Storage {
  Storage(size_t nbytes, Device device);  // from allocator_for(device)
  /// Page-locked host memory from `pinned_host` (Tensor::pin_memory): a CPU storage with pinned set.
  Storage(size_t nbytes, Allocator& pinned_host);
  /// nbytes of `base` from byte `offset` on: an alias that keeps base alive and frees nothing.
  Storage(std::shared_ptr<Storage> base, size_t offset, size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Allocator* allocator = nullptr;  // where data came from, and goes back to (null for an alias)
  std::shared_ptr<Storage> base;   // the storage an alias lies in (null otherwise)
  void* data = nullptr;
  size_t nbytes = 0;
  Device device = Device::kCPU;
  bool pinned = false;
  uint64_t version = 0;  // an alias counts its own writes only
};

/// A tensor of `shape` over base's elements [offset, offset + numel(shape)) (base's dtype and
/// device): writes through either are seen by the other, and it keeps base's bytes alive. Flat
/// buffers are made of these (ZeroRedundancyOptimizer lays its parameters, their shards and their
/// gradients in one per bucket, so the collectives run in place). Its version counts writes made
/// through it only: whoever writes through one bumps the others it must invalidate.
Tensor alias_elements(const Tensor& base, int64_t offset, const Shape& shape);
/// Whether t's elements are base's [offset, offset + t.numel()): same bytes, dtype and device.
bool is_alias_at(const Tensor& t, const Tensor& base, int64_t offset);
/// The allocation t's bytes lie in (an alias's base; t's own storage otherwise), and its size: what
/// memory accounting counts once.
const Storage& allocation_of(const Tensor& t);

struct PostAccumulateGradHooks;  // autograd.h
struct Float8LinearState;        // float8_scaling.h

struct TensorImpl {
  TensorImpl() = default;
  /// Frees grad_fn's graph through release_node: iteratively, however long its history.
  ~TensorImpl();
  TensorImpl(const TensorImpl&) = delete;
  TensorImpl& operator=(const TensorImpl&) = delete;

  std::shared_ptr<Storage> storage;
  Shape shape;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  Tensor grad;                     // same dtype, shape and device as this tensor
  Tensor master;                   // FP32 master copy, for lower-precision parameters an optimizer owns
  std::shared_ptr<Node> grad_fn;   // the recorded op that produced this tensor; null for leaves
  // Leaves: the backward pass that wrote grad last. GradScaler refuses a step when another
  // backward reached a parameter after unscale_ (PyTorch cannot tell; it would step on a mix).
  uint64_t grad_pass = 0;
  std::shared_ptr<PostAccumulateGradHooks> post_accumulate_grad_hooks;  // null until one is registered
  // A weight's FP8 scaling states (its linear's input, itself, its output's gradient): made by the
  // first linear that uses it inside a Float8Guard.
  std::shared_ptr<Float8LinearState> float8;
};

}  // namespace ampgrad
