// Multi-tensor apply (framework/multi_tensor.h): the chunk table over lists of tensor lists, the
// pool walking it, and the passes built on it. One optimizer pass over parameters of different
// groups, step counts, dtypes and sizes equals one optimizer per parameter bit for bit, so each
// chunk finds its own tensor's scalars; the clipping pair keeps affine's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "framework/allocator.h"
#include "framework/dtype.h"
#include "framework/multi_tensor.h"
#include "framework/parallel.h"
#include "framework/tensor.h"
#include "ops/elementwise/elementwise_kernels.h"
#include "ops/reduce/reduce_kernels.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "optim/update_kernels.h"
#include "optim_test_util.h"
#include "test_util.h"

namespace ag = ampgrad;
namespace agt = ampgrad::test;
namespace mt = ampgrad::multi_tensor;
using ag::DType;
using ag::Tensor;

namespace {

Tensor values(int64_t n, DType dtype, uint64_t seed) {
  return Tensor::from_vector(agt::random_values(static_cast<size_t>(n), -2.0, 2.0, seed), {n}, dtype);
}

// A new tensor with t's values (exact: double holds every value of every floating dtype).
Tensor copy_of(const Tensor& t) { return Tensor::from_vector(t.to_double_vector(), t.shape(), t.dtype()); }

TEST(MultiTensor, ChunksCoverEveryTensorInOrderAndNameTheirTensor) {
  const int64_t big = 2 * mt::kCpuChunkElements + 5;
  const std::vector<Tensor> a = {values(big, DType::kFloat16, 1), values(3, DType::kFloat32, 2),
                                 values(0, DType::kFloat32, 3), values(7, DType::kBFloat16, 4)};
  const std::vector<Tensor> b = {values(big, DType::kFloat32, 5), Tensor(), values(0, DType::kFloat32, 6),
                                 values(7, DType::kFloat32, 7)};
  const std::vector<mt::Chunk<2>> chunks = mt::make_chunks<2>("test pass", {a, b}, ag::Device::kCPU);
  ASSERT_EQ(chunks.size(), 5u);  // three for the big tensor, one each for the small ones, none for empty
  const int32_t tensor[] = {0, 0, 0, 1, 3};
  const int64_t start[] = {0, mt::kCpuChunkElements, 2 * mt::kCpuChunkElements, 0, 0};
  const int64_t n[] = {mt::kCpuChunkElements, mt::kCpuChunkElements, 5, 3, 7};
  for (size_t c = 0; c < chunks.size(); ++c) {
    SCOPED_TRACE(c);
    const size_t k = static_cast<size_t>(tensor[c]);
    EXPECT_EQ(chunks[c].tensor, tensor[c]);
    EXPECT_EQ(chunks[c].n, n[c]);
    EXPECT_EQ(chunks[c].dtype[0], a[k].dtype());
    EXPECT_EQ(chunks[c].data[0], static_cast<const char*>(a[k].data_ptr()) + start[c] * ag::element_size(a[k].dtype()));
    if (b[k].defined()) {
      EXPECT_EQ(chunks[c].data[1], static_cast<const char*>(b[k].data_ptr()) + start[c] * 4);
    } else {
      EXPECT_EQ(chunks[c].data[1], nullptr);
    }
  }
}

TEST(MultiTensor, BadListsAreRefusedNamingThePass) {
  const std::vector<Tensor> a = {values(4, DType::kFloat32, 1), values(5, DType::kFloat32, 2)};
  EXPECT_TRUE(agt::throws_error([&] { mt::make_chunks<2>("my pass", {a, {a[0]}}, ag::Device::kCPU); },
                                {"my pass", "list 1", "1 tensors", "list 0 has 2"}));
  EXPECT_TRUE(agt::throws_error([&] { mt::make_chunks<2>("my pass", {a, {a[1], a[0]}}, ag::Device::kCPU); },
                                {"my pass", "tensor 0", "[5]", "[4]", "same sizes"}));
  const std::vector<Tensor> hole = {Tensor(), a[0]};
  EXPECT_TRUE(agt::throws_error([&] { mt::make_chunks<2>("my pass", {hole, a}, ag::Device::kCPU); },
                                {"my pass", "tensor 0 of list 0 is undefined"}));
  // The update passes check their lists by name before writing anything.
  namespace k = ag::optim::kernels;
  const std::vector<Tensor> w = {a[0]}, rounded = {values(4, DType::kFloat16, 3)};
  const auto adam = [&](k::AdamLists lists, size_t scalars) {
    return [lists, scalars] { k::adam_update(ag::Device::kCPU, lists, std::vector<k::AdamScalars>(scalars)); };
  };
  EXPECT_TRUE(agt::throws_error(adam({w, w, {Tensor()}, w, rounded}, 1), {"Adam update", "parameter 0", "no exp_avg"}));
  // 16-bit weights are updated in place (stochastic rounding): never beside a rounded copy.
  EXPECT_TRUE(agt::throws_error(adam({rounded, w, w, w, rounded}, 1),
                                {"Adam update", "weights", "float16", "without a rounded copy"}));
  EXPECT_TRUE(agt::throws_error(adam({w, w, rounded, w, rounded}, 1),
                                {"Adam update", "exp_avg", "float16", "state is float32"}));
  EXPECT_TRUE(agt::throws_error(adam({w, w, w, w, w}, 1), {"Adam update", "rounded copy", "float32", "16-bit"}));
  EXPECT_TRUE(agt::throws_error(adam({w, w, w, {a[1]}, rounded}, 1), {"Adam update", "exp_avg_sq", "[5]", "[4]"}));
  EXPECT_TRUE(agt::throws_error(adam({w, w, w, w, rounded}, 2), {"Adam update", "1 parameters but 2"}));
  EXPECT_TRUE(agt::throws_error(
      [&] { k::sgd_update(ag::Device::kCPU, {w, {Tensor()}, {Tensor()}, {Tensor()}}, {k::SgdScalars{}}); },
      {"SGD update", "no gradient"}));
}

// Every element of every tensor is visited exactly once, on one thread or several.
TEST(MultiTensor, ThePoolVisitsEveryElementOnce) {
  const int saved = ag::num_threads();
  for (int threads : {1, 3}) {
    ag::set_num_threads(threads);
    std::vector<Tensor> counts = {ag::zeros({5 * mt::kCpuChunkElements + 17}), ag::zeros({11}),
                                  ag::zeros({mt::kCpuChunkElements})};
    const std::vector<mt::Chunk<1>> chunks = mt::make_chunks<1>("count", {counts}, ag::Device::kCPU);
    mt::apply_cpu(chunks, [](const mt::Chunk<1>& c) {
      float* x = mt::chunk_data<float>(c, 0);
      for (int64_t i = 0; i < c.n; ++i) x[i] += 1.0f;
    });
    for (const Tensor& t : counts) {
      const std::vector<double> got = t.to_double_vector();
      EXPECT_EQ(std::count(got.begin(), got.end(), 1.0), t.numel()) << threads << " threads, " << t.to_string();
    }
  }
  ag::set_num_threads(saved);
}

// Parameters of two groups (two learning rates), two dtypes and sizes up to several chunks; the
// second skips the first step, so the two reach different step counts.
struct Params {
  std::vector<Tensor> all;
  Params() {
    all = {values(3 * mt::kCpuChunkElements + 9, DType::kFloat16, 11), values(5, DType::kFloat32, 12),
           values(2 * mt::kCpuChunkElements, DType::kBFloat16, 13), values(33, DType::kFloat32, 14)};
    for (Tensor& p : all) p.set_requires_grad(true);
  }
};

void give_grads(std::vector<Tensor>& params, int step) {
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor& p = params[k];
    if (step == 0 && k == 1) {
      p.set_grad(Tensor());  // parameter 1 sits the first step out
      continue;
    }
    p.set_grad(values(p.numel(), p.dtype(), 100 + 10 * static_cast<uint64_t>(step) + k));
  }
}

void expect_same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].to_double_vector(), b[k].to_double_vector()) << "parameter " << k;
  }
}

template <typename Make>
void expect_one_pass_equals_one_optimizer_each(Make make) {
  Params together, apart;
  auto joint = make(std::vector<std::vector<Tensor>>{{together.all[0], together.all[1]},
                                                     {together.all[2], together.all[3]}});
  std::vector<decltype(joint)> single;
  for (size_t k = 0; k < apart.all.size(); ++k) {
    std::vector<std::vector<Tensor>> groups(2);
    groups[k < 2 ? 0 : 1] = {apart.all[k]};
    single.push_back(make(groups));
  }
  for (int step = 0; step < 3; ++step) {
    give_grads(together.all, step);
    give_grads(apart.all, step);
    joint->step();
    for (auto& opt : single) opt->step();
  }
  expect_same_bits(together.all, apart.all);
}

TEST(MultiTensor, OneAdamPassEqualsOneAdamPerParameter) {
  expect_one_pass_equals_one_optimizer_each([](const std::vector<std::vector<Tensor>>& groups) {
    std::vector<ag::optim::ParamGroup<ag::optim::AdamWOptions>> g;
    g.push_back({.params = groups[0], .options = ag::optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}});
    g.push_back({.params = groups[1], .options = ag::optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.0}});
    return std::make_unique<ag::optim::AdamW>(g);
  });
}

TEST(MultiTensor, OneSgdPassEqualsOneSgdPerParameter) {
  // One group with Nesterov momentum, one without momentum: the momentum list has holes.
  expect_one_pass_equals_one_optimizer_each([](const std::vector<std::vector<Tensor>>& groups) {
    std::vector<ag::optim::ParamGroup<ag::optim::SGDOptions>> g;
    g.push_back({.params = groups[0],
                 .options = ag::optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true}});
    g.push_back({.params = groups[1], .options = ag::optim::SGDOptions{.lr = 0.05}});
    return std::make_unique<ag::optim::SGD>(g);
  });
}

// A 16-bit gradient is read widened by the pass (no FP32 copy is made): the same bits as the
// same gradient given in FP32 on the master, as GradScaler's unscale_ leaves it.
TEST(MultiTensor, A16BitGradientIsReadAsItsFloat32Value) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    agt::expect_widened_grad_equals_fp32_grad(dtype, 2 * mt::kCpuChunkElements + 3, ag::Device::kCPU);
  }
}

// The step makes no FP32 copy of a 16-bit gradient: the allocator's peak during it stays well
// below the 4 bytes per element such a copy would take.
TEST(MultiTensor, AStepOn16BitGradientsAllocatesNoFloat32Copy) {
  const int64_t n = int64_t{1} << 20;
  Tensor p = values(n, DType::kBFloat16, 41);
  p.set_requires_grad(true);
  ag::optim::SGD opt({p}, {.lr = 0.1});
  p.set_grad(values(n, DType::kBFloat16, 42));
  opt.step();  // the first step sets up whatever it keeps
  p.set_grad(values(n, DType::kBFloat16, 43));
  ag::Allocator& cpu = ag::allocator_for(ag::Device::kCPU);
  const int64_t before = ag::memory_stats(ag::Device::kCPU).current_bytes;
  cpu.reset_peak();
  opt.step();
  EXPECT_LT(ag::memory_stats(ag::Device::kCPU).peak_bytes - before, n);  // an FP32 copy: 4n bytes
}

// The clipping pair on the CPU over tensors of several chunks: the squared norm in double, and
// every tensor scaled with the bits affine(x, coeff, 0, x) gives.
TEST(MultiTensor, SumOfSquaresAndClipByNormOverChunks) {
  Params p;
  std::vector<Tensor> xs, expected;
  double sum = 0;
  for (const Tensor& t : p.all) {
    xs.push_back(copy_of(t));
    for (double v : t.to_double_vector()) sum += v * v;
  }
  Tensor sum_sq = Tensor::empty({}, DType::kFloat64), norm = Tensor::empty({}, DType::kFloat64);
  ag::kernels::sum_of_squares(xs, sum_sq);
  EXPECT_NEAR(sum_sq.item<double>(), sum, 1e-13 * sum);
  const double max_norm = 1.0, coeff = max_norm / (std::sqrt(sum_sq.item<double>()) + 1e-6);
  for (const Tensor& x : xs) {
    expected.push_back(Tensor::empty(x.shape(), x.dtype()));
    ag::kernels::affine(x, coeff, 0.0, expected.back());
  }
  ag::kernels::clip_by_norm_(xs, sum_sq, max_norm, norm);
  EXPECT_EQ(norm.item<double>(), std::sqrt(sum_sq.item<double>()));
  for (size_t k = 0; k < xs.size(); ++k) {
    EXPECT_EQ(agt::bytes_of(xs[k]), agt::bytes_of(expected[k])) << "tensor " << k;
  }
  // A norm below max_norm leaves every tensor as it was.
  const std::vector<Tensor> before = {copy_of(xs[0]), copy_of(xs[3])};
  ag::kernels::clip_by_norm_(xs, sum_sq, 1e9, norm);
  EXPECT_EQ(agt::bytes_of(xs[0]), agt::bytes_of(before[0]));
  EXPECT_EQ(agt::bytes_of(xs[3]), agt::bytes_of(before[1]));
}

}  // namespace
