// The CUDA backend against the CPU: every row of the shared op-case table forward and backward in
// float32, float16, bfloat16 and float64, the caching allocator, device transfers, pinned memory and
// host-sync counts, device-mismatch errors, and GradScaler + optimizers. (Kernels at scale are in
// cuda_kernels_test.cc.) Without a GPU every case that needs one skips with the reason, or fails
// under AMPGRAD_REQUIRE_CUDA=1. In a CUDA build the binary also holds cuda_runtime_checks.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <tuple>
#include <string>
#include <vector>

#include "ampgrad.h"
#include "cuda_test_util.h"
#include "op_cases.h"
#include "precision_cases.h"
#include "reference.h"
#include "zero_size_cases.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  const std::vector<double> v = agt::random_values(static_cast<size_t>(n), lo, hi, seed);
  return std::vector<float>(v.begin(), v.end());
}

// Differences between two backends come from summation order and rounding ties.
void expect_close(const std::vector<float>& cuda, const std::vector<float>& cpu, ag::DType dtype,
                  const std::string& what) {
  const std::vector<double> a(cuda.begin(), cuda.end()), b(cpu.begin(), cpu.end());
  EXPECT_CLOSE(a, b, dtype, agt::between_results({.k = 4, .magnitude = 2})) << what;
}

// Every row of the shared op-case table on CUDA: the forward against the float64 reference (as the
// CPU is checked in ops_test.cc) and every input's gradient against the CPU's.
class CudaOpTest : public ::testing::TestWithParam<std::tuple<agt::OpCase, ag::DType>> {};

TEST_P(CudaOpTest, MatchesReferenceAndCpu) {
  SKIP_WITHOUT_CUDA();
  const auto& [op, dtype] = GetParam();
  std::vector<agt::Values> values;
  for (const ag::Tensor& t : agt::make_inputs(op, dtype)) values.push_back(t.to_double_vector());
  const ag::Tensor out = op.fn(agt::make_inputs(op, dtype, ag::Device::kCUDA));
  EXPECT_EQ(out.device(), ag::Device::kCUDA);
  EXPECT_CLOSE(out, op.reference(values), dtype, op.tol) << "forward";

  const std::vector<ag::Tensor> inputs = agt::make_inputs(op, ag::DType::kFloat64);
  const agt::Evaluated cpu = agt::evaluate(op.fn, inputs, dtype, ag::Device::kCPU);
  const agt::Evaluated gpu = agt::evaluate(op.fn, inputs, dtype, ag::Device::kCUDA);
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    EXPECT_CLOSE(gpu.grads[i], cpu.grads[i], dtype, agt::between_results(op.tol)) << "gradient of input " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOpTest,
                         ::testing::Combine(::testing::ValuesIn(agt::op_cases()),
                                            ::testing::ValuesIn(ag::kFloatingDTypes)),
                         agt::row_and_dtype_name);

TEST(CudaTest, CrossEntropyAtLargeLogitOffsetsKeepsFloat32Precision) {
  SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(agt::check_cross_entropy_at_large_offsets(ag::Device::kCUDA));
  EXPECT_TRUE(agt::check_cross_entropy_at_large_offsets(ag::Device::kCUDA, ag::DType::kFloat64));
}

TEST(CudaTest, CrossEntropyReadsSixteenBitLogitsInPlaceUnderAutocast) {
  SKIP_WITHOUT_CUDA();
  for (ag::DType low : ag::kLowPrecisionDTypes) {
    EXPECT_TRUE(agt::check_cross_entropy_reads_16bit_logits_in_place(ag::Device::kCUDA, low)) << ag::dtype_name(low);
  }
}

// The zero-size rows (tests/zero_size_cases.cc) on CUDA.
class CudaZeroSizeTest : public ::testing::TestWithParam<std::tuple<agt::ZeroSizeCase, ag::DType>> {};

TEST_P(CudaZeroSizeTest, GivesPyTorchsShapeAndEmptyOrZeroGradients) {
  SKIP_WITHOUT_CUDA();
  const auto& [c, dtype] = GetParam();
  EXPECT_TRUE(agt::check_zero_size_case(c, dtype, ag::Device::kCUDA));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaZeroSizeTest,
                         ::testing::Combine(::testing::ValuesIn(agt::zero_size_cases()),
                                            ::testing::ValuesIn(ag::kFloatingDTypes)),
                         agt::row_and_dtype_name);

TEST(CudaTest, AvailabilityQueryNeverCrashes) {
  // Runs everywhere: with no driver (error 35) or no device this is false, quietly, with a reason.
  const bool available = ag::cuda_is_available();
  EXPECT_EQ(available, ag::cuda_is_available());
  EXPECT_EQ(ag::cuda::unavailable_reason().empty(), available) << ag::cuda::unavailable_reason();
  if (!available) {
    EXPECT_THROW(ag::ones({2}).to(ag::Device::kCUDA), ag::Error);
    EXPECT_ERROR([] { (void)ag::ones({2}).pin_memory(); }, "pin_memory");
  }
}

// The line tests/cuda_packaging_test.sh reads; under AMPGRAD_REQUIRE_CUDA=1 a missing GPU fails.
TEST(CudaTest, RequiredGpuIsPresent) {
  std::cout << "cuda_is_available: " << ag::cuda_is_available() << " (" << ag::cuda::unavailable_reason() << ")\n";
  SKIP_WITHOUT_CUDA();
  EXPECT_GT(ag::device_count(ag::Device::kCUDA), 0);
}


// cuda::set_allow_tf32 (PyTorch's allow_tf32): off, a float32 GEMM matches the float64 reference to
// float32 precision; on, its inputs are rounded to TF32's 10 mantissa bits, so it misses that
// bound yet stays within TF32's (eps 2^-10, as float16's).
TEST(CudaTest, Tf32SwitchChangesFloat32GemmPrecision) {
  SKIP_WITHOUT_CUDA();
  const int64_t m = 64, k = 512, n = 48;
  const std::vector<double> a = agt::random_values(m * k, -1.0, 1.0, 41), b = agt::random_values(k * n, -1.0, 1.0, 42);
  const std::vector<double> expected = agt::matmul_ref(a, b, m, k, n);
  const ag::Tensor ga = ag::Tensor::from_vector(a, {m, k}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor gb = ag::Tensor::from_vector(b, {k, n}, ag::DType::kFloat32, ag::Device::kCUDA);
  const agt::Tol tol{.k = k, .magnitude = 1};
  EXPECT_CLOSE(ag::ops::matmul(ga, gb), expected, ag::DType::kFloat32, tol) << "TF32 off";
  ag::cuda::set_allow_tf32(true);
  const ag::Tensor tf32 = ag::ops::matmul(ga, gb);
  ag::cuda::set_allow_tf32(false);
  EXPECT_FALSE(agt::all_close(tf32.to_double_vector(), expected, ag::DType::kFloat32, tol)) << "TF32 on had no effect";
  EXPECT_CLOSE(tf32, expected, ag::DType::kFloat16, tol) << "TF32 on";
}

TEST(CudaTest, AllocatorReusesFreedBlocks) {
  SKIP_WITHOUT_CUDA();
  const ag::MemoryStats before = ag::memory_stats(ag::Device::kCUDA);
  int64_t reserved_after_first = 0;
  {
    ag::Tensor t = ag::Tensor::empty({1 << 18}, ag::DType::kFloat32, ag::Device::kCUDA);  // 1 MiB
    const ag::MemoryStats s = ag::memory_stats(ag::Device::kCUDA);
    EXPECT_EQ(s.current_bytes, before.current_bytes + (1 << 20));
    EXPECT_GE(s.peak_bytes, s.current_bytes);
    EXPECT_GE(s.reserved_bytes, s.current_bytes);
    reserved_after_first = s.reserved_bytes;
  }
  EXPECT_EQ(ag::memory_stats(ag::Device::kCUDA).current_bytes, before.current_bytes);
  for (int i = 0; i < 5; ++i) {
    ag::Tensor t = ag::Tensor::empty({1 << 18}, ag::DType::kFloat32, ag::Device::kCUDA);
    EXPECT_EQ(ag::memory_stats(ag::Device::kCUDA).reserved_bytes, reserved_after_first) << "iteration " << i;
  }
  EXPECT_GE(ag::memory_stats(ag::Device::kCUDA).peak_bytes, before.current_bytes + (1 << 20));
}

TEST(CudaTest, ToDeviceRoundTripAndConversions) {
  SKIP_WITHOUT_CUDA();
  const std::vector<float> values = random_values(1001, 3, -70000.0f, 70000.0f);
  for (ag::DType dtype : {ag::DType::kFloat32, ag::DType::kFloat16, ag::DType::kBFloat16}) {
    const ag::Tensor cpu = ag::Tensor::from_vector(values, {7, 143}, dtype);
    const ag::Tensor gpu = cpu.to(ag::Device::kCUDA);
    EXPECT_EQ(gpu.device(), ag::Device::kCUDA);
    EXPECT_EQ(gpu.shape(), cpu.shape());
    EXPECT_EQ(gpu.to(ag::Device::kCPU).to_vector(), cpu.to_vector());  // bit-exact both ways
  }
  // A dtype change on the device rounds exactly as the CPU does (including overflow to inf).
  const ag::Tensor f32 = ag::Tensor::from_vector(values, {1001});
  const std::vector<float> cpu_half = f32.to(ag::DType::kFloat16).to_vector();
  const std::vector<float> gpu_half = f32.to(ag::Device::kCUDA).to(ag::DType::kFloat16).to_vector();
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(cpu_half[i] == gpu_half[i] || (std::isnan(cpu_half[i]) && std::isnan(gpu_half[i]))) << i;
  }
  // Filling and accumulation on the device.
  EXPECT_EQ(ag::full({2}, 1.0 + 0x1p-8 + 0x1p-40, ag::DType::kBFloat16, ag::Device::kCUDA).to_vector(),
            std::vector<float>(2, 1.0f + 0x1p-7f));  // rounded once from double, as on the CPU
  ag::Tensor z = ag::zeros({3, 5}, ag::DType::kFloat16, ag::Device::kCUDA);
  EXPECT_EQ(z.to_vector(), std::vector<float>(15, 0.0f));
  EXPECT_EQ(ag::full({4}, 0.1, ag::DType::kFloat32, ag::Device::kCUDA).to_vector(), std::vector<float>(4, 0.1f));
}

// bfloat16 conversions on the device give the CPU's bits exactly: every rounding midpoint and its
// neighbours, subnormals, NaNs (sign and payload) and overflow, from float, double and int64.
TEST(CudaTest, BFloat16ConversionsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  std::vector<float> floats;
  for (uint32_t b = 0; b < 0x10000u; b += 7) {
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0x0001u}) {
      uint32_t u = (b << 16) | low;
      float f;
      std::memcpy(&f, &u, sizeof f);
      floats.push_back(f);
    }
  }
  // The same conversion on the GPU and on the CPU, compared byte for byte.
  const auto expect_same = [](const ag::Tensor& from, ag::DType to, const char* what) {
    EXPECT_EQ(agt::bytes_of(from.to(ag::Device::kCUDA).to(to)), agt::bytes_of(from.to(to))) << what;
  };
  const ag::Tensor f32 = ag::Tensor::from_vector(floats, {static_cast<int64_t>(floats.size())});
  expect_same(f32, ag::DType::kBFloat16, "float32 -> bfloat16");
  expect_same(f32.to(ag::DType::kFloat64) * 1.0000001f, ag::DType::kBFloat16, "float64 -> bfloat16");
  const ag::Tensor i64 = ag::Tensor::from_vector(
      std::vector<int64_t>{(int64_t{1} << 60) + (int64_t{1} << 52) + 1, -3, 257, INT64_MIN, 0}, {5});
  expect_same(i64, ag::DType::kBFloat16, "int64 -> bfloat16");
  const ag::Tensor bf16 = f32.to(ag::DType::kBFloat16);
  expect_same(bf16, ag::DType::kFloat32, "bfloat16 -> float32");
  expect_same(bf16, ag::DType::kFloat16, "bfloat16 -> float16");
  expect_same(bf16, ag::DType::kInt64, "bfloat16 -> int64");
}

// Every copy that makes the host wait is counted: device-to-host reads, and host-to-device copies
// (cudaMemcpy from pageable memory first waits for all queued work), but not a non-blocking copy
// from pinned memory, which is queued and returns.
TEST(CudaTest, HostSyncsAreCountedAndPinnedCopiesDoNotWait) {
  SKIP_WITHOUT_CUDA();
  const std::vector<float> values = random_values(1 << 20, 5);
  const ag::Tensor pageable = ag::Tensor::from_vector(values, {1 << 20});
  int64_t before = ag::cuda_host_sync_count();
  ag::Tensor a = pageable.to(ag::Device::kCUDA);
  EXPECT_EQ(ag::cuda_host_sync_count() - before, 1) << "pageable host-to-device copy";
  before = ag::cuda_host_sync_count();
  (void)pageable.to(ag::Device::kCUDA, ag::NonBlocking::kYes);  // pageable: waits anyway
  EXPECT_EQ(ag::cuda_host_sync_count() - before, 1) << "non-blocking copy from pageable memory";

  const ag::Tensor pinned = pageable.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(pageable.is_pinned());
  EXPECT_TRUE(pinned.pin_memory().is_same(pinned));
  EXPECT_EQ(pinned.to_vector(), values);
  before = ag::cuda_host_sync_count();
  ag::Tensor b = pinned.to(ag::Device::kCUDA, ag::NonBlocking::kYes);
  ag::Tensor c = pinned.to(ag::DType::kFloat16).to(ag::Device::kCUDA);  // a CPU cast, then a waiting copy
  EXPECT_EQ(ag::cuda_host_sync_count() - before, 1) << "only the blocking copy waits";
  before = ag::cuda_host_sync_count();
  EXPECT_EQ(b.to_vector(), values);  // the read waits (and is ordered after the copy)
  EXPECT_EQ(ag::cuda_host_sync_count() - before, 1) << "device-to-host read";
  EXPECT_EQ(a.to_vector(), values);
  EXPECT_ERROR([&] { (void)b.pin_memory(); }, "pin_memory", "not on the CPU");
}

// A pinned block freed while its asynchronous copy may still be queued is not handed out again
// before the copy is done: each device tensor keeps the batch it was copied from.
TEST(CudaTest, PinnedBatchesCopiedAsynchronouslyKeepTheirValues) {
  SKIP_WITHOUT_CUDA();
  constexpr int kBatches = 16;
  constexpr int64_t kN = 1 << 22;  // 16 MiB per batch: copies long enough to overlap the next fill
  std::vector<ag::Tensor> on_device;
  for (int i = 0; i < kBatches; ++i) {
    ag::Tensor host = ag::full({kN}, static_cast<double>(i)).pin_memory();
    on_device.push_back(host.to(ag::Device::kCUDA, ag::NonBlocking::kYes));
  }  // each pinned batch is freed right after its copy is queued
  for (int i = 0; i < kBatches; ++i) {
    const std::vector<float> v = on_device[static_cast<size_t>(i)].to_vector();
    ASSERT_EQ(std::count(v.begin(), v.end(), static_cast<float>(i)), kN) << "batch " << i;
  }
}

TEST(CudaTest, DeviceMismatchIsAClearError) {
  SKIP_WITHOUT_CUDA();
  const ag::Tensor a = ag::ones({2, 3});
  const ag::Tensor b = ag::ones({2, 3}, ag::DType::kFloat32, ag::Device::kCUDA);
  try {
    (void)(a + b);
    FAIL() << "adding a CPU and a CUDA tensor must throw";
  } catch (const ag::Error& e) {
    EXPECT_NE(std::string(e.what()).find("different devices"), std::string::npos) << e.what();
  }
}

// A small model with `low` weights (float16 or bfloat16) trained with GradScaler on one device;
// returns the parameters after each step.
struct TrainTrace {
  std::vector<std::vector<float>> params;
  std::vector<bool> stepped;
  std::vector<float> scales;
};

enum class OptKind { kAdam, kSgd };

TrainTrace train(ag::Device device, OptKind kind, double init_scale, ag::DType low) {
  ag::Tensor w = ag::Tensor::from_vector(random_values(4 * 8, 11, -0.5f, 0.5f), {4, 8}, low, device);
  ag::Tensor b = ag::Tensor::from_vector(random_values(4, 12, -0.5f, 0.5f), {4}, ag::DType::kFloat32, device);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const ag::Tensor x = ag::Tensor::from_vector(random_values(16 * 8, 13), {16, 8}, low, device);
  const ag::Tensor y = ag::Tensor::from_vector(random_values(16 * 4, 14), {16, 4}, ag::DType::kFloat32, device);
  ag::optim::Adam adam({w, b}, {.lr = 1e-2});
  ag::optim::SGD sgd({w, b}, {.lr = 0.05, .momentum = 0.9});
  ag::optim::Optimizer& opt = kind == OptKind::kAdam ? static_cast<ag::optim::Optimizer&>(adam) : sgd;
  ag::amp::GradScaler scaler({.init_scale = init_scale, .growth_factor = 2, .backoff_factor = 0.5,
                              .growth_interval = 2});
  TrainTrace trace;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    ag::Tensor out = ag::ops::linear(x, w, b.to(low));
    ag::Tensor loss = ag::ops::mse_loss(out.to(ag::DType::kFloat32), y);
    scaler.scale(loss).backward();
    trace.stepped.push_back(scaler.step(opt));
    scaler.update();
    trace.scales.push_back(static_cast<float>(scaler.get_scale()));
    std::vector<float> p = w.to_vector();
    const std::vector<float> pb = b.to_vector();
    p.insert(p.end(), pb.begin(), pb.end());
    trace.params.push_back(p);
  }
  return trace;
}

TEST(CudaTest, GradScalerWithOptimizersMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  // 1e9: the first FP16 gradients overflow, so the first steps are skipped on both devices
  // (bfloat16's range takes it without a skip).
  for (ag::DType low : {ag::DType::kFloat16, ag::DType::kBFloat16}) {
    for (double init_scale : {1024.0, 1e9}) {
      for (OptKind kind : {OptKind::kAdam, OptKind::kSgd}) {
        SCOPED_TRACE(std::string(kind == OptKind::kAdam ? "Adam" : "SGD") + " init_scale " +
                     std::to_string(init_scale) + " " + std::string(ag::dtype_name(low)));
        const TrainTrace cpu = train(ag::Device::kCPU, kind, init_scale, low);
        const TrainTrace gpu = train(ag::Device::kCUDA, kind, init_scale, low);
        EXPECT_EQ(gpu.stepped, cpu.stepped);
        EXPECT_EQ(gpu.scales, cpu.scales);
        for (size_t s = 0; s < cpu.params.size(); ++s) {
          expect_close(gpu.params[s], cpu.params[s], low, "parameters after step " + std::to_string(s));
        }
      }
    }
  }
}

// The AMP step's one host sync: GradScaler::step reading the found-inf flag (it returns a bool).
TEST(CudaTest, AmpTrainingStepWaitsForTheGpuOnce) {
  SKIP_WITHOUT_CUDA();
  ag::manual_seed(24);
  ag::nn::Sequential model{ag::nn::Linear(64, 128), ag::nn::ReLU(), ag::nn::Linear(128, 8)};
  model.to(ag::Device::kCUDA);
  const ag::Tensor x = ag::randn({32, 64}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor y = ag::randn({32, 8}, ag::DType::kFloat32, ag::Device::kCUDA);
  ag::optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  ag::amp::GradScaler scaler({.init_scale = 1024});
  for (int step = 0; step < 3; ++step) {
    const int64_t before = ag::cuda_host_sync_count();
    opt.zero_grad();
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCUDA, ag::DType::kFloat16);
      loss = ag::ops::mse_loss(model(x), y);
    }
    scaler.scale(loss).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(ag::cuda_host_sync_count() - before, 1) << "step " << step;
  }
}

TEST(CudaTest, AutocastOnCudaFollowsEachPolicy) {
  SKIP_WITHOUT_CUDA();
  for (ag::DType low : ag::kLowPrecisionDTypes) {
    SCOPED_TRACE(std::string(ag::dtype_name(low)));
    ag::manual_seed(21);
    ag::nn::Sequential model{ag::nn::Linear(8, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1)};
    model.to(ag::Device::kCUDA);
    const ag::Tensor x = ag::randn({32, 8}, ag::DType::kFloat32, ag::Device::kCUDA);
    const ag::Tensor y = ag::randn({32, 1}, ag::DType::kFloat32, ag::Device::kCUDA);
    {
      // A CPU guard leaves CUDA ops alone.
      ag::amp::AutocastGuard cpu_only(ag::Device::kCPU, low);
      EXPECT_EQ(model(x).dtype(), ag::DType::kFloat32);
    }
    ag::Tensor loss;
    {
      ag::amp::AutocastGuard autocast(ag::Device::kCUDA, low);
      const ag::Tensor out = model(x);
      EXPECT_EQ(out.dtype(), low);
      EXPECT_EQ(out.device(), ag::Device::kCUDA);
      loss = ag::ops::mse_loss(out, y);
      EXPECT_EQ(loss.dtype(), ag::DType::kFloat32);
      EXPECT_EQ(ag::ops::sum(out).dtype(), ag::DType::kFloat32);
      EXPECT_EQ((out + y).dtype(), ag::DType::kFloat32);
    }
    loss.backward();
    for (const ag::Tensor& p : model.parameters()) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().dtype(), ag::DType::kFloat32);  // FP32 parameters get FP32 gradients
      EXPECT_EQ(p.grad().device(), ag::Device::kCUDA);
    }
  }
}

TEST(CudaTest, ModuleToCudaKeepsHandlesAndValues) {
  SKIP_WITHOUT_CUDA();
  ag::manual_seed(22);
  ag::nn::Sequential model{ag::nn::Linear(3, 4), ag::nn::ReLU(), ag::nn::Linear(4, 2)};
  const std::vector<ag::Tensor> before = model.parameters();
  std::vector<std::vector<float>> values;
  for (const ag::Tensor& p : before) values.push_back(p.to_vector());
  model.to(ag::Device::kCUDA).to(ag::DType::kFloat16);
  const std::vector<ag::Tensor> after = model.parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(after[i].is_same(before[i]));
    EXPECT_EQ(after[i].device(), ag::Device::kCUDA);
    expect_close(after[i].to_vector(), values[i], ag::DType::kFloat16, "parameter " + std::to_string(i));
  }
}

TEST(CudaTest, CheckpointOfACudaModelRoundTrips) {
  SKIP_WITHOUT_CUDA();
  ag::manual_seed(23);
  ag::nn::Linear a(5, 3), b(5, 3);
  a.to(ag::Device::kCUDA);
  b.to(ag::Device::kCUDA);
  const std::string path = ::testing::TempDir() + "/cuda_model.safetensors";
  ag::checkpoint::save_model(path, a);
  ag::checkpoint::load_model(path, b);
  EXPECT_EQ(b.weight.device(), ag::Device::kCUDA);
  EXPECT_EQ(b.weight.to_vector(), a.weight.to_vector());
  EXPECT_EQ(b.bias.to_vector(), a.bias.to_vector());
}

}  // namespace
