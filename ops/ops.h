// The functional ops. Each is declared once, in its family's file (linear.cc, elementwise.cc,
// reduce.cc, shape.cc, ...), with its cast policy, checks, forward and backward; see
// framework/dispatch.h for the order. Dimensions may be negative (counted from the end).
#pragma once

#include <array>
#include <optional>
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
/// softmax, except that a row whose inputs are all -inf (every key masked out) gives 0s and a zero
/// gradient instead of NaN: PyTorch's attention math path (torch._safe_softmax). Autocast: float32.
Tensor safe_softmax(const Tensor& x, int64_t dim);
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
/// scaled_dot_product_attention's and self_attention's options beyond the operands (PyTorch's
/// keyword arguments, in its order): ops::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.1,
/// .is_causal = true}). A boolean mask has no dtype here: pass its additive form (0 / -inf).
struct AttentionOptions {
  /// Added to the scaled scores before the softmax (PyTorch's float attn_mask: 0 where a key takes
  /// part, -inf where it does not, or any bias), float32 or q's dtype, broadcastable to the scores
  /// [..., Tq, Tk] and added in their dtype (the 16-bit one under autocast); its gradient flows
  /// where it requires one. A query row it leaves no key gives 0s (safe_softmax), as PyTorch's.
  /// Not with is_causal. Undefined: none. Runs the composed path.
  Tensor attn_mask{};
  /// Dropout on the attention probabilities (before they weight v), kept ones scaled by 1 / (1 - p);
  /// in [0, 1]. As PyTorch's dropout_p it applies whenever given: pass 0 outside training. The
  /// mask is ops::dropout's over the probabilities [..., Tq, Tk] (the same elements from the same
  /// generator state on either path), drawn from the process-wide generator.
  double dropout_p = 0.0;
  bool is_causal = false;  ///< key j left out of query i's row when j > i (top-left aligned)
  /// The scores' factor: 1 / sqrt(D) when unset (PyTorch's scale=None); finite when given. A
  /// negative one scales q by -sqrt(-scale) and k by sqrt(-scale) on the composed path, as PyTorch.
  std::optional<double> scale = std::nullopt;
};

/// softmax(q k^T scale) v for q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] (batch dimensions
/// broadcast), with AttentionOptions' mask (additive, or causal), dropout and scale (1 / sqrt(D)
/// by default).
/// Autocast: lower precision. Where it applies (see AttentionBackend) a fused kernel runs: the
/// FlashAttention-2 algorithm, float32 accumulation and softmax, nothing of size Tq x Tk kept for
/// the backward (dropout's mask is regenerated from its seed). Elsewhere it is composed from
/// matmul, softmax (float32) and dropout, as PyTorch's math path.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options);
/// scaled_dot_product_attention(q, k, v, {.is_causal = is_causal}).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false);
/// A number where is_causal goes (PyTorch's positional dropout_p or scale) would become is_causal:
/// AttentionOptions names them. (A bare {} is ambiguous too: write AttentionOptions{}.)
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, double) = delete;
/// Multi-head self-attention over a fused qkv projection: qkv [B, T, 3C] holds q, k and v side by
/// side, each C = n_head x D wide with its heads in order; returns [B, T, C], the heads merged.
/// The values and gradients of splitting qkv, reshaping each part to [B, T, H, D], transposing it
/// to [B, H, T, D], scaled_dot_product_attention, and transposing and reshaping back, without those
/// copies: where the fused kernel applies it reads q, k, v where they lie in qkv and writes the
/// output (and the backward qkv's gradient) in place; elsewhere it runs exactly that composition.
Tensor self_attention(const Tensor& qkv, int64_t n_head, const AttentionOptions& options);
/// self_attention(qkv, n_head, {.is_causal = is_causal}).
Tensor self_attention(const Tensor& qkv, int64_t n_head, bool is_causal = false);
Tensor self_attention(const Tensor& qkv, int64_t n_head, double) = delete;  ///< as scaled_dot_product_attention's

/// Which implementation scaled_dot_product_attention and self_attention use (PyTorch's SDPBackend).
enum class AttentionBackend : uint8_t {
  kAuto,      ///< fused where it applies: one dtype for q, k, v after autocast (CPU: float32,
              ///< float16 or bfloat16; CUDA: float16 or bfloat16, head sizes up to 128, at most 65535
              ///< batch entries B x H, no dropout); the same batch dimensions (no broadcast); no
              ///< empty input
  kFused,     ///< fused, or an Error saying why it does not apply
  kComposed,  ///< matmul, softmax and dropout, recorded op by op (the reference the fused kernel is
              ///< tested against)
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

/// A spatial option of the 2-D ops: {height, width}.
using Size2 = std::array<int64_t, 2>;

/// conv2d's options, PyTorch's arguments of F.conv2d (zero padding).
struct Conv2dOptions {
  Size2 stride = {1, 1};    ///< step between output positions
  Size2 padding = {0, 0};   ///< zeros added on each side
  Size2 dilation = {1, 1};  ///< spacing between kernel taps
  int64_t groups = 1;       ///< input and output channels split into this many independent groups
};
/// Cross-correlation of x [N, C, H, W] with w [O, C/groups, kH, kW] plus b [O] (b may be undefined)
/// -> [N, O, Ho, Wo], Ho = (H + 2 pad - dil (kH - 1) - 1) / stride + 1 (floor), as PyTorch. A GEMM
/// per group over im2col columns on the GEMM engine (FP32 sums, rounded once; the bias is added to
/// the rounded product), the columns built per chunk of samples so their memory stays bounded (a
/// 1x1 convolution's columns are x transposed); a depthwise one (groups = C = O) runs a direct
/// kernel (compute-type sums, the bias included, rounded once). Autocast: lower precision.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), const Conv2dOptions& options = {});

/// max_pool2d's options (F.max_pool2d). A stride of {0, 0} means the kernel size (PyTorch's default).
struct MaxPool2dOptions {
  Size2 kernel_size = {2, 2};  ///< window size
  Size2 stride = {0, 0};       ///< step between windows; {0, 0}: kernel_size
  Size2 padding = {0, 0};      ///< implicit -inf on each side, at most half the kernel
  Size2 dilation = {1, 1};     ///< spacing between window taps
  bool ceil_mode = false;      ///< round the output size up (a last partial window that starts inside)
};
/// The maximum of each window of x [N, C, H, W] (or [C, H, W]); NaN propagates. The gradient goes
/// to the first maximum of each window (to its last NaN, as PyTorch). Autocast: none.
Tensor max_pool2d(const Tensor& x, const MaxPool2dOptions& options = {});

/// avg_pool2d's options (F.avg_pool2d). A stride of {0, 0} means the kernel size.
struct AvgPool2dOptions {
  Size2 kernel_size = {2, 2};     ///< window size
  Size2 stride = {0, 0};          ///< step between windows; {0, 0}: kernel_size
  Size2 padding = {0, 0};         ///< zeros on each side, at most half the kernel
  bool ceil_mode = false;         ///< round the output size up
  bool count_include_pad = true;  ///< padded zeros count in the divisor
  int64_t divisor_override = 0;   ///< when > 0, every window's divisor
};
/// The mean of each window of x [N, C, H, W] (or [C, H, W]), summed in float (double for float64).
/// Autocast: none.
Tensor avg_pool2d(const Tensor& x, const AvgPool2dOptions& options = {});
/// The mean over output_size {Ho, Wo} adaptive windows of x [N, C, H, W] (or [C, H, W]): window i
/// spans [floor(i H / Ho), ceil((i + 1) H / Ho)), as PyTorch. Autocast: none.
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);

/// Batch normalisation over dimension 1 of x [N, C, ...]: y = (x - mean) / sqrt(var + eps) w + b.
/// Training: mean and var (biased) per channel from the batch, and running_mean / running_var
/// (when defined, [C], any floating dtype, updated in place and not differentiated) become
/// (1 - momentum) running + momentum batch, the variance unbiased (n / (n - 1)), as PyTorch.
/// Eval: the running statistics. weight and bias [C] may be undefined. Autocast: float32.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

/// x with dimensions start_dim..end_dim (inclusive) merged into one, a view as reshape (torch.flatten;
/// nn::Flatten starts at 1). A 0-dim x becomes [1].
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);

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
