// conv2d inside a Float8Guard: the forward and the three gradients against a float64 computation on
// the same rounded, scaled operands (grouped, strided, over several chunks of samples), delayed
// scaling's state on the weight, a non-finite operand, depthwise convolutions left alone, and a
// short CNN training run that FP8 must keep up with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ampgrad.h"
#include "ops/conv/conv_kernels.h"
#include "reference.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Tensor;
using ag::amp::Float8Guard;

namespace {

using ::ampgrad::test::expect_close_to_largest;

Tensor random_tensor(const ag::Shape& shape, double lo, double hi, uint64_t seed) {
  return Tensor::from_vector(agt::random_values(static_cast<size_t>(ag::shape_numel(shape)), lo, hi, seed), shape,
                             DType::kFloat32);
}

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

float amax_of(const std::vector<float>& v) {
  float a = 0.0f;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

// saturate(v * scale) in `format`, decoded: the operand values the FP8 GEMMs multiply.
std::vector<double> rounded(const std::vector<float>& v, float scale, DType format) {
  const Tensor scaled = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}) * scale;
  const std::vector<float> s = scaled.to_vector();
  std::vector<double> out;
  for (float x : s) {
    const float clamped = std::clamp(x, -static_cast<float>(ag::dtype_info(format).max),
                                     static_cast<float>(ag::dtype_info(format).max));
    out.push_back(Tensor::from_vector(std::vector<float>{clamped}, {1}).to(format).to_double_vector()[0]);
  }
  return out;
}

struct Geometry {
  int64_t batch, channels, height, width, out_c, k, stride, pad, dilation, groups;
  int64_t out_h() const { return (height + 2 * pad - dilation * (k - 1) - 1) / stride + 1; }
  int64_t out_w() const { return (width + 2 * pad - dilation * (k - 1) - 1) / stride + 1; }
};

// dx and dw of L = sum(y * g) for y = conv(x, w) (no bias), in double: every (sample, output
// channel, position, input channel of its group, tap) pairs g with x for dw and with w for dx.
void conv_gradients_ref(const Geometry& c, const std::vector<double>& x, const std::vector<double>& w,
                        const std::vector<double>& g, std::vector<double>& dx, std::vector<double>& dw) {
  const int64_t cg = c.channels / c.groups, og = c.out_c / c.groups, oh = c.out_h(), ow = c.out_w();
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  for (int64_t n = 0; n < c.batch; ++n) {
    for (int64_t o = 0; o < c.out_c; ++o) {
      for (int64_t ci = 0; ci < cg; ++ci) {
        const int64_t channel = o / og * cg + ci;
        for (int64_t i = 0; i < c.k; ++i) {
          for (int64_t j = 0; j < c.k; ++j) {
            const size_t wi = static_cast<size_t>(((o * cg + ci) * c.k + i) * c.k + j);
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * c.stride - c.pad + i * c.dilation;
              if (iy < 0 || iy >= c.height) continue;
              for (int64_t ox = 0; ox < ow; ++ox) {
                const int64_t ix = ox * c.stride - c.pad + j * c.dilation;
                if (ix < 0 || ix >= c.width) continue;
                const size_t xi = static_cast<size_t>(((n * c.channels + channel) * c.height + iy) * c.width + ix);
                const double gy = g[static_cast<size_t>(((n * c.out_c + o) * oh + oy) * ow + ox)];
                dw[wi] += gy * x[xi];
                dx[xi] += gy * w[wi];
              }
            }
          }
        }
      }
    }
  }
}

struct ProductCase {
  std::string name;
  ag::amp::Float8Format format;
  DType x_dtype;  // BF16: under BF16 autocast
  Geometry geometry;
  int64_t column_budget;  // 0: the default; else small enough for several chunks
};

void PrintTo(const ProductCase& c, std::ostream* os) { *os << c.name; }

class Float8ConvProducts : public ::testing::TestWithParam<ProductCase> {};

// Current scaling: each tensor's scale is fp8_max / its own amax, so the test knows every operand.
TEST_P(Float8ConvProducts, ForwardAndGradientsAreTheScaledFp8Products) {
  const ProductCase& pc = GetParam();
  const Geometry& c = pc.geometry;
  const bool bf16 = pc.x_dtype == DType::kBFloat16;
  struct Restore {
    ~Restore() { ag::kernels::set_im2col_column_budget_for_testing(0); }
  } restore;
  ag::kernels::set_im2col_column_budget_for_testing(pc.column_budget);
  const Tensor x = leaf(random_tensor({c.batch, c.channels, c.height, c.width}, -3, 3, 3).to(pc.x_dtype));
  const Tensor w = leaf(random_tensor({c.out_c, c.channels / c.groups, c.k, c.k}, -0.2, 0.2, 4));
  const Tensor b = leaf(random_tensor({c.out_c}, -1, 1, 5));
  const Tensor g = random_tensor({c.batch, c.out_c, c.out_h(), c.out_w()}, -1e-3, 1e-3, 6).to(pc.x_dtype);
  const ag::ops::Conv2dOptions options{.stride = {c.stride, c.stride}, .padding = {c.pad, c.pad},
                                       .dilation = {c.dilation, c.dilation}, .groups = c.groups};
  Tensor y;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16, /*enabled=*/bf16);
    Float8Guard fp8(ag::Device::kCPU, {.format = pc.format, .scaling = ag::amp::Float8Scaling::kCurrent});
    y = ag::ops::conv2d(x, w, b, options);
  }
  EXPECT_EQ(y.dtype(), pc.x_dtype);
  ASSERT_EQ(y.shape(), (ag::Shape{c.batch, c.out_c, c.out_h(), c.out_w()}));
  y.backward(g);  // outside the guard: the recorded FP8 backward runs all the same
  EXPECT_EQ(x.grad().dtype(), pc.x_dtype);
  EXPECT_EQ(w.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(b.grad().dtype(), DType::kFloat32);
  ASSERT_NE(ag::amp::float8_state(w), nullptr);

  const DType grad_format = pc.format == ag::amp::Float8Format::kHybrid ? DType::kFloat8E5M2 : DType::kFloat8E4M3;
  const std::vector<float> xv = x.to_vector(), wv = w.to_vector(), gv = g.to_vector(), bv = b.to_vector();
  const float sx = 448.0f / amax_of(xv), sw = 448.0f / amax_of(wv);
  const float sg = static_cast<float>(ag::dtype_info(grad_format).max) / amax_of(gv);
  std::vector<double> xq = rounded(xv, sx, DType::kFloat8E4M3), wq = rounded(wv, sw, DType::kFloat8E4M3);
  const std::vector<double> gq = rounded(gv, sg, grad_format);
  for (double& v : xq) v /= sx;  // the values the products stand for
  for (double& v : wq) v /= sw;
  const agt::WindowRef window{.kh = c.k, .kw = c.k, .sh = c.stride, .sw = c.stride, .ph = c.pad, .pw = c.pad,
                              .dh = c.dilation, .dw = c.dilation};
  const agt::Values want_y = agt::conv2d_ref(xq, x.shape(), wq, w.shape(), {bv.begin(), bv.end()}, window, c.groups);
  std::vector<double> gs(gq.size()), want_dx, want_dw;
  for (size_t i = 0; i < gq.size(); ++i) gs[i] = gq[i] / sg;
  conv_gradients_ref(c, xq, wq, gs, want_dx, want_dw);
  // FP32 sums of exact products (a few units of 2^-24 of the magnitude), then one rounding to
  // BF16 (2^-9) for y and dx, and a second for y where the bias is added to the rounded product.
  const double tol = bf16 ? 8e-3 : 4e-6;
  expect_close_to_largest(y.to_vector(), want_y, tol, "y");
  expect_close_to_largest(x.grad().to_vector(), want_dx, tol, "dx");
  expect_close_to_largest(w.grad().to_vector(), want_dw, 4e-6, "dw");
  std::vector<double> want_db(static_cast<size_t>(c.out_c), 0.0);
  const int64_t len = c.out_h() * c.out_w();
  for (size_t i = 0; i < gv.size(); ++i) want_db[static_cast<size_t>(static_cast<int64_t>(i) / len % c.out_c)] += gv[i];
  expect_close_to_largest(b.grad().to_vector(), want_db, bf16 ? 8e-3 : 1e-6, "db");
  // The FP8 result is not the float one: 3 mantissa bits cost about 2^-4 relative a product.
  const Tensor y32 = ag::ops::conv2d(x.detach().to(DType::kFloat32), w.detach(), b.detach(), options);
  double worst = 0.0;
  const std::vector<float> a = y.to_vector(), f = y32.to_vector();
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - f[i]));
  EXPECT_GT(worst, 1e-4);
  EXPECT_LT(worst, 0.5);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Float8ConvProducts,
    ::testing::Values(
        // The CNN's 3 x 3 same convolution, FP32 around it, in three chunks of samples (the FP8
        // route's chunk is half the budget: two samples).
        ProductCase{"hybrid_fp32_chunks", ag::amp::Float8Format::kHybrid, DType::kFloat32,
                    {5, 4, 7, 6, 6, 3, 1, 1, 1, 1}, 4 * 4 * 9 * 7 * 6},
        // Grouped, strided and dilated, under BF16 autocast, E4M3 gradients too.
        ProductCase{"e4m3_bf16_grouped", ag::amp::Float8Format::kE4M3, DType::kBFloat16,
                    {3, 6, 9, 8, 4, 3, 2, 2, 2, 2}, 0},
        // A 1 x 1 convolution (no padding, one tap).
        ProductCase{"hybrid_fp32_pointwise", ag::amp::Float8Format::kHybrid, DType::kFloat32,
                    {2, 8, 5, 5, 16, 1, 1, 0, 1, 1}, 0}),
    [](const ::testing::TestParamInfo<ProductCase>& info) { return info.param.name; });

// Delayed scaling: the first step casts at scale 1, the next with the amaxes the first recorded;
// the states live with the weight, as a linear's.
TEST(Float8Conv2d, DelayedScalingCastsWithThePastStepsAmax) {
  const Tensor w = leaf(random_tensor({4, 3, 3, 3}, -0.5, 0.5, 7));
  const float w_amax = amax_of(w.to_vector());
  float x_amax = 0.0f;
  for (int step = 0; step < 2; ++step) {
    const Tensor x = random_tensor({2, 3, 6, 6}, -2.0 * (step + 1), 2.0 * (step + 1), 10 + step);
    {
      Float8Guard fp8(ag::Device::kCPU, {.amax_history_len = 4});
      ag::ops::sum(ag::ops::conv2d(x, w, Tensor(), {.padding = {1, 1}})).backward();  // dy = 1 everywhere
    }
    const ag::Float8LinearState* state = ag::amp::float8_state(w);
    ASSERT_NE(state, nullptr);
    EXPECT_EQ(state->input.scale(), step == 0 ? 1.0f : 448.0f / x_amax) << step;
    EXPECT_EQ(state->weight.scale(), step == 0 ? 1.0f : 448.0f / w_amax) << step;
    EXPECT_EQ(state->grad_output.scale(), step == 0 ? 1.0f : 57344.0f) << step;
    x_amax = amax_of(x.to_vector());
    EXPECT_EQ(state->input.amax_history()[0], x_amax) << step;
    EXPECT_EQ(state->input.step_counts().numel, x.numel()) << step;
  }
}

// The saturating cast would turn an inf into +-max and hide it from GradScaler: an infinite x makes
// y NaN, and an infinite dy makes both gradients NaN.
TEST(Float8Conv2d, AnInfiniteOperandGivesNaNNotASaturatedProduct) {
  Tensor x = random_tensor({2, 3, 5, 5}, -1, 1, 1);
  static_cast<float*>(x.data_ptr())[7] = INFINITY;
  const Tensor w = leaf(random_tensor({4, 3, 3, 3}, -1, 1, 2));
  Tensor y;
  {
    Float8Guard fp8(ag::Device::kCPU, {.scaling = ag::amp::Float8Scaling::kCurrent});
    y = ag::ops::conv2d(leaf(x), w, Tensor(), {.padding = {1, 1}});
  }
  for (float v : y.to_vector()) ASSERT_TRUE(std::isnan(v));
  const Tensor x2 = leaf(random_tensor({2, 3, 5, 5}, -1, 1, 3));
  {
    Float8Guard fp8(ag::Device::kCPU, {.scaling = ag::amp::Float8Scaling::kCurrent});
    y = ag::ops::conv2d(x2, w, Tensor(), {.padding = {1, 1}});
  }
  Tensor g = ag::ones(y.shape());
  static_cast<float*>(g.data_ptr())[3] = INFINITY;
  y.backward(g);
  for (float v : x2.grad().to_vector()) ASSERT_TRUE(std::isnan(v));
  for (float v : w.grad().to_vector()) ASSERT_TRUE(std::isnan(v));
}

// A depthwise convolution has no GEMM: inside the guard it runs as outside it (in the autocast
// dtype), and its weight gets no FP8 state.
TEST(Float8Conv2d, ADepthwiseConvolutionRunsAsOutsideTheGuard) {
  const Tensor x = random_tensor({2, 4, 6, 6}, -1, 1, 1), w = leaf(random_tensor({4, 1, 3, 3}, -1, 1, 2));
  const ag::ops::Conv2dOptions options{.padding = {1, 1}, .groups = 4};
  Tensor inside, outside;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
    outside = ag::ops::conv2d(x, w, Tensor(), options);
    Float8Guard fp8(ag::Device::kCPU);
    inside = ag::ops::conv2d(x, w, Tensor(), options);
  }
  EXPECT_EQ(inside.dtype(), DType::kBFloat16);
  EXPECT_EQ(inside.to_double_vector(), outside.to_double_vector());
  EXPECT_EQ(ag::amp::float8_state(w), nullptr);
}

// Each gradient alone: dx with the weight frozen, dw and db with x a constant; each as it is when
// all three are wanted (the dy cast is the same, and each product is its own).
TEST(Float8Conv2d, EachGradientAloneIsTheOneComputedWithTheOthers) {
  const Tensor x = random_tensor({3, 4, 6, 6}, -2, 2, 1), w = random_tensor({5, 4, 3, 3}, -0.5, 0.5, 2);
  const Tensor b = random_tensor({5}, -1, 1, 3), g = random_tensor({3, 5, 6, 6}, -1, 1, 4);
  const ag::amp::Float8Recipe recipe{.scaling = ag::amp::Float8Scaling::kCurrent};
  const auto grads = [&](bool x_grad, bool w_grad, bool b_grad) {
    Tensor xs = x.detach(), ws = w.detach(), bs = b.detach();
    xs.set_requires_grad(x_grad);
    ws.set_requires_grad(w_grad);
    bs.set_requires_grad(b_grad);
    Tensor y;
    {
      Float8Guard fp8(ag::Device::kCPU, recipe);
      y = ag::ops::conv2d(xs, ws, bs, {.padding = {1, 1}});
    }
    y.backward(g);
    return std::vector<Tensor>{xs.grad(), ws.grad(), bs.grad()};
  };
  const std::vector<Tensor> all = grads(true, true, true);
  const std::vector<Tensor> dx = grads(true, false, false), dw = grads(false, true, false);
  const std::vector<Tensor> db = grads(false, false, true);
  EXPECT_EQ(dx[0].to_double_vector(), all[0].to_double_vector());
  EXPECT_FALSE(dx[1].defined() || dx[2].defined());
  EXPECT_EQ(dw[1].to_double_vector(), all[1].to_double_vector());
  EXPECT_FALSE(dw[0].defined() || dw[2].defined());
  EXPECT_EQ(db[2].to_double_vector(), all[2].to_double_vector());
  EXPECT_FALSE(db[0].defined() || db[1].defined());
}

TEST(Float8Conv2d, BadInputNamesTheOp) {
  Float8Guard fp8(ag::Device::kCPU);
  const Tensor x = random_tensor({2, 3, 5, 5}, -1, 1, 1), w = random_tensor({4, 2, 3, 3}, -1, 1, 2);
  try {
    (void)ag::ops::conv2d(x, w);
    FAIL() << "expected an error";
  } catch (const ag::Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d: x has 3 channels but weight expects 2"), std::string::npos)
        << e.what();
  }
}

// A small CNN (conv, relu, conv, mean over positions, linear head) learns which of 4 classes an
// input is (the signs of its two channels' means) in FP8 about as far as in FP32: the FP8 loss
// ends within a tenth of FP32's start.
TEST(Float8Conv2d, ASmallCnnTrainsAsFarAsFp32) {
  const Tensor inputs = random_tensor({64, 2, 8, 8}, -1, 1, 11);
  const std::vector<double> means = ag::ops::mean(inputs, {2, 3}).to_double_vector();
  std::vector<int64_t> labels;
  for (size_t n = 0; n < 64; ++n) labels.push_back((means[2 * n] > 0 ? 2 : 0) + (means[2 * n + 1] > 0 ? 1 : 0));
  const Tensor targets = Tensor::from_vector(labels, {64});
  const auto train = [&](bool fp8) {
    ag::manual_seed(5);
    ag::nn::Conv2d conv1(2, 8, 3, {.padding = {1, 1}}), conv2(8, 8, 3, {.padding = {1, 1}});
    ag::nn::Linear head(8, 4);
    std::vector<Tensor> params;
    for (const ag::nn::Module* m : std::vector<const ag::nn::Module*>{&conv1, &conv2, &head}) {
      for (const Tensor& p : m->parameters()) params.push_back(p);
    }
    ag::optim::Adam adam(params, {.lr = 1e-2});
    float first = 0.0f, last = 0.0f;
    for (int step = 0; step < 100; ++step) {
      adam.zero_grad();
      Tensor loss;
      {
        Float8Guard guard(ag::Device::kCPU, {}, fp8);
        const Tensor h = ag::ops::relu(conv2.forward(ag::ops::relu(conv1.forward(inputs))));
        loss = ag::ops::cross_entropy(head.forward(ag::ops::mean(h, {2, 3})), targets);
      }
      loss.backward();
      adam.step();
      (step == 0 ? first : last) = loss.to_vector()[0];
    }
    return std::pair<float, float>{first, last};
  };
  const auto [first32, last32] = train(false);
  const auto [first8, last8] = train(true);
  EXPECT_LT(last32, 0.1f * first32);
  EXPECT_LT(last8, last32 + 0.1f * first32) << "FP32 " << first32 << " -> " << last32 << ", FP8 " << first8 << " -> "
                                            << last8;
}

}  // namespace
