// ProcessGroupMPI: collectives over CPU tensors on an MPI communicator, each started and polled by
// the communication thread (mpi_runtime.h), so they progress while the caller computes.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "distributed/collective_check.h"
#include "distributed/mpi_runtime.h"
#include "distributed/process_group.h"

namespace ampgrad::distributed {

class ProcessGroupMPI final : public ProcessGroup {
 public:
  /// Over every process of the job (a duplicate of MPI_COMM_WORLD, so its collectives never pair
  /// up with another group's). Starts MPI if needed.
  static std::shared_ptr<ProcessGroupMPI> create_world(ProcessGroupOptions options = {});
  ~ProcessGroupMPI() override;

  Backend backend() const override { return Backend::kMPI; }
  Device device() const override { return Device::kCPU; }
  std::shared_ptr<Work> all_reduce_async(Tensor& tensor, ReduceOp op, CheckAcrossRanks check) override;
  std::shared_ptr<Work> broadcast_async(Tensor& tensor, int root, CheckAcrossRanks check) override;
  std::shared_ptr<Work> reduce_scatter_async(Tensor& output, const Tensor& input, ReduceOp op,
                                             CheckAcrossRanks check) override;
  std::shared_ptr<Work> all_gather_async(Tensor& output, const Tensor& input, CheckAcrossRanks check) override;
  void barrier() override;
  int64_t all_reduce_int(int64_t value, ReduceOp op) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;

  /// The timeout of the collectives submitted from now on. For ProcessGroupNCCL's bootstrap, whose
  /// setup exchanges run under the start-up timeout and later ones under the collective timeout.
  void set_timeout_seconds(double seconds) { set_timeout(seconds); }

 private:
  ProcessGroupMPI(detail::MpiRuntime& runtime, MPI_Comm comm, int rank, int size, double timeout_seconds);
  // Queues the phases; `tensors` are what the collective writes, `held` what it only reads.
  std::shared_ptr<Work> submit(std::string what, std::vector<detail::MpiPhase> phases, std::vector<Tensor> tensors,
                               std::vector<Tensor> held = {});
  // The all-gather of collective records that runs first when check is kYes.
  detail::MpiPhase check_phase(const detail::CollectiveRecord& mine, const std::string& what);
  // check_phase when check is kYes, else the same check for this rank alone (which throws now).
  // Returns whether this rank's tensors are usable, i.e. whether the data phase may follow.
  bool add_check(std::vector<detail::MpiPhase>& phases, const detail::CollectiveRecord& mine, CheckAcrossRanks check,
                 const std::string& what);

  detail::MpiRuntime& runtime_;
  MPI_Comm comm_;
};

}  // namespace ampgrad::distributed
