// Step times as a data-parallel job sees them: the median of one rank's times, then the largest
// over ranks (a step ends when the slowest rank is done). Shared by ddp_bench and zero_bench.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ampgrad_distributed.h"

namespace ampgrad::bench {

inline double slowest_median(distributed::ProcessGroup& world, std::vector<double> times) {
  std::sort(times.begin(), times.end());
  const double mine = times[times.size() / 2];
  const int64_t micros = world.all_reduce_int(static_cast<int64_t>(mine * 1e6), distributed::ReduceOp::kMax);
  return static_cast<double>(micros) * 1e-6;
}

}  // namespace ampgrad::bench
