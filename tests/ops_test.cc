// Every op, table-driven, in float32, float16 and float64: forward against a float64 reference,
// a float64 finite-difference gradient check, and FP16 forward/backward against FP32.
// (FP32 accumulation, casts and error messages are in ops_precision_test.cc and ops_errors_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "ampgrad.h"
#include "ops/kernels.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Shape;
using ag::Tensor;
using Values = std::vector<double>;

namespace {

struct OpCase {
  std::string name;
  std::vector<Shape> shapes;  // of the inputs
  agt::TensorFn fn;
  std::function<Values(const std::vector<Values>&)> reference;  // in double, from the inputs' values
  agt::Tol tol;  // accumulation length and term size (see all_close)
};

void PrintTo(const OpCase& op, std::ostream* out) { *out << op.name; }

// out[i] = f(a[i % |a|], b[i % |b|]): with row-major storage this is how an operand that is the
// output's shape, a trailing row of it, or one element lines up with out[i].
Values broadcast_ref(const Values& a, const Values& b, double (*f)(double, double)) {
  const size_t n = std::max(a.size(), b.size());
  Values out(n);
  for (size_t i = 0; i < n; ++i) out[i] = f(a[i % a.size()], b[i % b.size()]);
  return out;
}

Values map_ref(const Values& x, const std::function<double(double)>& f) {
  Values out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), f);
  return out;
}

double sum_ref(const Values& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  using In = const std::vector<Tensor>&;
  using Refs = const std::vector<Values>&;
  cases.push_back({"linear", {{5, 7}, {3, 7}, {3}}, [](In t) { return ag::ops::linear(t[0], t[1], t[2]); },
                   [](Refs v) { return agt::linear_ref(v[0], v[1], v[2], 5, 7, 3); }, {.k = 7, .magnitude = 4}});
  cases.push_back({"linear_no_bias", {{5, 7}, {3, 7}}, [](In t) { return ag::ops::linear(t[0], t[1]); },
                   [](Refs v) { return agt::linear_ref(v[0], v[1], {}, 5, 7, 3); }, {.k = 7, .magnitude = 4}});
  cases.push_back({"matmul", {{4, 6}, {6, 3}}, [](In t) { return ag::ops::matmul(t[0], t[1]); },
                   [](Refs v) { return agt::matmul_ref(v[0], v[1], 4, 6, 3); }, {.k = 6, .magnitude = 4}});

  // add / sub / mul with every supported broadcast: equal shapes, a trailing row on either side,
  // one element (0-dim or [1]) on either side.
  struct Binary {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const Binary binaries[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }},
  };
  const std::pair<const char*, std::vector<Shape>> layouts[] = {
      {"same", {{3, 4}, {3, 4}}},        {"row_right", {{2, 3, 4}, {4}}}, {"row_left", {{4}, {3, 4}}},
      {"scalar_right", {{3, 4}, {}}},    {"scalar_left", {{}, {3, 4}}},   {"one_element", {{3, 4}, {1}}},
  };
  for (const Binary& b : binaries) {
    for (const auto& [layout, shapes] : layouts) {
      cases.push_back({std::string(b.name) + "_" + layout, shapes, [op = b.op](In t) { return op(t[0], t[1]); },
                       [f = b.ref](Refs v) { return broadcast_ref(v[0], v[1], f); }, {}});
    }
  }

  // The scalar forms and relu, on [3, 5].
  auto unary = [&](const char* name, std::function<Tensor(const Tensor&)> op, std::function<double(double)> ref) {
    cases.push_back({name, {{3, 5}}, [op](In t) { return op(t[0]); }, [ref](Refs v) { return map_ref(v[0], ref); }, {}});
  };
  unary("times_scalar", [](const Tensor& x) { return x * 2.0f; }, [](double x) { return 2 * x; });
  unary("scalar_times", [](const Tensor& x) { return -0.5f * x; }, [](double x) { return -0.5 * x; });
  unary("plus_scalar", [](const Tensor& x) { return x + 1.5f; }, [](double x) { return x + 1.5; });
  unary("minus_scalar", [](const Tensor& x) { return x - 0.75f; }, [](double x) { return x - 0.75; });
  unary("negate", [](const Tensor& x) { return -x; }, [](double x) { return -x; });
  unary("scale", [](const Tensor& x) { return ag::ops::scale(x, 3.0); }, [](double x) { return 3 * x; });
  unary("relu", [](const Tensor& x) { return ag::ops::relu(x); }, [](double x) { return x > 0 ? x : 0.0; });

  // Reductions and the loss: 0-dim results.
  cases.push_back({"sum", {{3, 5}}, [](In t) { return ag::ops::sum(t[0]); },
                   [](Refs v) { return Values{sum_ref(v[0])}; }, {.k = 15, .magnitude = 2}});
  cases.push_back({"sum_rank0", {{}}, [](In t) { return ag::ops::sum(t[0]); }, [](Refs v) { return v[0]; }, {}});
  cases.push_back({"mean", {{2, 3, 4}}, [](In t) { return ag::ops::mean(t[0]); },
                   [](Refs v) { return Values{sum_ref(v[0]) / 24}; }, {.k = 24, .magnitude = 2}});
  cases.push_back({"mse_loss", {{6, 2}, {6, 2}}, [](In t) { return ag::ops::mse_loss(t[0], t[1]); },
                   [](Refs v) {
                     double s = 0;
                     for (size_t i = 0; i < v[0].size(); ++i) s += (v[0][i] - v[1][i]) * (v[0][i] - v[1][i]);
                     return Values{s / 12};
                   },
                   {.k = 12, .magnitude = 4}});
  // Ops composed: a small MLP layer and its loss.
  cases.push_back({"mlp", {{4, 3}, {5, 3}, {5}, {4, 5}},
                   [](In t) { return ag::ops::mse_loss(ag::ops::relu(ag::ops::linear(t[0], t[1], t[2])), t[3]); },
                   [](Refs v) {
                     const Values h = map_ref(agt::linear_ref(v[0], v[1], v[2], 4, 3, 5),
                                              [](double x) { return x > 0 ? x : 0.0; });
                     double s = 0;
                     for (size_t i = 0; i < h.size(); ++i) s += (h[i] - v[3][i]) * (h[i] - v[3][i]);
                     return Values{s / 20};
                   },
                   {.k = 20, .magnitude = 8}});
  return cases;
}

// Inputs: uniform values in +-[0.1, 2.1), kept away from 0 so that relu's kink is never within a
// finite-difference step (for the mlp case: its hidden pre-activations, with these fixed seeds).
std::vector<Tensor> make_inputs(const OpCase& op, DType dtype) {
  std::vector<Tensor> inputs;
  uint64_t seed = 11;
  for (const Shape& shape : op.shapes) {
    Values v = agt::random_values(static_cast<size_t>(ag::shape_numel(shape)), -2.0, 2.0, seed++);
    for (double& x : v) x += x < 0 ? -0.1 : 0.1;
    inputs.push_back(Tensor::from_vector(v, shape, dtype));
  }
  return inputs;
}

std::string case_name(const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; }
std::string case_dtype_name(const ::testing::TestParamInfo<std::tuple<OpCase, DType>>& info) {
  return std::get<0>(info.param).name + "_" + std::string(ag::dtype_name(std::get<1>(info.param)));
}

class OpDtypeTest : public ::testing::TestWithParam<std::tuple<OpCase, DType>> {};

TEST_P(OpDtypeTest, ForwardMatchesFloat64Reference) {
  const auto& [op, dtype] = GetParam();
  const std::vector<Tensor> inputs = make_inputs(op, dtype);
  std::vector<Values> values;  // the inputs as rounded to dtype: the reference starts from them
  for (const Tensor& t : inputs) values.push_back(t.to_double_vector());
  const Tensor out = op.fn(inputs);
  EXPECT_EQ(out.dtype(), dtype);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_CLOSE(out, op.reference(values), dtype, op.tol);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpDtypeTest,
                         ::testing::Combine(::testing::ValuesIn(all_cases()),
                                            ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kFloat64)),
                         case_dtype_name);

class OpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTest, GradientMatchesFiniteDifferencesInFloat64) {
  const OpCase& op = GetParam();
  EXPECT_TRUE(agt::gradcheck(op.fn, make_inputs(op, DType::kFloat64)));
}

TEST_P(OpTest, Float16MatchesFloat32) {
  const OpCase& op = GetParam();
  // The same (unrounded) inputs: the difference includes rounding them to float16.
  const std::vector<Tensor> inputs = make_inputs(op, DType::kFloat64);
  const agt::Evaluated half = agt::evaluate(op.fn, inputs, DType::kFloat16);
  const agt::Evaluated single = agt::evaluate(op.fn, inputs, DType::kFloat32);
  EXPECT_CLOSE(half.out, single.out, DType::kFloat16, op.tol) << "forward";
  ASSERT_EQ(half.grads.size(), single.grads.size());
  for (size_t i = 0; i < half.grads.size(); ++i) {
    EXPECT_CLOSE(half.grads[i], single.grads[i], DType::kFloat16, op.tol) << "gradient of input " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace

namespace {

// relu and its gradient on every one of the 65536 binary16 values (the kernel works on the bits),
// against float: +-0 and negatives (-inf too) give 0, NaN stays NaN, everything else passes; the
// gradient passes dy exactly where x > 0.
TEST(Relu, EveryHalfValueMatchesFloat) {
  std::vector<ag::Half> bits(65536);
  for (uint32_t i = 0; i < 65536; ++i) bits[i] = ag::Half{static_cast<uint16_t>(i)};
  Tensor x = Tensor::empty({65536}, DType::kFloat16);
  std::copy(bits.begin(), bits.end(), x.data<ag::Half>());
  const Tensor dy = ag::full({65536}, 3.0, DType::kFloat16);
  Tensor y = Tensor::empty({65536}, DType::kFloat16), dx = Tensor::empty({65536}, DType::kFloat16);
  ag::kernels::relu(x, y);
  ag::kernels::relu_backward(x, dy, dx);
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float v = ag::half_to_float(bits[i]);
    const float out = ag::half_to_float(y.data<ag::Half>()[i]);
    const float grad = ag::half_to_float(dx.data<ag::Half>()[i]);
    const bool ok_forward = std::isnan(v) ? std::isnan(out) : (v > 0 ? out == v : (out == 0 && !std::signbit(out)));
    const bool ok_backward = grad == (v > 0 ? 3.0f : 0.0f);
    if (!ok_forward || !ok_backward) {
      ADD_FAILURE_AT(__FILE__, __LINE__) << "bits 0x" << std::hex << i << ": relu " << out << ", grad " << grad;
      if (++mismatches > 5) return;
    }
  }
}

}  // namespace
