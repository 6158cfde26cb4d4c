// The packed GEMM's micro-kernels (linear_gemm_cpu.cc): one register tile per instruction-set level,
// each with the cache blocks that suit it, and the pick by AMPGRAD_CPU_ISA and the running CPU.
// Every kernel sums each element as init, then one FMA per k in order, so all give the same bits.
#pragma once

#include <cstdint>

#include "framework/cpu_features.h"

namespace ampgrad::kernels::cpu {

/// c[mr x nr] = init + a_panel . b_panel, summed over kc. a_panel is packed [kc][mr], b_panel
/// [kc][nr] (64-byte aligned). init is null (zero) or mr rows of nr at init + i * init_ld (init_ld
/// 0 repeats one row: the bias); init may alias c. c rows are ldc floats apart.
using MicroKernelFn = void (*)(int64_t kc, const float* a_panel, const float* b_panel, const float* init,
                               int64_t init_ld, float* c, int64_t ldc);

struct MicroKernel {
  const char* name;
  int64_t mr, nr;  // the register tile: rows of a broadcast, columns of b in vectors
  int64_t kc;      // the k block: an nr x kc b panel stays in L1 while the a panels stream past it
  int64_t mc;      // the m block: mc x kc of packed a stays in L2 while all of the b panels pass
  MicroKernelFn run;
};

/// The largest tile any kernel has (for edge tiles kept on the stack).
inline constexpr int64_t kMaxTile = 8 * 32;

/// The kernel for instruction-set level `isa` (kNative: the best this CPU runs); a level the CPU
/// lacks gives the best one below it.
const MicroKernel& micro_kernel(CpuIsa isa);

/// micro_kernel(effective_cpu_isa()): the kernel the GEMM uses, chosen once.
const MicroKernel& default_micro_kernel();

}  // namespace ampgrad::kernels::cpu
