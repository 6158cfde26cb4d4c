// The cross-rank check of a collective's arguments: each rank describes what it passed in a small
// fixed-size record, the records are all-gathered, and every rank finds the same mismatch and
// throws the same Error, naming each rank's tensor. Internal to distributed/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "framework/tensor.h"

namespace ampgrad::distributed::detail {

/// Why this rank's own tensor cannot take part, found before any communication.
enum class Problem : int32_t { kOk, kUndefined, kWrongDevice, kUnsupportedDType, kAvgOfIntegers, kBadPart, kOverlap };

/// What one rank passed to a collective. Plain bytes: it travels as it is.
struct CollectiveRecord {
  static constexpr int kMaxDims = ::ampgrad::kMaxDims;  // every tensor's shape fits
  int32_t collective = 0;  // Collective below
  int32_t argument = 0;    // the ReduceOp, the broadcast's root, or all-gather's kInPlace / kOutOfPlace
  int32_t dtype = -1;      // -1: undefined tensor
  int32_t device = -1;
  int32_t problem = 0;     // a Problem
  int32_t ndim = 0;
  int64_t numel = 0;
  int64_t dims[kMaxDims] = {};
};

enum class Collective : int32_t { kAllReduce, kBroadcast, kReduceScatter, kAllGather };

/// An all-gather's argument: whether the input is this rank's part of the output. MPI needs every
/// rank to agree (MPI_IN_PLACE is all or none), so it is compared across ranks like a ReduceOp.
inline constexpr int32_t kOutOfPlace = 0, kInPlace = 1;

/// How errors name a collective call, `where` being rank_label's "rank 1 of 2 (mpi)":
/// "all_reduce(sum) of Tensor[4] float32 cpu on rank 1 of 2 (mpi)".
std::string all_reduce_label(ReduceOp op, const Tensor& tensor, const std::string& where);
/// "broadcast from rank 0 of ... on ...".
std::string broadcast_label(int root, const Tensor& tensor, const std::string& where);
/// "reduce_scatter(avg) of INPUT into OUTPUT on ...".
std::string reduce_scatter_label(ReduceOp op, const Tensor& input, const Tensor& output, const std::string& where);
/// "all_gather of INPUT into OUTPUT on ...".
std::string all_gather_label(const Tensor& input, const Tensor& output, const std::string& where);

/// The record of `tensor` as passed on this rank, including whether it is usable by a group on
/// `device` whose backend supports `supported(dtype)`. Reduce-scatter and all-gather describe the
/// whole tensor and pass this rank's `part` of it: a part that is undefined, of another dtype or
/// device, or not 1/`parts` of the whole's elements is Problem::kBadPart, so that every rank
/// throws (not this one alone, leaving the others waiting). A part whose bytes overlap the whole's
/// is Problem::kOverlap, except an all-gather's input that is exactly rank `rank`'s part of the
/// output: that one runs in place, and the record's argument says kInPlace.
CollectiveRecord describe_collective(Collective collective, int32_t argument, const Tensor& tensor, Device device,
                                     bool (*supported)(DType), const Tensor* part = nullptr, int parts = 1,
                                     int rank = 0);
/// Throws the Error every rank throws when the records (indexed by rank) disagree or one rank's
/// tensor is unusable; `what` names the collective, `group` the rank and backend for the message.
void check_collective(const std::vector<CollectiveRecord>& records, const std::string& what, Backend backend,
                      Device device);
/// The same check for this rank alone, for collectives issued with CheckAcrossRanks::kNo.
void check_local(const CollectiveRecord& record, const std::string& what, Backend backend, Device device);

}  // namespace ampgrad::distributed::detail
