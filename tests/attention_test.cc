// The fused scaled_dot_product_attention (ops/attention/) against float64 and against the
// composed path it replaces: values and the gradients of q, k and v in float32, bfloat16 and
// float16, causal or not, ragged lengths and head sizes, Tq != Tk; its accuracy at large scores;
// the memory it keeps for the backward; its independence from the thread count; and the
// backend switch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/parallel.h"
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
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return Tensor::from_vector(ag::test::random_values(static_cast<size_t>(n), -magnitude, magnitude, seed), shape,
                             DType::kFloat64);
}

ag::test::TensorFn attention(AttentionBackend backend, bool causal) {
  return [backend, causal](const std::vector<Tensor>& in) {
    AttentionBackendGuard guard(backend);
    return ag::ops::scaled_dot_product_attention(in[0], in[1], in[2], causal);
  };
}

// |a - b| over the output and each of the three gradients, each relative to the largest |b| of
// its tensor (or to 1, below which it is absolute: a gradient that is exactly 0 in float64, as
// q's and k's are for one key, is as close as its rounding allows).
std::vector<double> errors(const ag::test::Evaluated& a, const ag::test::Evaluated& b) {
  const auto relative = [](const std::vector<double>& x, const std::vector<double>& y) {
    double diff = 0.0, scale = 1.0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, std::abs(x[i] - y[i]));
      scale = std::max(scale, std::abs(y[i]));
    }
    return diff / scale;
  };
  std::vector<double> e{relative(a.out, b.out)};
  for (size_t i = 0; i < b.grads.size(); ++i) e.push_back(relative(a.grads[i], b.grads[i]));
  return e;
}

std::string to_string(const std::vector<double>& e) {
  std::string text;
  for (double v : e) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return "out, dq, dk, dv: " + text;
}

struct Case {
  int64_t batch, heads, tq, tk, d, dv;
  bool causal;
};

std::string name_of(const Case& c, DType dtype) {
  return std::string(ag::dtype_name(dtype)) + " [" + std::to_string(c.batch) + "," + std::to_string(c.heads) + "] Tq " +
         std::to_string(c.tq) + " Tk " + std::to_string(c.tk) + " D " + std::to_string(c.d) + " Dv " +
         std::to_string(c.dv) + (c.causal ? " causal" : "");
}

// fused vs float64 no worse than the composed path vs float64 (with a margin for the two paths'
// different rounding), and within the dtype's own tolerance.
void expect_fused_as_accurate_as_composed(const Case& c, double magnitude = 1.0) {
  const std::vector<Tensor> inputs = {values({c.batch, c.heads, c.tq, c.d}, 1, magnitude),
                                      values({c.batch, c.heads, c.tk, c.d}, 2, magnitude),
                                      values({c.batch, c.heads, c.tk, c.dv}, 3)};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(name_of(c, dtype));
    // float64 on the values as `dtype` stores them: the paths are judged on their own rounding.
    std::vector<Tensor> stored;
    for (const Tensor& t : inputs) stored.push_back(t.to(dtype).to(DType::kFloat64));
    const ag::test::Evaluated exact =
        ag::test::evaluate(attention(AttentionBackend::kComposed, c.causal), stored, DType::kFloat64);
    const ag::test::Evaluated fused = ag::test::evaluate(attention(AttentionBackend::kFused, c.causal), inputs, dtype);
    const ag::test::Evaluated composed =
        ag::test::evaluate(attention(AttentionBackend::kComposed, c.causal), inputs, dtype);
    const std::vector<double> fused_errors = errors(fused, exact), composed_errors = errors(composed, exact);
    const double fused_error = *std::max_element(fused_errors.begin(), fused_errors.end());
    const double composed_error = *std::max_element(composed_errors.begin(), composed_errors.end());
    EXPECT_LE(fused_error, 1.25 * composed_error + 2 * ag::test::eps(dtype))
        << "fused " << to_string(fused_errors) << "; composed " << to_string(composed_errors);
    EXPECT_LE(fused_error, 64 * ag::test::eps(dtype) * std::max(1.0, magnitude * magnitude));
  }
}

TEST(FusedAttention, MatchesFloat64AtLeastAsWellAsTheComposedPath) {
  for (const bool causal : {false, true}) {
    for (const int64_t t : {1, 63, 64, 65, 130}) {
      for (const int64_t d : {16, 64, 80, 128}) {
        expect_fused_as_accurate_as_composed({.batch = 1, .heads = 2, .tq = t, .tk = t, .d = d, .dv = d, .causal = causal});
      }
    }
  }
}

TEST(FusedAttention, LongSequencesAndUnequalLengths) {
  for (const bool causal : {false, true}) {
    expect_fused_as_accurate_as_composed({.batch = 1, .heads = 1, .tq = 1000, .tk = 1000, .d = 64, .dv = 64, .causal = causal});
    expect_fused_as_accurate_as_composed({.batch = 2, .heads = 1, .tq = 65, .tk = 200, .d = 32, .dv = 48, .causal = causal});
    expect_fused_as_accurate_as_composed({.batch = 1, .heads = 3, .tq = 200, .tk = 65, .d = 32, .dv = 16, .causal = causal});
  }
}

// Scores up to ~600 (q and k uniform in [-24, 24] over D = 16): a float32 score carries an absolute
// rounding error of ~4e-5, which every probability inherits. PyTorch's fused CPU kernel is far more
// accurate there than its math path; ours must be at least as accurate as the composed one.
TEST(FusedAttention, LargeScoresAreAsAccurateAsTheComposedPath) {
  expect_fused_as_accurate_as_composed({.batch = 1, .heads = 2, .tq = 64, .tk = 64, .d = 16, .dv = 16, .causal = true},
                                       /*magnitude=*/24.0);
}

TEST(FusedAttention, KeepsNothingOfSizeTByTForTheBackward) {
  // T = 1024, 2 heads of 64: the scores of one head alone are 4 MiB in float32.
  constexpr int64_t kT = 1024, kD = 64, kHeads = 2;
  const int64_t scores_bytes = kT * kT * 4;
  std::vector<Tensor> qkv;
  for (uint64_t seed : {1, 2, 3}) {
    qkv.push_back(values({1, kHeads, kT, kD}, seed).to(DType::kFloat32));
    qkv.back().set_requires_grad(true);
  }
  ag::allocator_for(ag::Device::kCPU).reset_peak();
  const int64_t live = ag::memory_stats(ag::Device::kCPU).current_bytes;
  const Tensor out = ag::ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true);
  EXPECT_EQ(out.grad_fn()->name(), "scaled_dot_product_attention");
  const int64_t kept = ag::memory_stats(ag::Device::kCPU).current_bytes - live;
  EXPECT_LT(kept, out.numel() * 4 + kHeads * kT * 8 + 4096) << "the forward keeps the output and each row's lse only";
  ag::ops::sum(out).backward();
  const int64_t peak = ag::memory_stats(ag::Device::kCPU).peak_bytes - live;
  EXPECT_LT(peak, scores_bytes) << "forward and backward never hold one head's scores";
  for (const Tensor& t : qkv) EXPECT_TRUE(ag::test::all_finite(t.grad()));
}

TEST(FusedAttention, ResultsDoNotDependOnTheThreadCount) {
  const std::vector<Tensor> inputs = {values({2, 3, 150, 32}, 1), values({2, 3, 150, 32}, 2), values({2, 3, 150, 32}, 3)};
  const int threads = ag::num_threads();
  ag::set_num_threads(1);
  const ag::test::Evaluated one = ag::test::evaluate(attention(AttentionBackend::kFused, true), inputs, DType::kBFloat16);
  ag::set_num_threads(3);
  const ag::test::Evaluated three =
      ag::test::evaluate(attention(AttentionBackend::kFused, true), inputs, DType::kBFloat16);
  ag::set_num_threads(threads);
  EXPECT_EQ(one.out, three.out);
  EXPECT_EQ(one.grads, three.grads);
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
