// Packing for the packed GEMM (see linear_gemm_pack_cpu.h). Float panels: every operand widened
// exactly to float (an 8-bit float by its code's entry in a table). BF16 pair panels: bfloat16
// bits moved, never converted, two k to a word (an 8-bit float's exact bfloat16 bits from a
// table, a panel at a time). Both use the baseline's 8-wide vectors at every level (packing is
// memory-bound); edges and other strides take the plain loops.
#include "ops/linear/linear_gemm_pack_cpu.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define AMPGRAD_SGEMM_AVX2 1
#endif

namespace ampgrad::kernels::cpu {

namespace {

// One element, or eight, of an operand as float: widening is exact for every storage type.
inline float load1(const float* p) { return *p; }
inline float load1(const Half* p) { return half_to_float(*p); }
inline float load1(const BFloat16* p) { return bfloat16_to_float(*p); }
template <typename T>
inline float load1_float8(const T* p) {
  static const float* const table = float8_value_table(T{});
  return table[p->bits];
}
inline float load1(const Float8E4M3* p) { return load1_float8(p); }
inline float load1(const Float8E5M2* p) { return load1_float8(p); }

#ifdef AMPGRAD_SGEMM_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// bfloat16 is the top half of a float: zero-extend to 32 bits and shift into place.
inline __m256 load8(const BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
// An 8-bit float widened without a table (gathers are slow): its 7-bit magnitude placed where a
// float's exponent and mantissa start is that float's value times 2^(bias - 127), subnormals
// included (a float subnormal times a power of two is exact), so one multiply rebiases it; the
// codes of inf and NaN get the bits float8_to_float gives them; then the sign.
template <typename T>
inline __m256 load8_float8(const T* p) {
  using F = fp8::Format<T>;
  constexpr int m = F::kMantissaBits;
  const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i magnitude = _mm256_and_si256(codes, _mm256_set1_epi32(0x7f));
  const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(magnitude, 23 - m)),
                                     _mm256_set1_ps(std::ldexp(1.0f, 127 - F::kBias)));
  const __m256i mantissa = _mm256_and_si256(magnitude, _mm256_set1_epi32((1 << m) - 1));
  const __m256i quiet = _mm256_andnot_si256(_mm256_cmpeq_epi32(mantissa, _mm256_setzero_si256()),
                                            _mm256_set1_epi32(0x00400000));
  const __m256i special = _mm256_or_si256(_mm256_or_si256(_mm256_set1_epi32(0x7f800000), quiet),
                                          _mm256_slli_epi32(mantissa, 23 - m));
  // The first special magnitude: e4m3's NaN (0x7f), e5m2's inf (0x7c).
  const __m256i is_special =
      _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(F::kHasInf ? 0x7b : 0x7e));
  const __m256i bits = _mm256_blendv_epi8(_mm256_castps_si256(value), special, is_special);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(0x80)), 24);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}
inline __m256 load8(const Float8E4M3* p) { return load8_float8(p); }
inline __m256 load8(const Float8E5M2* p) { return load8_float8(p); }

// Transposes the 8 x 8 block held in r[0..7] (rows) into columns, in place.
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 s[8];
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}
#endif

// The plain packing loop both panel kinds share (edges, tails, other strides):
// dst[p * width + j] = src[p * p_stride + j * j_stride] for p < kc and j < valid; zero up to width.
template <typename T>
void pack_scalar(const T* src, int64_t p_stride, int64_t j_stride, int64_t width, int64_t valid, int64_t kc,
                 float* dst) {
  for (int64_t p = 0; p < kc; ++p) {
    for (int64_t j = 0; j < width; ++j) dst[p * width + j] = j < valid ? load1(src + p * p_stride + j * j_stride) : 0.0f;
  }
}

#ifdef AMPGRAD_SGEMM_AVX2
// dst[0, width) = src[0, width), contiguous, for width 6 or a multiple of 4 from 8: full vectors,
// the last one overlapping the one before; width 6 reads 8 (src_room >= 8) and writes 2 past.
template <typename T>
inline void copy_row(const T* src, int64_t width, float* dst) {
  if (width < 8) return _mm256_storeu_ps(dst, load8(src));
  for (int64_t j = 0; j + 8 <= width; j += 8) _mm256_storeu_ps(dst + j, load8(src + j));
  if (width % 8 != 0) _mm256_storeu_ps(dst + width - 8, load8(src + width - 8));
}

// The first `count` values of v (8, 4, or 6 writing 2 more that the caller overwrites next).
inline void store_first(float* dst, __m256 v, int64_t count) {
  if (count == 4) return _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
  _mm256_storeu_ps(dst, v);
}
#endif

// dst[p * nr + j] = b(p0 + p, j0 + j) for p < kc, j < nr; columns j0 + j >= n_end are zero.
template <typename T>
void pack_b_panel(const T* b, int64_t rs, int64_t cs, int64_t p0, int64_t kc, int64_t j0, int64_t n_end,
                  int64_t nr, float* dst) {
  const int64_t valid = std::min(nr, n_end - j0);
#ifdef AMPGRAD_SGEMM_AVX2
  if (valid == nr && cs == 1) {  // rows of b are contiguous: copy nr at a time
    for (int64_t p = 0; p < kc; ++p) {
      const T* src = b + (p0 + p) * rs + j0;
      for (int64_t j = 0; j < nr; j += 8) _mm256_store_ps(dst + p * nr + j, load8(src + j));
    }
    return;
  }
  if (valid == nr && rs == 1) {  // columns of b are contiguous (b is a transpose): 8 x 8 transposes
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
      for (int64_t j = 0; j < nr; j += 8) {
        __m256 r[8];
        for (int q = 0; q < 8; ++q) r[q] = load8(b + (j0 + j + q) * cs + p0 + p);
        transpose8(r);
        for (int q = 0; q < 8; ++q) _mm256_store_ps(dst + (p + q) * nr + j, r[q]);
      }
    }
    pack_scalar(b + j0 * cs + p0 + p, 1, cs, nr, nr, kc - p, dst + p * nr);
    return;
  }
#endif
  pack_scalar(b + p0 * rs + j0 * cs, rs, cs, nr, valid, kc, dst);
}

// dst[p * mr + i] = a(i0 + i, p0 + p) for p < kc, i < mr; rows i0 + i >= m_end are zero. a has
// m_rows rows in all. The vector paths may write kPackSlack floats past the panel.
template <typename T>
void pack_a_panel(const T* a, int64_t rs, int64_t cs, int64_t i0, int64_t m_end, int64_t m_rows, int64_t p0,
                  int64_t kc, int64_t mr, float* dst) {
  const int64_t valid = std::min(mr, m_end - i0);
#ifdef AMPGRAD_SGEMM_AVX2
  if (valid == mr && rs == 1 && i0 + std::max<int64_t>(mr, 8) <= m_rows) {  // columns of a are contiguous (a transpose)
    for (int64_t p = 0; p < kc; ++p) copy_row(a + (p0 + p) * cs + i0, mr, dst + p * mr);
    return;
  }
  if (valid == mr && cs == 1 && mr <= 16) {  // rows of a are contiguous: 8 k at a time, 8 rows at a time transposed
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
      __m256 r[2][8];
      for (int64_t g = 0; g < mr; g += 8) {
        for (int i = 0; i < 8; ++i) {
          r[g / 8][i] = g + i < mr ? load8(a + (i0 + g + i) * rs + p0 + p) : _mm256_setzero_ps();
        }
        transpose8(r[g / 8]);
      }
      // Column by column, so what a 6-wide store writes past a column is overwritten by the next one.
      for (int q = 0; q < 8; ++q) {
        for (int64_t g = 0; g < mr; g += 8) store_first(dst + (p + q) * mr + g, r[g / 8][q], std::min<int64_t>(8, mr - g));
      }
    }
    pack_scalar(a + i0 * rs + p0 + p, 1, rs, mr, mr, kc - p, dst + p * mr);
    return;
  }
#endif
  pack_scalar(a + i0 * rs + p0 * cs, cs, rs, mr, valid, kc, dst);
}

// ---- bfloat16 pairs (Packing::kBFloat16Pairs) --------------------------------------------------

// An operand element's bfloat16 bits: its own, or an 8-bit float's value (exact in bfloat16: E4M3
// and E5M2 have at most 3 mantissa bits and exponents within bfloat16's normal range) from a table.
struct Bf16Bits {
  uint16_t operator()(BFloat16 v) const { return v.bits; }
};
template <typename T>
struct Float8Bf16Bits {
  const uint16_t* table = float8_bf16_table(kDTypeOf<T>);
  uint16_t operator()(T v) const { return table[v.bits]; }
};

// dst[q * width + j] = pair_word(x(2q, j), x(2q + 1, j)) for 2q < kc and j < width, where
// x(p, j) = bits(src[p * p_stride + j * j_stride]). Columns from `valid` are zero; an odd kc's last
// word takes `pad` as its second.
template <typename T, typename Bits>
void pack_pairs_scalar(const T* src, int64_t p_stride, int64_t j_stride, int64_t width, int64_t valid, int64_t kc,
                       uint16_t pad, uint32_t* dst, Bits bits) {
  for (int64_t q = 0; 2 * q < kc; ++q) {
    const T* first = src + 2 * q * p_stride;
    const bool whole = 2 * q + 1 < kc;
    for (int64_t j = 0; j < width; ++j) {
      const uint16_t second = !whole ? pad : j < valid ? bits(first[p_stride + j * j_stride]) : 0;
      dst[q * width + j] = pair_word(j < valid ? bits(first[j * j_stride]) : 0, second);
    }
  }
}

// What pack_pairs_scalar writes, a vector at a time where the panel is whole (valid == width, a
// multiple of 8) and one of the strides is 1.
void pack_pairs(const BFloat16* src, int64_t p_stride, int64_t j_stride, int64_t width, int64_t valid, int64_t kc,
                uint16_t pad, uint32_t* dst) {
  int64_t q = 0;
#ifdef AMPGRAD_SGEMM_AVX2
  if (valid == width && width % 8 == 0 && p_stride == 1) {
    // k is contiguous: a word is already a pair in memory, its halves swapped (x(k) is the low
    // one); 8 columns x 8 words at a time go through an 8 x 8 transpose (of bits, not floats).
    for (; 2 * q + 16 <= kc; q += 8) {
      for (int64_t j = 0; j < width; j += 8) {
        __m256 r[8];
        for (int t = 0; t < 8; ++t) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (j + t) * j_stride + 2 * q));
          r[t] = _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(v, 16), _mm256_srli_epi32(v, 16)));
        }
        transpose8(r);
        for (int t = 0; t < 8; ++t) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (q + t) * width + j), r[t]);
      }
    }
  } else if (valid == width && width % 8 == 0 && j_stride == 1) {
    // The columns are contiguous: interleave rows 2q + 1 (low halves) and 2q (high halves).
    for (; 2 * q + 2 <= kc; ++q) {
      const BFloat16* first = src + 2 * q * p_stride;
      for (int64_t j = 0; j < width; j += 8) {
        const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + j));
        const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + p_stride + j));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + q * width + j), _mm_unpacklo_epi16(x1, x0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + q * width + j + 4), _mm_unpackhi_epi16(x1, x0));
      }
    }
  }
#endif
  pack_pairs_scalar(src + 2 * q * p_stride, p_stride, j_stride, width, valid, kc - 2 * q, pad, dst + q * width,
                    Bf16Bits{});
}

#ifdef AMPGRAD_SGEMM_AVX2
// out[0, n) = the bfloat16 bits of codes[0, n), 8 at a time: each code's float from the table,
// whose top half is its bfloat16 (exact), then the halves packed.
template <typename T>
void decode_bf16(const T* codes, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = _mm256_srli_epi32(_mm256_castps_si256(load8(codes + i)), 16);
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(load8(codes + i + 8)), 16);
    // packus works within 128-bit lanes: put the 16 results back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  const Float8Bf16Bits<T> bits;
  for (; i < n; ++i) out[i] = bits(codes[i]);
}
#endif

// 8-bit float operands as bfloat16 pairs. A whole panel with one contiguous stride is decoded
// first, vector by vector, into bfloat16 laid out as the source (along that stride), and packed
// by the bfloat16 vector paths; the rest looks each element up.
template <typename T>
void pack_pairs(const T* src, int64_t p_stride, int64_t j_stride, int64_t width, int64_t valid, int64_t kc,
                uint16_t pad, uint32_t* dst) {
#ifdef AMPGRAD_SGEMM_AVX2
  if (valid == width && width % 8 == 0 && (p_stride == 1 || j_stride == 1) && kc >= 16) {
    thread_local std::vector<BFloat16> scratch;
    scratch.resize(static_cast<size_t>(kc * width));
    auto* bits = reinterpret_cast<uint16_t*>(scratch.data());
    if (p_stride == 1) {  // k contiguous: a run of kc per column
      for (int64_t j = 0; j < width; ++j) decode_bf16(src + j * j_stride, kc, bits + j * kc);
      return pack_pairs(scratch.data(), 1, kc, width, valid, kc, pad, dst);
    }
    for (int64_t p = 0; p < kc; ++p) decode_bf16(src + p * p_stride, width, bits + p * width);  // a run of width per k
    return pack_pairs(scratch.data(), width, 1, width, valid, kc, pad, dst);
  }
#endif
  pack_pairs_scalar(src, p_stride, j_stride, width, valid, kc, pad, dst, Float8Bf16Bits<T>{});
}

// Calls fn(T{}) with the storage type of an operand the pair kernel takes: bfloat16 or an 8-bit float.
template <typename Fn>
void visit_pair_operand(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat8E4M3: return fn(Float8E4M3{});
    case DType::kFloat8E5M2: return fn(Float8E5M2{});
    default: return fn(BFloat16{});
  }
}

}  // namespace

const uint16_t* float8_bf16_table(DType dtype) {
  const auto make = [](const float* values) {
    std::array<uint16_t, 256> t{};
    for (size_t c = 0; c < 256; ++c) t[c] = static_cast<uint16_t>(std::bit_cast<uint32_t>(values[c]) >> 16);
    return t;
  };
  static const std::array<uint16_t, 256> e4m3 = make(float8_value_table(Float8E4M3{}));
  static const std::array<uint16_t, 256> e5m2 = make(float8_value_table(Float8E5M2{}));
  return dtype == DType::kFloat8E4M3 ? e4m3.data() : e5m2.data();
}

void pack_a_block(const MatrixView& a, int64_t m_rows, int64_t i0, int64_t i1, int64_t p0, int64_t kc, int64_t mr,
                  Packing packing, float* dst) {
  const int64_t panel = packed_rows(kc, packing) * mr, rs = a.row_stride, cs = a.col_stride;
  for (int64_t i = i0; i < i1; i += mr) {
    float* out = dst + (i - i0) / mr * panel;
    if (packing == Packing::kBFloat16Pairs) {
      visit_pair_operand(a.dtype, [&](auto t) {
        pack_pairs(static_cast<const decltype(t)*>(a.data) + i * rs + p0 * cs, cs, rs, mr, std::min(mr, i1 - i), kc,
                   kPadA, reinterpret_cast<uint32_t*>(out));
      });
      continue;
    }
    visit_operand(a.dtype, [&](auto t) {
      pack_a_panel(static_cast<const decltype(t)*>(a.data), rs, cs, i, i1, m_rows, p0, kc, mr, out);
    });
  }
}

// When b's rows are contiguous, groups of 8 rows go across all the panels, so the source is read
// along its rows; panel by panel read one 64-byte piece per row, each on a new page (the step
// spent 8% of its time there, mostly stalled). When b's columns are contiguous, panel by panel is
// the sequential order.
void pack_b_block(const MatrixView& b, int64_t p0, int64_t kc, int64_t j0, int64_t j1, int64_t n_end, int64_t nr,
                  Packing packing, float* dst) {
  const int64_t panel = packed_rows(kc, packing) * nr, rs = b.row_stride, cs = b.col_stride;
  const int64_t group = cs == 1 ? 8 : kc;  // k per pass over the panels (even, so pairs stay whole)
  for (int64_t p = 0; p < kc; p += group) {
    const int64_t rows = std::min(group, kc - p);
    for (int64_t j = j0; j < j1; j += nr) {
      float* out = dst + (j - j0) / nr * panel + packed_rows(p, packing) * nr;
      if (packing == Packing::kBFloat16Pairs) {
        visit_pair_operand(b.dtype, [&](auto t) {
          pack_pairs(static_cast<const decltype(t)*>(b.data) + (p0 + p) * rs + j * cs, rs, cs, nr,
                     std::min(nr, n_end - j), rows, kPadB, reinterpret_cast<uint32_t*>(out));
        });
        continue;
      }
      visit_operand(b.dtype, [&](auto t) {
        pack_b_panel(static_cast<const decltype(t)*>(b.data), rs, cs, p0 + p, rows, j, n_end, nr, out);
      });
    }
  }
}

}  // namespace ampgrad::kernels::cpu
