// Fused attention (the FlashAttention-2 algorithm): softmax(q k^T * scale [causal]) v without
// the [Tq, Tk] scores in memory. The forward walks key/value tiles for each query tile with an
// online softmax in float32 and keeps only the output and each query row's log-sum-exp; the
// backward recomputes the probabilities tile by tile from it. Callers have checked
// shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

/// q [batch, Tq, D], k [batch, Tk, D], v [batch, Tk, Dv] (the batch dimensions flattened), one
/// dtype (float32, float16 or bfloat16), contiguous; Tk >= 1. Causal masking is top-left aligned
/// (key j is left out of query i's row when j > i), as PyTorch's is_causal.
struct AttentionShape {
  int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  bool causal = false;
  double scale = 1.0;  // the scores' factor, 1 / sqrt(D)
};

/// CUDA's fused kernels stage tiles of q, k, v (and their gradients) in shared memory: head sizes
/// up to this; larger ones run the composed path there.
inline constexpr int64_t kMaxFusedHeadSize = 128;

// out [batch, Tq, Dv] in q's dtype; lse [batch, Tq, 2] float32: each row's log-normaliser for the
// backward, in two parts (the row maximum m of the scaled, masked scores s and log sum_j exp(s_j -
// m)), so that p = exp((s - m) - log_sum) never rounds m + log_sum at the scores' magnitude. The
// CPU takes float32, float16 and bfloat16; CUDA float16 and bfloat16 (tensor cores), D, Dv <=
// kMaxFusedHeadSize.
namespace cpu {
void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape, Tensor& out,
                     Tensor& lse);
}
namespace cuda {
void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape, Tensor& out,
                     Tensor& lse);
}
inline void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape,
                            Tensor& out, Tensor& lse) {
  AG_ON_BACKEND(q.device(), flash_attention, q, k, v, shape, out, lse);
}

// dq, dk, dv (q's, k's, v's shapes and dtype) from the forward's out and lse and the output's
// gradient dout: dv = P^T dout, dS = P (dout v^T - rowsum(dout out)), dq = dS k scale,
// dk = dS^T q scale, with P recomputed tile by tile. Each is summed in float32 and rounded once
// (CUDA's tensor cores take P and dS rounded to the inputs' dtype, as FlashAttention's); no
// atomics on either backend, so the gradients are deterministic.
namespace cpu {
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionShape& shape, Tensor& dq, Tensor& dk, Tensor& dv);
}
namespace cuda {
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionShape& shape, Tensor& dq, Tensor& dk, Tensor& dv);
}
inline void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, const AttentionShape& shape, Tensor& dq,
                                     Tensor& dk, Tensor& dv) {
  AG_ON_BACKEND(q.device(), flash_attention_backward, q, k, v, out, lse, dout, shape, dq, dk, dv);
}

}  // namespace ampgrad::kernels
