// Storage-level primitives the framework itself needs (dtype conversion, device transfer,
// filling, gradient accumulation). The math of ops lives in ops/. They run the storage kernel
// family (storage_kernels.h): CPU loops in copy.cc, CUDA kernels in copy_cuda.cu.
#pragma once

#include "framework/tensor.h"

namespace ampgrad {

/// dst = src, converting dtype and moving across devices as needed (same element count).
/// NonBlocking::kYes queues a copy from pinned host memory to the GPU without waiting (see
/// Tensor::to(Device, NonBlocking)); every other copy touching the host waits.
void copy_(Tensor& dst, const Tensor& src, NonBlocking non_blocking = NonBlocking::kNo);
/// Every element of dst = value (rounded to dst's dtype).
void fill_(Tensor& dst, double value);
/// dst += src (same shape, dtype, device), summed in the compute type and rounded once.
void accumulate_(Tensor& dst, const Tensor& src);

}  // namespace ampgrad
