// Tensor basics: factories and shapes, seeding, storage alignment, dtype conversion, handle
// semantics (copies and detach), and the errors users get for bad shapes, tensors and devices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "framework/allocator.h"
#include "framework/autograd.h"
#include "framework/device.h"
#include "framework/dtype.h"
#include "framework/error.h"
#include "framework/parallel.h"
#include "framework/random.h"
#include "framework/tensor.h"
#include "framework/tensor_impl.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ag = ampgrad;
using ag::Device;
using ag::DType;
using ag::Shape;
using ag::Tensor;
using ag::test::throws_error;

namespace {

constexpr DType kAllDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kFloat64};

TEST(Tensor, FromVectorKeepsValuesShapeAndDtype) {
  const Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.device(), Device::kCPU);
  EXPECT_FALSE(t.requires_grad());
  EXPECT_TRUE(t.is_leaf());
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.to_string(), "Tensor[2, 3] float32 cpu");

  const Tensor d = Tensor::from_vector(std::vector<double>{0.1, -2.5}, {2});
  EXPECT_EQ(d.dtype(), DType::kFloat64);
  EXPECT_EQ(d.to_double_vector(), (std::vector<double>{0.1, -2.5}));
  const Tensor h = Tensor::from_vector(std::vector<double>{0.1, -2.5}, {2}, DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.to_double_vector(), (std::vector<double>{0.0999755859375, -2.5}));  // 0.1 rounded to half
}

TEST(Tensor, FactoriesForRanksZeroToFour) {
  for (const Shape& shape : {Shape{}, Shape{3}, Shape{2, 3}, Shape{2, 1, 3}, Shape{2, 3, 1, 2}, Shape{0}, Shape{2, 0, 3}}) {
    for (DType dtype : kAllDtypes) {
      SCOPED_TRACE(ag::shape_to_string(shape) + " " + std::string(ag::dtype_name(dtype)));
      const int64_t n = ag::shape_numel(shape);
      const Tensor z = ag::zeros(shape, dtype), o = ag::ones(shape, dtype), f = ag::full(shape, -0.1, dtype);
      for (const Tensor& t : {z, o, f}) {
        EXPECT_EQ(t.shape(), shape);
        EXPECT_EQ(t.numel(), n);
        EXPECT_EQ(t.dim(), static_cast<int64_t>(shape.size()));
        EXPECT_EQ(t.dtype(), dtype);
      }
      EXPECT_EQ(z.to_double_vector(), std::vector<double>(n, 0.0));
      EXPECT_EQ(o.to_double_vector(), std::vector<double>(n, 1.0));
      // -0.1 rounded once to the dtype.
      const double rounded = Tensor::from_vector(std::vector<double>{-0.1}, {1}, dtype).to_double_vector()[0];
      EXPECT_EQ(f.to_double_vector(), std::vector<double>(n, rounded));
      EXPECT_EQ(ag::randn(shape, dtype).numel(), n);
      EXPECT_EQ(ag::uniform(shape, -1, 1, dtype).numel(), n);
    }
  }
  EXPECT_EQ(ag::zeros({}).numel(), 1);  // rank 0 holds one element
}

TEST(Tensor, ManualSeedMakesSamplingReproducible) {
  ag::manual_seed(42);
  const Tensor a = ag::randn({1001});
  const Tensor u = ag::uniform({33}, -2, 3);
  ag::manual_seed(42);
  const Tensor b = ag::randn({1001});
  const Tensor v = ag::uniform({33}, -2, 3);
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), 1001 * sizeof(float)), 0);
  EXPECT_EQ(u.to_vector(), v.to_vector());
  const Tensor c = ag::randn({1001});
  EXPECT_NE(a.to_vector(), c.to_vector());  // the generator moves on
  ag::manual_seed(43);
  EXPECT_NE(a.to_vector(), ag::randn({1001}).to_vector());
  // Samples are drawn in double, then rounded once: a seed gives the same values in every dtype.
  ag::manual_seed(42);
  const Tensor d = ag::randn({1001}, DType::kFloat64);
  ag::manual_seed(42);
  const Tensor h = ag::randn({1001}, DType::kFloat16);
  EXPECT_EQ(d.to(DType::kFloat32).to_vector(), a.to_vector());
  EXPECT_EQ(d.to(DType::kFloat16).to_vector(), h.to_vector());
}

TEST(Tensor, RandnAndUniformHaveTheRightDistribution) {
  ag::manual_seed(7);
  const std::vector<double> n = ag::randn({100000}, DType::kFloat64).to_double_vector();
  double mean = 0, var = 0;
  for (double v : n) mean += v / n.size();
  for (double v : n) var += (v - mean) * (v - mean) / n.size();
  EXPECT_NEAR(mean, 0.0, 0.015);  // 5 standard errors of the mean
  EXPECT_NEAR(var, 1.0, 0.025);
  const std::vector<double> u = ag::uniform({100000}, -3, 5, DType::kFloat64).to_double_vector();
  double umean = 0;
  for (double v : u) {
    ASSERT_GE(v, -3.0);
    ASSERT_LT(v, 5.0);
    umean += v / u.size();
  }
  EXPECT_NEAR(umean, 1.0, 0.04);  // sd of the mean: 8 / sqrt(12 * 1e5) = 0.0073
}

TEST(Tensor, AnAliasSharesItsBasesElementsAndKeepsThemAlive) {
  Tensor part;
  const int64_t held = ag::memory_stats(ag::Device::kCPU).current_bytes;
  {
    Tensor base = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {6});
    const int64_t with_base = ag::memory_stats(ag::Device::kCPU).current_bytes;
    part = ag::alias_elements(base, 2, {2, 1});
    EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, with_base);  // no allocation
    EXPECT_EQ(part.to_vector(), (std::vector<float>{2, 3}));
    EXPECT_EQ(part.shape(), (ag::Shape{2, 1}));
    static_cast<float*>(part.data_ptr())[1] = 30;  // writes through either are seen by the other
    EXPECT_EQ(base.to_vector(), (std::vector<float>{0, 1, 2, 30, 4, 5}));
    EXPECT_TRUE(ag::is_alias_at(part, base, 2));
    EXPECT_FALSE(ag::is_alias_at(part, base, 1));
    EXPECT_FALSE(ag::is_alias_at(Tensor::from_vector(std::vector<float>{2, 30}, {2}), base, 2));
    EXPECT_EQ(&ag::allocation_of(part), &ag::allocation_of(base));
    EXPECT_EQ(ag::allocation_of(part).nbytes, 6 * sizeof(float));
    const Tensor inner = ag::alias_elements(part, 1, {1});  // an alias of an alias lies in the base
    EXPECT_EQ(&ag::allocation_of(inner), &ag::allocation_of(base));
    EXPECT_TRUE(ag::is_alias_at(inner, base, 3));
    const uint64_t base_version = base.version();
    part.bump_version();
    EXPECT_EQ(base.version(), base_version);  // an alias counts its own writes
    EXPECT_ERROR([&] { ag::alias_elements(base, 5, {2}); }, "alias_elements", "out of range");
    EXPECT_ERROR([&] { ag::alias_elements(base, -1, {1}); }, "out of range");
    EXPECT_ERROR([&] { ag::alias_elements(Tensor(), 0, {1}); }, "alias_elements", "undefined");
  }
  EXPECT_EQ(part.to_vector(), (std::vector<float>{2, 30}));  // the base's bytes live on in the alias
  part = Tensor();
  EXPECT_EQ(ag::memory_stats(ag::Device::kCPU).current_bytes, held);  // and are freed with it
}

TEST(Tensor, CpuStorageIsAligned) {
  std::vector<Tensor> keep;
  for (int64_t n : {0, 1, 3, 17, 64, 1000, 4099}) {
    for (DType dtype : kAllDtypes) {
      keep.push_back(Tensor::empty({n}, dtype));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(keep.back().data_ptr()) % ag::kCpuAlignment, 0u) << n;
    }
  }
  EXPECT_EQ(ag::kCpuAlignment, 64u);
}

TEST(Tensor, ToDtypeConvertsAndRoundTrips) {
  const std::vector<float> values{0.1f, -1.5f, 65504.f, 1e5f, 6e-8f, 3.0f};
  const Tensor t = Tensor::from_vector(values, {2, 3});
  EXPECT_TRUE(t.to(DType::kFloat32).is_same(t));  // no change: the same tensor, as in PyTorch
  const Tensor h = t.to(DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.shape(), t.shape());
  const std::vector<float> hv = h.to_vector();
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(hv[i], ag::half_to_float(ag::float_to_half(values[i]))) << i;
  EXPECT_TRUE(std::isinf(hv[3]));
  EXPECT_EQ(hv[4], 0x1p-24f);
  // float32 -> float64 -> float32 is exact; float16 -> float32 -> float16 is exact.
  EXPECT_EQ(t.to(DType::kFloat64).to(DType::kFloat32).to_vector(), values);
  EXPECT_EQ(t.to(DType::kFloat64).to_double_vector()[0], static_cast<double>(0.1f));
  EXPECT_EQ(h.to(DType::kFloat32).to(DType::kFloat16).to_vector(), hv);
  EXPECT_EQ(h.to(DType::kFloat64).to(DType::kFloat16).to_vector(), hv);
  EXPECT_TRUE(t.to(Device::kCPU).is_same(t));
}

TEST(Tensor, ItemNeedsOneElement) {
  EXPECT_EQ(ag::full({}, 2.5).item(), 2.5f);
  EXPECT_EQ(ag::full({1, 1}, -3, DType::kFloat16).item(), -3.0f);
  EXPECT_EQ(ag::full({1}, 0.25, DType::kFloat64).item(), 0.25f);
  EXPECT_TRUE(throws_error([] { (void)ag::zeros({2}).item(); }, {"item()", "[2]"}));
  EXPECT_TRUE(throws_error([] { (void)ag::zeros({0}).item(); }, {"item()", "[0]"}));
}

TEST(Tensor, CopiesShareIdentityAndDetachSharesOnlyStorage) {
  Tensor a = ag::zeros({3});
  Tensor b = a;  // a handle copy: same tensor
  EXPECT_TRUE(b.is_same(a));
  b.set_requires_grad(true);
  EXPECT_TRUE(a.requires_grad());
  b.set_grad(ag::ones({3}));
  EXPECT_TRUE(a.grad().defined());

  const Tensor d = a.detach();
  EXPECT_FALSE(d.is_same(a));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_FALSE(d.grad().defined());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.data_ptr(), a.data_ptr());  // same storage: writes show through
  Tensor writer = d;
  writer.data<float>()[1] = 7.0f;
  writer.bump_version();
  EXPECT_EQ(a.to_vector()[1], 7.0f);
  EXPECT_EQ(a.version(), d.version());  // one storage, one version counter
}

TEST(Tensor, WrongElementCountNamesTheShape) {
  EXPECT_TRUE(throws_error([] { Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5}, {2, 3}); },
                           {"from_vector", "5 values", "[2, 3]", "6 elements"}));
  EXPECT_NO_THROW(Tensor::from_vector(std::vector<double>{1}, {}, DType::kFloat16));  // 0-dim: exactly one value
  EXPECT_TRUE(throws_error([] { Tensor::from_vector(std::vector<double>{}, {}); }, {"0 values", "[]"}));
}

TEST(Tensor, BadShapesThrow) {
  EXPECT_TRUE(throws_error([] { ag::zeros({2, -1}); }, {"[2, -1]", "negative"}));
  EXPECT_TRUE(throws_error([] { Tensor::empty({-3}); }, {"[-3]", "negative"}));
  const int64_t big = int64_t{1} << 40;
  EXPECT_TRUE(throws_error([&] { ag::zeros({big, big}); }, {"[1099511627776, 1099511627776]", "too many elements"}));
#if !defined(__SANITIZE_ADDRESS__)  // ASan aborts on such a request instead of returning null
  // Addressable but far beyond any machine's memory: the allocator says so instead of crashing.
  EXPECT_TRUE(throws_error([] { Tensor::empty({int64_t{1} << 59}, DType::kFloat64); }, {"out of CPU memory"}));
#endif
  EXPECT_TRUE(throws_error([] { (void)ag::zeros({2, 3}).size(2); }, {"size(2)", "[2, 3]"}));
}

TEST(Tensor, UndefinedTensorsThrowClearly) {
  const Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_EQ(u.to_string(), "Tensor(undefined)");
  EXPECT_TRUE(throws_error([&] { (void)u.shape(); }, {"undefined"}));
  EXPECT_TRUE(throws_error([&] { (void)u.numel(); }, {"undefined"}));
  EXPECT_TRUE(throws_error([&] { (void)u.to_vector(); }, {"undefined"}));
  EXPECT_TRUE(throws_error([&] { (void)u.to(DType::kFloat16); }, {"undefined"}));
  EXPECT_TRUE(throws_error([&] { u.backward(); }, {"undefined"}));
  EXPECT_TRUE(throws_error([&] { (void)ag::ops::relu(u); }, {"relu", "undefined"}));
  EXPECT_TRUE(throws_error([&] { (void)(u + ag::ones({2})); }, {"add", "undefined"}));
}

TEST(Tensor, CudaWithoutCudaIsAClearError) {
  if (ag::cuda_is_available()) GTEST_SKIP() << "a GPU is present; this checks the CPU-only build";
  EXPECT_TRUE(throws_error([] { ag::zeros({2}, DType::kFloat32, Device::kCUDA); }, {"CUDA"}));
  EXPECT_TRUE(throws_error([] { ag::randn({2}, DType::kFloat16, Device::kCUDA); }, {"CUDA"}));
  EXPECT_TRUE(throws_error([] { Tensor::from_vector(std::vector<float>{1}, {1}, DType::kFloat32, Device::kCUDA); },
                           {"CUDA"}));
  EXPECT_TRUE(throws_error([] { (void)ag::ones({2}).to(Device::kCUDA); }, {"CUDA"}));
}

}  // namespace
