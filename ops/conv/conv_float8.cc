// conv2d with FP8 GEMMs (see conv_float8.h): linear_float8.cc's casts over conv.cc's im2col route.
// Forward: x and w cast to E4M3 by their scales (x once, before im2col: the columns repeat its
// codes and the padding's zeros stay zeros), y = (wq colsq) / (sw sx) + b per chunk of samples.
// Backward: dy cast by its scale; dw = (dyq colsq^T) / (sdy sx), its float32 sums added over the
// chunks and rounded once; dcols = (wq^T dyq) / (sw sdy), rounded to x's dtype and gathered by
// col2im; db from dy as it is. Only xq and wq are saved: one byte an element. A chunk holds half
// the columns the plain route's does: its products are float32. On CUDA an ungrouped
// convolution's GEMMs are 2-D, which cuBLASLt's FP8 matmul takes where m, n and k are multiples
// of 16 (after a transposed copy of an operand that is not K-contiguous: the forward's columns,
// dx's both; dw's are); grouped ones, and other sizes, run as bfloat16 GEMMs of the same values.
#include "ops/conv/conv_float8.h"

#include <cmath>
#include <memory>

#include "framework/autocast.h"
#include "framework/copy.h"
#include "framework/dispatch.h"
#include "framework/float8_scaling.h"
#include "ops/conv/conv_kernels.h"
#include "ops/conv/conv_plan.h"
#include "ops/linear/float8_operands.h"
#include "ops/linear/linear_float8_kernels.h"
#include "ops/linear/linear_kernels.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::ops::detail {

namespace {

using kernels::Transpose;

// A chunk's share of the column budget: the products of its GEMMs are float32 (dx's as many as
// the columns), so half the plain route's chunk keeps the transient bytes near its.
constexpr int64_t kFloat8ChunkShare = 2;

struct Float8Conv2d : Float8Inputs {
  static constexpr OpInfo kInfo{"conv2d", CastPolicy::kNone};  // the op casts its operands itself
  Float8Recipe recipe;
  uint64_t step = 0;
  std::shared_ptr<Float8LinearState> state;
  ConvPlan plan;
  Scaled x_meta, w_meta;  // their scales and amaxes (the FP8 data is in the saved tensors)

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    // Under autocast the operands need not share a dtype; the FP8 casts read each as it is.
    check_conv2d(kInfo.name, x, w, b, plan.options, /*same_dtype=*/!autocast::state(x.device()).enabled);
  }

  // A GEMM operand of the groups' stacked matrices [g, rows, cols]: one 2-D matrix for one group.
  Tensor gemm_view(const Tensor& stacked) const {
    return plan.options.groups == 1 ? reshape(stacked, {stacked.size(1), stacked.size(2)}) : stacked;
  }

  // The float32 sums of op(a) op(b) over FP8 operands, [g, m, n] (or [m, n] for one group).
  Tensor sums(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, int64_t m, int64_t n) const {
    const int64_t groups = plan.options.groups;
    const Shape shape = groups == 1 ? Shape{m, n} : Shape{groups, m, n};
    Tensor out = Tensor::empty(shape, DType::kFloat32, a.device());
    kernels::gemm(gemm_view(a), ta, gemm_view(b), tb, Tensor(), out);
    return out;
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    plan.set_geometry(x, w);
    record_inputs(x, w, b);
    state = float8_states_of(w, recipe);
    const Scaled xq = to_float8(x, *state, state->input, recipe, recipe.forward_dtype(), step, Twin::kNo);
    const Scaled wq = to_float8(w, *state, state->weight, recipe, recipe.forward_dtype(), step, Twin::kNo);
    saved.save(xq.data);
    saved.save(wq.data);
    x_meta = {Tensor(), Tensor(), xq.scale, xq.amax};
    w_meta = {Tensor(), Tensor(), wq.scale, wq.amax};

    const autocast::State autocast = autocast::state(x.device());
    const DType dtype = autocast.enabled ? autocast.dtype : x_dtype;
    const kernels::ConvGeometry& g = plan.geometry;
    const int64_t out_c = w.size(0), len = g.out_h * g.out_w, groups = plan.options.groups;
    Tensor y = Tensor::empty({x.size(0), out_c, g.out_h, g.out_w}, dtype, x.device());
    if (!finite_product(xq, wq)) {
      fill_(y, std::nan(""));
      return y;
    }
    const Tensor bias = has_bias && b.dtype() != dtype ? b.to(dtype) : b;
    const Tensor w3 = plan.weight_groups(wq.data);
    plan.for_each_chunk(x, w, kFloat8ChunkShare, [&](int64_t n0, int64_t n) {
      const Tensor cols = plan.columns(xq.data, w, n0, n);
      const Tensor s = sums(w3, Transpose::kNo, cols, Transpose::kNo, out_c / groups, n * len);
      Tensor ct = Tensor::empty({out_c, n, len}, dtype, x.device());
      Tensor ct_as_sums = reshape(ct, s.shape());
      kernels::descale(s, 1.0 / xq.scale / wq.scale, Tensor(), ct_as_sums);  // in double: each may be 1 / FLT_MAX
      kernels::samples_from_channels(ct, bias, n0, y);
    });
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Scaled xq = from_saved(saved[0], /*twin=*/false, x_meta), wq = from_saved(saved[1], /*twin=*/false, w_meta);
    const kernels::ConvGeometry& geometry = plan.geometry;
    const int64_t out_c = w_shape[0], len = geometry.out_h * geometry.out_w, groups = plan.options.groups;
    const int64_t rows = x_shape[1] * geometry.kh * geometry.kw;  // of the columns, Kg per group
    Tensor dx, dw, db;
    const bool need_dx = saved.needs_grad(0), need_dw = saved.needs_grad(1);
    if (need_dx || need_dw) {
      const Scaled g = to_float8(dy, *state, state->grad_output, recipe, recipe.backward_dtype(), step, Twin::kNo);
      const bool dx_finite = finite_product(g, wq), dw_finite = finite_product(g, xq);
      if (need_dx) dx = Tensor::empty(x_shape, x_dtype, dy.device());
      const Tensor w3 = plan.weight_groups(wq.data);
      Tensor dw_sums;  // float32, added over the chunks
      if ((need_dx && dx_finite) || (need_dw && dw_finite)) {
        plan.for_each_chunk(xq.data, wq.data, kFloat8ChunkShare, [&](int64_t n0, int64_t n) {
          Tensor dyt = Tensor::empty({groups, out_c / groups, n * len}, g.data.dtype(), dy.device());
          Tensor dyt_channels = reshape(dyt, {out_c, n, len});
          kernels::channels_from_samples(g.data, n0, dyt_channels);
          if (need_dw && dw_finite) {
            const Tensor cols = plan.columns(xq.data, wq.data, n0, n);
            const Tensor part = sums(dyt, Transpose::kNo, cols, Transpose::kYes, out_c / groups, rows / groups);
            if (dw_sums.defined()) {
              accumulate_(dw_sums, part);
            } else {
              dw_sums = part;
            }
          }
          if (need_dx && dx_finite) {
            const Tensor s = sums(w3, Transpose::kYes, dyt, Transpose::kNo, rows / groups, n * len);
            Tensor dcols = Tensor::empty({rows, n, len}, x_dtype, dy.device());
            Tensor dcols_as_sums = reshape(dcols, s.shape());
            kernels::descale(s, 1.0 / g.scale / wq.scale, Tensor(), dcols_as_sums);
            kernels::col2im(dcols, geometry, n0, dx);
          }
        });
      }
      if (need_dx && !dx_finite) fill_(dx, std::nan(""));
      if (need_dw && !dw_finite) {
        dw = full(w_shape, std::nan(""), w_dtype, dy.device());
      } else if (need_dw && dw_sums.defined()) {
        dw = Tensor::empty(w_shape, w_dtype, dy.device());
        Tensor dw_as_sums = reshape(dw, dw_sums.shape());
        kernels::descale(dw_sums, 1.0 / g.scale / xq.scale, Tensor(), dw_as_sums);
      } else if (need_dw) {
        dw = zeros(w_shape, w_dtype, dy.device());  // an empty batch
      }
    }
    if (has_bias && saved.needs_grad(2)) {
      Tensor column = Tensor::empty({out_c, 1}, dy.dtype(), dy.device());
      kernels::sum_to(reshape(dy, {x_shape[0], out_c, len}), 1.0, column);
      db = reshape(column, {out_c});
      if (db.dtype() != b_dtype) db = db.to(b_dtype);
    }
    return {dx, dw, db};
  }
};

}  // namespace

Tensor conv2d_float8(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options) {
  if (!x.defined() || x.dtype() == DType::kFloat64) return Tensor();
  // No GEMM in a depthwise convolution: it runs as it would outside the guard.
  if (x.dim() == 4 && w.defined() && w.dim() == 4 && is_depthwise(x, w, options.groups)) return Tensor();
  const fp8::Region region = fp8::region(x.device());
  Float8Conv2d op;
  op.plan = ConvPlan(options);
  op.recipe = region.recipe;
  op.step = region.step;
  return dispatch(std::move(op), x, w, b);
}

}  // namespace ampgrad::ops::detail
