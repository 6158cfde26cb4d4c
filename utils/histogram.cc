// PyTorch-compatible histogram bucketing (see histogram.h; the reference is
// torch/utils/tensorboard/summary.py make_histogram and numpy.histogram).
#include "utils/histogram.h"

#include <algorithm>
#include <cmath>

#include "framework/error.h"

namespace ampgrad::utils {

namespace {

// NumPy's bins=count: linspace edges; a value's bin is computed, then nudged by one where rounding put
// it on the wrong side of an edge; the last bin is closed on the right.
std::vector<double> equal_width_counts(const std::vector<double>& v, int count, std::vector<double>& edges) {
  double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  if (lo == hi) lo -= 0.5, hi += 0.5;
  edges.resize(count + 1);
  const double step = (hi - lo) / count;
  for (int i = 0; i < count; ++i) edges[i] = lo + i * step;
  edges[count] = hi;
  std::vector<double> counts(count, 0.0);
  for (double x : v) {
    auto i = static_cast<int64_t>((x - lo) / (hi - lo) * count);
    i = std::clamp<int64_t>(i, 0, count - 1);
    if (x < edges[i]) --i;
    else if (i != count - 1 && x >= edges[i + 1]) ++i;
    counts[i] += 1;
  }
  return counts;
}

// NumPy with explicit edges: bins are [e_i, e_i+1), the last one closed; values outside are dropped.
std::vector<double> edge_counts(const std::vector<double>& v, const std::vector<double>& edges) {
  std::vector<double> counts(edges.size() - 1, 0.0);
  for (double x : v) {
    if (x < edges.front() || x > edges.back()) continue;
    const auto i = std::upper_bound(edges.begin(), edges.end(), x) - edges.begin() - 1;
    counts[std::min<size_t>(i, counts.size() - 1)] += 1;
  }
  return counts;
}

}  // namespace

const std::vector<double>& tensorflow_bin_edges() {
  static const std::vector<double> edges = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);  // the same double sequence as PyTorch's loop
    std::vector<double> all;
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return edges;
}

Histogram make_histogram(std::span<const float> values, HistogramBins bins) {
  AG_CHECK(bins.count >= 0, "add_histogram: bins must be tensorflow() or fixed(count > 0), got count ", bins.count);
  std::vector<double> finite;
  finite.reserve(values.size());
  for (float x : values)
    if (std::isfinite(x)) finite.push_back(x);
  AG_CHECK(!finite.empty(), "add_histogram: no finite value to bucket (", values.size(), " values, ",
           values.size() - finite.size(), " of them inf/NaN); hint: log the inf/NaN count with add_scalar instead");

  std::vector<double> edges;
  std::vector<double> counts = bins.count > 0 ? equal_width_counts(finite, bins.count, edges)
                                              : edge_counts(finite, edges = tensorflow_bin_edges());
  const auto nonzero = [](double c) { return c > 0; };
  const auto first_it = std::find_if(counts.begin(), counts.end(), nonzero);
  AG_CHECK(first_it != counts.end(), "add_histogram: every value lies beyond the +-1e20 range of bins=tensorflow; ",
           "hint: use HistogramBins::fixed(count)");
  const size_t first = first_it - counts.begin();
  const size_t last = counts.size() - 1 - (std::find_if(counts.rbegin(), counts.rend(), nonzero) - counts.rbegin());

  // TensorBoard stores right edges only; an empty bucket on the left carries the left edge of `first`.
  Histogram h;
  h.bucket.push_back(0.0);
  h.bucket.insert(h.bucket.end(), counts.begin() + first, counts.begin() + last + 1);
  h.bucket_limit.assign(edges.begin() + first, edges.begin() + last + 2);
  h.min = *std::min_element(finite.begin(), finite.end());
  h.max = *std::max_element(finite.begin(), finite.end());
  h.num = static_cast<double>(finite.size());
  for (double x : finite) h.sum += x, h.sum_squares += x * x;
  return h;
}

}  // namespace ampgrad::utils
