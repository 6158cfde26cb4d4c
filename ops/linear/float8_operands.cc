// The FP8 operands of linear's and conv2d's GEMMs (see float8_operands.h).
//
// Scales follow the region's recipe (framework/float8_scaling.h): delayed scaling casts with the
// scale of the steps before and records this step's amax from the same pass; the first use of a
// state in a new step closes the previous one. A cast in a step the state has closed (an
// activation checkpoint recomputing its forward after a later step's) takes that step's scale and
// records nothing, so the recompute gives the forward's bits. Current scaling takes one more pass for the amax.
#include "ops/linear/float8_operands.h"

#include <mutex>
#include <optional>

#include "framework/copy.h"
#include "framework/tensor_impl.h"
#include "ops/linear/linear_float8_kernels.h"

namespace ampgrad::ops::detail {

using kernels::Transpose;

namespace {

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

}  // namespace

Tensor to_save(const Scaled& s) { return s.data_t.defined() ? s.data_t : s.data; }

Scaled from_saved(const Tensor& saved, bool twin, const Scaled& meta) {
  Scaled s{Tensor(), Tensor(), meta.scale, meta.amax};
  (twin ? s.data_t : s.data) = saved;
  return s;
}

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

Tensor scaled_product(const Scaled& a, Transpose ta, const Scaled& b, Transpose tb, const Tensor& bias,
                      const Shape& shape, DType dtype) {
  const Operand left = operand(a, ta, Side::kLeft), right = operand(b, tb, Side::kRight);
  const int64_t m = left.data.size(left.transpose == Transpose::kYes ? 1 : 0);
  const int64_t n = right.data.size(right.transpose == Transpose::kYes ? 0 : 1);
  Tensor out = Tensor::empty(shape, dtype, left.data.device());
  if (!finite_product(a, b)) {
    fill_(out, std::nan(""));
    return out;
  }
  Tensor sums = Tensor::empty({m, n}, DType::kFloat32, left.data.device());
  kernels::gemm(left.data, left.transpose, right.data, right.transpose, Tensor(), sums);
  // Formed in double: each inverse scale may be as small as 1 / FLT_MAX.
  kernels::descale(sums, 1.0 / a.scale / b.scale, bias, out);
  return out;
}

std::shared_ptr<Float8LinearState> float8_states_of(const Tensor& w, Float8Recipe& recipe) {
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

}  // namespace ampgrad::ops::detail
