// Shapes and strides for the iteration plans of ops/strided.h.
#include "ops/strided.h"

#include <algorithm>

namespace ampgrad::kernels {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

std::optional<Shape> try_broadcast_shapes(const Shape& a, const Shape& b, int64_t* failing_dim) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {  // i counts from the last dimension
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      if (failing_dim != nullptr) *failing_dim = -static_cast<int64_t>(i) - 1;
      return std::nullopt;
    }
    out[rank - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  int64_t dim = 0;
  std::optional<Shape> out = try_broadcast_shapes(a, b, &dim);
  AG_CHECK(out.has_value(), op, ": shapes ", shape_to_string(a), " and ", shape_to_string(b),
           " cannot be broadcast: they differ at dimension ", dim, " (counted from the end) and neither is 1",
           "; hint: broadcasting aligns the last dimensions and stretches sizes of 1 (PyTorch's rules)");
  return *out;
}

Shape broadcast_strides(const Shape& shape, const Shape& target) {
  const Shape own = contiguous_strides(shape);
  Shape strides(target.size(), 0);
  const size_t lead = target.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) strides[lead + d] = shape[d] == 1 ? 0 : own[d];
  return strides;
}

AlongDim along_dim(const Shape& shape, int64_t dim) {
  AlongDim v;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t s = shape[static_cast<size_t>(d)];
    if (d < dim) v.outer *= s;
    if (d == dim) v.size = s;
    if (d > dim) v.inner *= s;
  }
  return v;
}

}  // namespace ampgrad::kernels
