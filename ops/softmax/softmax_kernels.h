// Softmax-family kernels: softmax / log_softmax along a dimension (optionally causal), and the
// fused cross-entropy / negative-log-likelihood loss. Computed in float (double for float64) with
// the row maximum subtracted first, so large logits (1e4) stay finite; results rounded once.
// Callers have checked shapes, dtypes and devices; outputs are preallocated and overwritten.
#pragma once

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

enum class SoftmaxKind : bool { kSoftmax, kLogSoftmax };
/// Causal masking of the last two dimensions [..., Tq, Tk] (softmax only): element (i, j) is left
/// out (probability 0) when j > i (top-left aligned, as PyTorch's is_causal).
enum class Causal : bool { kNo, kYes };
/// What softmax gives for a row whose inputs are all -inf (no term): NaN, as torch.softmax, or 0
/// (PyTorch's attention math path, torch._safe_softmax).
enum class EmptyRows : bool { kNaN, kZero };

// y = softmax(x) or log_softmax(x) along `dim` (non-negative; the last one when causal).
namespace cpu {
void softmax(const Tensor& x, int64_t dim, SoftmaxKind kind, Causal causal, EmptyRows empty_rows, Tensor& y);
}
namespace cuda {
void softmax(const Tensor& x, int64_t dim, SoftmaxKind kind, Causal causal, EmptyRows empty_rows, Tensor& y);
}
inline void softmax(const Tensor& x, int64_t dim, SoftmaxKind kind, Causal causal, EmptyRows empty_rows, Tensor& y) {
  AG_ON_BACKEND(y.device(), softmax, x, dim, kind, causal, empty_rows, y);
}

// From the forward's output y and dy along `dim`: softmax dx = y (dy - sum(dy y)); log_softmax
// dx = dy - exp(y) sum(dy). (Causally masked elements have y = 0 and get dx = 0.)
namespace cpu { void softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, SoftmaxKind kind, Tensor& dx); }
namespace cuda { void softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, SoftmaxKind kind, Tensor& dx); }
inline void softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim, SoftmaxKind kind, Tensor& dx) {
  AG_ON_BACKEND(dx.device(), softmax_backward, y, dy, dim, kind, dx);
}

/// What the rows of a cross-entropy input hold: logits (cross_entropy) or log-probabilities (nll_loss).
enum class ClassScores : bool { kLogits, kLogProbs };

/// A row's log-normaliser lse = shift + log_sum (shift the row maximum, log_sum = log sum
/// exp(x - shift)), kept in two parts so that log_p = (x - shift) - log_sum subtracts the large
/// shift first: exact near the maximum, where x - lse would round lse to the precision of a large
/// logit (at an offset of 1e5 a float32 lse is 0.004 off). For log-probabilities both are 0.
template <typename C>
struct LogNormalizer {
  C shift = C(0);
  double log_sum = 0.0;
  AG_HOST_DEVICE C log_prob(C x) const { return (x - shift) - static_cast<C>(log_sum); }
  /// The same in double, for losses: x - shift of two floats is exact there whenever x is near the
  /// maximum (within a factor 2^29), and correctly rounded otherwise.
  AG_HOST_DEVICE double log_prob_wide(C x) const {
    return (static_cast<double>(x) - static_cast<double>(shift)) - log_sum;
  }
};

/// A cross-entropy problem: input [N, C], target int64 [N] in [0, C) or ignore_index.
struct CrossEntropyArgs {
  ClassScores scores = ClassScores::kLogits;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;  // eps: the target distribution is (1 - eps) one-hot + eps / C
};

// Per sample i: losses[i] = -sum_c q_c log p_c (log p = log_softmax(input) for logits, input itself
// for log-probabilities), valid[i] = 1, and the row's log-normaliser in row_lse[i] = (shift,
// log_sum) for the backward; for an ignored sample all are 0. losses and valid are in the compute
// dtype (float32 for 16-bit input, so the loss is never rounded to 16 bits), row_lse is float64
// [N, 2]. A target outside [0, C) that is not ignore_index throws an Error naming the sample and
// the value (on CUDA after one wait for the GPU).
namespace cpu {
void cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args, Tensor& losses,
                   Tensor& valid, Tensor& row_lse);
}
namespace cuda {
void cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args, Tensor& losses,
                   Tensor& valid, Tensor& row_lse);
}
inline void cross_entropy(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args, Tensor& losses,
                          Tensor& valid, Tensor& row_lse) {
  AG_ON_BACKEND(input.device(), cross_entropy, input, target, args, losses, valid, row_lse);
}

// dinput[i, c] = dlosses[i] (p_c - q_c) for logits, -dlosses[i] q_c for log-probabilities; 0 for
// an ignored sample. One pass over each row: p_c comes from the forward's row_lse, not from a new
// maximum and sum. dlosses is [N] in the compute dtype; dinput has the input's dtype.
namespace cpu {
void cross_entropy_backward(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args,
                            const Tensor& row_lse, const Tensor& dlosses, Tensor& dinput);
}
namespace cuda {
void cross_entropy_backward(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args,
                            const Tensor& row_lse, const Tensor& dlosses, Tensor& dinput);
}
inline void cross_entropy_backward(const Tensor& input, const Tensor& target, const CrossEntropyArgs& args,
                                   const Tensor& row_lse, const Tensor& dlosses, Tensor& dinput) {
  AG_ON_BACKEND(dinput.device(), cross_entropy_backward, input, target, args, row_lse, dlosses, dinput);
}

}  // namespace ampgrad::kernels
