// Names, the timeout defaults and the agreement on an outcome.
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

namespace {

// Seconds from the environment variable `name`, else `fallback`.
double seconds_from_env(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  AG_CHECK(end != text && *end == '\0' && seconds > 0 && seconds < 1e9, name, "=", text,
           " is not a number of seconds > 0; hint: for example ", name, "=60");
  return seconds;
}

}  // namespace

double default_timeout_seconds() { return seconds_from_env("AMPGRAD_DISTRIBUTED_TIMEOUT", kDefaultTimeoutSeconds); }

double default_startup_timeout_seconds() {
  return seconds_from_env("AMPGRAD_DISTRIBUTED_STARTUP_TIMEOUT", kDefaultStartupTimeoutSeconds);
}

double collective_timeout(const ProcessGroupOptions& options) {
  return options.timeout_seconds > 0 ? options.timeout_seconds : default_timeout_seconds();
}

double startup_timeout(const ProcessGroupOptions& options) {
  return options.startup_timeout_seconds > 0 ? options.startup_timeout_seconds : default_startup_timeout_seconds();
}

void agree_on_outcome(ProcessGroup& group, const std::string& my_error, const std::string& what,
                      const std::string& hint) {
  const std::vector<std::string> errors = group.all_gather_bytes(my_error);
  std::string report;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) report += ::ampgrad::detail::str_cat(report.empty() ? "" : "; ", "rank ", r, ": ", errors[r]);
  }
  AG_CHECK(report.empty(), what, " failed: ", report, "; hint: ", hint);
}

}  // namespace ampgrad::distributed
