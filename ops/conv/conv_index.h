// The index math of the CUDA convolution moves (conv_cuda.cu), for the device and the host: each
// maps an output element to what it reads, dividing by divisors fixed at launch (FastDivmod, or
// WideDivmod past 2^31). conv_index_test runs the maps on the host against the CPU kernels.
#pragma once

#include <atomic>
#include <cstdint>

#include "framework/device.h"
#include "framework/fast_divmod.h"
#include "ops/conv/conv_kernels.h"

namespace ampgrad::kernels {

/// For tests, process-wide: the CUDA moves take the 64-bit maps (WideDivmod) at every size, so
/// that their path runs on small tensors too.
inline std::atomic<bool> wide_index_maps_for_testing{false};

/// Where im2col's element k of cols [C kh kw, n, Ho Wo] reads x [N, C, H, W] (samples from n0):
/// its offset in x, or -1 where the tap falls in the padding.
template <typename Div>
struct Im2colIndex {
  using Index = typename Div::Index;
  Div out_w, out_h, samples, kw, kh;
  int64_t n0, channels, height, width;
  ConvGeometry g;

  Im2colIndex(int64_t n0, int64_t samples, int64_t channels, int64_t height, int64_t width, const ConvGeometry& g)
      : out_w(g.out_w), out_h(g.out_h), samples(samples), kw(g.kw), kh(g.kh), n0(n0), channels(channels),
        height(height), width(width), g(g) {}

  AG_HOST_DEVICE int64_t source(Index k) const {
    const auto [k1, ow] = out_w.divmod(k);
    const auto [k2, oh] = out_h.divmod(k1);
    const auto [row, s] = samples.divmod(k2);
    const auto [row1, j] = kw.divmod(row);
    const auto [c, i] = kh.divmod(row1);
    const int64_t h = int64_t{oh} * g.stride_h - g.pad_h + int64_t{i} * g.dilation_h;
    const int64_t w = int64_t{ow} * g.stride_w - g.pad_w + int64_t{j} * g.dilation_w;
    if (h < 0 || h >= height || w < 0 || w >= width) return -1;
    return (((n0 + s) * channels + c) * height + h) * width + w;
  }
};

/// col2im's gather: element k of the chunk's dx [n, C, H, W] sums the cols [C kh kw, n, Ho Wo]
/// entries im2col read from it; for_each_source calls add(offset in cols) for each, taps (i, j) in
/// order, as the CPU's col2im adds them.
template <typename Div>
struct Col2imIndex {
  using Index = typename Div::Index;
  Div width, height, channels, stride_h, stride_w;
  int64_t samples;
  ConvGeometry g;

  Col2imIndex(int64_t samples, int64_t channels, int64_t height, int64_t width, const ConvGeometry& g)
      : width(width), height(height), channels(channels), stride_h(g.stride_h), stride_w(g.stride_w),
        samples(samples), g(g) {}

  template <typename Add>
  AG_HOST_DEVICE void for_each_source(Index k, Add&& add) const {
    const auto [k1, x] = width.divmod(k);
    const auto [k2, y] = height.divmod(k1);
    const auto [s, c] = channels.divmod(k2);
    const int64_t out_len = g.out_h * g.out_w;
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t oh_scaled = int64_t{y} + g.pad_h - i * g.dilation_h;  // oh stride_h, if tap i of row oh reads y
      if (oh_scaled < 0) break;  // and for every later tap
      const auto [oh, oh_rest] = stride_h.divmod(static_cast<Index>(oh_scaled));
      if (oh_rest != 0 || oh >= g.out_h) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t ow_scaled = int64_t{x} + g.pad_w - j * g.dilation_w;
        if (ow_scaled < 0) break;
        const auto [ow, ow_rest] = stride_w.divmod(static_cast<Index>(ow_scaled));
        if (ow_rest != 0 || ow >= g.out_w) continue;
        const int64_t row = (int64_t{c} * g.kh + i) * g.kw + j;
        add((row * samples + s) * out_len + int64_t{oh} * g.out_w + ow);
      }
    }
  }
};

/// samples_from_channels: element k of the chunk's out [n, O, L] reads ct [O, n, L] at the offset
/// returned, and its channel is returned through `channel` (for the bias).
template <typename Div>
struct SamplesFromChannelsIndex {
  using Index = typename Div::Index;
  Div len, channels;
  int64_t samples;

  SamplesFromChannelsIndex(int64_t samples, int64_t channels, int64_t len)
      : len(len), channels(channels), samples(samples) {}

  AG_HOST_DEVICE int64_t source(Index k, int64_t& channel) const {
    const auto [k1, l] = len.divmod(k);
    const auto [s, o] = channels.divmod(k1);
    channel = o;
    return (int64_t{o} * samples + s) * len.divisor + l;
  }
};

/// channels_from_samples: element k of ct [O, n, L] reads y [N, O, L] at the offset returned
/// (samples from n0).
template <typename Div>
struct ChannelsFromSamplesIndex {
  using Index = typename Div::Index;
  Div len, samples;
  int64_t n0, channels;

  ChannelsFromSamplesIndex(int64_t n0, int64_t samples, int64_t channels, int64_t len)
      : len(len), samples(samples), n0(n0), channels(channels) {}

  AG_HOST_DEVICE int64_t source(Index k) const {
    const auto [k1, l] = len.divmod(k);
    const auto [o, s] = samples.divmod(k1);
    return ((n0 + s) * channels + o) * len.divisor + l;
  }
};

}  // namespace ampgrad::kernels
