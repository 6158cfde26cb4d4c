// Which CPU instruction sets ampgrad may use, chosen once per process from AMPGRAD_CPU_ISA.
// Every run-time CPU-feature choice asks this first, so one variable forces the portable paths.
#pragma once

namespace ampgrad::utils {

/// kBaseline: portable code only. kNative: the best the running CPU supports.
enum class CpuIsa { kBaseline, kNative };

/// Parses a value of AMPGRAD_CPU_ISA: null, "" or "native" -> kNative; "baseline" -> kBaseline;
/// anything else throws ampgrad::Error naming the value and the accepted ones.
CpuIsa parse_cpu_isa(const char* value);

/// parse_cpu_isa(getenv("AMPGRAD_CPU_ISA")), read on the first call and cached for the process.
CpuIsa cpu_isa();

}  // namespace ampgrad::utils
