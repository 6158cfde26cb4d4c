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
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Allocator* allocator = nullptr;  // where data came from, and goes back to
  void* data = nullptr;
  size_t nbytes = 0;
  Device device = Device::kCPU;
  bool pinned = false;
  uint64_t version = 0;
};

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
