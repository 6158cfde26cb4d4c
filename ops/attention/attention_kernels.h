// Fused attention (the FlashAttention-2 algorithm): dropout(softmax(q k^T * scale [causal])) v
// without the [Tq, Tk] scores in memory. The forward walks key/value tiles for each query tile with an
// online softmax in float32 and keeps only the output and each query row's log-sum-exp; the
// backward recomputes the probabilities tile by tile from it. Callers have checked
// shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/cpu_features.h"
#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

/// Where the rows of one operand's matrices lie in its tensor: batch entry b is head b % heads of
/// sequence b / heads, and its row r starts `at(b, r)` elements into the data. contiguous() is a
/// [batch, rows, cols] tensor; packed() is one of H heads of width D side by side in the rows of a
/// [B, T, width] tensor (q, k or v in the fused qkv projection's output, or the merged output), so
/// attention reads and writes them where they lie instead of splitting and merging the heads.
struct RowLayout {
  int64_t heads = 1, sequence_stride = 0, head_stride = 0, row_stride = 0, offset = 0;

  AG_HOST_DEVICE int64_t at(int64_t b, int64_t row) const {
    return offset + b / heads * sequence_stride + b % heads * head_stride + row * row_stride;
  }
  static RowLayout contiguous(int64_t rows, int64_t cols) {
    return {.heads = 1, .sequence_stride = rows * cols, .head_stride = 0, .row_stride = cols, .offset = 0};
  }
  /// Head h of sequence s at columns [offset + h d, offset + (h + 1) d) of rows of `width`.
  static RowLayout packed(int64_t heads, int64_t rows, int64_t width, int64_t d, int64_t offset) {
    return {.heads = heads, .sequence_stride = rows * width, .head_stride = d, .row_stride = width, .offset = offset};
  }
};

/// q [batch, Tq, D], k [batch, Tk, D], v [batch, Tk, Dv] (the batch dimensions flattened), one
/// dtype (float32, float16 or bfloat16); Tk >= 1. Causal masking is top-left aligned (key j is
/// left out of query i's row when j > i), as PyTorch's is_causal. The layouts say where each
/// operand's rows lie (dq, dk, dv as q, k, v; dout as out); lse is always [batch, Tq, 2].
struct AttentionShape {
  int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  bool causal = false;
  double scale = 1.0;  // the scores' factor, 1 / sqrt(D) by default
  // Dropout on the probabilities: P[b, i, j] is kept (and scaled by 1 / (1 - p)) where
  // dropout_uniform(dropout_seed, (b Tq + i) Tk + j) >= dropout_p, ops::dropout's mask over a
  // contiguous [batch, Tq, Tk]. The CPU's kernels only; 0: none.
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  RowLayout q{}, k{}, v{}, out{};  // where each operand's rows lie (with_contiguous_layouts, or views)

  /// Every operand a contiguous [batch, rows, cols] tensor.
  AttentionShape with_contiguous_layouts() const {
    AttentionShape s = *this;
    s.q = RowLayout::contiguous(tq, d);
    s.k = RowLayout::contiguous(tk, d);
    s.v = RowLayout::contiguous(tk, dv);
    s.out = RowLayout::contiguous(tq, dv);
    return s;
  }
};

/// CUDA's fused kernels stage tiles of q, k, v (and their gradients) in shared memory: head sizes
/// up to this; larger ones run the composed path there.
inline constexpr int64_t kMaxFusedHeadSize = 128;

// out [batch, Tq, Dv] in q's dtype (q, k, v and out may be one tensor's parts, as the layouts
// say); lse [batch, Tq, 2] float32: each row's log-normaliser for the backward, in two parts (the
// row maximum m of the scaled, masked scores s and log sum_j exp(s_j - m)), so that
// p = exp((s - m) - log_sum) never rounds m + log_sum at the scores' magnitude. The CPU takes
// float32, float16 and bfloat16; CUDA float16 and bfloat16 (tensor cores), D, Dv <=
// kMaxFusedHeadSize. On the CPU, `isa` caps the level of the loops between the tile products as it
// caps the unary ops' (elementwise_kernels.h); the tests run each level against the baseline's bits.
namespace cpu {
void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& shape, Tensor& out,
                     Tensor& lse, CpuIsa isa = CpuIsa::kNative);
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
// gradient dout: dv = Z^T dout, dS = P (dP - rowsum(dout out)), dq = dS k scale, dk = dS^T q scale,
// with P recomputed tile by tile, Z = P and dP = dout v^T (with dropout: both dropped, kept ones
// times 1 / (1 - p), the mask regenerated from its seed). Each is summed in float32 and rounded once
// (the products take P and dS rounded to the inputs' dtype, as FlashAttention's: on CUDA's tensor
// cores for float16 and bfloat16, on the CPU for bfloat16); no atomics on either backend, so the
// gradients are deterministic. `isa` as flash_attention's.
namespace cpu {
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, const AttentionShape& shape, Tensor& dq, Tensor& dk, Tensor& dv,
                              CpuIsa isa = CpuIsa::kNative);
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
