// DistributedSampler: each rank's share of a data set's indices, a fresh shuffle every epoch that
// every rank draws identically from (seed, epoch) (torch.utils.data.DistributedSampler's rules).
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/process_group.h"

namespace ampgrad::distributed {

/// How DistributedSampler orders and splits the indices (PyTorch's DistributedSampler arguments).
struct DistributedSamplerOptions {
  bool shuffle = true;  ///< permute the indices every epoch
  uint64_t seed = 0;       ///< the same on every rank
  bool drop_last = false;  ///< true: drop the tail that does not divide evenly; false: pad by repeating
};

/// The indices 0..dataset_size-1, permuted per epoch (when shuffling) by a generator seeded with
/// seed + epoch, extended by repeating its first indices to a multiple of num_replicas (or cut to
/// one with drop_last); rank r takes positions r, r + num_replicas, r + 2 num_replicas, ...
/// So the ranks' shares are disjoint (but for the padding) and cover the data set every epoch.
class DistributedSampler {
 public:
  /// The sampler of replica `rank` of num_replicas over dataset_size samples.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});
  /// num_replicas and rank from the group.
  DistributedSampler(int64_t dataset_size, const ProcessGroup& group, DistributedSamplerOptions options = {});

  /// Call at the start of every epoch: without it every epoch repeats the same order.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  /// The epoch set_epoch gave (0 before any).
  int64_t epoch() const { return epoch_; }
  /// This rank's indices for the current epoch (size() of them).
  std::vector<int64_t> indices() const;
  /// Samples per rank per epoch: ceil(dataset_size / num_replicas), or floor with drop_last.
  int64_t size() const { return num_samples_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace ampgrad::distributed
