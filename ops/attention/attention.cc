// scaled_dot_product_attention: dropout(softmax(q k^T scale [causally masked, top-left])) v, scale
// 1 / sqrt(D) unless given, dropout only where asked for; and
// self_attention, the same over the heads of a fused qkv projection, read and written in place.
//   fused (attention_kernels.h): one op on the tape that saves q, k, v, the output and each row's
//     log-sum-exp; its backward recomputes the probabilities tile by tile.
//   composed, as PyTorch's math path: matmul (lower precision under autocast), softmax (float32) and
//     dropout, each recorded, so the [..., Tq, Tk] scores and probabilities live until the backward.
#include <cmath>

#include "framework/autocast.h"
#include "framework/dispatch.h"
#include "framework/random.h"
#include "ops/attention/attention_kernels.h"
#include "ops/checks.h"
#include "ops/ops.h"
#include "ops/strided.h"

namespace ampgrad::ops {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

thread_local AttentionBackend tls_backend = AttentionBackend::kAuto;

// One call's options as the kernels take them: the scale resolved, and dropout's seed drawn once
// (the backward regenerates the forward's mask from it).
struct Settings {
  Tensor mask;  // additive, composed path only
  bool causal = false;
  double scale = 1.0;
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;

  kernels::AttentionShape apply(kernels::AttentionShape s) const {
    s.causal = causal;
    s.scale = scale;
    s.dropout_p = dropout_p;
    s.dropout_seed = dropout_seed;
    return s;
  }
};

struct FusedAttention {
  static constexpr OpInfo kInfo{"scaled_dot_product_attention", CastPolicy::kLowerPrecision};
  Settings settings;
  Tensor lse;  // [batch, Tq, 2] float32 from the forward (not a graph tensor)

  void check(const Tensor& q, const Tensor& k, const Tensor& v) const {
    check_same_device(kInfo.name, {{"q", &q}, {"k", &k}, {"v", &v}});
    check_same_dtype(kInfo.name, {{"q", &q}, {"k", &k}, {"v", &v}});
  }

  kernels::AttentionShape shape_of(const Tensor& q, const Tensor& k, const Tensor& v) const {
    const int64_t tq = q.size(-2), d = q.size(-1);
    const kernels::AttentionShape s{.batch = q.numel() / (tq * d),
                                    .tq = tq,
                                    .tk = k.size(-2),
                                    .d = d,
                                    .dv = v.size(-1)};
    return settings.apply(s).with_contiguous_layouts();
  }

  Tensor forward(SavedTensors& saved, const Tensor& q, const Tensor& k, const Tensor& v) {
    const kernels::AttentionShape s = shape_of(q, k, v);
    Shape out_shape = q.shape();
    out_shape.back() = s.dv;
    Tensor out = Tensor::empty(out_shape, q.dtype(), q.device());
    lse = Tensor::empty({s.batch, s.tq, 2}, DType::kFloat32, q.device());
    kernels::flash_attention(q, k, v, s, out, lse);
    saved.save(q);
    saved.save(k);
    saved.save(v);
    saved.save(out.detach());  // the backward's delta = rowsum(dout * out); detached: no cycle
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dout) const {
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
    Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
    Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
    // The output's gradient in its dtype (the kernels read it so; the engine does not promise it).
    const Tensor g = dout.dtype() == q.dtype() ? dout : dout.to(q.dtype());
    kernels::flash_attention_backward(q, k, v, saved[3], lse, g, shape_of(q, k, v), dq, dk, dv);
    return {dq, dk, dv};
  }
};

// self_attention's fused form: one op on the tape over qkv [B, T, 3C], whose three parts the
// kernels read in place (RowLayout::packed), writing out [B, T, C] and dqkv [B, T, 3C] directly.
struct FusedSelfAttention {
  static constexpr OpInfo kInfo{"self_attention", CastPolicy::kLowerPrecision};
  int64_t n_head;
  Settings settings;
  Tensor lse;  // [B x H, T, 2] float32 from the forward (not a graph tensor)

  void check(const Tensor& /*qkv*/) const {}

  kernels::AttentionShape shape_of(const Tensor& qkv) const {
    const int64_t b = qkv.size(0), t = qkv.size(1), width = qkv.size(2), c = width / 3, d = c / n_head;
    return settings.apply({.batch = b * n_head,
                           .tq = t,
                           .tk = t,
                           .d = d,
                           .dv = d,
                           .q = kernels::RowLayout::packed(n_head, t, width, d, 0),
                           .k = kernels::RowLayout::packed(n_head, t, width, d, c),
                           .v = kernels::RowLayout::packed(n_head, t, width, d, 2 * c),
                           .out = kernels::RowLayout::packed(n_head, t, c, d, 0)});
  }

  Tensor forward(SavedTensors& saved, const Tensor& qkv) {
    const kernels::AttentionShape s = shape_of(qkv);
    Tensor out = Tensor::empty({qkv.size(0), qkv.size(1), qkv.size(2) / 3}, qkv.dtype(), qkv.device());
    lse = Tensor::empty({s.batch, s.tq, 2}, DType::kFloat32, qkv.device());
    kernels::flash_attention(qkv, qkv, qkv, s, out, lse);
    saved.save(qkv);
    saved.save(out.detach());
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dout) const {
    const Tensor& qkv = saved[0];
    Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());  // every element written
    const Tensor g = dout.dtype() == qkv.dtype() ? dout : dout.to(qkv.dtype());
    kernels::flash_attention_backward(qkv, qkv, qkv, saved[1], lse, g, shape_of(qkv), dqkv, dqkv, dqkv);
    return {dqkv};
  }
};

// Why the fused kernels cannot take batch x [T, D] heads (Dv wide for v) of `dtype`, the dtype
// autocast leaves them in, on `device`; nullptr when they can.
const char* why_kernels_do_not_apply(Device device, DType dtype, int64_t batch, int64_t d, int64_t dv,
                                     const Settings& settings) {
  if (dtype == DType::kFloat64) return "float64 inputs run the composed path";
  if (device == Device::kCUDA) {
    if (settings.dropout_p > 0) return "on CUDA it has no dropout";
    if (!is_low_precision(dtype)) return "on CUDA it takes float16 or bfloat16 (float32 runs on cuBLAS, composed)";
    if (d > kernels::kMaxFusedHeadSize || dv > kernels::kMaxFusedHeadSize) return "on CUDA it takes head sizes up to 128";
    if (batch > 65535) return "on CUDA it takes at most 65535 batch entries (B x H)";
  }
  return nullptr;
}

DType dtype_under_autocast(const Tensor& x) {
  const autocast::State autocast = autocast::state(x.device());
  return autocast.enabled && x.dtype() != DType::kFloat64 ? autocast.dtype : x.dtype();
}

// Why the fused kernel does not apply to these inputs, or nullptr when it does. The dtypes are
// judged as autocast will leave them: float32 and 16-bit inputs become its dtype, float64 stays.
const char* why_not_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Settings& settings) {
  if (settings.mask.defined()) return "an attn_mask is given (the fused kernels take is_causal only)";
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dtype() == DType::kFloat64) return "float64 inputs run the composed path";
    if (dtype_under_autocast(*t) != dtype_under_autocast(q)) return "q, k and v have different dtypes";
  }
  if (q.dim() != k.dim() || q.dim() != v.dim()) return "q, k and v have different ranks (broadcast batch dimensions)";
  for (int64_t i = 0; i + 2 < q.dim(); ++i) {
    if (q.size(i) != k.size(i) || q.size(i) != v.size(i)) return "the batch dimensions broadcast";
  }
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return "an input is empty";
  return why_kernels_do_not_apply(q.device(), dtype_under_autocast(q), q.numel() / (q.size(-2) * q.size(-1)),
                                  q.size(-1), v.size(-1), settings);
}

// The same for self_attention's qkv [B, T, 3C] in n_head heads.
const char* why_not_fused(const Tensor& qkv, int64_t n_head, const Settings& settings) {
  if (settings.mask.defined()) return "an attn_mask is given (the fused kernels take is_causal only)";
  if (qkv.numel() == 0) return "an input is empty";
  const int64_t d = qkv.size(2) / 3 / n_head;
  return why_kernels_do_not_apply(qkv.device(), dtype_under_autocast(qkv), qkv.size(0) * n_head, d, d, settings);
}

// The options checked, the scale resolved (`scale` where given, else 1 / sqrt(D), PyTorch's
// scale=None) and dropout's seed left to draw_dropout_seed. The mask's shape is checked where the
// scores it must broadcast to are made (composed_attention).
Settings settings_of(const char* op, const AttentionOptions& options, int64_t d, DType q_dtype) {
  AG_CHECK(!options.scale || std::isfinite(*options.scale), op, ": scale must be finite, got ", *options.scale,
           "; hint: leave it unset for 1 / sqrt(D)");
  AG_CHECK(options.dropout_p >= 0.0 && options.dropout_p <= 1.0, op, ": dropout_p must be in [0, 1], got ",
           options.dropout_p, "; hint: it is the probability of dropping each attention weight (0 outside training)");
  if (options.attn_mask.defined()) {
    AG_CHECK(!options.is_causal, op, ": attn_mask and is_causal were both given, ", options.attn_mask.to_string(),
             "; hint: add the causal mask (-inf above the diagonal) into attn_mask, or leave attn_mask unset");
    const DType mask_dtype = options.attn_mask.dtype();
    AG_CHECK(mask_dtype == DType::kFloat32 || mask_dtype == q_dtype, op,
             ": attn_mask must be a floating-point additive mask, float32 or q's dtype (", dtype_name(q_dtype),
             "), got ", options.attn_mask.to_string(), "; hint: 0 where a key takes part and -inf where it does not");
  }
  return {.mask = options.attn_mask,
          .causal = options.is_causal,
          .scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(d)),
          .dropout_p = options.dropout_p};
}

// The fused kernels' dropout seed, drawn as ops::dropout draws it on the composed path (once, and
// not at all for p = 0 or 1), so either path leaves the generator as the other would and, from
// the same state, drops the same elements.
void draw_dropout_seed(Settings& settings) {
  if (settings.dropout_p > 0 && settings.dropout_p < 1) settings.dropout_seed = random::next_u64();
}

Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Settings& settings) {
  // q and k are each scaled by sqrt(|scale|) (D^-1/4 by default), q's negated for a negative
  // scale, before their product, as PyTorch's math path: the scores of large q and k then stay
  // finite in float16 where q k^T alone would overflow.
  const double root = std::sqrt(std::abs(settings.scale));
  Tensor scores = matmul(scale(q, settings.scale < 0 ? -root : root), transpose(scale(k, root), -2, -1));
  if (settings.mask.defined()) {
    // Added in the scores' dtype, as PyTorch adds it in place (under autocast the 16-bit one, as
    // autocast casts PyTorch's mask); it broadcasts to the scores, never the other way.
    const std::optional<Shape> both = kernels::try_broadcast_shapes(settings.mask.shape(), scores.shape());
    AG_CHECK(both == scores.shape(), kOp, ": attn_mask ", settings.mask.to_string(), " does not broadcast to the ",
             "scores ", shape_to_string(scores.shape()), " ([..., Tq, Tk]); hint: give it [Tq, Tk] or the scores' ",
             "batch dimensions");
    scores = add(scores, settings.mask.to(scores.dtype()));
  }
  // A row the mask leaves no key gives 0s, not NaN, as PyTorch's (2.5 and later) math path.
  const Tensor p = settings.causal ? causal_softmax(scores) : safe_softmax(scores, -1);
  return matmul(dropout(p, settings.dropout_p), v);
}

}  // namespace

AttentionBackend attention_backend() { return tls_backend; }

AttentionBackendGuard::AttentionBackendGuard(AttentionBackend backend) : previous_(tls_backend) {
  tls_backend = backend;
}
AttentionBackendGuard::~AttentionBackendGuard() { tls_backend = previous_; }

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  AG_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": q, k and v must be defined");
  check_same_device(kOp, {{"q", &q}, {"k", &k}, {"v", &v}});
  const auto all = [&] { return describe({{"q", &q}, {"k", &k}, {"v", &v}}); };
  AG_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, kOp, ": q, k, v must be [..., T, D], got ", all());
  AG_CHECK(q.size(-1) == k.size(-1), kOp, ": q and k must have the same head size D, got ", all());
  AG_CHECK(k.size(-2) == v.size(-2), kOp, ": k and v must have the same length, got ", all());
  Settings settings = settings_of(kOp, options, q.size(-1), q.dtype());
  if (settings.mask.defined()) check_same_device(kOp, {{"q", &q}, {"attn_mask", &settings.mask}});
  const char* why_not = tls_backend == AttentionBackend::kComposed ? "" : why_not_fused(q, k, v, settings);
  if (why_not == nullptr) {
    draw_dropout_seed(settings);
    return dispatch(FusedAttention{.settings = settings, .lse = {}}, q, k, v);
  }
  AG_CHECK(tls_backend != AttentionBackend::kFused, kOp, ": the fused kernel was asked for (AttentionBackend::kFused) ",
           "but does not apply: ", why_not, " (", all(), "); hint: AttentionBackend::kAuto falls back to the ",
           "composed path");
  return composed_attention(q, k, v, settings);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal) {
  return scaled_dot_product_attention(q, k, v, AttentionOptions{.is_causal = is_causal});
}

Tensor self_attention(const Tensor& qkv, int64_t n_head, const AttentionOptions& options) {
  constexpr const char* kSelf = "self_attention";
  AG_CHECK(qkv.defined(), kSelf, ": qkv must be defined");
  const auto all = [&] { return describe({{"qkv", &qkv}}); };
  AG_CHECK(qkv.dim() == 3, kSelf, ": qkv must be [B, T, 3C] (q, k and v side by side), got ", all());
  AG_CHECK(n_head >= 1 && qkv.size(2) % (3 * n_head) == 0, kSelf, ": qkv's last dimension must be 3 x n_head x D, ",
           "got ", all(), " with n_head ", n_head, "; hint: q, k and v are each n_head heads of D wide");
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / n_head;
  Settings settings = settings_of(kSelf, options, d, qkv.dtype());
  const char* why_not = tls_backend == AttentionBackend::kComposed ? "" : why_not_fused(qkv, n_head, settings);
  if (why_not == nullptr) {
    draw_dropout_seed(settings);
    return dispatch(FusedSelfAttention{.n_head = n_head, .settings = settings, .lse = {}}, qkv);
  }
  AG_CHECK(tls_backend != AttentionBackend::kFused, kSelf, ": the fused kernel was asked for ",
           "(AttentionBackend::kFused) but does not apply: ", why_not, " (", all(), ", n_head ", n_head,
           "); hint: AttentionBackend::kAuto falls back to the composed path");
  // [B, T, C] -> [B, H, T, D] for each of q, k, v; attention; and back.
  const std::vector<Tensor> parts = split(qkv, c, -1);
  const auto heads = [&](const Tensor& y) { return transpose(reshape(y, {b, t, n_head, d}), 1, 2); };
  const Tensor y = scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), options);
  return reshape(transpose(y, 1, 2), {b, t, c});
}

Tensor self_attention(const Tensor& qkv, int64_t n_head, bool is_causal) {
  return self_attention(qkv, n_head, AttentionOptions{.is_causal = is_causal});
}

}  // namespace ampgrad::ops
