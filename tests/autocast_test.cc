// Autocast: the cast policy of each op inside and outside guards, guard nesting and per-device
// state, gradients of FP32 leaves used in FP16, and the cast cache's freshness guarantees.
#include <gtest/gtest.h>

#include <string>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "amp_test_util.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/utils.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Device;
using ag::Tensor;
using ag::amp::AutocastGuard;
using ag::test::max_abs;
using ag::test::max_abs_diff;

namespace {

Tensor f32(const ag::Shape& shape) { return ag::randn(shape); }
Tensor f16(const ag::Shape& shape) { return ag::randn(shape, DType::kFloat16); }

// The per-op policies, for each autocast dtype (float16 and bfloat16 follow the same table).
class AutocastPolicyTest : public ::testing::TestWithParam<DType> {};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(ag::dtype_name(info.param));
}

TEST_P(AutocastPolicyTest, LinearAndMatmulRunInTheAutocastDtype) {
  const DType low = GetParam();
  ag::manual_seed(1);
  const Tensor x = f32({3, 4}), w = f32({2, 4}), b = f32({2});
  AutocastGuard autocast(Device::kCPU, low);
  EXPECT_EQ(ag::ops::linear(x, w, b).dtype(), low);
  EXPECT_EQ(ag::ops::linear(x, w).dtype(), low);
  EXPECT_EQ(ag::ops::linear(x.to(low), w, b).dtype(), low);  // mixed inputs are fine
  EXPECT_EQ(ag::ops::matmul(x, f32({4, 5})).dtype(), low);
  // An input in the other 16-bit dtype is cast to the autocast dtype too, as in PyTorch.
  const DType other = low == DType::kFloat16 ? DType::kBFloat16 : DType::kFloat16;
  EXPECT_EQ(ag::ops::linear(x.to(other), w, b).dtype(), low);
  // The result equals the explicit computation in the autocast dtype bit for bit.
  Tensor manual;
  {
    AutocastGuard off(Device::kCPU, low, /*enabled=*/false);
    manual = ag::ops::linear(x.to(low), w.to(low), b.to(low));
  }
  EXPECT_EQ(ag::ops::linear(x, w, b).to_double_vector(), manual.to_double_vector());
}

TEST_P(AutocastPolicyTest, LossesAndReductionsRunInFloat32) {
  const DType low = GetParam();
  ag::manual_seed(2);
  const Tensor a = ag::randn({4, 3}, low), b = ag::randn({4, 3}, low);
  AutocastGuard autocast(Device::kCPU, low);
  EXPECT_EQ(ag::ops::mse_loss(a, b).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::mse_loss(a, b.to(DType::kFloat32)).dtype(), DType::kFloat32);  // mixed inputs are fine
  EXPECT_EQ(ag::ops::sum(a).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::mean(a).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::sum(a.to(DType::kFloat32)).dtype(), DType::kFloat32);
  // The sum of 4097 values of 1 + eps is exact in FP32 (and representable in neither 16-bit type).
  const double eps = ag::dtype_info(low).eps;
  const Tensor many = ag::full({4097}, 1.0 + eps, low);
  EXPECT_EQ(ag::ops::sum(many).item(), static_cast<float>(4097 * (1.0 + eps)));
  EXPECT_NE(static_cast<double>(ag::full({1}, 4097 * (1.0 + eps), low).item()), 4097 * (1.0 + eps));
}

TEST_P(AutocastPolicyTest, ElementwiseOpsPromoteToTheWidestInput) {
  const DType low = GetParam();
  ag::manual_seed(3);
  const Tensor h = ag::randn({2, 3}, low), s = f32({2, 3});
  AutocastGuard autocast(Device::kCPU, low);
  EXPECT_EQ((h + s).dtype(), DType::kFloat32);
  EXPECT_EQ((s - h).dtype(), DType::kFloat32);
  EXPECT_EQ((h * s).dtype(), DType::kFloat32);
  EXPECT_EQ((h + h).dtype(), low);
  EXPECT_EQ((s * s).dtype(), DType::kFloat32);  // FP32 element-wise ops are not lowered
  // float16 with bfloat16 meets in float32 (neither holds the other), inside a guard or not.
  EXPECT_EQ((f16({2, 3}) + ag::randn({2, 3}, DType::kBFloat16)).dtype(), DType::kFloat32);
}

TEST_P(AutocastPolicyTest, ReluKeepsItsInputDtype) {
  const DType low = GetParam();
  ag::manual_seed(4);
  AutocastGuard autocast(Device::kCPU, low);
  EXPECT_EQ(ag::ops::relu(f32({5})).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::relu(f16({5})).dtype(), DType::kFloat16);
  EXPECT_EQ(ag::ops::relu(ag::randn({5}, DType::kBFloat16)).dtype(), DType::kBFloat16);
}

TEST(AutocastPolicy, NothingIsCastOutsideAGuard) {
  ag::manual_seed(5);
  const Tensor x = f32({3, 4}), w = f32({2, 4}), h = f16({3, 4});
  ASSERT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
  EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat32);
  EXPECT_EQ(ag::ops::linear(h, w.to(DType::kFloat16)).dtype(), DType::kFloat16);
  EXPECT_EQ(ag::ops::sum(h).dtype(), DType::kFloat16);
  EXPECT_EQ(ag::ops::mean(h).dtype(), DType::kFloat16);
  EXPECT_EQ(ag::ops::mse_loss(h, h).dtype(), DType::kFloat16);
  EXPECT_THROW(ag::ops::linear(h, w), ag::Error);    // float16 x with float32 w: no silent cast
  EXPECT_THROW(ag::ops::mse_loss(h, x), ag::Error);  // likewise
  EXPECT_EQ((h + x).dtype(), DType::kFloat32);       // promotion is always on
  EXPECT_EQ((x * h).dtype(), DType::kFloat32);
}

TEST(AutocastGuardState, NestedGuardsRestoreTheEnclosingState) {
  ag::manual_seed(6);
  const Tensor x = f32({2, 3}), w = f32({4, 3});
  {
    AutocastGuard outer(Device::kCPU, DType::kFloat16);
    {
      AutocastGuard inner(Device::kCPU, DType::kFloat16);
      EXPECT_TRUE(ag::amp::is_autocast_enabled(Device::kCPU));
      {
        AutocastGuard off(Device::kCPU, DType::kFloat16, /*enabled=*/false);
        EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
        EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat32);
        EXPECT_EQ(ag::ops::sum(f16({3})).dtype(), DType::kFloat16);
      }
      EXPECT_TRUE(ag::amp::is_autocast_enabled(Device::kCPU));
      EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat16);
    }
    EXPECT_TRUE(ag::amp::is_autocast_enabled(Device::kCPU));
    EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat16);
  }
  EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
  EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat32);
  // A disabled guard outside any region leaves autocast off and is restored to off.
  {
    AutocastGuard off(Device::kCPU, DType::kFloat16, /*enabled=*/false);
    EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
  }
  EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
}

TEST(AutocastGuardState, EachDeviceHasItsOwnState) {
  ag::manual_seed(7);
  const Tensor x = f32({2, 3}), w = f32({4, 3});
  {
    AutocastGuard cpu(Device::kCPU, DType::kFloat16);
    EXPECT_TRUE(ag::amp::is_autocast_enabled(Device::kCPU));
    EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCUDA));
    EXPECT_FALSE(ag::autocast::state(Device::kCUDA).enabled);
  }
  {
    // A CUDA guard (state only; needs no GPU) leaves CPU ops alone.
    AutocastGuard cuda(Device::kCUDA, DType::kFloat16);
    EXPECT_TRUE(ag::amp::is_autocast_enabled(Device::kCUDA));
    EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
    EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat32);
  }
  EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCUDA));
}

TEST(AutocastGuardState, OnlyLowPrecisionIsAcceptedAndARejectedGuardChangesNothing) {
  EXPECT_ERROR([] { AutocastGuard bad(Device::kCPU, DType::kFloat32); }, "float16 or bfloat16", "float32");
  EXPECT_ERROR([] { AutocastGuard bad(Device::kCPU, DType::kInt64); }, "int64");
  EXPECT_FALSE(ag::amp::is_autocast_enabled(Device::kCPU));
  EXPECT_EQ(ag::autocast::cache_size(), 0u);
}

TEST(AutocastPolicy, Float64IsNeverAutocast) {
  ag::manual_seed(8);
  const Tensor x = f32({2, 3}).to(DType::kFloat64), w = f32({4, 3}).to(DType::kFloat64);
  AutocastGuard autocast(Device::kCPU, DType::kFloat16);
  EXPECT_EQ(ag::ops::linear(x, w).dtype(), DType::kFloat64);
  EXPECT_EQ(ag::ops::matmul(x, f32({3, 2}).to(DType::kFloat64)).dtype(), DType::kFloat64);
  EXPECT_EQ(ag::ops::sum(x).dtype(), DType::kFloat64);
  EXPECT_EQ(ag::ops::mse_loss(x, x).dtype(), DType::kFloat64);
  EXPECT_EQ((x + f16({2, 3})).dtype(), DType::kFloat64);
}

TEST_P(AutocastPolicyTest, Fp32LeavesGetFp32GradientsMatchingFp32Training) {
  const DType low = GetParam();
  ag::manual_seed(9);
  ag::nn::Sequential model{ag::nn::Linear(8, 16), ag::nn::ReLU(), ag::nn::Linear(16, 2)};
  const Tensor x = f32({32, 8}), y = f32({32, 2});

  ag::ops::mse_loss(model(x), y).backward();
  std::vector<Tensor> reference;
  for (Tensor& p : model.parameters()) {
    reference.push_back(p.grad());
    p.set_grad(Tensor());
  }
  {
    AutocastGuard autocast(Device::kCPU, low);
    const Tensor out = model(x);
    ASSERT_EQ(out.dtype(), low);
    const Tensor loss = ag::ops::mse_loss(out, y);
    ASSERT_EQ(loss.dtype(), DType::kFloat32);
    loss.backward();
  }
  const std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    ASSERT_TRUE(g.defined()) << "parameter " << i;
    EXPECT_EQ(g.dtype(), DType::kFloat32) << "parameter " << i;
    // The autocast dtype rounds inputs, weights, activations and output gradients (eps/2 each:
    // 2^-11 for float16): a few of those relative to the gradient's magnitude.
    const double units = ag::dtype_info(low).eps / ag::dtype_info(DType::kFloat16).eps;
    const double tol = (1e-3 + 2e-2 * max_abs(reference[i])) * units;
    EXPECT_LE(max_abs_diff(g, reference[i]), tol) << "parameter " << i;
    EXPECT_GT(max_abs_diff(g, reference[i]), 0.0) << "parameter " << i << ": " << low << " should round something";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AutocastPolicyTest, ::testing::ValuesIn(ag::kLowPrecisionDTypes), dtype_param_name);

// ---- The cast cache -------------------------------------------------------------------------

// The Cast node that fed input `index` of the op that produced `out` (identifies a cached copy).
const ag::Node* cast_node_of_input(const Tensor& out, size_t index) {
  return out.grad_fn()->next_edges.at(index).node.get();
}

TEST(AutocastCache, AForwardUnderNoGradDoesNotStarveALaterForwardOfGradients) {
  // PyTorch's bug: the no-grad forward caches an FP16 weight without history, the next forward
  // reuses it and the FP32 weight silently gets no gradient.
  ag::manual_seed(10);
  ag::nn::Linear lin(4, 3);
  const Tensor x = f32({5, 4}), y = f32({5, 3});
  Tensor expected_dw;
  {
    AutocastGuard autocast(Device::kCPU, DType::kFloat16);
    ag::ops::mse_loss(lin(x), y).backward();
    expected_dw = lin.weight.grad();
  }
  lin.weight.set_grad(Tensor());
  lin.bias.set_grad(Tensor());
  {
    AutocastGuard autocast(Device::kCPU, DType::kFloat16);
    {
      ag::NoGradGuard no_grad;
      EXPECT_FALSE(lin(x).requires_grad());
    }
    const Tensor loss = ag::ops::mse_loss(lin(x), y);
    ASSERT_TRUE(loss.requires_grad());
    loss.backward();
    EXPECT_EQ(ag::autocast::cache_size(), 2u);  // the history-less copies were replaced, not added to
  }
  ASSERT_TRUE(lin.weight.grad().defined());
  ASSERT_TRUE(lin.bias.grad().defined());
  EXPECT_EQ(lin.weight.grad().to_double_vector(), expected_dw.to_double_vector());
}

TEST(AutocastCache, AnOptimizerStepInsideARegionIsSeenByTheNextForward) {
  ag::manual_seed(11);
  ag::nn::Linear lin(4, 3);
  ag::optim::SGD sgd(lin.parameters(), {.lr = 0.5});
  const Tensor x = f32({5, 4}), y = f32({5, 3});
  Tensor first, second;
  {
    AutocastGuard autocast(Device::kCPU, DType::kFloat16);
    first = lin(x);
    ag::ops::mse_loss(first, y).backward();
    sgd.step();
    second = lin(x);
  }
  Tensor fresh;
  {
    AutocastGuard autocast(Device::kCPU, DType::kFloat16);
    fresh = lin(x);
  }
  EXPECT_NE(second.to_double_vector(), first.to_double_vector());  // the step changed the weights enough to show
  EXPECT_EQ(second.to_double_vector(), fresh.to_double_vector());
}

TEST(AutocastCache, ReplacingAParameterTensorInsideARegionIsSeenByTheNextForward) {
  // set_data (what loading a checkpoint does) swaps the storage; the copy must not survive it,
  // even when the new storage happens to carry the same version number as the old one.
  ag::manual_seed(12);
  ag::nn::Linear lin(4, 3);
  const Tensor x = f32({5, 4});
  AutocastGuard autocast(Device::kCPU, DType::kFloat16);
  const Tensor before = lin(x);
  const Tensor new_weight = ag::full({3, 4}, 0.25);
  lin.weight.set_data(new_weight);
  const Tensor after = lin(x);
  Tensor expected;
  {
    AutocastGuard off(Device::kCPU, DType::kFloat16, /*enabled=*/false);
    expected = ag::ops::linear(x.to(DType::kFloat16), new_weight.to(DType::kFloat16), lin.bias.to(DType::kFloat16));
  }
  EXPECT_NE(after.to_double_vector(), before.to_double_vector());
  EXPECT_EQ(after.to_double_vector(), expected.to_double_vector());
}

TEST(AutocastCache, OneCopyPerParameterIsReusedAndClearedWithTheOutermostGuard) {
  ag::manual_seed(13);
  ag::nn::Linear lin(4, 3);
  const Tensor x = f32({5, 4}), y = f32({5, 3});
  EXPECT_EQ(ag::autocast::cache_size(), 0u);
  {
    AutocastGuard outer(Device::kCPU, DType::kFloat16);
    Tensor out1, out2;
    {
      AutocastGuard inner(Device::kCPU, DType::kFloat16);
      out1 = lin(x);
      EXPECT_EQ(ag::autocast::cache_size(), 2u);  // weight and bias
    }
    EXPECT_EQ(ag::autocast::cache_size(), 2u);  // an inner guard's exit keeps the cache
    out2 = lin(x);
    EXPECT_EQ(ag::autocast::cache_size(), 2u);
    EXPECT_EQ(cast_node_of_input(out1, 1), cast_node_of_input(out2, 1));  // the same FP16 weight
    EXPECT_EQ(cast_node_of_input(out1, 2), cast_node_of_input(out2, 2));  // the same FP16 bias
    // Inputs that are not parameters (no grad) are cast afresh and not cached.
    EXPECT_EQ(ag::ops::matmul(x, f32({4, 2})).dtype(), DType::kFloat16);
    EXPECT_EQ(ag::autocast::cache_size(), 2u);
    // Both uses route their gradients through the shared copy into the FP32 weight.
    (ag::ops::mse_loss(out1, y) + ag::ops::mse_loss(out2, y)).backward();
  }
  EXPECT_EQ(ag::autocast::cache_size(), 0u);
  const Tensor dw_twice = lin.weight.grad();
  ASSERT_TRUE(dw_twice.defined());
  lin.weight.set_grad(Tensor());
  {
    AutocastGuard autocast(Device::kCPU, DType::kFloat16);
    ag::ops::mse_loss(lin(x), y).backward();
  }
  const std::vector<float> once = lin.weight.grad().to_vector(), twice = dw_twice.to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2.0f * once[i]) << i;
}

// Mixed FP16/BF16 in one program: a float16 guard inside a bfloat16 one and back. Each level
// computes in its own dtype, the cache keeps one copy per (parameter, dtype) and can only hand out
// a copy of the dtype asked for, and gradients from both levels reach the FP32 parameter.
TEST(AutocastCache, NestedGuardsOfDifferentDtypesKeepACopyOfEach) {
  ag::manual_seed(14);
  ag::nn::Linear lin(4, 3);
  const Tensor x = f32({5, 4}), y = f32({5, 3});
  Tensor outer_before, inner, outer_after, inner_disabled;
  {
    AutocastGuard bf16(Device::kCPU, DType::kBFloat16);
    outer_before = lin(x);
    EXPECT_EQ(ag::autocast::cache_size(), 2u);
    {
      AutocastGuard fp16(Device::kCPU, DType::kFloat16);
      inner = lin(x);
      EXPECT_EQ(ag::autocast::cache_size(), 4u);  // the bfloat16 copies stay beside the float16 ones
      {
        AutocastGuard off(Device::kCPU, DType::kFloat16, /*enabled=*/false);
        inner_disabled = lin(x);
      }
    }
    EXPECT_EQ(ag::autocast::state(Device::kCPU).dtype, DType::kBFloat16);  // restored
    outer_after = lin(x);
    EXPECT_EQ(ag::autocast::cache_size(), 4u);
    (ag::ops::mse_loss(outer_before, y) + ag::ops::mse_loss(inner, y) + ag::ops::mse_loss(outer_after, y)).backward();
  }
  EXPECT_EQ(ag::autocast::cache_size(), 0u);
  EXPECT_EQ(outer_before.dtype(), DType::kBFloat16);
  EXPECT_EQ(inner.dtype(), DType::kFloat16);
  EXPECT_EQ(inner_disabled.dtype(), DType::kFloat32);
  EXPECT_EQ(outer_after.dtype(), DType::kBFloat16);
  // Back in the bfloat16 level, the same bfloat16 copies (not the float16 ones) are reused.
  EXPECT_EQ(cast_node_of_input(outer_before, 1), cast_node_of_input(outer_after, 1));
  EXPECT_NE(cast_node_of_input(outer_before, 1), cast_node_of_input(inner, 1));
  EXPECT_EQ(outer_after.to_double_vector(), outer_before.to_double_vector());
  // Each level equals its explicit computation.
  Tensor expected_bf16, expected_fp16;
  {
    ag::NoGradGuard no_grad;
    const Tensor w = lin.weight.detach(), b = lin.bias.detach();
    expected_bf16 = ag::ops::linear(x.to(DType::kBFloat16), w.to(DType::kBFloat16), b.to(DType::kBFloat16));
    expected_fp16 = ag::ops::linear(x.to(DType::kFloat16), w.to(DType::kFloat16), b.to(DType::kFloat16));
  }
  EXPECT_EQ(outer_before.to_double_vector(), expected_bf16.to_double_vector());
  EXPECT_EQ(inner.to_double_vector(), expected_fp16.to_double_vector());
  ASSERT_TRUE(lin.weight.grad().defined());
  EXPECT_EQ(lin.weight.grad().dtype(), DType::kFloat32);
}

}  // namespace
