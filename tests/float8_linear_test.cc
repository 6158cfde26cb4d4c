// linear inside a Float8Guard: the GEMM on FP8 operands against the float GEMM of their decoded
// values (bit for bit), the forward and the three gradients against a float64 computation on the
// same rounded, scaled operands, delayed scaling's state across steps, autocast around it, and a
// short training run that FP8 must keep up with.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "checkpoint/checkpoint.h"
#include "ops/linear/linear_float8_kernels.h"
#include "ops/linear/linear_kernels.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Tensor;
using ag::amp::Float8Guard;
using ag::amp::Float8Recipe;

namespace {

using ::ampgrad::test::expect_close_to_largest;

std::vector<float> random_floats(size_t n, double lo, double hi, uint64_t seed) {
  std::vector<float> out;
  for (double v : ag::test::random_values(n, lo, hi, seed)) out.push_back(static_cast<float>(v));
  return out;
}

Tensor random_tensor(const ag::Shape& shape, double lo, double hi, uint64_t seed) {
  return Tensor::from_vector(random_floats(static_cast<size_t>(ag::shape_numel(shape)), lo, hi, seed), shape);
}

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// saturate(v * scale) in `format`, decoded: the operand values the FP8 GEMM multiplies.
std::vector<double> rounded(const std::vector<float>& v, float scale, DType format) {
  std::vector<uint8_t> codes(v.size());
  if (format == DType::kFloat8E4M3) {
    ag::float_to_float8_saturated(v.data(), scale, reinterpret_cast<ag::Float8E4M3*>(codes.data()), v.size());
  } else {
    ag::float_to_float8_saturated(v.data(), scale, reinterpret_cast<ag::Float8E5M2*>(codes.data()), v.size());
  }
  std::vector<double> out;
  for (uint8_t c : codes) {
    out.push_back(format == DType::kFloat8E4M3 ? ag::float8_to_float(ag::Float8E4M3{c}) : ag::float8_to_float(ag::Float8E5M2{c}));
  }
  return out;
}

float amax_of(const std::vector<float>& v) {
  float a = 0.0f;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

// c[i, j] = sum_p a(i, p) b(p, j) * alpha, where a(i, p) = a[i * as_i + p * as_p] and so on.
std::vector<double> matmul(const std::vector<double>& a, int64_t as_i, int64_t as_p, const std::vector<double>& b,
                           int64_t bs_p, int64_t bs_j, int64_t m, int64_t n, int64_t k, double alpha) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += a[static_cast<size_t>(i * as_i + p * as_p)] * b[static_cast<size_t>(p * bs_p + j * bs_j)];
      c[static_cast<size_t>(i * n + j)] = s * alpha;
    }
  }
  return c;
}

TEST(Float8Gemm, Float8OperandsGiveTheFloatGemmsBitsOfTheirValues) {
  // Sizes below and above the packed path's threshold, odd edges, each transpose.
  for (const auto& [m, n, k] : {std::tuple{3, 5, 7}, std::tuple{64, 48, 80}, std::tuple{129, 70, 257}}) {
    for (auto ta : {ag::kernels::Transpose::kNo, ag::kernels::Transpose::kYes}) {
      for (auto tb : {ag::kernels::Transpose::kNo, ag::kernels::Transpose::kYes}) {
        const bool at = ta == ag::kernels::Transpose::kYes, bt = tb == ag::kernels::Transpose::kYes;
        const Tensor a = random_tensor(at ? ag::Shape{k, m} : ag::Shape{m, k}, -400, 400, 1).to(DType::kFloat8E4M3);
        const Tensor b = random_tensor(bt ? ag::Shape{n, k} : ag::Shape{k, n}, -3e4, 3e4, 2).to(DType::kFloat8E5M2);
        Tensor got = Tensor::empty({m, n}, DType::kFloat32), want = Tensor::empty({m, n}, DType::kFloat32);
        ag::kernels::gemm(a, ta, b, tb, Tensor(), got);
        ag::kernels::gemm(a.to(DType::kFloat32), ta, b.to(DType::kFloat32), tb, Tensor(), want);
        const std::vector<float> g = got.to_vector(), w = want.to_vector();
        int differ = 0;
        for (size_t i = 0; i < g.size(); ++i) differ += std::bit_cast<uint32_t>(g[i]) != std::bit_cast<uint32_t>(w[i]);
        EXPECT_EQ(differ, 0) << m << "x" << n << "x" << k << " ta " << at << " tb " << bt;
      }
    }
  }
}

// Large enough for the pool (pieces of 2^16): a NaN in a far piece wins, else the largest magnitude
// anywhere; the cast in the same pass gives each element's own saturating cast.
TEST(Float8Kernels, AmaxAndTheScaledCastOverManyPieces) {
  const int64_t n = 600 * 600;
  std::vector<float> values = random_floats(static_cast<size_t>(n), -2, 2, 35);
  values[200000] = -7.5f;
  const Tensor x = Tensor::from_vector(values, {600, 600}).to(DType::kBFloat16);
  EXPECT_EQ(ag::kernels::cpu::amax(x), 7.5f);
  Tensor q = Tensor::empty({600, 600}, DType::kFloat8E5M2);
  EXPECT_EQ(ag::kernels::cpu::quantize_float8(x, 3.0f, q).amax, 7.5f);
  const std::vector<float> wide = x.to_vector();
  std::vector<uint8_t> want(wide.size());
  ag::float_to_float8_saturated(wide.data(), 3.0f, reinterpret_cast<ag::Float8E5M2*>(want.data()), wide.size());
  EXPECT_EQ(std::memcmp(q.data_ptr(), want.data(), want.size()), 0);
  values[350000] = NAN;
  EXPECT_TRUE(std::isnan(ag::kernels::cpu::amax(Tensor::from_vector(values, {600, 600}))));
}

// The vectorised scaled cast against the reference one on every bfloat16 value (NaNs, infs,
// subnormals, every exponent) at scales that move them across the formats' ranges.
TEST(Float8Kernels, TheScaledCastMatchesTheReferenceOnEveryBfloat16Value) {
  Tensor every = Tensor::empty({65536}, DType::kBFloat16);
  for (int i = 0; i < 65536; ++i) static_cast<uint16_t*>(every.data_ptr())[i] = static_cast<uint16_t>(i);
  const std::vector<float> wide = every.to_vector();
  for (DType format : ag::kFloat8DTypes) {
    for (float scale : {1.0f, 3.7f, 1e-30f, 1e30f, 448.0f / 3.0f}) {
      Tensor q = Tensor::empty({65536}, format);
      const ag::Float8CastCounts cast = ag::kernels::cpu::quantize_float8(every, scale, q);
      std::vector<uint8_t> want(wide.size());
      if (format == DType::kFloat8E4M3) {
        ag::float_to_float8_saturated(wide.data(), scale, reinterpret_cast<ag::Float8E4M3*>(want.data()), wide.size());
      } else {
        ag::float_to_float8_saturated(wide.data(), scale, reinterpret_cast<ag::Float8E5M2*>(want.data()), wide.size());
      }
      const auto* got = static_cast<const uint8_t*>(q.data_ptr());
      int wrong = 0;
      // The counts as the diagnostics define them: clamped (|x * scale| rounds past the largest
      // finite value: above 464 in E4M3, whose tie rounds down to 448's even code, and from 61440
      // in E5M2, whose tie rounds up to inf's; infs too) and flushed (x nonzero and not NaN, its
      // code +-0).
      const bool e4m3 = format == DType::kFloat8E4M3;
      int64_t saturated = 0, flushed = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (got[i] != want[i] && ++wrong <= 3) {
          ADD_FAILURE() << ag::dtype_name(format) << " scale " << scale << ": " << wide[i] << " gave 0x" << std::hex
                        << int{got[i]} << ", reference 0x" << int{want[i]};
        }
        const float product = wide[i] * scale;  // in float, as the cast scales
        const float magnitude = std::fabs(product);
        saturated += !std::isnan(product) && (e4m3 ? magnitude > 464.0f : magnitude >= 61440.0f);
        flushed += wide[i] != 0.0f && !std::isnan(wide[i]) && (want[i] & 0x7f) == 0;
      }
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(cast.saturated, saturated) << ag::dtype_name(format) << " scale " << scale;
      EXPECT_EQ(cast.flushed, flushed) << ag::dtype_name(format) << " scale " << scale;
      EXPECT_GT(saturated + flushed, 0);  // every scale here moves some values out of range
      EXPECT_TRUE(std::isnan(cast.amax));  // the patterns include NaNs
    }
  }
}

// On the CPU the pair cast is the scaled cast alone: the packed GEMM reads either layout, so no
// transposed twin is made (one passed in is dropped), and the codes, amax and counts are
// quantize_float8's.
TEST(Float8Kernels, ThePairCastOnTheCpuIsTheScaledCastWithNoTwin) {
  std::vector<float> values = random_floats(33 * 65, -2, 2, 37);
  values[3] = 1e-9f;      // flushed to zero in both formats
  values[40] = 65536.0f;  // saturated in both (exact in bfloat16)
  const Tensor x = Tensor::from_vector(values, {33, 65}).to(DType::kBFloat16);
  for (DType format : ag::kFloat8DTypes) {
    Tensor want = Tensor::empty({33, 65}, format), got = Tensor::empty({33, 65}, format);
    Tensor twin = Tensor::empty({65, 33}, format);
    const ag::Float8CastCounts w = ag::kernels::cpu::quantize_float8(x, 3.0f, want);
    const ag::Float8CastCounts g = ag::kernels::quantize_float8_pair(x, 3.0f, got, twin);
    EXPECT_FALSE(twin.defined()) << ag::dtype_name(format);
    EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), 33 * 65), 0) << ag::dtype_name(format);
    EXPECT_EQ(std::bit_cast<uint32_t>(g.amax), std::bit_cast<uint32_t>(w.amax));
    EXPECT_EQ(g.amax, 65536.0f);
    EXPECT_EQ(g.saturated, w.saturated);
    EXPECT_EQ(g.flushed, w.flushed);
    EXPECT_GT(g.saturated, 0);
    EXPECT_GT(g.flushed, 0);
  }
}

// The FP8 linear with transposed twins (the CUDA path's choice of operands, flags and saved
// tensors, made to run on the CPU) gives the bits it gives without them: y, dx, dw and db, for
// every combination of gradients wanted, with a 3-D input, in both scalings.
TEST(Float8Linear, TwinLayoutsGiveThePlainLayoutsBits) {
  struct TwinsOn {
    TwinsOn() { ag::kernels::cpu::make_twins_for_testing(true); }
    ~TwinsOn() { ag::kernels::cpu::make_twins_for_testing(false); }
  };
  const Tensor x0 = random_tensor({2, 5, 12}, -2, 2, 51), w0 = random_tensor({7, 12}, -1, 1, 52);
  const Tensor b0 = random_tensor({7}, -1, 1, 53), dy = random_tensor({2, 5, 7}, -1, 1, 54);
  for (auto scaling : {ag::amp::Float8Scaling::kDelayed, ag::amp::Float8Scaling::kCurrent}) {
    for (int wanted = 0; wanted < 8; ++wanted) {  // bits: x, w, b need a gradient
      const auto run = [&](bool twins) {
        std::optional<TwinsOn> on;
        if (twins) on.emplace();
        Tensor x = x0.detach(), w = w0.detach(), b = b0.detach();
        x.set_requires_grad((wanted & 1) != 0);
        w.set_requires_grad((wanted & 2) != 0);
        b.set_requires_grad((wanted & 4) != 0);
        std::vector<float> out;
        for (int step = 0; step < 2; ++step) {  // the second step casts at delayed scaling's new scales
          Tensor y;
          {
            Float8Guard fp8(ag::Device::kCPU, {.scaling = scaling});
            y = ag::ops::linear(x, w, b);
          }
          const std::vector<float> values = y.to_vector();
          out.insert(out.end(), values.begin(), values.end());
          if (wanted != 0) y.backward(dy);
        }
        for (const Tensor& t : {x, w, b}) {
          if (!t.requires_grad()) continue;
          const std::vector<float> g = t.grad().to_vector();
          out.insert(out.end(), g.begin(), g.end());
        }
        return out;
      };
      EXPECT_EQ(run(true), run(false)) << "gradients wanted " << wanted;
    }
  }
}

// Every code through the packed GEMM (k = 16, so it is packed and its runs decoded by vectors):
// a's first column holds the 256 codes, b picks it, so c is each code's value, NaN and inf too.
TEST(Float8Gemm, EveryCodeIsDecodedExactlyByThePacking) {
  for (DType format : ag::kFloat8DTypes) {
    for (auto ta : {ag::kernels::Transpose::kNo, ag::kernels::Transpose::kYes}) {
      const bool at = ta == ag::kernels::Transpose::kYes;
      Tensor a = ag::zeros(at ? ag::Shape{16, 256} : ag::Shape{256, 16}, format);
      auto* codes = static_cast<uint8_t*>(a.data_ptr());
      for (int c = 0; c < 256; ++c) codes[at ? c : c * 16] = static_cast<uint8_t>(c);
      std::vector<float> pick(16 * 32, 0.0f);
      for (int j = 0; j < 32; ++j) pick[static_cast<size_t>(j)] = 1.0f;  // row 0 of b
      const Tensor b = Tensor::from_vector(pick, {16, 32}).to(format);
      Tensor c = Tensor::empty({256, 32}, DType::kFloat32);
      ag::kernels::gemm(a, ta, b, ag::kernels::Transpose::kNo, Tensor(), c);
      const std::vector<float> got = c.to_vector();
      for (int code = 0; code < 256; ++code) {
        const float want = format == DType::kFloat8E4M3 ? ag::float8_to_float(ag::Float8E4M3{static_cast<uint8_t>(code)})
                                                        : ag::float8_to_float(ag::Float8E5M2{static_cast<uint8_t>(code)});
        for (int j = 0; j < 32; j += 31) {
          const float v = got[static_cast<size_t>(code * 32 + j)];
          EXPECT_TRUE(std::isnan(want) ? std::isnan(v) : v == want) << ag::dtype_name(format) << " code " << code << ": " << v;
        }
      }
    }
  }
}

// Current scaling: each tensor's scale is fp8_max / its own amax, so the test knows every operand.
// FP32 throughout with the hybrid formats; then BF16 x and dy under BF16 autocast with E4M3 for
// the gradient too.
struct ProductCase {
  ag::amp::Float8Format format;
  DType x_dtype;
};
class Float8LinearProducts : public ::testing::TestWithParam<ProductCase> {};

TEST_P(Float8LinearProducts, ForwardAndGradientsAreTheScaledFp8Products) {
  const auto [format, x_dtype] = GetParam();
  const bool bf16 = x_dtype == DType::kBFloat16;
  const int64_t batch = 2, rows = 19, in = 70, out = 33;
  const Tensor x = leaf(random_tensor({batch, rows, in}, -3, 3, 3).to(x_dtype));
  const Tensor w = leaf(random_tensor({out, in}, -0.2, 0.2, 4));
  const Tensor b = leaf(random_tensor({out}, -1, 1, 5));
  const Tensor g = random_tensor({batch, rows, out}, -1e-3, 1e-3, 6).to(x_dtype);
  Tensor y;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16, /*enabled=*/bf16);
    Float8Guard fp8(ag::Device::kCPU, {.format = format, .scaling = ag::amp::Float8Scaling::kCurrent});
    y = ag::ops::linear(x, w, b);
  }
  EXPECT_EQ(y.dtype(), x_dtype);
  EXPECT_EQ(y.shape(), (ag::Shape{batch, rows, out}));
  y.backward(g);  // outside the guard: the recorded FP8 backward runs all the same
  EXPECT_EQ(x.grad().dtype(), x_dtype);
  EXPECT_EQ(w.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(b.grad().dtype(), DType::kFloat32);

  const DType grad_format = format == ag::amp::Float8Format::kHybrid ? DType::kFloat8E5M2 : DType::kFloat8E4M3;
  const std::vector<float> xv = x.to_vector(), wv = w.to_vector(), gv = g.to_vector(), bv = b.to_vector();
  const float sx = 448.0f / amax_of(xv), sw = 448.0f / amax_of(wv);
  const float sg = static_cast<float>(ag::dtype_info(grad_format).max) / amax_of(gv);
  const std::vector<double> xq = rounded(xv, sx, DType::kFloat8E4M3), wq = rounded(wv, sw, DType::kFloat8E4M3),
                            gq = rounded(gv, sg, grad_format);
  const int64_t m = batch * rows;
  std::vector<double> want_y = matmul(xq, in, 1, wq, 1, in, m, out, in, 1.0 / sx / sw);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < out; ++j) want_y[static_cast<size_t>(i * out + j)] += bv[static_cast<size_t>(j)];
  }
  const double tol = bf16 ? 4e-3 : 2e-6;  // BF16 results: one rounding, 2^-9 relative
  expect_close_to_largest(y.to_vector(), want_y, tol, "y");
  expect_close_to_largest(x.grad().to_vector(), matmul(gq, out, 1, wq, in, 1, m, in, out, 1.0 / sg / sw), tol, "dx");
  expect_close_to_largest(w.grad().to_vector(), matmul(gq, 1, out, xq, in, 1, out, in, m, 1.0 / sg / sx), 2e-6, "dw");
  std::vector<double> want_db(static_cast<size_t>(out), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < out; ++j) want_db[static_cast<size_t>(j)] += gv[static_cast<size_t>(i * out + j)];
  }
  expect_close_to_largest(b.grad().to_vector(), want_db, bf16 ? 4e-3 : 1e-6, "db");
  // The FP8 result is not the float one: 3 mantissa bits cost about 2^-4 relative a product.
  const Tensor y32 = ag::ops::linear(x.detach().to(DType::kFloat32), w.detach(), b.detach());
  double worst = 0.0;
  const std::vector<float> a = y.to_vector(), c = y32.to_vector();
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - c[i]));
  EXPECT_GT(worst, 1e-4);
  EXPECT_LT(worst, 0.5);
}

INSTANTIATE_TEST_SUITE_P(Cases, Float8LinearProducts,
                         ::testing::Values(ProductCase{ag::amp::Float8Format::kHybrid, DType::kFloat32},
                                           ProductCase{ag::amp::Float8Format::kE4M3, DType::kBFloat16}),
                         [](const ::testing::TestParamInfo<ProductCase>& info) {
                           return std::string(info.param.format == ag::amp::Float8Format::kHybrid ? "hybrid" : "e4m3") +
                                  "_" + std::string(ag::dtype_name(info.param.x_dtype));
                         });

// Each step casts with the scale from the steps before it (none before the first: scale 1): the
// window's max over the last 4 steps, or the last step alone; the amaxes go up and down so the
// two differ. The weight's own scale and its output gradient's follow the same way.
TEST(Float8Linear, DelayedScalingCastsWithThePastStepsAmax) {
  const std::vector<float> spreads{4.0f, 1.0f, 2.0f, 8.0f, 1.0f, 1.0f, 0.5f, 0.5f};
  for (auto compute : {ag::amp::Float8AmaxCompute::kMax, ag::amp::Float8AmaxCompute::kMostRecent}) {
    SCOPED_TRACE(compute == ag::amp::Float8AmaxCompute::kMax ? "max" : "most recent");
    const Tensor w = leaf(random_tensor({8, 16}, -0.5, 0.5, 7));
    const float w_amax = amax_of(w.to_vector());
    const Float8Recipe recipe{.amax_history_len = 4, .amax_compute = compute};
    std::vector<float> amaxes;
    for (size_t step = 0; step < spreads.size(); ++step) {
      const Tensor x = random_tensor({5, 16}, -spreads[step], spreads[step], 10 + step);
      amaxes.push_back(amax_of(x.to_vector()));
      {
        Float8Guard fp8(ag::Device::kCPU, recipe);
        ag::ops::sum(ag::ops::linear(x, w)).backward();  // dy = 1 everywhere
        ag::ops::linear(x, w);  // a second use in the same step records into the same slot
      }
      const ag::Float8LinearState* state = ag::amp::float8_state(w);
      ASSERT_NE(state, nullptr);
      float past = 0.0f;  // the amax this step's scale came from
      for (size_t s = step >= 4 ? step - 4 : 0; s < step; ++s) {
        past = compute == ag::amp::Float8AmaxCompute::kMax ? std::max(past, amaxes[s]) : amaxes[s];
      }
      EXPECT_EQ(state->input.scale(), step == 0 ? 1.0f : 448.0f / past) << step;
      EXPECT_EQ(state->input.amax_history()[0], amaxes.back()) << step;
      EXPECT_EQ(state->input.amax_history().size(), 4u);
      EXPECT_EQ(state->weight.scale(), step == 0 ? 1.0f : 448.0f / w_amax) << step;
      EXPECT_EQ(state->grad_output.scale(), step == 0 ? 1.0f : 57344.0f) << step;
      EXPECT_EQ(state->grad_output.amax_history()[0], 1.0f) << step;
    }
  }
}

// A weight computed in the forward is a new tensor every step: it keeps no state, and its linear
// scales by current amaxes (delayed scaling would cast it at scale 1 forever).
TEST(Float8Linear, AComputedWeightScalesByCurrentAmaxes) {
  const Tensor x = random_tensor({6, 16}, -1e-3, 1e-3, 30);
  const Tensor w = leaf(random_tensor({4, 16}, -1e-3, 1e-3, 31));
  Tensor computed, y_delayed, y_current;
  {
    Float8Guard fp8(ag::Device::kCPU);  // delayed
    computed = ag::ops::mul(w, ag::ones({1}));
    y_delayed = ag::ops::linear(x, computed);
  }
  {
    Float8Guard fp8(ag::Device::kCPU, {.scaling = ag::amp::Float8Scaling::kCurrent});
    y_current = ag::ops::linear(x, w.detach());
  }
  EXPECT_EQ(ag::amp::float8_state(computed), nullptr);
  EXPECT_EQ(y_delayed.to_vector(), y_current.to_vector());
}

// The recompute of a checkpointed block runs in the forward's FP8 region, with its scales: the
// gradients are those of the same block run without checkpointing, bit for bit.
TEST(Float8Linear, ActivationCheckpointingRecomputesInFp8) {
  const Tensor x = random_tensor({8, 16}, -1, 1, 32);
  const auto run = [&](bool checkpointed, bool fp8) {
    ag::manual_seed(6);
    ag::nn::Sequential block{ag::nn::Linear(16, 32), ag::nn::GELU(), ag::nn::Linear(32, 16)};
    const Tensor input = leaf(x.detach());
    Tensor y;
    {
      Float8Guard guard(ag::Device::kCPU, {}, fp8);
      const auto fn = [&](const std::vector<Tensor>& in) { return block(in[0]); };
      y = checkpointed ? ag::utils::checkpoint(fn, {input}) : fn({input});
    }
    ag::ops::sum(ag::ops::mul(y, y)).backward();
    std::vector<float> grads = input.grad().to_vector();
    for (const Tensor& p : block.parameters()) {
      const std::vector<float> g = p.grad().to_vector();
      grads.insert(grads.end(), g.begin(), g.end());
    }
    return grads;
  };
  const std::vector<float> plain = run(false, true);
  EXPECT_EQ(run(true, true), plain);
  EXPECT_NE(run(false, false), plain);  // and FP8 did run
}

// A checkpointed forward whose backward (and so its recompute) comes after the next step's
// forward, as with micro-batches whose backwards run late: the next forward has closed the step and
// changed the scales (delayed scaling: the first step cast at 1, the second at 448 / amax), yet the
// recompute casts with its own step's scales and records nothing, so the gradients are the bits of
// the same run without checkpointing, in either scaling.
TEST(Float8Linear, ARecomputeAfterTheNextForwardCastsWithItsOwnStepsScales) {
  const Tensor x1 = random_tensor({8, 16}, -1, 1, 41), x2 = random_tensor({8, 16}, -3, 3, 42);
  for (auto scaling : {ag::amp::Float8Scaling::kDelayed, ag::amp::Float8Scaling::kCurrent}) {
    const auto run = [&](bool checkpointed) {
      ag::manual_seed(6);
      ag::nn::Sequential block{ag::nn::Linear(16, 32), ag::nn::GELU(), ag::nn::Linear(32, 16)};
      const auto fn = [&](const std::vector<Tensor>& in) { return block(in[0]); };
      const Tensor input = leaf(x1.detach());
      Tensor y1, y2;
      {
        Float8Guard guard(ag::Device::kCPU, {.scaling = scaling});
        y1 = checkpointed ? ag::utils::checkpoint(fn, {input}) : fn({input});
      }
      {
        Float8Guard guard(ag::Device::kCPU, {.scaling = scaling});
        y2 = fn({x2});
      }
      ag::ops::sum(ag::ops::mul(y1, y1)).backward();
      std::vector<float> grads = input.grad().to_vector();
      for (const Tensor& p : block.parameters()) {
        const std::vector<float> g = p.grad().to_vector();
        grads.insert(grads.end(), g.begin(), g.end());
      }
      // And the states saw what the plain run's did: the recompute added no amax.
      for (const Tensor& p : block.parameters()) {
        if (const ag::Float8LinearState* s = ag::amp::float8_state(p)) {
          grads.push_back(s->input.amax_history()[0]);
          grads.push_back(s->weight.scale());
        }
      }
      return grads;
    };
    EXPECT_EQ(run(true), run(false)) << (scaling == ag::amp::Float8Scaling::kDelayed ? "delayed" : "current");
  }
}

// The saturating cast maps inf to +-448: a linear with a non-finite operand returns NaN rather
// than finite values, so GradScaler sees the overflow (a bias-free layer has no other path).
TEST(Float8Linear, AnInfiniteOperandGivesNaNNotASaturatedProduct) {
  const Tensor w = leaf(random_tensor({3, 8}, -1, 1, 33));
  std::vector<float> xs = random_floats(4 * 8, -1, 1, 34);
  Tensor y;
  {
    Float8Guard fp8(ag::Device::kCPU);
    y = ag::ops::linear(Tensor::from_vector(xs, {4, 8}), w);
  }
  EXPECT_TRUE(ag::test::all_finite(y));
  std::vector<float> g(4 * 3, 1.0f);
  g[5] = INFINITY;
  y.backward(Tensor::from_vector(g, {4, 3}));
  for (float v : w.grad().to_vector()) EXPECT_TRUE(std::isnan(v));
  xs[3] = -INFINITY;
  {
    Float8Guard fp8(ag::Device::kCPU);
    for (float v : ag::ops::linear(Tensor::from_vector(xs, {4, 8}), w.detach()).to_vector()) EXPECT_TRUE(std::isnan(v));
  }
}

TEST(Float8Linear, ANestedGuardKeepsItsStep) {
  const auto step = [] { return ag::fp8::region(ag::Device::kCPU).step; };
  EXPECT_EQ(step(), 0u);
  uint64_t outer = 0;
  {
    Float8Guard a(ag::Device::kCPU);
    outer = step();
    EXPECT_GT(outer, 0u);
    {
      Float8Guard off(ag::Device::kCPU, {}, false);
      Float8Guard on(ag::Device::kCPU);
      EXPECT_EQ(step(), outer);
    }
  }
  EXPECT_EQ(step(), 0u);
  {
    Float8Guard off(ag::Device::kCPU, {}, false);
    EXPECT_EQ(step(), 0u);
    Float8Guard on(ag::Device::kCPU);
    EXPECT_GT(step(), outer);
  }
}

TEST(Float8Linear, OutputTakesTheAutocastDtypeAndNnLinearRunsInFp8) {
  ag::manual_seed(3);
  ag::nn::Linear layer(24, 12);
  const Tensor x = random_tensor({6, 24}, -1, 1, 8);
  Tensor y, h;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
    Float8Guard fp8(ag::Device::kCPU, {.scaling = ag::amp::Float8Scaling::kCurrent});
    y = layer(x);
    h = ag::ops::relu(y);
  }
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_EQ(h.dtype(), DType::kBFloat16);
  ASSERT_NE(ag::amp::float8_state(layer.weight), nullptr);
  ag::ops::sum(ag::ops::cast(h, DType::kFloat32)).backward();
  EXPECT_EQ(layer.weight.grad().dtype(), DType::kFloat32);
  EXPECT_TRUE(ag::test::all_finite(layer.weight.grad()));
  // enabled = false inside turns FP8 off: no state for a fresh weight.
  ag::nn::Linear other(24, 12);
  {
    Float8Guard fp8(ag::Device::kCPU);
    EXPECT_TRUE(ag::amp::is_float8_enabled(ag::Device::kCPU));
    Float8Guard off(ag::Device::kCPU, {}, false);
    EXPECT_FALSE(ag::amp::is_float8_enabled(ag::Device::kCPU));
    other(x);
  }
  EXPECT_FALSE(ag::amp::is_float8_enabled(ag::Device::kCPU));
  EXPECT_EQ(ag::amp::float8_state(other.weight), nullptr);
}

TEST(Float8Linear, BadInputNamesTheOpAndBadRecipesTheField) {
  const Tensor x = random_tensor({4, 5}, -1, 1, 9), w = random_tensor({3, 6}, -1, 1, 10);
  {
    Float8Guard fp8(ag::Device::kCPU);
    EXPECT_ERROR([&] { ag::ops::linear(x, w); }, "linear", "5 features", "[3, 6]");
    EXPECT_ERROR([&] { ag::ops::linear(x.to(DType::kFloat8E4M3), w); }, "linear", "8-bit");
  }
  EXPECT_ERROR([] { Float8Guard fp8(ag::Device::kCPU, {.amax_history_len = 0}); }, "Float8Guard", "amax_history_len");
  EXPECT_FALSE(ag::amp::is_float8_enabled(ag::Device::kCPU));
}

// A teacher-student regression in FP8 (delayed scaling, the default recipe) ends near FP32's loss.
TEST(Float8Linear, TrainsAsFarAsFp32OnASmallRegression) {
  const Tensor x = random_tensor({256, 16}, -1, 1, 11);
  ag::manual_seed(1);
  ag::nn::Sequential teacher{ag::nn::Linear(16, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
  Tensor target;
  {
    ag::NoGradGuard no_grad;
    target = teacher(x);
  }
  const auto train = [&](bool fp8) {
    ag::manual_seed(2);
    ag::nn::Sequential student{ag::nn::Linear(16, 32), ag::nn::ReLU(), ag::nn::Linear(32, 1)};
    ag::optim::Adam opt(student.parameters(), {.lr = 3e-3});
    float loss_value = 0.0f;
    for (int step = 0; step < 300; ++step) {
      opt.zero_grad();
      Tensor loss;
      {
        Float8Guard guard(ag::Device::kCPU, {}, fp8);
        loss = ag::ops::mse_loss(student(x), target);
      }
      loss.backward();
      opt.step();
      loss_value = loss.item<float>();
    }
    return loss_value;
  };
  const float fp32 = train(false), fp8 = train(true);
  RecordProperty("fp32_loss", std::to_string(fp32));
  RecordProperty("fp8_loss", std::to_string(fp8));
  EXPECT_LT(fp32, 1e-3f);  // measured 1.2e-4 (FP8 1.3e-4)
  EXPECT_LT(fp8, 2.0f * fp32 + 1e-4f) << "fp32 " << fp32;
}

// FP8 linears inside FP16 autocast with a GradScaler: the scaled loss's gradients (x 2^16) are
// cast to E5M2 by their own scale, so the scale of the loss does not overflow them; the run
// trains, and an inf in one step's input is seen by the scaler, which skips that step alone.
TEST(Float8Linear, TrainsWithFp16AutocastAndAGradScaler) {
  const Tensor x = random_tensor({128, 16}, -1, 1, 40);
  ag::manual_seed(7);
  ag::nn::Sequential teacher{ag::nn::Linear(16, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1)};
  Tensor target;
  {
    ag::NoGradGuard no_grad;
    target = teacher(x);
  }
  ag::manual_seed(8);
  ag::nn::Sequential model{ag::nn::Linear(16, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1)};
  ag::optim::Adam opt(model.parameters(), {.lr = 3e-3});
  ag::amp::GradScaler scaler;
  std::vector<float> losses;
  int skipped = 0;
  for (int step = 0; step < 150; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kFloat16);
      Float8Guard fp8(ag::Device::kCPU);
      const Tensor input = step == 100 ? x * INFINITY : x;
      loss = ag::ops::mse_loss(model(input), target);
    }
    scaler.scale(loss).backward();
    skipped += scaler.step(opt) ? 0 : 1;
    scaler.update();
    losses.push_back(loss.item<float>());
  }
  EXPECT_EQ(skipped, 1);
  EXPECT_LT(losses.back(), 0.1f * losses.front());
}

// A run saved after some FP8 steps and resumed in a fresh process state continues bit for bit:
// parameters, Adam's state and every weight's amax history and scale.
TEST(Float8Linear, CheckpointResumesDelayedScalingBitForBit) {
  ag::test::ScratchDir scratch("float8_linear_test");
  const Tensor x = random_tensor({64, 12}, -2, 2, 20), target = random_tensor({64, 3}, -1, 1, 21);
  struct Run {
    std::unique_ptr<ag::nn::Sequential> model;
    std::unique_ptr<ag::optim::Adam> opt;
  };
  const auto make = [] {
    ag::manual_seed(4);
    Run r;
    r.model = std::make_unique<ag::nn::Sequential>(ag::nn::Linear(12, 16), ag::nn::ReLU(), ag::nn::Linear(16, 3));
    r.opt = std::make_unique<ag::optim::Adam>(r.model->parameters(), ag::optim::AdamOptions{.lr = 1e-2});
    return r;
  };
  const Float8Recipe recipe{.amax_history_len = 3};
  const auto step = [&](Run& r) {
    r.opt->zero_grad();
    Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
      Float8Guard fp8(ag::Device::kCPU, recipe);
      loss = ag::ops::mse_loss(r.model->operator()(x), target);
    }
    loss.backward();
    r.opt->step();
  };
  Run straight = make();
  for (int i = 0; i < 5; ++i) step(straight);
  const std::string path = scratch.path("fp8.safetensors");
  ag::checkpoint::save_checkpoint(path, {.model = straight.model.get(), .optimizer = straight.opt.get()});
  for (int i = 0; i < 5; ++i) step(straight);

  Run resumed = make();
  step(resumed);  // state that the load must replace, FP8 states included
  ag::checkpoint::TrainingState state{.model = resumed.model.get(), .optimizer = resumed.opt.get()};
  ag::checkpoint::load_checkpoint(path, state);
  for (int i = 0; i < 5; ++i) step(resumed);

  const auto a = straight.model->named_parameters(), b = resumed.model->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  int with_state = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second.to_vector(), b[i].second.to_vector()) << a[i].first;
    const ag::Float8LinearState* sa = ag::amp::float8_state(a[i].second);
    const ag::Float8LinearState* sb = ag::amp::float8_state(b[i].second);
    ASSERT_EQ(sa == nullptr, sb == nullptr) << a[i].first;
    if (sa == nullptr) continue;
    ++with_state;
    for (auto member : {&ag::Float8LinearState::input, &ag::Float8LinearState::weight,
                        &ag::Float8LinearState::grad_output}) {
      EXPECT_EQ((sa->*member).scale(), (sb->*member).scale()) << a[i].first;
      EXPECT_EQ((sa->*member).amax_history(), (sb->*member).amax_history()) << a[i].first;
    }
  }
  EXPECT_EQ(with_state, 2);  // the two weights; biases have none
}

TEST(Float8Linear, BadFp8StateInACheckpointChangesNothing) {
  ag::test::ScratchDir scratch("float8_linear_test");
  ag::manual_seed(5);
  ag::nn::Linear layer(4, 2);
  {
    Float8Guard fp8(ag::Device::kCPU);
    layer(random_tensor({3, 4}, -1, 1, 22));
  }
  const std::string path = scratch.path("good.safetensors");
  ag::checkpoint::save_checkpoint(path, {.model = &layer});
  ag::checkpoint::NamedTensors file = ag::checkpoint::load_safetensors(path);
  for (auto& [name, t] : file.tensors) {
    if (name == "fp8.weight.input.scale") t = Tensor::from_vector(std::vector<float>{0.0f}, {1});
  }
  file.metadata = ag::checkpoint::load_safetensors(path).metadata;
  const std::string bad = scratch.path("bad.safetensors");
  ag::checkpoint::save_safetensors(bad, file);
  const ag::Float8LinearState* before = ag::amp::float8_state(layer.weight);
  const std::vector<float> weights = layer.weight.to_vector();
  ag::checkpoint::TrainingState state{.model = &layer};
  EXPECT_ERROR([&] { ag::checkpoint::load_checkpoint(bad, state); }, "FP8", "weight", "input", "scale");
  EXPECT_EQ(ag::amp::float8_state(layer.weight), before);
  EXPECT_EQ(layer.weight.to_vector(), weights);
}

// Unscaled, gradients of 1e-6 flush to zero in E5M2 (smallest subnormal 1.5e-5); scaled, they live.
TEST(Float8Linear, WithoutScalingSmallGradientsFlushToZero) {
  const Tensor x = random_tensor({32, 8}, -1, 1, 23);
  const Tensor g = random_tensor({32, 4}, -1e-6, 1e-6, 24);
  for (auto scaling : {ag::amp::Float8Scaling::kNone, ag::amp::Float8Scaling::kCurrent}) {
    const Tensor w = leaf(random_tensor({4, 8}, -1, 1, 25));
    {
      Float8Guard fp8(ag::Device::kCPU, {.scaling = scaling});
      ag::ops::linear(x, w).backward(g);
    }
    int zeros = 0;
    for (float v : w.grad().to_vector()) zeros += v == 0.0f;
    if (scaling == ag::amp::Float8Scaling::kNone) {
      EXPECT_EQ(zeros, 32);
      EXPECT_EQ(ag::amp::float8_state(w)->grad_output.scale(), 1.0f);
    } else {
      EXPECT_EQ(zeros, 0);
    }
  }
}

}  // namespace
