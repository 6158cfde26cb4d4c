// conv2d as GEMMs over im2col columns on the GEMM engine (FP32 sums for every storage type), or a
// direct depthwise kernel.
// Autocast runs it in lower precision. Per group g, with cols [Kg, n L] the chunk's columns:
//   out_g = w_g cols_g  (+ b);  dw_g = dy_g cols_g^T;  dcols_g = w_g^T dy_g, dx = col2im(dcols)
// The columns of a chunk of samples are built, used and dropped, in the forward and again in the
// backward: nothing of im2col's size K n L lives from forward to backward. A depthwise convolution
// (groups = C = O) runs a direct kernel instead, and so does a stride-1 one on the CPU in float32
// (with the GEMM route's bits) or bfloat16 (forward and both gradients; conv_direct_cpu.cc).
// Inside a Float8Guard the GEMMs take FP8 operands (conv_float8.cc).
#include <algorithm>

#include "framework/copy.h"
#include "framework/dispatch.h"
#include "framework/float8_scaling.h"
#include "ops/checks.h"
#include "ops/conv/conv_float8.h"
#include "ops/conv/conv_kernels.h"
#include "ops/conv/conv_plan.h"
#include "ops/linear/linear_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::ops {

namespace {

using kernels::Transpose;
using kernels::gemm;

struct Conv2d {
  static constexpr OpInfo kInfo{"conv2d", CastPolicy::kLowerPrecision};
  detail::ConvPlan plan{};
  bool has_bias = false;

  void check(const Tensor& x, const Tensor& w, const Tensor& b) const {
    detail::check_conv2d(kInfo.name, x, w, b, plan.options, /*same_dtype=*/true);
  }

  Tensor forward(SavedTensors& saved, const Tensor& x, const Tensor& w, const Tensor& b) {
    saved.save(x);
    saved.save(w);
    has_bias = b.defined();
    plan.set_geometry(x, w);
    const kernels::ConvGeometry& geometry = plan.geometry;
    const int64_t batch = x.size(0), out_c = w.size(0), len = geometry.out_h * geometry.out_w;
    Tensor out = Tensor::empty({batch, out_c, geometry.out_h, geometry.out_w}, x.dtype(), x.device());
    if (plan.depthwise(x, w)) {
      kernels::depthwise_conv2d(x, w, b, geometry, out);
      return out;
    }
    if (kernels::direct_conv2d_applies(x, w, geometry, plan.options.groups)) {
      kernels::cpu::direct_conv2d(x, w, b, geometry, out);
      return out;
    }
    const Tensor w3 = plan.weight_groups(w);
    plan.for_each_chunk(x, w, /*share=*/1, [&](int64_t n0, int64_t n) {
      const Tensor cols = plan.columns(x, w, n0, n);
      const Tensor ct = gemm(w3, Transpose::kNo, cols, Transpose::kNo);  // [g, O/g, n L]
      kernels::samples_from_channels(reshape(ct, {out_c, n, len}), b, n0, out);
    });
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    const Tensor& x = saved[0];
    const Tensor& w = saved[1];
    const kernels::ConvGeometry& geometry = plan.geometry;
    const int64_t out_c = w.size(0), len = geometry.out_h * geometry.out_w, groups = plan.options.groups;
    const Tensor w3 = plan.weight_groups(w);
    Tensor dx, dw, db;
    if (saved.needs_grad(0)) dx = Tensor::empty(x.shape(), dy.dtype(), dy.device());
    if (saved.needs_grad(1) && plan.depthwise(x, w)) dw = Tensor::empty(w.shape(), dy.dtype(), dy.device());
    if (plan.depthwise(x, w)) {
      if (dx.defined() || dw.defined()) kernels::depthwise_conv2d_backward(x, w, dy, geometry, dx, dw);
    } else if (saved.needs_grad(0) || saved.needs_grad(1)) {
      // Where the forward was a direct convolution, so are both gradients; the im2col route does
      // the rest, and dw again where the direct one holds a NaN (conv_kernels.h: a non-finite x can
      // put one where this route has none; a NaN both routes share, on a diverged step, costs dw
      // twice).
      bool need_dx = saved.needs_grad(0), need_dw = saved.needs_grad(1);
      if (kernels::direct_conv2d_applies(x, w, geometry, groups)) {
        if (need_dx) kernels::cpu::direct_conv2d_input_grad(dy, w, geometry, dx);
        if (need_dw) {
          dw = Tensor::empty(w.shape(), dy.dtype(), dy.device());
          if (!kernels::cpu::direct_conv2d_weight_grad(x, dy, geometry, dw)) dw = Tensor();
        }
        need_dx = false;
        need_dw = need_dw && !dw.defined();
      }
      if (need_dx || need_dw) {
        plan.for_each_chunk(x, w, /*share=*/1, [&](int64_t n0, int64_t n) {
          Tensor dyt = Tensor::empty({groups, out_c / groups, n * len}, dy.dtype(), dy.device());
          Tensor dyt_channels = reshape(dyt, {out_c, n, len});
          kernels::channels_from_samples(dy, n0, dyt_channels);
          if (need_dw) {
            const Tensor cols = plan.columns(x, w, n0, n);
            const Tensor part = reshape(gemm(dyt, Transpose::kNo, cols, Transpose::kYes), w.shape());
            if (dw.defined()) {
              accumulate_(dw, part);  // a later chunk: one rounding per chunk, few chunks by the budget
            } else {
              dw = part;
            }
          }
          if (need_dx) {
            Tensor dcols = reshape(gemm(w3, Transpose::kYes, dyt, Transpose::kNo),
                                   {x.size(1) * geometry.kh * geometry.kw, n, len});
            kernels::col2im(dcols, geometry, n0, dx);
          }
        });
      }
    }
    if (saved.needs_grad(1) && !dw.defined()) dw = zeros(w.shape(), dy.dtype(), dy.device());  // an empty batch
    if (has_bias && saved.needs_grad(2)) {
      Tensor column = Tensor::empty({out_c, 1}, dy.dtype(), dy.device());
      kernels::sum_to(reshape(dy, {x.size(0), out_c, len}), 1.0, column);
      db = reshape(column, {out_c});
    }
    return {dx, dw, db};
  }
};

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& options) {
  // An unbatched [C, H, W] input is a batch of one, as in PyTorch.
  if (x.defined() && x.dim() == 3) return squeeze(conv2d(unsqueeze(x, 0), w, b, options), 0);
  if (x.defined() && fp8::region(x.device()).enabled) {
    if (Tensor y = detail::conv2d_float8(x, w, b, options); y.defined()) return y;
  }
  return dispatch(Conv2d{.plan = detail::ConvPlan(options)}, x, w, b);
}

}  // namespace ampgrad::ops
