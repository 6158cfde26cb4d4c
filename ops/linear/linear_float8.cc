// linear with FP8 GEMMs (see linear_float8.h). Forward: x and w cast to E4M3 by their scales,
// y = (xq wq^T) / (sx sw) + b. Backward: dy cast to the backward format by its scale,
// dx = (dyq wq) / (sdy sw) and dw = (dyq^T xq) / (sdy sx), db from dy as it is. Only xq and wq are
// saved for backward: one byte an element where the BF16 path keeps two. Where the device's FP8
// GEMM wants both operands K-contiguous (CUDA), the casts whose transpose a backward GEMM reads
// (x and dy for dw, w for dx) also write it in the same pass, and the forward saves xq^T and wq^T
// in place of xq and wq, so the GEMMs copy nothing and the saved bytes stay the same.
//
// Scales follow the region's recipe (framework/float8_scaling.h): delayed scaling casts with the
// scale of the steps before and records this step's amax from the same pass; the first use of a
// state in a new step closes the previous one. A cast in a step the state has closed (an
// activation checkpoint recomputing its forward after a later step's) takes that step's scale and
// records nothing, so the recompute gives the forward's bits. Current scaling takes one more pass for the amax.
// The states live with the weight when it is a leaf (a parameter, the same tensor every step); a
// weight computed in the forward is new every step, so it and its linear scale by current amaxes.
// The saturating cast would turn an inf into +-max and hide an overflow from GradScaler: a product
// with a non-finite operand is NaN everywhere instead.
#include "ops/linear/linear_float8.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>

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
// and the source's amax. data_t is data's transposed twin where the cast made one (the device's
// FP8 GEMM wants K-contiguous operands); after the forward only one of the two is kept.
struct Scaled {
  Tensor data;
  Tensor data_t{};
  float scale = 1.0f;
  float amax = 0.0f;
};

// What the forward saves of an FP8 copy: its twin in its place where the cast made one (the
// backward's GEMMs read only the transpose then), so the saved bytes stay one copy's.
Tensor to_save(const Scaled& s) { return s.data_t.defined() ? s.data_t : s.data; }

// The saved FP8 copy back, with its cast's scale and amax (meta's), in the slot to_save took it from.
Scaled from_saved(const Tensor& saved, bool twin, const Scaled& meta) {
  Scaled s{Tensor(), Tensor(), meta.scale, meta.amax};
  (twin ? s.data_t : s.data) = saved;
  return s;
}

// Whether a cast should also make its transposed twin (where the device wants one): when a
// backward GEMM will read the tensor transposed.
enum class Twin : bool { kNo, kWanted };

Scaled to_float8(const Tensor& t, Float8LinearState& owner, Float8ScalingState& state, const Float8Recipe& recipe,
                 DType format, uint64_t step, Twin twin) {
  Scaled out{Tensor::empty(t.shape(), format, t.device())};
  const bool current = recipe.scaling == Float8Scaling::kCurrent;
  std::optional<float> recast;  // the scale of a closed step that this cast repeats
  {
    const std::lock_guard<std::mutex> lock(owner.mutex);
    if (step < state.step) recast = state.scale_of_closed_step(step);
  }
  const float amax = current ? kernels::amax(t) : 0.0f;
  {
    const std::lock_guard<std::mutex> lock(owner.mutex);
    if (step > state.step) {  // the first use in a new step closes the one before
      state.keep_step_scale();
      if (recipe.scaling == Float8Scaling::kNone) {
        state.clear_step_amax();
      } else if (!current) {
        state.update(recipe, format);
      }
      state.start_step_counts(format);
      state.step = step;
    }
    if (recipe.scaling == Float8Scaling::kNone) {
      out.scale = 1.0f;
    } else if (recast) {  // current scaling: from this amax again, as that step's cast did
      out.scale = current ? float8_scale(amax, format, recipe.margin, recipe.power_of_two_scales, *recast) : *recast;
    } else {
      if (current) state.set_from_amax(amax, recipe, format);
      out.scale = state.scale();
    }
  }
  const Float8CastCounts cast = twin == Twin::kWanted
                                    ? kernels::quantize_float8_pair(t, out.scale, out.data, out.data_t)
                                    : kernels::quantize_float8(t, out.scale, out.data);
  out.amax = cast.amax;
  if (recast) return out;  // that step recorded these values when it first cast them
  const std::lock_guard<std::mutex> lock(owner.mutex);
  if (!current) state.record_amax(cast.amax);
  state.record_cast(cast);
  return out;
}

// An FP8 operand as gemm takes it: a stored matrix and whether to read it transposed.
struct Operand {
  Tensor data;
  Transpose transpose;
};

enum class Side : bool { kLeft, kRight };

// op(s) as the `side` operand of a GEMM: from s.data read as `t`, or from its twin read the other
// way where that puts K contiguous (a left operand not transposed, a right one transposed: the
// "TN" layout cuBLASLt's FP8 matmul takes on Hopper) or where s.data was not kept. Without twins
// (the CPU) this is always s.data as `t`.
Operand operand(const Scaled& s, Transpose t, Side side) {
  const Transpose k_contiguous = side == Side::kLeft ? Transpose::kNo : Transpose::kYes;
  if (!s.data_t.defined() || (s.data.defined() && t == k_contiguous)) return {s.data, t};
  return {s.data_t, t == Transpose::kYes ? Transpose::kNo : Transpose::kYes};
}

// op(a) op(b) over FP8 operands, descaled by 1 / (a's scale * b's scale) (+ bias), as `dtype`.
Tensor scaled_product(const Scaled& a, Transpose ta, const Scaled& b, Transpose tb, const Tensor& bias,
                      const Shape& shape, DType dtype) {
  const Operand left = operand(a, ta, Side::kLeft), right = operand(b, tb, Side::kRight);
  const int64_t m = left.data.size(left.transpose == Transpose::kYes ? 1 : 0);
  const int64_t n = right.data.size(right.transpose == Transpose::kYes ? 0 : 1);
  Tensor out = Tensor::empty(shape, dtype, left.data.device());
  if (!std::isfinite(a.amax) || !std::isfinite(b.amax)) {
    fill_(out, std::nan(""));
    return out;
  }
  Tensor sums = Tensor::empty({m, n}, DType::kFloat32, left.data.device());
  kernels::gemm(left.data, left.transpose, right.data, right.transpose, Tensor(), sums);
  // Formed in double: each inverse scale may be as small as 1 / FLT_MAX.
  kernels::descale(sums, 1.0 / a.scale / b.scale, bias, out);
  return out;
}

struct Float8Linear {
  static constexpr OpInfo kInfo{"linear", CastPolicy::kNone};  // the op casts its operands itself
  Float8Recipe recipe;
  uint64_t step = 0;
  std::shared_ptr<Float8LinearState> state;
  Shape x_shape, w_shape;
  DType x_dtype = DType::kFloat32, w_dtype = DType::kFloat32, b_dtype = DType::kFloat32;
  bool has_bias = false;
  Scaled x_meta, w_meta;  // their scales and amaxes (the FP8 data is in the saved tensors)
  bool x_twin = false, w_twin = false;  // whether the saved tensor is the transposed twin

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    // Under autocast the operands need not share a dtype (autocast would cast them all); the FP8
    // casts read each as it is.
    check_linear(kInfo.name, x, w, b, /*same_dtype=*/!autocast::state(x.device()).enabled);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    x_shape = x.shape();
    w_shape = w.shape();
    x_dtype = x.dtype();
    w_dtype = w.dtype();
    has_bias = b.defined();
    if (has_bias) b_dtype = b.dtype();
    state = states_of(w);
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
  const fp8::Region region = fp8::region(x.device());
  Float8Linear op;
  op.recipe = region.recipe;
  op.step = region.step;
  return dispatch(std::move(op), x, w, b);
}

}  // namespace ampgrad::ops::detail
