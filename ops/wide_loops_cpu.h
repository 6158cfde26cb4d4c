// A loop compiled twice, for the build's baseline (AVX2: 8 floats to a vector) and again for
// AVX-512 (16), picked per call: the unary formulas' loops and the fused attention's loops between
// its tile products. Both builds run the same operations per element in the same order, with the
// same FMA contractions (the baseline has FMA too) and no reassociation, so they give the same bits;
// each user's tests hold the AVX-512 build to the baseline's.
#pragma once

#include "framework/cpu_features.h"

namespace ampgrad::kernels::cpu {

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)  // FMA: the same contractions as the baseline
#define AMPGRAD_WIDE_LOOPS 1
// Loop::run, always inlined (its run() is [[gnu::always_inline]]) into a function built for AVX-512.
template <typename Loop, typename... Args>
[[gnu::target(AMPGRAD_AVX512_FEATURES ",prefer-vector-width=512")]] void run_avx512(Args... args) {
  Loop::run(args...);
}
#endif

/// Whether a kernel called with level cap `isa` runs its loops' AVX-512 builds (cpu_isa_allows).
inline bool wide_loops(CpuIsa isa) { return cpu_isa_allows(CpuIsa::kAvx512, isa); }

/// Loop::run(args...), in its AVX-512 build where `wide` (wide_loops) and this build has one.
template <typename Loop, typename... Args>
void run_loop(bool wide, Args... args) {
#ifdef AMPGRAD_WIDE_LOOPS
  if (wide) {
    run_avx512<Loop>(args...);
    return;
  }
#endif
  (void)wide;
  Loop::run(args...);
}

}  // namespace ampgrad::kernels::cpu
