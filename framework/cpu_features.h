// The running CPU's instruction-set features, detected once, and the one switch that limits which
// of them ampgrad's kernels may use (AMPGRAD_CPU_ISA). Every run-time CPU-feature choice asks here.
#pragma once

#include <string>

/// The instruction sets of the AVX-512 kernels (CpuIsa::kAvx512) and of those that add AVX512_BF16
/// (CpuIsa::kAvx512Bf16), for the functions compiled for them: [[AMPGRAD_AVX512_TARGET]]. Such a
/// function runs only where effective_cpu_isa() reaches its level. AMPGRAD_AVX512_FEATURES is the
/// list alone, for a target that adds options: gnu::target(AMPGRAD_AVX512_FEATURES ",prefer-vector-width=512").
#define AMPGRAD_AVX512_FEATURES "avx512f,avx512bw,avx512vl,avx512dq,fma"
#define AMPGRAD_AVX512_TARGET gnu::target(AMPGRAD_AVX512_FEATURES)
#define AMPGRAD_AVX512_BF16_TARGET gnu::target(AMPGRAD_AVX512_FEATURES ",avx512bf16")

namespace ampgrad {

/// What the CPU and the operating system together support (CPUID, and XGETBV for the register
/// state the OS saves). Detected on the first call to cpu_features().
struct CpuFeatures {
  // The default build's baseline.
  bool sse42 = false;  ///< SSE4.2 (the CRC-32C instruction)
  bool avx2 = false;   ///< AVX2
  bool fma = false;    ///< FMA3
  bool f16c = false;   ///< F16C (float16 <-> float32 conversions)
  // Chosen at run time.
  bool avx512f = false;      ///< AVX-512 Foundation
  bool avx512bw = false;     ///< AVX-512 byte and word instructions
  bool avx512vl = false;     ///< AVX-512 at 128 and 256 bits
  bool avx512dq = false;     ///< AVX-512 doubleword and quadword instructions
  bool avx512_bf16 = false;  ///< AVX512_BF16 (VDPBF16PS: BF16 pairs multiplied and summed in float)
  bool avx512_fp16 = false;  ///< AVX512_FP16 (float16 arithmetic)
  // Linux also asks for a permission to use AMX.
  bool amx_tile = false;  ///< AMX tiles
  bool amx_bf16 = false;  ///< AMX BF16 tile products
  bool amx_fp16 = false;  ///< AMX FP16 tile products
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

/// Whether kernels of `level` may run: effective_cpu_isa(), capped further by `cap` (a kernel's
/// own level argument, which tests lower to run a baseline; kNative: no further cap), reaches
/// `level`. Unlike the GEMM's choice of kernel, the cap never lifts AMPGRAD_CPU_ISA's. level is a
/// real level, never kNative (for which it says false).
bool cpu_isa_allows(CpuIsa level, CpuIsa cap = CpuIsa::kNative);

}  // namespace ampgrad
