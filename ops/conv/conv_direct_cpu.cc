// Direct stride-1 convolution on the CPU (conv_kernels.h: direct_conv2d). The im2col route writes
// K = C kH kW columns per output pixel, packs them again for the GEMM and transposes the result
// into [N, O, Ho, Wo]; at a ResNet stage's 3x3 shape that costs as much as the arithmetic. Here a
// register tile of output channels x a run of output positions sums over (c, i, j), reading x
// straight from a zero-padded copy [C, Hp, Wp]. The positions run over the padded-width grid
// q = oh Wp + ow: tap (i, j) of position q is element q + i Wp + j of a padded channel plane, so a
// run of positions is a run of the plane even across output rows (its columns ow >= Wo are
// computed and dropped: 2 of every 16 at 14 x 14, where whole-row tiles would drop 18 of 32).
// Where that computes fewer positions, rows share their padding columns (padded_width).
//   float32, AVX2/FMA  6 x 16: 12 ymm accumulators (the GEMM's tile);
//   float32, AVX-512   8 x 32: 16 zmm accumulators;
//   bfloat16, AVX512_BF16 8 x 32 over channel pairs: the padded copy holds (c, c + 1) pairs in
//     32-bit words, so VDPBF16PS takes two channels a step (the GEMM's pair kernel's arithmetic).
// On small planes, where the grid drops many columns (2 of every 16 at 14 x 14), the forward
// (float32 at AVX-512, bfloat16 at AVX512_BF16) runs channel tiles instead
// (conv_direct_channels_cpu.cc): 32 output channels x a run of one output row's positions, x
// broadcast, leaving channels-last through a transpose (channel_tiles_pay decides by counting the
// products each route computes); the weight gradient likewise runs along output channels.
// The AVX-512 tiles are compiled for their own targets and run where effective_cpu_isa() allows.
// Float32: each output is 0, then one FMA per (c, i, j) in order, then + b: the bits of the im2col
// GEMM route (the GEMM makes the same chain), so the two routes agree exactly. Bfloat16 pairs other
// terms than the GEMM's pair kernel (channels at one tap, not neighbouring taps) and rounds once
// where that route rounds the sum and then the sum plus b.
// The weight gradient is a GEMM whose long reduction runs over the grid: vectors along q.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "framework/cpu_features.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "ops/conv/conv_direct_common.h"
#include "ops/conv/conv_kernels.h"

#ifdef AMPGRAD_DIRECT_CONV
#include "framework/bfloat16_avx512.h"
#endif

namespace ampgrad::kernels::cpu {

#ifdef AMPGRAD_DIRECT_CONV

namespace direct {
namespace {

// How many padded input values one chunk of samples copies (8 Mi), and how many floats of vector
// partial sums the weight gradient keeps at once (2 Mi), at most beyond one sample's and one
// channel tile's: the grid's transients beside x and w, bounded whatever the batch and the number
// of output channels. Tests lower them (set_direct_conv_budgets_for_testing).
constexpr int64_t kPaddedBudget = int64_t{1} << 23, kPartialBudget = int64_t{1} << 21;
std::atomic<int64_t> padded_budget_for_testing{0}, partial_budget_for_testing{0};
int64_t padded_budget() {
  const int64_t set = padded_budget_for_testing.load();
  return set > 0 ? set : kPaddedBudget;
}
int64_t partial_budget() {
  const int64_t set = partial_budget_for_testing.load();
  return set > 0 ? set : kPartialBudget;
}

std::atomic<DirectConvRoute> route_for_testing{DirectConvRoute::kAuto};

// n values in copies of fixed sizes, which compile to a few moves: a call to memcpy for each run of
// a tile row cost 3% of the BF16 ResNet stage.
template <typename T>
void copy_run(T* dst, const T* src, int64_t n) {
  for (; n >= 16; n -= 16, dst += 16, src += 16) std::memcpy(dst, src, 16 * sizeof(T));
  for (int64_t size = 8; size > 0; size /= 2) {
    if ((n & size) != 0) {
      std::memcpy(dst, src, static_cast<size_t>(size) * sizeof(T));
      dst += size, src += size;
    }
  }
}

// The tile leaves through a small buffer of T (bias added and rounded in registers): of grid
// positions q0 .. q0 + kCols - 1, those with ow < Wo go to y for the block's valid channels.
template <int kRows, int kCols, typename T>
void write_tile(const T (&tile)[kRows][kCols], int64_t o0, int64_t q0, const Plan& p, T* y_sample) {
  const int64_t rows = std::min<int64_t>(kRows, p.out_c - o0), plane = p.out_h * p.out_w;
  const int64_t end = std::min(q0 + kCols, p.out_h * p.padded_w);
  for (int64_t q = q0; q < end;) {
    const int64_t oh = q / p.padded_w, ow = q % p.padded_w, row_end = (oh + 1) * p.padded_w;
    const int64_t valid = std::min({row_end, oh * p.padded_w + p.out_w, end}) - q;
    for (int64_t r = 0; valid > 0 && r < rows; ++r) {
      copy_run(y_sample + (o0 + r) * plane + oh * p.out_w + ow, tile[r] + (q - q0), valid);
    }
    q = std::min(row_end, end);
  }
}

// ---- Forward tiles: kRows channels o0.. x kCols grid positions q0..; `in` is the sample's padded
// copy from element q0 of its first plane, `wp` the packed block of o0, `bias` its kRows channels'
// biases (-0.0f without one: adding it changes no sum, not even a -0, with MXCSR's DAZ off as
// ampgrad leaves it) -------------------------------------------------------------------------

[[gnu::noinline]] void tile_avx2(const float* in, const float* wp, const float* bias, const Plan& p,
                                 float (&tile)[6][16]) {
  constexpr int kRows = 6;
  __m256 acc[kRows][2];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.words; ++c) {
    for (int64_t i = 0; i < p.kh; ++i) {
      const float* row = in + c * plane + i * p.padded_w;
      for (int64_t j = 0; j < p.kw; ++j, wp += kRows) {
        const __m256 b0 = _mm256_loadu_ps(row + j), b1 = _mm256_loadu_ps(row + j + 8);
#pragma GCC unroll 6
        for (int r = 0; r < kRows; ++r) {
          const __m256 a = _mm256_broadcast_ss(wp + r);
          acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    const __m256 b = _mm256_set1_ps(bias[r]);
    _mm256_storeu_ps(tile[r], _mm256_add_ps(acc[r][0], b));
    _mm256_storeu_ps(tile[r] + 8, _mm256_add_ps(acc[r][1], b));
  }
}

// An AVX-512 forward tile's 8 x 2 accumulators: zeroed, and stored into the tile with the bias
// added (the bfloat16 tile rounds them there too).
[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void zero_accumulators(__m512 (&acc)[8][2]) {
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
}

[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void store_accumulators(const __m512 (&acc)[8][2],
                                                                          const float* bias, float (&tile)[8][32]) {
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    const __m512 b = _mm512_set1_ps(bias[r]);
    _mm512_storeu_ps(tile[r], _mm512_add_ps(acc[r][0], b));
    _mm512_storeu_ps(tile[r] + 16, _mm512_add_ps(acc[r][1], b));
  }
}

[[AMPGRAD_AVX512_TARGET, gnu::always_inline]] inline void store_accumulators(const __m512 (&acc)[8][2],
                                                                          const float* bias, BFloat16 (&tile)[8][32]) {
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    const __m512 b = _mm512_set1_ps(bias[r]);
    for (int half = 0; half < 2; ++half) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile[r] + 16 * half),
                          bf16::round_avx512(_mm512_add_ps(acc[r][half], b)));
    }
  }
}

[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void tile_avx512(const float* in, const float* wp, const float* bias,
                                                          const Plan& p, float (&tile)[8][32]) {
  constexpr int kRows = 8;
  __m512 acc[kRows][2];
  zero_accumulators(acc);
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.words; ++c) {
    for (int64_t i = 0; i < p.kh; ++i) {
      const float* row = in + c * plane + i * p.padded_w;
      for (int64_t j = 0; j < p.kw; ++j, wp += kRows) {
        const __m512 b0 = _mm512_loadu_ps(row + j), b1 = _mm512_loadu_ps(row + j + 16);
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) {
          const __m512 a = _mm512_set1_ps(wp[r]);
          acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
          acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
      }
    }
  }
  store_accumulators(acc, bias, tile);
}

[[AMPGRAD_AVX512_BF16_TARGET, gnu::noinline]] void tile_avx512_bf16(const uint32_t* in, const uint32_t* wp,
                                                                    const float* bias, const Plan& p,
                                                                    BFloat16 (&tile)[8][32]) {
  constexpr int kRows = 8;
  __m512 acc[kRows][2];
  zero_accumulators(acc);
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.words; ++c) {
    for (int64_t i = 0; i < p.kh; ++i) {
      const uint32_t* row = in + c * plane + i * p.padded_w;
      for (int64_t j = 0; j < p.kw; ++j, wp += kRows) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(row + j), b1 = (__m512bh)_mm512_loadu_si512(row + j + 16);
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(wp[r]));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
      }
    }
  }
  store_accumulators(acc, bias, tile);
}

// y = conv(src, w) + b over every sample, with the tile of kRows x kCols that tile_fn computes.
template <int kRows, int kCols, typename T, typename Tile>
void run(const T* src, const T* w, const T* bias, int64_t batch, Plan p, T* y, Tile&& tile_fn) {
  using W = Word<T>;
  p.words = (p.channels + channels_per_word<T>() - 1) / channels_per_word<T>();
  p.padded_h = p.height + 2 * p.pad_h;
  p.padded_w = padded_width(p);
  const std::vector<W> wp = pack_weights<kRows>(w, p);
  const int64_t blocks = (p.out_c + kRows - 1) / kRows, block_words = p.words * p.kh * p.kw * kRows;
  std::vector<float> row_bias(static_cast<size_t>(blocks * kRows), -0.0f);
  for (int64_t o = 0; bias != nullptr && o < p.out_c; ++o) row_bias[static_cast<size_t>(o)] = load(bias[o]);
  const int64_t per_sample = p.words * p.padded_h * p.padded_w;
  const int64_t grid = p.out_h * p.padded_w, tiles = (grid + kCols - 1) / kCols;
  // The last sample's last tile reads up to kCols + kw past its last plane (positions past the grid).
  const int64_t slack = 2 * kCols + p.kw;
  const int64_t chunk =
      std::clamp<int64_t>(padded_budget() / std::max<int64_t>(per_sample, 1), 1, std::max<int64_t>(batch, 1));
  // From the caching allocator (32-bit words as float32): a step's convolutions reuse its blocks.
  Tensor padded_block = Tensor::empty({std::min(chunk, batch) * per_sample + slack}, DType::kFloat32, Device::kCPU);
  W* const padded = static_cast<W*>(padded_block.data_ptr());
  // An item is a few tiles of one sample (about 256 positions): every block of output channels
  // runs over them, its packed weights staying in L1.
  const int64_t tiles_per_item = std::max<int64_t>(1, 256 / kCols);
  const int64_t items_per_sample = (tiles + tiles_per_item - 1) / tiles_per_item;
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t n = std::min(chunk, batch - n0);
    pad_samples<!std::is_same_v<T, float>>(src, n0, n, p, padded);
    std::fill(padded + n * per_sample, padded + n * per_sample + slack, W{});
    parallel_range(n * items_per_sample, 1, [&](int64_t lo, int64_t hi) {
      T tile[kRows][kCols];
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t s = item / items_per_sample, t0 = (item % items_per_sample) * tiles_per_item;
        const int64_t t1 = std::min(tiles, t0 + tiles_per_item);
        const W* in = padded + s * per_sample;
        T* y_sample = y + (n0 + s) * p.out_c * p.out_h * p.out_w;
        for (int64_t ob = 0; ob < blocks; ++ob) {
          for (int64_t t = t0; t < t1; ++t) {
            tile_fn(in + t * kCols, wp.data() + ob * block_words, row_bias.data() + ob * kRows, p, tile);
            write_tile(tile, ob * kRows, t * kCols, p, y_sample);
          }
        }
      }
    });
  }
}

// Stride-1 convolution of src [batch, C, H, W] by w [O, C, kh, kw] with the plan's padding.
template <typename T>
void convolve(const T* src, const T* w, const T* bias, int64_t batch, const Plan& p, T* y) {
  const DirectConvRoute route = route_for_testing.load();
  if constexpr (std::is_same_v<T, float>) {
    if (effective_cpu_isa() >= CpuIsa::kAvx512 && route != DirectConvRoute::kGrid &&
        (route == DirectConvRoute::kChannels || channel_tiles_pay(p))) {
      convolve_in_channel_tiles(src, w, bias, batch, p, y);
    } else if (effective_cpu_isa() >= CpuIsa::kAvx512) {
      run<8, 32>(src, w, bias, batch, p, y,
                 [](const float* in, const float* wp, const float* b, const Plan& q, float(&t)[8][32]) {
                   tile_avx512(in, wp, b, q, t);
                 });
    } else {
      run<6, 16>(src, w, bias, batch, p, y,
                 [](const float* in, const float* wp, const float* b, const Plan& q, float(&t)[6][16]) {
                   tile_avx2(in, wp, b, q, t);
                 });
    }
  } else if (route != DirectConvRoute::kGrid && (route == DirectConvRoute::kChannels || channel_tiles_pay(p))) {
    convolve_in_channel_tiles(src, w, bias, batch, p, y);
  } else {
    run<8, 32>(src, w, bias, batch, p, y,
               [](const uint32_t* in, const uint32_t* wp, const float* b, const Plan& q, BFloat16(&t)[8][32]) {
                 tile_avx512_bf16(in, wp, b, q, t);
               });
  }
}

// ---- The weight gradient ----------------------------------------------------------------------
// dw[o, (c, i, j)] = sum over samples and grid positions q of dyg[o, q] xp[c, q + i Wp + j], where
// dyg is dy on the padded-width grid with zeros at the dropped columns (ow >= Wo) and past the
// grid: a GEMM whose long reduction runs over q. A tile of kO output channels x kK taps keeps one
// vector of float partial sums per pair, in registers over a block of 2 to 8 KB of each row of a
// group of samples (the x windows of the block stay in L2 while every tile passes over them) and
// in memory between blocks; its lanes are added in double at the end. Bfloat16 takes positions
// (q, q + 1) as the pairs of VDPBF16PS: both operands are runs of memory, so pairs need no
// rearranging.

// The positions one weight-tile call runs over.
struct Block {
  int64_t len;        // positions per sample, a multiple of 32
  int64_t count;      // samples
  int64_t dy_stride;  // from one sample's dy rows to the next's
  int64_t x_stride;   // from one sample's padded copy to the next's
};

template <int kO, int kK>
[[gnu::noinline]] void weight_tile_avx2(const float* const (&dy)[kO], const float* const (&xs)[kK], const Block& b,
                                        float* sums) {
  __m256 acc[kO][kK];
#pragma GCC unroll 8
  for (int r = 0; r < kO; ++r) {
#pragma GCC unroll 8
    for (int k = 0; k < kK; ++k) acc[r][k] = _mm256_load_ps(sums + (r * kK + k) * 8);
  }
  for (int64_t s = 0; s < b.count; ++s) {
    const int64_t dy_at = s * b.dy_stride, x_at = s * b.x_stride;
    for (int64_t q = 0; q < b.len; q += 8) {
      __m256 d[kO];
#pragma GCC unroll 8
      for (int r = 0; r < kO; ++r) d[r] = _mm256_loadu_ps(dy[r] + dy_at + q);
#pragma GCC unroll 8
      for (int k = 0; k < kK; ++k) {
        const __m256 xv = _mm256_loadu_ps(xs[k] + x_at + q);
#pragma GCC unroll 8
        for (int r = 0; r < kO; ++r) acc[r][k] = _mm256_fmadd_ps(d[r], xv, acc[r][k]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kO; ++r) {
#pragma GCC unroll 8
    for (int k = 0; k < kK; ++k) _mm256_store_ps(sums + (r * kK + k) * 8, acc[r][k]);
  }
}

template <int kO, int kK>
[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void weight_tile_avx512(const float* const (&dy)[kO],
                                                                 const float* const (&xs)[kK], const Block& b,
                                                                 float* sums) {
  __m512 acc[kO][kK];
  load_partials(acc, sums);
  for (int64_t s = 0; s < b.count; ++s) {
    const int64_t dy_at = s * b.dy_stride, x_at = s * b.x_stride;
    for (int64_t q = 0; q < b.len; q += 16) {
      __m512 d[kO];
#pragma GCC unroll 8
      for (int r = 0; r < kO; ++r) d[r] = _mm512_loadu_ps(dy[r] + dy_at + q);
#pragma GCC unroll 8
      for (int k = 0; k < kK; ++k) {
        const __m512 xv = _mm512_loadu_ps(xs[k] + x_at + q);
#pragma GCC unroll 8
        for (int r = 0; r < kO; ++r) acc[r][k] = _mm512_fmadd_ps(d[r], xv, acc[r][k]);
      }
    }
  }
  store_partials(acc, sums);
}

template <int kO, int kK>
[[AMPGRAD_AVX512_BF16_TARGET, gnu::noinline]] void weight_tile_avx512_bf16(const BFloat16* const (&dy)[kO],
                                                                           const BFloat16* const (&xs)[kK],
                                                                           const Block& b, float* sums) {
  __m512 acc[kO][kK];
  load_partials(acc, sums);
  for (int64_t s = 0; s < b.count; ++s) {
    const int64_t dy_at = s * b.dy_stride, x_at = s * b.x_stride;
    for (int64_t q = 0; q < b.len; q += 32) {
      __m512bh d[kO];
#pragma GCC unroll 8
      for (int r = 0; r < kO; ++r) d[r] = (__m512bh)_mm512_loadu_si512(dy[r] + dy_at + q);
#pragma GCC unroll 8
      for (int k = 0; k < kK; ++k) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xs[k] + x_at + q);
#pragma GCC unroll 8
        for (int r = 0; r < kO; ++r) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], d[r], xv);
      }
    }
  }
  store_partials(acc, sums);
}

template <int kO, int kK, int kLanes, typename T, typename Tile>
void run_weight_grad(const T* x, const T* dy, int64_t batch, Plan p, double* total, Tile&& tile_fn) {
  p.padded_h = p.height + 2 * p.pad_h;
  p.padded_w = padded_width(p);
  const int64_t plane = p.padded_h * p.padded_w, per_sample = p.channels * plane;
  // The grid in blocks of about `most` positions (rounded up to 32), as even as they come: as many
  // as keep every channel's windows of a block within kWindowBudget (they stay in L2 while every
  // tile passes over them), from 2 KB to 8 KB of each row. Longer blocks send each tile's partial
  // sums to memory less often (BF16 ResNet stage 123 -> 118 ms from 2 KB to 8 KB rows).
  const int64_t most = std::clamp<int64_t>(kWindowBudget / (p.channels * static_cast<int64_t>(sizeof(T))),
                                           2048 / sizeof(T), 8192 / sizeof(T));
  const int64_t grid = p.out_h * p.padded_w, blocks = (grid + most - 1) / most;
  const int64_t len = ((grid + blocks - 1) / blocks + 31) / 32 * 32, grid_len = blocks * len;
  // Small planes: a block runs over a group of samples, up to `most` positions in all. (A group
  // has more than one sample only when the grid is one block, so a lane adds its products in
  // sample, then position order, whatever the block.)
  const int64_t group = std::max<int64_t>(1, most / grid_len);
  const int64_t taps = p.channels * p.kh * p.kw;
  // Past the last sample's last plane, its last block's windows reach grid_len - grid + kw - 1.
  const int64_t slack = grid_len - grid + p.kw + 32;
  const int64_t chunk = std::clamp<int64_t>(padded_budget() / std::max<int64_t>(per_sample + p.out_c * grid_len, 1), 1,
                                            std::max<int64_t>(batch, 1));
  const int64_t held = std::min(chunk, batch);
  Tensor padded_block = Tensor::empty({held * per_sample + slack}, kDTypeOf<T>, Device::kCPU);
  Tensor grid_block = Tensor::empty({(held + group) * p.out_c * grid_len}, kDTypeOf<T>, Device::kCPU);
  T* const padded = padded_block.data<T>();
  T* const dyg = grid_block.data<T>();
  // Zeros for the tiles' missing rows (channels past O, if O is not a multiple of kO), as long as a
  // group's reads.
  T* const zero_rows = dyg + held * p.out_c * grid_len;
  if (p.out_c % kO != 0) std::fill(zero_rows, zero_rows + group * p.out_c * grid_len, T{});
  // Each tap's offset in a sample's padded copy: c plane + i Wp + j.
  std::vector<int64_t> offset(static_cast<size_t>(taps));
  for (int64_t t = 0; t < taps; ++t) {
    offset[static_cast<size_t>(t)] = (t / (p.kh * p.kw)) * plane + ((t / p.kw) % p.kh) * p.padded_w + t % p.kw;
  }
  const int64_t o_tiles = (p.out_c + kO - 1) / kO, k_tiles = (taps + kK - 1) / kK;
  // Each tile's kO x kK vectors of partial sums, kept over every sample and block (a tile's lanes
  // are summed once, at the end: after every block that cost more than the products), for a band
  // of output-channel tiles at a time. Each lane adds its products in sample, then block order,
  // whatever the chunks and bands, so neither changes a bit.
  constexpr int64_t kTileFloats = kO * kK * kLanes;
  const int64_t band = std::clamp<int64_t>(partial_budget() / (k_tiles * kTileFloats), 1, o_tiles);
  Tensor partial_block = Tensor::empty({band * k_tiles * kTileFloats + 16}, DType::kFloat32, Device::kCPU);
  float* const partial = align_64(partial_block.data<float>());
  for (int64_t band0 = 0; band0 < o_tiles; band0 += band) {
    const int64_t band_items = (std::min(o_tiles, band0 + band) - band0) * k_tiles;
    std::fill(partial, partial + band_items * kTileFloats, 0.0f);
    for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
      const int64_t n = std::min(chunk, batch - n0);
      pad_samples<false>(x, n0, n, p, padded);
      std::fill(padded + n * per_sample, padded + n * per_sample + slack, T{});
      // dy on the grid: each output row, then zeros for the dropped columns; zeros past the grid.
      parallel_range(n * p.out_c, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t item = lo; item < hi; ++item) {
          const T* src = dy + (n0 * p.out_c + item) * p.out_h * p.out_w;
          T* dst = dyg + item * grid_len;
          for (int64_t oh = 0; oh < p.out_h; ++oh) {
            std::memcpy(dst + oh * p.padded_w, src + oh * p.out_w, static_cast<size_t>(p.out_w) * sizeof(T));
            std::fill(dst + oh * p.padded_w + p.out_w, dst + (oh + 1) * p.padded_w, T{});
          }
          std::fill(dst + grid, dst + grid_len, T{});
        }
      });
      for (int64_t s0 = 0; s0 < n; s0 += group) {
        const Block block{.len = len, .count = std::min(group, n - s0), .dy_stride = p.out_c * grid_len,
                          .x_stride = per_sample};
        for (int64_t b = 0; b < blocks; ++b) {
          const T* x_block = padded + s0 * per_sample + b * len;
          const T* dy_block = dyg + s0 * p.out_c * grid_len + b * len;
          parallel_range(band_items, 1, [&](int64_t lo, int64_t hi) {
            for (int64_t item = lo; item < hi; ++item) {
              const int64_t o0 = (band0 + item / k_tiles) * kO, t0 = (item % k_tiles) * kK;
              const T* dy_rows[kO];
              const T* windows[kK];
              for (int r = 0; r < kO; ++r) dy_rows[r] = o0 + r < p.out_c ? dy_block + (o0 + r) * grid_len : zero_rows;
              for (int k = 0; k < kK; ++k) {
                windows[k] = t0 + k < taps ? x_block + offset[static_cast<size_t>(t0 + k)] : x_block;  // sums dropped
              }
              tile_fn(dy_rows, windows, block, partial + item * kTileFloats);
            }
          });
        }
      }
    }
    for (int64_t item = 0; item < band_items; ++item) {
      const int64_t o0 = (band0 + item / k_tiles) * kO, t0 = (item % k_tiles) * kK;
      for (int r = 0; r < kO && o0 + r < p.out_c; ++r) {
        for (int k = 0; k < kK && t0 + k < taps; ++k) {
          const float* lanes = partial + item * kTileFloats + (r * kK + k) * kLanes;
          double sum = 0;
          for (int l = 0; l < kLanes; ++l) sum += lanes[l];
          total[(o0 + r) * taps + t0 + k] = sum;
        }
      }
    }
  }
}

template <typename T>
void weight_grad(const T* x, const T* dy, int64_t batch, const Plan& p, double* total) {
  const DirectConvRoute route = route_for_testing.load();
  if constexpr (std::is_same_v<T, float>) {
    if (effective_cpu_isa() >= CpuIsa::kAvx512 && route != DirectConvRoute::kGrid &&
        (route == DirectConvRoute::kChannels || channel_weight_tiles_pay(p))) {
      weight_grad_in_channel_tiles(x, dy, batch, p, total);
    } else if (effective_cpu_isa() >= CpuIsa::kAvx512) {
      run_weight_grad<4, 6, 16>(x, dy, batch, p, total, [](const float* const(&d)[4], const float* const(&w)[6],
                                                           const Block& b, float* sums) {
        weight_tile_avx512<4, 6>(d, w, b, sums);
      });
    } else {
      run_weight_grad<2, 5, 8>(x, dy, batch, p, total, [](const float* const(&d)[2], const float* const(&w)[5],
                                                          const Block& b, float* sums) {
        weight_tile_avx2<2, 5>(d, w, b, sums);
      });
    }
  } else if (route != DirectConvRoute::kGrid && (route == DirectConvRoute::kChannels || channel_weight_tiles_pay(p))) {
    weight_grad_in_channel_tiles(x, dy, batch, p, total);
  } else {
    run_weight_grad<4, 6, 16>(x, dy, batch, p, total, [](const BFloat16* const(&d)[4], const BFloat16* const(&w)[6],
                                                         const Block& b, float* sums) {
      weight_tile_avx512_bf16<4, 6>(d, w, b, sums);
    });
  }
}

// Calls fn(T{}) for the dtypes the direct kernels take.
template <typename Fn>
void visit_direct_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::kBFloat16) return fn(BFloat16{});
  AG_CHECK(dtype == DType::kFloat32, "conv2d: the direct kernel takes float32 or bfloat16, not ", dtype_name(dtype));
  fn(float{});
}

}  // namespace
}  // namespace direct

using direct::Plan;

bool direct_conv2d_applies(const Tensor& x, const Tensor& w, const ConvGeometry& g, int64_t groups) {
  const bool dtype_ok = x.dtype() == DType::kFloat32 ||
                        (x.dtype() == DType::kBFloat16 && effective_cpu_isa() >= CpuIsa::kAvx512Bf16);
  return dtype_ok && groups == 1 && g.stride_h == 1 && g.stride_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 &&
         w.size(2) * w.size(3) > 1 && g.pad_h < g.kh && g.pad_w < g.kw;
}

void direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  const Plan p{.channels = x.size(1), .height = x.size(2), .width = x.size(3), .out_c = w.size(0), .kh = g.kh,
               .kw = g.kw, .pad_h = g.pad_h, .pad_w = g.pad_w, .out_h = g.out_h, .out_w = g.out_w};
  direct::visit_direct_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    direct::convolve<T>(x.data<T>(), w.data<T>(), b.defined() ? b.data<T>() : nullptr, x.size(0), p, y.data<T>());
  });
}

void set_direct_conv_route_for_testing(DirectConvRoute route) { direct::route_for_testing.store(route); }

void set_direct_conv_budgets_for_testing(int64_t padded_values, int64_t partial_floats) {
  direct::padded_budget_for_testing.store(padded_values);
  direct::partial_budget_for_testing.store(partial_floats);
}

void direct_conv2d_input_grad(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx) {
  AG_CHECK(dy.dtype() == w.dtype() && dx.dtype() == w.dtype(), "conv2d backward: dy is ", dtype_name(dy.dtype()),
           ", the weight ", dtype_name(w.dtype()), " and dx ", dtype_name(dx.dtype()), "; the direct kernel takes one dtype");
  // dx[s, c, y, x] = sum over (o, i, j) of dy[s, o, y + pad_h - i, x + pad_w - j] w[o, c, i, j]: the
  // stride-1 convolution of dy, padded by kh - 1 - pad_h (and kw - 1 - pad_w), with the filters
  // transposed to [C, O] and turned half a turn.
  const int64_t out_c = w.size(0), in_c = w.size(1), kh = g.kh, kw = g.kw;
  const Plan p{.channels = out_c, .height = g.out_h, .width = g.out_w, .out_c = in_c, .kh = kh, .kw = kw,
               .pad_h = kh - 1 - g.pad_h, .pad_w = kw - 1 - g.pad_w, .out_h = dx.size(2), .out_w = dx.size(3)};
  direct::visit_direct_dtype(dy.dtype(), [&](auto t) {
    using T = decltype(t);
    std::vector<T> turned(static_cast<size_t>(w.numel()));
    const T* src = w.data<T>();
    for (int64_t o = 0; o < out_c; ++o) {
      for (int64_t c = 0; c < in_c; ++c) {
        for (int64_t i = 0; i < kh; ++i) {
          for (int64_t j = 0; j < kw; ++j) {
            turned[static_cast<size_t>(((c * out_c + o) * kh + (kh - 1 - i)) * kw + (kw - 1 - j))] =
                src[((o * in_c + c) * kh + i) * kw + j];
          }
        }
      }
    }
    direct::convolve<T>(dy.data<T>(), turned.data(), nullptr, dy.size(0), p, dx.data<T>());
  });
}

bool direct_conv2d_weight_grad(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw) {
  AG_CHECK(dy.dtype() == x.dtype() && dw.dtype() == x.dtype(), "conv2d backward: dy is ", dtype_name(dy.dtype()),
           ", x ", dtype_name(x.dtype()), " and dw ", dtype_name(dw.dtype()), "; the direct kernel takes one dtype");
  const Plan p{.channels = x.size(1), .height = x.size(2), .width = x.size(3), .out_c = dw.size(0), .kh = g.kh,
               .kw = g.kw, .pad_h = g.pad_h, .pad_w = g.pad_w, .out_h = g.out_h, .out_w = g.out_w};
  std::vector<double> total(static_cast<size_t>(dw.numel()), 0.0);
  direct::visit_direct_dtype(x.dtype(), [&](auto t) {
    using T = decltype(t);
    direct::weight_grad<T>(x.data<T>(), dy.data<T>(), x.size(0), p, total.data());
    T* out = dw.data<T>();
    for (size_t k = 0; k < total.size(); ++k) out[k] = convert<T>(total[k]);
  });
  return std::none_of(total.begin(), total.end(), [](double v) { return std::isnan(v); });
}

#else  // no AVX2/FMA build: the im2col route serves every convolution

bool direct_conv2d_applies(const Tensor&, const Tensor&, const ConvGeometry&, int64_t) { return false; }
void direct_conv2d(const Tensor&, const Tensor&, const Tensor&, const ConvGeometry&, Tensor&) {
  AG_CHECK(false, "conv2d: the direct kernel needs an AVX2/FMA build");
}
void direct_conv2d_input_grad(const Tensor&, const Tensor&, const ConvGeometry&, Tensor&) {
  AG_CHECK(false, "conv2d: the direct kernel needs an AVX2/FMA build");
}
bool direct_conv2d_weight_grad(const Tensor&, const Tensor&, const ConvGeometry&, Tensor&) {
  AG_CHECK(false, "conv2d: the direct kernel needs an AVX2/FMA build");
  return false;
}
void set_direct_conv_budgets_for_testing(int64_t, int64_t) {}
void set_direct_conv_route_for_testing(DirectConvRoute) {}

#endif

}  // namespace ampgrad::kernels::cpu
