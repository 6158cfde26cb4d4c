// The CUDA convolution's index math (ops/conv/conv_index.h, framework/fast_divmod.h) run on the
// host against the CPU kernels: the GPU's im2col, col2im and transposes read what the CPU's read.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "framework/error.h"
#include "framework/fast_divmod.h"
#include "framework/tensor.h"
#include "ops/conv/conv_index.h"
#include "ops/conv/conv_kernels.h"

namespace ag = ampgrad;
namespace k = ampgrad::kernels;

namespace {

// Whether FastDivmod(d) gives n / d and n % d (a failure is reported once for each divisor).
bool divides(uint32_t d, uint32_t n) {
  const auto [q, r] = ag::FastDivmod(d).divmod(n);
  EXPECT_EQ(q, n / d) << n << " / " << d;
  EXPECT_EQ(r, n % d) << n << " % " << d;
  return q == n / d && r == n % d;
}

TEST(FastDivmod, MatchesDivisionForEveryDivisorUpTo4096AndLargeOnes) {
  std::mt19937 rng(7);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d : {65535u, 65536u, 65537u, 1000003u, (1u << 30) - 1, 1u << 30, (1u << 30) + 1, 3u << 29,
                     (1u << 31) - 1, 1u << 31}) {
    divisors.push_back(d);
  }
  for (int t = 0; t < 200; ++t) divisors.push_back(1 + rng() % (1u << 31));
  for (const uint32_t d : divisors) {
    // The edges of the first quotients and the last ones below 2^32, where a rounding error would show.
    std::vector<uint32_t> numerators = {0xffffffffu};
    for (uint32_t n = 0; n < 64; ++n) numerators.push_back(n);
    for (uint64_t q : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{0xffffffffu} / d}) {
      for (int64_t delta = -1; delta <= 1; ++delta) {
        const int64_t n = static_cast<int64_t>(q * d) + delta;
        if (n >= 0 && n <= 0xffffffffLL) numerators.push_back(static_cast<uint32_t>(n));
      }
    }
    for (int t = 0; t < 64; ++t) numerators.push_back(static_cast<uint32_t>(rng()));
    for (const uint32_t n : numerators) {
      if (!divides(d, n)) break;
    }
  }
}

TEST(FastDivmod, RejectsDivisorsOutsideItsRange) {
  EXPECT_THROW(ag::FastDivmod(0), ag::Error);
  EXPECT_THROW(ag::FastDivmod((int64_t{1} << 31) + 1), ag::Error);
  EXPECT_THROW(ag::WideDivmod(0), ag::Error);
  EXPECT_TRUE(ag::fits_fast_divmod((int64_t{1} << 31) - 1));
  EXPECT_FALSE(ag::fits_fast_divmod(int64_t{1} << 31));
}

struct Case {
  int64_t batch, channels, height, width, kh, kw, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};

int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

k::ConvGeometry geometry_of(const Case& c) {
  return {.kh = c.kh, .kw = c.kw, .stride_h = c.stride_h, .stride_w = c.stride_w, .pad_h = c.pad_h,
          .pad_w = c.pad_w, .dilation_h = c.dilation_h, .dilation_w = c.dilation_w,
          .out_h = out_size(c.height, c.kh, c.stride_h, c.pad_h, c.dilation_h),
          .out_w = out_size(c.width, c.kw, c.stride_w, c.pad_w, c.dilation_w)};
}

// Strides, padding (also wider than the kernel), dilation, odd sizes, an input smaller than the
// kernel, 1 x 1 kernels; each run over the whole batch and over a chunk that starts at sample 1.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {2, 3, 5, 7, 3, 3, 1, 1, 1, 1, 1, 1},  {3, 2, 8, 6, 3, 2, 2, 1, 1, 0, 1, 2}, {2, 1, 9, 9, 5, 5, 3, 3, 2, 2, 1, 1},
      {2, 4, 4, 4, 1, 1, 1, 1, 0, 0, 1, 1},  {2, 2, 7, 5, 2, 3, 2, 3, 2, 1, 2, 1}, {3, 2, 3, 2, 4, 4, 1, 2, 3, 3, 1, 1},
      {2, 3, 11, 7, 3, 3, 2, 2, 3, 0, 2, 3}, {2, 5, 6, 9, 1, 3, 3, 2, 0, 4, 1, 1},
  };
  return all;
}

// Small integers as floats: every sum below is exact whatever its order.
ag::Tensor small_integers(const ag::Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(ag::shape_numel(shape)));
  for (float& e : v) e = static_cast<float>(static_cast<int>(rng() % 17) - 8);
  return ag::Tensor::from_vector(v, shape);
}

template <typename Div>
void check_im2col(const Case& c, int64_t n0, int64_t n) {
  const k::ConvGeometry g = geometry_of(c);
  const ag::Tensor x = small_integers({c.batch, c.channels, c.height, c.width}, 1);
  ag::Tensor cols = ag::Tensor::empty({c.channels * c.kh * c.kw, n, g.out_h * g.out_w});
  k::cpu::im2col(x, n0, g, cols);
  const std::vector<float> xs = x.to_vector(), want = cols.to_vector();
  const k::Im2colIndex<Div> map(n0, n, c.channels, c.height, c.width, g);
  for (int64_t e = 0; e < static_cast<int64_t>(want.size()); ++e) {
    const int64_t at = map.source(static_cast<typename Div::Index>(e));
    ASSERT_EQ(at >= 0 ? xs[static_cast<size_t>(at)] : 0.0f, want[static_cast<size_t>(e)]) << "cols element " << e;
  }
}

template <typename Div>
void check_col2im(const Case& c, int64_t n0, int64_t n) {
  const k::ConvGeometry g = geometry_of(c);
  const ag::Tensor cols = small_integers({c.channels * c.kh * c.kw, n, g.out_h * g.out_w}, 2);
  ag::Tensor dx = ag::zeros({c.batch, c.channels, c.height, c.width});
  k::cpu::col2im(cols, g, n0, dx);
  const std::vector<float> cs = cols.to_vector(), want = dx.to_vector();
  const k::Col2imIndex<Div> map(n, c.channels, c.height, c.width, g);
  const int64_t first = n0 * c.channels * c.height * c.width, count = n * c.channels * c.height * c.width;
  for (int64_t e = 0; e < count; ++e) {
    float sum = 0.0f;
    map.for_each_source(static_cast<typename Div::Index>(e), [&](int64_t at) { sum += cs[static_cast<size_t>(at)]; });
    ASSERT_EQ(sum, want[static_cast<size_t>(first + e)]) << "dx element " << first + e;
  }
}

template <typename Div>
void check_transposes(int64_t batch, int64_t channels, int64_t len, int64_t n0, int64_t n) {
  const ag::Tensor ct = small_integers({channels, n, len}, 3), b = small_integers({channels}, 4);
  ag::Tensor out = ag::zeros({batch, channels, len});
  k::cpu::samples_from_channels(ct, b, n0, out);
  const std::vector<float> cts = ct.to_vector(), bs = b.to_vector(), outs = out.to_vector();
  const k::SamplesFromChannelsIndex<Div> to_samples(n, channels, len);
  for (int64_t e = 0; e < n * channels * len; ++e) {
    int64_t o = -1;
    const int64_t at = to_samples.source(static_cast<typename Div::Index>(e), o);
    const int64_t out_at = n0 * channels * len + e;
    ASSERT_EQ(cts[static_cast<size_t>(at)] + bs[static_cast<size_t>(o)], outs[static_cast<size_t>(out_at)])
        << "out element " << out_at;
  }

  const ag::Tensor y = small_integers({batch, channels, len}, 5);
  ag::Tensor back = ag::Tensor::empty({channels, n, len});
  k::cpu::channels_from_samples(y, n0, back);
  const std::vector<float> ys = y.to_vector(), backs = back.to_vector();
  const k::ChannelsFromSamplesIndex<Div> to_channels(n0, n, channels, len);
  for (int64_t e = 0; e < channels * n * len; ++e) {
    ASSERT_EQ(ys[static_cast<size_t>(to_channels.source(static_cast<typename Div::Index>(e)))],
              backs[static_cast<size_t>(e)])
        << "ct element " << e;
  }
}

template <typename Div>
void check_all() {
  for (const Case& c : cases()) {
    SCOPED_TRACE(testing::Message() << "x [" << c.batch << ", " << c.channels << ", " << c.height << ", " << c.width
                                    << "], kernel " << c.kh << " x " << c.kw << ", stride {" << c.stride_h << ", "
                                    << c.stride_w << "}, padding {" << c.pad_h << ", " << c.pad_w << "}, dilation {"
                                    << c.dilation_h << ", " << c.dilation_w << "}");
    ASSERT_GE(geometry_of(c).out_h, 1);
    ASSERT_GE(geometry_of(c).out_w, 1);
    for (const auto& [n0, n] : {std::pair<int64_t, int64_t>{0, c.batch}, {1, c.batch - 1}}) {
      check_im2col<Div>(c, n0, n);
      check_col2im<Div>(c, n0, n);
      check_transposes<Div>(c.batch, c.channels, c.height * c.width, n0, n);
    }
  }
}

TEST(ConvIndex, ThirtyTwoBitMapsReadWhatTheCpuKernelsRead) { check_all<ag::FastDivmod>(); }

TEST(ConvIndex, SixtyFourBitMapsReadWhatTheCpuKernelsRead) { check_all<ag::WideDivmod>(); }

}  // namespace
