// The float64 references of reference.h.
#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ampgrad::test {

namespace {

// The row-major multi-index of `linear` in `shape`.
std::vector<int64_t> unravel(int64_t linear, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = linear % shape[d];
    linear /= shape[d];
  }
  return index;
}

int64_t ravel(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t linear = 0;
  for (size_t d = 0; d < shape.size(); ++d) linear = linear * shape[d] + index[d];
  return linear;
}

// The element of an operand of `shape` that out index `index` (of a larger rank) reads when broadcast.
int64_t broadcast_index(const std::vector<int64_t>& index, const Shape& shape) {
  const size_t lead = index.size() - shape.size();
  std::vector<int64_t> own(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) own[d] = shape[d] == 1 ? 0 : index[lead + d];
  return ravel(own, shape);
}

}  // namespace

Values matmul_ref(const Values& a, const Values& b, int64_t m, int64_t k, int64_t n) {
  Values c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
    }
  }
  return c;
}

Values linear_ref(const Values& x, const Values& w, const Values& b, int64_t n, int64_t in, int64_t out) {
  Values y(static_cast<size_t>(n * out), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int64_t p = 0; p < in; ++p) acc += x[i * in + p] * w[o * in + p];
      y[i * out + o] = acc;
    }
  }
  return y;
}

Shape broadcast_ref_shape(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1, db = i < b.size() ? b[b.size() - 1 - i] : 1;
    out[rank - 1 - i] = std::max(da, db);
  }
  return out;
}

Values broadcast_ref(const Values& a, const Shape& a_shape, const Values& b, const Shape& b_shape,
                     const std::function<double(double, double)>& f) {
  const Shape shape = broadcast_ref_shape(a_shape, b_shape);
  Values out(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<int64_t> index = unravel(static_cast<int64_t>(i), shape);
    out[i] = f(a[static_cast<size_t>(broadcast_index(index, a_shape))], b[static_cast<size_t>(broadcast_index(index, b_shape))]);
  }
  return out;
}

Values map_ref(const Values& x, const std::function<double(double)>& f) {
  Values out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), f);
  return out;
}

Values zip_ref(const Values& a, const Values& b, const std::function<double(double, double)>& f) {
  Values out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = f(a[i], b[i]);
  return out;
}

double sum_ref(const Values& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

double mse_ref(const Values& pred, const Values& target) {
  double s = 0;
  for (size_t i = 0; i < pred.size(); ++i) s += (pred[i] - target[i]) * (pred[i] - target[i]);
  return s / static_cast<double>(pred.size());
}

Values permute_ref(const Values& x, const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out_shape(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) out_shape[i] = shape[static_cast<size_t>(dims[i])];
  Values out(x.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<int64_t> o = unravel(static_cast<int64_t>(i), out_shape);
    std::vector<int64_t> in(shape.size());
    for (size_t d = 0; d < dims.size(); ++d) in[static_cast<size_t>(dims[d])] = o[d];
    out[i] = x[static_cast<size_t>(ravel(in, shape))];
  }
  return out;
}

Values narrow_ref(const Values& x, const Shape& shape, int64_t dim, int64_t start, int64_t length) {
  Values out;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t at = unravel(static_cast<int64_t>(i), shape)[static_cast<size_t>(dim)];
    if (at >= start && at < start + length) out.push_back(x[i]);
  }
  return out;
}

Values cat_ref(const std::vector<Values>& xs, const std::vector<Shape>& shapes, int64_t dim) {
  Shape out_shape = shapes[0];
  out_shape[static_cast<size_t>(dim)] = 0;
  for (const Shape& s : shapes) out_shape[static_cast<size_t>(dim)] += s[static_cast<size_t>(dim)];
  Values out(static_cast<size_t>(shape_numel(out_shape)));
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<int64_t> index = unravel(static_cast<int64_t>(i), out_shape);
    size_t k = 0;
    while (index[static_cast<size_t>(dim)] >= shapes[k][static_cast<size_t>(dim)]) {
      index[static_cast<size_t>(dim)] -= shapes[k][static_cast<size_t>(dim)];
      ++k;
    }
    out[i] = xs[k][static_cast<size_t>(ravel(index, shapes[k]))];
  }
  return out;
}

Values sum_dims_ref(const Values& x, const Shape& shape, const std::vector<int64_t>& dims) {
  Shape kept = shape;
  for (int64_t d : dims) kept[static_cast<size_t>(d)] = 1;
  Values out(static_cast<size_t>(shape_numel(kept)), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<int64_t> index = unravel(static_cast<int64_t>(i), shape);
    for (int64_t d : dims) index[static_cast<size_t>(d)] = 0;
    out[static_cast<size_t>(ravel(index, kept))] += x[i];
  }
  return out;
}

Values max_dim_ref(const Values& x, const Shape& shape, int64_t dim) {
  Shape kept = shape;
  kept[static_cast<size_t>(dim)] = 1;
  Values out(static_cast<size_t>(shape_numel(kept)), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<int64_t> index = unravel(static_cast<int64_t>(i), shape);
    index[static_cast<size_t>(dim)] = 0;
    double& best = out[static_cast<size_t>(ravel(index, kept))];
    best = std::max(best, x[i]);
  }
  return out;
}

Values softmax_ref(const Values& x, int64_t cols, bool log, int64_t causal_tq) {
  Values out(x.size());
  for (size_t r = 0; r * static_cast<size_t>(cols) < x.size(); ++r) {
    const double* row = x.data() + r * static_cast<size_t>(cols);
    const int64_t valid = causal_tq > 0 ? std::min<int64_t>(cols, static_cast<int64_t>(r) % causal_tq + 1)
                                        : cols;
    double max = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < valid; ++j) max = std::max(max, row[j]);
    for (int64_t j = 0; j < valid; ++j) sum += std::exp(row[j] - max);
    for (int64_t j = 0; j < cols; ++j) {
      double& o = out[r * static_cast<size_t>(cols) + static_cast<size_t>(j)];
      if (j >= valid) {
        o = 0.0;
      } else {
        o = log ? row[j] - max - std::log(sum) : std::exp(row[j] - max) / sum;
      }
    }
  }
  return out;
}

Values cross_entropy_ref(const Values& scores, int64_t classes, const std::vector<int64_t>& target, int64_t ignore,
                         double eps, bool log_probs) {
  const Values log_p = log_probs ? scores : softmax_ref(scores, classes, true);
  Values out(target.size(), 0.0);
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == ignore) continue;
    const double* row = log_p.data() + i * static_cast<size_t>(classes);
    double mean = 0;
    for (int64_t c = 0; c < classes; ++c) mean += row[c];
    mean /= static_cast<double>(classes);
    out[i] = -(1 - eps) * row[target[i]] - eps * mean;
  }
  return out;
}

Values layer_norm_ref(const Values& x, int64_t cols, const Values& w, const Values& b, double eps) {
  Values out(x.size());
  for (size_t r = 0; r * static_cast<size_t>(cols) < x.size(); ++r) {
    const double* row = x.data() + r * static_cast<size_t>(cols);
    double mean = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mean += row[j];
    mean /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (row[j] - mean) / std::sqrt(var + eps);
      out[r * static_cast<size_t>(cols) + static_cast<size_t>(j)] =
          xhat * (w.empty() ? 1.0 : w[static_cast<size_t>(j)]) + (b.empty() ? 0.0 : b[static_cast<size_t>(j)]);
    }
  }
  return out;
}

Values batched_matmul_ref(const Values& a, const Shape& a_shape, const Values& b, const Shape& b_shape) {
  const int64_t m = a_shape[a_shape.size() - 2], k = a_shape.back(), n = b_shape.back();
  const Shape a_batch(a_shape.begin(), a_shape.end() - 2), b_batch(b_shape.begin(), b_shape.end() - 2);
  const Shape batch = broadcast_ref_shape(a_batch, b_batch);
  const int64_t count = shape_numel(batch);
  Values out(static_cast<size_t>(count * m * n), 0.0);
  for (int64_t bi = 0; bi < count; ++bi) {
    const std::vector<int64_t> index = unravel(bi, batch);
    const int64_t ai = broadcast_index(index, a_batch), bj = broadcast_index(index, b_batch);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += a[static_cast<size_t>((ai * m + i) * k + p)] * b[static_cast<size_t>((bj * k + p) * n + j)];
        out[static_cast<size_t>((bi * m + i) * n + j)] = acc;
      }
    }
  }
  return out;
}

}  // namespace ampgrad::test
