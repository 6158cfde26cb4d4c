// ProcessGroupNCCL: non-blocking communicator setup polled against the timeout, collectives on a
// side stream ordered after the compute stream by events, and works whose wait() polls the GPU.
#include "distributed/process_group_nccl.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>

#include "distributed/collective_check.h"
#include "distributed/mpi_runtime.h"
#include "framework/cuda_check.h"
#include "framework/device.h"
#include "framework/error.h"

namespace ampgrad::distributed {

namespace detail {

using Clock = std::chrono::steady_clock;

struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  double timeout_seconds = kDefaultTimeoutSeconds;
  std::mutex mutex;
  std::string broken;  // why the communicator was aborted, or ""
};

namespace {

constexpr auto kPollInterval = std::chrono::microseconds(50);

void nccl_check(ncclResult_t result, const char* call) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  AG_FAIL("NCCL call `", call, "` failed: ", ncclGetErrorString(result), " (", ncclGetLastError(nullptr), ")");
}

[[noreturn]] void abort_and_fail(NcclState& state, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.broken.empty()) {
      state.broken = reason;
      ncclCommAbort(state.comm);  // also ends kernels waiting for a rank that is gone
    }
  }
  AG_FAIL("ampgrad.distributed: ", reason, "; this process group can no longer be used; hint: look at the other ",
          "ranks' output for the first error; AMPGRAD_DISTRIBUTED_TIMEOUT (collectives) and ",
          "AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT (setup) set the timeouts, in seconds");
}

// Throws (and aborts) once NCCL reported an error, or `deadline` passed; returns false while the
// communicator is still busy with a call (config.blocking = 0 makes calls return early).
bool communicator_ready(NcclState& state, Clock::time_point deadline, const std::string& what) {
  ncclResult_t async = ncclSuccess;
  nccl_check(ncclCommGetAsyncError(state.comm, &async), "ncclCommGetAsyncError");
  if (async != ncclSuccess && async != ncclInProgress) {
    abort_and_fail(state, ::ampgrad::detail::str_cat("NCCL reported ", ncclGetErrorString(async), " during ", what));
  }
  if (Clock::now() > deadline) {
    abort_and_fail(state, ::ampgrad::detail::str_cat(what, " did not complete within ", state.timeout_seconds,
                                                     " s: another rank failed, exited, or is not calling the same ",
                                                     "collectives in the same order"));
  }
  return async == ncclSuccess;
}

void wait_ready(NcclState& state, Clock::time_point deadline, const std::string& what) {
  while (!communicator_ready(state, deadline, what)) std::this_thread::sleep_for(kPollInterval);
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;  // NCCL sums half in float per step
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt64: return ncclInt64;
    default: break;  // the 8-bit floats: storage only, never reduced
  }
  AG_FAIL("ampgrad.distributed: NCCL groups do not handle dtype ", dtype);
}

bool nccl_supports(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64 || dtype == DType::kInt64;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;  // NCCL multiplies by 1/size before summing floats
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// A collective queued on the group's stream; `done` is recorded after it.
class NcclWork final : public Work {
 public:
  NcclWork(std::string what, std::shared_ptr<NcclState> state, cudaEvent_t done, Tensor tensor, Tensor input)
      : what_(std::move(what)), state_(std::move(state)), done_(done), tensor_(std::move(tensor)),
        input_(std::move(input)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  bool is_completed() override { return finished_ || cudaEventQuery(done_) != cudaErrorNotReady; }

  void wait() override {
    if (finished_) return;
    const Clock::time_point deadline = deadline_after(state_->timeout_seconds);
    for (;;) {
      const cudaError_t query = cudaEventQuery(done_);
      if (query == cudaSuccess) break;
      AG_CHECK(query == cudaErrorNotReady, "ampgrad.distributed: ", what_, ": CUDA reported ",
               cudaGetErrorName(query), " (", cudaGetErrorString(query), ")");
      communicator_ready(*state_, deadline, what_);  // throws on NCCL errors and after the deadline
      std::this_thread::sleep_for(kPollInterval);
    }
    finished_ = true;
    tensor_.bump_version();
  }

 private:
  std::string what_;
  std::shared_ptr<NcclState> state_;
  cudaEvent_t done_;
  Tensor tensor_;
  Tensor input_;  // a collective's separate source (reduce-scatter, all-gather), kept until it is done
  bool finished_ = false;
};

}  // namespace
}  // namespace detail

using detail::Clock;

std::shared_ptr<ProcessGroupNCCL> ProcessGroupNCCL::create_world(ProcessGroupOptions options) {
  // The whole setup (CUDA contexts, the NCCL id, the communicator) waits for every rank to get
  // there, so its exchanges run under the start-up timeout; the collectives after it do not.
  ProcessGroupOptions setup_options = options;
  setup_options.timeout_seconds = startup_timeout(options);
  std::shared_ptr<ProcessGroupMPI> bootstrap = ProcessGroupMPI::create_world(setup_options);
  const int rank = bootstrap->rank(), size = bootstrap->size();
  const std::string where = detail::rank_label(rank, size, Backend::kNCCL);
  // Every rank says where it runs and whether it can take part, so that a rank without a GPU is
  // an error on every rank instead of a hang.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string problem;
  const int gpus = device_count(Device::kCUDA);
  if (gpus == 0) problem = "no usable CUDA device (or no driver)";
  const std::vector<std::string> facts = bootstrap->all_gather_bytes(std::string(host) + '\0' + problem);
  int local_rank = 0;
  for (int r = 0; r < size; ++r) {
    const std::string& fact = facts[static_cast<size_t>(r)];
    const std::string their_host = fact.substr(0, fact.find('\0'));
    const std::string their_problem = fact.substr(fact.find('\0') + 1);
    AG_CHECK(their_problem.empty(), "ampgrad.distributed: creating an NCCL process group on ", where, ": rank ", r,
             " (", their_host, ") cannot take part: ", their_problem, "; hint: NCCL groups need one GPU per rank");
    if (r < rank && their_host == host) ++local_rank;
  }
  const int cuda_device = local_rank % gpus;
  AG_CUDA_CHECK(cudaSetDevice(cuda_device));

  ncclUniqueId id{};
  if (rank == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const std::vector<std::string> ids =
      bootstrap->all_gather_bytes(rank == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof(id)) : "");
  AG_CHECK(ids[0].size() == sizeof(id), "internal: rank 0 sent an NCCL id of ", ids[0].size(), " bytes");
  std::memcpy(&id, ids[0].data(), sizeof(id));

  auto state = std::make_shared<detail::NcclState>();
  state->rank = rank;
  state->size = size;
  state->timeout_seconds = startup_timeout(options);  // for the setup; then the collectives' own
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that setup and collectives can be polled against the timeout
  detail::nccl_check(ncclCommInitRankConfig(&state->comm, size, id, rank, &config), "ncclCommInitRankConfig");
  detail::wait_ready(*state, detail::deadline_after(state->timeout_seconds), "ncclCommInitRankConfig on " + where);
  state->timeout_seconds = collective_timeout(options);
  bootstrap->set_timeout_seconds(state->timeout_seconds);
  cudaStream_t stream = nullptr;
  AG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::shared_ptr<ProcessGroupNCCL>(new ProcessGroupNCCL(std::move(bootstrap), std::move(state), stream,
                                                                cuda_device));
}

ProcessGroupNCCL::ProcessGroupNCCL(std::shared_ptr<ProcessGroupMPI> bootstrap,
                                   std::shared_ptr<detail::NcclState> state, cudaStream_t stream, int cuda_device)
    : ProcessGroup(bootstrap->rank(), bootstrap->size(), bootstrap->timeout_seconds()),
      bootstrap_(std::move(bootstrap)), state_(std::move(state)), stream_(stream), cuda_device_(cuda_device) {}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->broken.empty()) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(state_->comm);
  }  // an aborted communicator is already gone
  cudaStreamDestroy(stream_);
}

void ProcessGroupNCCL::check(const std::string& what, const Tensor& tensor, int collective, int32_t argument,
                             CheckAcrossRanks check, const Tensor* part) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    AG_CHECK(state_->broken.empty(), "ampgrad.distributed: ", what, " cannot run: ", state_->broken);
  }
  const detail::CollectiveRecord mine = detail::describe_collective(static_cast<detail::Collective>(collective),
                                                                    argument, tensor, device(), &detail::nccl_supports,
                                                                    part, size(), rank());
  if (check == CheckAcrossRanks::kNo) return detail::check_local(mine, what, backend(), device());
  const std::vector<std::string> all =
      bootstrap_->all_gather_bytes(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
  std::vector<detail::CollectiveRecord> records(all.size());
  for (size_t r = 0; r < all.size(); ++r) std::memcpy(&records[r], all[r].data(), sizeof(detail::CollectiveRecord));
  detail::check_collective(records, what, backend(), device());
}

std::shared_ptr<Work> ProcessGroupNCCL::enqueue(
    const std::string& what, Tensor& tensor,
    const std::function<ncclResult_t(void* data, size_t count, ncclDataType_t type)>& call, const Tensor& input) {
  // The side stream starts after everything already queued on the compute (legacy) stream.
  cudaEvent_t ready = nullptr, done = nullptr;
  AG_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  AG_CUDA_CHECK(cudaEventRecord(ready, cudaStreamLegacy));
  AG_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
  AG_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait is satisfied
  detail::nccl_check(call(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), detail::nccl_type(tensor.dtype())),
                     what.c_str());
  detail::wait_ready(*state_, detail::deadline_after(timeout_seconds()), what);
  AG_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  // The compute stream does not wait here (the rest of backward overlaps the collective); wait()
  // holds the host until `done`, so what the caller queues after it runs after the collective.
  AG_CUDA_CHECK(cudaEventRecord(done, stream_));
  return std::make_shared<detail::NcclWork>(what, state_, done, tensor, input);
}

std::shared_ptr<Work> ProcessGroupNCCL::all_reduce_async(Tensor& tensor, ReduceOp op, CheckAcrossRanks check) {
  const std::string what =
      detail::all_reduce_label(op, tensor, detail::rank_label(rank(), size(), backend()));
  this->check(what, tensor, static_cast<int>(detail::Collective::kAllReduce), static_cast<int32_t>(op), check);
  ncclComm_t comm = state_->comm;
  cudaStream_t stream = stream_;
  return enqueue(what, tensor, [&](void* data, size_t count, ncclDataType_t type) {
    return ncclAllReduce(data, data, count, type, detail::nccl_op(op), comm, stream);
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::broadcast_async(Tensor& tensor, int root, CheckAcrossRanks check) {
  const std::string what =
      detail::broadcast_label(root, tensor, detail::rank_label(rank(), size(), backend()));
  AG_CHECK(root >= 0 && root < size(), "ampgrad.distributed: ", what, ": root must be in [0, ", size(), ")");
  this->check(what, tensor, static_cast<int>(detail::Collective::kBroadcast), root, check);
  ncclComm_t comm = state_->comm;
  cudaStream_t stream = stream_;
  return enqueue(what, tensor, [&](void* data, size_t count, ncclDataType_t type) {
    return ncclBroadcast(data, data, count, type, root, comm, stream);
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::reduce_scatter_async(Tensor& output, const Tensor& input, ReduceOp op,
                                                             CheckAcrossRanks check) {
  const std::string what =
      detail::reduce_scatter_label(op, input, output, detail::rank_label(rank(), size(), backend()));
  this->check(what, input, static_cast<int>(detail::Collective::kReduceScatter), static_cast<int32_t>(op), check,
              &output);
  ncclComm_t comm = state_->comm;
  cudaStream_t stream = stream_;
  const void* source = input.data_ptr();
  return enqueue(
      what, output,
      [&](void* data, size_t count, ncclDataType_t type) {
        return ncclReduceScatter(source, data, count, type, detail::nccl_op(op), comm, stream);
      },
      input);
}

std::shared_ptr<Work> ProcessGroupNCCL::all_gather_async(Tensor& output, const Tensor& input, CheckAcrossRanks check) {
  const std::string what =
      detail::all_gather_label(input, output, detail::rank_label(rank(), size(), backend()));
  this->check(what, output, static_cast<int>(detail::Collective::kAllGather), 0, check, &input);
  ncclComm_t comm = state_->comm;
  cudaStream_t stream = stream_;
  const void* source = input.data_ptr();
  const size_t part = static_cast<size_t>(input.numel());
  return enqueue(
      what, output,
      [&](void* data, size_t, ncclDataType_t type) {
        return ncclAllGather(source, data, part, type, comm, stream);  // sendcount: one rank's part
      },
      input);
}

void ProcessGroupNCCL::barrier() { bootstrap_->barrier(); }
int64_t ProcessGroupNCCL::all_reduce_int(int64_t value, ReduceOp op) { return bootstrap_->all_reduce_int(value, op); }
std::vector<std::string> ProcessGroupNCCL::all_gather_bytes(const std::string& bytes) {
  return bootstrap_->all_gather_bytes(bytes);
}

}  // namespace ampgrad::distributed
