// Every row of the shared op-case table (op_cases.h) in float32, float16, bfloat16 and float64:
// forward against a float64 reference, a float64 finite-difference gradient check, and each 16-bit
// dtype's forward/backward against FP32.
// (FP32 accumulation, casts and error messages are in ops_precision_test.cc and ops_errors_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "op_cases.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/strided.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::DType;
using ag::Shape;
using ag::Tensor;
using agt::make_inputs;
using agt::OpCase;
using agt::Values;

namespace {

std::string case_name(const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; }

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
                         ::testing::Combine(::testing::ValuesIn(agt::op_cases()),
                                            ::testing::ValuesIn(ag::kFloatingDTypes)),
                         agt::row_and_dtype_name);

class OpTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTest, GradientMatchesFiniteDifferencesInFloat64) {
  const OpCase& op = GetParam();
  EXPECT_TRUE(agt::gradcheck(op.fn, make_inputs(op, DType::kFloat64)));
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTest, ::testing::ValuesIn(agt::op_cases()), case_name);

class OpLowPrecisionTest : public ::testing::TestWithParam<std::tuple<OpCase, DType>> {};

TEST_P(OpLowPrecisionTest, MatchesFloat32) {
  const auto& [op, dtype] = GetParam();
  // The same (unrounded) inputs: the difference includes rounding them to the 16-bit dtype
  // (evaluate also checks that every gradient has the inputs' dtype).
  const std::vector<Tensor> inputs = make_inputs(op, DType::kFloat64);
  const agt::Evaluated low = agt::evaluate(op.fn, inputs, dtype);
  const agt::Evaluated single = agt::evaluate(op.fn, inputs, DType::kFloat32);
  EXPECT_CLOSE(low.out, single.out, dtype, op.tol) << "forward";
  ASSERT_EQ(low.grads.size(), single.grads.size());
  for (size_t i = 0; i < low.grads.size(); ++i) {
    EXPECT_CLOSE(low.grads[i], single.grads[i], dtype, op.tol) << "gradient of input " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpLowPrecisionTest,
                         ::testing::Combine(::testing::ValuesIn(agt::op_cases()),
                                            ::testing::ValuesIn(ag::kLowPrecisionDTypes)),
                         agt::row_and_dtype_name);

}  // namespace

namespace {

// relu and its gradient on every one of the 65536 values of each 16-bit dtype (the kernel works on
// the bits), against float: +-0 and negatives (-inf too) give 0, NaN stays NaN, everything else
// passes; the gradient is 0 exactly where x <= 0 and dy elsewhere (NaN included, as PyTorch).
class Relu16Test : public ::testing::TestWithParam<DType> {};

TEST_P(Relu16Test, EveryValueMatchesFloat) {
  const DType dtype = GetParam();
  Tensor x = Tensor::empty({65536}, dtype);
  auto* bits = static_cast<uint16_t*>(x.data_ptr());
  for (uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  const Tensor dy = ag::full({65536}, 3.0, dtype);
  Tensor y = Tensor::empty({65536}, dtype), dx = Tensor::empty({65536}, dtype);
  ag::kernels::relu(x, y);
  ag::kernels::relu_backward(x, dy, dx);
  const std::vector<float> values = x.to_vector(), outs = y.to_vector(), grads = dx.to_vector();
  int mismatches = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float v = values[i], out = outs[i], grad = grads[i];
    const bool ok_forward = std::isnan(v) ? std::isnan(out) : (v > 0 ? out == v : (out == 0 && !std::signbit(out)));
    const bool ok_backward = grad == (v <= 0 ? 0.0f : 3.0f);  // NaN passes its gradient, as in PyTorch
    if (!ok_forward || !ok_backward) {
      ADD_FAILURE_AT(__FILE__, __LINE__) << "bits 0x" << std::hex << i << ": relu " << out << ", grad " << grad;
      if (++mismatches > 5) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Relu16Test, ::testing::ValuesIn(ag::kLowPrecisionDTypes),
                         [](const auto& info) { return std::string(ag::dtype_name(info.param)); });

// FP16 add/sub/mul over rows long enough for the 8-wide kernel path (37: four vectors and a
// tail), for each way an operand can be walked (a row, a broadcast row, one value), bit for bit
// against the definition: widen both to float, compute in float, round once to nearest even.
// The values reach overflow (inf) and subnormal results.
TEST(ElementwiseHalf, LongRowsMatchFloatMathRoundedOnce) {
  const std::pair<ag::Shape, ag::Shape> layouts[] = {
      {{3, 37}, {3, 37}}, {{3, 37}, {37}}, {{37}, {3, 37}}, {{3, 37}, {}}, {{}, {3, 37}}, {{3, 1}, {1, 37}}};
  struct Op {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    float (*ref)(float, float);
  };
  const Op binaries[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](float a, float b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](float a, float b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](float a, float b) { return a * b; }},
  };
  uint64_t seed = 40;
  for (const auto& [sa, sb] : layouts) {
    for (const Op& op : binaries) {
      // Magnitudes from 2^-14 to 2^15: sums overflow, products overflow and go subnormal.
      const auto values = [&](const ag::Shape& shape) {
        std::vector<double> v = agt::random_values(ag::shape_numel(shape), -1, 1, seed += 7);
        for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i % 30) - 14);
        return Tensor::from_vector(v, shape, DType::kFloat16);
      };
      const Tensor a = values(sa), b = values(sb);
      const Tensor out = op.op(a, b);
      const ag::Shape shape = out.shape();
      const ag::Shape a_strides = ag::kernels::broadcast_strides(sa, shape);
      const ag::Shape b_strides = ag::kernels::broadcast_strides(sb, shape);
      const int64_t cols = shape.back(), rows = out.numel() / cols;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const auto at = [&](const Tensor& t, const ag::Shape& strides) {
            const int64_t offset = (strides.size() > 1 ? r * strides[strides.size() - 2] : 0) + c * strides.back();
            return ag::half_to_float(t.data<ag::Half>()[offset]);
          };
          const uint16_t expected = ag::float_to_half(op.ref(at(a, a_strides), at(b, b_strides))).bits;
          ASSERT_EQ(out.data<ag::Half>()[r * cols + c].bits, expected)
              << op.name << " " << ::testing::PrintToString(sa) << " " << ::testing::PrintToString(sb) << " at " << r
              << "," << c;
        }
      }
    }
  }
}

}  // namespace
