// ProcessGroupNCCL: collectives over CUDA tensors with NCCL, on a side stream that waits for the
// compute stream, bootstrapped through MPI (rank 0's NCCL id is sent to the others over an MPI
// group, which also carries the host-side agreements). Compiled when the toolkit has NCCL.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "distributed/process_group_mpi.h"

namespace ampgrad::distributed {

namespace detail {
struct NcclState;  // the communicator and whether it broke, shared with works in flight
}

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  /// Over every process of the job. Each rank takes GPU (local rank % GPUs on its machine), the
  /// local rank counting the lower ranks on the same host, and makes it the current device.
  static std::shared_ptr<ProcessGroupNCCL> create_world(ProcessGroupOptions options = {});
  ~ProcessGroupNCCL() override;

  Backend backend() const override { return Backend::kNCCL; }
  Device device() const override { return Device::kCUDA; }
  int cuda_device() const { return cuda_device_; }
  /// Queued on the group's stream after the work already queued on the compute stream; wait()
  /// blocks the host until the GPU finished it (polling against the timeout, then aborting the
  /// communicator, so a rank that went missing cannot hang the others).
  std::shared_ptr<Work> all_reduce_async(Tensor& tensor, ReduceOp op, CheckAcrossRanks check) override;
  std::shared_ptr<Work> broadcast_async(Tensor& tensor, int root, CheckAcrossRanks check) override;
  std::shared_ptr<Work> reduce_scatter_async(Tensor& output, const Tensor& input, ReduceOp op,
                                             CheckAcrossRanks check) override;
  std::shared_ptr<Work> all_gather_async(Tensor& output, const Tensor& input, CheckAcrossRanks check) override;
  /// Through the MPI bootstrap group: every rank called it (GPU work is not waited for).
  void barrier() override;
  int64_t all_reduce_int(int64_t value, ReduceOp op) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;

 private:
  ProcessGroupNCCL(std::shared_ptr<ProcessGroupMPI> bootstrap, std::shared_ptr<detail::NcclState> state,
                   cudaStream_t stream, int cuda_device);
  // Queues call(tensor's data, its element count, its type) on the side stream; the Work holds
  // `tensor` (the result) and `input` (a separate source, if any) until it finishes.
  std::shared_ptr<Work> enqueue(const std::string& what, Tensor& tensor,
                                const std::function<ncclResult_t(void* data, size_t count, ncclDataType_t type)>& call,
                                const Tensor& input = Tensor());
  // Throws on every rank (or this one, when check is kNo) unless every rank's tensor is usable;
  // `part` is this rank's part of `tensor` in reduce-scatter and all-gather.
  void check(const std::string& what, const Tensor& tensor, int collective, int32_t argument, CheckAcrossRanks check,
             const Tensor* part = nullptr);

  std::shared_ptr<ProcessGroupMPI> bootstrap_;
  std::shared_ptr<detail::NcclState> state_;
  cudaStream_t stream_;
  int cuda_device_;
};

}  // namespace ampgrad::distributed
