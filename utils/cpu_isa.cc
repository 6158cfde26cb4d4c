// AMPGRAD_CPU_ISA parsing (see cpu_isa.h).
#include "utils/cpu_isa.h"

#include <cstdlib>
#include <string_view>

#include "framework/error.h"

namespace ampgrad::utils {

CpuIsa parse_cpu_isa(const char* value) {
  const std::string_view v = value == nullptr ? "" : value;
  if (v.empty() || v == "native") return CpuIsa::kNative;
  if (v == "baseline") return CpuIsa::kBaseline;
  AG_FAIL("AMPGRAD_CPU_ISA='", v, "' is not a known setting; hint: use 'baseline' (portable code only) or ",
          "'native' (the default: the best the CPU supports)");
}

CpuIsa cpu_isa() {
  // A function-local static: thread-safe, read once, so the choice cannot change mid-run.
  static const CpuIsa isa = parse_cpu_isa(std::getenv("AMPGRAD_CPU_ISA"));
  return isa;
}

}  // namespace ampgrad::utils
