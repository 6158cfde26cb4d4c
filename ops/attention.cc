// scaled_dot_product_attention, composed from recorded ops as PyTorch's math path does:
//   softmax(q k^T / sqrt(D) [causally masked, top-left]) v
// Under autocast the two matmuls run in lower precision and the softmax in float32.
#include <cmath>

#include "ops/checks.h"
#include "ops/ops.h"

namespace ampgrad::ops {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal) {
  const char* op = "scaled_dot_product_attention";
  check_same_device(op, {{"q", &q}, {"k", &k}, {"v", &v}});
  const auto all = [&] { return describe({{"q", &q}, {"k", &k}, {"v", &v}}); };
  AG_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op, ": q, k, v must be [..., T, D], got ", all());
  AG_CHECK(q.size(-1) == k.size(-1), op, ": q and k must have the same head size D, got ", all());
  AG_CHECK(k.size(-2) == v.size(-2), op, ": k and v must have the same length, got ", all());
  // q and k are each scaled by D^-1/4 before their product, as PyTorch's math path: the scores of
  // large q and k then stay finite in float16 where q k^T alone would overflow.
  const double root_scale = std::pow(static_cast<double>(q.size(-1)), -0.25);
  const Tensor scores = matmul(scale(q, root_scale), transpose(scale(k, root_scale), -2, -1));
  const Tensor p = is_causal ? causal_softmax(scores) : softmax(scores, -1);
  return matmul(p, v);
}

}  // namespace ampgrad::ops
