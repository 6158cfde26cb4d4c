// The direct stride-1 convolution (ops/conv/conv_direct_cpu.cc) against the im2col GEMM route it
// replaces: float32's forward bit for bit (the same FMA chain per output), the input and weight
// gradients and bfloat16 against float64 references (their sums run in other orders), over shapes
// whose output rows and channels are not multiples of the register tiles. conv_direct_avx2_test runs this file with
// AMPGRAD_CPU_ISA=avx2, so the AVX2 tile is held to the same bits as the AVX-512 one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "framework/cpu_features.h"
#include "ops/conv/conv_kernels.h"
#include "ops/linear/linear_kernels.h"
#include "ops/ops.h"
#include "reference.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
namespace k = ampgrad::kernels;
using ag::DType;
using ag::Tensor;

namespace {

struct Case {
  int64_t n, c, h, w, o, kh, kw, ph, pw;
  bool bias;
};

const Case kCases[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, true},     // smaller than one tile both ways
    {1, 1, 5, 40, 9, 3, 3, 1, 1, false},   // a row of 40: a full and a partial tile; 9 channels: one past a block
    {3, 5, 9, 33, 7, 5, 5, 2, 2, true},    // 5x5, padding 2
    {2, 4, 6, 17, 13, 1, 3, 0, 1, true},   // 1x3
    {2, 3, 8, 8, 6, 2, 2, 0, 0, false},    // an even kernel without padding: 7x7 out
    {1, 2, 4, 70, 3, 3, 2, 2, 1, true},    // padding 2 rows (as large as the direct input gradient allows)
    {2, 16, 12, 65, 20, 3, 3, 1, 1, true}, // several tiles and blocks
    {1, 3, 5, 9, 10, 3, 3, 1, 1, true},    // a tile spans several output rows
    {2, 2, 70, 90, 3, 3, 3, 1, 1, false},  // the weight gradient's grid in blocks: 4 of 1600 floats, 2 of 3200 bfloat16
    {2, 3, 4, 31, 5, 1, 3, 0, 1, true},    // rows sharing padding columns and no padding rows
    {2, 2, 1, 1, 3, 3, 3, 1, 1, true},     // an input smaller than the kernel
    {1, 3, 2, 2, 5, 3, 3, 2, 2, true},     // padding 2 all round a 2 x 2 input
    {2, 6, 14, 14, 40, 3, 3, 1, 1, true},  // the CNN's plane (channel tiles of 14): a full and a partial block of 32
    {1, 4, 7, 7, 33, 3, 3, 1, 1, false},   // 7 x 7 (channel tiles of 7) into 33 channels
    {1, 5, 5, 23, 32, 3, 3, 1, 1, true},   // rows of 23: channel tiles of 14 with a partial one, overrunning rows
    {2, 5, 14, 14, 64, 3, 3, 1, 1, false}, // y and dw pick the channel tiles themselves; 45 taps: a partial tile of 6
    {6, 1, 14, 14, 256, 3, 3, 1, 1, true}, // dw's channel tiles: groups (float32: 3 of 2 samples) carry float sums
};

// The routes (float32 at AVX-512, bfloat16 at AVX512_BF16): the grid's tiles along positions, and
// the channel tiles along output channels. The tests below run y, dx and dw on both, whatever the
// automatic choice; where they must agree, bit for bit (bits_of: -0 is not +0).
const k::cpu::DirectConvRoute kRoutes[] = {k::cpu::DirectConvRoute::kGrid, k::cpu::DirectConvRoute::kChannels};
const char* route_name(k::cpu::DirectConvRoute route) {
  return route == k::cpu::DirectConvRoute::kGrid ? "grid tiles" : "channel tiles";
}
// A contiguous CPU tensor's bytes.
std::vector<unsigned char> bits_of(const Tensor& t) {
  const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
  return {bytes, bytes + t.numel() * static_cast<int64_t>(ag::element_size(t.dtype()))};
}

struct ForcedRoute {
  explicit ForcedRoute(k::cpu::DirectConvRoute route) { k::cpu::set_direct_conv_route_for_testing(route); }
  ~ForcedRoute() { k::cpu::set_direct_conv_route_for_testing(k::cpu::DirectConvRoute::kAuto); }
  ForcedRoute(const ForcedRoute&) = delete;
  ForcedRoute& operator=(const ForcedRoute&) = delete;
};

ag::Shape x_shape(const Case& c) { return {c.n, c.c, c.h, c.w}; }
ag::Shape w_shape(const Case& c) { return {c.o, c.c, c.kh, c.kw}; }

Tensor random_tensor(const ag::Shape& shape, uint64_t seed) {
  return Tensor::from_vector(agt::random_values(static_cast<size_t>(ag::shape_numel(shape)), -1, 1, seed), shape,
                             DType::kFloat32);
}

k::ConvGeometry geometry(const Case& c) {
  return {.kh = c.kh, .kw = c.kw, .pad_h = c.ph, .pad_w = c.pw, .out_h = c.h + 2 * c.ph - c.kh + 1,
          .out_w = c.w + 2 * c.pw - c.kw + 1};
}

// The im2col route: y = w cols (+ b), transposed into [N, O, Ho, Wo].
Tensor im2col_forward(const Tensor& x, const Tensor& w, const Tensor& b, const k::ConvGeometry& g) {
  const int64_t n = x.size(0), out_c = w.size(0), rows = w.numel() / out_c, len = g.out_h * g.out_w;
  Tensor cols = Tensor::empty({rows, n, len}, DType::kFloat32);
  k::im2col(x, 0, g, cols);
  const Tensor ct = k::gemm(ag::ops::reshape(w, {out_c, rows}), k::Transpose::kNo, ag::ops::reshape(cols, {rows, n * len}),
                            k::Transpose::kNo);
  Tensor y = Tensor::empty({n, out_c, g.out_h, g.out_w}, DType::kFloat32);
  k::samples_from_channels(ag::ops::reshape(ct, {out_c, n, len}), b, 0, y);
  return y;
}

// dx[s, c, y, x] = sum over o, i, j of dy[s, o, y + ph - i, x + pw - j] w[o, c, i, j], in double.
std::vector<double> input_grad_reference(const Case& c, const Tensor& dy, const Tensor& w) {
  const std::vector<double> d = dy.to_double_vector(), wv = w.to_double_vector();
  const k::ConvGeometry g = geometry(c);
  std::vector<double> dx(static_cast<size_t>(c.n * c.c * c.h * c.w), 0.0);
  for (int64_t s = 0; s < c.n; ++s) {
    for (int64_t ci = 0; ci < c.c; ++ci) {
      for (int64_t y = 0; y < c.h; ++y) {
        for (int64_t x = 0; x < c.w; ++x) {
          double sum = 0;
          for (int64_t o = 0; o < c.o; ++o) {
            for (int64_t i = 0; i < c.kh; ++i) {
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t oy = y + c.ph - i, ox = x + c.pw - j;
                if (oy < 0 || oy >= g.out_h || ox < 0 || ox >= g.out_w) continue;
                sum += d[static_cast<size_t>(((s * c.o + o) * g.out_h + oy) * g.out_w + ox)] *
                       wv[static_cast<size_t>(((o * c.c + ci) * c.kh + i) * c.kw + j)];
              }
            }
          }
          dx[static_cast<size_t>(((s * c.c + ci) * c.h + y) * c.w + x)] = sum;
        }
      }
    }
  }
  return dx;
}

TEST(DirectConv2d, ForwardGivesTheIm2colRoutesBits) {
  const char* isa = std::getenv("AMPGRAD_CPU_ISA");
  std::printf("AMPGRAD_CPU_ISA=%s: the direct convolution runs at %s\n", isa ? isa : "(unset)",
              ag::cpu_isa_name(ag::effective_cpu_isa()));
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], w [" << c.o
                                      << ", " << c.c << ", " << c.kh << ", " << c.kw << "], padding " << c.ph << ", "
                                      << c.pw);
    const Tensor x = random_tensor(x_shape(c), seed++), w = random_tensor(w_shape(c), seed++);
    const Tensor b = c.bias ? random_tensor({c.o}, seed++) : Tensor();
    const k::ConvGeometry g = geometry(c);
    ASSERT_TRUE(k::direct_conv2d_applies(x, w, g, 1));
    const std::vector<unsigned char> want = bits_of(im2col_forward(x, w, b, g));
    for (const k::cpu::DirectConvRoute route : kRoutes) {
      SCOPED_TRACE(route_name(route));
      const ForcedRoute forced(route);
      Tensor direct = Tensor::empty({c.n, c.o, g.out_h, g.out_w}, DType::kFloat32);
      k::cpu::direct_conv2d(x, w, b, g, direct);
      EXPECT_EQ(bits_of(direct), want);
    }
    // The op takes the direct kernel, on the route it picks.
    EXPECT_EQ(bits_of(ag::ops::conv2d(x, w, b, {.padding = {c.ph, c.pw}})), want);
  }
}

TEST(DirectConv2d, InputGradientMatchesTheFloat64Reference) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], w [" << c.o
                                      << ", " << c.c << ", " << c.kh << ", " << c.kw << "]");
    const k::ConvGeometry g = geometry(c);
    const Tensor dy = random_tensor({c.n, c.o, g.out_h, g.out_w}, seed++), w = random_tensor(w_shape(c), seed++);
    Tensor dx = Tensor::empty(x_shape(c), DType::kFloat32);
    k::cpu::direct_conv2d_input_grad(dy, w, g, dx);
    EXPECT_CLOSE(dx, input_grad_reference(c, dy, w), DType::kFloat32, {.k = c.o * c.kh * c.kw, .magnitude = 4});
    // Both routes give the same bits (one FMA chain per output).
    for (const k::cpu::DirectConvRoute route : kRoutes) {
      SCOPED_TRACE(route_name(route));
      const ForcedRoute forced(route);
      Tensor routed = Tensor::empty(x_shape(c), DType::kFloat32);
      k::cpu::direct_conv2d_input_grad(dy, w, g, routed);
      EXPECT_EQ(bits_of(routed), bits_of(dx));
    }
    // Through the op's backward too.
    Tensor x = random_tensor(x_shape(c), seed++);
    x.set_requires_grad(true);
    ag::ops::sum(ag::ops::conv2d(x, w, Tensor(), {.padding = {c.ph, c.pw}}) * dy).backward();
    EXPECT_EQ(x.grad().to_vector(), dx.to_vector());
  }
}

// The weight gradient's terms per sum: every grid position of every sample (an upper bound on
// what one vector lane adds in float).
int64_t grid_terms(const Case& c) { return c.n * geometry(c).out_h * (c.w + 2 * c.pw); }

// dw[o, c, i, j] = sum over s, oy, ox of dy[s, o, oy, ox] x[s, c, oy - ph + i, ox - pw + j], in double.
std::vector<double> weight_grad_reference(const Case& c, const Tensor& x, const Tensor& dy) {
  const std::vector<double> xv = x.to_double_vector(), d = dy.to_double_vector();
  const k::ConvGeometry g = geometry(c);
  std::vector<double> dw(static_cast<size_t>(c.o * c.c * c.kh * c.kw), 0.0);
  for (int64_t s = 0; s < c.n; ++s) {
    for (int64_t o = 0; o < c.o; ++o) {
      for (int64_t ci = 0; ci < c.c; ++ci) {
        for (int64_t i = 0; i < c.kh; ++i) {
          for (int64_t j = 0; j < c.kw; ++j) {
            double sum = 0;
            for (int64_t oy = 0; oy < g.out_h; ++oy) {
              const int64_t iy = oy - c.ph + i;
              if (iy < 0 || iy >= c.h) continue;
              for (int64_t ox = 0; ox < g.out_w; ++ox) {
                const int64_t ix = ox - c.pw + j;
                if (ix < 0 || ix >= c.w) continue;
                sum += d[static_cast<size_t>(((s * c.o + o) * g.out_h + oy) * g.out_w + ox)] *
                       xv[static_cast<size_t>(((s * c.c + ci) * c.h + iy) * c.w + ix)];
              }
            }
            dw[static_cast<size_t>(((o * c.c + ci) * c.kh + i) * c.kw + j)] += sum;
          }
        }
      }
    }
  }
  return dw;
}

TEST(DirectConv2d, WeightGradientMatchesTheFloat64Reference) {
  uint64_t seed = 200;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], w [" << c.o
                                      << ", " << c.c << ", " << c.kh << ", " << c.kw << "]");
    const k::ConvGeometry g = geometry(c);
    const Tensor x = random_tensor(x_shape(c), seed++), dy = random_tensor({c.n, c.o, g.out_h, g.out_w}, seed++);
    const std::vector<double> want = weight_grad_reference(c, x, dy);
    // Each vector lane sums a share of the n x grid positions in float (|dy x| <= 1); the lanes are
    // totalled in double. The channel tiles' float sums are shorter.
    for (const k::cpu::DirectConvRoute route : kRoutes) {
      SCOPED_TRACE(route_name(route));
      const ForcedRoute forced(route);
      Tensor routed = Tensor::empty(w_shape(c), DType::kFloat32);
      ASSERT_TRUE(k::cpu::direct_conv2d_weight_grad(x, dy, g, routed)) << "no NaN from finite inputs";
      EXPECT_CLOSE(routed, want, DType::kFloat32, {.k = grid_terms(c), .magnitude = 16});
    }
    Tensor dw = Tensor::empty(w_shape(c), DType::kFloat32);
    ASSERT_TRUE(k::cpu::direct_conv2d_weight_grad(x, dy, g, dw)) << "no NaN from finite inputs";
    // Through the op's backward too.
    Tensor w = random_tensor(w_shape(c), seed++);
    w.set_requires_grad(true);
    ag::ops::sum(ag::ops::conv2d(x, w, Tensor(), {.padding = {c.ph, c.pw}}) * dy).backward();
    EXPECT_EQ(w.grad().to_vector(), dw.to_vector());
  }
  // Many samples of several blocks each (30 rows of 71 positions: two blocks of float32).
  const Case big{40, 8, 30, 70, 5, 3, 3, 1, 1, false};
  const k::ConvGeometry g = geometry(big);
  const Tensor x = random_tensor(x_shape(big), 7), dy = random_tensor({big.n, big.o, g.out_h, g.out_w}, 8);
  const std::vector<double> want = weight_grad_reference(big, x, dy);
  for (const k::cpu::DirectConvRoute route : kRoutes) {
    SCOPED_TRACE(route_name(route));
    const ForcedRoute forced(route);
    Tensor dw = Tensor::empty(w_shape(big), DType::kFloat32);
    ASSERT_TRUE(k::cpu::direct_conv2d_weight_grad(x, dy, g, dw)) << "no NaN from finite inputs";
    EXPECT_CLOSE(dw, want, DType::kFloat32, {.k = grid_terms(big), .magnitude = 64});
  }
}

// Bfloat16 (AVX512_BF16: channel pairs, or grid-position pairs for the weight gradient, summed in
// float by VDPBF16PS), each result rounded once: against float64 from the same bfloat16 values, and
// y and dx the same on both routes.
TEST(DirectConv2d, Bfloat16MatchesTheFloat64Reference) {
  const Tensor probe = Tensor::empty({1, 1, 4, 4}, DType::kBFloat16);
  const k::ConvGeometry probe_g{.kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1, .out_h = 4, .out_w = 4};
  if (!k::direct_conv2d_applies(probe, Tensor::empty({1, 1, 3, 3}, DType::kBFloat16), probe_g, 1)) {
    GTEST_SKIP() << "the bfloat16 direct convolution needs avx512_bf16, and the kernels run at "
                 << ag::cpu_isa_name(ag::effective_cpu_isa()) << " here "
                 << ag::cpu_unsupported_reason(ag::CpuIsa::kAvx512Bf16);
  }
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], w [" << c.o
                                      << ", " << c.c << ", " << c.kh << ", " << c.kw << "]");
    const k::ConvGeometry g = geometry(c);
    const auto bf16 = [](const Tensor& t) { return t.to(DType::kBFloat16); };
    const Tensor x = bf16(random_tensor(x_shape(c), seed++)), w = bf16(random_tensor(w_shape(c), seed++));
    const Tensor b = c.bias ? bf16(random_tensor({c.o}, seed++)) : Tensor();
    const Tensor dy = bf16(random_tensor({c.n, c.o, g.out_h, g.out_w}, seed++));
    Tensor y = Tensor::empty({c.n, c.o, g.out_h, g.out_w}, DType::kBFloat16);
    k::cpu::direct_conv2d(x, w, b, g, y);
    const agt::WindowRef window{.kh = c.kh, .kw = c.kw, .ph = c.ph, .pw = c.pw};
    EXPECT_CLOSE(y,
                 agt::conv2d_ref(x.to_double_vector(), x_shape(c), w.to_double_vector(), w_shape(c),
                                 c.bias ? b.to_double_vector() : std::vector<double>{}, window, 1),
                 DType::kBFloat16, {.k = c.c * c.kh * c.kw, .magnitude = 4});
    Tensor dx = Tensor::empty(x_shape(c), DType::kBFloat16);
    k::cpu::direct_conv2d_input_grad(dy, w, g, dx);
    EXPECT_CLOSE(dx, input_grad_reference(c, dy, w), DType::kBFloat16, {.k = c.o * c.kh * c.kw, .magnitude = 4});
    // The channel tiles pair the same channels in the same order as the grid's: the same bits.
    for (const k::cpu::DirectConvRoute route : kRoutes) {
      SCOPED_TRACE(route_name(route));
      const ForcedRoute forced(route);
      Tensor routed_y = Tensor::empty(y.shape(), DType::kBFloat16), routed_dx = Tensor::empty(x_shape(c), DType::kBFloat16);
      k::cpu::direct_conv2d(x, w, b, g, routed_y);
      k::cpu::direct_conv2d_input_grad(dy, w, g, routed_dx);
      EXPECT_EQ(bits_of(routed_y), bits_of(y));
      EXPECT_EQ(bits_of(routed_dx), bits_of(dx));
      // dw pairs other terms on each route (neighbouring positions of a row on the channel tiles).
      Tensor routed_dw = Tensor::empty(w_shape(c), DType::kBFloat16);
      ASSERT_TRUE(k::cpu::direct_conv2d_weight_grad(x, dy, g, routed_dw)) << "no NaN from finite inputs";
      EXPECT_CLOSE(routed_dw, weight_grad_reference(c, x, dy), DType::kBFloat16, {.k = grid_terms(c), .magnitude = 16});
    }
    Tensor dw = Tensor::empty(w_shape(c), DType::kBFloat16);
    ASSERT_TRUE(k::cpu::direct_conv2d_weight_grad(x, dy, g, dw)) << "no NaN from finite inputs";
    EXPECT_CLOSE(dw, weight_grad_reference(c, x, dy), DType::kBFloat16, {.k = grid_terms(c), .magnitude = 16});
    // The op (as autocast runs it) takes the same kernels.
    Tensor xr = x.detach(), wr = w.detach();
    xr.set_requires_grad(true);
    wr.set_requires_grad(true);
    const Tensor yr = ag::ops::conv2d(xr, wr, b, {.padding = {c.ph, c.pw}});
    EXPECT_EQ(yr.to_vector(), y.to_vector());
    ag::ops::sum(yr * dy).backward();
    EXPECT_EQ(xr.grad().to_vector(), dx.to_vector());
    EXPECT_EQ(wr.grad().to_vector(), dw.to_vector());
  }
}

// Integer values from -2 to 2: every product and sum is exact in float, so dw on either route, in
// float32 and bfloat16, must be the float64 reference rounded once, bit for bit (a product paired
// with the wrong x, even only at an odd row's last position, shows).
TEST(DirectConv2d, WeightGradientOfIntegersIsExactOnBothRoutes) {
  std::vector<DType> dtypes{DType::kFloat32};
  const Tensor probe = Tensor::empty({1, 1, 4, 4}, DType::kBFloat16);
  if (k::direct_conv2d_applies(probe, Tensor::empty({1, 1, 3, 3}, DType::kBFloat16),
                               {.kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1, .out_h = 4, .out_w = 4}, 1)) {
    dtypes.push_back(DType::kBFloat16);
  }
  const auto integers = [](const ag::Shape& shape, uint64_t seed) {
    std::vector<double> v = agt::random_values(static_cast<size_t>(ag::shape_numel(shape)), -1, 1, seed);
    for (double& e : v) e = std::round(2 * e);
    return Tensor::from_vector(v, shape, DType::kFloat32);
  };
  uint64_t seed = 500;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "], w [" << c.o
                                      << ", " << c.c << ", " << c.kh << ", " << c.kw << "]");
    const k::ConvGeometry g = geometry(c);
    const Tensor x = integers(x_shape(c), seed++), dy = integers({c.n, c.o, g.out_h, g.out_w}, seed++);
    const std::vector<double> want = weight_grad_reference(c, x, dy);
    for (const DType dtype : dtypes) {
      SCOPED_TRACE(ag::dtype_name(dtype));
      const std::vector<unsigned char> rounded = bits_of(Tensor::from_vector(want, w_shape(c), dtype));
      for (const k::cpu::DirectConvRoute route : kRoutes) {
        SCOPED_TRACE(route_name(route));
        const ForcedRoute forced(route);
        Tensor dw = Tensor::empty(w_shape(c), dtype);
        ASSERT_TRUE(k::cpu::direct_conv2d_weight_grad(x.to(dtype), dy.to(dtype), g, dw)) << "no NaN from finite inputs";
        EXPECT_EQ(bits_of(dw), rounded);
      }
    }
  }
}

// Budgets small enough for a chunk of one sample and a band of one channel tile: the chunk and
// band loops run many times and change no bit (each vector lane adds in the same order).
TEST(DirectConv2d, ChunksAndBandsChangeNoBit) {
  std::vector<DType> dtypes{DType::kFloat32};
  const Tensor probe = Tensor::empty({1, 1, 4, 4}, DType::kBFloat16);
  if (k::direct_conv2d_applies(probe, Tensor::empty({1, 1, 3, 3}, DType::kBFloat16),
                               {.kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1, .out_h = 4, .out_w = 4}, 1)) {
    dtypes.push_back(DType::kBFloat16);
  }
  const Case c{5, 7, 9, 11, 19, 3, 3, 1, 1, true};
  const k::ConvGeometry g = geometry(c);
  for (const DType dtype : dtypes) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    const Tensor x = random_tensor(x_shape(c), 41).to(dtype), w = random_tensor(w_shape(c), 42).to(dtype);
    const Tensor b = random_tensor({c.o}, 43).to(dtype), dy = random_tensor({c.n, c.o, g.out_h, g.out_w}, 44).to(dtype);
    const auto run_all = [&] {
      Tensor y = Tensor::empty({c.n, c.o, g.out_h, g.out_w}, dtype), dx = Tensor::empty(x_shape(c), dtype);
      Tensor dw = Tensor::empty(w_shape(c), dtype);
      k::cpu::direct_conv2d(x, w, b, g, y);
      k::cpu::direct_conv2d_input_grad(dy, w, g, dx);
      EXPECT_TRUE(k::cpu::direct_conv2d_weight_grad(x, dy, g, dw)) << "no NaN from finite inputs";
      return std::vector<std::vector<float>>{y.to_vector(), dx.to_vector(), dw.to_vector()};
    };
    const auto whole = run_all();

    // One sample per chunk and one tile per band; then bands of a few tiles with a short last one
    // (two of AVX-512's 4-channel tiles of 5, eight of AVX2's 2-channel tiles of 10).
    const auto with_budgets = [&](int64_t padded, int64_t partial) {
      struct Restore {
        ~Restore() { k::cpu::set_direct_conv_budgets_for_testing(0, 0); }
      } restore;
      k::cpu::set_direct_conv_budgets_for_testing(padded, partial);
      return run_all();
    };
    const auto pieces = with_budgets(1, 1);
    const int64_t two_tiles = 2 * ((9 * c.c + 5) / 6) * 4 * 6 * 16;  // two rows of AVX-512's 4 x 6 x 16-float tiles
    const auto bands_of_two = with_budgets(0, two_tiles);
    EXPECT_EQ(bands_of_two[2], whole[2]) << "dw in bands of two tiles";
    EXPECT_EQ(pieces[0], whole[0]) << "y";
    EXPECT_EQ(pieces[1], whole[1]) << "dx";
    EXPECT_EQ(pieces[2], whole[2]) << "dw";
  }
}

// An infinity in x: the direct weight gradient's dropped grid columns multiply it by a dy of 0 for
// a tap that never meets it (the dropped column ow = 7 of a row, Wp = 8, at tap j = 2 reads x's
// column 0 of the next row), so it reports a NaN and the op takes the im2col route for dw, whose
// non-finite entries are the float64 reference's; dx stays the direct kernel's.
TEST(DirectConv2d, AnInfinityInXGivesTheReferencesNonFiniteWeightGradient) {
  const Case c{1, 2, 5, 6, 3, 3, 3, 1, 1, false};
  const k::ConvGeometry g = geometry(c);
  std::vector<double> xv = agt::random_values(static_cast<size_t>(c.n * c.c * c.h * c.w), -1, 1, 91);
  xv[2 * c.w] = std::numeric_limits<double>::infinity();  // x[0, 0, 2, 0]
  Tensor x = Tensor::from_vector(xv, x_shape(c), DType::kFloat32);
  const Tensor dy = random_tensor({c.n, c.o, g.out_h, g.out_w}, 92);
  Tensor w = random_tensor(w_shape(c), 93);
  Tensor direct_dw = Tensor::empty(w_shape(c), DType::kFloat32), direct_dx = Tensor::empty(x_shape(c), DType::kFloat32);
  EXPECT_FALSE(k::cpu::direct_conv2d_weight_grad(x, dy, g, direct_dw)) << "the direct sums should hold a NaN";
  k::cpu::direct_conv2d_input_grad(dy, w, g, direct_dx);

  x.set_requires_grad(true);
  w.set_requires_grad(true);
  ag::ops::sum(ag::ops::conv2d(x, w, Tensor(), {.padding = {c.ph, c.pw}}) * dy).backward();
  EXPECT_EQ(x.grad().to_vector(), direct_dx.to_vector());
  const std::vector<float> dw = w.grad().to_vector();
  const std::vector<double> want = weight_grad_reference(c, x, dy);
  int non_finite = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    SCOPED_TRACE(e);
    EXPECT_EQ(std::isnan(dw[e]), std::isnan(want[e]));
    if (std::isinf(want[e])) {
      EXPECT_EQ(dw[e], static_cast<float>(want[e]));
    } else if (!std::isnan(want[e])) {
      EXPECT_NEAR(dw[e], want[e], 1e-4 * (1 + std::abs(want[e])));  // not EXPECT_CLOSE: some entries are not finite
    }
    non_finite += std::isfinite(want[e]) ? 0 : 1;
  }
  EXPECT_GT(non_finite, 0) << "the infinity should reach some taps";
}

TEST(DirectConv2d, AppliesOnlyWhereItsInputGradientIsOneToo) {
  const Tensor x = Tensor::empty({1, 2, 8, 8}, DType::kFloat32), w = Tensor::empty({3, 2, 3, 3}, DType::kFloat32);
  const k::ConvGeometry g{.kh = 3, .kw = 3, .pad_h = 1, .pad_w = 1, .out_h = 8, .out_w = 8};
  EXPECT_TRUE(k::direct_conv2d_applies(x, w, g, 1));
  EXPECT_FALSE(k::direct_conv2d_applies(x.to(DType::kFloat16), w.to(DType::kFloat16), g, 1)) << "float16";
  EXPECT_EQ(k::direct_conv2d_applies(x.to(DType::kBFloat16), w.to(DType::kBFloat16), g, 1),
            ag::effective_cpu_isa() >= ag::CpuIsa::kAvx512Bf16)
      << "bfloat16 where VDPBF16PS runs";
  EXPECT_FALSE(k::direct_conv2d_applies(x, w, {.kh = 3, .kw = 3, .stride_h = 2, .out_h = 3, .out_w = 6}, 1));
  EXPECT_FALSE(k::direct_conv2d_applies(x, w, {.kh = 3, .kw = 3, .dilation_w = 2, .out_h = 6, .out_w = 4}, 1));
  EXPECT_FALSE(k::direct_conv2d_applies(x, w, {.kh = 3, .kw = 3, .pad_h = 3, .out_h = 12, .out_w = 6}, 1))
      << "padding past the kernel";
  EXPECT_FALSE(k::direct_conv2d_applies(x, Tensor::empty({3, 2, 1, 1}, DType::kFloat32), {.out_h = 8, .out_w = 8}, 1))
      << "1x1: a plain GEMM already";
  EXPECT_FALSE(k::direct_conv2d_applies(x, Tensor::empty({2, 1, 3, 3}, DType::kFloat32), g, 2)) << "grouped";
}

}  // namespace
