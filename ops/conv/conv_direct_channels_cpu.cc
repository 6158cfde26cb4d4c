// The direct convolution's channel tiles (float32 at AVX-512; bfloat16 at AVX512_BF16, over channel
// pairs as the grid's tiles, and position pairs for dw; conv_direct_common.h). On small planes
// the grid's dropped columns cost the most: 28 of every 224 positions at 14 x 14 (Wp = 16), 15 of
// 64 at 7 x 7. These tiles run along output channels instead, two vectors of 16 (four for the
// weight gradient), with each position's x broadcast, so that a row of Wo positions computes
// nothing it drops where the tile's run of positions divides Wo. The forward's outputs leave
// channels-last through a 16 x 16 transpose; the weight gradient reads dy transposed the same way.
// Each forward output is still 0, one FMA per (c, i, j) in order, then + b (bfloat16: one VDPBF16PS
// per channel pair and tap, then + b, rounded once): the grid's bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/cpu_features.h"
#include "framework/parallel.h"
#include "framework/tensor.h"
#include "ops/conv/conv_direct_common.h"

#ifdef AMPGRAD_DIRECT_CONV
#include "framework/bfloat16_avx512.h"

namespace ampgrad::kernels::cpu::direct {
namespace {

// ---- The forward: kPos positions of one output row x 32 output channels ------------------------
constexpr int kChannelBlock = 32;

// A channel tile's kPos x 2 accumulators: zeroed, and stored into out[q][r] with the bias added.
template <int kPos>
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void zero_accumulators(__m512 (&acc)[kPos][2]) {
#pragma GCC unroll 14
  for (int q = 0; q < kPos; ++q) acc[q][0] = acc[q][1] = _mm512_setzero_ps();
}

template <int kPos>
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void store_accumulators(const __m512 (&acc)[kPos][2],
                                                                          const float* bias, float* out) {
  const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
#pragma GCC unroll 14
  for (int q = 0; q < kPos; ++q) {
    _mm512_store_ps(out + q * kChannelBlock, _mm512_add_ps(acc[q][0], b0));
    _mm512_store_ps(out + q * kChannelBlock + 16, _mm512_add_ps(acc[q][1], b1));
  }
}

// `in` is the sample's padded copy from the tile's first position (oh Wp + ow0) of its first plane,
// `wp` the packed block, `bias` its 32 channels' biases; out[q][r] = output channel r at position q.
template <int kPos>
[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void channel_tile_avx512(const float* in, const float* wp, const float* bias,
                                                                  const Plan& p, float* out) {
  __m512 acc[kPos][2];
  zero_accumulators(acc);
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.words; ++c) {
    for (int64_t i = 0; i < p.kh; ++i) {
      const float* row = in + c * plane + i * p.padded_w;
      for (int64_t j = 0; j < p.kw; ++j, wp += kChannelBlock) {
        const __m512 w0 = _mm512_loadu_ps(wp), w1 = _mm512_loadu_ps(wp + 16);
        // Opaque to the compiler, which would otherwise carry the values that tap j + 1 reads again
        // over from tap j, in more registers than there are (spilled to the stack).
        const float* taps = row + j;
        asm("" : "+r"(taps));
#pragma GCC unroll 14
        for (int q = 0; q < kPos; ++q) {
          const __m512 xq = _mm512_set1_ps(taps[q]);
          acc[q][0] = _mm512_fmadd_ps(w0, xq, acc[q][0]);
          acc[q][1] = _mm512_fmadd_ps(w1, xq, acc[q][1]);
        }
      }
    }
  }
  store_accumulators(acc, bias, out);
}

// The same over channel pairs: `in` and `wp` hold (c, c + 1) pairs of bfloat16 in 32-bit words, so
// one VDPBF16PS adds two channels' products (the grid's bfloat16 tile adds the same pairs in the
// same order, broadcasting w where this broadcasts x: the same bits), rounded once with b added.
template <int kPos>
[[AMPGRAD_AVX512_BF16_TARGET, gnu::noinline]] void channel_tile_avx512_bf16(const uint32_t* in, const uint32_t* wp,
                                                                            const float* bias, const Plan& p,
                                                                            float* out) {
  __m512 acc[kPos][2];
  zero_accumulators(acc);
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.words; ++c) {
    for (int64_t i = 0; i < p.kh; ++i) {
      const uint32_t* row = in + c * plane + i * p.padded_w;
      for (int64_t j = 0; j < p.kw; ++j, wp += kChannelBlock) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp), w1 = (__m512bh)_mm512_loadu_si512(wp + 16);
        const uint32_t* taps = row + j;
        asm("" : "+r"(taps));  // as in the float tile
#pragma GCC unroll 14
        for (int q = 0; q < kPos; ++q) {
          const __m512bh xq = (__m512bh)_mm512_set1_epi32(static_cast<int>(taps[q]));
          acc[q][0] = _mm512_dpbf16_ps(acc[q][0], w0, xq);
          acc[q][1] = _mm512_dpbf16_ps(acc[q][1], w1, xq);
        }
      }
    }
  }
  store_accumulators(acc, bias, out);
}

// The low (high) 64-bit halves of each 128-bit lane of a and b, interleaved.
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline __m512 unpacklo_64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline __m512 unpackhi_64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// Row k of the 16 x 16 block r becomes its column k: 32-bit, then 64-bit interleaves within each
// 128-bit lane, then two lane shuffles.
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void transpose_16x16(__m512 (&r)[16]) {
  __m512 t[16], s[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // s[4k + e], 128-bit lane l: element 4l + e of rows 4k .. 4k + 3.
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    s[4 * k] = unpacklo_64(t[4 * k], t[4 * k + 2]);
    s[4 * k + 1] = unpackhi_64(t[4 * k], t[4 * k + 2]);
    s[4 * k + 2] = unpacklo_64(t[4 * k + 1], t[4 * k + 3]);
    s[4 * k + 3] = unpackhi_64(t[4 * k + 1], t[4 * k + 3]);
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {
    const __m512 even0 = _mm512_shuffle_f32x4(s[e], s[4 + e], 0x88), odd0 = _mm512_shuffle_f32x4(s[e], s[4 + e], 0xDD);
    const __m512 even1 = _mm512_shuffle_f32x4(s[8 + e], s[12 + e], 0x88);
    const __m512 odd1 = _mm512_shuffle_f32x4(s[8 + e], s[12 + e], 0xDD);
    r[e] = _mm512_shuffle_f32x4(even0, even1, 0x88);
    r[8 + e] = _mm512_shuffle_f32x4(even0, even1, 0xDD);
    r[4 + e] = _mm512_shuffle_f32x4(odd0, odd1, 0x88);
    r[12 + e] = _mm512_shuffle_f32x4(odd0, odd1, 0xDD);
  }
}

// buf [count][32] (16 rows past count readable) into y_sample's first `channels` of output
// channels o0.., at flat positions p0 .. p0 + count - 1 of each channel's plane; bfloat16 rounded
// as the grid's tiles round.
template <typename T>
[[AMPGRAD_AVX512_TARGET]] void write_channels_last(const float* buf, int64_t count, int64_t o0, int64_t channels,
                                                   int64_t plane, int64_t p0, T* y_sample) {
  for (int64_t q0 = 0; q0 < count; q0 += 16) {
    const __mmask16 mask = count - q0 >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (count - q0)) - 1);
    for (int64_t half = 0; 16 * half < channels; ++half) {
      __m512 r[16];
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) r[k] = _mm512_load_ps(buf + (q0 + k) * kChannelBlock + 16 * half);
      transpose_16x16(r);
      const int64_t rows = std::min<int64_t>(16, channels - 16 * half);
      T* dst = y_sample + (o0 + 16 * half) * plane + p0 + q0;
      for (int64_t k = 0; k < rows; ++k) {
        if constexpr (std::is_same_v<T, float>) {
          _mm512_mask_storeu_ps(dst + k * plane, mask, r[k]);
        } else {
          _mm256_mask_storeu_epi16(dst + k * plane, mask, bf16::round_avx512(r[k]));
        }
      }
    }
  }
}

// Padded rows [row0, row0 + rows) of one sample's channels (row r holds source row r - pad_h) into
// dst [words][rows][Wp], laid out as pad_samples lays out whole planes (bfloat16: channel pairs).
template <typename T>
void pad_band(const T* src, int64_t row0, int64_t rows, const Plan& p, Word<T>* dst) {
  using W = Word<T>;
  const int64_t hw = p.height * p.width;
  for (int64_t cw = 0; cw < p.words; ++cw) {
    for (int64_t r = 0; r < rows; ++r) {
      W* out = dst + (cw * rows + r) * p.padded_w;
      const int64_t source_row = row0 + r - p.pad_h;
      if (source_row < 0 || source_row >= p.height) {
        std::fill(out, out + p.padded_w, W{});
        continue;
      }
      std::fill(out, out + p.pad_w, W{});
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(out + p.pad_w, src + cw * hw + source_row * p.width, static_cast<size_t>(p.width) * 4);
      } else {
        // Two loops without a test per value, so that the compiler vectorises them.
        const int64_t c = 2 * cw;
        const T* first = src + c * hw + source_row * p.width;
        W* row = out + p.pad_w;
        if (c + 1 < p.channels) {
          const T* second = first + hw;
          for (int64_t col = 0; col < p.width; ++col) row[col] = pair_word(first[col].bits, second[col].bits);
        } else {
          for (int64_t col = 0; col < p.width; ++col) row[col] = pair_word(first[col].bits, kPadB);
        }
      }
      std::fill(out + p.pad_w + p.width, out + p.padded_w, W{});
    }
  }
}

// y = conv(src, w) + b over every sample in channel tiles of kPos positions. An item is a band of
// output rows of one sample (about 256 positions): its padded rows are copied into the thread's
// buffer (where the tiles find them in L2), every block of 32 channels runs over them into the
// item's output buffer, and that leaves transposed.
template <int kPos, typename T>
void run_channels(const T* src, const T* w, const T* bias, int64_t batch, Plan p, T* y) {
  using W = Word<T>;
  p.words = (p.channels + channels_per_word<T>() - 1) / channels_per_word<T>();
  p.padded_w = padded_width(p);
  const std::vector<W> wp = pack_weights<kChannelBlock, T>(w, p);
  const int64_t blocks = (p.out_c + kChannelBlock - 1) / kChannelBlock;
  const int64_t block_words = p.words * p.kh * p.kw * kChannelBlock;
  std::vector<float> block_bias(static_cast<size_t>(blocks * kChannelBlock), -0.0f);
  for (int64_t o = 0; bias != nullptr && o < p.out_c; ++o) block_bias[static_cast<size_t>(o)] = load(bias[o]);
  const int64_t plane_out = p.out_h * p.out_w, row_tiles = (p.out_w + kPos - 1) / kPos;
  const int64_t band = std::clamp<int64_t>(256 / std::max<int64_t>(p.out_w, 1), 1, std::max<int64_t>(p.out_h, 1));
  const int64_t bands = (p.out_h + band - 1) / band;
  // A band's padded rows, then room for the overrun of the last row's last tile (kPos + kw - 1
  // values), zeros. A shorter last band reads up to pad_w values past its rows into rows left by a
  // taller one (shared padding columns): those start a row, so they are padding zeros too.
  const int64_t band_values = p.words * (band + p.kh - 1) * p.padded_w + kPos + p.kw + 16;
  // A band's positions (the last tile's overrun stays within row_tiles kPos), and the transpose's
  // 16 rows past them.
  const int64_t buffer_rows = band * row_tiles * kPos + 16;
  parallel_range(batch * bands, 1, [&](int64_t lo, int64_t hi) {
    std::vector<W> padded(static_cast<size_t>(band_values), W{});
    std::vector<float> buffer(static_cast<size_t>(buffer_rows * kChannelBlock + 16));
    float* const buf = align_64(buffer.data());
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t s = item / bands, r0 = (item % bands) * band, r1 = std::min(p.out_h, r0 + band);
      Plan in_band = p;
      in_band.padded_h = r1 - r0 + p.kh - 1;
      pad_band(src + s * p.channels * p.height * p.width, r0, in_band.padded_h, p, padded.data());
      T* y_sample = y + s * p.out_c * plane_out;
      for (int64_t ob = 0; ob < blocks; ++ob) {
        // Tiles in position order: a row's last tile overruns into the next row's first positions,
        // which their own tile then writes.
        for (int64_t oh = r0; oh < r1; ++oh) {
          for (int64_t t = 0; t < row_tiles; ++t) {
            const W* in = padded.data() + (oh - r0) * p.padded_w + t * kPos;
            const W* block = wp.data() + ob * block_words;
            const float* block_b = block_bias.data() + ob * kChannelBlock;
            float* out = buf + ((oh - r0) * p.out_w + t * kPos) * kChannelBlock;
            if constexpr (std::is_same_v<T, float>) {
              channel_tile_avx512<kPos>(in, block, block_b, in_band, out);
            } else {
              channel_tile_avx512_bf16<kPos>(in, block, block_b, in_band, out);
            }
          }
        }
        write_channels_last(buf, (r1 - r0) * p.out_w, ob * kChannelBlock,
                            std::min<int64_t>(kChannelBlock, p.out_c - ob * kChannelBlock), plane_out, r0 * p.out_w,
                            y_sample);
      }
    }
  });
}

// The channel tile's positions for a row of `out_w`: 14, or 7 where that computes fewer.
int64_t channel_tile_positions(int64_t out_w) {
  return (out_w + 6) / 7 * 7 < (out_w + 13) / 14 * 14 ? 7 : 14;
}

// ---- The weight gradient in channel tiles ------------------------------------------------------
// dw[o, t] = the sum over samples and output positions pos of dy[o, pos] x[c, pos + tap t], with
// output channels along the vectors: dy transposed to [positions][O] per sample (dyt; bfloat16:
// [rows][position pairs][O]) and x broadcast from the padded copy. No dropped column is computed
// (the grid's tiles compute 28 of every 224 positions for nothing at 14 x 14), only, in bfloat16,
// a position of dy 0 after an odd row. A tile of kTaps taps x kVec vectors of channels sums
// a group of samples in float (the group's x and dyt stay in L2 while every tile passes over them),
// keeps its sums in memory between groups, and adds them into the double totals every
// kFlushPositions positions or more: each float sum has fewer terms than that plus a group's. The
// groups, and so the bits, depend on the shapes alone.
constexpr int64_t kFlushPositions = 2048;

// The samples one channel weight tile runs over, from its first.
struct ChannelSpan {
  int64_t count;       // samples
  int64_t dyt_stride;  // from one sample's dyt to the next's
  int64_t x_stride;    // from one sample's padded copy to the next's
  int64_t o_stride;    // dyt's row: the channels, rounded up to a tile's
  int64_t out_h, row_words, padded_w;  // row_words: dyt rows per output row (bfloat16: position pairs)
};

template <int kVec, int kTaps>
[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void weight_channel_tile_avx512(const float* dyt,
                                                                         const float* const (&xs)[kTaps],
                                                                         const ChannelSpan& b, float* sums) {
  __m512 acc[kTaps][kVec];
  load_partials(acc, sums);
  for (int64_t s = 0; s < b.count; ++s) {
    const float* d = dyt + s * b.dyt_stride;
    for (int64_t oh = 0; oh < b.out_h; ++oh) {
      const int64_t at = s * b.x_stride + oh * b.padded_w;
      for (int64_t ow = 0; ow < b.row_words; ++ow, d += b.o_stride) {
        __m512 dv[kVec];
#pragma GCC unroll 4
        for (int v = 0; v < kVec; ++v) dv[v] = _mm512_loadu_ps(d + 16 * v);
#pragma GCC unroll 12
        for (int t = 0; t < kTaps; ++t) {
          const __m512 xt = _mm512_set1_ps(xs[t][at + ow]);
#pragma GCC unroll 4
          for (int v = 0; v < kVec; ++v) acc[t][v] = _mm512_fmadd_ps(dv[v], xt, acc[t][v]);
        }
      }
    }
  }
  store_partials(acc, sums);
}

// dyt [positions][o_stride] of one sample from its dy [O][positions] (channels past O: zeros).
[[AMPGRAD_AVX512_TARGET]] void transpose_sample(const float* dy, int64_t channels, int64_t positions,
                                                int64_t o_stride, float* dyt) {
  for (int64_t o0 = 0; o0 < o_stride; o0 += 16) {
    for (int64_t q0 = 0; q0 < positions; q0 += 16) {
      const int64_t count = std::min<int64_t>(16, positions - q0);
      const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
      __m512 r[16];
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        r[k] = o0 + k < channels ? _mm512_maskz_loadu_ps(mask, dy + (o0 + k) * positions + q0) : _mm512_setzero_ps();
      }
      transpose_16x16(r);
      for (int64_t k = 0; k < count; ++k) _mm512_storeu_ps(dyt + (q0 + k) * o_stride + o0, r[k]);
    }
  }
}

// Bfloat16: dyt holds pairs of neighbouring positions of a row, (ow, ow + 1), in 32-bit words (the
// first in the low half, a missing one past an odd row 0), and x's windows are read two values at a
// time, the same pair, so one VDPBF16PS adds two positions' products.
template <int kVec, int kTaps>
[[AMPGRAD_AVX512_BF16_TARGET, gnu::noinline]] void weight_channel_tile_avx512_bf16(
    const uint32_t* dyt, const BFloat16* const (&xs)[kTaps], const ChannelSpan& b, float* sums) {
  __m512 acc[kTaps][kVec];
  load_partials(acc, sums);
  for (int64_t s = 0; s < b.count; ++s) {
    const uint32_t* d = dyt + s * b.dyt_stride;
    for (int64_t oh = 0; oh < b.out_h; ++oh) {
      const int64_t at = s * b.x_stride + oh * b.padded_w;
      for (int64_t pair = 0; pair < b.row_words; ++pair, d += b.o_stride) {
        __m512bh dv[kVec];
#pragma GCC unroll 4
        for (int v = 0; v < kVec; ++v) dv[v] = (__m512bh)_mm512_loadu_si512(d + 16 * v);
#pragma GCC unroll 12
        for (int t = 0; t < kTaps; ++t) {
          uint32_t word;
          std::memcpy(&word, xs[t] + at + 2 * pair, sizeof(word));
          const __m512bh xt = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
#pragma GCC unroll 4
          for (int v = 0; v < kVec; ++v) acc[t][v] = _mm512_dpbf16_ps(acc[t][v], dv[v], xt);
        }
      }
    }
  }
  store_partials(acc, sums);
}

// dyt [out_h][row_words][o_stride] words of one sample from its bfloat16 dy [O][out_h][out_w]: each
// word two neighbouring positions of a row (channels past O and the position past an odd row: 0).
[[AMPGRAD_AVX512_TARGET]] void transpose_sample_pairs(const BFloat16* dy, int64_t channels, int64_t out_h,
                                                      int64_t out_w, int64_t o_stride, uint32_t* dyt) {
  const int64_t row_words = (out_w + 1) / 2, positions = out_h * out_w;
  for (int64_t o0 = 0; o0 < o_stride; o0 += 16) {
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t w0 = 0; w0 < row_words; w0 += 16) {
        const int64_t words = std::min<int64_t>(16, row_words - w0), values = std::min<int64_t>(32, out_w - 2 * w0);
        const __mmask32 mask = values == 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << values) - 1);
        __m512 r[16];
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) {
          r[k] = o0 + k < channels
                     ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, dy + (o0 + k) * positions + oh * out_w + 2 * w0))
                     : _mm512_setzero_ps();
        }
        transpose_16x16(r);
        for (int64_t k = 0; k < words; ++k) {
          _mm512_storeu_ps(reinterpret_cast<float*>(dyt + (oh * row_words + w0 + k) * o_stride + o0), r[k]);
        }
      }
    }
  }
}

template <int kVec, int kTaps, typename T>
void run_weight_grad_channels(const T* x, const T* dy, int64_t batch, Plan p, double* total) {
  using W = Word<T>;
  constexpr int64_t kBlock = 16 * kVec, kTileFloats = kTaps * kBlock;
  p.padded_h = p.height + 2 * p.pad_h;
  p.padded_w = padded_width(p);
  const int64_t plane = p.padded_h * p.padded_w, per_sample = p.channels * plane;
  const int64_t positions = p.out_h * p.out_w, o_stride = (p.out_c + kBlock - 1) / kBlock * kBlock;
  const int64_t row_words = (p.out_w + channels_per_word<T>() - 1) / channels_per_word<T>();
  const int64_t dyt_per_sample = p.out_h * row_words * o_stride, taps = p.channels * p.kh * p.kw;
  // A group of samples whose padded x and dyt fit in kWindowBudget: written just before the tiles
  // read them, they stay in L2 (a whole batch's copies, written first, went out to memory: the
  // transposes then cost twice their time).
  const int64_t sample_bytes = per_sample * static_cast<int64_t>(sizeof(T)) + dyt_per_sample * 4;
  const int64_t group = std::clamp<int64_t>(kWindowBudget / sample_bytes, 1, std::max<int64_t>(batch, 1));
  // The last position's last tap reads up to pad_w past the last plane (rows share padding columns),
  // one more where an odd row's last bfloat16 pair reads past it.
  const int64_t slack = p.pad_w + 16;
  Tensor padded_block = Tensor::empty({group * per_sample + slack}, kDTypeOf<T>, Device::kCPU);
  Tensor dyt_block = Tensor::empty({group * dyt_per_sample}, DType::kFloat32, Device::kCPU);
  T* const padded = padded_block.data<T>();
  W* const dyt = static_cast<W*>(dyt_block.data_ptr());
  std::vector<int64_t> offset(static_cast<size_t>(taps));
  for (int64_t t = 0; t < taps; ++t) {
    offset[static_cast<size_t>(t)] = (t / (p.kh * p.kw)) * plane + ((t / p.kw) % p.kh) * p.padded_w + t % p.kw;
  }
  const int64_t o_tiles = o_stride / kBlock, k_tiles = (taps + kTaps - 1) / kTaps, items = o_tiles * k_tiles;
  Tensor sum_block = Tensor::empty({items * kTileFloats + 16}, DType::kFloat32, Device::kCPU);
  float* const sums = align_64(sum_block.data<float>());
  std::fill(sums, sums + items * kTileFloats, 0.0f);
  const auto add_into_totals = [&] {
    parallel_range(items, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t o0 = (item / k_tiles) * kBlock, t0 = (item % k_tiles) * kTaps;
        float* tile = sums + item * kTileFloats;
        for (int64_t t = 0; t < kTaps && t0 + t < taps; ++t) {
          for (int64_t r = 0; r < kBlock && o0 + r < p.out_c; ++r) {
            total[(o0 + r) * taps + t0 + t] += tile[t * kBlock + r];
          }
        }
        std::fill(tile, tile + kTileFloats, 0.0f);
      }
    });
  };
  int64_t unflushed = 0;
  for (int64_t g0 = 0; g0 < batch; g0 += group) {
    const int64_t n = std::min(group, batch - g0);
    pad_samples<false>(x, g0, n, p, padded);
    std::fill(padded + n * per_sample, padded + n * per_sample + slack, T{});
    parallel_range(n, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t s = lo; s < hi; ++s) {
        const T* sample_dy = dy + (g0 + s) * p.out_c * positions;
        if constexpr (std::is_same_v<T, float>) {
          transpose_sample(sample_dy, p.out_c, positions, o_stride, dyt + s * dyt_per_sample);
        } else {
          transpose_sample_pairs(sample_dy, p.out_c, p.out_h, p.out_w, o_stride, dyt + s * dyt_per_sample);
        }
      }
    });
    const ChannelSpan span{.count = n, .dyt_stride = dyt_per_sample, .x_stride = per_sample, .o_stride = o_stride,
                           .out_h = p.out_h, .row_words = row_words, .padded_w = p.padded_w};
    parallel_range(items, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t o0 = (item / k_tiles) * kBlock, t0 = (item % k_tiles) * kTaps;
        const T* windows[kTaps];
        for (int t = 0; t < kTaps; ++t) windows[t] = padded + (t0 + t < taps ? offset[static_cast<size_t>(t0 + t)] : 0);
        if constexpr (std::is_same_v<T, float>) {
          weight_channel_tile_avx512<kVec, kTaps>(dyt + o0, windows, span, sums + item * kTileFloats);
        } else {
          weight_channel_tile_avx512_bf16<kVec, kTaps>(dyt + o0, windows, span, sums + item * kTileFloats);
        }
      }
    });
    unflushed += n * positions;
    if (unflushed >= kFlushPositions) {
      add_into_totals();
      unflushed = 0;
    }
  }
  if (unflushed > 0) add_into_totals();
}

}  // namespace

// Whether the channel tiles compute fewer products than the grid's 8 x 32 tiles, with a margin for
// their transpose and for the 7-position tile's lower FMA density. (Measured forward + backward on
// one thread: 28 x 28 into 128 channels, which the count favours by 1%, ran 12% faster; 56 x 56
// into 64, where the grid wins by 2%, the same.)
bool channel_tiles_pay(Plan p) {
  if (p.out_c < 32) return false;
  p.padded_w = padded_width(p);
  const int64_t kpos = channel_tile_positions(p.out_w);
  const double grid = static_cast<double>((p.out_h * p.padded_w + 31) / 32 * 32 * ((p.out_c + 7) / 8 * 8));
  const double channels = static_cast<double>(p.out_h * ((p.out_w + kpos - 1) / kpos * kpos) *
                                              ((p.out_c + kChannelBlock - 1) / kChannelBlock * kChannelBlock));
  return channels * (kpos == 14 ? 1.05 : 1.15) < grid;
}

template <typename T>
void convolve_in_channel_tiles(const T* src, const T* w, const T* bias, int64_t batch, const Plan& p, T* y) {
  if (channel_tile_positions(p.out_w) == 7) {
    run_channels<7>(src, w, bias, batch, p, y);
  } else {
    run_channels<14>(src, w, bias, batch, p, y);
  }
}
template void convolve_in_channel_tiles(const float*, const float*, const float*, int64_t, const Plan&, float*);
template void convolve_in_channel_tiles(const BFloat16*, const BFloat16*, const BFloat16*, int64_t, const Plan&,
                                        BFloat16*);

// Whether the channel weight tiles compute fewer products than the grid's (kO x kK over `len`
// positions of each sample), with a margin for the transposes and the double totals.
bool channel_weight_tiles_pay(Plan p) {
  if (p.out_c < 32) return false;
  p.padded_w = padded_width(p);
  const int64_t taps = p.channels * p.kh * p.kw, grid = p.out_h * p.padded_w;
  const int64_t most = std::clamp<int64_t>(kWindowBudget / (p.channels * 4), 512, 2048);
  const int64_t blocks = (grid + most - 1) / most, len = ((grid + blocks - 1) / blocks + 31) / 32 * 32;
  const double grid_work = static_cast<double>(blocks * len * ((p.out_c + 3) / 4 * 4) * ((taps + 5) / 6 * 6));
  const int64_t block = p.out_c > 32 ? 64 : 32, k_taps = p.out_c > 32 ? 6 : 12;
  const double channel_work = static_cast<double>(p.out_h * p.out_w * ((p.out_c + block - 1) / block * block) *
                                                  ((taps + k_taps - 1) / k_taps * k_taps));
  return channel_work * 1.05 < grid_work;
}

template <typename T>
void weight_grad_in_channel_tiles(const T* x, const T* dy, int64_t batch, const Plan& p, double* total) {
  if (p.out_c > 32) {
    run_weight_grad_channels<4, 6>(x, dy, batch, p, total);
  } else {
    run_weight_grad_channels<2, 12>(x, dy, batch, p, total);
  }
}
template void weight_grad_in_channel_tiles(const float*, const float*, int64_t, const Plan&, double*);
template void weight_grad_in_channel_tiles(const BFloat16*, const BFloat16*, int64_t, const Plan&, double*);

}  // namespace ampgrad::kernels::cpu::direct
#endif
