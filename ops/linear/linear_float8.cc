// linear with FP8 GEMMs (see linear_float8.h). Forward: x and w cast to E4M3 by their scales,
// y = (xq wq^T) / (sx sw) + b. Backward: dy cast to the backward format by its scale,
// dx = (dyq wq) / (sdy sw) and dw = (dyq^T xq) / (sdy sx), db from dy as it is. Only xq and wq are
// saved for backward: one byte an element where the BF16 path keeps two. Where the device's FP8
// GEMM wants both operands K-contiguous (CUDA), the casts whose transpose a backward GEMM reads
// (x and dy for dw, w for dx) also write it in the same pass, and the forward saves xq^T and wq^T
// in place of xq and wq, so the GEMMs copy nothing and the saved bytes stay the same.
// The casts, their scales and the descaled products are float8_operands.h's.
#include "ops/linear/linear_float8.h"

#include <memory>

#include "framework/autocast.h"
#include "framework/dispatch.h"
#include "framework/float8_scaling.h"
#include "ops/checks.h"
#include "ops/linear/float8_operands.h"
#include "ops/linear/linear_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::ops::detail {

namespace {

using kernels::Transpose;

struct Float8Linear : Float8Inputs {
  static constexpr OpInfo kInfo{"linear", CastPolicy::kNone};  // the op casts its operands itself
  Float8Recipe recipe;
  uint64_t step = 0;
  std::shared_ptr<Float8LinearState> state;
  Scaled x_meta, w_meta;  // their scales and amaxes (the FP8 data is in the saved tensors)
  bool x_twin = false, w_twin = false;  // whether the saved tensor is the transposed twin

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    // Under autocast the operands need not share a dtype (autocast would cast them all); the FP8
    // casts read each as it is.
    check_linear(kInfo.name, x, w, b, /*same_dtype=*/!autocast::state(x.device()).enabled);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    record_inputs(x, w, b);
    state = float8_states_of(w, recipe);
    const int64_t rows = shape_numel(Shape(x_shape.begin(), x_shape.end() - 1));
    // dw reads x transposed and dx reads w so: their casts make the twins those GEMMs want.
    Scaled xq = to_float8(reshape(x, {rows, x.size(-1)}), *state, state->input, recipe, recipe.forward_dtype(), step,
                          saved.needs_grad(1) ? Twin::kWanted : Twin::kNo);
    Scaled wq = to_float8(w, *state, state->weight, recipe, recipe.forward_dtype(), step,
                          saved.needs_grad(0) ? Twin::kWanted : Twin::kNo);
    x_twin = xq.data_t.defined();
    w_twin = wq.data_t.defined();
    saved.save(to_save(xq));
    saved.save(to_save(wq));
    const autocast::State autocast = autocast::state(x.device());
    Shape out_shape = x_shape;
    out_shape.back() = w.size(0);
    Tensor y = scaled_product(xq, Transpose::kNo, wq, Transpose::kYes, b, out_shape,
                              autocast.enabled ? autocast.dtype : x_dtype);
    x_meta = {Tensor(), Tensor(), xq.scale, xq.amax};
    w_meta = {Tensor(), Tensor(), wq.scale, wq.amax};
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Scaled xq = from_saved(saved[0], x_twin, x_meta), wq = from_saved(saved[1], w_twin, w_meta);
    const int64_t rows = shape_numel(Shape(x_shape.begin(), x_shape.end() - 1));
    const Tensor dy2 = reshape(dy, {rows, w_shape[0]});
    // Cast only for a GEMM that reads it (db alone sums dy as it is); dw reads dy transposed.
    Scaled g;
    if (saved.needs_grad(0) || saved.needs_grad(1)) {
      g = to_float8(dy2, *state, state->grad_output, recipe, recipe.backward_dtype(), step,
                    saved.needs_grad(1) ? Twin::kWanted : Twin::kNo);
    }
    Tensor dx, dw, db;
    if (saved.needs_grad(0)) dx = scaled_product(g, Transpose::kNo, wq, Transpose::kNo, Tensor(), x_shape, x_dtype);
    if (saved.needs_grad(1)) {
      dw = scaled_product(g, Transpose::kYes, xq, Transpose::kNo, Tensor(), w_shape, w_dtype);
    }
    if (has_bias && saved.needs_grad(2)) {
      db = Tensor::empty({w_shape[0]}, dy.dtype(), dy.device());
      kernels::sum_to(dy2, 1.0, db);
      if (db.dtype() != b_dtype) db = db.to(b_dtype);
    }
    return {dx, dw, db};
  }
};

}  // namespace

Tensor linear_float8(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (!x.defined() || x.dtype() == DType::kFloat64) return Tensor();
  const fp8::Region region = fp8::region(x.device());
  Float8Linear op;
  op.recipe = region.recipe;
  op.step = region.step;
  return dispatch(std::move(op), x, w, b);
}

}  // namespace ampgrad::ops::detail
