// The running CPU's instruction-set features, detected once, and the one switch that limits which
// of them ampgrad's kernels may use (AMPGRAD_CPU_ISA). Every run-time CPU-feature choice asks here.
#pragma once

#include <string>

namespace ampgrad {

/// What the CPU and the operating system together support (CPUID, and XGETBV for the register
/// state the OS saves). Detected on the first call to cpu_features().
struct CpuFeatures {
  bool sse42 = false, avx2 = false, fma = false, f16c = false;  // the default build's baseline
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_fp16 = false;  // Linux also asks for a permission to use AMX
};

/// The features of the running CPU, detected once per process.
const CpuFeatures& cpu_features();

/// An instruction-set level, lowest first; each allows the ones below it. kBaseline: only what the
/// build's compiler flags guarantee, no run-time-chosen extension (portable CRC-32C; the AVX2 GEMM
/// with the default flags). kAvx2: extensions of AVX2-era CPUs chosen at run time (SSE4.2 CRC-32C).
/// kAvx512: AVX-512 F/BW/VL/DQ kernels too (BF16 GEMM operands still widened to float).
/// kAvx512Bf16: AVX512_BF16 too: BF16 x BF16 GEMMs multiply BF16 pairs with VDPBF16PS, which
/// flushes subnormal inputs and sums to zero (a level of its own so that it can be turned off).
/// kNative: the best the CPU supports.
enum class CpuIsa { kBaseline, kAvx2, kAvx512, kAvx512Bf16, kNative };

/// "baseline", "avx2", "avx512", "avx512_bf16", "native".
const char* cpu_isa_name(CpuIsa isa);

/// Parses a value of AMPGRAD_CPU_ISA: null, "" or "native" -> kNative; "baseline", "avx2",
/// "avx512", "avx512_bf16" -> that level; anything else throws ampgrad::Error naming the value and
/// the accepted ones.
CpuIsa parse_cpu_isa(const char* value);

/// parse_cpu_isa(getenv("AMPGRAD_CPU_ISA")), read on the first call and cached for the process.
CpuIsa cpu_isa();

/// Whether this CPU can run kernels of `isa` (kBaseline and kNative: always).
bool cpu_supports(CpuIsa isa);

/// Why this CPU cannot run kernels of `isa` ("this CPU lacks avx512bw avx512vl"), or "" if it can.
std::string cpu_unsupported_reason(CpuIsa isa);

/// The level the kernels use: cpu_isa(), lowered to the best level this CPU supports (so a
/// forced level the CPU lacks never runs an instruction it cannot execute). Never kNative.
CpuIsa effective_cpu_isa();

}  // namespace ampgrad
