// DistributedDataParallel: wraps a module so that, by the end of every backward(), each rank's
// gradients are the average over all ranks. Gradients are reduced in buckets as autograd produces
// them (post-accumulate-grad hooks), overlapping communication with the rest of backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/process_group.h"
#include "nn/module.h"

namespace ampgrad::distributed {

/// How DistributedDataParallel buckets, broadcasts and overlaps (PyTorch's DDP arguments).
struct DataParallelOptions {
  /// A bucket closes once it holds this many MiB of gradients (PyTorch's bucket_cap_mb).
  double bucket_cap_mb = 25.0;
  /// The first bucket is smaller, so the first all-reduce starts early in backward (PyTorch's 1 MiB).
  double first_bucket_cap_mb = 1.0;
  /// Copy rank 0's parameters and buffers to every rank at construction (what makes the replicas
  /// start equal).
  bool broadcast_parameters = true;
  /// Copy rank 0's buffers to every rank before each forward (PyTorch's broadcast_buffers), so
  /// state a forward updates (running statistics) stays that of rank 0. Costs nothing without buffers.
  bool broadcast_buffers = true;
  /// false: every bucket is reduced after the whole backward, none during it (to measure what
  /// overlapping buys; the results are the same bits).
  bool overlap = true;
  /// Inside a Float8Guard with delayed scaling, reduce the amaxes the weights' FP8 states recorded
  /// in the step before with MAX across ranks, before each training forward (grad mode on, under
  /// no_sync() too: each micro-batch is an FP8 step), so that every rank scales by the same amaxes
  /// (Transformer Engine's amax reduction). Evaluate under NoGradGuard, or through the inner module on every rank, so that the
  /// states stay alike. false only to show what it prevents.
  bool reduce_float8_amax = true;
};

/// What the reduction cost, for benchmarks.
struct DataParallelStats {
  int64_t buckets = 0;  ///< buckets the gradients are reduced in
  int64_t parameters = 0;             ///< elements of the parameters that require grad
  int64_t bytes_per_sync = 0;         ///< gradient bytes all-reduced per synchronised backward
  int64_t syncs = 0;                  ///< backward passes that reduced
  int64_t last_overlapped_buckets = 0;  ///< buckets the last one launched before backward's last gradient
  double last_wait_seconds = 0.0;     ///< time the last one waited for communication at its end
  double total_wait_seconds = 0.0;  ///< time all of them waited for communication at their ends
};

/// A Module whose only child is the wrapped module, registered as "module" (so named_parameters()
/// and state_dict() say "module.0.weight", as PyTorch's DDP does; checkpoint the inner module for
/// the plain names).
class DistributedDataParallel : public nn::Module {
 public:
  /// Checks that every rank's module has the same parameters and buffers (names, shapes, dtypes,
  /// on the group's device; an Error on every rank naming the first difference otherwise),
  /// broadcasts rank 0's values, and hooks the parameters. `module` must outlive this wrapper,
  /// and keep its dtypes and device (convert it before wrapping).
  DistributedDataParallel(nn::Module& module, ProcessGroup& group, DataParallelOptions options = {});
  /// Over the default group (init_process_group).
  explicit DistributedDataParallel(nn::Module& module, DataParallelOptions options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// module.forward(x), arming the reduction for the backward that follows (unless in no_sync()).
  /// Throws if the previous backward left parameters without gradients (every parameter that
  /// requires grad must take part in the loss, as with PyTorch's default find_unused_parameters=False).
  Tensor forward(const Tensor& x) override;
  /// The wrapped module.
  nn::Module& module() { return module_; }
  /// The group the gradients are reduced over.
  ProcessGroup& group() { return group_; }
  /// What the reduction has cost so far.
  const DataParallelStats& stats() const { return stats_; }

  /// RAII from no_sync(): backward passes of forwards run while it lives accumulate gradients
  /// locally; the first forward/backward after it reduces the accumulated sum.
  class NoSyncGuard {
   public:
    /// Turns reduction off for as long as the guard lives (restoring the previous setting after).
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) {
      ddp.sync_enabled_ = false;
    }
    ~NoSyncGuard() { ddp_.sync_enabled_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  /// For gradient accumulation: { auto guard = ddp.no_sync(); loss(ddp(x1)).backward(); } then a
  /// last micro-batch outside it.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

 private:
  struct Bucket;
  void check_replicas();
  void check_unchanged() const;
  void broadcast_buffers();
  void reduce_float8_amaxes();
  void build_buckets();
  void on_gradient_ready(size_t index);
  void launch_ready_buckets();
  void launch(size_t bucket);
  void finish_reduction();
  void check_usable() const;
  std::string unready_parameters() const;

  nn::Module& module_;
  ProcessGroup& group_;
  DataParallelOptions options_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;  // those that require grad, in module order
  std::vector<std::string> layouts_;  // what each of params_ looked like when wrapped
  std::vector<uint64_t> hook_ids_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  std::vector<int64_t> offset_of_;  // parameter -> element offset in its bucket
  std::vector<bool> ready_;         // parameter -> its gradient arrived this iteration
  size_t ready_count_ = 0;
  size_t next_launch_ = 0;
  int64_t overlapped_ = 0;  // buckets launched this iteration while gradients were still coming
  bool armed_ = false;    // forward ran with sync on: the next backward reduces
  bool reduced_ = false;  // and that backward has reduced; no other gradient may arrive before a forward
  bool sync_enabled_ = true;
  std::string broken_;  // a collective failed: the replicas may disagree from here on
  DataParallelStats stats_;
};

}  // namespace ampgrad::distributed
