// How each dtype is all-reduced over MPI. OpenMPI has no 16-bit float type, so 16-bit dtypes travel
// as 16-bit elements (half the bytes of converting to float32) and are combined by user-defined
// ops that widen to float32, add or compare, and round once per combine. Internal to distributed/.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "distributed/process_group.h"
#include "framework/dtype.h"

namespace ampgrad::distributed::detail {

/// What all_reduce does for (dtype, op): MPI's datatype and op, and where kAvg divides by the
/// group size: before the sum for 16-bit dtypes (partial sums then stay within the inputs' range,
/// so they cannot overflow where the average would not), after it for wider ones (one rounding).
struct MpiReduction {
  MPI_Datatype type;
  MPI_Op op;
  bool divide_before;
  bool divide_after;
};

/// Whether MPI groups reduce and broadcast this dtype (every dtype of the dtype table: the
/// floating ones and int64; kAvg takes floating dtypes only).
bool mpi_supports(DType dtype);
/// The datatype of one element (16-bit floats: 2 opaque bytes). Communication thread only.
MPI_Datatype mpi_datatype(DType dtype);
/// Communication thread only (it creates the user-defined ops on first use).
MpiReduction mpi_reduction(DType dtype, ReduceOp op);
/// Whether kAvg of `dtype` divides before the sum (16-bit dtypes). Any thread.
bool mpi_reduction_divides_before(DType dtype, ReduceOp op);
/// data[i] = data[i] / divisor, computed in the dtype's compute type and rounded once.
void divide_in_place(void* data, DType dtype, int64_t n, int divisor);

}  // namespace ampgrad::distributed::detail
