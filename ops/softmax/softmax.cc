// softmax, log_softmax, cross_entropy and nll_loss. Autocast runs them all in float32 (the losses
// read 16-bit scores as they are and compute in float32).
//   softmax:     dx = y (dy - sum(dy y))          log_softmax: dx = dy - softmax(x) sum(dy)
//   cross_entropy (fused): dlogits = (softmax(logits) - q) * dloss_i, q the (smoothed) one-hot
//   target; mean divides by the number of samples that are not ignore_index.
#include <limits>

#include "framework/copy.h"
#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"
#include "ops/softmax/softmax_kernels.h"

namespace ampgrad::ops {

int64_t normalize_dim(const char* op, int64_t dim, int64_t rank);  // shape.cc

namespace {

using kernels::Causal;
using kernels::EmptyRows;
using kernels::SoftmaxKind;

template <SoftmaxKind kKind>
struct Softmax {
  static constexpr OpInfo kInfo{kKind == SoftmaxKind::kSoftmax ? "softmax" : "log_softmax", CastPolicy::kFloat32};
  int64_t dim;  // normalised
  Causal causal = Causal::kNo;
  EmptyRows empty_rows = EmptyRows::kNaN;

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  Tensor forward(SavedTensors& saved, const Tensor& x) const {
    Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
    kernels::softmax(x, dim, kKind, causal, empty_rows, y);
    saved.save(y.detach());  // the backward needs only the output (saved detached: no cycle)
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    kernels::softmax_backward(saved[0], dy, dim, kKind, dx);
    return {dx};
  }
};

// float32 for 16-bit floats (their sums and counts overflow), else the dtype itself.
DType accumulation_dtype(DType dtype) { return is_low_precision(dtype) ? DType::kFloat32 : dtype; }

// t's values in `dtype` (t itself when it already is): a plain conversion, not recorded.
Tensor in_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  copy_(out, t);
  return out;
}

// Per-sample losses [N] of a cross-entropy problem, reduced as asked. FP16/BF16 scores are read as
// they are (under autocast too: no float32 copy of [N, V] logits) and the loss is computed, and
// reduced, in float32; the forward keeps each row's log-normaliser, so the backward writes the
// scores' gradient, in their own dtype, in one pass over them.
struct CrossEntropy {
  static constexpr OpInfo kInfo{"cross_entropy", CastPolicy::kFloat32InKernel, /*integer_inputs=*/0b10};  // target
  kernels::CrossEntropyArgs args;
  Reduction reduction;
  const char* name;  // "cross_entropy" or "nll_loss", for errors
  Tensor row_lse;    // [N, 2] float64 from the forward: each row's (shift, log_sum)
  Tensor count;      // the number of samples that count, for the mean's backward

  void check(const Tensor& input, const Tensor& target) const {
    AG_CHECK(input.defined() && target.defined(), name, ": input and target must be defined");
    const auto both = [&] { return describe({{"input", &input}, {"target", &target}}); };
    AG_CHECK(input.device() == target.device(), name, ": input and target are on different devices (", both(), ")");
    AG_CHECK(target.dtype() == DType::kInt64, name, ": target must be int64 class indices, got ", both(),
             "; hint: Tensor::from_vector(std::vector<int64_t>{...}, shape)");
    AG_CHECK(input.dim() == 2 && target.dim() == 1 && input.size(0) == target.size(0), name,
             ": needs input [N, C] and target [N], got ", both());
    AG_CHECK(input.size(1) > 0, name, ": input has no classes (", both(), ")");
  }

  Tensor forward(SavedTensors& saved, const Tensor& input, const Tensor& target) {
    saved.save(input);
    saved.save(target);
    const int64_t n = input.size(0);
    // Losses in float32 for 16-bit scores: a float16 sum of 40000 losses of ~2 overflows, and 70000
    // samples cannot be counted in float16 at all. A 16-bit result (outside autocast) is rounded
    // from the float32 sum, mean or per-sample loss.
    const DType acc = accumulation_dtype(input.dtype());
    const DType result = autocast::float32_result_dtype(input);
    Tensor losses = Tensor::empty({n}, acc, input.device());
    Tensor valid = Tensor::empty({n}, acc, input.device());
    row_lse = Tensor::empty({n, 2}, DType::kFloat64, input.device());
    kernels::cross_entropy(input, target, args, losses, valid, row_lse);
    if (reduction == Reduction::kNone) return in_dtype(losses, result);
    Tensor total = Tensor::empty({}, acc, input.device());
    kernels::sum_to(losses, 1.0, total);
    if (reduction == Reduction::kSum) return in_dtype(total, result);
    count = Tensor::empty({}, acc, input.device());
    kernels::sum_to(valid, 1.0, count);
    // The mean of no samples is NaN, as PyTorch's (a quiet NaN, not the sign-set one 0 / 0 gives on x86).
    if (n == 0) return full({}, std::numeric_limits<double>::quiet_NaN(), result, input.device());
    Tensor mean = Tensor::empty({}, acc, input.device());
    kernels::binary(kernels::BinaryOp::kDiv, total, count, mean);  // all ignored: 0 / 0 = NaN, as PyTorch
    return in_dtype(mean, result);
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Tensor& input = saved[0];
    const DType acc = accumulation_dtype(input.dtype());
    Tensor dlosses = in_dtype(dy, acc);
    if (reduction != Reduction::kNone) {
      Tensor g = dlosses;
      if (reduction == Reduction::kMean) {
        g = Tensor::empty({}, acc, dy.device());
        kernels::binary(kernels::BinaryOp::kDiv, dlosses, count, g);
      }
      dlosses = Tensor::empty({input.size(0)}, acc, dy.device());
      kernels::affine(g, 1.0, 0.0, dlosses);  // the same gradient for every sample
    }
    Tensor dinput = Tensor::empty(input.shape(), input.dtype(), input.device());
    kernels::cross_entropy_backward(input, saved[1], args, row_lse, dlosses, dinput);
    return {dinput, Tensor()};
  }
};

Tensor cross_entropy_op(const char* name, kernels::ClassScores scores, const Tensor& input, const Tensor& target,
                        const CrossEntropyOptions& options) {
  AG_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0, name,
           ": label_smoothing must be in [0, 1], got ", options.label_smoothing);
  return dispatch(CrossEntropy{.args = {.scores = scores,
                                        .ignore_index = options.ignore_index,
                                        .label_smoothing = options.label_smoothing},
                               .reduction = options.reduction,
                               .name = name,
                               .row_lse = {},
                               .count = {}},
                  input, target);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  AG_CHECK(x.defined(), "softmax: input is undefined");
  return dispatch(Softmax<SoftmaxKind::kSoftmax>{.dim = normalize_dim("softmax", dim, x.dim())}, x);
}

Tensor safe_softmax(const Tensor& x, int64_t dim) {
  AG_CHECK(x.defined(), "safe_softmax: input is undefined");
  return dispatch(Softmax<SoftmaxKind::kSoftmax>{.dim = normalize_dim("safe_softmax", dim, x.dim()),
                                                 .empty_rows = EmptyRows::kZero},
                  x);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  AG_CHECK(x.defined(), "log_softmax: input is undefined");
  return dispatch(Softmax<SoftmaxKind::kLogSoftmax>{.dim = normalize_dim("log_softmax", dim, x.dim())}, x);
}

Tensor causal_softmax(const Tensor& x) {
  AG_CHECK(x.defined() && x.dim() >= 2, "causal_softmax: needs a tensor [..., Tq, Tk], got ", x.to_string());
  return dispatch(Softmax<SoftmaxKind::kSoftmax>{.dim = x.dim() - 1, .causal = Causal::kYes}, x);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  return cross_entropy_op("cross_entropy", kernels::ClassScores::kLogits, logits, target, options);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options) {
  return cross_entropy_op("nll_loss", kernels::ClassScores::kLogProbs, log_probs, target,
                          {.ignore_index = options.ignore_index, .label_smoothing = 0.0, .reduction = options.reduction});
}

}  // namespace ampgrad::ops
