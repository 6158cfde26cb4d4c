// Op-case rows for the ops of classifiers and transformers: activations, exp/log, div, softmax,
// the losses, layer norm, embedding, dropout and attention.
#include <cmath>
#include <random>

#include "op_cases.h"
#include "ops/elementwise/dropout_mask.h"
#include "ops/ops.h"

namespace ampgrad::test {

namespace {

// The transcendental functions are within 2 ulp in float32 (ops/math.h): a tolerance of k = 4
// allows 4 eps, as a sum of four terms would.
constexpr Tol kTranscendental{.k = 4, .magnitude = 1};

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Fixed targets for the loss rows (they are int64 constants, not differentiable inputs), on the
// device of the logits they go with.
const std::vector<int64_t> kTargets{2, 0, 4, -100, 1, 3};

Tensor targets(const Tensor& logits) { return Tensor::from_vector(kTargets, {6}, DType::kInt64, logits.device()); }

}  // namespace

void append_model_cases(std::vector<OpCase>& cases) {
  using In = const std::vector<Tensor>&;
  using Refs = const std::vector<Values>&;
  const auto add = [&](std::string name, std::vector<Shape> shapes, TensorFn fn,
                       std::function<Values(const std::vector<Values>&)> ref, Tol tol = {}) {
    cases.push_back({std::move(name), std::move(shapes), std::move(fn), std::move(ref), tol});
  };

  // Activations and exp/log (log of x^2, which is positive for these inputs).
  add("gelu", {{3, 5}}, [](In t) { return ops::gelu(t[0]); }, [](Refs v) { return map_ref(v[0], gelu_ref); },
      kTranscendental);
  add("gelu_tanh", {{3, 5}}, [](In t) { return ops::gelu(t[0], ops::GeluApproximation::kTanh); },
      [](Refs v) { return map_ref(v[0], gelu_tanh_ref); }, kTranscendental);
  add("tanh", {{4, 9}}, [](In t) { return ops::tanh(t[0]); }, [](Refs v) { return map_ref(v[0], [](double x) { return std::tanh(x); }); },
      kTranscendental);
  add("sigmoid", {{4, 9}}, [](In t) { return ops::sigmoid(t[0]); },
      [](Refs v) { return map_ref(v[0], [](double x) { return 1 / (1 + std::exp(-x)); }); }, kTranscendental);
  add("exp", {{3, 7}}, [](In t) { return ops::exp(t[0]); }, [](Refs v) { return map_ref(v[0], [](double x) { return std::exp(x); }); },
      kTranscendental);
  add("log", {{3, 7}}, [](In t) { return ops::log(t[0] * t[0]); },
      [](Refs v) { return map_ref(v[0], [](double x) { return std::log(x * x); }); }, {.k = 16, .magnitude = 1});
  add("div_broadcast", {{2, 3}, {3}}, [](In t) { return ops::div(t[0], t[1]); },
      [](Refs v) { return broadcast_ref(v[0], {2, 3}, v[1], {3}, [](double a, double b) { return a / b; }); });

  // Softmax family.
  add("softmax", {{3, 6}}, [](In t) { return ops::softmax(t[0], -1); }, [](Refs v) { return softmax_ref(v[0], 6); },
      {.k = 8, .magnitude = 1});
  add("softmax_dim0", {{4, 3}}, [](In t) { return ops::softmax(t[0], 0); },
      [](Refs v) { return permute_ref(softmax_ref(permute_ref(v[0], {4, 3}, {1, 0}), 4), {3, 4}, {1, 0}); },
      {.k = 8, .magnitude = 1});
  add("safe_softmax", {{3, 6}}, [](In t) { return ops::safe_softmax(t[0], -1); },  // finite rows: softmax
      [](Refs v) { return softmax_ref(v[0], 6); }, {.k = 8, .magnitude = 1});
  add("log_softmax", {{3, 6}}, [](In t) { return ops::log_softmax(t[0], 1); },
      [](Refs v) { return softmax_ref(v[0], 6, true); }, {.k = 8, .magnitude = 4});
  add("causal_softmax", {{2, 3, 5}}, [](In t) { return ops::causal_softmax(t[0]); },
      [](Refs v) { return softmax_ref(v[0], 5, false, 3); }, {.k = 8, .magnitude = 1});
  add("causal_softmax_tall", {{5, 3}}, [](In t) { return ops::causal_softmax(t[0]); },  // Tq > Tk
      [](Refs v) { return softmax_ref(v[0], 3, false, 5); }, {.k = 8, .magnitude = 1});

  // Losses (targets fixed, sample 3 ignored).
  const auto ce = [](ops::CrossEntropyOptions o) {
    return [o](In t) { return ops::cross_entropy(t[0], targets(t[0]), o); };
  };
  const auto ce_ref = [](double eps, ops::Reduction r) {
    return [eps, r](Refs v) {
      const Values per = cross_entropy_ref(v[0], 5, kTargets, -100, eps);
      if (r == ops::Reduction::kNone) return per;
      const double sum = sum_ref(per);
      return Values{r == ops::Reduction::kSum ? sum : sum / 5};  // 5 samples count
    };
  };
  add("cross_entropy", {{6, 5}}, ce({}), ce_ref(0.0, ops::Reduction::kMean), {.k = 16, .magnitude = 4});
  add("cross_entropy_sum_smoothed", {{6, 5}}, ce({.label_smoothing = 0.1, .reduction = ops::Reduction::kSum}),
      ce_ref(0.1, ops::Reduction::kSum), {.k = 16, .magnitude = 4});
  add("cross_entropy_none", {{6, 5}}, ce({.reduction = ops::Reduction::kNone}), ce_ref(0.0, ops::Reduction::kNone),
      {.k = 8, .magnitude = 4});
  add("nll_loss", {{6, 5}}, [](In t) { return ops::nll_loss(ops::log_softmax(t[0], -1), targets(t[0])); },
      [](Refs v) { return Values{sum_ref(cross_entropy_ref(v[0], 5, kTargets, -100, 0.0)) / 5}; },
      {.k = 16, .magnitude = 4});

  // Layer norm with and without its affine parameters, over [2, 3, 8].
  add("layer_norm", {{2, 3, 8}, {8}, {8}}, [](In t) { return ops::layer_norm(t[0], t[1], t[2], 1e-5); },
      [](Refs v) { return layer_norm_ref(v[0], 8, v[1], v[2], 1e-5); }, {.k = 16, .magnitude = 4});
  add("layer_norm_plain", {{4, 6}}, [](In t) { return ops::layer_norm(t[0], Tensor(), Tensor(), 1e-5); },
      [](Refs v) { return layer_norm_ref(v[0], 6, {}, {}, 1e-5); }, {.k = 16, .magnitude = 4});
  // Rows of 19: the CPU's sums take two blocks of 8 lanes and a tail of 3.
  add("layer_norm_long_rows", {{3, 19}, {19}, {19}}, [](In t) { return ops::layer_norm(t[0], t[1], t[2], 1e-5); },
      [](Refs v) { return layer_norm_ref(v[0], 19, v[1], v[2], 1e-5); }, {.k = 16, .magnitude = 4});

  // Embedding: a repeated id sums its rows' gradients.
  add("embedding", {{5, 3}},
      [](In t) {
        const Tensor ids = Tensor::from_vector(std::vector<int64_t>{4, 0, 4, 2}, {2, 2}, DType::kInt64, t[0].device());
        return ops::embedding(ids, t[0]);
      },
      [](Refs v) {
        Values out;
        for (int64_t id : {4, 0, 4, 2}) out.insert(out.end(), v[0].begin() + id * 3, v[0].begin() + id * 3 + 3);
        return out;
      });

  // Dropout with a fixed seed: the mask is the counter hash of the generator's next 64 bits.
  add("dropout", {{4, 8}},
      [](In t) {
        manual_seed(123);
        return ops::dropout(t[0], 0.25);
      },
      [](Refs v) {
        const uint64_t seed = std::mt19937_64(123)();
        Values out(v[0].size());
        for (size_t i = 0; i < out.size(); ++i) {
          out[i] = kernels::dropout_uniform(seed, i) >= 0.25f ? v[0][i] / 0.75 : 0.0;
        }
        return out;
      });

  // Attention [B, H, T, D] = [1, 2, 4, 3], with and without the causal mask.
  for (bool causal : {false, true}) {
    add(causal ? "attention_causal" : "attention", {{1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}},
        [causal](In t) { return ops::scaled_dot_product_attention(t[0], t[1], t[2], causal); },
        [causal](Refs v) {
          const Shape qs{1, 2, 4, 3};
          Values scores = batched_matmul_ref(v[0], qs, permute_ref(v[1], qs, {0, 1, 3, 2}), {1, 2, 3, 4});
          for (double& s : scores) s /= std::sqrt(3.0);
          return batched_matmul_ref(softmax_ref(scores, 4, false, causal ? 4 : 0), {1, 2, 4, 4}, v[2], qs);
        },
        {.k = 16, .magnitude = 4});
  }
  // A shorter query than key (Tq 2 < Tk 4): the causal mask is aligned top-left, as PyTorch's.
  add("attention_causal_short_q", {{1, 2, 2, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}},
      [](In t) { return ops::scaled_dot_product_attention(t[0], t[1], t[2], true); },
      [](Refs v) {
        Values scores = batched_matmul_ref(v[0], {1, 2, 2, 3}, permute_ref(v[1], {1, 2, 4, 3}, {0, 1, 3, 2}), {1, 2, 3, 4});
        for (double& s : scores) s /= std::sqrt(3.0);
        return batched_matmul_ref(softmax_ref(scores, 4, false, 2), {1, 2, 2, 4}, v[2], {1, 2, 4, 3});
      },
      {.k = 16, .magnitude = 4});
  // self_attention over qkv [B, T, 3C] = [2, 4, 18]: two heads of 3, read where they lie.
  for (bool causal : {false, true}) {
    add(causal ? "self_attention_causal" : "self_attention", {{2, 4, 18}},
        [causal](In t) { return ops::self_attention(t[0], 2, causal); },
        [causal](Refs v) {
          constexpr int64_t kB = 2, kT = 4, kH = 2, kD = 3, kC = kH * kD;
          const Shape heads{kB, kH, kT, kD};
          const auto part = [&](int64_t which) {  // [B, T, C] slice of qkv -> [B, H, T, D]
            Values out(static_cast<size_t>(kB * kH * kT * kD));
            for (int64_t b = 0; b < kB; ++b) {
              for (int64_t h = 0; h < kH; ++h) {
                for (int64_t t = 0; t < kT; ++t) {
                  for (int64_t d = 0; d < kD; ++d) {
                    out[static_cast<size_t>(((b * kH + h) * kT + t) * kD + d)] =
                        v[0][static_cast<size_t>((b * kT + t) * 3 * kC + which * kC + h * kD + d)];
                  }
                }
              }
            }
            return out;
          };
          Values scores = batched_matmul_ref(part(0), heads, permute_ref(part(1), heads, {0, 1, 3, 2}), {kB, kH, kD, kT});
          for (double& s : scores) s /= std::sqrt(3.0);
          const Values y = batched_matmul_ref(softmax_ref(scores, kT, false, causal ? kT : 0), {kB, kH, kT, kT}, part(2),
                                              heads);
          return permute_ref(y, heads, {0, 2, 1, 3});  // heads merged: [B, T, H, D]
        },
        {.k = 16, .magnitude = 4});
  }
}

}  // namespace ampgrad::test
