// Names and the timeout default.
#include "distributed/process_group.h"

#include <cstdlib>

#include "framework/error.h"

namespace ampgrad::distributed {

std::string_view backend_name(Backend backend) { return backend == Backend::kMPI ? "mpi" : "nccl"; }

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

double default_timeout_seconds() {
  const char* text = std::getenv("AMPGRAD_DISTRIBUTED_TIMEOUT");
  if (text == nullptr || *text == '\0') return kDefaultTimeoutSeconds;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  AG_CHECK(end != text && *end == '\0' && seconds > 0 && seconds < 1e9, "AMPGRAD_DISTRIBUTED_TIMEOUT=", text,
           " is not a number of seconds > 0; hint: for example AMPGRAD_DISTRIBUTED_TIMEOUT=60");
  return seconds;
}

}  // namespace ampgrad::distributed
