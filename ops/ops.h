// The functional ops. Each is declared once, in its family's file (linear.cc, elementwise.cc,
// reduce.cc, shape.cc, ...), with its cast policy, checks, forward and backward; see
// framework/dispatch.h for the order. Dimensions may be negative (counted from the end).
#pragma once

#include <vector>

#include "framework/tensor.h"

namespace ampgrad::ops {

/// y[..., out] = x[..., in] @ w[out, in]^T + b[out] (b may be undefined), for any number of leading
/// dimensions. Autocast: lower precision.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
/// c = a @ b: [..., M, K] @ [..., K, N] -> [..., M, N] with the batch dimensions broadcast
/// (NumPy/PyTorch rules); a 1-D operand is a row (a) or column (b) vector whose dimension is
/// dropped from the result. Autocast: lower precision.
Tensor matmul(const Tensor& a, const Tensor& b);

/// Element-wise with NumPy/PyTorch broadcasting, any rank ([2,3] + [1,3], [B,T,C] + [C], ...).
/// Inputs of different dtypes are promoted to the wider one.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);  ///< a - b
Tensor mul(const Tensor& a, const Tensor& b);  ///< a * b
Tensor div(const Tensor& a, const Tensor& b);  ///< a / b
/// max(x, 0); a NaN stays NaN (as in PyTorch), so it still reaches the loss.
Tensor relu(const Tensor& x);

/// GELU: exact x/2 (1 + erf(x / sqrt 2)), or the tanh approximation of GPT-2 and llm.c.
enum class GeluApproximation : uint8_t { kNone, kTanh };
/// Activations, element-wise in the input's dtype (computed in float; autocast: none).
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::kNone);
Tensor tanh(const Tensor& x);  ///< tanh(x)
Tensor sigmoid(const Tensor& x);  ///< 1 / (1 + e^-x)
/// e^x and the natural log, element-wise. Autocast: float32.
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);  ///< the natural log
/// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training;
/// x itself otherwise. The mask comes from the global generator (manual_seed makes it
/// reproducible) and is the same on every device. p must be in [0, 1].
Tensor dropout(const Tensor& x, double p, bool training = true);

/// Sum / mean of all elements, as a 0-dim tensor. Accumulates in double whatever the size, rounds
/// once; autocast: float32.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);  ///< the mean of all elements
/// Sum / mean over `dims` (each once; empty means all), keeping them as size 1 when keepdim.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);  ///< the mean over `dims`
/// The maxima along `dim` (the gradient goes to the first maximum; a NaN is the maximum).
/// Autocast: none (runs in the input's dtype).
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
/// The index (int64) of the first maximum along `dim`. Not differentiable.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

/// The same elements in another shape (one dimension may be -1: inferred). Shares x's storage (no
/// copy): tensors are always contiguous, so every reshape is a view.
Tensor reshape(const Tensor& x, const Shape& shape);
/// x with a dimension of size 1 inserted at `dim` (in [-rank - 1, rank]) / removed at `dim`.
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);  ///< (see unsqueeze)
/// Dimensions reordered: out.shape[i] = x.shape[dims[i]]. A contiguous copy.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
/// Two dimensions swapped (a permute).
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
/// Elements [start, start + length) along `dim` (a contiguous copy).
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// Consecutive pieces of `size` along `dim` (the last may be shorter), as torch.split.
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
/// `chunks` pieces along `dim` of ceil(n / chunks) each (fewer if n is small), as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
/// The tensors joined along `dim`; all other dimensions must match.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
/// x broadcast to `shape` (NumPy rules; -1 keeps a dimension), as a contiguous copy.
Tensor expand(const Tensor& x, const Shape& shape);

/// mean((pred - target)^2) over all elements, 0-dim; shapes must be equal. Autocast: float32.
Tensor mse_loss(const Tensor& pred, const Tensor& target);

/// softmax / log_softmax along dim, computed with the maximum subtracted (large inputs stay
/// finite). Autocast: float32.
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);  ///< log(softmax(x)), without forming softmax
/// softmax over the last dimension of x [..., Tq, Tk] where element (i, j) with j > i is masked out
/// (probability 0): attention that may not look ahead, aligned top-left as PyTorch's is_causal
/// (every row keeps column 0, so no row is empty). Autocast: float32.
Tensor causal_softmax(const Tensor& x);

/// How a loss over samples is reduced: the mean (over the samples that count), the sum, or none.
enum class Reduction : uint8_t { kMean, kSum, kNone };

/// cross_entropy's options, PyTorch's arguments of F.cross_entropy.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   ///< samples with this target count for nothing
  double label_smoothing = 0.0;  ///< the target distribution is (1 - eps) one-hot + eps / C
  Reduction reduction = Reduction::kMean;  ///< the mean over the counted samples, their sum, or one loss per sample
};
/// -log softmax(logits)[target], fused and numerically stable: logits [N, C], target int64 [N] in
/// [0, C) (or ignore_index); a target out of range is an Error. Mean: over the samples that are not
/// ignored (NaN if all are). kNone gives [N]. Autocast: float32.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

/// nll_loss's options, PyTorch's arguments of F.nll_loss.
struct NllLossOptions {
  int64_t ignore_index = -100;  ///< samples with this target count for nothing
  Reduction reduction = Reduction::kMean;  ///< the mean over the counted samples, their sum, or one loss per sample
};
/// -log_probs[target] for log-probabilities [N, C] (e.g. from log_softmax). Autocast: float32.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NllLossOptions& options = {});

/// (x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased variance, as
/// PyTorch); weight and bias [C] may be undefined. Autocast: float32.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
/// Rows of weight [V, C] picked by int64 ids [...] -> [..., C]; an id outside [0, V) is an Error.
/// Autocast: none (the weight's dtype).
Tensor embedding(const Tensor& ids, const Tensor& weight);
/// softmax(q k^T / sqrt(D)) v for q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] (batch dimensions
/// broadcast), causally masked when is_causal (top-left aligned). Autocast: lower precision.
/// Where it applies (see AttentionBackend) a fused kernel runs: the FlashAttention-2 algorithm,
/// float32 accumulation and softmax, nothing of size Tq x Tk kept for the backward. Elsewhere it
/// is composed from matmul and softmax (float32), as PyTorch's math path.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false);
/// Multi-head self-attention over a fused qkv projection: qkv [B, T, 3C] holds q, k and v side by
/// side, each C = n_head x D wide with its heads in order; returns [B, T, C], the heads merged.
/// The values and gradients of splitting qkv, reshaping each part to [B, T, H, D], transposing it
/// to [B, H, T, D], scaled_dot_product_attention, and transposing and reshaping back, without those
/// copies: where the fused kernel applies it reads q, k, v where they lie in qkv and writes the
/// output (and the backward qkv's gradient) in place; elsewhere it runs exactly that composition.
Tensor self_attention(const Tensor& qkv, int64_t n_head, bool is_causal = false);

/// Which implementation scaled_dot_product_attention and self_attention use (PyTorch's SDPBackend).
enum class AttentionBackend : uint8_t {
  kAuto,      ///< fused where it applies: CPU; float32, float16 or bfloat16 (one dtype for q, k, v
              ///< after autocast); the same batch dimensions (no broadcast); no empty input
  kFused,     ///< fused, or an Error saying why it does not apply
  kComposed,  ///< matmul and softmax, recorded op by op (the reference the fused kernel is tested against)
};
/// The backend scaled_dot_product_attention uses on this thread now.
AttentionBackend attention_backend();
/// While it lives, scaled_dot_product_attention on this thread uses `backend`
/// (torch.nn.attention.sdpa_kernel); guards nest.
class AttentionBackendGuard {
 public:
  /// Uses `backend` on this thread until the guard ends (then the previous one again).
  explicit AttentionBackendGuard(AttentionBackend backend);
  ~AttentionBackendGuard();
  AttentionBackendGuard(const AttentionBackendGuard&) = delete;
  AttentionBackendGuard& operator=(const AttentionBackendGuard&) = delete;

 private:
  AttentionBackend previous_;
};

/// alpha * x, computed in the compute type (float, double for float64) and rounded once to x's
/// dtype (what x * 2.0f calls).
Tensor scale(const Tensor& x, double alpha);

/// x in `dtype` (differentiable; same as x.to(dtype)).
Tensor cast(const Tensor& x, DType dtype);

}  // namespace ampgrad::ops

namespace ampgrad {

Tensor operator+(const Tensor& a, const Tensor& b);  ///< ops::add
Tensor operator-(const Tensor& a, const Tensor& b);  ///< ops::sub
Tensor operator*(const Tensor& a, const Tensor& b);  ///< ops::mul
/// Scalar forms: the scalar is not rounded to the tensor's dtype first; x * s is computed in the
/// compute type (float, double for float64) and rounded once, as PyTorch does.
Tensor operator+(const Tensor& a, float s);  ///< x + s
Tensor operator-(const Tensor& a, float s);  ///< x - s
Tensor operator*(const Tensor& a, float s);  ///< x * s
Tensor operator*(float s, const Tensor& a);  ///< s * x
Tensor operator-(const Tensor& a);  ///< -x
}  // namespace ampgrad
