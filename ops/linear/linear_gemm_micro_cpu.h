// The packed GEMM's micro-kernels (linear_gemm_cpu.cc): one register tile per instruction-set level,
// each with the cache blocks that suit it, and the pick by AMPGRAD_CPU_ISA, the running CPU and the
// operands' dtype. Every kernel sums each element as init, then one FMA per k in order, so all give
// the same bits (the BF16 pair kernel too, unless a subnormal turns up: see Packing).
#pragma once

#include <cstdint>

#include "framework/cpu_features.h"
#include "framework/dtype.h"

namespace ampgrad::kernels::cpu {

struct MatrixView;  // linear_gemm_cpu.h

/// What a packed panel's 32-bit words hold.
/// kFloat: one float (any operand, widened while packed); a panel of kc k values has kc rows.
/// kBFloat16Pairs: two bfloat16 k-neighbours, k in the high half and k + 1 in the low half (only
///   bfloat16 x bfloat16 products); ceil(kc / 2) rows, an odd kc padded with +0 in a and -0 in b
///   (the product -0 leaves every sum, -0 included, unchanged). VDPBF16PS adds the high product
///   first and rounds after each of the two (Intel's pseudo-code, and measured on a Zen 4), so the
///   sums are the FMA chain's in k order; but it reads subnormal inputs (the accumulator too) as
///   zeros of their sign, and gives a zero of the exact result's sign for a step whose result is
///   tiny after rounding (fixed DAZ/FTZ, whatever MXCSR says).
enum class Packing { kFloat, kBFloat16Pairs };

/// k values per packed word.
constexpr int64_t k_per_word(Packing packing) { return packing == Packing::kBFloat16Pairs ? 2 : 1; }

/// c[mr x nr] = init + a_panel . b_panel over kw packed rows of words (see Packing). a_panel is
/// [kw][mr] words, b_panel [kw][nr] (64-byte aligned). init is null (zero) or mr rows of nr at
/// init + i * init_ld (init_ld 0 repeats one row: the bias); init may alias c. c rows are ldc
/// floats apart.
using MicroKernelFn = void (*)(int64_t kw, const void* a_panel, const void* b_panel, const float* init,
                               int64_t init_ld, float* c, int64_t ldc);

/// c[m x n] (row-major floats) = init + a b for a [m, k] and b [k, n] as stored, unpacked, in the
/// kernel's own arithmetic: the GEMM's path for products too small to pack, which must give the
/// packed path's bits so that a result does not depend on the shape around it (m = 1 or a batch).
/// init is null (zero) or n floats (the bias, repeated on every row).
using DirectFn = void (*)(int64_t m, int64_t n, int64_t k, const MatrixView& a, const MatrixView& b, const float* init,
                          float* c);

struct MicroKernel {
  const char* name;
  Packing packing;
  int64_t mr, nr;  // the register tile: rows of a broadcast, columns of b in vectors
  int64_t kc;      // the k block (k values, a multiple of k_per_word): an nr x kc b panel stays near
                   // the core while the a panels stream past it
  int64_t mc;      // the m block: mc x kc of packed a stays in L2 while all of the b panels pass
  MicroKernelFn run;
  DirectFn direct;  // null: the plain FMA loop over widened operands, which is what a kFloat kernel sums
};

/// The largest tile any kernel has (for edge tiles kept on the stack).
inline constexpr int64_t kMaxTile = 8 * 32;

/// The kernel for products of two `operands` matrices at instruction-set level `isa` (kNative:
/// the best this CPU runs); a level the CPU lacks gives the best one below it. bfloat16 operands
/// get the BF16 pair kernel from kAvx512Bf16 up, else (like float16) a float kernel.
const MicroKernel& micro_kernel(CpuIsa isa, DType operands = DType::kFloat32);

/// micro_kernel(effective_cpu_isa(), operands): the kernel the GEMM uses, chosen once.
const MicroKernel& default_micro_kernel(DType operands = DType::kFloat32);

}  // namespace ampgrad::kernels::cpu
