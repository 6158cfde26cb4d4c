// The fused scaled_dot_product_attention (ops/attention/) against float64 and against the
// composed path it replaces: values and the gradients of q, k and v in float32, bfloat16 and
// float16, causal or not, ragged lengths and head sizes, Tq != Tk; its accuracy at large scores;
// the memory it keeps for the backward; its independence from the thread count; the backend
// switch; the scale and dropout options; and self_attention, which reads the heads where they lie
// in a fused qkv projection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "amp/autocast.h"
#include "framework/autograd.h"
#include "framework/cpu_features.h"
#include "framework/parallel.h"
#include "attention_cases.h"
#include "ops/attention/attention_kernels.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Shape;
using ag::Tensor;
using ag::ops::AttentionBackend;
using ag::ops::AttentionBackendGuard;

namespace {

Tensor values(Shape shape, uint64_t seed, double magnitude = 1.0) {
  return Tensor::from_vector(ag::test::random_values(static_cast<size_t>(ag::shape_numel(shape)), -magnitude, magnitude,
                                                     seed),
                             shape, DType::kFloat64);
}

ag::test::TensorFn attention(AttentionBackend backend, bool causal, double dropout_p = 0.0) {
  return [backend, causal, dropout_p](const std::vector<Tensor>& in) {
    AttentionBackendGuard guard(backend);
    ag::manual_seed(11);  // the same dropout mask every time
    return ag::ops::scaled_dot_product_attention(in[0], in[1], in[2], {.dropout_p = dropout_p, .is_causal = causal});
  };
}

const std::vector<DType> kCpuDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// A number where is_causal goes (PyTorch's positional dropout_p or scale) does not compile: it
// would have become is_causal = true. AttentionOptions names them.
template <typename Arg>
concept TakesAsIsCausal = requires(const Tensor& t, Arg arg) { ag::ops::scaled_dot_product_attention(t, t, t, arg); };
template <typename Arg>
concept SelfAttentionTakesAsIsCausal = requires(const Tensor& t, Arg arg) { ag::ops::self_attention(t, 2, arg); };
static_assert(TakesAsIsCausal<bool> && !TakesAsIsCausal<double> && !TakesAsIsCausal<float>);
static_assert(SelfAttentionTakesAsIsCausal<bool> && !SelfAttentionTakesAsIsCausal<double>);

TEST(FusedAttention, MatchesFloat64AtLeastAsWellAsTheComposedPath) {
  for (const ag::test::AttentionCase& c : ag::test::attention_cases()) {
    EXPECT_TRUE(ag::test::fused_attention_as_accurate_as_composed(ag::Device::kCPU, c, kCpuDTypes));
  }
}

// Scores up to ~600 (q and k uniform in [-24, 24] over D = 16): a float32 score carries an absolute
// rounding error of ~4e-5, which every probability inherits. PyTorch's fused CPU kernel is far more
// accurate there than its math path; ours must be at least as accurate as the composed one.
TEST(FusedAttention, LargeScoresAreAsAccurateAsTheComposedPath) {
  const ag::test::AttentionCase c{.batch = 1, .heads = 2, .tq = 64, .tk = 64, .d = 16, .dv = 16, .causal = true};
  EXPECT_TRUE(ag::test::fused_attention_as_accurate_as_composed(ag::Device::kCPU, c, kCpuDTypes, /*magnitude=*/24.0));
  // In 16 bits the composed path rounds the scores (~600) to the dtype before its softmax; the
  // fused kernel keeps them in float32: at least 10x more accurate (measured 40-60x).
  EXPECT_TRUE(ag::test::fused_attention_as_accurate_as_composed(ag::Device::kCPU, c,
                                                                {DType::kBFloat16, DType::kFloat16},
                                                                /*magnitude=*/24.0, /*ratio=*/0.1));
}

TEST(FusedAttention, KeepsNothingOfSizeTByTForTheBackward) {
  EXPECT_TRUE(ag::test::fused_attention_keeps_no_scores(ag::Device::kCPU, DType::kFloat32));
  EXPECT_TRUE(ag::test::fused_attention_keeps_no_scores(ag::Device::kCPU, DType::kBFloat16));
  EXPECT_TRUE(ag::test::fused_attention_keeps_no_scores(ag::Device::kCPU, DType::kFloat16));
}

TEST(FusedAttention, ResultsDoNotDependOnTheThreadCount) {
  const std::vector<Tensor> inputs = {values({2, 3, 150, 32}, 1), values({2, 3, 150, 32}, 2), values({2, 3, 150, 32}, 3)};
  const int threads = ag::num_threads();
  for (double dropout_p : {0.0, 0.3}) {
    ag::set_num_threads(1);
    const ag::test::Evaluated one =
        ag::test::evaluate(attention(AttentionBackend::kFused, true, dropout_p), inputs, DType::kBFloat16);
    ag::set_num_threads(3);
    const ag::test::Evaluated three =
        ag::test::evaluate(attention(AttentionBackend::kFused, true, dropout_p), inputs, DType::kBFloat16);
    ag::set_num_threads(threads);
    EXPECT_EQ(one.out, three.out) << "dropout " << dropout_p;
    EXPECT_EQ(one.grads, three.grads) << "dropout " << dropout_p;
  }
}

// Under BF16 autocast the fused kernel (on the cast inputs) and the composed path (bfloat16
// matmuls, float32 softmax and dropout) drop the same probabilities: their outputs agree to
// bfloat16's rounding, while another mask's output is far off.
TEST(FusedAttention, DropoutUnderAutocastDropsWhatTheComposedPathDrops) {
  const Tensor q = values({2, 2, 70, 32}, 1).to(DType::kFloat32), k = values({2, 2, 90, 32}, 2).to(DType::kFloat32);
  const Tensor v = values({2, 2, 90, 32}, 3).to(DType::kFloat32);
  const auto run = [&](AttentionBackend backend, uint64_t seed) {
    AttentionBackendGuard guard(backend);
    ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kBFloat16);
    ag::manual_seed(seed);
    const Tensor out = ag::ops::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .is_causal = true});
    EXPECT_EQ(out.dtype(), DType::kBFloat16);
    return out;
  };
  const Tensor fused = run(AttentionBackend::kFused, 3);
  EXPECT_LT(ag::test::max_abs_diff(fused, run(AttentionBackend::kComposed, 3)), 0.05);
  EXPECT_GT(ag::test::max_abs_diff(fused, run(AttentionBackend::kComposed, 4)), 0.3);
}

// The loops between the CPU kernel's tile products (the online softmax, the backward's
// probabilities and score gradients) at each level against the baseline's, bit for bit: a row
// block across the causal diagonal, keys beyond the queries and the reverse.
TEST(FusedAttention, EveryLevelOfItsCpuLoopsGivesTheBaselinesBits) {
  using ag::CpuIsa;
  if (!ag::cpu_supports(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "the AVX-512 loops cannot run here: " << ag::cpu_unsupported_reason(CpuIsa::kAvx512);
  }
  if (static_cast<int>(ag::effective_cpu_isa()) < static_cast<int>(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "AMPGRAD_CPU_ISA=" << ag::cpu_isa_name(ag::cpu_isa()) << " caps the level below avx512";
  }
  struct Case {
    int64_t tq, tk, d;
    bool causal;
    double dropout_p = 0.0;
  };
  for (const Case& c : {Case{200, 200, 64, true}, Case{65, 200, 32, true}, Case{200, 65, 32, true},
                        Case{150, 150, 16, false}, Case{200, 130, 32, true, 0.3}}) {
    for (const DType dtype : kCpuDTypes) {
      ag::kernels::AttentionShape shape{.batch = 2,
                                        .tq = c.tq,
                                        .tk = c.tk,
                                        .d = c.d,
                                        .dv = c.d,
                                        .causal = c.causal,
                                        .scale = 1.0 / std::sqrt(static_cast<double>(c.d)),
                                        .dropout_p = c.dropout_p,
                                        .dropout_seed = 77};
      shape = shape.with_contiguous_layouts();
      const Tensor q = values({2, c.tq, c.d}, 1, 3.0).to(dtype), k = values({2, c.tk, c.d}, 2, 3.0).to(dtype),
                   v = values({2, c.tk, c.d}, 3).to(dtype), dout = values({2, c.tq, c.d}, 4).to(dtype);
      std::vector<Tensor> results[2];
      const CpuIsa levels[2] = {CpuIsa::kBaseline, CpuIsa::kAvx512};
      for (int l = 0; l < 2; ++l) {
        Tensor out = Tensor::empty(q.shape(), dtype), lse = Tensor::empty({2, c.tq, 2});
        Tensor dq = Tensor::empty(q.shape(), dtype), dk = Tensor::empty(k.shape(), dtype),
               dv = Tensor::empty(v.shape(), dtype);
        ag::kernels::cpu::flash_attention(q, k, v, shape, out, lse, levels[l]);
        ag::kernels::cpu::flash_attention_backward(q, k, v, out, lse, dout, shape, dq, dk, dv, levels[l]);
        results[l] = {out, lse, dq, dk, dv};
      }
      const char* names[] = {"out", "lse", "dq", "dk", "dv"};
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_TRUE(ag::test::same_bits(results[0][i], results[1][i]))
            << names[i] << ", Tq " << c.tq << " Tk " << c.tk << (c.causal ? " causal, " : ", ")
            << (c.dropout_p > 0 ? "dropout, " : "") << ag::dtype_name(dtype);
      }
    }
  }
}

TEST(FusedAttention, AutocastRunsItInTheLowerPrecision) {
  for (DType low : ag::kLowPrecisionDTypes) {
    Tensor q = values({1, 2, 70, 16}, 1).to(DType::kFloat32);
    q.set_requires_grad(true);
    Tensor out;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCPU, low);
      out = ag::ops::scaled_dot_product_attention(q, q, q, true);
    }
    EXPECT_EQ(out.dtype(), low);
    EXPECT_EQ(out.grad_fn()->name(), "scaled_dot_product_attention");
    ag::ops::sum(out).backward();
    EXPECT_EQ(q.grad().dtype(), DType::kFloat32);  // through the recorded cast
    EXPECT_TRUE(ag::test::all_finite(q.grad()));
  }
}

TEST(SelfAttention, ReadsTheHeadsWhereTheyLieInQkvAndMatchesSplittingThem) {
  EXPECT_TRUE(ag::test::self_attention_reads_the_heads_in_place(ag::Device::kCPU, kCpuDTypes, 2, 70, 3, 16));
  EXPECT_TRUE(ag::test::self_attention_reads_the_heads_in_place(ag::Device::kCPU, kCpuDTypes, 1, 130, 2, 80));
  EXPECT_TRUE(ag::test::self_attention_reads_the_heads_in_place(ag::Device::kCPU, {DType::kFloat32}, 3, 1, 4, 8));
}

TEST(SelfAttention, FallsBackToTheCompositionAndRejectsBadShapes) {
  const Tensor wide = values({2, 5, 12}, 4);  // float64: the composed path
  Tensor leaf = wide.detach();
  leaf.set_requires_grad(true);
  const Tensor out = ag::ops::self_attention(leaf, 2, true);
  EXPECT_EQ(out.shape(), (ag::Shape{2, 5, 4}));
  EXPECT_EQ(out.grad_fn()->name(), "reshape");
  {
    AttentionBackendGuard fused(AttentionBackend::kFused);
    EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::self_attention(wide, 2, true); },
                                       {"self_attention", "float64", "kFused", "[2, 5, 12]"}));
  }
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::self_attention(wide, 3, true); },
                                     {"self_attention", "3 x n_head x D", "[2, 5, 12]", "n_head 3"}));
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::self_attention(values({5, 12}, 1), 2); },
                                     {"self_attention", "[B, T, 3C]", "[5, 12]"}));
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::self_attention(wide, 0); }, {"self_attention", "n_head 0"}));
}

// scale unset is 1 / sqrt(D), bit for bit, on both paths; given, it must be finite. (Given scales'
// values and gradients are checked against float64 with the other cases: attention_cases.)
TEST(FusedAttention, ScaleDefaultsToOneOverTheRootOfTheHeadSizeAndMustBeFinite) {
  const Tensor q = values({2, 5, 16}, 1).to(DType::kFloat32), k = values({2, 7, 16}, 2).to(DType::kFloat32);
  const Tensor v = values({2, 7, 8}, 3).to(DType::kFloat32);
  for (AttentionBackend backend : {AttentionBackend::kFused, AttentionBackend::kComposed}) {
    AttentionBackendGuard guard(backend);
    EXPECT_EQ(ag::ops::scaled_dot_product_attention(q, k, v, true).to_vector(),
              ag::ops::scaled_dot_product_attention(q, k, v, {.is_causal = true, .scale = 0.25}).to_vector());
    EXPECT_NE(ag::ops::scaled_dot_product_attention(q, k, v, true).to_vector(),
              ag::ops::scaled_dot_product_attention(q, k, v, {.is_causal = true, .scale = 0.5}).to_vector());
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(q, k, v, {.scale = bad}); },
                                         {"scaled_dot_product_attention", "scale must be finite"}));
      EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::self_attention(values({1, 3, 12}, 4), 2, {.scale = bad}); },
                                         {"self_attention", "scale must be finite"}));
    }
  }
}

// An additive attn_mask (PyTorch's float mask): -inf above the diagonal is is_causal (in float64 on
// the composed path); a bias broadcast over the batch gets its gradient (finite differences, q, k,
// v and the mask); a fully masked row gives 0s; the fused kernels do not take one (kFused says
// so), and the bad forms are errors.
TEST(AttentionMask, IsAddedToTheScoresAndGetsItsGradient) {
  const Tensor q = values({2, 6, 8}, 1), k = values({2, 9, 8}, 2), v = values({2, 9, 4}, 3);
  std::vector<double> causal_mask(6 * 9);
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t j = 0; j < 9; ++j) causal_mask[static_cast<size_t>(i * 9 + j)] = j > i ? -INFINITY : 0.0;
  }
  const Tensor mask = Tensor::from_vector(causal_mask, {6, 9}, DType::kFloat64);
  const ag::test::Evaluated masked = ag::test::evaluate(
      [&](const std::vector<Tensor>& in) {
        return ag::ops::scaled_dot_product_attention(in[0], in[1], in[2], {.attn_mask = mask});
      },
      {q, k, v}, DType::kFloat64);
  const ag::test::Evaluated causal =
      ag::test::evaluate(attention(AttentionBackend::kComposed, true), {q, k, v}, DType::kFloat64);
  ASSERT_EQ(masked.out.size(), causal.out.size());
  for (size_t i = 0; i < masked.out.size(); ++i) EXPECT_NEAR(masked.out[i], causal.out[i], 1e-14);
  for (size_t g = 0; g < 3; ++g) {
    for (size_t i = 0; i < masked.grads[g].size(); ++i) EXPECT_NEAR(masked.grads[g][i], causal.grads[g][i], 1e-14);
  }
  EXPECT_TRUE(ag::test::gradcheck(
      [](const std::vector<Tensor>& in) {
        return ag::ops::scaled_dot_product_attention(in[0], in[1], in[2], {.attn_mask = in[3], .scale = 0.3});
      },
      {q, k, v, values({1, 6, 9}, 5)}));
  // A query row the mask leaves no key gives 0s and gradients of 0, not NaN (PyTorch 2.5 and later).
  std::vector<double> padded(6 * 9, 0.0);
  std::fill(padded.begin() + 2 * 9, padded.begin() + 3 * 9, -INFINITY);  // row 2 sees nothing
  const ag::test::Evaluated empty_row = ag::test::evaluate(
      [&](const std::vector<Tensor>& in) {
        return ag::ops::scaled_dot_product_attention(
            in[0], in[1], in[2], {.attn_mask = Tensor::from_vector(padded, {6, 9}, DType::kFloat32)});
      },
      {q, k, v}, DType::kFloat32);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(empty_row.out[static_cast<size_t>((b * 6 + 2) * 4 + c)], 0.0);
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(empty_row.grads[0][static_cast<size_t>((b * 6 + 2) * 8 + c)], 0.0);
  }
  for (const std::vector<double>& g : empty_row.grads) {
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](double x) { return std::isfinite(x); }));
  }
  EXPECT_NE(empty_row.out[0], 0.0);
  const Tensor f = q.to(DType::kFloat32);
  const Tensor bias = values({6, 9}, 6).to(DType::kFloat32);
  {
    AttentionBackendGuard fused(AttentionBackend::kFused);
    EXPECT_TRUE(ag::test::throws_error(
        [&] { ag::ops::scaled_dot_product_attention(f, f, f, {.attn_mask = values({6, 6}, 7).to(DType::kFloat32)}); },
        {"scaled_dot_product_attention", "attn_mask", "kFused"}));
  }
  EXPECT_TRUE(ag::test::throws_error(
      [&] { ag::ops::scaled_dot_product_attention(f, k.to(DType::kFloat32), v.to(DType::kFloat32),
                                                  {.attn_mask = bias, .is_causal = true}); },
      {"scaled_dot_product_attention", "attn_mask and is_causal"}));
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>(36, 0), {6, 6});
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(f, f, f, {.attn_mask = ids}); },
                                     {"scaled_dot_product_attention", "floating-point additive mask", "int64"}));
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(f, f, f, {.attn_mask = bias}); },
                                     {"scaled_dot_product_attention", "[6, 9]", "[2, 6, 6]"}));
  const Tensor wider = values({4, 1, 6, 6}, 8).to(DType::kFloat32);  // would broadcast the batch up
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(f, f, f, {.attn_mask = wider}); },
                                     {"scaled_dot_product_attention", "[4, 1, 6, 6]", "does not broadcast"}));
  EXPECT_TRUE(ag::test::throws_error(
      [&] { ag::ops::scaled_dot_product_attention(f, f, f, {.attn_mask = values({6, 6}, 9)}); },
      {"scaled_dot_product_attention", "float32 or q's dtype", "float64"}));
  // A float32 mask with bfloat16 q, k, v is added in bfloat16 (PyTorch's in-place add): the output
  // is bfloat16 and within its rounding of the float32 run's.
  const Tensor mask32 = values({6, 6}, 10).to(DType::kFloat32);
  const Tensor h = values({2, 6, 8}, 11).to(DType::kBFloat16);
  const Tensor out16 = ag::ops::scaled_dot_product_attention(h, h, h, {.attn_mask = mask32});
  EXPECT_EQ(out16.dtype(), DType::kBFloat16);
  const Tensor h32 = h.to(DType::kFloat32);
  const std::vector<double> got = out16.to_double_vector(),
                            want = ag::ops::scaled_dot_product_attention(h32, h32, h32, {.attn_mask = mask32})
                                       .to_double_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.05);
}

// safe_softmax: a row of only -inf gives 0s and a zero gradient in every dtype; other rows are
// softmax's bits; a row with a NaN stays NaN (as torch._safe_softmax).
TEST(SafeSoftmax, ARowOfOnlyMinusInfinityGivesZeros) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = Tensor::from_vector(std::vector<double>{-inf, -inf, -inf, 0.5, -1, 2, -inf, nan, 1}, {3, 3});
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor leaf = x.to(dtype).detach();  // its own leaf (x.to(float64) would be x itself)
    leaf.set_requires_grad(true);
    const Tensor y = ag::ops::safe_softmax(leaf, -1);
    ag::ops::sum(y * Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}).to(dtype)).backward();
    const std::vector<double> v = y.to_double_vector(), g = leaf.grad().to_double_vector();
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(v[static_cast<size_t>(i)], 0.0) << ag::dtype_name(dtype);
      EXPECT_EQ(g[static_cast<size_t>(i)], 0.0) << ag::dtype_name(dtype);
    }
    const std::vector<double> plain = ag::ops::softmax(x.to(dtype), -1).to_double_vector();
    EXPECT_EQ(std::vector<double>(v.begin() + 3, v.begin() + 6),
              std::vector<double>(plain.begin() + 3, plain.begin() + 6));
    EXPECT_TRUE(std::isnan(v[7]));
    EXPECT_TRUE(std::isnan(plain[0]));  // plain softmax: NaN
  }
}

// Dropout on the probabilities: the fused kernel drops the elements the composed path's
// ops::dropout drops from the same generator state (else its values would be far off the float64
// reference's), in values and gradients.
TEST(FusedAttention, DropoutDropsWhatTheComposedPathDrops) {
  for (const ag::test::AttentionCase& c : ag::test::attention_dropout_cases()) {
    EXPECT_TRUE(ag::test::fused_attention_as_accurate_as_composed(ag::Device::kCPU, c, kCpuDTypes));
  }
}

// Either path draws one seed from the generator (none for p = 0 or 1), so what follows draws alike;
// p = 1 drops everything (output and gradients 0); p outside [0, 1] is an error.
TEST(FusedAttention, DropoutDrawsLikeTheComposedPathAndChecksItsProbability) {
  const Tensor q = values({2, 9, 16}, 1).to(DType::kFloat32), v = values({2, 9, 8}, 3).to(DType::kFloat32);
  for (double p : {0.0, 0.3, 1.0}) {
    std::vector<uint64_t> next;
    for (AttentionBackend backend : {AttentionBackend::kFused, AttentionBackend::kComposed}) {
      AttentionBackendGuard guard(backend);
      ag::manual_seed(5);
      Tensor leaf = q.detach();
      leaf.set_requires_grad(true);
      const Tensor out = ag::ops::scaled_dot_product_attention(leaf, leaf, v, {.dropout_p = p, .is_causal = true});
      ag::ops::sum(out).backward();
      next.push_back(ag::random::next_u64());
      if (p == 1.0) {
        EXPECT_EQ(out.to_vector(), std::vector<float>(out.numel(), 0.0f));
        EXPECT_EQ(leaf.grad().to_vector(), std::vector<float>(leaf.numel(), 0.0f));
      }
    }
    EXPECT_EQ(next[0], next[1]) << "p " << p;
  }
  for (double bad : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(q, q, v, {.dropout_p = bad}); },
                                       {"scaled_dot_product_attention", "dropout_p must be in [0, 1]"}));
  }
}

TEST(FusedAttention, TheBackendCanBeForcedAndSaysWhyTheFusedOneDoesNotApply) {
  const Tensor q = values({1, 4, 8}, 1).to(DType::kFloat32);
  {
    AttentionBackendGuard composed(AttentionBackend::kComposed);
    Tensor leaf = q.detach();
    leaf.set_requires_grad(true);
    EXPECT_EQ(ag::ops::scaled_dot_product_attention(leaf, leaf, leaf).grad_fn()->name(), "matmul");
    {
      AttentionBackendGuard fused(AttentionBackend::kFused);  // guards nest
      EXPECT_EQ(ag::ops::scaled_dot_product_attention(leaf, leaf, leaf).grad_fn()->name(),
                "scaled_dot_product_attention");
    }
    EXPECT_EQ(ag::ops::scaled_dot_product_attention(leaf, leaf, leaf).grad_fn()->name(), "matmul");
  }
  AttentionBackendGuard fused(AttentionBackend::kFused);
  const Tensor wide = q.to(DType::kFloat64);
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(wide, wide, wide); },
                                     {"scaled_dot_product_attention", "float64", "kFused", "kAuto"}));
  const Tensor broadcast_k = values({4, 8}, 2).to(DType::kFloat32);
  EXPECT_TRUE(ag::test::throws_error([&] { ag::ops::scaled_dot_product_attention(q, broadcast_k, broadcast_k); },
                                     {"scaled_dot_product_attention", "broadcast", "[4, 8]"}));
}

}  // namespace
