// Reductions to one element: sum and mean. They accumulate in FP32 (FP64 for float64) and
// round once; autocast runs them in float32.
#include <limits>

#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/elementwise_kernels.h"
#include "ops/reduce_kernels.h"
#include "ops/ops.h"

namespace ampgrad::ops {

namespace {

// sum (kMean = false) or mean (kMean = true) of all elements; d/dx = dy (/ N) everywhere.
template <bool kMean>
struct Reduce {
  static constexpr OpInfo kInfo{kMean ? "mean" : "sum", CastPolicy::kFloat32};
  Shape x_shape;

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  double scale(int64_t n) const { return kMean ? 1.0 / static_cast<double>(n) : 1.0; }

  Tensor forward(SavedTensors&, const Tensor& x) {
    x_shape = x.shape();
    if (x.numel() == 0) {  // sum of nothing is 0 and mean of nothing is NaN, as in PyTorch
      return full({}, kMean ? std::numeric_limits<double>::quiet_NaN() : 0.0, x.dtype(), x.device());
    }
    Tensor out = Tensor::empty({}, x.dtype(), x.device());
    kernels::sum_to(x, scale(x.numel()), out);
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
    if (dx.numel() > 0) kernels::affine(dy, scale(dx.numel()), 0.0, dx);
    return {dx};
  }
};

}  // namespace

Tensor sum(const Tensor& x) { return dispatch(Reduce<false>{}, x); }
Tensor mean(const Tensor& x) { return dispatch(Reduce<true>{}, x); }

}  // namespace ampgrad::ops
