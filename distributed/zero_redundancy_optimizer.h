// ZeroRedundancyOptimizer: ZeRO stage 1 (and 2) over a process group. Each rank keeps the FP32
// masters and optimizer state of one shard of the parameters: gradients are averaged in buckets
// while backward runs (all-reduced at stage 1, reduce-scattered at stage 2), each rank steps its
// shard with an ordinary optimizer, and the updated shards are all-gathered back into every rank's
// parameters. The parameters live in one flat buffer per bucket (each an alias of its elements),
// and the shard is this rank's part of it, so the step and the all-gather write them in place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/found_inf_sync.h"
#include "distributed/process_group.h"
#include "framework/tensor.h"
#include "nn/utils.h"
#include "optim/optimizer.h"

namespace ampgrad::distributed {

/// How ZeroRedundancyOptimizer shards, buckets and starts.
struct ZeroOptions {
  /// 1 (ZeRO stage 1): the masters and optimizer state are sharded; the gradients are all-reduced
  /// in place in their buckets as DistributedDataParallel's are, so each parameter's gradient is
  /// the average over the ranks and the shard's gradient is a part of the same buffer (2 + 2 +
  /// 12/N bytes per parameter with 16-bit weights and Adam). 2 (stage 2): the gradients too: each
  /// bucket is reduce-scattered and its parameters' gradients released, so only the averaged
  /// shard stays (2 + 14/N).
  int stage = 1;
  /// A bucket closes once it holds this many MiB of gradients (as DistributedDataParallel's).
  double bucket_cap_mb = 25.0;
  /// The first bucket is smaller, so the first reduce-scatter starts early in backward.
  double first_bucket_cap_mb = 1.0;
  /// Copy rank 0's parameters to every rank at construction (what makes the replicas start equal).
  bool broadcast_parameters = true;
};

/// What sharding holds on this rank, in elements and bytes (for benchmarks and the memory table).
struct ZeroStats {
  int64_t parameters = 0;      ///< elements of the parameters it updates
  int64_t shard_elements = 0;  ///< elements of this rank's shards (a 1/size share, padding included)
  int64_t buckets = 0;         ///< buckets the gradients travel in
  int64_t syncs = 0;           ///< backward passes whose gradients were reduce-scattered
  int64_t gathers = 0;         ///< steps whose shards were all-gathered
};

/// Makes the optimizer over this rank's shards: one list of shard tensors per parameter group, in
/// the groups' order (1-D leaves of the parameters' dtype, on their device).
using ShardOptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(const std::vector<std::vector<Tensor>>& shard_groups)>;

/// The factory of an optimizer `Opt` (optim::SGD, Adam, AdamW) with `defaults`, and group k's own
/// options from group_options[k] where given:
///   ZeroRedundancyOptimizer zero(model.parameters(), shard_optimizer<optim::AdamW>({.lr = 1e-3}), group);
template <typename Opt, typename Options = typename Opt::Options>
ShardOptimizerFactory shard_optimizer(Options defaults, std::vector<std::optional<Options>> group_options = {}) {
  return [defaults, group_options](const std::vector<std::vector<Tensor>>& shard_groups) {
    std::vector<optim::ParamGroup<Options>> groups;
    for (size_t k = 0; k < shard_groups.size(); ++k) {
      groups.push_back({.params = shard_groups[k],
                        .options = k < group_options.size() ? group_options[k] : std::nullopt});
    }
    return std::unique_ptr<optim::Optimizer>(std::make_unique<Opt>(groups, defaults));
  };
}

/// PyTorch's ZeroRedundancyOptimizer, with DeepSpeed's stage 2 as an option (the reduce-scatter,
/// so no rank holds the averaged gradient of what it does not update). The loop is the usual one,
/// on optimizer():
///   scaler.scale(loss).backward();   // buckets are averaged as their gradients arrive (stage 1
///                                    // all-reduces them in place, stage 2 reduce-scatters them)
///   scaler.unscale_(zero.optimizer()); zero.clip_grad_norm_(1.0);   // optional
///   scaler.step(zero.optimizer());   // steps this rank's shard, then all-gathers every shard
///   scaler.update();  zero.zero_grad();
/// Every rank's parameter lists must match (names aside); every parameter that requires grad must
/// get a gradient in every backward. The found-inf flag of GradScaler is MAX-reduced over the ranks
/// (by init_process_group's agreement, or, where none is installed, by one this object installs
/// over its group for its lifetime), so every rank skips or steps together. MasterWeights modes,
/// parameter groups, set_lr and schedulers act on optimizer(). unscale_ and the step touch this
/// rank's shard only: at stage 1 the rest of each parameter's gradient stays averaged but scaled.
/// Construction re-points the parameters into the flat buffers (set_data): move or convert the
/// model before, not after; a parameter given new storage of the same shape and dtype is copied
/// back into its bucket at the next step (until then consolidated_state() holds the old masters).
class ZeroRedundancyOptimizer {
 public:
  /// Shards `params` (the ones that require grad; leaves on the group's device, each listed once)
  /// in one parameter group.
  ZeroRedundancyOptimizer(const std::vector<Tensor>& params, ShardOptimizerFactory make, ProcessGroup& group,
                          ZeroOptions options = {});
  /// One parameter group per entry, each given to `make` as its own group of shards.
  ZeroRedundancyOptimizer(const std::vector<std::vector<Tensor>>& param_groups, ShardOptimizerFactory make,
                          ProcessGroup& group, ZeroOptions options = {});
  /// Over the default group (init_process_group).
  ZeroRedundancyOptimizer(const std::vector<Tensor>& params, ShardOptimizerFactory make, ZeroOptions options = {});
  ~ZeroRedundancyOptimizer();
  ZeroRedundancyOptimizer(const ZeroRedundancyOptimizer&) = delete;
  ZeroRedundancyOptimizer& operator=(const ZeroRedundancyOptimizer&) = delete;

  /// The optimizer over this rank's shards: give it to GradScaler, schedulers and set_lr. Its
  /// step() refuses to run before the last backward's gradients were reduced, and ends by
  /// all-gathering the shards into the parameters.
  optim::Optimizer& optimizer() { return *optimizer_; }
  /// optimizer().step().
  void step() { optimizer_->step(); }
  /// Clears the parameters' gradients and the shards' (set to none, as PyTorch 2). After a backward
  /// that failed part way it also forgets the gradients that had arrived, so the next backward
  /// starts afresh.
  void zero_grad();
  /// clip_grad_norm_ over every rank's shards: the shards' sums of |g|^p (or maxima) are reduced
  /// across the ranks, so every rank finds the norm of the whole model's averaged gradient and
  /// scales its shard alike. Call after the backward (after scaler.unscale_ with a GradScaler).
  double clip_grad_norm_(double max_norm, nn::utils::ClipGradNormOptions options = {});

  /// The parameters it updates, group after group (those of the constructor that require grad).
  const std::vector<Tensor>& parameters() const { return params_; }
  /// The group it communicates over.
  ProcessGroup& group() { return group_; }
  /// What this rank holds.
  const ZeroStats& stats() const { return stats_; }

  /// The whole model's optimizer state, as optim::Optimizer::state() of one process stepping
  /// parameters() would give it (masters and moments per parameter, full shapes), gathered from
  /// every rank's shards into every rank (each holds the whole state while it keeps the result).
  /// A collective: every rank calls it.
  std::vector<optim::ParamState> consolidated_state();
  /// The same on rank `to` only (PyTorch's consolidate_state_dict(to)); the other ranks get an
  /// empty vector and hold at most one bucket's worth of one state tensor at a time, so saving a
  /// checkpoint costs them no more memory than a step. A collective: every rank passes the same `to`.
  std::vector<optim::ParamState> consolidated_state(int to);
  /// Loads a state of that shape (from consolidated_state at any world size, or from a single
  /// process's optimizer over the same parameters): each rank keeps its shard of it. Load the
  /// parameters' values first. Not a collective (every rank must pass the same state).
  void load_consolidated_state(const std::vector<optim::ParamState>& state);
  /// The optimizer one process stepping parameters() would hold: the factory's kind, one group
  /// per group of this one with its options (lr included), and consolidated_state() as its state,
  /// over copies of the parameters (the model's own tensors are not touched). A collective. It is
  /// what distributed::save_checkpoint writes for a ZeroRedundancyOptimizer (from rank 0's).
  std::unique_ptr<optim::Optimizer> consolidated_optimizer();
  /// The same on rank `to` only; null on the other ranks (see consolidated_state(int)). A collective.
  std::unique_ptr<optim::Optimizer> consolidated_optimizer(int to);
  /// An optimizer of the factory's kind over copies of parameters(), with this one's groups and
  /// options but no state: what a single-process checkpoint is loaded into before
  /// load_consolidated_optimizer() (nothing is gathered). Not a collective.
  std::unique_ptr<optim::Optimizer> make_unsharded_optimizer();
  /// Loads the state and the group options of an optimizer over the same parameters (one
  /// process's, or a consolidated_optimizer()): the inverse of consolidated_optimizer(). Not a
  /// collective.
  void load_consolidated_optimizer(const optim::Optimizer& whole);

 private:
  struct Bucket;
  void build_buckets(const std::vector<std::vector<Tensor>>& groups, const ShardOptimizerFactory& make);
  void on_gradient_ready(size_t index);
  // Stage 1: parameter `index`'s gradient moves into the bucket's flat_grad (its own becomes an alias).
  void adopt_gradient(Bucket& bucket, size_t index);
  // Makes parameter `index` an alias of its elements of the bucket's flat_param (copying its
  // values there) unless it is one; returns whether it moved.
  bool place_in_bucket(Bucket& bucket, size_t index);
  // Throws unless parameter `index` has the dtype, device and shape it was sharded with.
  void check_unchanged(const Bucket& bucket, size_t index) const;
  void launch(Bucket& bucket);
  void finish_reduction();
  // Forgets a backward whose gradients did not all arrive (zero_grad after it failed part way).
  void abandon_reduction();
  void before_step();
  void check_reduced() const;
  // `shard` (this rank's part of `bucket`) takes the elements of parameter `index` that fall in it,
  // from `source`, laid out as the parameter.
  void copy_to_shard(const Bucket& bucket, size_t index, Tensor& shard, const Tensor& source) const;
  // Copies the parameters into the shards where they changed since the last gather (or always).
  void refresh_shards(bool force);
  void gather_parameters();
  // consolidated_state() into rank `to` only, or (no `to`) into every rank.
  std::vector<optim::ParamState> consolidate(std::optional<int> to);
  // The unsharded optimizer with `state` loaded where `here` (else null); agreed across the ranks.
  std::unique_ptr<optim::Optimizer> build_consolidated(const std::vector<optim::ParamState>& state, bool here);

  ProcessGroup& group_;
  ZeroOptions options_;
  std::vector<Tensor> params_;
  std::vector<size_t> group_of_;  // each parameter's group
  std::vector<Shape> shape_of_;  // each parameter's shape when sharded
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // each parameter's bucket
  std::vector<int64_t> offset_of_;  // its first element in the bucket
  std::vector<bool> ready_;  // its gradient arrived in the backward being reduced
  size_t ready_count_ = 0;
  size_t next_launch_ = 0;  // buckets launch in order, so every rank issues them alike
  std::vector<uint64_t> hook_ids_;
  ShardOptimizerFactory make_;  // kept to build consolidated_optimizer()
  std::unique_ptr<optim::Optimizer> optimizer_;
  size_t pre_hook_ = 0, post_hook_ = 0;
  std::optional<amp::FoundInfSync> replaced_found_inf_;  // set when this object installed the hook
  ZeroStats stats_;
};

}  // namespace ampgrad::distributed
