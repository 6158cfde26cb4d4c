// Shape ops: reshape (a view: tensors are always contiguous, so any reshape shares storage),
// permute/transpose, narrow/split/chunk, cat and expand (contiguous copies through strided_copy).
// Every one accepts integer tensors and is differentiable for floating ones:
//   reshape: dx = reshape(dy)            permute: dx = permute(dy, inverse)
//   narrow:  dx = dy placed in zeros     cat: dx_i = narrow(dy)     expand: dx = sum_to(dy)
#include <algorithm>
#include <numeric>

#include "framework/dispatch.h"
#include "framework/tensor_impl.h"
#include "ops/checks.h"
#include "ops/ops.h"
#include "ops/reduce/reduce_kernels.h"
#include "ops/shape/shape_kernels.h"

namespace ampgrad::ops {

namespace {

using kernels::contiguous_strides;
using kernels::make_plan;
using kernels::strided_copy;

// x's storage seen with another shape of as many elements (no copy, no history).
Tensor alias(const Tensor& x, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl()->storage;
  impl->shape = shape;
  impl->numel = x.numel();
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

// `shape` with its one -1 inferred from x's element count.
Shape infer_shape(const Tensor& x, const Shape& shape) {
  Shape out = shape;
  int64_t known = 1, inferred = -1;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == -1) {
      AG_CHECK(inferred < 0, "reshape: only one dimension can be -1, got ", shape_to_string(shape));
      inferred = static_cast<int64_t>(d);
    } else {
      AG_CHECK(out[d] >= 0, "reshape: invalid size ", out[d], " in ", shape_to_string(shape));
      known *= out[d];
    }
  }
  if (inferred >= 0) {
    AG_CHECK(known != 0 && x.numel() % known == 0, "reshape: cannot infer the -1 of ", shape_to_string(shape),
             " for ", x.to_string(), " (", x.numel(), " elements)");
    out[static_cast<size_t>(inferred)] = x.numel() / known;
  }
  AG_CHECK(shape_numel(out) == x.numel(), "reshape: ", x.to_string(), " (", x.numel(),
           " elements) cannot be viewed as ", shape_to_string(shape), " (", shape_numel(out), " elements)");
  return out;
}

// x with its dimensions in the order `dims` (a permutation), as a contiguous copy.
Tensor permuted(const Tensor& x, const std::vector<int64_t>& dims) {
  const Shape in_strides = contiguous_strides(x.shape());
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    shape[i] = x.shape()[static_cast<size_t>(dims[i])];
    strides[i] = in_strides[static_cast<size_t>(dims[i])];
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  strided_copy(x, out, make_plan<2>(shape, {contiguous_strides(shape), strides}));
  return out;
}

// The slice [start, start + length) of x along dim, as a contiguous copy.
Tensor sliced(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Shape shape = x.shape();
  shape[static_cast<size_t>(dim)] = length;
  const Shape strides = contiguous_strides(x.shape());
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  strided_copy(x, out, make_plan<2>(shape, {contiguous_strides(shape), strides}, {0, start * strides[static_cast<size_t>(dim)]}));
  return out;
}

// Copies src into the slice of dst that starts at `start` along dim (src has the slice's shape).
void place(const Tensor& src, Tensor& dst, int64_t dim, int64_t start) {
  const Shape strides = contiguous_strides(dst.shape());
  strided_copy(src, dst, make_plan<2>(src.shape(), {strides, contiguous_strides(src.shape())},
                                      {start * strides[static_cast<size_t>(dim)], 0}));
}

struct Reshape {
  static constexpr OpInfo kInfo{"reshape", CastPolicy::kNone, kAnyInputMayBeInteger};
  Shape shape;
  Shape in_shape;

  void check(const Tensor& x) const { AG_CHECK(x.defined(), kInfo.name, ": input is undefined"); }

  Tensor forward(SavedTensors&, const Tensor& x) {
    in_shape = x.shape();
    return alias(x, infer_shape(x, shape));
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const { return {alias(dy, in_shape)}; }
};

struct Permute {
  static constexpr OpInfo kInfo{"permute", CastPolicy::kNone, kAnyInputMayBeInteger};
  std::vector<int64_t> dims;  // normalised to [0, rank)

  void check(const Tensor& x) const {
    AG_CHECK(x.defined(), kInfo.name, ": input is undefined");
    std::vector<bool> seen(dims.size(), false);
    bool ok = static_cast<int64_t>(dims.size()) == x.dim();
    for (int64_t d : dims) {
      ok = ok && d >= 0 && d < x.dim() && !seen[static_cast<size_t>(d)];
      if (ok) seen[static_cast<size_t>(d)] = true;
    }
    AG_CHECK(ok, kInfo.name, ": dims must be a permutation of the ", x.dim(), " dimensions of ", x.to_string(),
             ", got ", shape_to_string(dims));
  }

  Tensor forward(SavedTensors&, const Tensor& x) const { return permuted(x, dims); }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    std::vector<int64_t> inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inverse[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
    return {permuted(dy, inverse)};
  }
};

struct Narrow {
  static constexpr OpInfo kInfo{"narrow", CastPolicy::kNone, kAnyInputMayBeInteger};
  int64_t dim, start, length;
  int64_t given_start;  // as the caller wrote it (negative: from the end), for errors
  Shape in_shape;

  void check(const Tensor& x) const {
    AG_CHECK(x.defined(), kInfo.name, ": input is undefined");
    const int64_t size = x.size(dim);
    // Written so that nothing overflows, whatever start and length are (start + length may not fit).
    AG_CHECK(start >= 0 && start <= size && length >= 0 && length <= size - start, kInfo.name, ": start ", given_start,
             " and length ", length, " do not fit dimension ", dim, " (size ", size, ") of ", x.to_string(),
             "; hint: need 0 <= length <= size - start, with -size <= start <= size (negative counts from the end)");
  }

  Tensor forward(SavedTensors&, const Tensor& x) {
    in_shape = x.shape();
    return sliced(x, dim, start, length);
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = zeros(in_shape, dy.dtype(), dy.device());
    place(dy, dx, dim, start);
    return {dx};
  }
};

struct Cat {
  static constexpr OpInfo kInfo{"cat", CastPolicy::kPromote, kAnyInputMayBeInteger};
  int64_t dim;  // normalised
  std::vector<int64_t> sizes;  // each input's size along dim

  void check(std::span<const Tensor> xs) const {
    const Tensor& first = xs[0];
    for (size_t i = 0; i < xs.size(); ++i) {
      const Tensor& x = xs[i];
      AG_CHECK(x.defined(), kInfo.name, ": tensor ", i, " is undefined");
      AG_CHECK(x.device() == first.device() && x.dtype() == first.dtype(), kInfo.name, ": tensor ", i, " is ",
               x.to_string(), " but tensor 0 is ", first.to_string(), "; hint: move them to one device");
      bool same = x.dim() == first.dim();
      for (int64_t d = 0; same && d < x.dim(); ++d) same = d == dim || x.size(d) == first.size(d);
      AG_CHECK(same, kInfo.name, ": tensor ", i, " ", x.to_string(), " does not match tensor 0 ", first.to_string(),
               " outside dimension ", dim);
    }
  }

  Tensor forward(SavedTensors&, std::span<const Tensor> xs) {
    Shape shape = xs[0].shape();
    int64_t total = 0;
    for (const Tensor& x : xs) {
      sizes.push_back(x.size(dim));
      total += x.size(dim);
    }
    shape[static_cast<size_t>(dim)] = total;
    Tensor out = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
    int64_t start = 0;
    for (const Tensor& x : xs) {
      place(x, out, dim, start);
      start += x.size(dim);
    }
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors& saved, const Tensor& dy) const {
    std::vector<Tensor> dxs(sizes.size());
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (saved.needs_grad(i)) dxs[i] = sliced(dy, dim, start, sizes[i]);
      start += sizes[i];
    }
    return dxs;
  }
};

struct Expand {
  static constexpr OpInfo kInfo{"expand", CastPolicy::kNone, kAnyInputMayBeInteger};
  Shape shape;  // -1 already resolved
  Shape in_shape;

  void check(const Tensor& x) const {
    AG_CHECK(x.defined(), kInfo.name, ": input is undefined");
    AG_CHECK(kernels::broadcast_shapes(kInfo.name, x.shape(), shape) == shape, kInfo.name, ": ", x.to_string(),
             " cannot be expanded to ", shape_to_string(shape), " (only dimensions of size 1 stretch)");
  }

  Tensor forward(SavedTensors&, const Tensor& x) {
    in_shape = x.shape();
    Tensor out = Tensor::empty(shape, x.dtype(), x.device());
    strided_copy(x, out, make_plan<2>(shape, {contiguous_strides(shape), kernels::broadcast_strides(x.shape(), shape)}));
    return out;
  }

  std::vector<Tensor> backward(const SavedTensors&, const Tensor& dy) const {
    Tensor dx = Tensor::empty(in_shape, dy.dtype(), dy.device());
    kernels::sum_to(dy, 1.0, dx);
    return {dx};
  }
};

}  // namespace

int64_t normalize_dim(const char* op, int64_t dim, int64_t rank) {
  AG_CHECK(dim >= -rank && dim < rank, op, ": dimension ", dim, " is out of range for a tensor of rank ", rank,
           " (valid: ", -rank, " to ", rank - 1, ")");
  return dim < 0 ? dim + rank : dim;
}

Tensor reshape(const Tensor& x, const Shape& shape) { return dispatch(Reshape{.shape = shape, .in_shape = {}}, x); }

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  AG_CHECK(x.defined(), "unsqueeze: input is undefined");
  Shape shape = x.shape();
  const int64_t d = normalize_dim("unsqueeze", dim, x.dim() + 1);
  shape.insert(shape.begin() + d, 1);
  return reshape(x, shape);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  AG_CHECK(x.defined(), "flatten: input is undefined");
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t start = normalize_dim("flatten", start_dim, x.dim()), end = normalize_dim("flatten", end_dim, x.dim());
  AG_CHECK(start <= end, "flatten: start_dim (", start_dim, ") must not come after end_dim (", end_dim, ") for ",
           x.to_string());
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  shape.push_back(shape_numel(Shape(x.shape().begin() + start, x.shape().begin() + end + 1)));
  shape.insert(shape.end(), x.shape().begin() + end + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  AG_CHECK(x.defined(), "squeeze: input is undefined");
  const int64_t d = normalize_dim("squeeze", dim, x.dim());
  Shape shape = x.shape();
  if (shape[static_cast<size_t>(d)] != 1) return x;  // as PyTorch: only a size-1 dimension goes
  shape.erase(shape.begin() + d);
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  AG_CHECK(x.defined(), "permute: input is undefined");
  std::vector<int64_t> normalized;
  for (int64_t d : dims) normalized.push_back(normalize_dim("permute", d, x.dim()));
  return dispatch(Permute{.dims = normalized}, x);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  AG_CHECK(x.defined(), "transpose: input is undefined");
  std::vector<int64_t> dims(static_cast<size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[static_cast<size_t>(normalize_dim("transpose", dim0, x.dim()))],
            dims[static_cast<size_t>(normalize_dim("transpose", dim1, x.dim()))]);
  return dispatch(Permute{.dims = dims}, x);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  AG_CHECK(x.defined(), "narrow: input is undefined");
  const int64_t d = normalize_dim("narrow", dim, x.dim());
  // A negative start counts from the end, as in PyTorch; one before -size is refused by the check.
  const int64_t size = x.size(d);
  const int64_t given_start = start;
  if (start < 0 && start >= -size) start += size;
  return dispatch(Narrow{.dim = d, .start = start, .length = length, .given_start = given_start, .in_shape = {}}, x);
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
  AG_CHECK(x.defined(), "split: input is undefined");
  AG_CHECK(size > 0, "split: the piece size must be positive, got ", size);
  const int64_t d = normalize_dim("split", dim, x.dim());
  const int64_t n = x.size(d);
  std::vector<Tensor> pieces;
  for (int64_t start = 0; start < n || (n == 0 && pieces.empty()); start += size) {
    pieces.push_back(narrow(x, d, start, std::min(size, n - start)));
  }
  return pieces;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  AG_CHECK(x.defined(), "chunk: input is undefined");
  AG_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got ", chunks);
  const int64_t n = x.size(normalize_dim("chunk", dim, x.dim()));
  return split(x, std::max<int64_t>(1, n == 0 ? 0 : 1 + (n - 1) / chunks), dim);  // ceil(n / chunks), no overflow
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  AG_CHECK(!xs.empty(), "cat: needs at least one tensor");
  AG_CHECK(xs[0].defined(), "cat: tensor 0 is undefined");
  const int64_t d = normalize_dim("cat", dim, xs[0].dim());
  if (xs.size() > SavedTensors::kMaxInputs) {  // more than one op takes: join groups, then the groups
    std::vector<Tensor> groups;
    for (size_t i = 0; i < xs.size(); i += SavedTensors::kMaxInputs) {
      const size_t end = std::min(xs.size(), i + SavedTensors::kMaxInputs);
      groups.push_back(cat(std::vector<Tensor>(xs.begin() + static_cast<ptrdiff_t>(i), xs.begin() + static_cast<ptrdiff_t>(end)), d));
    }
    return cat(groups, d);
  }
  return dispatch_list(Cat{.dim = d, .sizes = {}}, xs);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  AG_CHECK(x.defined(), "expand: input is undefined");
  AG_CHECK(static_cast<int64_t>(shape.size()) >= x.dim(), "expand: ", x.to_string(), " has more dimensions than ",
           shape_to_string(shape));
  Shape resolved = shape;
  const size_t lead = shape.size() - x.shape().size();
  for (size_t d = 0; d < resolved.size(); ++d) {
    if (resolved[d] != -1) continue;
    AG_CHECK(d >= lead, "expand: -1 is not allowed for a new leading dimension, got ", shape_to_string(shape));
    resolved[d] = x.shape()[d - lead];
  }
  return dispatch(Expand{.shape = resolved, .in_shape = {}}, x);
}

}  // namespace ampgrad::ops
