// ProcessGroupMPI: each collective is a list of phases for the communication thread (see
// mpi_runtime.h): an optional all-gather that checks the ranks' arguments, then the operation.
#include "distributed/process_group_mpi.h"

#include <climits>
#include <cstring>

#include "distributed/collective_check.h"
#include "distributed/mpi_reduce.h"
#include "framework/copy.h"
#include "framework/error.h"

namespace ampgrad::distributed {

using detail::mpi_check;
using detail::MpiPhase;

namespace {

int checked_count(int64_t n, const std::string& what) {
  AG_CHECK(n <= INT_MAX, "ampgrad.distributed: ", what, ": ", n, " elements is more than one MPI call can send (",
           INT_MAX, "); hint: reduce it in parts");
  return static_cast<int>(n);
}

}  // namespace

std::shared_ptr<ProcessGroupMPI> ProcessGroupMPI::create_world(ProcessGroupOptions options) {
  const double timeout = collective_timeout(options), startup = startup_timeout(options);
  detail::MpiRuntime& runtime = detail::MpiRuntime::get(startup);
  auto comm = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  MpiPhase dup{.start = [comm](MPI_Request* request) {
                 mpi_check(MPI_Comm_idup(MPI_COMM_WORLD, comm.get(), request), "MPI_Comm_idup");
               },
               .finish = [comm] {
                 mpi_check(MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
               }};
  const std::string what = ::ampgrad::detail::str_cat(
      "creating an MPI process group on ", detail::rank_label(runtime.world_rank(), runtime.world_size(), Backend::kMPI));
  // The first collective of the job: every rank has to have started, so the start-up deadline applies.
  auto work = std::make_shared<detail::MpiWork>(what, std::vector<MpiPhase>{dup}, std::vector<Tensor>{}, startup);
  runtime.submit(work);
  work->wait();
  return std::shared_ptr<ProcessGroupMPI>(
      new ProcessGroupMPI(runtime, *comm, runtime.world_rank(), runtime.world_size(), timeout));
}

ProcessGroupMPI::ProcessGroupMPI(detail::MpiRuntime& runtime, MPI_Comm comm, int rank, int size,
                                 double timeout_seconds)
    : ProcessGroup(rank, size, timeout_seconds), runtime_(runtime), comm_(comm) {
  runtime_.add_group(+1);
}

ProcessGroupMPI::~ProcessGroupMPI() {
  // Queued behind this group's last collectives, not waited for: MPI_Comm_free is local, and a
  // destructor must not block on other ranks (a broken or exiting runtime just drops it).
  MPI_Comm comm = comm_;
  MpiPhase free_comm{.start = [comm](MPI_Request*) mutable { MPI_Comm_free(&comm); }, .finish = nullptr};
  runtime_.submit(std::make_shared<detail::MpiWork>("freeing an MPI communicator", std::vector<MpiPhase>{free_comm},
                                                    std::vector<Tensor>{}, timeout_seconds()));
  runtime_.add_group(-1);
}

std::shared_ptr<Work> ProcessGroupMPI::submit(std::string what, std::vector<MpiPhase> phases,
                                              std::vector<Tensor> tensors, std::vector<Tensor> held) {
  auto work = std::make_shared<detail::MpiWork>(std::move(what), std::move(phases), std::move(tensors),
                                                timeout_seconds(), std::move(held));
  runtime_.submit(work);
  return work;
}

MpiPhase ProcessGroupMPI::check_phase(const detail::CollectiveRecord& mine, const std::string& what) {
  using detail::CollectiveRecord;
  struct Exchange {
    CollectiveRecord mine;
    std::vector<CollectiveRecord> all;
  };
  auto exchange = std::make_shared<Exchange>();
  exchange->mine = mine;
  exchange->all.resize(static_cast<size_t>(size()));
  const MPI_Comm comm = comm_;
  return {.start = [exchange, comm](MPI_Request* request) {
            mpi_check(MPI_Iallgather(&exchange->mine, sizeof(CollectiveRecord), MPI_BYTE, exchange->all.data(),
                                     sizeof(CollectiveRecord), MPI_BYTE, comm, request),
                      "MPI_Iallgather");
          },
          .finish = [exchange, what, backend = backend(), device = device()] {
            detail::check_collective(exchange->all, what, backend, device);
          }};
}

std::shared_ptr<Work> ProcessGroupMPI::all_reduce_async(Tensor& tensor, ReduceOp op, CheckAcrossRanks check) {
  const std::string what =
      detail::all_reduce_label(op, tensor, detail::rank_label(rank(), size(), backend()));
  std::vector<MpiPhase> phases;
  if (add_check(phases,
                detail::describe_collective(detail::Collective::kAllReduce, static_cast<int32_t>(op), tensor, device(),
                                            &detail::mpi_supports),
                check, what)) {
    void* data = tensor.data_ptr();
    const DType dtype = tensor.dtype();
    const int64_t n = tensor.numel();
    const int count = checked_count(n, what);
    const int group_size = size();
    const MPI_Comm comm = comm_;
    phases.push_back({.start = [=](MPI_Request* request) {
                        const detail::MpiReduction r = detail::mpi_reduction(dtype, op);
                        if (r.divide_before) detail::divide_in_place(data, dtype, n, group_size);
                        mpi_check(MPI_Iallreduce(MPI_IN_PLACE, data, count, r.type, r.op, comm, request),
                                  "MPI_Iallreduce");
                      },
                      .finish = [=] {
                        if (detail::mpi_reduction(dtype, op).divide_after) {
                          detail::divide_in_place(data, dtype, n, group_size);
                        }
                      }});
  }
  return submit(what, std::move(phases), {tensor});
}

std::shared_ptr<Work> ProcessGroupMPI::broadcast_async(Tensor& tensor, int root, CheckAcrossRanks check) {
  const std::string what =
      detail::broadcast_label(root, tensor, detail::rank_label(rank(), size(), backend()));
  AG_CHECK(root >= 0 && root < size(), "ampgrad.distributed: ", what, ": root must be in [0, ", size(), ")");
  std::vector<MpiPhase> phases;
  if (add_check(phases,
                detail::describe_collective(detail::Collective::kBroadcast, root, tensor, device(),
                                            &detail::mpi_supports),
                check, what)) {
    void* data = tensor.data_ptr();
    const DType dtype = tensor.dtype();
    const int count = checked_count(tensor.numel(), what);
    const MPI_Comm comm = comm_;
    phases.push_back({.start = [=](MPI_Request* request) {
                        mpi_check(MPI_Ibcast(data, count, detail::mpi_datatype(dtype), root, comm, request),
                                  "MPI_Ibcast");
                      },
                      .finish = nullptr});
  }
  return submit(what, std::move(phases), {tensor});
}

bool ProcessGroupMPI::add_check(std::vector<MpiPhase>& phases, const detail::CollectiveRecord& mine,
                                CheckAcrossRanks check, const std::string& what) {
  if (check == CheckAcrossRanks::kYes) {
    phases.push_back(check_phase(mine, what));  // throws on every rank when any rank's record is bad
  } else {
    detail::check_local(mine, what, backend(), device());
  }
  return mine.problem == static_cast<int32_t>(detail::Problem::kOk);
}

std::shared_ptr<Work> ProcessGroupMPI::reduce_scatter_async(Tensor& output, const Tensor& input, ReduceOp op,
                                                            CheckAcrossRanks check) {
  const std::string what =
      detail::reduce_scatter_label(op, input, output, detail::rank_label(rank(), size(), backend()));
  std::vector<MpiPhase> phases;
  if (!add_check(phases,
                 detail::describe_collective(detail::Collective::kReduceScatter, static_cast<int32_t>(op), input,
                                             device(), &detail::mpi_supports, &output, size(), rank()),
                 check, what)) {
    return submit(what, std::move(phases), {});
  }
  const DType dtype = input.dtype();
  const int64_t n = output.numel();
  const int count = checked_count(n, what);
  const int group_size = size();
  const MPI_Comm comm = comm_;
  void* out = output.data_ptr();
  // A 16-bit kAvg divides before the sum (see ReduceOp): into a copy, so the input is not changed.
  Tensor source = input;
  if (detail::mpi_reduction_divides_before(dtype, op)) {
    source = Tensor::empty(input.shape(), dtype, input.device());
    copy_(source, input);
  }
  const void* in = source.data_ptr();
  phases.push_back({.start = [=](MPI_Request* request) {
                      const detail::MpiReduction r = detail::mpi_reduction(dtype, op);
                      if (r.divide_before) detail::divide_in_place(const_cast<void*>(in), dtype, n * group_size, group_size);
                      mpi_check(MPI_Ireduce_scatter_block(in, out, count, r.type, r.op, comm, request),
                                "MPI_Ireduce_scatter_block");
                    },
                    .finish = [=] {
                      if (detail::mpi_reduction(dtype, op).divide_after) detail::divide_in_place(out, dtype, n, group_size);
                    }});
  return submit(what, std::move(phases), {output}, {source});
}

std::shared_ptr<Work> ProcessGroupMPI::all_gather_async(Tensor& output, const Tensor& input, CheckAcrossRanks check) {
  const std::string what =
      detail::all_gather_label(input, output, detail::rank_label(rank(), size(), backend()));
  std::vector<MpiPhase> phases;
  const detail::CollectiveRecord record = detail::describe_collective(
      detail::Collective::kAllGather, detail::kOutOfPlace, output, device(), &detail::mpi_supports, &input, size(), rank());
  if (!add_check(phases, record, check, what)) return submit(what, std::move(phases), {});
  const DType dtype = input.dtype();
  const int count = checked_count(input.numel(), what);
  const MPI_Comm comm = comm_;
  void* out = output.data_ptr();
  // In place when the input is this rank's part of the output (MPI wants MPI_IN_PLACE for that, on
  // every rank: the cross-rank check compares it).
  const void* in = record.argument == detail::kInPlace ? MPI_IN_PLACE : input.data_ptr();
  phases.push_back({.start = [=](MPI_Request* request) {
                      const MPI_Datatype type = detail::mpi_datatype(dtype);
                      mpi_check(MPI_Iallgather(in, count, type, out, count, type, comm, request), "MPI_Iallgather");
                    },
                    .finish = nullptr});
  return submit(what, std::move(phases), {output}, {input});  // the input is only read
}

void ProcessGroupMPI::barrier() {
  const MPI_Comm comm = comm_;
  submit(::ampgrad::detail::str_cat("barrier on ", detail::rank_label(rank(), size(), backend())),
         {{.start = [comm](MPI_Request* request) { mpi_check(MPI_Ibarrier(comm, request), "MPI_Ibarrier"); },
           .finish = nullptr}},
         {})
      ->wait();
}

int64_t ProcessGroupMPI::all_reduce_int(int64_t value, ReduceOp op) {
  auto result = std::make_shared<int64_t>(value);
  const MPI_Comm comm = comm_;
  const MPI_Op mpi_op = op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
  submit(::ampgrad::detail::str_cat("all_reduce_int(", reduce_op_name(op), ") on ",
                                    detail::rank_label(rank(), size(), backend())),
         {{.start = [=](MPI_Request* request) {
             mpi_check(MPI_Iallreduce(MPI_IN_PLACE, result.get(), 1, MPI_INT64_T, mpi_op, comm, request),
                       "MPI_Iallreduce");
           },
           .finish = nullptr}},
         {})
      ->wait();
  return op == ReduceOp::kAvg ? *result / size() : *result;
}

std::vector<std::string> ProcessGroupMPI::all_gather_bytes(const std::string& bytes) {
  const std::string what = ::ampgrad::detail::str_cat("all_gather_bytes(", bytes.size(), " bytes) on ",
                                                      detail::rank_label(rank(), size(), backend()));
  struct Exchange {
    std::string mine;
    int length = 0;
    std::vector<int> lengths, offsets;
    std::vector<char> all;
  };
  auto x = std::make_shared<Exchange>();
  x->mine = bytes;
  x->lengths.resize(static_cast<size_t>(size()));
  x->offsets.resize(static_cast<size_t>(size()));
  x->length = checked_count(static_cast<int64_t>(bytes.size()), what);
  const MPI_Comm comm = comm_;
  auto lengths = [x, comm](MPI_Request* request) {
    mpi_check(MPI_Iallgather(&x->length, 1, MPI_INT, x->lengths.data(), 1, MPI_INT, comm, request), "MPI_Iallgather");
  };
  auto layout = [x, what] {
    int64_t total = 0;
    for (size_t r = 0; r < x->lengths.size(); ++r) {
      x->offsets[r] = static_cast<int>(total);
      total += x->lengths[r];
    }
    checked_count(total, what);
    x->all.resize(static_cast<size_t>(total));
  };
  auto data = [x, comm](MPI_Request* request) {
    mpi_check(MPI_Iallgatherv(x->mine.data(), static_cast<int>(x->mine.size()), MPI_CHAR, x->all.data(),
                              x->lengths.data(), x->offsets.data(), MPI_CHAR, comm, request),
              "MPI_Iallgatherv");
  };
  submit(what, {{.start = lengths, .finish = layout}, {.start = data, .finish = nullptr}}, {})->wait();
  std::vector<std::string> out;
  for (size_t r = 0; r < x->lengths.size(); ++r) {
    out.emplace_back(x->all.data() + x->offsets[r], static_cast<size_t>(x->lengths[r]));
  }
  return out;
}

}  // namespace ampgrad::distributed
