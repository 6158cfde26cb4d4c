// DistributedSampler (see sampler.h). The shuffle uses its own fully specified generator
// (SplitMix64 + Fisher-Yates), so every rank and every build draws the same permutation.
#include "distributed/sampler.h"

#include <numeric>

#include "framework/error.h"

namespace ampgrad::distributed {

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): tiny, and good enough to shuffle data.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, bound), without modulo bias (rejects the top partial range).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  AG_CHECK(num_replicas >= 1 && rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank,
           " is not in [0, num_replicas = ", num_replicas, ")");
  AG_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size);
  AG_CHECK(!options.drop_last || dataset_size >= num_replicas, "DistributedSampler: with drop_last, ",
           dataset_size, " samples leave nothing for ", num_replicas, " ranks; hint: use drop_last = false");
  num_samples_ = options.drop_last ? dataset_size / num_replicas : (dataset_size + num_replicas - 1) / num_replicas;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const ProcessGroup& group,
                                       DistributedSamplerOptions options)
    : DistributedSampler(dataset_size, group.size(), group.rank(), options) {}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    SplitMix64 rng(options_.seed + static_cast<uint64_t>(epoch_));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  const size_t total = static_cast<size_t>(num_samples_ * num_replicas_);
  if (total <= order.size()) {
    order.resize(total);  // drop_last
  } else {
    for (size_t i = 0, n = order.size(); order.size() < total; ++i) order.push_back(order[i % n]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_)) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace ampgrad::distributed
