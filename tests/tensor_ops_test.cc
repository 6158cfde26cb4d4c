// Tensors for real models, beyond the op-case table: int64 tensors (round trips, casts, refusing
// gradients and float-only ops, checkpoints), reshape as a view, the errors of the shape ops,
// argmax, and memory that stays flat over a long loop of shape ops on tensors that require grad.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "checkpoint/safetensors.h"
#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/tensor.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::DType;
using ag::Shape;
using ag::Tensor;

namespace {

TEST(Int64, RoundTripsExactly) {
  const std::vector<int64_t> values{3, -1, 4, int64_t{1} << 62, std::numeric_limits<int64_t>::min(), 0};
  const Tensor ids = Tensor::from_vector(values, {2, 3});
  EXPECT_EQ(ids.dtype(), DType::kInt64);
  EXPECT_EQ(ids.shape(), (Shape{2, 3}));
  EXPECT_EQ(ids.to_vector<int64_t>(), values);
  EXPECT_EQ(Tensor::from_vector(std::vector<int64_t>{7}, {}).item<int64_t>(), 7);
  EXPECT_EQ(ag::zeros({2}, DType::kInt64).to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(ag::full({2}, -3.9, DType::kInt64).to_vector<int64_t>(), (std::vector<int64_t>{-3, -3}));
}

TEST(Int64, CastsTruncateAndSaturateAsPyTorch) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor x = Tensor::from_vector(std::vector<double>{2.7, -2.7, 0.5, nan, inf, -inf, 1e30, 65504}, {8});
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> expected{2, -2, 0, lowest, lowest, lowest, lowest, 65504};
  EXPECT_EQ(x.to(DType::kInt64).to_vector<int64_t>(), expected);
  EXPECT_EQ(x.to(DType::kFloat32).to(DType::kInt64).to_vector<int64_t>(), expected);
  // float16 -> int64 goes through the exact float value; int64 -> float16 rounds once.
  EXPECT_EQ(x.to(DType::kFloat16).to(DType::kInt64).to_vector<int64_t>()[0], 2);
  const Tensor big = Tensor::from_vector(std::vector<int64_t>{2049, 65519, 65520, -(int64_t{1} << 40)}, {4});
  EXPECT_EQ(big.to(DType::kFloat16).to_vector<double>(),
            (std::vector<double>{2048, 65504, inf, -inf}));  // 2049 ties to even; 65520 rounds to inf
  EXPECT_EQ(big.to(DType::kFloat64).to_vector<double>()[3], -std::ldexp(1.0, 40));
  EXPECT_EQ(big.to_vector<float>()[0], 2049.0f);
}

TEST(Int64, NeverRequiresGradAndFloatOpsRefuseIt) {
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, 3}, {3});
  EXPECT_ERROR([&] { ids.set_requires_grad(true); }, "set_requires_grad(true)", "int64", "floating-point");
  EXPECT_FALSE(ids.requires_grad());
  EXPECT_ERROR([&] { (void)ag::ops::relu(ids); }, "relu", "input 0 is Tensor[3] int64", "hint");
  EXPECT_ERROR([&] { (void)ag::ops::sum(ids); }, "sum", "int64");
  EXPECT_ERROR([&] { (void)(ids * ids); }, "mul", "int64");
  EXPECT_ERROR([&] { (void)ag::ops::linear(ids, ag::ones({2, 3})); }, "linear", "int64");
  // Mixed with a float tensor, int64 is promoted (as in PyTorch).
  const Tensor mixed = ids + ag::ones({3});
  EXPECT_EQ(mixed.dtype(), DType::kFloat32);
  EXPECT_EQ(mixed.to_vector(), (std::vector<float>{2, 3, 4}));
}

TEST(Int64, ShapeOpsAndAutocastLeaveItAlone) {
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_EQ(ag::ops::transpose(ids, 0, 1).to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(ag::ops::reshape(ids, {3, 2}).dtype(), DType::kInt64);
  EXPECT_EQ(ag::ops::cat({ids, ids}, 0).to_vector<int64_t>().size(), 12u);
  EXPECT_EQ(ag::ops::narrow(ids, 1, 2, 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(ag::ops::expand(ag::ops::narrow(ids, 0, 0, 1), {2, 3}).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  ag::amp::AutocastGuard autocast(ag::Device::kCPU, DType::kFloat16);
  EXPECT_EQ(ag::ops::reshape(ids, {6}).dtype(), DType::kInt64);
  EXPECT_ERROR([&] { (void)ag::ops::matmul(ids, ids); }, "matmul", "int64");
}

TEST(Int64, ArgmaxGivesInt64WithoutGradient) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 5, 5, -2, std::nanf(""), 0}, {2, 3});
  x.set_requires_grad(true);
  const Tensor index = ag::ops::argmax(x, 1);
  EXPECT_EQ(index.dtype(), DType::kInt64);
  EXPECT_FALSE(index.requires_grad());
  EXPECT_EQ(index.to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));  // the first maximum; NaN is the maximum
  EXPECT_EQ(ag::ops::argmax(x, 0, true).shape(), (Shape{1, 3}));
  const Tensor m = ag::ops::max(x, 1);
  EXPECT_EQ(m.to_vector()[0], 5.0f);
  EXPECT_TRUE(std::isnan(m.to_vector()[1]));
  ag::ops::sum(m).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0, 1, 0, 0, 1, 0}));  // only the first maximum
  EXPECT_ERROR([] { (void)ag::ops::argmax(ag::zeros({2, 0}), 1); }, "argmax", "empty");
}

TEST(Int64, SafetensorsStoresI64) {
  const std::string path = ::testing::TempDir() + "/ids.safetensors";
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{-5, 1ll << 50, 7}, {3});
  ag::checkpoint::save_safetensors(path, {.tensors = {{"ids", ids}}});
  const ag::checkpoint::NamedTensors loaded = ag::checkpoint::load_safetensors(path);
  ASSERT_EQ(loaded.tensors.size(), 1u);
  EXPECT_EQ(loaded.tensors[0].second.dtype(), DType::kInt64);
  EXPECT_EQ(loaded.tensors[0].second.to_vector<int64_t>(), ids.to_vector<int64_t>());
}

TEST(ShapeOps, ReshapeIsAViewThatSharesVersions) {
  Tensor x = ag::randn({2, 6});
  const Tensor v = ag::ops::reshape(x, {3, -1});
  EXPECT_EQ(v.shape(), (Shape{3, 4}));
  EXPECT_EQ(v.data_ptr(), x.data_ptr());  // no copy
  // A view saved for backward sees an in-place change of the base.
  Tensor w = ag::randn({4});
  w.set_requires_grad(true);
  x.set_requires_grad(true);
  const Tensor y = ag::ops::sum(ag::ops::reshape(x, {3, 4}) * w);
  x.bump_version();  // what an in-place write does
  EXPECT_ERROR([&] { y.backward(); }, "modified in place");
}

TEST(ShapeOps, ErrorsNameTheOpAndShapes) {
  const Tensor x = ag::randn({2, 3, 4});
  EXPECT_ERROR([&] { (void)ag::ops::reshape(x, {5, -1}); }, "reshape", "[5, -1]", "Tensor[2, 3, 4]");
  EXPECT_ERROR([&] { (void)ag::ops::reshape(x, {-1, -1}); }, "reshape", "only one dimension can be -1");
  EXPECT_ERROR([&] { (void)ag::ops::reshape(x, {7, 2}); }, "reshape", "24 elements", "[7, 2]");
  EXPECT_ERROR([&] { (void)ag::ops::permute(x, {0, 1}); }, "permute", "permutation", "[0, 1]");
  EXPECT_ERROR([&] { (void)ag::ops::permute(x, {0, 1, 1}); }, "permute", "[0, 1, 1]");
  EXPECT_ERROR([&] { (void)ag::ops::transpose(x, 0, 3); }, "transpose", "dimension 3", "rank 3");
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 1, 2, 2); }, "narrow", "start 2", "length 2", "size 3");
  EXPECT_ERROR([&] { (void)ag::ops::cat({x, ag::randn({2, 4, 4})}, 0); }, "cat", "outside dimension 0");
  EXPECT_EQ(ag::ops::cat({x, ag::randn({2, 3, 4}, DType::kFloat64)}, 0).dtype(), DType::kFloat64);  // promotes
  EXPECT_ERROR([] { (void)ag::ops::cat({}, 0); }, "cat", "at least one");
  EXPECT_ERROR([&] { (void)ag::ops::expand(x, {2, 5, 4}); }, "expand", "[2, 5, 4]");
  EXPECT_ERROR([&] { (void)ag::ops::split(x, 0, 1); }, "split", "positive");
  EXPECT_ERROR([&] { (void)ag::ops::sum(x, {1, -2}); }, "sum", "listed twice");
  EXPECT_ERROR([&] { (void)ag::ops::mean(x, {3}); }, "mean", "dimension 3", "out of range");
  EXPECT_ERROR([&] { (void)ag::ops::max(x, -4); }, "max", "-4");
}

// narrow's bounds, checked without overflow for any int64 start and length; a negative start
// counts from the end (PyTorch's narrow).
TEST(ShapeOps, NarrowBoundsNeverOverflowAndNegativeStartCountsFromTheEnd) {
  const Tensor x = Tensor::from_vector(std::vector<float>{0, 1, 2, 3}, {4});
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 0, 2, kMax); }, "narrow", "start 2", "size 4");
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 0, kMax, 1); }, "narrow", "size 4");
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 0, kMin, 1); }, "narrow", "size 4");
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 0, 1, kMin); }, "narrow", "size 4");
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 0, -5, 1); }, "narrow", "start -5");
  EXPECT_ERROR([&] { (void)ag::ops::narrow(x, 0, -1, 2); }, "narrow", "start -1", "length 2");
  EXPECT_EQ(ag::ops::narrow(x, 0, -3, 2).to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(ag::ops::narrow(x, 0, -4, 4).to_vector(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(ag::ops::narrow(x, -1, -1, 1).to_vector(), (std::vector<float>{3}));
  EXPECT_EQ(ag::ops::narrow(x, 0, 4, 0).numel(), 0);  // an empty slice at the end, as PyTorch allows
  EXPECT_EQ(ag::ops::chunk(x, kMax, 0).size(), 4u);  // ceil(4 / 2^63-1) = 1 row each
}

// A tensor may have kMaxDims (25) dimensions, and every op iterates them even where none merge;
// one more is refused where the shape is made, so nothing can be created (or saved) that cannot
// be used (or loaded).
TEST(ShapeOps, TheMostDimensionsWorkEverywhereAndOneMoreIsRefusedAtCreation) {
  EXPECT_ERROR([] { (void)ag::zeros(Shape(ag::kMaxDims + 1, 1)); }, "26 dimensions", "25");
  const Tensor most = ag::zeros(Shape(ag::kMaxDims, 1));
  EXPECT_ERROR([&] { (void)ag::ops::unsqueeze(most, 0); }, "26 dimensions");
  EXPECT_ERROR([&] { (void)ag::ops::reshape(most, Shape(ag::kMaxDims + 1, 1)); }, "26 dimensions");

  // 13 dimensions of 2, reversed: element j of the result is element bit-reverse(j) of x.
  constexpr int kBits = 13;
  std::vector<float> values(1 << kBits);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  Shape twos(kBits, 2);
  twos.resize(ag::kMaxDims, 1);
  const Tensor x = Tensor::from_vector(values, twos);
  std::vector<int64_t> reversed(ag::kMaxDims);
  std::iota(reversed.begin(), reversed.end(), 0);
  std::reverse(reversed.begin(), reversed.begin() + kBits);
  const std::vector<float> permuted = ag::ops::permute(x, reversed).to_vector();
  for (uint32_t j = 0; j < values.size(); ++j) {
    uint32_t r = 0;
    for (int b = 0; b < kBits; ++b) r |= ((j >> b) & 1u) << (kBits - 1 - b);
    ASSERT_EQ(permuted[j], static_cast<float>(r)) << j;
  }

  // 16 alternating broadcast dimensions (8 of a, 8 of b, none merge), then sums over every other one.
  Shape sa(ag::kMaxDims, 1), sb(ag::kMaxDims, 1);
  for (int d = 0; d < 16; ++d) (d % 2 == 0 ? sa : sb)[static_cast<size_t>(d)] = 2;
  Tensor a = Tensor::from_vector(std::vector<float>(values.begin(), values.begin() + 256), sa);
  Tensor b = ag::full(sb, 2.0);
  a.set_requires_grad(true);
  const Tensor prod = a * b;
  EXPECT_EQ(prod.numel(), 1 << 16);
  std::vector<int64_t> odd;
  for (int d = 1; d < 16; d += 2) odd.push_back(d);
  const Tensor back = ag::ops::sum(prod, odd, /*keepdim=*/true);  // 2 * 256 copies summed: a * 512
  EXPECT_EQ(back.shape(), sa);
  const std::vector<float> got = back.to_vector();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], values[i] * 512.0f) << i;
  ag::ops::sum(prod).backward();
  EXPECT_EQ(a.grad().to_vector(), std::vector<float>(256, 512.0f));
}

TEST(ShapeOps, SplitChunkAndCatOfMany) {
  const Tensor x = ag::randn({10, 3});
  const std::vector<Tensor> parts = ag::ops::split(x, 4, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].shape(), (Shape{2, 3}));
  EXPECT_EQ(ag::ops::chunk(x, 3, 0).size(), 3u);    // ceil(10 / 3) = 4 rows each: 4, 4, 2
  EXPECT_EQ(ag::ops::chunk(x, 20, 0).size(), 10u);  // never empty pieces
  // 100 tensors (more than one op takes at once) still join, with gradients flowing to each.
  std::vector<Tensor> many;
  for (int i = 0; i < 100; ++i) {
    many.push_back(ag::full({1, 2}, i));
    many.back().set_requires_grad(true);
  }
  const Tensor joined = ag::ops::cat(many, 0);
  EXPECT_EQ(joined.shape(), (Shape{100, 2}));
  EXPECT_EQ(joined.to_vector()[2 * 57], 57.0f);
  ag::ops::sum(joined * 3.0f).backward();
  for (const Tensor& t : many) EXPECT_EQ(t.grad().to_vector(), (std::vector<float>{3, 3}));
}

// Reshape, transpose, cat and narrow on tensors that require grad, thousands of times: the bytes
// held stay exactly the same (graphs are freed, views share storage).
TEST(ShapeOps, MemoryStaysFlatOverALongLoop) {
  Tensor w = ag::randn({8, 6});
  w.set_requires_grad(true);
  const auto step = [&] {
    const Tensor v = ag::ops::transpose(ag::ops::reshape(w, {4, 12}), 0, 1);
    const Tensor joined = ag::ops::cat({v, ag::ops::narrow(v, 0, 2, 5)}, 0);
    ag::ops::sum(ag::ops::mean(joined, {1}) * 2.0f).backward();
    w.set_grad(Tensor());
  };
  for (int i = 0; i < 100; ++i) step();
  const int64_t early = ag::memory_stats(ag::Device::kCPU).current_bytes;
  for (int i = 0; i < 5000; ++i) step();
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, early);
}

}  // namespace
