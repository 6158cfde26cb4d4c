// ProcessGroupMPI: collectives over CPU tensors on an MPI communicator, each started and polled by
// the communication thread (mpi_runtime.h), so they progress while the caller computes.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

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
  void barrier() override;
  int64_t all_reduce_int(int64_t value, ReduceOp op) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;

  /// The timeout of the collectives submitted from now on. For ProcessGroupNCCL's bootstrap, whose
  /// setup exchanges run under the start-up timeout and later ones under the collective timeout.
  void set_timeout_seconds(double seconds) { set_timeout(seconds); }

 private:
  ProcessGroupMPI(detail::MpiRuntime& runtime, MPI_Comm comm, int rank, int size, double timeout_seconds);
  std::shared_ptr<Work> submit(std::string what, std::vector<detail::MpiPhase> phases, std::vector<Tensor> tensors);
  // The all-gather of collective records that runs first when check is kYes.
  detail::MpiPhase check_phase(const Tensor& tensor, int collective, int32_t argument, const std::string& what);

  detail::MpiRuntime& runtime_;
  MPI_Comm comm_;
};

}  // namespace ampgrad::distributed
