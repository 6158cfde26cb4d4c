// CUDA kernels at the sizes and shapes that exercise their edges, against the CPU: vector tails,
// grid-stride loops past the grid cap, k == 0 GEMMs, reductions over many chunks, the one-launch
// multi-tensor passes (unscale, its measuring twin, sum of squares, clip_grad_norm_, one optimizer
// pass over parameters of several groups and dtypes), every optimizer variant, conv2d's moves, the fused
// attention on tensor cores, and the FP8 linear (its casts, the fused cast and transpose, its
// cuBLASLt GEMMs, its fallback). Skips without a GPU (fails under AMPGRAD_REQUIRE_CUDA=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "amp/diagnostics/grad_stats.h"
#include "amp/unscale.h"
#include "ampgrad.h"
#include "attention_cases.h"
#include "cuda_test_util.h"
#include "framework/copy.h"
#include "framework/multi_tensor.h"
#include "nn/utils.h"
#include "ops/conv/conv_index.h"
#include "ops/conv/conv_kernels.h"
#include "ops/linear/linear_float8_kernels.h"
#include "ops/reduce/reduce_kernels.h"
#include "optim_test_util.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
using ag::Device;
using ag::DType;
using ag::Tensor;

namespace {

Tensor random_tensor(const ag::Shape& shape, DType dtype, uint64_t seed, Device device = Device::kCPU) {
  return Tensor::from_vector(agt::random_values(static_cast<size_t>(ag::shape_numel(shape)), -2.0, 2.0, seed), shape,
                             dtype, device);
}

// Element-wise kernels round one float (double for float64) result per element, as the CPU does:
// equal bits, whatever the size (the 16-byte vector path plus a scalar tail) or broadcast.
TEST(CudaKernels, ElementwiseTailsAndBroadcastsMatchCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : ag::kFloatingDTypes) {
    for (int64_t n : {1, 2, 3, 5, 7, 9, 15, 17, 1023, 4097, 65537}) {
      SCOPED_TRACE(std::string(ag::dtype_name(dtype)) + " n = " + std::to_string(n));
      const Tensor a = random_tensor({n}, dtype, 1), b = random_tensor({n}, dtype, 2);
      const Tensor ga = a.to(Device::kCUDA), gb = b.to(Device::kCUDA);
      EXPECT_EQ((ga + gb).to_double_vector(), (a + b).to_double_vector());
      EXPECT_EQ((ga - gb).to_double_vector(), (a - b).to_double_vector());
      EXPECT_EQ((ga * gb).to_double_vector(), (a * b).to_double_vector());
      EXPECT_EQ((ga * 0.3f).to_double_vector(), (a * 0.3f).to_double_vector());
      EXPECT_EQ(ag::ops::relu(ga).to_double_vector(), ag::ops::relu(a).to_double_vector());
      const Tensor row = random_tensor({1, n}, dtype, 3), col = random_tensor({5, 1}, dtype, 4);
      EXPECT_EQ((row.to(Device::kCUDA) * col.to(Device::kCUDA)).to_double_vector(), (row * col).to_double_vector());
    }
  }
}

// Past blocks_for's cap (65536 blocks of 256 threads) each thread loops: every element is written.
TEST(CudaKernels, GridStrideLoopsReachEveryElement) {
  SKIP_WITHOUT_CUDA();
  const int64_t vec_n = int64_t{65536} * 256 * 4 + 4 * 1000 + 3;  // the 16-byte path: 4 floats per thread
  const Tensor sum = ag::full({vec_n}, 1.0, DType::kFloat32, Device::kCUDA) +
                     ag::full({vec_n}, 2.0, DType::kFloat32, Device::kCUDA);
  std::vector<float> v = sum.to_vector();
  EXPECT_EQ(std::count(v.begin(), v.end(), 3.0f), vec_n);
  const int64_t n = int64_t{65536} * 256 + 1001;  // the scalar and broadcast paths
  const Tensor x = ag::full({n}, -1.5, DType::kFloat32, Device::kCUDA);
  v = (x + ag::full({1}, 4.0, DType::kFloat32, Device::kCUDA)).to_vector();
  EXPECT_EQ(std::count(v.begin(), v.end(), 2.5f), n);
  v = (x * 2.0f).to_vector();
  EXPECT_EQ(std::count(v.begin(), v.end(), -3.0f), n);
  v = ag::ops::relu(-x).to_vector();
  EXPECT_EQ(std::count(v.begin(), v.end(), 1.5f), n);
  v = x.to(DType::kFloat16).to_vector();
  EXPECT_EQ(std::count(v.begin(), v.end(), -1.5f), n);
}

// Sums over many chunks and past reduce_to_one's 1024-block cap, against the CPU: both add in
// double and round once, so they agree to float rounding.
TEST(CudaKernels, ReductionsOverManyChunksMatchCpu) {
  SKIP_WITHOUT_CUDA();
  const std::vector<std::pair<ag::Shape, std::vector<int64_t>>> cases = {
      {{10'000'003}, {}},         // everything to one value
      {{40'000, 300}, {0}},       // columns (bias gradients): 10 chunks per output
      {{1'000'000, 20}, {0}},     // 245 chunks per output
      {{300, 40'000}, {1}},       // rows
      {{64, 3000, 33}, {0, 2}},   // a kept middle dimension
  };
  for (const auto& [shape, dims] : cases) {
    SCOPED_TRACE(ag::shape_to_string(shape));
    const Tensor x = random_tensor(shape, DType::kFloat32, 5);
    const Tensor cpu = ag::ops::sum(x, dims), gpu = ag::ops::sum(x.to(Device::kCUDA), dims);
    EXPECT_CLOSE(gpu.to_double_vector(), cpu.to_double_vector(), DType::kFloat32);
  }
  const Tensor p = random_tensor({3'000'001}, DType::kFloat16, 6), y = random_tensor({3'000'001}, DType::kFloat16, 7);
  const Tensor cpu = ag::ops::mse_loss(p, y), gpu = ag::ops::mse_loss(p.to(Device::kCUDA), y.to(Device::kCUDA));
  EXPECT_CLOSE(gpu.to_double_vector(), cpu.to_double_vector(), DType::kFloat16);
}

// Small integers: sums of them are exact in any order, so the GPU's gathers and the CPU's
// scatters must agree to the bit.
Tensor small_integers(const ag::Shape& shape, DType dtype, uint64_t seed) {
  std::vector<double> v = agt::random_values(static_cast<size_t>(ag::shape_numel(shape)), -8.0, 8.0, seed);
  for (double& e : v) e = std::round(e);
  return Tensor::from_vector(v, shape, dtype);
}

// A tensor's bytes, from either device, to compare bits: == on values would not tell -0 from +0.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor host = t.to(Device::kCPU);
  const auto* p = static_cast<const uint8_t*>(host.data_ptr());
  return {p, p + host.numel() * static_cast<int64_t>(ag::element_size(host.dtype()))};
}

// conv2d's moves (im2col, col2im, the transposes) on a chunk that starts at sample 1, with strides,
// padding and dilation, against the CPU's bit for bit, with the 32-bit index maps and the 64-bit
// ones; the untouched samples stay as they were. col2im also over random values: the GPU gathers
// each element's taps in the order the CPU adds them.
TEST(CudaKernels, ConvolutionMovesOfAChunkMatchTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  namespace k = ag::kernels;
  const k::ConvGeometry g{.kh = 3, .kw = 2, .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 2, .dilation_h = 1,
                          .dilation_w = 2, .out_h = 4, .out_w = 7};  // over x [3, 5, 7, 5]
  const int64_t batch = 3, channels = 5, n0 = 1, n = 2, rows = channels * g.kh * g.kw, len = g.out_h * g.out_w;
  struct Restore {
    ~Restore() { k::wide_index_maps_for_testing = false; }
  } restore;
  for (const bool wide : {false, true}) {
    k::wide_index_maps_for_testing = wide;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      SCOPED_TRACE(std::string(ag::dtype_name(dtype)) + (wide ? ", 64-bit maps" : ", 32-bit maps"));
      const auto on_both = [&](const std::function<void(Device, Tensor&)>& fill, const ag::Shape& shape) {
        Tensor cpu = small_integers(shape, dtype, 9), gpu = cpu.to(Device::kCUDA);
        fill(Device::kCPU, cpu);
        fill(Device::kCUDA, gpu);
        EXPECT_EQ(bytes_of(gpu), bytes_of(cpu));
      };
      const Tensor x = small_integers({batch, channels, 7, 5}, dtype, 1);
      const Tensor cols = small_integers({rows, n, len}, dtype, 2);
      const Tensor random_cols = random_tensor({rows, n, len}, dtype, 6);
      const Tensor ct = small_integers({64, n, len}, dtype, 3), b = small_integers({64}, dtype, 4);
      const Tensor y = small_integers({batch, 64, len}, dtype, 5);
      const auto on = [](const Tensor& t, Device d) { return t.to(d); };
      on_both([&](Device d, Tensor& out) { k::im2col(on(x, d), n0, g, out); }, {rows, n, len});
      on_both([&](Device d, Tensor& dx) { k::col2im(on(cols, d), g, n0, dx); }, {batch, channels, 7, 5});
      on_both([&](Device d, Tensor& dx) { k::col2im(on(random_cols, d), g, n0, dx); }, {batch, channels, 7, 5});
      on_both([&](Device d, Tensor& out) { k::samples_from_channels(on(ct, d), on(b, d), n0, out); }, {batch, 64, len});
      on_both([&](Device d, Tensor& out) { k::samples_from_channels(on(ct, d), Tensor(), n0, out); }, {batch, 64, len});
      on_both([&](Device d, Tensor& out) { k::channels_from_samples(on(y, d), n0, out); }, {64, n, len});
    }
  }
}

// conv2d forward and both gradients over several chunks of samples (the column budget lowered so
// that a chunk holds two of the five), grouped and strided, against the CPU's: the chunks start
// past sample 0 and the weight gradient is summed over them.
TEST(CudaKernels, Conv2dInChunksMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  namespace k = ag::kernels;
  struct Restore {
    ~Restore() { k::set_im2col_column_budget_for_testing(0); }
  } restore;
  const ag::Shape xs{5, 4, 9, 8}, ws{6, 2, 3, 3};  // 36 column rows (two groups of 18) of 5 x 4 positions a sample
  k::set_im2col_column_budget_for_testing(2 * 36 * 5 * 4);
  const agt::TensorFn conv = [](const std::vector<Tensor>& in) {
    return ag::ops::conv2d(in[0], in[1], in[2], {.stride = {2, 2}, .padding = {1, 1}, .groups = 2});
  };
  const std::vector<Tensor> inputs = {random_tensor(xs, DType::kFloat64, 1), random_tensor(ws, DType::kFloat64, 2),
                                      random_tensor({6}, DType::kFloat64, 3)};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    const agt::Evaluated cpu = agt::evaluate(conv, inputs, dtype, Device::kCPU);
    const agt::Evaluated gpu = agt::evaluate(conv, inputs, dtype, Device::kCUDA);
    // Sums of 18 products (the forward and dx) and of 100 (dw), in another order.
    EXPECT_CLOSE(gpu.out, cpu.out, dtype, {.k = 18, .magnitude = 8});
    ASSERT_EQ(gpu.grads.size(), 3u);
    EXPECT_CLOSE(gpu.grads[0], cpu.grads[0], dtype, {.k = 18, .magnitude = 8});
    EXPECT_CLOSE(gpu.grads[1], cpu.grads[1], dtype, {.k = 100, .magnitude = 40});
    EXPECT_CLOSE(gpu.grads[2], cpu.grads[2], dtype, {.k = 100, .magnitude = 40});
  }
}

// An empty inner dimension: the product is zero (or the bias), never cuBLAS's k = 0 call, and never
// whatever the reused block held before (NaN here).
TEST(CudaKernels, GemmsWithKZeroGiveZeroOrTheBias) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : ag::kFloatingDTypes) {
    SCOPED_TRACE(ag::dtype_name(dtype));
    (void)ag::full({512 / static_cast<int64_t>(ag::element_size(dtype))}, NAN, dtype, Device::kCUDA);  // a dirty block
    const agt::TensorFn mm = [](const std::vector<Tensor>& in) { return ag::ops::matmul(in[0], in[1]); };
    const agt::TensorFn lin = [](const std::vector<Tensor>& in) { return ag::ops::linear(in[0], in[1], in[2]); };
    const std::vector<std::pair<agt::TensorFn, std::vector<Tensor>>> cases = {
        {mm, {random_tensor({5, 0}, DType::kFloat64, 1), random_tensor({0, 7}, DType::kFloat64, 2)}},
        {mm, {random_tensor({2, 5, 0}, DType::kFloat64, 1), random_tensor({2, 0, 7}, DType::kFloat64, 2)}},
        {lin, {random_tensor({4, 0}, DType::kFloat64, 1), random_tensor({3, 0}, DType::kFloat64, 2),
               random_tensor({3}, DType::kFloat64, 3)}},
    };
    for (const auto& [fn, inputs] : cases) {
      const agt::Evaluated cpu = agt::evaluate(fn, inputs, dtype, Device::kCPU);
      const agt::Evaluated gpu = agt::evaluate(fn, inputs, dtype, Device::kCUDA);
      EXPECT_EQ(gpu.out, cpu.out);
      EXPECT_EQ(gpu.grads, cpu.grads);
      for (double v : gpu.out) EXPECT_FALSE(std::isnan(v));
    }
  }
}

// Gradients of mixed dtypes and sizes, more than 96 chunks of 16384 (what one launch covered
// before) and more than 1024 (the grid cap: blocks loop over chunks), against the CPU bit for bit.
TEST(CudaKernels, MultiTensorUnscaleMatchesCpuAtAnySize) {
  SKIP_WITHOUT_CUDA();
  std::vector<int64_t> sizes = {1, 3, 16384, 16385, 100'000, 333'333, 1'000'000, 7};
  for (int i = 0; i < 30; ++i) sizes.push_back(4096 * (i + 1) + i);
  sizes.push_back(int64_t{1024} * 16384 + 5);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kFloat64};
  std::vector<Tensor> cpu_grads, gpu_grads, cpu_outs, gpu_outs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    cpu_grads.push_back(random_tensor({sizes[k]}, dtypes[k % 3], 100 + k));
    gpu_grads.push_back(cpu_grads.back().to(Device::kCUDA));
    cpu_outs.push_back(Tensor::empty({sizes[k]}));
    gpu_outs.push_back(Tensor::empty({sizes[k]}, DType::kFloat32, Device::kCUDA));
  }
  const double inv_scale = 1.0 / 3.0;  // not a power of two: every product rounds
  EXPECT_FALSE(ag::amp::unscale_and_check_all(cpu_grads, inv_scale, cpu_outs));
  EXPECT_FALSE(ag::amp::unscale_and_check_all(gpu_grads, inv_scale, gpu_outs));
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_EQ(agt::bytes_of(gpu_outs[k]), agt::bytes_of(cpu_outs[k])) << "gradient " << k << " of " << sizes[k];
  }
  // One non-finite value anywhere is found: the last element of the last (grid-looped) tensor, or
  // a NaN in a float16 gradient.
  std::vector<float> values = gpu_grads.back().to_vector();
  values.back() = std::numeric_limits<float>::infinity();
  gpu_grads.back() = Tensor::from_vector(values, {sizes.back()}, gpu_grads.back().dtype(), Device::kCUDA);
  EXPECT_TRUE(ag::amp::unscale_and_check_all(gpu_grads, inv_scale, gpu_outs));
  gpu_grads.back() = cpu_grads.back().to(Device::kCUDA);
  gpu_grads[1] = Tensor::from_vector(std::vector<float>{0.5f, NAN, 1.0f}, {3}, DType::kFloat16, Device::kCUDA);
  EXPECT_TRUE(ag::amp::unscale_and_check_all(gpu_grads, inv_scale, gpu_outs));
}

// The measuring unscale over more chunks than blocks: a block counts chunk after chunk (of
// different tensors) in shared memory and must hand each chunk's counts to its own tensor.
TEST(CudaKernels, MultiTensorMeasureCountsEachTensorAsTheCpuDoes) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kChunk = ag::multi_tensor::kCudaChunkElements;
  std::vector<int64_t> sizes = {kChunk * 700 + 3, 5, kChunk * 400, 0, 99'999};
  const DType dtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat32, DType::kFloat64};
  std::vector<Tensor> cpu, gpu, cpu_outs, gpu_outs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<double> v = agt::random_values(static_cast<size_t>(sizes[k]), -40.0, 10.0, 500 + k);
    for (double& x : v) x = (static_cast<int64_t>(x * 7) % 2 == 0 ? 1 : -1) * std::exp2(x);  // many binades
    cpu.push_back(Tensor::from_vector(v, {sizes[k]}, dtypes[k]));
    gpu.push_back(cpu.back().to(Device::kCUDA));
    cpu_outs.push_back(Tensor::empty({sizes[k]}));
    gpu_outs.push_back(Tensor::empty({sizes[k]}, DType::kFloat32, Device::kCUDA));
  }
  const ag::amp::FormatTable table = ag::amp::make_format_table(ag::amp::low_precision_dtypes());
  std::vector<ag::amp::GradCounts> cpu_counts, gpu_counts;
  EXPECT_EQ(ag::amp::unscale_check_and_measure_all(cpu, 1.0 / 1024, cpu_outs, table, cpu_counts),
            ag::amp::unscale_check_and_measure_all(gpu, 1.0 / 1024, gpu_outs, table, gpu_counts));
  ASSERT_EQ(gpu_counts.size(), sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(std::memcmp(&cpu_counts[k], &gpu_counts[k], sizeof(ag::amp::GradCounts)), 0);
    ASSERT_EQ(agt::bytes_of(gpu_outs[k]), agt::bytes_of(cpu_outs[k]));
  }
  std::vector<ag::amp::GradCounts> measured;
  ag::amp::measure_all(gpu, 1.0 / 1024, table, measured);  // measure only: no outputs
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(std::memcmp(&cpu_counts[k], &measured[k], sizeof(ag::amp::GradCounts)), 0) << k;
  }
}

// One optimizer pass over parameters of two groups (two learning rates), three dtypes, sizes of
// many chunks, one of which skipped the first step (so the step counts differ): each chunk must
// find its own parameter's scalars, as on the CPU.
TEST(CudaKernels, OneOptimizerPassOverMixedParametersMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kChunk = ag::multi_tensor::kCudaChunkElements;
  const int64_t sizes[] = {kChunk * 3 + 1, 7, kChunk * 1100 + 9, 4096};
  const DType dtypes[] = {DType::kFloat16, DType::kFloat32, DType::kBFloat16, DType::kFloat32};
  for (bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "AdamW" : "SGD");
    std::vector<Tensor> cpu, gpu;
    for (size_t k = 0; k < std::size(sizes); ++k) {
      cpu.push_back(random_tensor({sizes[k]}, dtypes[k], 600 + k));
      gpu.push_back(cpu.back().to(Device::kCUDA));
      cpu.back().set_requires_grad(true);
      gpu.back().set_requires_grad(true);
    }
    const auto make = [&](const std::vector<Tensor>& p) -> std::unique_ptr<ag::optim::Optimizer> {
      if (adam) {
        return std::make_unique<ag::optim::AdamW>(std::vector<ag::optim::ParamGroup<ag::optim::AdamWOptions>>{
            {.params = {p[0], p[1]}, .options = ag::optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}},
            {.params = {p[2], p[3]}, .options = ag::optim::AdamWOptions{.lr = 3e-3}}});
      }
      return std::make_unique<ag::optim::SGD>(std::vector<ag::optim::ParamGroup<ag::optim::SGDOptions>>{
          {.params = {p[0], p[1]}, .options = ag::optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}},
          {.params = {p[2], p[3]}, .options = ag::optim::SGDOptions{.lr = 0.05, .weight_decay = 0.01}}});
    };
    auto opt_cpu = make(cpu), opt_gpu = make(gpu);
    for (int step = 0; step < 3; ++step) {
      for (size_t k = 0; k < cpu.size(); ++k) {
        const bool sits_out = step == 0 && k == 1;
        const Tensor g = sits_out ? Tensor() : random_tensor({sizes[k]}, dtypes[k], 700 + 10 * step + k);
        cpu[k].set_grad(g);
        gpu[k].set_grad(sits_out ? Tensor() : g.to(Device::kCUDA));
      }
      opt_cpu->step();
      opt_gpu->step();
    }
    for (size_t k = 0; k < cpu.size(); ++k) {
      SCOPED_TRACE(k);
      const bool has_master = dtypes[k] != DType::kFloat32;
      const Tensor m_cpu = has_master ? cpu[k].master() : cpu[k], m_gpu = has_master ? gpu[k].master() : gpu[k];
      EXPECT_CLOSE(m_gpu.to_double_vector(), m_cpu.to_double_vector(), DType::kFloat32, agt::Tol{.k = 16});
      EXPECT_CLOSE(gpu[k].to_double_vector(), cpu[k].to_double_vector(), dtypes[k], agt::Tol{.k = 4});
    }
  }
}

// Stochastic rounding in the CUDA update pass draws the CPU's bits for every element (they are
// keyed by the element's index in the tensor, not the thread): the same weights, bit for bit, over
// finite values of every binade (16-bit subnormals, the top binade, ±0). The update,
// w (1 - 2^-7) from lr 2^-3 and weight decay 2^-4, is exact in FP32 for 16-bit w, with or without
// fused multiply-adds, so only the rounding could differ. (inf and NaN are left out: their NaN
// bits are each processor's own.)
TEST(CudaKernels, StochasticRoundingMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  const int64_t n = 3 * ag::multi_tensor::kCudaChunkElements + 5;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<float> values(static_cast<size_t>(n));
    ag::manual_seed(3);
    const std::vector<float> normal = ag::randn({n}).to_vector();
    const int top = dtype == DType::kBFloat16 ? 127 : 15, bottom = dtype == DType::kBFloat16 ? -133 : -24;
    for (int64_t i = 0; i < n; ++i) {
      // |normal| < 1.5 keeps the top binade finite in both formats.
      values[i] = std::ldexp(std::clamp(normal[i], -1.5f, 1.5f), bottom + static_cast<int>(i % (top - bottom + 1)));
    }
    values[0] = 0.0f;
    values[1] = -0.0f;
    const Tensor init = Tensor::from_vector(values, {n}).to(dtype);
    const auto run = [&](Device device) {
      // A copy of its own on either device: init.to(kCPU) would be init itself, which the
      // optimizer would then update in place under the other run.
      Tensor p = Tensor::empty(init.shape(), init.dtype(), device);
      ag::copy_(p, init);
      p.set_requires_grad(true);
      ag::optim::SGD sgd({p}, {.lr = 0x1p-3, .weight_decay = 0x1p-4});
      sgd.set_master_weights(ag::optim::MasterWeights::kStochasticRounding);
      sgd.set_rounding_seed(42);
      for (int i = 0; i < 3; ++i) {
        sgd.zero_grad();
        ag::ops::sum(p * 0.0).backward();  // a zero gradient: the update is the decay alone
        sgd.step();
      }
      return p.to(Device::kCPU);
    };
    const Tensor on_gpu = run(Device::kCUDA), on_cpu = run(Device::kCPU);
    EXPECT_TRUE(agt::bytes_of(on_gpu) == agt::bytes_of(on_cpu)) << dtype;
  }
}

// The embedding's gradient (positions sorted by id, one block per distinct id) sums each row in
// position order as the CPU does: the same bits, with ids repeated thousands of times, ids never
// named, and a width that is no multiple of the block.
TEST(CudaKernels, EmbeddingGradientMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kVocab = 1000, kDim = 300, kIds = 6000;
  std::vector<int64_t> id_values;
  for (int64_t i = 0; i < kIds; ++i) id_values.push_back(i % 7 == 0 ? 3 : (i * 7919) % (kVocab / 2));  // half unused
  Tensor ids = Tensor::empty({2, kIds / 2}, DType::kInt64);
  std::memcpy(ids.data_ptr(), id_values.data(), sizeof(int64_t) * kIds);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Tensor w0 = random_tensor({kVocab, kDim}, dtype, 5);
    const Tensor g = random_tensor({2, kIds / 2, kDim}, dtype, 6);
    const auto grad_on = [&](Device device) {
      Tensor w = Tensor::empty(w0.shape(), dtype, device);
      ag::copy_(w, w0);
      w.set_requires_grad(true);
      ag::ops::sum(ag::ops::embedding(ids.to(device), w) * g.to(device)).backward();
      return w.grad().to(Device::kCPU);
    };
    const Tensor on_gpu = grad_on(Device::kCUDA), on_cpu = grad_on(Device::kCPU);
    EXPECT_TRUE(agt::bytes_of(on_gpu) == agt::bytes_of(on_cpu)) << ag::dtype_name(dtype);
  }
}

// A 16-bit gradient read widened by the CUDA pass gives the bits of the same gradient given in
// FP32 on the master (as GradScaler's unscale_ leaves it).
TEST(CudaKernels, A16BitGradientIsReadAsItsFloat32Value) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    agt::expect_widened_grad_equals_fp32_grad(dtype, 3 * ag::multi_tensor::kCudaChunkElements + 5, Device::kCUDA);
  }
}

// An update pass that cannot run (the optimizer state left on the CPU when the parameter moved
// to the GPU) throws naming the state, and changes nothing: the step count and moments stay.
TEST(CudaKernels, AnUpdatePassThatCannotRunChangesNothing) {
  SKIP_WITHOUT_CUDA();
  Tensor p = random_tensor({5}, DType::kFloat32, 1);
  p.set_requires_grad(true);
  ag::optim::Adam opt({p}, ag::optim::AdamOptions{.lr = 1e-2});
  p.set_grad(random_tensor({5}, DType::kFloat32, 2));
  opt.step();
  const std::vector<double> m = opt.state(0).exp_avg.to_double_vector();
  p.set_data(p.detach().to(Device::kCUDA));
  p.set_grad(random_tensor({5}, DType::kFloat32, 3, Device::kCUDA));
  EXPECT_TRUE(agt::throws_error([&] { opt.step(); }, {"Adam update", "exp_avg", "another device"}));
  EXPECT_EQ(opt.state(0).step, 1);
  EXPECT_EQ(opt.state(0).exp_avg.to_double_vector(), m);
}

// The squared norm clip_grad_norm_ needs, over many tensors in one launch, against the CPU (both in
// double, in different orders) and run to run (fixed order: equal bits).
TEST(CudaKernels, SumOfSquaresOverManyTensorsMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  std::vector<Tensor> cpu, gpu;
  const DType dtypes[] = {DType::kFloat16, DType::kFloat32, DType::kFloat64};
  const int64_t sizes[] = {0, 1, 5, 16384, 16385, 250'000, int64_t{1100} * 16384, 3};
  for (size_t k = 0; k < std::size(sizes); ++k) {
    cpu.push_back(random_tensor({sizes[k]}, dtypes[k % 3], 200 + k));
    gpu.push_back(cpu.back().to(Device::kCUDA));
  }
  Tensor cpu_out = Tensor::empty({}, DType::kFloat64), gpu_out = Tensor::empty({}, DType::kFloat64, Device::kCUDA);
  ag::kernels::sum_of_squares(cpu, cpu_out);
  ag::kernels::sum_of_squares(gpu, gpu_out);
  const double expected = cpu_out.item<double>(), got = gpu_out.item<double>();
  EXPECT_NEAR(got, expected, 1e-12 * expected);
  ag::kernels::sum_of_squares(gpu, gpu_out);
  EXPECT_EQ(gpu_out.item<double>(), got);
  ag::kernels::sum_of_squares({}, gpu_out);
  EXPECT_EQ(gpu_out.item<double>(), 0.0);
}

// clip_grad_norm_ on CUDA gradients (p = 2): the norm and the scaling stay on the device. Against
// the CPU path (the sums differ only in order), with the host waits counted: none for the tensor
// form, one to read a double back, one for error_if_nonfinite. Other p take the host path.
TEST(CudaKernels, ClipGradNormStaysOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kFloat64};
  const int64_t sizes[] = {5003, 16385, 3, 40'000};
  const auto make = [&](Device device) {
    std::vector<Tensor> params;
    for (size_t k = 0; k < std::size(sizes); ++k) {
      Tensor p = ag::zeros({sizes[k]}, dtypes[k % 3], device);
      p.set_requires_grad(true);
      p.set_grad(random_tensor({sizes[k]}, dtypes[k % 3], 500 + k, device));
      params.push_back(p);
    }
    return params;
  };
  const auto close = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (size_t k = 0; k < a.size(); ++k) {
      const std::vector<double> x = a[k].grad().to_double_vector(), y = b[k].grad().to_double_vector();
      ASSERT_EQ(x.size(), y.size());
      const double eps = a[k].dtype() == DType::kFloat16 ? 2e-3 : 1e-6;  // one rounding of coeff * g apart
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], eps * std::abs(y[i])) << k << " " << i;
    }
  };
  for (double max_norm : {1.0, 1e9}) {  // clipped, and left alone
    SCOPED_TRACE(max_norm);
    const std::vector<Tensor> cpu = make(Device::kCPU), gpu = make(Device::kCUDA);
    const double expected = ag::nn::utils::clip_grad_norm_(cpu, max_norm);
    const int64_t before = ag::cuda_host_sync_count();
    const Tensor norm = ag::nn::utils::clip_grad_norm_tensor_(gpu, max_norm);
    EXPECT_EQ(ag::cuda_host_sync_count() - before, 0) << "the tensor form must not wait for the GPU";
    EXPECT_EQ(norm.device(), Device::kCUDA);
    EXPECT_NEAR(norm.item<double>(), expected, 1e-12 * expected);
    close(gpu, cpu);
  }
  {
    const std::vector<Tensor> cpu = make(Device::kCPU), gpu = make(Device::kCUDA);
    const double expected = ag::nn::utils::clip_grad_norm_(cpu, 2.0, {.error_if_nonfinite = true});
    const int64_t before = ag::cuda_host_sync_count();
    const double got = ag::nn::utils::clip_grad_norm_(gpu, 2.0, {.error_if_nonfinite = true});
    EXPECT_EQ(ag::cuda_host_sync_count() - before, 1) << "one wait to read the norm (and check it)";
    EXPECT_NEAR(got, expected, 1e-12 * expected);
    close(gpu, cpu);
    const int64_t before_double = ag::cuda_host_sync_count();
    ag::nn::utils::clip_grad_norm_(gpu, 2.0);
    EXPECT_EQ(ag::cuda_host_sync_count() - before_double, 1);
  }
  {  // a non-finite norm: the error before anything is scaled, or the norm back and nothing scaled
    std::vector<Tensor> gpu = make(Device::kCUDA);
    gpu[1].set_grad(ag::full({sizes[1]}, std::nan(""), dtypes[1], Device::kCUDA));
    const std::vector<double> untouched = gpu[0].grad().to_double_vector();
    EXPECT_TRUE(agt::throws_error([&] { ag::nn::utils::clip_grad_norm_(gpu, 1.0, {.error_if_nonfinite = true}); },
                                  {"clip_grad_norm_", "non-finite"}));
    EXPECT_TRUE(std::isnan(ag::nn::utils::clip_grad_norm_tensor_(gpu, 1.0).item<double>()));
    EXPECT_EQ(gpu[0].grad().to_double_vector(), untouched);
  }
  for (double p : {1.0, std::numeric_limits<double>::infinity()}) {  // the host path, same answers
    SCOPED_TRACE(p);
    const std::vector<Tensor> cpu = make(Device::kCPU), gpu = make(Device::kCUDA);
    const double expected = ag::nn::utils::clip_grad_norm_(cpu, 1.0, {.norm_type = p});
    const Tensor norm = ag::nn::utils::clip_grad_norm_tensor_(gpu, 1.0, {.norm_type = p});
    EXPECT_EQ(norm.device(), Device::kCUDA);
    EXPECT_EQ(norm.item<double>(), expected);
    close(gpu, cpu);
  }
}

// Each optimizer variant's fused CUDA update against the CPU's over a few steps with the same
// gradients, for float32 parameters and float16 ones with FP32 masters.
TEST(CudaKernels, EveryOptimizerVariantMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  using Make = std::function<std::unique_ptr<ag::optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<std::string, Make>> variants = {
      {"SGD momentum dampening weight decay",
       [](std::vector<Tensor> p) {
         return std::make_unique<ag::optim::SGD>(p, ag::optim::SGDOptions{
             .lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
       }},
      {"SGD Nesterov",
       [](std::vector<Tensor> p) {
         return std::make_unique<ag::optim::SGD>(p, ag::optim::SGDOptions{
             .lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
       }},
      {"SGD plain weight decay",
       [](std::vector<Tensor> p) {
         return std::make_unique<ag::optim::SGD>(p, ag::optim::SGDOptions{.lr = 0.1, .weight_decay = 0.05});
       }},
      {"Adam L2 weight decay",
       [](std::vector<Tensor> p) {
         return std::make_unique<ag::optim::Adam>(p, ag::optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.01});
       }},
      {"AdamW", [](std::vector<Tensor> p) {
         return std::make_unique<ag::optim::AdamW>(p, ag::optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
       }},
  };
  for (const auto& [name, make] : variants) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      SCOPED_TRACE(name + " " + std::string(ag::dtype_name(dtype)));
      const int64_t n = 5003;  // a tail after any vector width
      Tensor p_cpu = random_tensor({n}, dtype, 300), p_gpu = p_cpu.to(Device::kCUDA);
      p_cpu.set_requires_grad(true);
      p_gpu.set_requires_grad(true);
      auto opt_cpu = make({p_cpu});
      auto opt_gpu = make({p_gpu});
      for (int step = 0; step < 4; ++step) {
        const Tensor g = random_tensor({n}, dtype, 400 + step);
        p_cpu.set_grad(g);
        p_gpu.set_grad(g.to(Device::kCUDA));
        opt_cpu->step();
        opt_gpu->step();
        // float32 element math in a different order (the GPU fuses multiply-adds): a few float ulps.
        const Tensor m_cpu = dtype == DType::kFloat32 ? p_cpu : p_cpu.master();
        const Tensor m_gpu = dtype == DType::kFloat32 ? p_gpu : p_gpu.master();
        EXPECT_CLOSE(m_gpu.to_double_vector(), m_cpu.to_double_vector(), DType::kFloat32, agt::Tol{.k = 16})
            << "step " << step;
        EXPECT_CLOSE(p_gpu.to_double_vector(), p_cpu.to_double_vector(), dtype, agt::Tol{.k = 4}) << "step " << step;
      }
    }
  }
}

// The fused attention on tensor cores (ops/attention/attention_cuda.cu) against float64 and the
// composed (cuBLAS) path, as the CPU kernel is checked in attention_test.cc.
TEST(CudaKernels, FusedAttentionMatchesFloat64AtLeastAsWellAsTheComposedPath) {
  SKIP_WITHOUT_CUDA();
  for (const agt::AttentionCase& c : agt::attention_cases()) {
    EXPECT_TRUE(agt::fused_attention_as_accurate_as_composed(Device::kCUDA, c, {DType::kBFloat16, DType::kFloat16}));
  }
  // At scores near 600 the composed path rounds the scores to 16 bits before its softmax; the fused
  // kernel's are float32 from the tensor cores: at least 10x more accurate, as on the CPU.
  EXPECT_TRUE(agt::fused_attention_as_accurate_as_composed(
      Device::kCUDA, {.batch = 1, .heads = 2, .tq = 64, .tk = 64, .d = 16, .dv = 16, .causal = true},
      {DType::kBFloat16, DType::kFloat16}, /*magnitude=*/24.0, /*ratio=*/0.1));
}

TEST(CudaKernels, FusedAttentionKeepsNoScoresAndFallsBackWhereItDoesNotApply) {
  SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(agt::fused_attention_keeps_no_scores(Device::kCUDA, DType::kBFloat16));
  EXPECT_TRUE(agt::fused_attention_keeps_no_scores(Device::kCUDA, DType::kFloat16));
  // float32, head sizes over 128 and dropout run the composed path on CUDA; kFused says why.
  for (const auto& [dtype, d, dropout] : {std::tuple{DType::kFloat32, int64_t{64}, 0.0},
                                          std::tuple{DType::kBFloat16, int64_t{256}, 0.0},
                                          std::tuple{DType::kBFloat16, int64_t{64}, 0.2}}) {
    Tensor q = random_tensor({1, 2, 40, d}, dtype, 7, Device::kCUDA);
    q.set_requires_grad(true);
    const ag::ops::AttentionOptions options{.dropout_p = dropout, .is_causal = true};
    EXPECT_EQ(ag::ops::scaled_dot_product_attention(q, q, q, options).grad_fn()->name(), "matmul");
    ag::ops::AttentionBackendGuard fused(ag::ops::AttentionBackend::kFused);
    EXPECT_TRUE(agt::throws_error([&] { ag::ops::scaled_dot_product_attention(q, q, q, options); },
                                  {"scaled_dot_product_attention", "CUDA"}));
  }
}

// safe_softmax's rows of only -inf give 0s and zero gradients on the GPU too; the other rows the
// CPU's values (float32 and bfloat16).
TEST(CudaKernels, SafeSoftmaxGivesZerosForEmptyRowsAsTheCpu) {
  SKIP_WITHOUT_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x =
      Tensor::from_vector(std::vector<float>{-inf, -inf, -inf, -inf, 0.5f, -1, 2, 0, 1, -inf, 3, -2}, {3, 4});
  const Tensor dy = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::vector<double> out[2], grad[2];
    for (int d = 0; d < 2; ++d) {
      const Device device = d == 0 ? Device::kCPU : Device::kCUDA;
      Tensor leaf = x.to(dtype).to(device);
      leaf.set_requires_grad(true);
      const Tensor y = ag::ops::safe_softmax(leaf, -1);
      ag::ops::sum(y * dy.to(dtype).to(device)).backward();
      out[d] = y.to_double_vector();
      grad[d] = leaf.grad().to_double_vector();
    }
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(out[1][i], 0.0) << ag::dtype_name(dtype);
      EXPECT_EQ(grad[1][i], 0.0) << ag::dtype_name(dtype);
    }
    for (size_t i = 0; i < out[0].size(); ++i) {
      EXPECT_NEAR(out[1][i], out[0][i], 1e-2 * (1 + std::abs(out[0][i]))) << i << " " << ag::dtype_name(dtype);
      EXPECT_NEAR(grad[1][i], grad[0][i], 1e-1 * (1 + std::abs(grad[0][i]))) << i << " " << ag::dtype_name(dtype);
    }
  }
}

TEST(CudaKernels, SelfAttentionReadsTheHeadsWhereTheyLieInQkv) {
  SKIP_WITHOUT_CUDA();
  EXPECT_TRUE(agt::self_attention_reads_the_heads_in_place(Device::kCUDA, {DType::kBFloat16, DType::kFloat16}, 2, 70, 3,
                                                           64));
  EXPECT_TRUE(agt::self_attention_reads_the_heads_in_place(Device::kCUDA, {DType::kBFloat16}, 1, 130, 2, 80));
}

TEST(CudaKernels, FusedAttentionGradientsAreDeterministic) {
  SKIP_WITHOUT_CUDA();
  const auto run = [] {
    std::vector<Tensor> qkv;
    for (uint64_t seed : {11, 12, 13}) {
      qkv.push_back(random_tensor({2, 3, 300, 64}, DType::kBFloat16, seed, Device::kCUDA));
      qkv.back().set_requires_grad(true);
    }
    ag::ops::sum(ag::ops::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true)).backward();
    std::vector<std::vector<double>> g;
    for (const Tensor& t : qkv) g.push_back(t.grad().to_double_vector());
    return g;
  };
  EXPECT_EQ(run(), run());
}

// The 8-bit float casts on the GPU give the CPU's codes (which //tests:float8_test holds to
// PyTorch's): from every float16 and bfloat16 pattern, from floats around every rounding
// boundary and past the range, from float64; every code widened; and device-to-device casts.
TEST(CudaKernels, Float8CastsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  std::vector<uint16_t> patterns(65536);
  for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
  Tensor every_half = Tensor::empty({65536}, DType::kFloat16), every_bf16 = Tensor::empty({65536}, DType::kBFloat16);
  std::memcpy(every_half.data_ptr(), patterns.data(), 65536 * 2);
  std::memcpy(every_bf16.data_ptr(), patterns.data(), 65536 * 2);
  std::vector<float> floats = every_bf16.to_vector();
  for (float v : every_half.to_vector()) floats.push_back(v);
  for (double v : agt::random_values(100000, -60000.0, 60000.0, 40)) floats.push_back(static_cast<float>(v));
  for (double v : agt::random_values(100000, -1e-3, 1e-3, 41)) floats.push_back(static_cast<float>(v));
  const Tensor x = Tensor::from_vector(floats, {static_cast<int64_t>(floats.size())});
  const auto bytes = [](const Tensor& t) {
    const Tensor cpu = t.to(Device::kCPU);
    const auto* p = static_cast<const uint8_t*>(cpu.data_ptr());
    return std::vector<uint8_t>(p, p + cpu.numel());
  };
  // The same codes, or the first few elements whose codes differ.
  const auto same_codes = [&](const Tensor& source, DType fp8) -> testing::AssertionResult {
    const std::vector<uint8_t> got = bytes(source.to(Device::kCUDA).to(fp8)), want = bytes(source.to(fp8));
    std::vector<double> values = source.to_double_vector();
    std::string differ;
    int shown = 0;
    for (size_t i = 0; i < want.size() && shown < 8; ++i) {
      if (got[i] == want[i]) continue;
      differ += " [" + std::to_string(i) + "] " + std::to_string(values[i]) + ": " + std::to_string(got[i]) +
                " not " + std::to_string(want[i]) + ";";
      ++shown;
    }
    if (differ.empty()) return testing::AssertionSuccess();
    return testing::AssertionFailure() << ag::dtype_name(source.dtype()) << " -> " << ag::dtype_name(fp8) << ":" << differ;
  };
  for (DType fp8 : ag::kFloat8DTypes) {
    SCOPED_TRACE(ag::dtype_name(fp8));
    EXPECT_TRUE(same_codes(x, fp8));
    EXPECT_TRUE(same_codes(every_half, fp8));
    EXPECT_TRUE(same_codes(every_bf16, fp8));
    EXPECT_TRUE(same_codes(x.to(DType::kFloat64), fp8));
    Tensor codes = Tensor::empty({256}, fp8);
    for (int c = 0; c < 256; ++c) static_cast<uint8_t*>(codes.data_ptr())[c] = static_cast<uint8_t>(c);
    const std::vector<float> want = codes.to(DType::kFloat32).to_vector();
    const std::vector<float> got = codes.to(Device::kCUDA).to(DType::kFloat32).to_vector();
    for (int c = 0; c < 256; ++c) EXPECT_EQ(std::bit_cast<uint32_t>(got[c]), std::bit_cast<uint32_t>(want[c])) << c;
    EXPECT_EQ(bytes(x.to(fp8).to(Device::kCUDA).to(DType::kBFloat16).to(fp8)), bytes(x.to(fp8)));
    EXPECT_EQ(ag::zeros({8}, fp8, Device::kCUDA).to_vector(), std::vector<float>(8, 0.0f));
  }
}

// Where a cast's amax (as bits) and counts differ from the reference's, as " amax ...; counts ...;".
std::string counts_differ(const ag::Float8CastCounts& g, const ag::Float8CastCounts& w) {
  std::string differ;
  if (std::bit_cast<uint32_t>(g.amax) != std::bit_cast<uint32_t>(w.amax)) {
    differ += " amax " + std::to_string(g.amax) + " not " + std::to_string(w.amax) + ";";
  }
  if (g.saturated != w.saturated || g.flushed != w.flushed || g.numel != w.numel) {
    differ += " counts " + std::to_string(g.saturated) + "/" + std::to_string(g.flushed) + "/" +
              std::to_string(g.numel) + " not " + std::to_string(w.saturated) + "/" + std::to_string(w.flushed) +
              "/" + std::to_string(w.numel) + ";";
  }
  return differ;
}

// The CUDA scaled cast against the CPU's, one tensor and scale: codes, amax (as bits) and counts.
testing::AssertionResult same_scaled_cast(const Tensor& src, float scale, DType format) {
  Tensor want = Tensor::empty(src.shape(), format), got = Tensor::empty(src.shape(), format, Device::kCUDA);
  const ag::Float8CastCounts w = ag::kernels::cpu::quantize_float8(src.to(Device::kCPU), scale, want);
  const ag::Float8CastCounts g = ag::kernels::quantize_float8(src.to(Device::kCUDA), scale, got);
  const std::vector<uint8_t> gb = bytes_of(got), wb = bytes_of(want);
  const std::vector<double> values = src.to_double_vector();
  std::string differ;
  for (size_t i = 0, shown = 0; i < wb.size() && shown < 4; ++i) {
    if (gb[i] == wb[i]) continue;
    differ += " [" + std::to_string(i) + "] " + std::to_string(values[i]) + ": " + std::to_string(gb[i]) + " not " +
              std::to_string(wb[i]) + ";";
    ++shown;
  }
  differ += counts_differ(g, w);
  if (differ.empty()) return testing::AssertionSuccess();
  return testing::AssertionFailure() << ag::dtype_name(src.dtype()) << " -> " << ag::dtype_name(format) << " scale "
                                     << scale << ":" << differ;
}

// The FP8 linear's element-wise kernels on the GPU give the CPU's results bit for bit: the scaled
// cast of every bfloat16 and float16 pattern (NaNs, infs, subnormals) at scales that push them
// past both ends of each format, the amax alone, and the descale in float and in double.
TEST(CudaKernels, Float8LinearKernelsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  std::vector<uint16_t> patterns(65536);
  for (size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<uint16_t>(i);
  Tensor every_bf16 = Tensor::empty({65536}, DType::kBFloat16), every_half = Tensor::empty({65536}, DType::kFloat16);
  std::memcpy(every_bf16.data_ptr(), patterns.data(), 65536 * 2);
  std::memcpy(every_half.data_ptr(), patterns.data(), 65536 * 2);
  const Tensor big = random_tensor({700, 700}, DType::kFloat32, 60);  // many blocks' partials
  for (DType format : ag::kFloat8DTypes) {
    for (float scale : {1.0f, 3.7f, 1e-30f, 1e30f, 448.0f / 3.0f, 0.0f}) {
      EXPECT_TRUE(same_scaled_cast(every_bf16, scale, format));
      EXPECT_TRUE(same_scaled_cast(every_half, scale, format));
    }
    EXPECT_TRUE(same_scaled_cast(big, 1e4f, format));
    EXPECT_TRUE(same_scaled_cast(big.to(DType::kFloat64), 3.0f, format));
  }
  for (const Tensor& t : {every_bf16, every_half, big}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(ag::kernels::amax(t.to(Device::kCUDA))),
              std::bit_cast<uint32_t>(ag::kernels::cpu::amax(t)));
  }
  EXPECT_EQ(ag::kernels::amax(Tensor::empty({0}, DType::kFloat32, Device::kCUDA)), 0.0f);
  const Tensor products = random_tensor({37, 45}, DType::kFloat32, 61);
  const Tensor bias = random_tensor({45}, DType::kBFloat16, 62);
  for (DType dtype : ag::kFloatingDTypes) {
    for (double alpha : {0.37, 1e-39}) {  // a normal float, and a subnormal one (the double path)
      for (const Tensor& b : {Tensor(), bias}) {
        Tensor want = Tensor::empty({37, 45}, dtype), got = Tensor::empty({37, 45}, dtype, Device::kCUDA);
        ag::kernels::cpu::descale(products, alpha, b, want);
        ag::kernels::descale(products.to(Device::kCUDA), alpha, b.defined() ? b.to(Device::kCUDA) : b, got);
        EXPECT_EQ(got.to_double_vector(), want.to_double_vector()) << ag::dtype_name(dtype) << " alpha " << alpha;
      }
    }
  }
}

// The CUDA fused cast and transpose against the CPU's scaled cast of a (rows, cols) matrix: the
// same codes, dst_t their transpose ((cols, rows), of the format, on the GPU), the same amax bits
// and counts.
testing::AssertionResult same_pair_cast(const Tensor& src, float scale, DType format) {
  const int64_t rows = src.size(0), cols = src.size(1);
  Tensor want = Tensor::empty(src.shape(), format), got = Tensor::empty(src.shape(), format, Device::kCUDA), got_t;
  const ag::Float8CastCounts w = ag::kernels::cpu::quantize_float8(src.to(Device::kCPU), scale, want);
  const ag::Float8CastCounts g = ag::kernels::quantize_float8_pair(src.to(Device::kCUDA), scale, got, got_t);
  const auto failure = [&] {
    return testing::AssertionFailure() << ag::dtype_name(src.dtype()) << " " << rows << "x" << cols << " -> "
                                       << ag::dtype_name(format) << " scale " << scale << ":";
  };
  if (!got_t.defined() || got_t.shape() != ag::Shape{cols, rows} || got_t.dtype() != format ||
      got_t.device() != Device::kCUDA) {
    return failure() << " dst_t is " << (got_t.defined() ? got_t.to_string() : "undefined");
  }
  const std::vector<uint8_t> gb = bytes_of(got), gtb = bytes_of(got_t), wb = bytes_of(want);
  std::string differ;
  int shown = 0;
  for (int64_t r = 0; r < rows && shown < 4; ++r) {
    for (int64_t c = 0; c < cols && shown < 4; ++c) {
      const uint8_t code = wb[static_cast<size_t>(r * cols + c)];
      const uint8_t direct = gb[static_cast<size_t>(r * cols + c)], transposed = gtb[static_cast<size_t>(c * rows + r)];
      if (direct == code && transposed == code) continue;
      differ += " [" + std::to_string(r) + ", " + std::to_string(c) + "]: " + std::to_string(direct) + " and " +
                std::to_string(transposed) + " (transposed) not " + std::to_string(code) + ";";
      ++shown;
    }
  }
  differ += counts_differ(g, w);
  if (differ.empty()) return testing::AssertionSuccess();
  return failure() << differ;
}

// The fused cast and transpose (the FP8 linear's casts of x, w and dy on CUDA) gives the CPU's
// scaled cast and its transpose: every bfloat16 pattern as a (256, 256) matrix (NaNs, infs and
// subnormals in many tiles) at scales past both ends of each format, and odd shapes (a single
// element, a single row or column, partial tiles at the right and bottom edges, tall and thin,
// thousands of tiles) from float32, float16 and bfloat16.
TEST(CudaKernels, Float8CastAndTransposeMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_CUDA();
  Tensor every_bf16 = Tensor::empty({256, 256}, DType::kBFloat16);
  for (int i = 0; i < 65536; ++i) static_cast<uint16_t*>(every_bf16.data_ptr())[i] = static_cast<uint16_t>(i);
  for (DType format : ag::kFloat8DTypes) {
    for (float scale : {1.0f, 3.7f, 1e-30f, 1e30f, 448.0f / 3.0f, 0.0f}) {
      EXPECT_TRUE(same_pair_cast(every_bf16, scale, format));
    }
    const std::pair<int64_t, int64_t> shapes[] = {{1, 1},    {1, 1000},   {1000, 1},  {33, 65},
                                                  {1000, 7}, {7, 1000},   {300, 260}, {2048, 2080}};
    for (const auto& [rows, cols] : shapes) {
      const Tensor x = random_tensor({rows, cols}, DType::kFloat32, 110 + static_cast<uint64_t>(rows));
      for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        for (float scale : {1e4f, 3.0f, 1e-6f}) EXPECT_TRUE(same_pair_cast(x.to(dtype), scale, format));
      }
    }
  }
  // An empty matrix gives an empty twin and nothing else.
  Tensor dst = Tensor::empty({0, 5}, DType::kFloat8E4M3, Device::kCUDA), dst_t;
  const ag::Float8CastCounts empty =
      ag::kernels::quantize_float8_pair(Tensor::empty({0, 5}, DType::kFloat32, Device::kCUDA), 1.0f, dst, dst_t);
  EXPECT_EQ(dst_t.shape(), (ag::Shape{5, 0}));
  EXPECT_EQ(empty.amax, 0.0f);
  EXPECT_EQ(empty.saturated + empty.flushed, 0);
}

// The FP8 GEMM on the GPU, each transpose, at shapes cuBLASLt's FP8 matmul takes (multiples of 16)
// and at shapes it refuses (the bfloat16 fallback), against the CPU's float GEMM of the decoded
// values. The values are small integers, so every sum is exact whatever its order (and within
// the few bits Hopper's FP8 tensor cores keep between promotions to FP32): any layout or decoding
// slip shows as a differing bit.
TEST(CudaKernels, Float8GemmGivesTheFloatGemmOfItsValues) {
  SKIP_WITHOUT_CUDA();
  using ag::kernels::Transpose;
  const auto integers = [](const ag::Shape& shape, int64_t limit, uint64_t seed, DType format) {
    std::vector<float> v;
    const size_t count = static_cast<size_t>(ag::shape_numel(shape));
    for (double r : agt::random_values(count, -limit - 0.49, limit + 0.49, seed)) {
      v.push_back(static_cast<float>(std::round(r)));
    }
    return Tensor::from_vector(v, shape).to(format);  // exact in both formats for |v| <= 8
  };
  // The linear's pairs: E4M3 x E4M3 (forward), E5M2 x E4M3 (dy with w or x), and E4M3 x E5M2.
  const std::pair<DType, DType> formats[] = {{DType::kFloat8E4M3, DType::kFloat8E4M3},
                                             {DType::kFloat8E5M2, DType::kFloat8E4M3},
                                             {DType::kFloat8E4M3, DType::kFloat8E5M2}};
  for (const auto& [m, n, k] : {std::tuple{48, 32, 64}, std::tuple{256, 128, 512}, std::tuple{5, 3, 7},
                                std::tuple{33, 17, 40}, std::tuple{32, 32, 24}}) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        for (const auto& [a_format, b_format] : formats) {
          const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
          const Tensor a = integers(at ? ag::Shape{k, m} : ag::Shape{m, k}, 4, 70, a_format);
          const Tensor b = integers(bt ? ag::Shape{n, k} : ag::Shape{k, n}, 4, 71, b_format);
          Tensor want = Tensor::empty({m, n}, DType::kFloat32);
          Tensor got = Tensor::empty({m, n}, DType::kFloat32, Device::kCUDA);
          ag::kernels::cpu::gemm(a.to(DType::kFloat32), ta, b.to(DType::kFloat32), tb, Tensor(), want);
          const int64_t before = ag::kernels::cuda::float8_tensor_core_gemms_for_testing();
          ag::kernels::gemm(a.to(Device::kCUDA), ta, b.to(Device::kCUDA), tb, Tensor(), got);
          EXPECT_EQ(got.to_vector(), want.to_vector()) << m << "x" << n << "x" << k << " ta " << at << " tb " << bt
                                                       << " " << ag::dtype_name(a_format) << " x "
                                                       << ag::dtype_name(b_format);
          // On FP8 tensor cores exactly where the shape allows (the fallback proved nothing about them).
          if (ag::kernels::cuda::has_float8_tensor_cores()) {
            EXPECT_EQ(ag::kernels::cuda::float8_tensor_core_gemms_for_testing() - before,
                      m % 16 == 0 && n % 16 == 0 && k % 16 == 0 ? 1 : 0)
                << m << "x" << n << "x" << k << " ta " << at << " tb " << bt;
          }
        }
      }
    }
  }
}

// got within a GEMM's summation error of want (2^-12 of want's largest magnitude), and one rounding
// to `rounded_to` (want's dtype by default). Not FP32's 2^-23 times K: between its promotions to
// FP32, Hopper's FP8 tensor cores add aligned products in fewer bits (about 14), and a summation
// order's error is of that size. A wrong operand, scale or layout is far larger: one FP8 rounding
// is 2^-4 of a product.
testing::AssertionResult close_to(const Tensor& got, const Tensor& want, DType rounded_to) {
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  if (g.size() != w.size()) return testing::AssertionFailure() << g.size() << " values, not " << w.size();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::fabs(v));
  const double eps = ag::dtype_info(rounded_to).eps;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::fabs(g[i] - w[i]) <= 0x1p-12 * scale + eps * std::fabs(w[i]))) {
      return testing::AssertionFailure() << "[" << i << "] " << g[i] << " vs " << w[i] << " (scale " << scale << ")";
    }
  }
  return testing::AssertionSuccess();
}
testing::AssertionResult close_to(const Tensor& got, const Tensor& want) { return close_to(got, want, want.dtype()); }

// A BF16-autocast step of a linear inside a Float8Guard: y = x w^T + b, then backward of g.
struct Float8Step {
  Tensor x, w, b;  // x is the last step's
  void run(const Tensor& x_step, const Tensor& g, const ag::amp::Float8Recipe& recipe) {
    const Device device = w.device();
    x = x_step.to(device);
    x.set_requires_grad(true);
    {
      ag::amp::AutocastGuard autocast(device, DType::kBFloat16);
      ag::amp::Float8Guard fp8(device, recipe);
      y = ag::ops::linear(x, w, b);
    }
    y.backward(g.to(device));
  }
  Tensor y;
};

// Three steps on the GPU and on the CPU from the same weights, current and delayed scaling: the
// FP8 operands (each re-cast at the scale the step used) are the same bytes, the scaling states
// the same bits, and y, dx, dw, db agree to FP32 summation order. 48x64 by 32x64: every GEMM is
// cuBLASLt's FP8 one on an FP8-capable GPU.
TEST(CudaKernels, Float8LinearMatchesTheCpuOverSteps) {
  SKIP_WITHOUT_CUDA();
  for (auto scaling : {ag::amp::Float8Scaling::kCurrent, ag::amp::Float8Scaling::kDelayed}) {
    SCOPED_TRACE(scaling == ag::amp::Float8Scaling::kCurrent ? "current" : "delayed");
    const ag::amp::Float8Recipe recipe{.scaling = scaling, .amax_history_len = 4};
    Float8Step cpu, gpu;
    cpu.w = random_tensor({32, 64}, DType::kFloat32, 80);
    cpu.b = random_tensor({32}, DType::kFloat32, 81);
    gpu.w = cpu.w.to(Device::kCUDA);
    gpu.b = cpu.b.to(Device::kCUDA);
    for (Tensor* t : {&cpu.w, &cpu.b, &gpu.w, &gpu.b}) t->set_requires_grad(true);
    for (uint64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      // Spreads that change from step to step, so delayed scaling's scales move.
      const Tensor x = random_tensor({2, 24, 64}, DType::kFloat32, 90 + step) * static_cast<float>(1 + 3 * step);
      const Tensor g = (random_tensor({2, 24, 32}, DType::kFloat32, 95 + step) * 1e-3f).to(DType::kBFloat16);
      cpu.run(x, g, recipe);
      const int64_t before = ag::kernels::cuda::float8_tensor_core_gemms_for_testing();
      gpu.run(x, g, recipe);
      if (ag::kernels::cuda::has_float8_tensor_cores()) {  // y, dx and dw
        EXPECT_EQ(ag::kernels::cuda::float8_tensor_core_gemms_for_testing() - before, 3);
      }
      const ag::amp::Float8LinearState* cs = ag::amp::float8_state(cpu.w);
      const ag::amp::Float8LinearState* gs = ag::amp::float8_state(gpu.w);
      ASSERT_NE(gs, nullptr);
      ASSERT_NE(cs, nullptr);
      for (auto member : {&ag::amp::Float8LinearState::input, &ag::amp::Float8LinearState::weight,
                          &ag::amp::Float8LinearState::grad_output}) {
        EXPECT_EQ(std::bit_cast<uint32_t>((gs->*member).scale()), std::bit_cast<uint32_t>((cs->*member).scale()));
        EXPECT_EQ((gs->*member).amax_history(), (cs->*member).amax_history());
      }
      EXPECT_TRUE(same_scaled_cast(ag::ops::reshape(x, {48, 64}), cs->input.scale(), recipe.forward_dtype()));
      EXPECT_TRUE(same_scaled_cast(cpu.w.detach(), cs->weight.scale(), recipe.forward_dtype()));
      EXPECT_TRUE(same_scaled_cast(ag::ops::reshape(g, {48, 32}), cs->grad_output.scale(), recipe.backward_dtype()));
      EXPECT_EQ(gpu.y.dtype(), DType::kBFloat16);
      EXPECT_TRUE(close_to(gpu.y, cpu.y));
      EXPECT_TRUE(close_to(gpu.x.grad(), cpu.x.grad()));
      EXPECT_TRUE(close_to(gpu.w.grad(), cpu.w.grad()));  // summed over the steps so far on both
      EXPECT_TRUE(close_to(gpu.b.grad(), cpu.b.grad(), DType::kBFloat16));  // db is summed from the BF16 dy
    }
  }
}

// conv2d inside a Float8Guard under BF16 autocast, two steps of delayed scaling on the GPU and on
// the CPU from the same weights: the same scaling states (bits), and y, dx, dw, db to FP32
// summation order. Ungrouped, its GEMMs are 16 x 144 by 144 x 256 (cuBLASLt's FP8 matmul on an
// FP8-capable GPU), or, in chunks of one sample, by 144 x 64; grouped, they are batched (the
// bfloat16 fallback).
TEST(CudaKernels, Float8Conv2dMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  struct Restore {
    ~Restore() { ag::kernels::set_im2col_column_budget_for_testing(0); }
  } restore;
  const int64_t one_sample = 16 * 9 * 64;  // column values a sample; the FP8 route's chunk is half the budget
  for (const auto& [groups, budget] : {std::pair<int64_t, int64_t>{1, 0}, {1, 2 * one_sample}, {2, 0}}) {
    SCOPED_TRACE("groups " + std::to_string(groups) + ", budget " + std::to_string(budget));
    ag::kernels::set_im2col_column_budget_for_testing(budget);
    const ag::amp::Float8Recipe recipe{.amax_history_len = 4};
    const ag::ops::Conv2dOptions options{.padding = {1, 1}, .groups = groups};
    Tensor w[2] = {random_tensor({16, 16 / groups, 3, 3}, DType::kFloat32, 70), Tensor()};
    Tensor b[2] = {random_tensor({16}, DType::kFloat32, 71), Tensor()};
    w[1] = w[0].to(Device::kCUDA);
    b[1] = b[0].to(Device::kCUDA);
    for (Tensor* t : {&w[0], &w[1], &b[0], &b[1]}) t->set_requires_grad(true);
    for (uint64_t step = 0; step < 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const Tensor x = random_tensor({4, 16, 8, 8}, DType::kFloat32, 72 + step) * static_cast<float>(1 + 3 * step);
      const Tensor g = (random_tensor({4, 16, 8, 8}, DType::kFloat32, 75 + step) * 1e-3f).to(DType::kBFloat16);
      Tensor xs[2], ys[2];
      const int64_t before = ag::kernels::cuda::float8_tensor_core_gemms_for_testing();
      for (int d = 0; d < 2; ++d) {
        const Device device = d == 0 ? Device::kCPU : Device::kCUDA;
        xs[d] = x.to(device);
        xs[d].set_requires_grad(true);
        {
          ag::amp::AutocastGuard autocast(device, DType::kBFloat16);
          ag::amp::Float8Guard fp8(device, recipe);
          ys[d] = ag::ops::conv2d(xs[d], w[d], b[d], options);
        }
        ys[d].backward(g.to(device));
      }
      if (ag::kernels::cuda::has_float8_tensor_cores()) {  // y, dx and dw per chunk, ungrouped
        const int64_t ran = ag::kernels::cuda::float8_tensor_core_gemms_for_testing() - before;
        if (groups == 1) {
          EXPECT_GE(ran, 3);
        } else {
          EXPECT_EQ(ran, 0);
        }
      }
      const ag::amp::Float8LinearState* cs = ag::amp::float8_state(w[0]);
      const ag::amp::Float8LinearState* gs = ag::amp::float8_state(w[1]);
      ASSERT_NE(cs, nullptr);
      ASSERT_NE(gs, nullptr);
      for (auto member : {&ag::amp::Float8LinearState::input, &ag::amp::Float8LinearState::weight,
                          &ag::amp::Float8LinearState::grad_output}) {
        EXPECT_EQ(std::bit_cast<uint32_t>((gs->*member).scale()), std::bit_cast<uint32_t>((cs->*member).scale()));
        EXPECT_EQ((gs->*member).amax_history(), (cs->*member).amax_history());
      }
      EXPECT_EQ(ys[1].dtype(), DType::kBFloat16);
      EXPECT_TRUE(close_to(ys[1], ys[0]));
      EXPECT_TRUE(close_to(xs[1].grad(), xs[0].grad()));
      EXPECT_TRUE(close_to(w[1].grad(), w[0].grad()));  // summed over the steps so far on both
      EXPECT_TRUE(close_to(b[1].grad(), b[0].grad(), DType::kBFloat16));  // db is summed from the BF16 dy
    }
  }
}

// Shapes cuBLASLt's FP8 matmul refuses (K = 7, odd M and N) still give the CPU's answer, through
// the bfloat16 fallback; and a non-finite operand makes the product NaN on the GPU too.
TEST(CudaKernels, Float8LinearFallsBackWhereCublasLtRefusesTheShape) {
  SKIP_WITHOUT_CUDA();
  Float8Step cpu, gpu;
  cpu.w = random_tensor({3, 7}, DType::kFloat32, 100);
  cpu.b = random_tensor({3}, DType::kFloat32, 101);
  gpu.w = cpu.w.to(Device::kCUDA);
  gpu.b = cpu.b.to(Device::kCUDA);
  for (Tensor* t : {&cpu.w, &gpu.w}) t->set_requires_grad(true);
  const ag::amp::Float8Recipe recipe{.scaling = ag::amp::Float8Scaling::kCurrent};
  const Tensor x = random_tensor({5, 7}, DType::kFloat32, 102);
  const Tensor g = random_tensor({5, 3}, DType::kFloat32, 103).to(DType::kBFloat16);
  cpu.run(x, g, recipe);
  gpu.run(x, g, recipe);
  EXPECT_TRUE(close_to(gpu.y, cpu.y));
  EXPECT_TRUE(close_to(gpu.x.grad(), cpu.x.grad()));
  EXPECT_TRUE(close_to(gpu.w.grad(), cpu.w.grad()));
  std::vector<float> bad = x.to_vector();
  bad[4] = INFINITY;
  gpu.run(Tensor::from_vector(bad, {5, 7}), g, recipe);
  for (float v : gpu.y.to_vector()) EXPECT_TRUE(std::isnan(v));
}

// With only x or only w needing a gradient, only the casts whose transpose that gradient's GEMM
// reads make twins (the forward saves the other operand as it is): the gradient still matches the
// CPU's, at a shape cuBLASLt's FP8 matmul takes and at one it refuses.
TEST(CudaKernels, Float8LinearGradientsMatchTheCpuWhenOnlyOneIsWanted) {
  SKIP_WITHOUT_CUDA();
  const ag::amp::Float8Recipe recipe{.scaling = ag::amp::Float8Scaling::kCurrent};
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{48, 64, 32}, {5, 7, 3}};  // rows, in, out
  for (const auto& [rows, in, out] : shapes) {
    const Tensor x = random_tensor({rows, in}, DType::kFloat32, 120), w = random_tensor({out, in}, DType::kFloat32, 121);
    const Tensor g = random_tensor({rows, out}, DType::kFloat32, 122) * 1e-3f;
    for (bool x_wants_grad : {true, false}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(in) + (x_wants_grad ? ", dx only" : ", dw only"));
      Tensor grads[2];
      for (Device device : {Device::kCPU, Device::kCUDA}) {
        Tensor xd = x.to(device).detach(), wd = w.to(device).detach();
        (x_wants_grad ? xd : wd).set_requires_grad(true);
        Tensor y;
        {
          ag::amp::Float8Guard fp8(device, recipe);
          y = ag::ops::linear(xd, wd);
        }
        y.backward(g.to(device));
        grads[device == Device::kCUDA] = (x_wants_grad ? xd : wd).grad();
      }
      ASSERT_TRUE(grads[1].defined());
      EXPECT_TRUE(close_to(grads[1], grads[0]));
    }
  }
}

// linear inside a Float8Guard on CUDA runs in FP8: its weight gets scaling states, and its result
// is the FP8 one (3 mantissa bits: about 2^-4 relative a product), not the float one.
TEST(CudaKernels, LinearInsideAFloat8GuardRunsInFp8) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = random_tensor({32, 64}, DType::kFloat32, 42, Device::kCUDA);
  const Tensor w = random_tensor({16, 64}, DType::kFloat32, 43, Device::kCUDA);
  Tensor y;
  {
    ag::amp::Float8Guard fp8(Device::kCUDA, {.scaling = ag::amp::Float8Scaling::kCurrent});
    y = ag::ops::linear(x, w);
  }
  ASSERT_NE(ag::amp::float8_state(w), nullptr);
  const std::vector<float> got = y.to_vector(), exact = ag::ops::linear(x, w).to_vector();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - exact[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(exact[i])));
  }
  EXPECT_GT(worst, 1e-4 * scale);
  EXPECT_LT(worst, 0.1 * scale);
}

}  // namespace
