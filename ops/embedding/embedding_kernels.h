// Embedding kernels: a gather of weight rows by int64 ids, and its scatter-add gradient.
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

// out[i, :] = weight[ids[i], :] for the n flat ids (out is [n, C] in weight's dtype). An id
// outside [0, V) throws an Error naming its position and value (on CUDA after one wait for the GPU).
namespace cpu { void embedding(const Tensor& ids, const Tensor& weight, Tensor& out); }
namespace cuda { void embedding(const Tensor& ids, const Tensor& weight, Tensor& out); }
inline void embedding(const Tensor& ids, const Tensor& weight, Tensor& out) {
  AG_ON_BACKEND(out.device(), embedding, ids, weight, out);
}

// dweight = 0, then dweight[ids[i], :] += dout[i, :] in the order of i, accumulated in float
// (double for float64) and rounded once: deterministic, whatever the backend.
namespace cpu { void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight); }
namespace cuda { void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight); }
inline void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  AG_ON_BACKEND(dweight.device(), embedding_backward, ids, dout, dweight);
}

}  // namespace ampgrad::kernels
