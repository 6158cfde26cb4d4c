// bfloat16's reference rounding (bfloat16.h: bf16::from_float_bits) on sixteen floats in an AVX-512
// register: the bulk conversion uses it, and so do kernels that round their results in registers.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace ampgrad::bf16 {

/// The bfloat16 bits of v's sixteen floats: round to nearest even on the integer bits, NaNs quieted
/// (sign and the top of the payload kept), exactly as from_float_bits. AVX512_BF16's VCVTNEPS2BF16
/// would flush subnormal inputs to zero instead.
// The maskz_ forms with every lane set are the plain instructions; the plain intrinsics start from
// _mm512_undefined_*, which GCC 12 reports as used uninitialised once inlined (GCC bug 105593).
[[gnu::target("avx512f,avx512bw"), gnu::always_inline]] inline __m256i round_avx512(__m512 v) {
  constexpr __mmask16 kAll = 0xffff;
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quieted = _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_maskz_cvtepi32_epi16(kAll, _mm512_maskz_srli_epi32(kAll, quieted, 16));
}

}  // namespace ampgrad::bf16

#endif  // __x86_64__
