// Cross-rank argument checks for collectives (see collective_check.h).
#include "distributed/collective_check.h"

#include <algorithm>
#include <sstream>

#include "framework/error.h"

namespace ampgrad::distributed::detail {

namespace {

std::string describe(const CollectiveRecord& r) {
  if (r.dtype < 0) return "an undefined tensor";
  std::ostringstream out;
  out << "Tensor[";
  for (int i = 0; i < r.ndim; ++i) out << (i ? ", " : "") << r.dims[i];
  out << "] " << dtype_name(static_cast<DType>(r.dtype)) << ' ' << device_name(static_cast<Device>(r.device));
  if (r.collective == static_cast<int32_t>(Collective::kBroadcast)) out << " (root " << r.argument << ")";
  if (r.collective == static_cast<int32_t>(Collective::kAllGather) && r.argument == kInPlace) out << " (in place)";
  if (r.collective == static_cast<int32_t>(Collective::kAllReduce) ||
      r.collective == static_cast<int32_t>(Collective::kReduceScatter)) {
    out << " (" << reduce_op_name(static_cast<ReduceOp>(r.argument)) << ")";
  }
  return out.str();
}

bool same_call(const CollectiveRecord& a, const CollectiveRecord& b) {
  return a.collective == b.collective && a.argument == b.argument && a.dtype == b.dtype && a.ndim == b.ndim &&
         a.numel == b.numel && std::equal(a.dims, a.dims + CollectiveRecord::kMaxDims, b.dims);
}

std::string hint_for(Problem problem, Backend backend, Device device) {
  switch (problem) {
    case Problem::kWrongDevice:
      return ::ampgrad::detail::str_cat(backend == Backend::kMPI ? "an MPI" : "an NCCL", " group reduces ",
                                        device_name(device),
                                        " tensors; hint: use Backend::",
                                        device == Device::kCPU ? "kNCCL for CUDA tensors" : "kMPI for CPU tensors",
                                        ", or move the tensor with .to(Device::k",
                                        device == Device::kCPU ? "CPU" : "CUDA", ")");
    case Problem::kUndefined: return "the tensor is undefined";
    case Problem::kUnsupportedDType: return "its dtype is not supported by this backend";
    case Problem::kAvgOfIntegers: return "ReduceOp::kAvg needs a floating dtype; hint: use kSum and divide";
    case Problem::kBadPart:
      return "the per-rank tensor must have the whole's dtype and device and 1/size of its elements; hint: pad the "
             "whole to a multiple of the group size";
    case Problem::kOverlap:
      return "the per-rank tensor shares bytes with the whole; hint: pass separate tensors, or (all_gather only) "
             "make the input exactly this rank's part of the output, alias_elements(output, rank * part, {part})";
    case Problem::kOk: break;
  }
  return "";
}

}  // namespace

namespace {

std::string label(const Tensor& t) { return t.defined() ? t.to_string() : "an undefined tensor"; }

// Where `part` lies against `whole` (both defined, one dtype): 1 = exactly part `rank` of it, 0 =
// no byte in common, -1 = any other overlap.
int placement(const Tensor& whole, const Tensor& part, int rank) {
  const auto* w = static_cast<const char*>(whole.data_ptr());
  const auto* p = static_cast<const char*>(part.data_ptr());
  const size_t part_bytes = static_cast<size_t>(part.numel()) * element_size(part.dtype());
  const size_t whole_bytes = static_cast<size_t>(whole.numel()) * element_size(whole.dtype());
  if (part_bytes == 0 || whole_bytes == 0 || p + part_bytes <= w || w + whole_bytes <= p) return 0;
  return p == w + static_cast<size_t>(rank) * part_bytes ? 1 : -1;
}

}  // namespace

std::string all_reduce_label(ReduceOp op, const Tensor& tensor, const std::string& where) {
  return ::ampgrad::detail::str_cat("all_reduce(", reduce_op_name(op), ") of ", label(tensor), " on ", where);
}

std::string broadcast_label(int root, const Tensor& tensor, const std::string& where) {
  return ::ampgrad::detail::str_cat("broadcast from rank ", root, " of ", label(tensor), " on ", where);
}

std::string reduce_scatter_label(ReduceOp op, const Tensor& input, const Tensor& output, const std::string& where) {
  return ::ampgrad::detail::str_cat("reduce_scatter(", reduce_op_name(op), ") of ", label(input), " into ",
                                    label(output), " on ", where);
}

std::string all_gather_label(const Tensor& input, const Tensor& output, const std::string& where) {
  return ::ampgrad::detail::str_cat("all_gather of ", label(input), " into ", label(output), " on ", where);
}

CollectiveRecord describe_collective(Collective collective, int32_t argument, const Tensor& tensor, Device device,
                                     bool (*supported)(DType), const Tensor* part, int parts, int rank) {
  CollectiveRecord r;
  r.collective = static_cast<int32_t>(collective);
  r.argument = argument;
  if (!tensor.defined()) {
    r.problem = static_cast<int32_t>(Problem::kUndefined);
    return r;
  }
  r.dtype = static_cast<int32_t>(tensor.dtype());
  r.device = static_cast<int32_t>(tensor.device());
  r.numel = tensor.numel();
  r.ndim = static_cast<int32_t>(tensor.dim());
  for (int i = 0; i < r.ndim; ++i) r.dims[i] = tensor.shape()[static_cast<size_t>(i)];
  if (tensor.device() != device) {
    r.problem = static_cast<int32_t>(Problem::kWrongDevice);
  } else if (!supported(tensor.dtype())) {
    r.problem = static_cast<int32_t>(Problem::kUnsupportedDType);
  } else if ((collective == Collective::kAllReduce || collective == Collective::kReduceScatter) &&
             argument == static_cast<int32_t>(ReduceOp::kAvg) &&
             !is_floating(tensor.dtype())) {
    r.problem = static_cast<int32_t>(Problem::kAvgOfIntegers);
  } else if (part != nullptr && (!part->defined() || part->dtype() != tensor.dtype() ||
                                 part->device() != tensor.device() ||
                                 tensor.numel() != static_cast<int64_t>(parts) * part->numel())) {
    r.problem = static_cast<int32_t>(Problem::kBadPart);
  } else if (part != nullptr) {
    const int where = placement(tensor, *part, rank);
    if (where == 1 && collective == Collective::kAllGather) {
      r.argument = kInPlace;
    } else if (where != 0) {
      r.problem = static_cast<int32_t>(Problem::kOverlap);
    }
  }
  return r;
}

void check_local(const CollectiveRecord& record, const std::string& what, Backend backend, Device device) {
  AG_CHECK(record.problem == static_cast<int32_t>(Problem::kOk), "ampgrad.distributed: ", what, ": ", describe(record), ": ",
           hint_for(static_cast<Problem>(record.problem), backend, device));
}

void check_collective(const std::vector<CollectiveRecord>& records, const std::string& what, Backend backend,
                      Device device) {
  bool ok = true;
  const auto usable = [](const CollectiveRecord& r) { return r.problem == static_cast<int32_t>(Problem::kOk); };
  for (const CollectiveRecord& r : records) ok = ok && usable(r) && same_call(r, records[0]);
  if (ok) return;
  std::ostringstream table;
  std::string hint;
  for (size_t rank = 0; rank < records.size(); ++rank) {
    const CollectiveRecord& r = records[rank];
    table << (rank ? "; " : "") << "rank " << rank << ": " << describe(r);
    if (!usable(r)) {
      table << " [unusable]";
      if (hint.empty()) hint = hint_for(static_cast<Problem>(r.problem), backend, device);
    }
  }
  if (hint.empty()) {
    hint = "hint: every rank must pass the same shape, dtype and arguments, and call the same collectives in the "
           "same order";
  }
  AG_FAIL("ampgrad.distributed: ", what, ": the ranks' arguments do not match (", table.str(), "); ", hint,
          "; nothing was reduced, and the group is still usable");
}

}  // namespace ampgrad::distributed::detail
