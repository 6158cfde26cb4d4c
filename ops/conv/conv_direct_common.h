// The direct stride-1 convolution's shared pieces (conv_kernels.h: direct_conv2d): its plan, the
// zero-padded copies of the source and the packed weights. conv_direct_cpu.cc holds the grid tiles
// and picks the route; conv_direct_channels_cpu.cc holds the channel tiles. Internal to ops/conv.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "framework/bfloat16.h"
#include "framework/cpu_features.h"
#include "framework/parallel.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#define AMPGRAD_DIRECT_CONV 1
#endif

#ifdef AMPGRAD_DIRECT_CONV
// GCC 12 warns, wrongly, that the AVX-512 shuffles' _mm512_undefined_* values may be used
// uninitialized (GCC bug 105593, attributed to the header): silenced around the include, as in
// bfloat16.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace ampgrad::kernels::cpu::direct {

// The weight gradient's windows of one block of positions (the grid) or one group of samples (the
// channel tiles), in bytes: half of a 1 MB L2.
constexpr int64_t kWindowBudget = int64_t{1} << 19;

// The geometry of one call: the source [n, C, H, W] (x, or dy for the input gradient) read through
// its padded copy [n, words, Hp, Wp], where a word holds one channel (float32) or a channel pair
// (bfloat16); O outputs channels of out_h x out_w. Source row r starts at (pad_h + r) Wp + pad_w.
struct Plan {
  int64_t channels, height, width, out_c, kh, kw, pad_h, pad_w, out_h, out_w;
  int64_t words = 0, padded_h = 0, padded_w = 0;
};

// Wp: W + pad_w, where the pad_w zeros before a row are also the right padding of the row above
// (out_w <= Wp since pad_w < kw; the last row's right padding is the next plane's first zeros, or
// the slack after the last plane), so fewer dropped columns are computed: 1 of 57 at the ResNet
// stage's 56 x 56, not 2 of 58 (3% of the BF16 step). W + 2 pad_w where that gives as few runs of
// 32 positions: at 14 x 14 both take 7, and rows of 16 floats keep a third of the loads aligned.
inline int64_t padded_width(const Plan& p) {
  const int64_t shared = p.width + p.pad_w, separate = p.width + 2 * p.pad_w;
  const auto runs = [&](int64_t wp) { return (p.out_h * wp + 31) / 32; };
  return runs(separate) <= runs(shared) ? separate : shared;
}

// The padded copy's and the packed weights' 32-bit words: a float, or two bfloat16 channels with
// the even one in the high half (VDPBF16PS multiplies it first). A missing odd channel pads with +0
// in the weights and -0 in x (kPadA, kPadB: the product -0 leaves every sum unchanged).
template <typename T>
using Word = std::conditional_t<std::is_same_v<T, float>, float, uint32_t>;
constexpr uint32_t pair_word(uint16_t first, uint16_t second) { return (uint32_t{first} << 16) | second; }
constexpr uint16_t kPadA = 0x0000, kPadB = 0x8000;
template <typename T>
constexpr int64_t channels_per_word() {
  return std::is_same_v<T, float> ? 1 : 2;
}

// w [O, C, kh, kw] as blocks of kRows output channels: wp[ob][word][i][j][r] holds
// w[ob kRows + r, channel(s) of word, i, j] (0 past O): the kRows words one step broadcasts.
template <int kRows, typename T>
std::vector<Word<T>> pack_weights(const T* w, const Plan& p) {
  const int64_t blocks = (p.out_c + kRows - 1) / kRows, taps = p.kh * p.kw;
  std::vector<Word<T>> packed(static_cast<size_t>(blocks * p.words * taps * kRows), Word<T>{});
  for (int64_t o = 0; o < p.out_c; ++o) {
    for (int64_t cw = 0; cw < p.words; ++cw) {
      for (int64_t t = 0; t < taps; ++t) {
        Word<T>& out = packed[static_cast<size_t>((((o / kRows) * p.words + cw) * taps + t) * kRows + o % kRows)];
        if constexpr (std::is_same_v<T, float>) {
          out = w[(o * p.channels + cw) * taps + t];
        } else {
          const int64_t c = 2 * cw;
          out = pair_word(w[(o * p.channels + c) * taps + t].bits,
                          c + 1 < p.channels ? w[(o * p.channels + c + 1) * taps + t].bits : kPadA);
        }
      }
    }
  }
  return packed;
}

// Samples [n0, n0 + n) of `src` into the zero-padded copy, one channel (Pairs: a channel pair's
// words) per plane. Without Pairs the copy keeps src's type (the weight gradient reads bfloat16
// pairs along the grid from it).
template <bool kPairs, typename T, typename Out>
void pad_samples(const T* src, int64_t n0, int64_t n, const Plan& p, Out* padded) {
  const int64_t plane = p.padded_h * p.padded_w, planes = kPairs ? p.words : p.channels;
  const int64_t hw = p.height * p.width;
  parallel_range(n * planes, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(plane, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t item = lo; item < hi; ++item) {
                     const int64_t s = item / planes, cw = item % planes;
                     Out* dst = padded + item * plane;
                     // Zeros only where no row lands: before the first row, between rows, after the last.
                     Out* zeros_from = dst;
                     for (int64_t r = 0; r < p.height; ++r) {
                       Out* row = dst + (p.pad_h + r) * p.padded_w + p.pad_w;
                       std::fill(zeros_from, row, Out{});
                       zeros_from = row + p.width;
                       if constexpr (kPairs) {
                         const int64_t c = 2 * cw;
                         const T* first = src + ((n0 + s) * p.channels + c) * hw + r * p.width;
                         const T* second = c + 1 < p.channels ? first + hw : nullptr;
                         for (int64_t col = 0; col < p.width; ++col) {
                           row[col] = pair_word(first[col].bits, second != nullptr ? second[col].bits : kPadB);
                         }
                       } else {
                         std::memcpy(row, src + ((n0 + s) * p.channels + cw) * hw + r * p.width,
                                     static_cast<size_t>(p.width) * sizeof(T));
                       }
                     }
                     std::fill(zeros_from, dst + plane, Out{});
                   }
                 });
}

// p rounded up to a 64-byte boundary (a buffer allocated 16 floats longer holds what follows).
inline float* align_64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// An AVX-512 weight tile's kO x kK vectors of partial sums, from and back to memory (the grid's
// tiles and the channel tiles, float32 and bfloat16 alike).
template <int kO, int kK>
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void load_partials(__m512 (&acc)[kO][kK], const float* sums) {
#pragma GCC unroll 12
  for (int r = 0; r < kO; ++r) {
#pragma GCC unroll 8
    for (int k = 0; k < kK; ++k) acc[r][k] = _mm512_load_ps(sums + (r * kK + k) * 16);
  }
}

template <int kO, int kK>
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void store_partials(const __m512 (&acc)[kO][kK], float* sums) {
#pragma GCC unroll 12
  for (int r = 0; r < kO; ++r) {
#pragma GCC unroll 8
    for (int k = 0; k < kK; ++k) _mm512_store_ps(sums + (r * kK + k) * 16, acc[r][k]);
  }
}

// ---- The channel tiles (conv_direct_channels_cpu.cc; float32 at AVX-512, bfloat16 at
// AVX512_BF16) ----------------------------------------------------------------------------------
// Whether they compute enough fewer products than the grid's tiles to pay for their transposes.
bool channel_tiles_pay(Plan p);
bool channel_weight_tiles_pay(Plan p);
// y = conv(src, w) + b as the grid's tiles give it; dw's sums into total (zeros on entry). T is
// float or BFloat16.
template <typename T>
void convolve_in_channel_tiles(const T* src, const T* w, const T* bias, int64_t batch, const Plan& p, T* y);
template <typename T>
void weight_grad_in_channel_tiles(const T* x, const T* dy, int64_t batch, const Plan& p, double* total);

}  // namespace ampgrad::kernels::cpu::direct
#endif
