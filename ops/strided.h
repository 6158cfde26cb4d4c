// Iterating over several operands of one shape, each with its own strides (0 where an operand is
// broadcast, a permutation for a transpose, an offset for a slice): the plan every element-wise,
// broadcast, reduction and copy kernel walks, on the CPU and on CUDA (it is passed to kernels by
// value). Plans are coalesced: adjacent dimensions that are contiguous in every operand merge, and
// size-1 dimensions drop, so [64, 512, 768] + [768] walks as [32768, 768] and a same-shape add as
// one flat loop.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "framework/device.h"
#include "framework/error.h"
#include "framework/tensor.h"

namespace ampgrad::kernels {

/// Dimensions an iteration plan can keep: as many as a tensor can have, so that every shape
/// iterates, even one whose dimensions do not merge (a permute of a [B, H, T, D] tensor keeps 4).
inline constexpr int kMaxPlanDims = kMaxDims;

/// N operands walked together over `sizes`: element (i0, .., ik) of operand n is at
/// offset[n] + sum_d i_d * strides[n][d]. Dimension rank - 1 is the innermost (fastest) one.
template <int N>
struct StridedPlan {
  int rank = 0;
  int64_t numel = 1;
  int64_t sizes[kMaxPlanDims] = {};
  int64_t offset[N] = {};
  int64_t strides[N][kMaxPlanDims] = {};
};

/// The row-major strides of a contiguous tensor of `shape` ({12, 4, 1} for [2, 3, 4]).
Shape contiguous_strides(const Shape& shape);

/// A tensor of `shape` viewed as [outer, size, inner] around dimension `dim` (non-negative): what
/// kernels along one dimension (softmax, max, argmax) index by.
struct AlongDim {
  int64_t outer = 1, size = 1, inner = 1;
};
AlongDim along_dim(const Shape& shape, int64_t dim);

/// NumPy/PyTorch broadcasting: the shape both a and b stretch to (aligned at the last dimension; a
/// dimension of 1 stretches), or nullopt with *failing_dim set to the first dimension (counted from
/// the end: -1 is the last) where they differ and neither is 1.
std::optional<Shape> try_broadcast_shapes(const Shape& a, const Shape& b, int64_t* failing_dim = nullptr);
/// The same, throwing an Error that names `op`, both shapes and the dimension that fails.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

/// The strides with which a contiguous tensor of `shape` is read as `target` (its broadcast): 0
/// for the dimensions it is broadcast along, and for the leading dimensions it lacks.
Shape broadcast_strides(const Shape& shape, const Shape& target);

/// A plan over `sizes` from each operand's strides and offset, coalesced. Strides may be 0
/// (broadcast) or any permutation. Throws if sizes has more than kMaxPlanDims dimensions.
template <int N>
StridedPlan<N> make_plan(const Shape& sizes, const std::array<Shape, N>& strides,
                         const std::array<int64_t, N>& offsets = {}) {
  StridedPlan<N> plan;
  for (int n = 0; n < N; ++n) plan.offset[n] = offsets[n];
  plan.numel = shape_numel(sizes);
  // Walk from the innermost dimension out, merging each into the previous kept one when every
  // operand continues contiguously across the boundary.
  int64_t kept_sizes[kMaxPlanDims];
  int64_t kept_strides[N][kMaxPlanDims];
  int kept = 0;
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    const int64_t size = sizes[static_cast<size_t>(d)];
    if (size == 1) continue;
    if (kept > 0) {
      bool merges = true;
      for (int n = 0; n < N; ++n) {
        merges = merges && strides[n][static_cast<size_t>(d)] == kept_strides[n][kept - 1] * kept_sizes[kept - 1];
      }
      if (merges) {
        kept_sizes[kept - 1] *= size;
        continue;
      }
    }
    AG_CHECK(kept < kMaxPlanDims, "a strided iteration over ", shape_to_string(sizes), " has more than the ",
             kMaxPlanDims, " dimensions a tensor may have");
    kept_sizes[kept] = size;
    for (int n = 0; n < N; ++n) kept_strides[n][kept] = strides[n][static_cast<size_t>(d)];
    ++kept;
  }
  plan.rank = kept;
  for (int i = 0; i < kept; ++i) {  // back to outermost-first order
    plan.sizes[i] = kept_sizes[kept - 1 - i];
    for (int n = 0; n < N; ++n) plan.strides[n][i] = kept_strides[n][kept - 1 - i];
  }
  return plan;
}

/// Calls fn(offsets, inner) for the rows of `plan` in [row_begin, row_end): a row is the innermost
/// dimension (plan.sizes[rank - 1] elements, operand n stepping by plan.strides[n][rank - 1]);
/// offsets[n] is the row's first element in operand n. A rank-0 plan is one row of one element.
template <int N, typename Fn>
void for_each_row(const StridedPlan<N>& plan, int64_t row_begin, int64_t row_end, Fn&& fn) {
  if (row_begin >= row_end) return;
  const int outer_rank = plan.rank > 0 ? plan.rank - 1 : 0;
  const int64_t inner = plan.rank > 0 ? plan.sizes[plan.rank - 1] : 1;
  int64_t index[kMaxPlanDims] = {};
  int64_t offsets[N];
  // Decompose the first row once; then step the odometer.
  int64_t rest = row_begin;
  for (int d = outer_rank - 1; d >= 0; --d) {
    index[d] = rest % plan.sizes[d];
    rest /= plan.sizes[d];
  }
  for (int n = 0; n < N; ++n) {
    offsets[n] = plan.offset[n];
    for (int d = 0; d < outer_rank; ++d) offsets[n] += index[d] * plan.strides[n][d];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    fn(static_cast<const int64_t*>(offsets), inner);
    for (int d = outer_rank - 1; d >= 0; --d) {
      for (int n = 0; n < N; ++n) offsets[n] += plan.strides[n][d];
      if (++index[d] < plan.sizes[d]) break;
      for (int n = 0; n < N; ++n) offsets[n] -= plan.strides[n][d] * plan.sizes[d];
      index[d] = 0;
    }
  }
}

/// The offsets in every operand of the plan's element `linear` (row-major over plan.sizes): for
/// kernels that give each thread its own elements.
template <int N>
AG_HOST_DEVICE inline void plan_offsets(const StridedPlan<N>& plan, int64_t linear, int64_t (&offsets)[N]) {
  for (int n = 0; n < N; ++n) offsets[n] = plan.offset[n];
  for (int d = plan.rank - 1; d >= 0; --d) {
    const int64_t i = linear % plan.sizes[d];
    linear /= plan.sizes[d];
    for (int n = 0; n < N; ++n) offsets[n] += i * plan.strides[n][d];
  }
}

/// The number of rows of a plan (elements / innermost size).
template <int N>
int64_t plan_rows(const StridedPlan<N>& plan) {
  if (plan.numel == 0) return 0;
  return plan.rank > 0 ? plan.numel / plan.sizes[plan.rank - 1] : 1;
}

}  // namespace ampgrad::kernels
