// Rows where a zero-size dimension meets broadcasting, batching or a reduction: what every op must
// return (PyTorch's shapes) without reading or writing out of bounds.
#include "zero_size_cases.h"

#include <cmath>
#include <limits>

#include "ops/ops.h"

namespace ampgrad::test {

namespace {

// int64 values on the device of `like` (targets and ids).
Tensor int64_on(const std::vector<int64_t>& values, const Shape& shape, const Tensor& like) {
  return Tensor::from_vector(values, shape).to(like.device());
}

}  // namespace

std::vector<ZeroSizeCase> zero_size_cases() {
  using In = const std::vector<Tensor>&;
  std::vector<ZeroSizeCase> cases;
  const auto add = [&](std::string name, std::vector<Shape> shapes, TensorFn fn, Shape out, double value = 0.0,
                       std::vector<double> grad_values = {}) {
    cases.push_back({std::move(name), std::move(shapes), std::move(fn), std::move(out), value, std::move(grad_values)});
  };
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const TensorFn matmul = [](In t) { return ops::matmul(t[0], t[1]); };

  // Batched GEMMs: an empty batch against an unbatched or batch-of-one operand, and empty matrices.
  add("matmul_empty_batch_64", {{0, 64, 64}, {64, 64}}, matmul, {0, 64, 64});
  add("matmul_empty_batch_512", {{0, 512, 512}, {512, 512}}, matmul, {0, 512, 512});
  add("matmul_matrix_empty_batch", {{2, 3}, {0, 3, 4}}, matmul, {0, 2, 4});
  add("matmul_empty_batch_batch_of_one", {{0, 2, 3}, {1, 3, 4}}, matmul, {0, 2, 4});
  add("matmul_batch_of_one_empty_batch", {{1, 2, 3}, {0, 3, 4}}, matmul, {0, 2, 4});
  add("matmul_vector_empty_batch", {{3}, {0, 3, 4}}, matmul, {0, 4});
  add("matmul_empty_batch_vector", {{0, 2, 3}, {3}}, matmul, {0, 2});
  add("matmul_broadcast_empty_inner_batch", {{1, 0, 2, 3}, {5, 1, 3, 4}}, matmul, {5, 0, 2, 4});
  add("matmul_no_rows", {{2, 0, 3}, {3, 4}}, matmul, {2, 0, 4});
  add("matmul_no_columns", {{2, 2, 3}, {3, 0}}, matmul, {2, 2, 0});
  add("matmul_k_zero", {{2, 3, 0}, {0, 4}}, matmul, {2, 3, 4});
  add("linear_empty_leading", {{0, 2, 5}, {4, 5}, {4}}, [](In t) { return ops::linear(t[0], t[1], t[2]); }, {0, 2, 4});
  add("linear_k_zero", {{3, 0}, {4, 0}, {4}}, [](In t) { return ops::linear(t[0], t[1], t[2]); }, {3, 4},
      /*value=*/1.0, {0, 0, 3});  // the bias alone; its gradient sums 3 rows

  // Element-wise ops broadcasting against an empty operand.
  add("add_rows_over_none", {{0, 3}, {1, 3}}, [](In t) { return t[0] + t[1]; }, {0, 3});
  add("mul_empty_middle", {{2, 0, 1}, {1, 3}}, [](In t) { return t[0] * t[1]; }, {2, 0, 3});
  add("sub_scalar_shape", {{0}, {1}}, [](In t) { return t[0] - t[1]; }, {0});
  add("div_column", {{3, 0}, {3, 1}}, [](In t) { return ops::div(t[0], t[1]); }, {3, 0});
  add("scalar_times_empty", {{0, 4}}, [](In t) { return t[0] * 2.0f + 1.0f; }, {0, 4});
  add("unary_chain", {{0, 3}},
      [](In t) { return ops::log(ops::exp(ops::sigmoid(ops::tanh(ops::gelu(ops::relu(t[0])))))); }, {0, 3});
  add("dropout", {{0, 3}}, [](In t) { return ops::dropout(t[0], 0.5, true); }, {0, 3});

  // Shapes.
  add("reshape", {{0, 3}}, [](In t) { return ops::reshape(t[0], {-1, 3, 1}); }, {0, 3, 1});
  add("permute", {{0, 3, 4}}, [](In t) { return ops::permute(t[0], {2, 0, 1}); }, {4, 0, 3});
  add("transpose", {{3, 0}}, [](In t) { return ops::transpose(t[0], 0, 1); }, {0, 3});
  add("expand_to_none", {{1, 3}}, [](In t) { return ops::expand(t[0], {2, 0, 3}); }, {2, 0, 3});
  add("narrow_nothing", {{4, 3}}, [](In t) { return ops::narrow(t[0], 0, 4, 0); }, {0, 3});
  add("cat_with_empty", {{0, 3}, {2, 3}}, [](In t) { return ops::cat({t[0], t[1]}, 0); }, {2, 3}, 1.0, {0, 1});
  add("split_empty", {{0, 3}}, [](In t) { return ops::split(t[0], 2, 0)[0]; }, {0, 3});

  // Reductions and normalisations over empty rows, or rows of nothing.
  add("sum_rows_of_none", {{0, 3}}, [](In t) { return ops::sum(t[0], {1}); }, {0});
  add("sum_over_none", {{0, 3}}, [](In t) { return ops::sum(t[0], {0}, true); }, {1, 3});
  add("mean_over_none", {{0, 3}}, [](In t) { return ops::mean(t[0], {0}); }, {3}, kNaN);
  add("max_rows_of_none", {{0, 3}}, [](In t) { return ops::max(t[0], 1); }, {0});
  add("softmax_no_rows", {{0, 5}}, [](In t) { return ops::softmax(t[0], -1); }, {0, 5});
  add("softmax_empty_rows", {{3, 0}}, [](In t) { return ops::softmax(t[0], -1); }, {3, 0});
  add("log_softmax_no_rows", {{2, 0, 5}}, [](In t) { return ops::log_softmax(t[0], 1); }, {2, 0, 5});
  add("layer_norm_no_rows", {{0, 4}, {4}, {4}}, [](In t) { return ops::layer_norm(t[0], t[1], t[2]); }, {0, 4});
  add("mse_of_nothing", {{0}, {0}}, [](In t) { return ops::mse_loss(t[0], t[1]); }, {}, kNaN);

  // Losses and lookups over no samples.
  add("cross_entropy_none_reduction", {{0, 5}},
      [](In t) {
        return ops::cross_entropy(t[0], int64_on({}, {0}, t[0]), {.reduction = ops::Reduction::kNone});
      },
      {0});
  add("cross_entropy_sum", {{0, 5}},
      [](In t) { return ops::cross_entropy(t[0], int64_on({}, {0}, t[0]), {.reduction = ops::Reduction::kSum}); }, {});
  add("cross_entropy_mean", {{0, 5}}, [](In t) { return ops::cross_entropy(t[0], int64_on({}, {0}, t[0])); }, {},
      kNaN);
  add("embedding_no_ids", {{5, 3}}, [](In t) { return ops::embedding(int64_on({}, {2, 0}, t[0]), t[0]); }, {2, 0, 3});
  add("attention_no_batch", {{0, 2, 3, 4}, {0, 2, 3, 4}, {0, 2, 3, 4}},
      [](In t) { return ops::scaled_dot_product_attention(t[0], t[1], t[2], true); }, {0, 2, 3, 4});
  add("attention_no_tokens", {{1, 2, 0, 4}, {1, 2, 0, 4}, {1, 2, 0, 4}},
      [](In t) { return ops::scaled_dot_product_attention(t[0], t[1], t[2], true); }, {1, 2, 0, 4});
  add("self_attention_no_tokens", {{1, 0, 12}}, [](In t) { return ops::self_attention(t[0], 2, true); }, {1, 0, 4});
  return cases;
}

::testing::AssertionResult check_zero_size_case(const ZeroSizeCase& c, DType dtype, Device device) {
  std::vector<Tensor> inputs;
  for (const Shape& shape : c.shapes) {
    Tensor t = ones(shape, dtype).to(device);
    t.set_requires_grad(true);
    inputs.push_back(t);
  }
  const Tensor out = c.fn(inputs);
  if (out.shape() != c.out) {
    return ::testing::AssertionFailure() << "result " << out.to_string() << ", expected shape " << shape_to_string(c.out);
  }
  // Exact: every expected value is 0, 1, a small count or NaN, in every dtype.
  const auto same = [](double got, double want) { return std::isnan(want) ? std::isnan(got) : got == want; };
  for (const double v : out.to_double_vector()) {
    if (!same(v, c.value)) return ::testing::AssertionFailure() << "result holds " << v << ", expected " << c.value;
  }
  ops::sum(out).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor g = inputs[i].grad();
    if (!g.defined() || g.shape() != inputs[i].shape()) {
      return ::testing::AssertionFailure() << "input " << i << " " << inputs[i].to_string() << " got the gradient "
                                           << (g.defined() ? g.to_string() : "(undefined)");
    }
    const double want = i < c.grad_values.size() ? c.grad_values[i] : 0.0;
    for (const double v : g.to_double_vector()) {
      if (!same(v, want)) {
        return ::testing::AssertionFailure() << "input " << i << "'s gradient holds " << v << ", expected " << want;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ampgrad::test
