// The GEMM's register tiles (see linear_gemm_micro_cpu.h):
//   AVX2/FMA  6 x 16: 12 ymm accumulators + 2 b vectors + 1 broadcast (15 of 16 registers);
//   AVX-512   8 x 32: 16 zmm accumulators + 2 b vectors + 1 broadcast (of 32). 16 independent
//     sums cover the FMA latency of two 512-bit pipes, and 10 loads per 16 FMAs leave the load
//     ports room. On a Zen 4 core (512-bit FMAs issued as two 256-bit halves) it was 3-6% faster
//     than the AVX2 tile over the mlp's shapes; 12x32 was 2-3% faster and 16x16 about as fast.
//   AVX512_BF16 8 x 32 over bfloat16 pairs: the AVX-512 tile with VDPBF16PS for the FMA, two k per
//     instruction. On a Zen 4 core it retires one per cycle like a 512-bit FMA, so twice the FLOP.
//     Products too small to pack run the same instruction on unpacked pairs (direct_avx512_bf16).
// The AVX-512 kernels are compiled for their own targets with function attributes, so the library
// still runs on any AVX2 CPU; each is only called when the running CPU has its features.
#include "ops/linear/linear_gemm_micro_cpu.h"

#include <cmath>
#include <cstring>

#include "framework/cpu_features.h"
#include "ops/linear/linear_gemm_cpu.h"
#include "ops/linear/linear_gemm_pack_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define AMPGRAD_GEMM_AVX512 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define AMPGRAD_GEMM_AVX2 1
#endif

namespace ampgrad::kernels::cpu {

namespace {

// The portable tile (a build without AVX2): the same sums in the same order, one FMA per k.
void micro_kernel_portable(int64_t kc, const void* a_panel, const void* b_panel, const float* init, int64_t init_ld,
                           float* c, int64_t ldc) {
  constexpr int kMR = 6, kNR = 16;
  const float* __restrict a = static_cast<const float*>(a_panel);
  const float* __restrict b = static_cast<const float*>(b_panel);
  float acc[kMR][kNR];
  for (int i = 0; i < kMR; ++i) {
    for (int j = 0; j < kNR; ++j) acc[i][j] = init ? init[i * init_ld + j] : 0.0f;
  }
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < kMR; ++i) {
      for (int j = 0; j < kNR; ++j) acc[i][j] = std::fma(a[p * kMR + i], b[p * kNR + j], acc[i][j]);
    }
  }
  for (int i = 0; i < kMR; ++i) std::memcpy(c + i * ldc, acc[i], sizeof(acc[i]));
}

#ifdef AMPGRAD_GEMM_AVX2
// Not inlined: inside the driver GCC runs short of registers and reloads b for every FMA, which
// saturates the load ports (-10% measured).
[[gnu::noinline]] void micro_kernel_avx2(int64_t kc, const void* a_panel, const void* b_panel, const float* init,
                                         int64_t init_ld, float* c, int64_t ldc) {
  constexpr int kMR = 6, kNR = 16;
  const float* __restrict a = static_cast<const float*>(a_panel);
  const float* __restrict b = static_cast<const float*>(b_panel);
  __m256 acc[kMR][2];
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i) {
    acc[i][0] = init ? _mm256_loadu_ps(init + i * init_ld) : _mm256_setzero_ps();
    acc[i][1] = init ? _mm256_loadu_ps(init + i * init_ld + 8) : _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b + p * kNR);
    const __m256 b1 = _mm256_load_ps(b + p * kNR + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + p * kMR + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}
#endif

#ifdef AMPGRAD_GEMM_AVX512

// The accumulators of a kMR x (16 kNV) tile start from init (or zero) and end in c; both kernels
// below share these and differ only in their k step.
template <int kMR, int kNV>
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void load_tile(__m512 (&acc)[kMR][kNV], const float* init,
                                                                    int64_t init_ld) {
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[i][v] = init ? _mm512_loadu_ps(init + i * init_ld + 16 * v) : _mm512_setzero_ps();
  }
}

template <int kMR, int kNV>
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void store_tile(const __m512 (&acc)[kMR][kNV], float* c,
                                                                     int64_t ldc) {
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) _mm512_storeu_ps(c + i * ldc + 16 * v, acc[i][v]);
  }
}

// A kMR x (16 kNV) tile of float words: kMR * kNV zmm accumulators, kNV b vectors per k.
template <int kMR, int kNV>
[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void micro_kernel_avx512(int64_t kc, const void* a_panel, const void* b_panel,
                                                                   const float* init, int64_t init_ld, float* c,
                                                                   int64_t ldc) {
  constexpr int kNR = 16 * kNV;
  const float* __restrict a = static_cast<const float*>(a_panel);
  const float* __restrict b = static_cast<const float*>(b_panel);
  __m512 acc[kMR][kNV];
  load_tile(acc, init, init_ld);
#pragma GCC unroll 2
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = _mm512_load_ps(b + p * kNR + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[p * kMR + i]);
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  store_tile(acc, c, ldc);
}

// The same tile over words of two bfloat16 k-neighbours: one VDPBF16PS per two FMAs.
template <int kMR, int kNV>
[[AMPGRAD_AVX512_BF16_TARGET, gnu::noinline]] void micro_kernel_avx512_bf16(int64_t kw, const void* a_panel,
                                                                             const void* b_panel, const float* init,
                                                                             int64_t init_ld, float* c, int64_t ldc) {
  constexpr int kNR = 16 * kNV;
  const uint32_t* __restrict a = static_cast<const uint32_t*>(a_panel);
  const uint32_t* __restrict b = static_cast<const uint32_t*>(b_panel);
  __m512 acc[kMR][kNV];
  load_tile(acc, init, init_ld);
#pragma GCC unroll 2
  for (int64_t p = 0; p < kw; ++p) {
    __m512bh bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + p * kNR + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMR; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[p * kMR + i]));
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
    }
  }
  store_tile(acc, c, ldc);
}

// acc + the products of one pair word of a and one of b, by VDPBF16PS in lane 0.
[[AMPGRAD_AVX512_BF16_TARGET, gnu::always_inline]] inline __m128 dot_pair(__m128 acc, uint32_t a_word,
                                                                          uint32_t b_word) {
  return _mm_dpbf16_ps(acc, (__m128bh)_mm_cvtsi32_si128(static_cast<int>(a_word)),
                       (__m128bh)_mm_cvtsi32_si128(static_cast<int>(b_word)));
}

// The pair kernel's sums for a product too small to pack: each element's words are the ones the
// packing forms (k high, k + 1 low, an odd k's last word padded) and go through VDPBF16PS in the
// same order, one lane at a time. The instruction itself, not a model of it: its flush of tiny
// results uses x86's tininess after rounding (to 24 bits with an unbounded exponent), which a
// float FMA followed by a test for subnormals gets wrong just below 2^-126.
[[AMPGRAD_AVX512_BF16_TARGET]] void direct_avx512_bf16(int64_t m, int64_t n, int64_t k, const MatrixView& a,
                                                       const MatrixView& b, const float* init, float* c) {
  const auto* a_bits = static_cast<const uint16_t*>(a.data);
  const auto* b_bits = static_cast<const uint16_t*>(b.data);
  const int64_t whole = k / 2 * 2;  // k values in whole pairs
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* ai = a_bits + i * a.row_stride;
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t* bj = b_bits + j * b.col_stride;
      __m128 acc = _mm_set_ss(init != nullptr ? init[j] : 0.0f);
      for (int64_t p = 0; p < whole; p += 2) {
        acc = dot_pair(acc, pair_word(ai[p * a.col_stride], ai[(p + 1) * a.col_stride]),
                       pair_word(bj[p * b.row_stride], bj[(p + 1) * b.row_stride]));
      }
      if (whole < k) {
        acc = dot_pair(acc, pair_word(ai[whole * a.col_stride], kPadA), pair_word(bj[whole * b.row_stride], kPadB));
      }
      c[i * n + j] = _mm_cvtss_f32(acc);
    }
  }
}
#endif

// k blocks of up to 1024: a whole k of the mlp's products in one block, so c is written once and
// never read back. The b panel (64 or 128 KB) then streams from L2 instead of sitting in L1, which
// costs less than the partial sums' round trips did: on a Zen 4 core, 1-thread CPU time over the
// mlp's GEMM shapes, kc 256 -> 1024 took the AVX2 kernel from 85-94 to 92-100 GFLOP/s.
// m blocks: 96 x 1024 of packed a (384 KB) stays in L2 (512 KB on Zen 3, 1-2 MB on newer cores).
constexpr MicroKernel kPortable{"portable 6x16", Packing::kFloat, 6, 16, 256, 144, micro_kernel_portable, nullptr};
#ifdef AMPGRAD_GEMM_AVX2
constexpr MicroKernel kAvx2{"avx2 6x16", Packing::kFloat, 6, 16, 1024, 96, micro_kernel_avx2, nullptr};
#else
constexpr MicroKernel kAvx2 = kPortable;
#endif
#ifdef AMPGRAD_GEMM_AVX512
constexpr MicroKernel kAvx512{"avx512 8x32", Packing::kFloat, 8, 32, 1024, 96, micro_kernel_avx512<8, 2>, nullptr};
// k blocks of 2048 bfloat16: the same bytes per panel as the float kernel's 1024.
constexpr MicroKernel kAvx512Bf16{"avx512_bf16 8x32 bf16 pairs", Packing::kBFloat16Pairs, 8, 32, 2048, 96,
                                  micro_kernel_avx512_bf16<8, 2>, direct_avx512_bf16};
// Every k block but the last must be whole words (the driver starts block p0 at row p0 / 2).
static_assert(kAvx512Bf16.kc % k_per_word(kAvx512Bf16.packing) == 0, "a pair kernel's k block must be even");

// Whether `isa` (a cap; kNative: none) lets a kernel of `level` run here.
bool allows(CpuIsa isa, CpuIsa level) {
  return (isa == CpuIsa::kNative || static_cast<int>(isa) >= static_cast<int>(level)) && cpu_supports(level);
}
#endif

}  // namespace

const MicroKernel& micro_kernel(CpuIsa isa, DType operands) {
#ifdef AMPGRAD_GEMM_AVX512
  if (operands == DType::kBFloat16 && allows(isa, CpuIsa::kAvx512Bf16)) return kAvx512Bf16;
  if (allows(isa, CpuIsa::kAvx512)) return kAvx512;
#endif
  // The AVX2 kernel is the build's baseline (compiled in only with -mavx2 -mfma).
  (void)isa, (void)operands;
  return kAvx2;
}

const MicroKernel& default_micro_kernel(DType operands) {
  static const MicroKernel& widening = micro_kernel(effective_cpu_isa());
  static const MicroKernel& bf16 = micro_kernel(effective_cpu_isa(), DType::kBFloat16);
  return operands == DType::kBFloat16 ? bf16 : widening;
}

}  // namespace ampgrad::kernels::cpu
