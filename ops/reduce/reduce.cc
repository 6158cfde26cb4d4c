// Reductions: sum and mean (of everything or over dimensions; autocast runs them in float32 and
// they accumulate in double, so the error does not grow with the size), max and argmax along one
// dimension.
//   sum: dx = dy broadcast back     mean: dx = dy / count broadcast back
//   max: dx = dy at the index of the first maximum, 0 elsewhere
#include <algorithm>
#include <limits>

#include "framework/dispatch.h"
#include "ops/checks.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"

namespace ampgrad::ops {

int64_t normalize_dim(const char* op, int64_t dim, int64_t rank);  // shape.cc

namespace {

// The reduced shape with each reduced dimension kept as 1 (what sum_to writes), and the count of
// elements summed into each output.
struct Reduction {
  Shape kept_shape;  // x's shape with reduced dims set to 1
  Shape out_shape;   // kept_shape, or without the reduced dims when !keepdim
  int64_t count = 1;
};

Reduction plan_reduction(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Reduction r;
  r.kept_shape = x.shape();
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), dims.empty());  // no dims: all of them
  for (int64_t dim : dims) {
    const int64_t d = normalize_dim(op, dim, x.dim());
    AG_CHECK(!reduced[static_cast<size_t>(d)], op, ": dimension ", dim, " is listed twice in ", shape_to_string(dims));
    reduced[static_cast<size_t>(d)] = true;
  }
  for (size_t d = 0; d < reduced.size(); ++d) {
    if (!reduced[d]) {
      r.out_shape.push_back(x.shape()[d]);
      continue;
    }
    r.count *= x.shape()[d];
    r.kept_shape[d] = 1;
    if (keepdim) r.out_shape.push_back(1);
  }
  return r;
}

// sum (kMean = false) or mean (kMean = true) over the reduced dimensions; d/dx = dy (/ count),
// broadcast back over them.
template <bool kMean>
struct Reduce {
  static constexpr OpInfo kInfo{kMean ? "mean" : "sum", CastPolicy::kFloat32};
  Reduction r;
  Shape x_shape;

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  double scale() const { return kMean ? 1.0 / static_cast<double>(r.count) : 1.0; }

  Tensor forward(SavedTensors&, const Tensor& x) {
    x_shape = x.shape();
    if (r.count == 0) {  // a sum of nothing is 0 and a mean of nothing is NaN, as in PyTorch
      return full(r.out_shape, kMean ? std::numeric_limits<double>::quiet_NaN() : 0.0, x.dtype(), x.device());
    }
    Tensor out = Tensor::empty(r.kept_shape, x.dtype(), x.device());
    kernels::sum_to(x, scale(), out);
    return reshape(out, r.out_shape);
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
    if (dx.numel() > 0) kernels::affine(reshape(dy, r.kept_shape), scale(), 0.0, dx);
    return {dx};
  }
};

// The maxima along dim (kValues) or their indices (argmax, not differentiable).
template <bool kValues>
struct Max {
  static constexpr OpInfo kInfo{kValues ? "max" : "argmax", CastPolicy::kNone};
  int64_t dim;  // normalised
  bool keepdim;
  Shape x_shape;
  Tensor indices;  // kept for backward (int64, not a graph tensor)

  void check(const Tensor& x) const {
    AG_CHECK(x.defined(), kInfo.name, ": input is undefined");
    AG_CHECK(x.size(dim) > 0, kInfo.name, ": dimension ", dim, " of ", x.to_string(), " is empty, so it has no maximum");
  }

  Tensor forward(SavedTensors&, const Tensor& x) {
    x_shape = x.shape();
    Shape out_shape = x.shape();
    if (keepdim) {
      out_shape[static_cast<size_t>(dim)] = 1;
    } else {
      out_shape.erase(out_shape.begin() + dim);
    }
    indices = Tensor::empty(out_shape, DType::kInt64, x.device());
    Tensor out = kValues ? Tensor::empty(out_shape, x.dtype(), x.device()) : Tensor();
    kernels::max_along(x, dim, out, indices);
    return kValues ? out : indices;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
    kernels::max_backward(dy, indices, dim, dx);
    return {dx};
  }
};

}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }
Tensor mean(const Tensor& x) { return mean(x, {}, false); }

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  AG_CHECK(x.defined(), "sum: input is undefined");
  return dispatch(Reduce<false>{.r = plan_reduction("sum", x, dims, keepdim), .x_shape = {}}, x);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  AG_CHECK(x.defined(), "mean: input is undefined");
  return dispatch(Reduce<true>{.r = plan_reduction("mean", x, dims, keepdim), .x_shape = {}}, x);
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  AG_CHECK(x.defined(), "max: input is undefined");
  return dispatch(Max<true>{.dim = normalize_dim("max", dim, x.dim()), .keepdim = keepdim, .x_shape = {}, .indices = {}},
                  x);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  AG_CHECK(x.defined(), "argmax: input is undefined");
  return dispatch(
      Max<false>{.dim = normalize_dim("argmax", dim, x.dim()), .keepdim = keepdim, .x_shape = {}, .indices = {}}, x);
}

}  // namespace ampgrad::ops
