// Bucketing values into a TensorBoard histogram the way PyTorch's SummaryWriter.add_histogram does.
#pragma once

#include <span>
#include <vector>

#include "utils/event.h"

namespace ampgrad::utils {

/// How add_histogram buckets values (PyTorch's `bins` argument).
struct HistogramBins {
  int count = 0;  ///< 0: bins="tensorflow"; > 0: that many equal-width bins from min to max
  /// PyTorch's default: edges 0 and +-1e-12 * 1.1^k up to 1e20 (fine near zero, ~10% wide far away).
  static HistogramBins tensorflow() { return {}; }
  /// `count` equal-width bins between the smallest and largest value (NumPy's `bins=count`).
  static HistogramBins fixed(int count) { return {count}; }
};

/// PyTorch's default bucket edges (bins="tensorflow"): -1e20 .. -1e-12, 0, 1e-12 .. 1e20 (1549 edges).
const std::vector<double>& tensorflow_bin_edges();

/// The histogram PyTorch's add_histogram would write for `values` (as float64): np.histogram counts,
/// trimmed to the non-empty range plus one empty bucket on the left, as TensorBoard lists only right
/// edges. inf/NaN values cannot be placed and are left out (of num, sum, min, max too); no finite
/// value at all, or every value beyond +-1e20 under bins="tensorflow", throws ampgrad::Error.
Histogram make_histogram(std::span<const float> values, HistogramBins bins = HistogramBins::tensorflow());

}  // namespace ampgrad::utils
