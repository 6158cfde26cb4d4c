// The fused-attention checks shared by the CPU and CUDA suites (see attention_cases.h).
#include "attention_cases.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "framework/allocator.h"
#include "ops/ops.h"

namespace ampgrad::test {

namespace {

using ops::AttentionBackend;

Tensor values(Shape shape, uint64_t seed, double magnitude = 1.0) {
  return Tensor::from_vector(random_values(static_cast<size_t>(shape_numel(shape)), -magnitude, magnitude, seed), shape,
                             DType::kFloat64);
}

// Attention as the case asks for, from the generator state manual_seed(kDropoutSeed) (every
// evaluation of a case with dropout drops the same elements).
constexpr uint64_t kDropoutSeed = 29;

TensorFn attention(AttentionBackend backend, const AttentionCase& c) {
  return [backend, c](const std::vector<Tensor>& in) {
    ops::AttentionBackendGuard guard(backend);
    if (c.dropout_p > 0) manual_seed(kDropoutSeed);
    return ops::scaled_dot_product_attention(in[0], in[1], in[2],
                                             {.dropout_p = c.dropout_p, .is_causal = c.causal, .scale = c.scale});
  };
}

// |a - b| over the output and each of the three gradients, each relative to the largest |b| of
// its tensor (or to 1, below which it is absolute: a gradient that is exactly 0 in float64, as
// q's and k's are for one key, is as close as its rounding allows).
std::vector<double> errors(const Evaluated& a, const Evaluated& b) {
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

std::string name_of(const AttentionCase& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " [" + std::to_string(c.batch) + "," + std::to_string(c.heads) + "] Tq " +
         std::to_string(c.tq) + " Tk " + std::to_string(c.tk) + " D " + std::to_string(c.d) + " Dv " +
         std::to_string(c.dv) + (c.causal ? " causal" : "") + (c.scale ? " scale " + std::to_string(*c.scale) : "") +
         (c.dropout_p > 0 ? " dropout " + std::to_string(c.dropout_p) : "");
}

}  // namespace

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> cases;
  for (const bool causal : {false, true}) {
    for (const int64_t t : {1, 63, 64, 65, 127, 128, 129}) {
      for (const int64_t d : {16, 64, 80, 128}) {
        cases.push_back({.batch = 1, .heads = 2, .tq = t, .tk = t, .d = d, .dv = d, .causal = causal});
      }
    }
    cases.push_back({.batch = 1, .heads = 1, .tq = 1000, .tk = 1000, .d = 64, .dv = 64, .causal = causal});
    cases.push_back({.batch = 2, .heads = 1, .tq = 65, .tk = 200, .d = 32, .dv = 48, .causal = causal});
    cases.push_back({.batch = 1, .heads = 3, .tq = 200, .tk = 65, .d = 32, .dv = 16, .causal = causal});
    // Head sizes that are not multiples of 8: rows of 40 and 24 bytes in 16 bits, which CUDA's tiles
    // load element by element instead of 16 bytes at a time.
    cases.push_back({.batch = 1, .heads = 2, .tq = 65, .tk = 130, .d = 20, .dv = 12, .causal = causal});
    cases.push_back(
        {.batch = 1, .heads = 2, .tq = 129, .tk = 70, .d = 64, .dv = 64, .causal = causal, .scale = 1.0 / 64});
    cases.push_back({.batch = 2, .heads = 1, .tq = 63, .tk = 63, .d = 16, .dv = 16, .causal = causal, .scale = -0.7});
  }
  return cases;
}

std::vector<AttentionCase> attention_dropout_cases() {
  std::vector<AttentionCase> cases;
  for (const bool causal : {false, true}) {
    cases.push_back(
        {.batch = 2, .heads = 2, .tq = 129, .tk = 129, .d = 64, .dv = 64, .causal = causal, .dropout_p = 0.2});
    cases.push_back(
        {.batch = 1, .heads = 3, .tq = 65, .tk = 200, .d = 32, .dv = 48, .causal = causal, .dropout_p = 0.5});
    cases.push_back(
        {.batch = 1, .heads = 2, .tq = 200, .tk = 65, .d = 32, .dv = 32, .causal = causal, .dropout_p = 0.3});
  }
  return cases;
}

::testing::AssertionResult fused_attention_as_accurate_as_composed(Device device, const AttentionCase& c,
                                                                   const std::vector<DType>& dtypes, double magnitude,
                                                                   double ratio) {
  const std::vector<Tensor> inputs = {values({c.batch, c.heads, c.tq, c.d}, 1, magnitude),
                                      values({c.batch, c.heads, c.tk, c.d}, 2, magnitude),
                                      values({c.batch, c.heads, c.tk, c.dv}, 3)};
  for (DType dtype : dtypes) {
    // float64 on the values as `dtype` stores them: the paths are judged on their own rounding.
    std::vector<Tensor> stored;
    for (const Tensor& t : inputs) stored.push_back(t.to(dtype).to(DType::kFloat64));
    const Evaluated exact = evaluate(attention(AttentionBackend::kComposed, c), stored, DType::kFloat64);
    const Evaluated fused = evaluate(attention(AttentionBackend::kFused, c), inputs, dtype, device);
    const Evaluated composed = evaluate(attention(AttentionBackend::kComposed, c), inputs, dtype, device);
    const std::vector<double> fused_errors = errors(fused, exact), composed_errors = errors(composed, exact);
    const double fused_error = *std::max_element(fused_errors.begin(), fused_errors.end());
    const double composed_error = *std::max_element(composed_errors.begin(), composed_errors.end());
    if (fused_error > ratio * composed_error + 2 * eps(dtype) ||
        fused_error > 64 * eps(dtype) * std::max(1.0, magnitude * magnitude)) {
      return ::testing::AssertionFailure() << name_of(c, dtype) << " on " << device_name(device) << ": fused "
                                           << to_string(fused_errors) << "; composed " << to_string(composed_errors);
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult fused_attention_keeps_no_scores(Device device, DType dtype) {
  constexpr int64_t kT = 1024, kD = 64, kHeads = 2;
  const int64_t scores_bytes = kT * kT * 4;
  std::vector<Tensor> qkv;
  for (uint64_t seed : {1, 2, 3}) {
    qkv.push_back(values({1, kHeads, kT, kD}, seed).to(dtype).to(device));
    qkv.back().set_requires_grad(true);
  }
  allocator_for(device).reset_peak();
  const int64_t live = memory_stats(device).current_bytes;
  const Tensor out = ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true);
  if (out.grad_fn()->name() != "scaled_dot_product_attention") {
    return ::testing::AssertionFailure() << "the composed path ran (" << out.grad_fn()->name() << ")";
  }
  const int64_t kept = memory_stats(device).current_bytes - live;
  const int64_t allowed = out.numel() * static_cast<int64_t>(dtype_info(dtype).size) + kHeads * kT * 8 + 4096;
  if (kept > allowed) {
    return ::testing::AssertionFailure() << "the forward keeps " << kept << " bytes; the output and each row's "
                                         << "log-normaliser take " << allowed - 4096;
  }
  ops::sum(out).backward();
  const int64_t peak = memory_stats(device).peak_bytes - live;
  if (peak >= scores_bytes) {
    return ::testing::AssertionFailure() << "forward and backward held " << peak << " bytes at once, one head's "
                                         << "scores are " << scores_bytes;
  }
  for (const Tensor& t : qkv) {
    if (!all_finite(t.grad())) return ::testing::AssertionFailure() << "a non-finite gradient";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult self_attention_reads_the_heads_in_place(Device device, const std::vector<DType>& dtypes,
                                                                   int64_t batch, int64_t t, int64_t heads, int64_t d) {
  const int64_t c = heads * d;
  const std::vector<Tensor> inputs = {values({batch, t, 3 * c}, 7, 2.0)};
  for (DType dtype : dtypes) {
    std::vector<AttentionCase> cases = {{.causal = false}, {.causal = true}, {.causal = true, .scale = 0.3}};
    if (device == Device::kCPU) cases.push_back({.causal = true, .dropout_p = 0.25});  // CUDA: composed
    for (const AttentionCase& option : cases) {
      const ops::AttentionOptions options{
          .dropout_p = option.dropout_p, .is_causal = option.causal, .scale = option.scale};
      const std::string name = std::string(dtype_name(dtype)) + " [" + std::to_string(batch) + ", " +
                               std::to_string(t) + ", 3 x " + std::to_string(heads) + " x " + std::to_string(d) +
                               "]" + (option.causal ? " causal" : "") + (option.scale ? " scale 0.3" : "") +
                               (option.dropout_p > 0 ? " dropout" : "") + " on " + std::string(device_name(device));
      const Evaluated packed = evaluate(
          [&](const std::vector<Tensor>& in) {
            ops::AttentionBackendGuard fused(AttentionBackend::kFused);
            if (option.dropout_p > 0) manual_seed(kDropoutSeed);
            return ops::self_attention(in[0], heads, options);
          },
          inputs, dtype, device);
      const Evaluated split = evaluate(
          [&](const std::vector<Tensor>& in) {
            const std::vector<Tensor> parts = ops::split(in[0], c, -1);
            const auto split_heads = [&](const Tensor& y) {
              return ops::transpose(ops::reshape(y, {batch, t, heads, d}), 1, 2);
            };
            const Tensor y = attention(AttentionBackend::kFused, option)(
                {split_heads(parts[0]), split_heads(parts[1]), split_heads(parts[2])});
            return ops::reshape(ops::transpose(y, 1, 2), {batch, t, c});
          },
          inputs, dtype, device);
      if (packed.out != split.out || packed.grads != split.grads) {
        return ::testing::AssertionFailure() << name << ": self_attention differs from split + attention + merge ("
                                             << to_string(errors(packed, split)) << ")";
      }
      Tensor qkv = inputs[0].to(dtype).to(device);
      qkv.set_requires_grad(true);
      const int64_t live = memory_stats(device).current_bytes;
      const Tensor out = ops::self_attention(qkv, heads, options);
      const int64_t kept = memory_stats(device).current_bytes - live;
      const int64_t allowed = out.numel() * static_cast<int64_t>(dtype_info(dtype).size) + batch * heads * t * 8 + 4096;
      if (out.grad_fn()->name() != "self_attention" || kept > allowed) {
        return ::testing::AssertionFailure() << name << ": the forward (" << out.grad_fn()->name() << ") keeps " << kept
                                             << " bytes; the output and the log-normalisers take " << allowed - 4096;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ampgrad::test
