// scaled_dot_product_attention: softmax(q k^T / sqrt(D) [causally masked, top-left]) v.
//   fused (attention_kernels.h): one op on the tape that saves q, k, v, the output and each row's
//     log-sum-exp; its backward recomputes the probabilities tile by tile.
//   composed, as PyTorch's math path: matmul (lower precision under autocast) and softmax (float32),
//     each recorded, so the [..., Tq, Tk] scores and probabilities live until the backward.
#include <cmath>

#include "framework/autocast.h"
#include "framework/dispatch.h"
#include "ops/attention/attention_kernels.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

thread_local AttentionBackend tls_backend = AttentionBackend::kAuto;

struct FusedAttention {
  static constexpr OpInfo kInfo{"scaled_dot_product_attention", CastPolicy::kLowerPrecision};
  bool causal;
  Tensor lse;  // [batch, Tq, 2] float32 from the forward (not a graph tensor)

  void check(const Tensor& q, const Tensor& k, const Tensor& v) const {
    check_same_device(kInfo.name, {{"q", &q}, {"k", &k}, {"v", &v}});
    check_same_dtype(kInfo.name, {{"q", &q}, {"k", &k}, {"v", &v}});
  }

  kernels::AttentionShape shape_of(const Tensor& q, const Tensor& k, const Tensor& v) const {
    const int64_t tq = q.size(-2), d = q.size(-1);
    return {.batch = q.numel() / (tq * d),
            .tq = tq,
            .tk = k.size(-2),
            .d = d,
            .dv = v.size(-1),
            .causal = causal,
            .scale = 1.0 / std::sqrt(static_cast<double>(d))};
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

// Why the fused kernel does not apply to these inputs, or nullptr when it does. The dtypes are
// judged as autocast will leave them: float32 and 16-bit inputs become its dtype, float64 stays.
const char* why_not_fused(const Tensor& q, const Tensor& k, const Tensor& v) {
  const autocast::State autocast = autocast::state(q.device());
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dtype() == DType::kFloat64) return "float64 inputs run the composed path";
    if (!autocast.enabled && t->dtype() != q.dtype()) return "q, k and v have different dtypes";
  }
  if (q.dim() != k.dim() || q.dim() != v.dim()) return "q, k and v have different ranks (broadcast batch dimensions)";
  for (int64_t i = 0; i + 2 < q.dim(); ++i) {
    if (q.size(i) != k.size(i) || q.size(i) != v.size(i)) return "the batch dimensions broadcast";
  }
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return "an input is empty";
  if (q.device() == Device::kCUDA) {
    const DType dtype = autocast.enabled ? autocast.dtype : q.dtype();
    if (!is_low_precision(dtype)) return "on CUDA it takes float16 or bfloat16 (float32 runs on cuBLAS, composed)";
    if (q.size(-1) > kernels::kMaxFusedHeadSize || v.size(-1) > kernels::kMaxFusedHeadSize) {
      return "on CUDA it takes head sizes up to 128";
    }
    if (q.numel() / (q.size(-2) * q.size(-1)) > 65535) return "on CUDA it takes at most 65535 batch entries (B x H)";
  }
  return nullptr;
}

Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal) {
  // q and k are each scaled by D^-1/4 before their product, as PyTorch's math path: the scores of
  // large q and k then stay finite in float16 where q k^T alone would overflow.
  const double root_scale = std::pow(static_cast<double>(q.size(-1)), -0.25);
  const Tensor scores = matmul(scale(q, root_scale), transpose(scale(k, root_scale), -2, -1));
  const Tensor p = is_causal ? causal_softmax(scores) : softmax(scores, -1);
  return matmul(p, v);
}

}  // namespace

AttentionBackend attention_backend() { return tls_backend; }

AttentionBackendGuard::AttentionBackendGuard(AttentionBackend backend) : previous_(tls_backend) {
  tls_backend = backend;
}
AttentionBackendGuard::~AttentionBackendGuard() { tls_backend = previous_; }

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal) {
  AG_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": q, k and v must be defined");
  check_same_device(kOp, {{"q", &q}, {"k", &k}, {"v", &v}});
  const auto all = [&] { return describe({{"q", &q}, {"k", &k}, {"v", &v}}); };
  AG_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, kOp, ": q, k, v must be [..., T, D], got ", all());
  AG_CHECK(q.size(-1) == k.size(-1), kOp, ": q and k must have the same head size D, got ", all());
  AG_CHECK(k.size(-2) == v.size(-2), kOp, ": k and v must have the same length, got ", all());
  const char* why_not = tls_backend == AttentionBackend::kComposed ? "" : why_not_fused(q, k, v);
  if (why_not == nullptr) return dispatch(FusedAttention{.causal = is_causal, .lse = {}}, q, k, v);
  AG_CHECK(tls_backend != AttentionBackend::kFused, kOp, ": the fused kernel was asked for (AttentionBackend::kFused) ",
           "but does not apply: ", why_not, " (", all(), "); hint: AttentionBackend::kAuto falls back to the ",
           "composed path");
  return composed_attention(q, k, v, is_causal);
}

}  // namespace ampgrad::ops
