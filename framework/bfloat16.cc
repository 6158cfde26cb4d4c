// bfloat16 bulk conversions: the reference rounding of bfloat16.h done 8 (AVX2) or 16 (AVX-512)
// values at a time on the integer bits, so every path gives the reference's bits. AVX512_BF16's
// VCVTNEPS2BF16 is not used: it flushes subnormal inputs to zero (tests/bfloat16_test.cc shows it).
#include "framework/bfloat16.h"

#include "framework/cpu_features.h"
#include "framework/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns, wrongly, that the AVX-512 intrinsics' _mm512_undefined_* values may be used
// uninitialized when they are inlined into a target("avx512f") function (GCC bug 105593); the
// warning is attributed to the header, so it is silenced around the include.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define AMPGRAD_BF16_AVX512 1
#include "framework/bfloat16_avx512.h"
#endif

namespace ampgrad {

namespace {

using detail::Bf16Path;

void to_float_scalar(const BFloat16* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i]);
}

void from_float_scalar(const float* src, BFloat16* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16(src[i]);
}

#if defined(__AVX2__)
void to_float_avx2(const BFloat16* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  to_float_scalar(src + i, dst + i, n - i);
}

void from_float_avx2(const float* src, BFloat16* dst, size_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(bias, odd));
    // |u| as a signed compare: both sides are below 2^31.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i bits = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan), 16);
    // Eight 32-bit values below 2^16 to eight 16-bit ones: packus works per 128-bit lane, so
    // gather lanes 0 and 2 of the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  from_float_scalar(src + i, dst + i, n - i);
}
#endif

#if defined(AMPGRAD_BF16_AVX512)
[[gnu::target("avx512f,avx512bw")]] void to_float_avx512(const BFloat16* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
  to_float_scalar(src + i, dst + i, n - i);
}

[[gnu::target("avx512f,avx512bw")]] void from_float_avx512(const float* src, BFloat16* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16::round_avx512(_mm512_loadu_ps(src + i)));
  }
  from_float_scalar(src + i, dst + i, n - i);
}
#endif

void to_float(Bf16Path path, const BFloat16* src, float* dst, size_t n) {
  switch (path) {
#if defined(AMPGRAD_BF16_AVX512)
    case Bf16Path::kAvx512: return to_float_avx512(src, dst, n);
#endif
#if defined(__AVX2__)
    case Bf16Path::kAvx2: return to_float_avx2(src, dst, n);
#endif
    default: return to_float_scalar(src, dst, n);
  }
}

void from_float(Bf16Path path, const float* src, BFloat16* dst, size_t n) {
  switch (path) {
#if defined(AMPGRAD_BF16_AVX512)
    case Bf16Path::kAvx512: return from_float_avx512(src, dst, n);
#endif
#if defined(__AVX2__)
    case Bf16Path::kAvx2: return from_float_avx2(src, dst, n);
#endif
    default: return from_float_scalar(src, dst, n);
  }
}

}  // namespace

namespace detail {

bool bf16_path_available(Bf16Path path) {
  switch (path) {
    case Bf16Path::kScalar: return true;
#if defined(__AVX2__)
    case Bf16Path::kAvx2: return true;
#else
    case Bf16Path::kAvx2: return false;
#endif
#if defined(AMPGRAD_BF16_AVX512)
    case Bf16Path::kAvx512: return cpu_supports(CpuIsa::kAvx512);
#else
    case Bf16Path::kAvx512: return false;
#endif
  }
  return false;
}

Bf16Path bf16_selected_path() {
  static const Bf16Path path = effective_cpu_isa() >= CpuIsa::kAvx512 && bf16_path_available(Bf16Path::kAvx512)
                                   ? Bf16Path::kAvx512
                               : bf16_path_available(Bf16Path::kAvx2) ? Bf16Path::kAvx2
                                                                      : Bf16Path::kScalar;
  return path;
}

void bfloat16_to_float_with(Bf16Path path, const BFloat16* src, float* dst, size_t n) {
  AG_CHECK(bf16_path_available(path), "bfloat16_to_float_with: path ", static_cast<int>(path),
           " is not available on this CPU or build; hint: ask bf16_path_available() first");
  to_float(path, src, dst, n);
}

void float_to_bfloat16_with(Bf16Path path, const float* src, BFloat16* dst, size_t n) {
  AG_CHECK(bf16_path_available(path), "float_to_bfloat16_with: path ", static_cast<int>(path),
           " is not available on this CPU or build; hint: ask bf16_path_available() first");
  from_float(path, src, dst, n);
}

}  // namespace detail

void bfloat16_to_float(const BFloat16* src, float* dst, size_t n) {
  to_float(detail::bf16_selected_path(), src, dst, n);
}

void float_to_bfloat16(const float* src, BFloat16* dst, size_t n) {
  from_float(detail::bf16_selected_path(), src, dst, n);
}

}  // namespace ampgrad
