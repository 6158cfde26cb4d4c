// linear with FP8 GEMMs (see linear_float8.h). Forward: x and w cast to E4M3 by their scales,
// y = (xq wq^T) / (sx sw) + b. Backward: dy cast to the backward format by its scale,
// dx = (dyq wq) / (sdy sw) and dw = (dyq^T xq) / (sdy sx), db from dy as it is. Only xq and wq are
// saved for backward: one byte an element where the BF16 path keeps two.
//
// Scales follow the region's recipe (framework/float8_scaling.h): delayed scaling casts with the
// scale of the steps before and records this step's amax from the same pass; the first use of a
// state in a new step closes the previous one. Current scaling takes one more pass for the amax.
// The states live with the weight when it is a leaf (a parameter, the same tensor every step); a
// weight computed in the forward is new every step, so it and its linear scale by current amaxes.
// The saturating cast would turn an inf into +-max and hide an overflow from GradScaler: a product
// with a non-finite operand is NaN everywhere instead.
#include "ops/linear/linear_float8.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>

#include "framework/autocast.h"
#include "framework/copy.h"
#include "framework/dispatch.h"
#include "framework/float8_scaling.h"
#include "framework/tensor_impl.h"
#include "ops/checks.h"
#include "ops/linear/linear_float8_kernels.h"
#include "ops/linear/linear_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::ops::detail {

namespace {

using kernels::Transpose;

// An FP8 copy of a tensor, the scale it was cast with (its values are scale times the source's)
// and the source's amax.
struct Scaled {
  Tensor data;
  float scale = 1.0f;
  float amax = 0.0f;
};

Scaled to_float8(const Tensor& t, Float8LinearState& owner, Float8ScalingState& state, const Float8Recipe& recipe,
                 DType format, uint64_t step) {
  Scaled out{Tensor::empty(t.shape(), format, t.device())};
  if (recipe.scaling == Float8Scaling::kCurrent) {
    out.amax = kernels::cpu::amax(t);
    {
      const std::lock_guard<std::mutex> lock(owner.mutex);
      state.set_from_amax(out.amax, recipe, format);
      state.step = std::max(state.step, step);
      out.scale = state.scale();
    }
    kernels::cpu::quantize_float8(t, out.scale, out.data);
    return out;
  }
  {
    const std::lock_guard<std::mutex> lock(owner.mutex);
    if (step > state.step) {  // the first use in a new step closes the one before
      if (recipe.scaling == Float8Scaling::kNone) {
        state.clear_step_amax();
      } else {
        state.update(recipe, format);
      }
      state.step = step;
    }
    out.scale = recipe.scaling == Float8Scaling::kNone ? 1.0f : state.scale();
  }
  out.amax = kernels::cpu::quantize_float8(t, out.scale, out.data);
  const std::lock_guard<std::mutex> lock(owner.mutex);
  state.record_amax(out.amax);
  return out;
}

// op(a) op(b) over FP8 operands, descaled by 1 / (a's scale * b's scale) (+ bias), as `dtype`.
Tensor scaled_product(const Scaled& a, Transpose ta, const Scaled& b, Transpose tb, const Tensor& bias,
                      const Shape& shape, DType dtype) {
  const int64_t m = ta == Transpose::kYes ? a.data.size(1) : a.data.size(0);
  const int64_t n = tb == Transpose::kYes ? b.data.size(0) : b.data.size(1);
  Tensor out = Tensor::empty(shape, dtype, a.data.device());
  if (!std::isfinite(a.amax) || !std::isfinite(b.amax)) {
    fill_(out, std::nan(""));
    return out;
  }
  Tensor sums = Tensor::empty({m, n}, DType::kFloat32, a.data.device());
  kernels::gemm(a.data, ta, b.data, tb, Tensor(), sums);
  // Formed in double: each inverse scale may be as small as 1 / FLT_MAX.
  kernels::cpu::descale(sums, 1.0 / a.scale / b.scale, bias, out);
  return out;
}

struct Float8Linear {
  static constexpr OpInfo kInfo{"linear", CastPolicy::kNone};  // the op casts its operands itself
  Float8Recipe recipe;
  uint64_t step = 0;
  std::shared_ptr<Float8LinearState> state;
  Shape x_shape;
  DType x_dtype = DType::kFloat32, w_dtype = DType::kFloat32, b_dtype = DType::kFloat32;
  bool has_bias = false;
  Scaled x_meta, w_meta;  // their scales and amaxes (the FP8 data is in the saved tensors)

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    // Under autocast the operands need not share a dtype (autocast would cast them all); the FP8
    // casts read each as it is.
    check_linear(kInfo.name, x, w, b, /*same_dtype=*/!autocast::state(x.device()).enabled);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    x_shape = x.shape();
    x_dtype = x.dtype();
    w_dtype = w.dtype();
    has_bias = b.defined();
    if (has_bias) b_dtype = b.dtype();
    state = states_of(w);
    const int64_t rows = shape_numel(Shape(x_shape.begin(), x_shape.end() - 1));
    Scaled xq = to_float8(reshape(x, {rows, x.size(-1)}), *state, state->input, recipe, recipe.forward_dtype(), step);
    Scaled wq = to_float8(w, *state, state->weight, recipe, recipe.forward_dtype(), step);
    saved.save(xq.data);
    saved.save(wq.data);
    const autocast::State autocast = autocast::state(x.device());
    Shape out_shape = x_shape;
    out_shape.back() = w.size(0);
    Tensor y = scaled_product(xq, Transpose::kNo, wq, Transpose::kYes, b, out_shape,
                              autocast.enabled ? autocast.dtype : x_dtype);
    x_meta = {Tensor(), xq.scale, xq.amax};
    w_meta = {Tensor(), wq.scale, wq.amax};
    return y;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Scaled xq{saved[0], x_meta.scale, x_meta.amax}, wq{saved[1], w_meta.scale, w_meta.amax};
    const Tensor dy2 = reshape(dy, {xq.data.size(0), wq.data.size(0)});
    const Scaled g = to_float8(dy2, *state, state->grad_output, recipe, recipe.backward_dtype(), step);
    Tensor dx, dw, db;
    if (saved.needs_grad(0)) dx = scaled_product(g, Transpose::kNo, wq, Transpose::kNo, Tensor(), x_shape, x_dtype);
    if (saved.needs_grad(1)) {
      dw = scaled_product(g, Transpose::kYes, xq, Transpose::kNo, Tensor(), wq.data.shape(), w_dtype);
    }
    if (has_bias && saved.needs_grad(2)) {
      db = Tensor::empty({wq.data.size(0)}, dy.dtype(), dy.device());
      kernels::sum_to(dy2, 1.0, db);
      if (db.dtype() != b_dtype) db = db.to(b_dtype);
    }
    return {dx, dw, db};
  }

  // A leaf weight keeps its states across steps; any other gets fresh ones, scaled by current amaxes.
  std::shared_ptr<Float8LinearState> states_of(const Tensor& w) {
    if (w.grad_fn() != nullptr) {
      recipe.scaling = recipe.scaling == Float8Scaling::kNone ? Float8Scaling::kNone : Float8Scaling::kCurrent;
      return std::make_shared<Float8LinearState>();
    }
    static std::mutex creating;
    const std::lock_guard<std::mutex> lock(creating);
    TensorImpl* owner = w.impl();
    if (owner->float8 == nullptr) owner->float8 = std::make_shared<Float8LinearState>();
    return owner->float8;
  }
};

}  // namespace

Tensor linear_float8(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (!x.defined() || x.dtype() == DType::kFloat64) return Tensor();
  if (x.device() != Device::kCPU) {
    static std::once_flag told;
    std::call_once(told, [] {
      std::fprintf(stderr,
                   "ampgrad: linear inside a Float8Guard on CUDA runs as it would outside the guard for now (the "
                   "CUDA FP8 GEMMs are not built yet)\n");
    });
    return Tensor();
  }
  const fp8::Region region = fp8::region(x.device());
  Float8Linear op;
  op.recipe = region.recipe;
  op.step = region.step;
  return dispatch(std::move(op), x, w, b);
}

}  // namespace ampgrad::ops::detail
