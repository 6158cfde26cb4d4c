// Process groups: the ranks of a data-parallel job and the collectives training needs (all-reduce
// sum/avg/max, broadcast, barrier), on MPI for CPU tensors and on NCCL for CUDA tensors. Shaped
// like torch.distributed; every wait is bounded by the group's timeout and fails with an Error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "framework/device.h"
#include "framework/tensor.h"

namespace ampgrad::distributed {

/// The communication library: MPI (CPU tensors) or NCCL (CUDA tensors).
enum class Backend : uint8_t { kMPI, kNCCL };
std::string_view backend_name(Backend backend);  ///< "mpi", "nccl"

/// kAvg is kSum divided by the group size. In 16-bit dtypes each rank's tensor is divided before
/// the sum (so partial sums cannot overflow where the average would not), wider ones after.
enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
std::string_view reduce_op_name(ReduceOp op);  ///< "sum", "avg", "max"

/// Whether a collective first checks that every rank passes the same shape, dtype and a tensor
/// on the group's device (one small extra round trip; a mismatch is then an Error on every rank
/// instead of a hang or garbage). DistributedDataParallel checks its layout once and skips it.
enum class CheckAcrossRanks : bool { kNo, kYes };

/// The collective timeout when none is given: $AMPGRAD_DISTRIBUTED_TIMEOUT (seconds, > 0) when
/// set, else this.
inline constexpr double kDefaultTimeoutSeconds = 300.0;
/// The collective timeout to use: $AMPGRAD_DISTRIBUTED_TIMEOUT or kDefaultTimeoutSeconds.
double default_timeout_seconds();

/// The start-up timeout when none is given: $AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT (seconds, > 0)
/// when set, else this. Start-up (MPI_Init_thread, the first group's communicator, NCCL's setup)
/// waits for every rank's process to be launched and loaded, which on a busy machine takes far
/// longer than a collective between running ranks, so it has its own, generous deadline.
inline constexpr double kDefaultStartupTimeoutSeconds = 300.0;
/// The start-up timeout to use: $AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT or kDefaultStartupTimeoutSeconds.
double default_startup_timeout_seconds();

/// Timeouts of a process group.
struct ProcessGroupOptions {
  /// How long one collective may wait for the other ranks before it throws and the group becomes
  /// unusable; <= 0 means default_timeout_seconds().
  double timeout_seconds = 0.0;
  /// How long the group's setup (with MPI's start-up, the first time) may wait for the other
  /// ranks; <= 0 means default_startup_timeout_seconds().
  double startup_timeout_seconds = 0.0;
};

/// The two timeouts of `options`, defaults filled in.
double collective_timeout(const ProcessGroupOptions& options);
double startup_timeout(const ProcessGroupOptions& options);  ///< see collective_timeout

/// A collective in flight (torch.distributed's Work). Its tensor must not be used until wait().
class Work {
 public:
  virtual ~Work() = default;
  /// Returns once the result is in the tensor (for NCCL: once the GPU finished it). Throws
  /// ampgrad::Error if the collective failed or did not complete within the group's timeout.
  virtual void wait() = 0;
  /// Whether it has finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
};

/// The ranks 0..size()-1 of a job and their collectives. Every rank must call the same
/// collectives in the same order; a rank that does not (it failed, exited or hangs) makes the
/// others throw after timeout_seconds(), and the group cannot be used after such an error.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's index in the group, in [0, size()).
  int rank() const { return rank_; }
  /// The number of processes in the group.
  int size() const { return size_; }
  /// How long one collective waits for the other ranks before it throws.
  double timeout_seconds() const { return timeout_seconds_; }
  /// The library the group communicates through (MPI or NCCL).
  virtual Backend backend() const = 0;
  /// Where this group's tensors live: kCPU for MPI, kCUDA for NCCL.
  virtual Device device() const = 0;

  /// In place: tensor = op(tensor of every rank). Same shape and dtype on every rank.
  /// Supports float32, float16, float64 (16-bit dtypes are summed in float32, see ReduceOp) and
  /// int64 (kSum, kMax).
  virtual std::shared_ptr<Work> all_reduce_async(Tensor& tensor, ReduceOp op,
                                                 CheckAcrossRanks check = CheckAcrossRanks::kYes) = 0;
  /// all_reduce_async, waited for.
  void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum) { all_reduce_async(tensor, op)->wait(); }
  /// In place: tensor = root's tensor on every rank.
  virtual std::shared_ptr<Work> broadcast_async(Tensor& tensor, int root,
                                                CheckAcrossRanks check = CheckAcrossRanks::kYes) = 0;
  /// broadcast_async, waited for.
  void broadcast(Tensor& tensor, int root = 0) { broadcast_async(tensor, root)->wait(); }
  /// output = this rank's part of op(every rank's input) (torch.distributed.reduce_scatter_tensor):
  /// `input` is size() parts of output.numel() elements end to end, and rank r receives part r
  /// reduced. Same dtype and device; the dtypes and kAvg's rounding are all_reduce's. What ZeRO
  /// reduces gradients with: each rank gets only the shard it updates.
  virtual std::shared_ptr<Work> reduce_scatter_async(Tensor& output, const Tensor& input, ReduceOp op,
                                                     CheckAcrossRanks check = CheckAcrossRanks::kYes) = 0;
  /// reduce_scatter_async, waited for.
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter_async(output, input, op)->wait();
  }
  /// output = every rank's input end to end, in rank order (torch.distributed.all_gather_into_tensor):
  /// output.numel() == size() * input.numel(), same dtype and device, any dtype of the table. The
  /// input may be this rank's part of the output (an alias of its elements from rank() *
  /// input.numel() on): then it runs in place, as NCCL's and MPI's in-place all-gathers do.
  virtual std::shared_ptr<Work> all_gather_async(Tensor& output, const Tensor& input,
                                                 CheckAcrossRanks check = CheckAcrossRanks::kYes) = 0;
  /// all_gather_async, waited for.
  void all_gather(Tensor& output, const Tensor& input) { all_gather_async(output, input)->wait(); }
  /// Returns once every rank called it.
  virtual void barrier() = 0;

  // Host-side collectives for small agreements (found-inf flags, checkpoint outcomes, layouts).
  /// op over every rank's value (kAvg rounds toward zero).
  virtual int64_t all_reduce_int(int64_t value, ReduceOp op) = 0;
  /// Every rank's bytes, indexed by rank.
  virtual std::vector<std::string> all_gather_bytes(const std::string& bytes) = 0;

 protected:
  /// A group member: rank of size, collectives timing out after timeout_seconds.
  ProcessGroup(int rank, int size, double timeout_seconds)
      : rank_(rank), size_(size), timeout_seconds_(timeout_seconds) {}
  /// Changes the collective timeout (after a setup that ran under the start-up timeout).
  void set_timeout(double seconds) { timeout_seconds_ = seconds; }

 private:
  int rank_;
  int size_;
  double timeout_seconds_;
};

/// Gathers every rank's error text (empty where its part worked) and throws the same ampgrad::Error
/// on every rank, naming each rank that failed and why, if any did: "WHAT failed: rank R: ...;
/// hint: HINT". A collective, for work that ranks do apart between collectives (a file only rank 0
/// writes, a state only one rank keeps), so that a failure there ends every rank's call alike.
void agree_on_outcome(ProcessGroup& group, const std::string& my_error, const std::string& what,
                      const std::string& hint);

/// A new group over every process of the job (MPI_COMM_WORLD): kMPI for CPU tensors, kNCCL for
/// CUDA tensors (each rank uses GPU local_rank % GPUs on its machine; NCCL is bootstrapped
/// through MPI). Needs the processes to be started by mpirun (a program run alone is rank 0 of 1).
std::shared_ptr<ProcessGroup> new_group(Backend backend = Backend::kMPI, ProcessGroupOptions options = {});

// The default group (torch.distributed's init_process_group and friends).
/// Creates the default group and installs the GradScaler found-inf hook (amp/found_inf_sync.h)
/// that MAX-reduces the inf/NaN flag over it, so every rank skips or steps together.
ProcessGroup& init_process_group(Backend backend = Backend::kMPI, ProcessGroupOptions options = {});
/// Whether init_process_group has run (and destroy_process_group has not).
bool is_initialized();
ProcessGroup& default_group();  ///< throws unless initialised
int get_rank();  ///< default_group().rank()
int get_world_size();  ///< default_group().size()
/// Drops the default group and the found-inf hook (MPI itself stays up until the process exits).
void destroy_process_group();

// The same collectives over the default group.
void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::kSum);  ///< default_group().all_reduce
void broadcast(Tensor& tensor, int root = 0);  ///< default_group().broadcast
void barrier();  ///< default_group().barrier

}  // namespace ampgrad::distributed
