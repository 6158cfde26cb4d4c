// Direct stride-1 convolution on the CPU (conv_kernels.h: direct_conv2d). The im2col route writes
// K = C kH kW columns per output pixel, packs them again for the GEMM and transposes the result
// into [N, O, Ho, Wo]; at a ResNet stage's 3x3 shape that costs as much as the arithmetic. Here a
// register tile of output channels x a run of output positions sums over (c, i, j), reading x
// straight from a zero-padded copy [C, Hp, Wp]. The positions run over the padded-width grid
// q = oh Wp + ow: tap (i, j) of position q is element q + i Wp + j of a padded channel plane, so a
// run of positions is a run of the plane even across output rows (its columns ow >= Wo are
// computed and dropped: 2 of every 16 at 14 x 14, where whole-row tiles would drop 18 of 32).
//   AVX2/FMA  6 x 16: 12 ymm accumulators (the GEMM's tile);
//   AVX-512   8 x 32: 16 zmm accumulators, compiled for its own target and run where
//             effective_cpu_isa() allows.
// Each output is 0, then one FMA per (c, i, j) in order, then + b: the bits of the im2col GEMM
// route (the GEMM makes the same chain), so the two routes agree exactly.
#include <algorithm>
#include <cstring>
#include <vector>

#include "framework/cpu_features.h"
#include "framework/parallel.h"
#include "ops/conv/conv_kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AMPGRAD_DIRECT_CONV 1
#endif

namespace ampgrad::kernels::cpu {

#ifdef AMPGRAD_DIRECT_CONV

namespace {

// How many padded input floats one chunk of samples copies at most (32 MB): the copy is a
// transient beside x, bounded whatever the batch.
constexpr int64_t kPaddedBudget = int64_t{1} << 23;

// The geometry of one call: x [n, C, H, W] read through its padded copy [n, C, Hp, Wp].
struct Plan {
  int64_t channels, height, width, out_c, kh, kw, pad_h, pad_w, out_h, out_w;
  int64_t padded_h, padded_w;
};

// w [O, C, kh, kw] as blocks of kRows output channels: wp[ob][c][i][j][r] = w[ob kRows + r, c, i, j]
// (0 past O), the kRows values one (c, i, j) step broadcasts, side by side.
template <int kRows>
std::vector<float> pack_weights(const float* w, const Plan& p) {
  const int64_t blocks = (p.out_c + kRows - 1) / kRows, taps = p.channels * p.kh * p.kw;
  std::vector<float> packed(static_cast<size_t>(blocks * taps * kRows), 0.0f);
  for (int64_t o = 0; o < p.out_c; ++o) {
    for (int64_t t = 0; t < taps; ++t) packed[static_cast<size_t>(((o / kRows) * taps + t) * kRows + o % kRows)] = w[o * taps + t];
  }
  return packed;
}

// Samples [n0, n0 + n) of x into the zero-padded copy.
void pad_samples(const float* x, int64_t n0, int64_t n, const Plan& p, float* padded) {
  const int64_t plane = p.padded_h * p.padded_w;
  parallel_range(n * p.channels, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(plane, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t item = lo; item < hi; ++item) {
                     const float* src = x + (n0 * p.channels + item) * p.height * p.width;
                     float* dst = padded + item * plane;
                     std::fill(dst, dst + p.pad_h * p.padded_w, 0.0f);
                     for (int64_t r = 0; r < p.height; ++r) {
                       float* row = dst + (p.pad_h + r) * p.padded_w;
                       std::fill(row, row + p.pad_w, 0.0f);
                       std::memcpy(row + p.pad_w, src + r * p.width, static_cast<size_t>(p.width) * sizeof(float));
                       std::fill(row + p.pad_w + p.width, row + p.padded_w, 0.0f);
                     }
                     std::fill(dst + (p.pad_h + p.height) * p.padded_w, dst + plane, 0.0f);
                   }
                 });
}

// The tile's sums leave through a small buffer: of grid positions q0 .. q0 + kCols - 1, those with
// ow < Wo go to y (plus b) for the block's valid channels.
template <int kRows, int kCols>
void write_tile(const float (&tile)[kRows][kCols], const float* bias, int64_t o0, int64_t q0, const Plan& p,
                float* y_sample) {
  const int64_t rows = std::min<int64_t>(kRows, p.out_c - o0), plane = p.out_h * p.out_w;
  const int64_t end = std::min(q0 + kCols, p.out_h * p.padded_w);
  for (int64_t q = q0; q < end;) {
    const int64_t oh = q / p.padded_w, ow = q % p.padded_w, row_end = (oh + 1) * p.padded_w;
    const int64_t valid = std::min({row_end, oh * p.padded_w + p.out_w, end}) - q;
    for (int64_t r = 0; valid > 0 && r < rows; ++r) {
      const float* sums = tile[r] + (q - q0);
      float* out = y_sample + (o0 + r) * plane + oh * p.out_w + ow;
      if (bias == nullptr) {
        std::memcpy(out, sums, static_cast<size_t>(valid) * sizeof(float));
      } else {
        const float add = bias[o0 + r];
        for (int64_t c = 0; c < valid; ++c) out[c] = sums[c] + add;
      }
    }
    q = std::min(row_end, end);
  }
}

// One kRows x 16 tile: channels o0.., grid positions q0..; `in` is the sample's padded copy from
// element q0 of its first plane, and `wp` the packed block of o0.
[[gnu::noinline]] void tile_avx2(const float* in, const float* wp, const Plan& p, float (&tile)[6][16]) {
  constexpr int kRows = 6;
  __m256 acc[kRows][2];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.channels; ++c) {
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
    _mm256_storeu_ps(tile[r], acc[r][0]);
    _mm256_storeu_ps(tile[r] + 8, acc[r][1]);
  }
}

#define AMPGRAD_AVX512_TARGET gnu::target("avx512f,avx512bw,avx512vl,avx512dq,fma")

[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void tile_avx512(const float* in, const float* wp, const Plan& p,
                                                          float (&tile)[8][32]) {
  constexpr int kRows = 8;
  __m512 acc[kRows][2];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const int64_t plane = p.padded_h * p.padded_w;
  for (int64_t c = 0; c < p.channels; ++c) {
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
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    _mm512_storeu_ps(tile[r], acc[r][0]);
    _mm512_storeu_ps(tile[r] + 16, acc[r][1]);
  }
}

// y = conv(x, w) + b over every sample, with the tile of kRows x kCols that tile_fn computes.
template <int kRows, int kCols, typename Tile>
void run(const float* x, const float* w, const float* bias, int64_t batch, Plan p, float* y, Tile&& tile_fn) {
  p.padded_h = p.height + 2 * p.pad_h;
  p.padded_w = p.width + 2 * p.pad_w;
  const std::vector<float> wp = pack_weights<kRows>(w, p);
  const int64_t blocks = (p.out_c + kRows - 1) / kRows, block_floats = p.channels * p.kh * p.kw * kRows;
  const int64_t per_sample = p.channels * p.padded_h * p.padded_w;
  const int64_t grid = p.out_h * p.padded_w, tiles = (grid + kCols - 1) / kCols;
  // The last sample's last tile reads up to kCols + kw past its last plane (positions past the grid).
  const int64_t slack = 2 * kCols + p.kw;
  const int64_t chunk = std::clamp<int64_t>(kPaddedBudget / std::max<int64_t>(per_sample, 1), 1, std::max<int64_t>(batch, 1));
  // From the caching allocator: a step's convolutions reuse one another's blocks.
  Tensor padded_block = Tensor::empty({std::min(chunk, batch) * per_sample + slack}, DType::kFloat32, Device::kCPU);
  float* const padded = padded_block.data<float>();
  // An item is a few tiles of one sample (about 256 positions): every block of output channels
  // runs over them, its packed weights staying in L1.
  const int64_t tiles_per_item = std::max<int64_t>(1, 256 / kCols), items_per_sample = (tiles + tiles_per_item - 1) / tiles_per_item;
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t n = std::min(chunk, batch - n0);
    pad_samples(x, n0, n, p, padded);
    std::fill(padded + n * per_sample, padded + n * per_sample + slack, 0.0f);
    parallel_range(n * items_per_sample, 1, [&](int64_t lo, int64_t hi) {
      float tile[kRows][kCols];
      for (int64_t item = lo; item < hi; ++item) {
        const int64_t s = item / items_per_sample, t0 = (item % items_per_sample) * tiles_per_item;
        const int64_t t1 = std::min(tiles, t0 + tiles_per_item);
        const float* in = padded + s * per_sample;
        float* y_sample = y + (n0 + s) * p.out_c * p.out_h * p.out_w;
        for (int64_t ob = 0; ob < blocks; ++ob) {
          for (int64_t t = t0; t < t1; ++t) {
            tile_fn(in + t * kCols, wp.data() + ob * block_floats, p, tile);
            write_tile(tile, bias, ob * kRows, t * kCols, p, y_sample);
          }
        }
      }
    });
  }
}

// Stride-1 convolution of x [batch, C, H, W] by w [O, C, kh, kw] with padding (pad_h, pad_w).
void convolve(const float* x, const float* w, const float* bias, int64_t batch, const Plan& p, float* y) {
  if (effective_cpu_isa() >= CpuIsa::kAvx512) {
    run<8, 32>(x, w, bias, batch, p, y, [](const float* in, const float* wp, const Plan& q, float(&t)[8][32]) {
      tile_avx512(in, wp, q, t);
    });
  } else {
    run<6, 16>(x, w, bias, batch, p, y, [](const float* in, const float* wp, const Plan& q, float(&t)[6][16]) {
      tile_avx2(in, wp, q, t);
    });
  }
}

// ---- The weight gradient ----------------------------------------------------------------------
// dw[o, (c, i, j)] = sum over samples and grid positions q of dyg[o, q] xp[c, q + i Wp + j], where
// dyg is dy on the padded-width grid with zeros at the dropped columns (ow >= Wo) and past the
// grid: a GEMM whose long reduction runs over q. A tile of kO output channels x kK taps keeps one
// vector of partial sums per pair over a block of about 512 positions of a group of samples (dy
// rows and x windows of the block stay in L2 while every tile passes over them), then adds its sums
// to a double total.
struct Block {
  int64_t len;        // positions per sample, a multiple of 16
  int64_t count;      // samples
  int64_t dy_stride;  // from one sample's dy rows to the next's
  int64_t x_stride;   // from one sample's padded copy to the next's
};

template <int kO, int kK>
[[gnu::noinline]] void weight_tile_avx2(const float* const (&dy)[kO], const float* const (&xs)[kK], const Block& b,
                                        float (&sums)[kO][kK]) {
  __m256 acc[kO][kK];
#pragma GCC unroll 8
  for (int r = 0; r < kO; ++r) {
#pragma GCC unroll 8
    for (int k = 0; k < kK; ++k) acc[r][k] = _mm256_setzero_ps();
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
  for (int r = 0; r < kO; ++r) {
    for (int k = 0; k < kK; ++k) {
      const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc[r][k]), _mm256_extractf128_ps(acc[r][k], 1));
      const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
      sums[r][k] = _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
    }
  }
}

template <int kO, int kK>
[[AMPGRAD_AVX512_TARGET, gnu::noinline]] void weight_tile_avx512(const float* const (&dy)[kO],
                                                                 const float* const (&xs)[kK], const Block& b,
                                                                 float (&sums)[kO][kK]) {
  __m512 acc[kO][kK];
#pragma GCC unroll 8
  for (int r = 0; r < kO; ++r) {
#pragma GCC unroll 8
    for (int k = 0; k < kK; ++k) acc[r][k] = _mm512_setzero_ps();
  }
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
  for (int r = 0; r < kO; ++r) {
    for (int k = 0; k < kK; ++k) sums[r][k] = _mm512_reduce_add_ps(acc[r][k]);
  }
}

template <int kO, int kK, typename Tile>
void run_weight_grad(const float* x, const float* dy, int64_t batch, Plan p, double* total, Tile&& tile_fn) {
  p.padded_h = p.height + 2 * p.pad_h;
  p.padded_w = p.width + 2 * p.pad_w;
  const int64_t plane = p.padded_h * p.padded_w, per_sample = p.channels * plane;
  // The grid in blocks of about 512 positions (a multiple of 16), as even as they come.
  const int64_t grid = p.out_h * p.padded_w, blocks = (grid + 511) / 512;
  const int64_t len = ((grid + blocks - 1) / blocks + 15) / 16 * 16, grid_len = blocks * len;
  // Small planes: a block runs over a group of samples, so the sums are reduced every ~1024 positions.
  const int64_t group = std::max<int64_t>(1, 1024 / grid_len);
  const int64_t taps = p.channels * p.kh * p.kw;
  // Past the last sample's last plane, its last block's windows reach grid_len - grid + kw - 1.
  const int64_t slack = grid_len - grid + p.kw + 16;
  const int64_t chunk = std::clamp<int64_t>(kPaddedBudget / std::max<int64_t>(per_sample + p.out_c * grid_len, 1), 1,
                                            std::max<int64_t>(batch, 1));
  const int64_t held = std::min(chunk, batch);
  Tensor padded_block = Tensor::empty({held * per_sample + slack}, DType::kFloat32, Device::kCPU);
  Tensor grid_block = Tensor::empty({held * p.out_c * grid_len + group * p.out_c * grid_len}, DType::kFloat32,
                                    Device::kCPU);
  float* const padded = padded_block.data<float>();
  float* const dyg = grid_block.data<float>();
  // Zeros for the tiles' missing rows (channels past O, taps past K), as long as a group's reads.
  float* const zeros = dyg + held * p.out_c * grid_len;
  std::fill(zeros, zeros + group * p.out_c * grid_len, 0.0f);
  // Each tap's offset in a sample's padded copy: c plane + i Wp + j.
  std::vector<int64_t> offset(static_cast<size_t>(taps));
  for (int64_t t = 0; t < taps; ++t) {
    offset[static_cast<size_t>(t)] = (t / (p.kh * p.kw)) * plane + ((t / p.kw) % p.kh) * p.padded_w + t % p.kw;
  }
  const int64_t o_tiles = (p.out_c + kO - 1) / kO, k_tiles = (taps + kK - 1) / kK;
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t n = std::min(chunk, batch - n0);
    pad_samples(x, n0, n, p, padded);
    std::fill(padded + n * per_sample, padded + n * per_sample + slack, 0.0f);
    // dy on the grid: each output row, then zeros for the dropped columns; zeros past the grid.
    parallel_range(n * p.out_c, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t item = lo; item < hi; ++item) {
        const float* src = dy + (n0 * p.out_c + item) * p.out_h * p.out_w;
        float* dst = dyg + item * grid_len;
        for (int64_t oh = 0; oh < p.out_h; ++oh) {
          std::memcpy(dst + oh * p.padded_w, src + oh * p.out_w, static_cast<size_t>(p.out_w) * sizeof(float));
          std::fill(dst + oh * p.padded_w + p.out_w, dst + (oh + 1) * p.padded_w, 0.0f);
        }
        std::fill(dst + grid, dst + grid_len, 0.0f);
      }
    });
    for (int64_t s0 = 0; s0 < n; s0 += group) {
      const Block block{.len = len, .count = std::min(group, n - s0), .dy_stride = p.out_c * grid_len, .x_stride = per_sample};
      for (int64_t b = 0; b < blocks; ++b) {
        const float* x_block = padded + s0 * per_sample + b * len;
        const float* dy_block = dyg + s0 * p.out_c * grid_len + b * len;
        parallel_range(o_tiles * k_tiles, 1, [&](int64_t lo, int64_t hi) {
          float sums[kO][kK];
          for (int64_t item = lo; item < hi; ++item) {
            const int64_t o0 = (item / k_tiles) * kO, t0 = (item % k_tiles) * kK;
            const float* dy_rows[kO];
            const float* windows[kK];
            for (int r = 0; r < kO; ++r) dy_rows[r] = o0 + r < p.out_c ? dy_block + (o0 + r) * grid_len : zeros;
            for (int k = 0; k < kK; ++k) {
              windows[k] = t0 + k < taps ? x_block + offset[static_cast<size_t>(t0 + k)] : x_block;  // times zero rows
            }
            tile_fn(dy_rows, windows, block, sums);
            for (int r = 0; r < kO && o0 + r < p.out_c; ++r) {
              for (int k = 0; k < kK && t0 + k < taps; ++k) total[(o0 + r) * taps + t0 + k] += static_cast<double>(sums[r][k]);
            }
          }
        });
      }
    }
  }
}

}  // namespace

bool direct_conv2d_applies(const Tensor& x, const Tensor& w, const ConvGeometry& g, int64_t groups) {
  return x.dtype() == DType::kFloat32 && groups == 1 && g.stride_h == 1 && g.stride_w == 1 && g.dilation_h == 1 &&
         g.dilation_w == 1 && w.size(2) * w.size(3) > 1 && g.pad_h < g.kh && g.pad_w < g.kw;
}

void direct_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvGeometry& g, Tensor& y) {
  const Plan p{.channels = x.size(1), .height = x.size(2), .width = x.size(3), .out_c = w.size(0), .kh = g.kh,
               .kw = g.kw, .pad_h = g.pad_h, .pad_w = g.pad_w, .out_h = g.out_h, .out_w = g.out_w,
               .padded_h = 0, .padded_w = 0};
  convolve(x.data<float>(), w.data<float>(), b.defined() ? b.data<float>() : nullptr, x.size(0), p, y.data<float>());
}

void direct_conv2d_input_grad(const Tensor& dy, const Tensor& w, const ConvGeometry& g, Tensor& dx) {
  // dx[s, c, y, x] = sum over (o, i, j) of dy[s, o, y + pad_h - i, x + pad_w - j] w[o, c, i, j]: the
  // stride-1 convolution of dy, padded by kh - 1 - pad_h (and kw - 1 - pad_w), with the filters
  // transposed to [C, O] and turned half a turn.
  const int64_t out_c = w.size(0), in_c = w.size(1), kh = g.kh, kw = g.kw;
  std::vector<float> turned(static_cast<size_t>(w.numel()));
  const float* src = w.data<float>();
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
  const Plan p{.channels = out_c, .height = g.out_h, .width = g.out_w, .out_c = in_c, .kh = kh, .kw = kw,
               .pad_h = kh - 1 - g.pad_h, .pad_w = kw - 1 - g.pad_w, .out_h = dx.size(2), .out_w = dx.size(3),
               .padded_h = 0, .padded_w = 0};
  convolve(dy.data<float>(), turned.data(), nullptr, dy.size(0), p, dx.data<float>());
}

void direct_conv2d_weight_grad(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw) {
  const Plan p{.channels = x.size(1), .height = x.size(2), .width = x.size(3), .out_c = dw.size(0), .kh = g.kh,
               .kw = g.kw, .pad_h = g.pad_h, .pad_w = g.pad_w, .out_h = g.out_h, .out_w = g.out_w,
               .padded_h = 0, .padded_w = 0};
  std::vector<double> total(static_cast<size_t>(dw.numel()), 0.0);
  if (effective_cpu_isa() >= CpuIsa::kAvx512) {
    run_weight_grad<4, 6>(x.data<float>(), dy.data<float>(), x.size(0), p, total.data(),
                          [](const float* const(&d)[4], const float* const(&w)[6], const Block& b,
                             float(&out)[4][6]) { weight_tile_avx512<4, 6>(d, w, b, out); });
  } else {
    run_weight_grad<2, 5>(x.data<float>(), dy.data<float>(), x.size(0), p, total.data(),
                          [](const float* const(&d)[2], const float* const(&w)[5], const Block& b,
                             float(&out)[2][5]) { weight_tile_avx2<2, 5>(d, w, b, out); });
  }
  float* out = dw.data<float>();
  for (size_t k = 0; k < total.size(); ++k) out[k] = static_cast<float>(total[k]);
}

#else  // no AVX2/FMA build: the im2col route serves every convolution

bool direct_conv2d_applies(const Tensor&, const Tensor&, const ConvGeometry&, int64_t) { return false; }
void direct_conv2d(const Tensor&, const Tensor&, const Tensor&, const ConvGeometry&, Tensor&) {
  AG_CHECK(false, "conv2d: the direct kernel needs an AVX2/FMA build");
}
void direct_conv2d_input_grad(const Tensor&, const Tensor&, const ConvGeometry&, Tensor&) {
  AG_CHECK(false, "conv2d: the direct kernel needs an AVX2/FMA build");
}
void direct_conv2d_weight_grad(const Tensor&, const Tensor&, const ConvGeometry&, Tensor&) {
  AG_CHECK(false, "conv2d: the direct kernel needs an AVX2/FMA build");
}

#endif

}  // namespace ampgrad::kernels::cpu
