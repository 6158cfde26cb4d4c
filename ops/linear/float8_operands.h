// The FP8 operands of the GEMM ops inside a Float8Guard (linear's three GEMMs, conv2d's): a
// tensor's scaled cast through its scaling state, the descaled product, the states a weight keeps.
// Internal to ops/: linear_float8.cc and conv_float8.cc build on it.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>

#include "framework/float8_scaling.h"
#include "framework/tensor.h"
#include "ops/linear/linear_kernels.h"

namespace ampgrad::ops::detail {

/// An FP8 copy of a tensor, the scale it was cast with (its values are scale times the source's)
/// and the source's amax. data_t is data's transposed twin where the cast made one (the device's
/// FP8 GEMM wants K-contiguous operands); after the forward only one of the two is kept.
struct Scaled {
  Tensor data;
  Tensor data_t{};
  float scale = 1.0f;
  float amax = 0.0f;
};

/// What the forward saves of an FP8 copy: its twin in its place where the cast made one (the
/// backward's GEMMs read only the transpose then), so the saved bytes stay one copy's.
Tensor to_save(const Scaled& s);

/// The saved FP8 copy back, with its cast's scale and amax (meta's), in the slot to_save took it from.
Scaled from_saved(const Tensor& saved, bool twin, const Scaled& meta);

/// What an FP8 GEMM op (linear, conv2d) keeps of its inputs for the backward beside their FP8
/// copies: the shapes and dtypes its gradients take, and whether there was a bias.
struct Float8Inputs {
  Shape x_shape, w_shape;
  DType x_dtype = DType::kFloat32, w_dtype = DType::kFloat32, b_dtype = DType::kFloat32;
  bool has_bias = false;

  void record_inputs(const Tensor& x, const Tensor& w, const Tensor& b) {
    x_shape = x.shape();
    w_shape = w.shape();
    x_dtype = x.dtype();
    w_dtype = w.dtype();
    has_bias = b.defined();
    if (has_bias) b_dtype = b.dtype();
  }
};

/// Whether a cast should also make its transposed twin (where the device wants one): when a
/// backward GEMM will read the tensor transposed.
enum class Twin : bool { kNo, kWanted };

/// t cast to `format` by the scale `state` gives it under `recipe` in `step` (delayed scaling: the
/// scale of the steps before, this cast's amax recorded; current: this tensor's amax), with its
/// twin where asked and the device makes one. `owner` holds `state` and its mutex.
Scaled to_float8(const Tensor& t, Float8LinearState& owner, Float8ScalingState& state, const Float8Recipe& recipe,
                 DType format, uint64_t step, Twin twin);

/// Whether a product of these FP8 copies is finite: the saturating cast would turn an inf into
/// +-max and hide an overflow from GradScaler, so a product with a non-finite operand is NaN
/// everywhere instead.
inline bool finite_product(const Scaled& a, const Scaled& b) {
  return std::isfinite(a.amax) && std::isfinite(b.amax);
}

/// op(a) op(b) over FP8 matrices, descaled by 1 / (a's scale * b's scale) (+ bias per column), as
/// `dtype` in `shape` (of m x n elements); NaN everywhere unless finite_product(a, b).
Tensor scaled_product(const Scaled& a, kernels::Transpose ta, const Scaled& b, kernels::Transpose tb,
                      const Tensor& bias, const Shape& shape, DType dtype);

/// The scaling states of the op whose weight is w: a leaf weight (a parameter, the same tensor
/// every step) keeps its own across steps (TensorImpl::float8); a weight computed in the forward
/// is new every step, so it gets fresh ones and `recipe` turns to current scaling (unless none).
std::shared_ptr<Float8LinearState> float8_states_of(const Tensor& w, Float8Recipe& recipe);

}  // namespace ampgrad::ops::detail
