// The CUDA backend against the CPU: every op forward and backward in float32 and float16, the
// caching allocator, device transfers, device-mismatch errors, and GradScaler + optimizers.
// Without a GPU (or driver) every case except the availability check skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ampgrad.h"

namespace ag = ampgrad;

namespace {

#define SKIP_WITHOUT_CUDA()                                                                     \
  do {                                                                                          \
    if (!ag::cuda_is_available())                                                               \
      GTEST_SKIP() << "no CUDA device: cuda_is_available() is false (no GPU, no driver, or a "  \
                      "CPU-only build); run tools/gpu_check.sh on a GPU machine";               \
  } while (false)

std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Differences between two backends come from summation order and rounding ties, so the
// tolerance is a few units of the dtype's precision, relative to the reference, plus an absolute floor.
void expect_close(const std::vector<float>& cuda, const std::vector<float>& cpu, ag::DType dtype,
                  const std::string& what) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  const double rtol = dtype == ag::DType::kFloat16 ? 4e-3 : 2e-5;
  const double atol = dtype == ag::DType::kFloat16 ? 4e-3 : 2e-5;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_NEAR(cuda[i], cpu[i], atol + std::abs(cpu[i]) * rtol) << what << " element " << i;
  }
}

struct OpResult {
  std::vector<float> out;
  std::vector<std::vector<float>> grads;
};

using OpFn = std::function<ag::Tensor(const std::vector<ag::Tensor>&)>;

// Builds the inputs on `device` in `dtype`, runs f, backpropagates a fixed random upstream
// gradient and returns the output and every input's gradient as host floats.
OpResult run_op(const OpFn& f, const std::vector<ag::Shape>& shapes, ag::DType dtype, ag::Device device) {
  std::vector<ag::Tensor> inputs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    ag::Tensor t = ag::Tensor::from_vector(random_values(ag::shape_numel(shapes[k]), 100 + k), shapes[k], dtype, device);
    t.set_requires_grad(true);
    inputs.push_back(t);
  }
  ag::Tensor out = f(inputs);
  EXPECT_EQ(out.device(), device);
  const ag::Tensor dout = ag::Tensor::from_vector(random_values(out.numel(), 7), out.shape(), out.dtype(), device);
  out.backward(dout);
  OpResult result{.out = out.to_vector(), .grads = {}};
  for (const ag::Tensor& t : inputs) {
    result.grads.push_back(t.grad().defined() ? t.grad().to_vector() : std::vector<float>{});
  }
  return result;
}

struct OpCase {
  std::string name;
  OpFn f;
  std::vector<ag::Shape> shapes;
};

std::vector<OpCase> op_cases() {
  using V = std::vector<ag::Tensor>;
  return {
      {"linear_bias", [](const V& v) { return ag::ops::linear(v[0], v[1], v[2]); }, {{5, 16}, {7, 16}, {7}}},
      {"linear_nobias", [](const V& v) { return ag::ops::linear(v[0], v[1]); }, {{33, 64}, {9, 64}}},
      {"matmul", [](const V& v) { return ag::ops::matmul(v[0], v[1]); }, {{6, 40}, {40, 3}}},
      {"add", [](const V& v) { return v[0] + v[1]; }, {{4, 37}, {4, 37}}},
      {"sub_row_broadcast", [](const V& v) { return v[0] - v[1]; }, {{5, 6}, {6}}},
      {"mul_scalar_broadcast", [](const V& v) { return v[0] * v[1]; }, {{3, 129}, {1}}},
      {"mul", [](const V& v) { return v[0] * v[1]; }, {{1000}, {1000}}},
      {"scale", [](const V& v) { return v[0] * 2.5f; }, {{17, 3}}},
      {"relu", [](const V& v) { return ag::ops::relu(v[0]); }, {{8, 33}}},
      {"sum", [](const V& v) { return ag::ops::sum(v[0]); }, {{50, 41}}},
      {"mean", [](const V& v) { return ag::ops::mean(v[0]); }, {{3, 1000}}},
      {"mse_loss", [](const V& v) { return ag::ops::mse_loss(v[0], v[1]); }, {{64, 9}, {64, 9}}},
  };
}

class CudaOpTest : public ::testing::TestWithParam<ag::DType> {};

TEST_P(CudaOpTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_CUDA();
  const ag::DType dtype = GetParam();
  for (const OpCase& c : op_cases()) {
    SCOPED_TRACE(c.name);
    const OpResult cpu = run_op(c.f, c.shapes, dtype, ag::Device::kCPU);
    const OpResult gpu = run_op(c.f, c.shapes, dtype, ag::Device::kCUDA);
    expect_close(gpu.out, cpu.out, dtype, c.name + " forward");
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    for (size_t k = 0; k < cpu.grads.size(); ++k) {
      expect_close(gpu.grads[k], cpu.grads[k], dtype, c.name + " grad of input " + std::to_string(k));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOpTest, ::testing::Values(ag::DType::kFloat32, ag::DType::kFloat16),
                         [](const auto& info) { return std::string(ag::dtype_name(info.param)); });

TEST(CudaTest, AvailabilityQueryNeverCrashes) {
  // Runs everywhere: with no driver (error 35) or no device this is false, quietly.
  const bool available = ag::cuda_is_available();
  EXPECT_EQ(available, ag::cuda_is_available());
  if (!available) {
    EXPECT_THROW(ag::ones({2}).to(ag::Device::kCUDA), ag::Error);
  }
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
  for (ag::DType dtype : {ag::DType::kFloat32, ag::DType::kFloat16}) {
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
  ag::Tensor z = ag::zeros({3, 5}, ag::DType::kFloat16, ag::Device::kCUDA);
  EXPECT_EQ(z.to_vector(), std::vector<float>(15, 0.0f));
  EXPECT_EQ(ag::full({4}, 0.1, ag::DType::kFloat32, ag::Device::kCUDA).to_vector(), std::vector<float>(4, 0.1f));
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

// A small FP16 model trained with GradScaler on one device; returns the parameters after each step.
struct TrainTrace {
  std::vector<std::vector<float>> params;
  std::vector<bool> stepped;
  std::vector<float> scales;
};

enum class OptKind { kAdam, kSgd };

TrainTrace train(ag::Device device, OptKind kind, double init_scale) {
  ag::Tensor w = ag::Tensor::from_vector(random_values(4 * 8, 11, -0.5f, 0.5f), {4, 8}, ag::DType::kFloat16, device);
  ag::Tensor b = ag::Tensor::from_vector(random_values(4, 12, -0.5f, 0.5f), {4}, ag::DType::kFloat32, device);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const ag::Tensor x = ag::Tensor::from_vector(random_values(16 * 8, 13), {16, 8}, ag::DType::kFloat16, device);
  const ag::Tensor y = ag::Tensor::from_vector(random_values(16 * 4, 14), {16, 4}, ag::DType::kFloat32, device);
  ag::optim::Adam adam({w, b}, {.lr = 1e-2});
  ag::optim::SGD sgd({w, b}, {.lr = 0.05, .momentum = 0.9});
  ag::optim::Optimizer& opt = kind == OptKind::kAdam ? static_cast<ag::optim::Optimizer&>(adam) : sgd;
  ag::amp::GradScaler scaler({.init_scale = init_scale, .growth_factor = 2, .backoff_factor = 0.5,
                              .growth_interval = 2});
  TrainTrace trace;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    ag::Tensor out = ag::ops::linear(x, w, b.to(ag::DType::kFloat16));
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
  // 1e9: the first FP16 gradients overflow, so the first steps are skipped on both devices.
  for (double init_scale : {1024.0, 1e9}) {
    for (OptKind kind : {OptKind::kAdam, OptKind::kSgd}) {
      SCOPED_TRACE(std::string(kind == OptKind::kAdam ? "Adam" : "SGD") + " init_scale " + std::to_string(init_scale));
      const TrainTrace cpu = train(ag::Device::kCPU, kind, init_scale);
      const TrainTrace gpu = train(ag::Device::kCUDA, kind, init_scale);
      EXPECT_EQ(gpu.stepped, cpu.stepped);
      EXPECT_EQ(gpu.scales, cpu.scales);
      for (size_t s = 0; s < cpu.params.size(); ++s) {
        expect_close(gpu.params[s], cpu.params[s], ag::DType::kFloat16, "parameters after step " + std::to_string(s));
      }
    }
  }
}

TEST(CudaTest, AutocastOnCudaFollowsEachPolicy) {
  SKIP_WITHOUT_CUDA();
  ag::manual_seed(21);
  ag::nn::Sequential model{ag::nn::Linear(8, 16), ag::nn::ReLU(), ag::nn::Linear(16, 1)};
  model.to(ag::Device::kCUDA);
  const ag::Tensor x = ag::randn({32, 8}, ag::DType::kFloat32, ag::Device::kCUDA);
  const ag::Tensor y = ag::randn({32, 1}, ag::DType::kFloat32, ag::Device::kCUDA);
  {
    // A CPU guard leaves CUDA ops alone.
    ag::amp::AutocastGuard cpu_only(ag::Device::kCPU, ag::DType::kFloat16);
    EXPECT_EQ(model(x).dtype(), ag::DType::kFloat32);
  }
  ag::Tensor loss;
  {
    ag::amp::AutocastGuard autocast(ag::Device::kCUDA, ag::DType::kFloat16);
    const ag::Tensor out = model(x);
    EXPECT_EQ(out.dtype(), ag::DType::kFloat16);
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
